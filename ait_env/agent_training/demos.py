"""Expert demonstrations collected into a JSONL file, resumably, for behaviour cloning.

Contract of :func:`collect`: for each family and each of ``per_family`` task instances (seeds
``seed, seed + 1, ...``), one demonstration (:func:`ait_env.agents.experts.demonstrate`) whose strategy is drawn
from ``weights``, on each backend of ``backends`` (the task text, the base models and the job settings differ by
backend). Every line of the file is one demonstration (:meth:`Demonstration.to_json`); a run that stops is
resumed by calling :func:`collect` again with the same arguments: the demonstrations already in the file are
kept and not played again. The draw of a demonstration depends only on (seed, backend, family, instance), so a
resumed file equals an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym

import ait_env  # noqa: F401  (registers AIT/JobWriting-v0)
from ait_env.agents.experts import STRATEGIES, ExpertError, demonstrate

def _rng(*parts: Any) -> random.Random:
    return random.Random(int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little"))


def _key(d: dict[str, Any]) -> tuple[str, str, int]:
    return str(d["backend"]), str(d["family"]), int(d["seed"])


def read(path: Path) -> list[dict[str, Any]]:
    """The demonstrations in ``path`` (a torn last line, from a run that was killed, is skipped)."""
    out = []
    if not Path(path).is_file():
        return out
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def collect(path: Path, families: list[str], per_family: int, backends: list[str], weights: dict[str, float],
            seed: int = 0, overrides: dict[str, Any] | None = None,
            log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Play the demonstrations that ``path`` lacks (module docstring); returns all of them."""
    unknown = [s for s in weights if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; choose from {STRATEGIES}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    have = read(path)
    done = {_key(d) for d in have}
    plan = [(b, f, seed + i) for b in backends for f in families for i in range(per_family)]
    todo = [p for p in plan if p not in done]
    if not todo:
        return have
    log(f"[demos] {len(plan) - len(todo)} of {len(plan)} demonstrations in {path}; playing {len(todo)}")
    t0 = time.time()
    for backend in backends:
        mine = [p for p in todo if p[0] == backend]
        if not mine:
            continue
        env = gym.make("AIT/JobWriting-v0", backend=backend, overrides=overrides or {})
        try:
            for k, (_, family, s) in enumerate(mine):
                rng = _rng(seed, backend, family, s)
                names = list(weights)
                strategy = rng.choices(names, weights=[weights[n] for n in names])[0]
                try:
                    demo = demonstrate(env, family, s, strategy, rng).to_json()
                except ExpertError as exc:
                    log(f"[demos] skipped {backend} {family} seed {s} ({strategy}): {str(exc)[:300]}")
                    continue
                with open(path, "a") as f:
                    f.write(json.dumps(demo) + "\n")
                have.append(demo)
                if (k + 1) % 10 == 0 or k + 1 == len(mine):
                    log(f"[demos] {backend}: {k + 1}/{len(mine)} played ({time.time() - t0:.0f} s)")
        finally:
            env.close()
    return have
