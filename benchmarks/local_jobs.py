"""Run real jobs on the local backend and print what they did: the reference job, a ladder of
deliberately bad jobs, a hyperparameter sweep, and a reproducibility rerun.

    python benchmarks/local_jobs.py reference [--families all]          # uplift of each reference job + timings
    python benchmarks/local_jobs.py ladder [--families arithmetic,...] [--max-steps 20]  # bad jobs per family
    python benchmarks/local_jobs.py ladder --families warehouse --variants lr_zero,state_ignored  # + a rubric blind to the world
    python benchmarks/local_jobs.py sweep --family arithmetic --param max_steps --values 0,5,10,20,40,80
    python benchmarks/local_jobs.py sweep --family units --param lr --values 3e-7,1e-6,3e-6,1e-5 --max-steps 10
    python benchmarks/local_jobs.py repro --family arithmetic           # the same job twice
    python benchmarks/local_jobs.py reference --families arithmetic --device cuda   # on a GPU

Every job goes through the one job runner (sandboxed verifiers rollouts, GRPO, hidden eval), exactly
as an episode's job would; the ladder's bad jobs skip the validation probe on purpose (the probe
rejects some of them, e.g. a constant reward) so their uplift can be measured. Results are appended
to ``runs/benchmarks/local_jobs.jsonl``. A sweep ends with its distinct levels: post scores sorted, a
new level whenever a score exceeds the last level by more than both their 95% CI half-widths.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from task_families import reference_files
from ait_env.jobs.settings import BackendSettings
from ait_env.jobs.result import JobResult
from ait_env.config import load_group
from ait_env.jobs.bundle import build_bundle
from ait_env.jobs.schema import parse_job
from ait_env.episode.reward import RewardSettings, episode_reward
from ait_env.runner import run
from ait_env.hidden.secrets import hidden_set
from task_families import FAMILY_NAMES, get_family

OUT = Path("runs/benchmarks/local_jobs.jsonl")
Edit = Callable[[dict[str, str]], dict[str, str]]


def _set_toml(key: str, value: str, required: bool = True) -> Edit:
    def edit(files: dict[str, str]) -> dict[str, str]:
        text, n = re.subn(rf"(?m)^{re.escape(key)} = .*$", f"{key} = {value}", files["job.toml"])
        if not n and required:
            raise ValueError(f"job.toml has no key {key!r}")
        return {**files, "job.toml": text}
    return edit


def _rubric(expr: str) -> Edit:
    """Replace the reference rubric by one returning ``expr`` (a function of ``correct``)."""
    def edit(files: dict[str, str]) -> dict[str, str]:
        env = files["environment.py"]
        m = re.search(r"rubric = vf\.Rubric\(funcs=\[([a-z_]+)", env)
        if not m:
            raise ValueError("could not find the reference rubric")
        first = m.group(1)
        env = re.sub(r"rubric = vf\.Rubric\(.*?\)\n",
                     f"rubric = vf.Rubric(funcs=[lambda completion, answer, **kw: "
                     f"(lambda correct: {expr})({first}(completion=completion, answer=answer, **kw))], weights=[1.0])\n",
                     env, count=1, flags=re.S)
        return {**files, "environment.py": env}
    return edit


def _chain(*edits: Edit) -> Edit:
    def edit(files: dict[str, str]) -> dict[str, str]:
        for e in edits:
            files = e(files)
        return files
    return edit


def _state_ignored(files: dict[str, str]) -> dict[str, str]:
    """A stateful family's rubric that reads only the answer's shape, never the world its tool calls left (what
    the probe refuses as ``state_ignored``): 1 for any label-shaped answer, from the reference's own parser."""
    env = files["environment.py"]
    if "def _label(" not in env:
        raise ValueError("state_ignored: the reference environment has no _label parser (a stateful family's rung)")
    env = re.sub(r"rubric = vf\.Rubric\(.*?\)\n",
                 "rubric = vf.Rubric(funcs=[lambda completion, **kw: 1.0 if _label(completion) else 0.0], "
                 "weights=[1.0])\n", env, count=1, flags=re.S)
    return {**files, "environment.py": env}


LADDER: dict[str, Edit] = {
    "reference": lambda f: f,
    "constant_reward": _rubric("1.0"),
    "lr_zero": _chain(_set_toml("lr", "0.0"), _set_toml("min_lr", "0.0", required=False)),  # constant: no min_lr
    "reward_wrong_answers": _rubric("1.0 - correct"),
    "lr_collapse": _set_toml("lr", "1e-4"),
    "state_ignored": _state_ignored,   # stateful families only (skipped for the others)
}


def run_job(family: str, model: str, edit: Edit, label: str, backend: BackendSettings) -> JobResult:
    fam = get_family(family)
    files = edit(reference_files(family, model, backend="local"))
    job, issues = parse_job(files["job.toml"])
    if job is None:
        raise SystemExit(f"{label}: job.toml invalid: {issues}")
    with tempfile.TemporaryDirectory(prefix="ait-bench-ws-") as tmp:  # the bundle keeps its own copy
        ws = Path(tmp)
        for name, text in files.items():
            (ws / name).write_text(text)
        bundle = build_bundle(ws, job, fam, Path("runs/benchmarks/jobs"))
    t0 = time.time()
    result = run(bundle.root, backend, progress=True)
    rec = {"label": label, "family": family, "model": model, "job_id": result.job_id, "status": result.status,
           "pre": max(result.baselines.values()) if result.baselines else None, "post": result.post_score,
           "post_ci95": result.post_ci95, "wall_s": round(time.time() - t0, 1),
           "train_s": round(result.train_seconds, 1), "max_steps": job.prime_rl.max_steps, "lr": job.prime_rl.optim.lr,
           "timings": result.timings, "curves": result.curves, "error": result.error}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("a") as f:
        f.write(json.dumps(rec) + "\n")
    return result


def distinct_levels(posts: list[tuple[float, float]]) -> list[float]:
    """Post scores (with their 95% CI half-widths) that are pairwise apart by more than both intervals,
    taken greedily from the lowest."""
    levels: list[tuple[float, float]] = []
    for p, ci in sorted(posts):
        if not levels or p - levels[-1][0] > max(ci, levels[-1][1]):
            levels.append((p, ci))
    return [p for p, _ in levels]


def env_reward(r: JobResult, backend: BackendSettings) -> float | None:
    """The reward the env would give this job submitted on the first attempt (its own ``compose``)."""
    if r.status != "succeeded" or r.post_score is None or not r.baselines:
        return None
    b = episode_reward("scored", RewardSettings.model_validate(load_group("reward", "default")), attempts=1,
                validated_attempt=1, post=r.post_score, best_pre=max(r.baselines.values()),
                train_seconds=r.train_seconds, wall_clock_limit_s=backend.bounds.wall_clock_minutes * 60)
    return b.total


def _row(label: str, family: str, r: JobResult, backend: BackendSettings) -> str:
    pre = max(r.baselines.values()) if r.baselines else float("nan")
    post = r.post_score if r.post_score is not None else float("nan")
    reward = env_reward(r, backend)
    return (f"{family:11s} {label:22s} {r.status:10s} pre {pre:.3f} post {post:.3f} ± {r.post_ci95 or 0:.3f} "
            f"uplift {post - pre:+.3f} wall {r.wall_seconds:6.1f} s train {r.train_seconds:6.1f} s "
            f"env reward {'-' if reward is None else f'{reward:.3f}'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["reference", "ladder", "sweep", "repro"])
    ap.add_argument("--families", default="all")
    ap.add_argument("--family", default="arithmetic")
    ap.add_argument("--model", default="ait-tiny-m")
    ap.add_argument("--param", default="max_steps")
    ap.add_argument("--values", default="0,5,10,20,40,80")
    ap.add_argument("--variants", default=",".join(LADDER))
    ap.add_argument("--max-steps", type=int, default=None,
                    help="ladder and sweep (of another parameter): run every job with this many steps instead "
                         "of the reference's (the bad jobs need not be as long as the reference to show they do "
                         "not lift the model; a learning-rate sweep is cheaper at fewer steps)")
    ap.add_argument("--measure-pre", action="store_true",
                    help="measure the base model's hidden-eval score in the job instead of reading the pinned "
                         "baseline (the reference mode always does: its wall time includes both evals)")
    ap.add_argument("--device", default=None,
                    help="where the jobs sample and train: cpu (the backend's default), cuda, or auto")
    args = ap.parse_args()
    from ait_env.hidden.secrets import default_hidden_seeds

    seeds = default_hidden_seeds("published")   # the docs' figures; AIT_HIDDEN_SEEDS=private for your own sets
    print(f"hidden-eval seeds: {seeds.label}", file=sys.stderr)
    backend = BackendSettings.model_validate(load_group("backend", "local"))
    if args.device:
        backend.options["device"] = args.device
    if args.measure_pre or args.mode == "reference":
        backend.options["measure_pre"] = True
    families = list(FAMILY_NAMES) if args.families == "all" else args.families.split(",")
    lines: list[str] = []
    if args.mode == "reference":
        for fam in families:
            r = run_job(fam, args.model, LADDER["reference"], "reference", backend)
            lines.append(_row("reference", fam, r, backend))
            t = r.timings
            lines.append(f"{'':11s} timings: pre-eval {t.get('pre_eval', float('nan')):.1f} s, post-eval "
                         f"{t.get('post_eval', float('nan')):.1f} s (one hidden eval: {len(hidden_set(fam))} "
                         f"instances), rollouts {t.get('rollout', 0):.1f} s, optimizer {t.get('optimizer', 0):.1f} s, "
                         f"curve evals {t.get('curve_evals', 0):.1f} s; {t.get('train_tokens_per_s', 0):.0f} sampled tokens/s "
                         f"through rollout + update")
    elif args.mode == "ladder":
        steps = _set_toml("max_steps", str(args.max_steps)) if args.max_steps else LADDER["reference"]
        for fam in families:
            for v in args.variants.split(","):
                if v == "state_ignored" and not get_family(fam).state_args:
                    continue   # a stateless family has no world to ignore
                lines.append(_row(v, fam, run_job(fam, args.model, _chain(LADDER[v], steps), v, backend), backend))
    elif args.mode == "sweep":
        posts: list[tuple[float, float]] = []
        for value in args.values.split(","):
            edit = _set_toml(args.param, value)
            if args.param == "max_steps":
                edit = _chain(edit, _set_toml("warmup_steps", "0"))
            elif args.max_steps:
                edit = _chain(edit, _set_toml("max_steps", str(args.max_steps)))
            if args.param == "max_steps" and int(value) == 0:
                lines.append(f"{args.family:11s} max_steps=0 is the untrained base (see baselines)")
                continue
            r = run_job(args.family, args.model, edit, f"{args.param}={value}", backend)
            lines.append(_row(f"{args.param}={value}", args.family, r, backend))
            if r.post_score is not None:
                posts.append((r.post_score, r.post_ci95 or 0.0))
        levels = distinct_levels(posts)
        lines.append(f"distinct levels (each beyond both 95% CI half-widths): {len(levels)}: "
                     + ", ".join(f"{p:.3f}" for p in levels))
    else:
        for i in range(2):
            r = run_job(args.family, args.model, LADDER["reference"], f"repro#{i + 1}", backend)
            lines.append(_row(f"repro#{i + 1}", args.family, r, backend))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
