"""Regenerate the golden prime-rl rl.toml files under ``tests/golden/rl_toml/``.

    python tests/golden/regen.py            # (re)write every golden
    python tests/golden/regen.py --check    # exit 1 if any golden is missing or differs

Cases:

- ``<family>.toml``: ``task_families/<family>/reference/job.toml`` of every registered family that has
  one, with ``{base_model}`` replaced by :data:`GOLDEN_BASE_MODEL`;
- ``variant_<name>.toml``: ``tests/jobs/variants/<name>.toml`` (complete job files covering the
  optimizer / scheduler / loss / algo / option branches). A variant may carry one comment line
  ``# render-options: {json}`` with :class:`ait_env.jobs.primerl.RenderOptions` fields.

Review the diff of a regenerated golden before committing it: it is the config prime-rl will run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ait_env.jobs.bundle import env_id_for  # noqa: E402
from ait_env.jobs.primerl import RenderOptions, render_rl_toml  # noqa: E402
from ait_env.jobs.schema import parse_job  # noqa: E402

GOLDEN_DIR = ROOT / "tests" / "golden" / "rl_toml"
VARIANTS_DIR = ROOT / "tests" / "jobs" / "variants"
GOLDEN_BASE_MODEL = "Qwen/Qwen3-1.7B"
_OPTIONS_PREFIX = "# render-options:"


def family_reference(family: str) -> Path:
    return ROOT / "task_families" / family / "reference" / "job.toml"


def family_job_text(family: str) -> str | None:
    """The family's reference job.toml with the golden base model, or None if it has none yet."""
    p = family_reference(family)
    if not p.is_file():
        return None
    return p.read_text(encoding="utf-8").replace("{base_model}", GOLDEN_BASE_MODEL)


def options_of(text: str) -> RenderOptions:
    for line in text.splitlines():
        if line.startswith(_OPTIONS_PREFIX):
            return RenderOptions(**json.loads(line[len(_OPTIONS_PREFIX):]))
    return RenderOptions()


def render_case(name: str, text: str) -> str:
    """Render one golden case (deterministic env id and output dir derived from ``name``)."""
    job, issues = parse_job(text)
    if job is None:
        raise ValueError(f"golden case {name!r} does not parse: {issues}")
    env_id = env_id_for(f"golden-{name}")
    return render_rl_toml(job, env_id=env_id, output_dir=f"outputs/{env_id}", options=options_of(text))


def cases() -> dict[str, str]:
    """Golden file name (without ``.toml``) -> job.toml text."""
    from task_families import FAMILY_NAMES

    out: dict[str, str] = {}
    for family in FAMILY_NAMES:
        text = family_job_text(family)
        if text is not None:
            out[family] = text
    for p in sorted(VARIANTS_DIR.glob("*.toml")):
        out[f"variant_{p.stem}"] = p.read_text(encoding="utf-8")
    return out


def golden_path(name: str) -> Path:
    return GOLDEN_DIR / f"{name}.toml"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    bad = 0
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in cases().items():
        rendered = render_case(name, text)
        path = golden_path(name)
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current == rendered:
            print(f"ok        {path.relative_to(ROOT)}")
            continue
        if check:
            bad += 1
            print(f"{'MISSING' if current is None else 'DIFFERS':9} {path.relative_to(ROOT)}")
        else:
            path.write_text(rendered, encoding="utf-8")
            print(f"written   {path.relative_to(ROOT)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
