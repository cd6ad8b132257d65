"""Score every allowed base model of a backend on each family's hidden set and store the results.

    python scripts/seed_baselines.py backend=stub            # the per-user store: $AIT_DATA_DIR/baselines/stub.json
    python scripts/seed_baselines.py backend=stub pin=true   # the store shipped with the package
    python scripts/seed_baselines.py backend=local families=calendar            # or families=[units,calendar]

The user store is measured on the hidden sets of this installation's private seeds (``hidden_seeds=published``
for the published ones); ``pin=true`` always uses the published seeds (:mod:`ait_env.hidden.secrets`).
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig, ListConfig
from rich.console import Console
from rich.progress import track

from ait_env.backends import make_backend
from ait_env.jobs.settings import BackendSettings
from ait_env.config import EnvSettings
from ait_env.hidden.secrets import default_hidden_seeds
from task_families import FAMILY_NAMES

PINNED_DIR = Path(__file__).resolve().parents[1] / "ait_env" / "data" / "baselines"


@hydra.main(version_base="1.3", config_path="../conf", config_name="seed_baselines")
def main(cfg: DictConfig) -> None:
    from ait_env.extras import missing_extras_exit

    with missing_extras_exit("scripts/seed_baselines.py"):  # e.g. torch for backend=local: one line, exit 3
        _main(cfg)


def _main(cfg: DictConfig) -> None:
    console = Console()
    chosen = cfg.get("hidden_seeds")
    if cfg.pin and (chosen or "published") != "published":
        raise SystemExit("pin=true writes the baselines shipped with the package, measured on the published "
                         "hidden-eval seeds: drop hidden_seeds, or pin=false for your own seeds' user store")
    seeds = default_hidden_seeds("published" if cfg.pin else "private", "published" if cfg.pin else chosen)
    console.print(f"hidden-eval seeds: {seeds.label}")
    env = EnvSettings.model_validate(dict(cfg.env))
    backend = make_backend(BackendSettings.model_validate(dict(cfg.backend)), env.runs_path)
    chosen = cfg.families
    families = (list(FAMILY_NAMES) if str(chosen) == "all"
                else [str(f) for f in chosen] if isinstance(chosen, ListConfig) else [str(chosen)])
    unknown = [f for f in families if f not in FAMILY_NAMES]
    if unknown:
        raise SystemExit(f"unknown families {unknown}; choose from {', '.join(FAMILY_NAMES)} or all")
    store = backend.baselines
    target = PINNED_DIR / f"{backend.name}.json" if cfg.pin else store.user_path
    pairs = [(f, m.name) for f in families for m in backend.catalog()]
    with backend:
        entries = [backend.measure_baseline(f, m) for f, m in track(pairs, description="scoring base models")]
    path = store.put(entries, target)
    for e in entries:
        console.print(f"{e.family:12s} {e.model:28s} {e.score:.3f} ± {e.ci95:.3f} (n={e.n})")
    console.print(f"wrote {len(entries)} baselines to {path}")


if __name__ == "__main__":
    from ait_env.processes import sigterm_as_exit

    with sigterm_as_exit():  # a SIGTERM stops the running jobs too, not only this process
        main()
