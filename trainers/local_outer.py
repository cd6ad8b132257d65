"""The outer loop on a laptop: a small policy over a job's decision slots learns, by group-relative policy
gradient on the env's reward, to write better jobs — no account, no LLM, real jobs on the local backend.

    python trainers/local_outer.py +pilot=local                 # conf/pilot/local.yaml: arithmetic, local
    python trainers/local_outer.py +pilot=local pilot.policy_lr=0 pilot.name=local-control   # the control
    python trainers/local_outer.py +pilot=local_smoke           # stub backend, seconds
    python trainers/plot_run.py runs/local_outer/local          # the Tinker trainer's charts

With ``env.max_jobs_per_episode=2`` the episodes are research episodes and the policy has one more slot,
``sweep``: one job, or a two-job learning-rate sweep run at once (``submit_jobs``), then ``finish``.

Each step samples ``groups_per_step`` task instances and ``group_size`` episodes of each; every episode
draws its slot choices from the policy (:class:`ait_env.agents.slot_policy.SlotPolicy`) and plays them
through the env's text tool calls (read the job template, write job.toml and environment.py, submit).
Advantages are rewards minus their group's mean (``infra_failed`` episodes are dropped, a group needs
two kept episodes); one Adam step on the logits per training step. All episodes of a run share one
backend with the job result cache on, so a job the policy already tried is served, not trained again
(``env/all/ait/cache_hit``).

Output in ``<run_dir>/<pilot.name>``: ``metrics.jsonl`` with the Tinker trainer's keys
(``env/all/ait/reward``, ``.../validated``, ``.../post``, ``.../uplift``, ``.../model/<name>``,
``.../surface/*``, ``.../status/*``) plus ``env/all/ait/cache_hit``, ``env/all/ait/job_usd``, the policy's
choice probabilities ``policy/<slot>/<choice>`` and ``policy/entropy``; ``episodes.jsonl``; ``summary.json``
(the first and last quarter of steps: mean reward with 95% CIs, the stronger model's share); the charts
of ``trainers/plot_run.py`` in ``charts/`` (on a surrogate backend each says ``SURROGATE scores``, from the
run folder's ``run_label.txt``). With ``wandb.project`` set (``pip install wandb``; ``wandb.mode=offline``
needs no account) every row also goes to Weights & Biases; ``metrics.jsonl`` stays the record.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import gymnasium as gym
import hydra
from omegaconf import DictConfig, OmegaConf

import ait_env  # noqa: F401  (registers AIT/JobWriting-v0)
from ait_env.agents.slot_policy import SlotPolicy, episode_jobs, play, slots_for
from ait_env.backends import make_backend
from ait_env.config import compose
from ait_env.observe.metrics import episode_metrics, fill_model_share, model_key
from ait_env.jobs.schema import parse_job
from ait_env.hidden.secrets import default_hidden_seeds
from ait_env.observe.metrics import mean_ci
from ait_env.observe.plots import run_label, write_run_label


def summarize(episodes: list[dict[str, Any]], steps: int, stronger: str) -> dict[str, Any]:
    """First vs last quarter of steps: mean reward with 95% CI, the stronger model's share of validated jobs."""
    q = max(1, steps // 4)
    out: dict[str, Any] = {"quarter_steps": q}
    for name, lo, hi in (("first", 0, q), ("last", steps - q, steps)):
        eps = [e for e in episodes if lo <= e["step"] < hi and e["reward"] is not None]
        mean, half = mean_ci([e["reward"] for e in eps])
        validated = [e for e in eps if e["validated"]]
        share = sum(1 for e in validated if e["base_model"] == stronger) / len(validated) if validated else None
        out[name] = {"episodes": len(eps), "mean_reward": mean, "ci95": half, "stronger_model_share": share}
    f, last = out["first"], out["last"]
    gap = None if f["mean_reward"] is None or last["mean_reward"] is None else last["mean_reward"] - f["mean_reward"]
    out["reward_gain"] = gap
    out["gain_beyond_both_cis"] = bool(gap is not None and f["ci95"] is not None and last["ci95"] is not None
                                       and gap > f["ci95"] + last["ci95"])
    return out


def run(cfg: DictConfig) -> Path:
    p = cfg.pilot
    if p.get("trainer") != "local_outer":
        raise SystemExit(f"pilot {p.get('name')!r} is not a local outer-loop pilot (trainer: {p.get('trainer')!r}); "
                         "use +pilot=local or +pilot=local_smoke (conf/pilot/), or trainers/tinker_grpo.py")
    out = Path(str(cfg.run_dir)) / str(p.name)
    out.mkdir(parents=True, exist_ok=True)
    env_cfg = OmegaConf.to_container(cfg.env, resolve=True)
    assert isinstance(env_cfg, dict)
    env_cfg.update(runs_dir=str(out / "runs"), max_attempts=int(p.max_attempts))
    backend_over = OmegaConf.to_container(p.backend, resolve=True)
    assert isinstance(backend_over, dict)
    name = str(backend_over.pop("name"))
    overrides = {"env": env_cfg, "reward": OmegaConf.to_container(cfg.reward, resolve=True), "backend": backend_over}
    seeds = default_hidden_seeds("private", cfg.get("hidden_seeds"))   # before any job runner starts: inherited
    settings = compose(backend=name, overrides=overrides)
    backend = make_backend(settings.backend, settings.env.runs_path)
    write_run_label(out, run_label(surrogate=backend.surrogate, backend=name,  # every chart carries it
                                   hidden_seeds=seeds.label))
    catalog = [m.name for m in backend.catalog()]
    stronger = next((m.name for m in backend.catalog() if m.role == "larger"), catalog[-1])
    research = settings.env.max_jobs_per_episode > 1
    slots = slots_for(catalog, research=research)
    policy = SlotPolicy(slots, lr=float(p.policy_lr), seed=int(p.seed))
    families = list(p.families)
    tracker = _wandb(cfg, out)
    log = out / "metrics.jsonl"
    log.write_text("")
    (out / "episodes.jsonl").write_text("")
    episodes: list[dict[str, Any]] = []
    lock = threading.Lock()
    t_run = time.time()
    print(f"local outer loop {p.name}: {p.steps} steps x {p.groups_per_step} groups x {p.group_size} episodes "
          f"on {name}{' (SURROGATE scores)' if backend.surrogate else ''}, families {families}, "
          f"policy lr {p.policy_lr}, hidden_seeds {seeds.label}; logging to {out}", flush=True)

    def episode(step: int, g: int, family: str, instance: int, choice: dict[str, int]) -> dict[str, Any]:
        env = gym.make("AIT/JobWriting-v0", family=family, backend=backend, overrides=overrides)
        try:
            jobs = episode_jobs(family, slots, choice, name)
            info, turns = play(env, family, instance, lambda fam: jobs if len(jobs) > 1 else jobs[0])
            reward = info["reward"]
            job = None
            if reward.get("validated_attempt") is not None:   # the job the reward counts
                job, _ = parse_job(jobs[min(reward.get("best_job") or 0, len(jobs) - 1)]["job.toml"])
        finally:
            env.close()
        kept = not reward.get("drop")
        rec = {"step": step, "group": g, "family": family, "instance": instance,
               "choice": {s.name: s.label(choice[s.name]) for s in slots}, "status": reward["status"],
               "reward": float(reward["total"]) if kept else None, "validated": reward.get("validated_attempt") is not None,
               "base_model": job.job.base_model if job else None, "post": reward.get("post"),
               "uplift": reward.get("uplift"), "dispatched": len(info.get("jobs") or []),
               "cache_hit": sum(bool(j.get("cache_hit")) for j in info.get("jobs") or []),
               "job_usd": float(sum(j.get("cost_usd") or 0.0 for j in info.get("jobs") or [])),
               "metrics": episode_metrics(reward, job, family, turns, float(reward["total"] or 0.0),
                                          research=research) if kept else {}}
        with lock:
            with open(out / "episodes.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")
        return rec

    with ThreadPoolExecutor(max_workers=int(p.env_threads), thread_name_prefix="ait-outer") as pool:
        try:
            for step in range(int(p.steps)):
                t0 = time.time()
                plan = []
                for g in range(int(p.groups_per_step)):
                    family = families[(step * int(p.groups_per_step) + g) % len(families)]
                    instance = int(p.seed) * 1_000_003 + step * 1000 + g
                    plan += [(step, g, family, instance, policy.sample()) for _ in range(int(p.group_size))]
                recs = list(pool.map(lambda a: episode(*a), plan))
                episodes.extend(recs)
                choices, advs = [], []
                for g in range(int(p.groups_per_step)):
                    group = [(r, a[4]) for r, a in zip(recs, plan) if a[1] == g and r["reward"] is not None]
                    if len(group) < 2:
                        continue
                    mean = sum(r["reward"] for r, _ in group) / len(group)
                    for r, c in group:
                        choices.append(c)
                        advs.append(r["reward"] - mean)
                grad = policy.update(choices, advs)
                row = _row(step, recs, catalog, policy, grad, time.time() - t0)
                with open(log, "a") as f:
                    f.write(json.dumps(row) + "\n")
                if tracker is not None:
                    tracker.log(row, step=step)
                print(f"step {step}: reward {row.get('env/all/ait/reward', float('nan')):.3f} "
                      f"validated {row.get('env/all/ait/validated', 0):.2f} "
                      f"{model_key(stronger)} share {row.get(f'env/all/ait/model/{model_key(stronger)}', 0):.2f} "
                      f"cache hits {row['env/all/ait/cache_hit']:.2f} entropy {row['policy/entropy']:.2f} "
                      f"({row['time/step_s']:.0f} s)", flush=True)
        finally:
            backend.close()
            if tracker is not None:
                tracker.finish()
    summary = summarize(episodes, int(p.steps), stronger)
    summary.update(seconds=round(time.time() - t_run, 1), episodes=len(episodes),
                   cache_hit_rate=sum(e["cache_hit"] for e in episodes) / max(1, sum(e["dispatched"] for e in episodes)),
                   final_policy={s.name: dict(zip([s.label(i) for i in range(len(s.choices))],
                                                  [round(x, 3) for x in policy.probs(s.name)])) for s in slots})
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: summary[k] for k in ("first", "last", "reward_gain", "gain_beyond_both_cis",
                                              "cache_hit_rate", "seconds")}, indent=1))
    if cfg.get("charts", True):
        _charts(out)
    return out


def _row(step: int, recs: list[dict[str, Any]], catalog: list[str], policy: SlotPolicy, grad: float,
         seconds: float) -> dict[str, Any]:
    kept = [dict(r["metrics"]) for r in recs if r["reward"] is not None]
    fill_model_share(kept, catalog)
    row: dict[str, Any] = {"step": step}
    for key in sorted({k for m in kept for k in m}):
        vals = [m[key] for m in kept if key in m]
        row[f"env/all/{key}"] = sum(vals) / len(vals)
    row["env/all/ait/infra_dropped_frac"] = sum(r["reward"] is None for r in recs) / len(recs)
    ran = sum(r["dispatched"] for r in recs)
    row["env/all/ait/cache_hit"] = sum(r["cache_hit"] for r in recs) / ran if ran else 0.0  # of the jobs run
    row["env/all/ait/job_usd"] = sum(r["job_usd"] for r in recs) / len(recs)
    row["env/all/ait/llm_usd"] = 0.0  # no LLM: the policy is a few dozen numbers
    for s in policy.slots:
        for i, prob in enumerate(policy.probs(s.name)):
            row[f"policy/{s.name}/{s.label(i)}"] = prob
    row.update({"policy/entropy": policy.entropy(), "optim/grad_norm": grad, "time/step_s": seconds})
    return row


def _wandb(cfg: DictConfig, out: Path) -> Any:
    project = cfg.get("wandb", {}).get("project")
    if not project:
        return None
    try:
        import wandb
    except ImportError:
        raise SystemExit("wandb.project is set but wandb is not installed: pip install wandb "
                         "(or leave wandb.project unset; metrics.jsonl is written either way)") from None
    return wandb.init(project=str(project), name=str(cfg.pilot.name), dir=str(out), mode=str(cfg.wandb.mode),
                      config=OmegaConf.to_container(cfg, resolve=True))


def _charts(out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import plot_run

    plot_run.render(out / "metrics.jsonl", out / "charts")


@hydra.main(version_base="1.3", config_path="../conf", config_name="local_outer")
def main(cfg: DictConfig) -> None:
    from ait_env.observe.display import no_bars_unless_terminal
    from ait_env.extras import missing_extras_exit, require

    if cfg.get("pilot") is None:
        raise SystemExit("choose a pilot: python trainers/local_outer.py +pilot=<local|local_smoke> (conf/pilot/)")
    require("trainers/local_outer.py", "local", "matplotlib")  # the charts, drawn at the end of the run
    no_bars_unless_terminal()  # a tee'd log gets lines, not tqdm redraws
    with missing_extras_exit("trainers/local_outer.py"):  # e.g. torch, for backend=local
        run(cfg)


if __name__ == "__main__":
    from ait_env.processes import sigterm_as_exit

    with sigterm_as_exit():  # a SIGTERM stops the running jobs too, not only this process
        main()
