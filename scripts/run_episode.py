"""The main job: one complete episode — task spec, tool calls, validation, job run, reward.

    python scripts/run_episode.py                       # arithmetic, scripted reference agent, default backend
    python scripts/run_episode.py family=arithmetic backend=stub seed=3

The ``local`` backend trains models built beforehand by ``python -m ait_env.local.build`` (``scripts/main.sh``
runs it first); this script builds nothing. Each turn's tool output is shown clipped to
:data:`SHOWN_CHARS` characters at a line or word boundary, with a marker saying how much was left out;
a surrogate backend's reward is labelled as one.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from ait_env.agents.reference import ScriptedReferenceAgent
from ait_env.config import settings_from_cfg
from ait_env.display import clip, status_label
from ait_env.env import JobWritingEnv

AGENTS = {"reference": ScriptedReferenceAgent}
SHOWN_CHARS = 800  # of each turn's tool output


@hydra.main(version_base="1.3", config_path="../conf", config_name="run_episode")
def main(cfg: DictConfig) -> None:
    console = Console()
    if cfg.agent not in AGENTS:
        raise SystemExit(f"unknown agent {cfg.agent!r}; choose one of: {', '.join(AGENTS)}")
    env = JobWritingEnv(settings=settings_from_cfg(cfg))
    agent = AGENTS[cfg.agent]()
    obs, info = env.reset(seed=int(cfg.seed))
    console.rule(f"episode {info['episode_id']}: family={info['family']} backend={info['backend']}")
    if info["surrogate"]:
        console.print("[yellow]backend 'stub' is a SURROGATE: scores are a formula of the job's settings, "
                      "nothing is trained.[/yellow]", soft_wrap=True)
    agent.reset(info)
    done = False
    while not done:
        action = agent.act(obs, info)
        n_before = len(info["messages"])
        obs, reward, terminated, truncated, info = env.step(action)
        calls = [tc["function"]["name"] for m in info["messages"][n_before:] if m["role"] == "assistant"
                 for tc in m.get("tool_calls", [])]
        console.print(f"[bold]turn {info['turn']}[/bold] tools: {', '.join(calls) or '(none)'}")
        console.print("  " + clip(obs, SHOWN_CHARS).replace("\n", "\n  "), markup=False, highlight=False,
                      soft_wrap=True)
        done = terminated or truncated
    r = info["reward"]
    console.print(f"reward: {status_label(r['status'], info['backend'], info['surrogate'])}", markup=False)
    table = Table("term", "value", title="reward breakdown")
    for key in ("total", "V", "Q", "S", "post", "best_pre", "uplift", "U", "attempts"):
        value = r.get(key)
        table.add_row(key, "—" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)
    if "job" in info:
        job_dir = env.runs_dir / "jobs" / info["job"]["job_id"]
        console.print(f"job bundle and result: {job_dir}")
        from ait_env.backends.base import JobResult
        from ait_env.plots import plot_job_curves
        from task_families import get_family

        opts = cfg.backend.get("options") or {}  # the local runner's eval_limit / eval_subset, when set
        full = int(opts.get("eval_limit") or get_family(info["family"]).hidden_eval_size)
        subset = min(int(opts["eval_subset"]), full) if opts.get("eval_subset") else None
        chart = plot_job_curves(JobResult.model_validate(info["job"]), job_dir / "training_curve.png",
                                title=f"{info['family']} on {info['backend']}: {info['job']['job_id']}",
                                full_size=full, subset_size=subset)
        if chart:
            console.print(f"inner training curve: {chart}")
    env.close()


if __name__ == "__main__":
    main()
