"""The main job: one complete episode — task spec, tool calls, validation, job run, reward.

    python scripts/run_episode.py                       # arithmetic, scripted reference agent, default backend
    python scripts/run_episode.py family=arithmetic backend=stub seed=3
    python scripts/run_episode.py agent=research env.max_jobs_per_episode=2   # a research episode: two jobs

``agent=research`` is the two-job reference agent (:class:`ait_env.agents.reference.TwoJobReferenceAgent`):
a 5-step first job, then, when its eval curve was still rising, the reference job; it needs
``env.max_jobs_per_episode`` of 2 or more.

The ``local`` backend trains models built beforehand by ``python -m cpu.tiny_models.build`` (``scripts/main.sh``
runs it first); this script builds nothing. Each turn's tool output is shown clipped to
:data:`SHOWN_CHARS` characters at a line or word boundary, with a marker saying how much was left out;
a surrogate backend's reward is labelled as one.

It scores with the published hidden-eval seeds by default (``hidden_seeds=published``: the README's figures
and the pinned baselines); ``hidden_seeds=private`` (or ``AIT_HIDDEN_SEEDS=private``) scores with this
installation's own (:mod:`ait_env.hidden.secrets`).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from ait_env.agents.reference import ScriptedReferenceAgent, TwoJobReferenceAgent
from ait_env.config import settings_from_cfg
from ait_env.hidden.secrets import default_hidden_seeds
from ait_env.observe.display import clip, no_bars_unless_terminal, status_label
from ait_env.env import JobWritingEnv

AGENTS = {"reference": ScriptedReferenceAgent, "research": TwoJobReferenceAgent}
SHOWN_CHARS = 800  # of each turn's tool output
#: the reward breakdown's rows: V comes from the attempt that validated (of the job that counts), so that
#: attempt is shown beside it, and the episode's submit_job calls under their own name
BREAKDOWN_ROWS = (("total", "total"), ("V", "V"), ("validated_attempt", "V: validated at attempt"), ("Q", "Q"),
                  ("S", "S"), ("post", "post"), ("best_pre", "best_pre"), ("uplift", "uplift"), ("U", "U"),
                  ("attempts", "submit_job calls (episode)"))


@hydra.main(version_base="1.3", config_path="../conf", config_name="run_episode")
def main(cfg: DictConfig) -> None:
    from ait_env.extras import missing_extras_exit

    with missing_extras_exit("scripts/run_episode.py"):  # e.g. torch for backend=local: one line, exit 3
        _main(cfg)


def _main(cfg: DictConfig) -> None:
    no_bars_unless_terminal()  # a tee'd log gets lines, not tqdm redraws
    console = Console()
    if cfg.agent not in AGENTS:
        raise SystemExit(f"unknown agent {cfg.agent!r}; choose one of: {', '.join(AGENTS)}")
    seeds = default_hidden_seeds("published", cfg.get("hidden_seeds"))   # the README's figures, unless chosen
    settings = settings_from_cfg(cfg)
    if cfg.agent == "research" and settings.env.max_jobs_per_episode < 2:
        raise SystemExit("agent=research runs two jobs: add env.max_jobs_per_episode=2 to the command line")
    env = JobWritingEnv(settings=settings)
    agent = AGENTS[cfg.agent]()
    obs, info = env.reset(seed=int(cfg.seed))
    console.rule(f"episode {info['episode_id']}: family={info['family']} backend={info['backend']} "
                 f"hidden_seeds={seeds.label}")
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
    table = Table("term", "value", title="reward breakdown" + (" [SURROGATE scores]" if info["surrogate"] else ""))
    for key, name in BREAKDOWN_ROWS:
        value = r.get(key)
        table.add_row(name, "—" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value))
    if len(r["jobs"]) > 1:
        table.add_row("charge", f"{r['charge']:.4f}")
        table.add_row("best job", str(r["best_job"] + 1) if r["best_job"] is not None else "—")
    console.print(table)
    if len(r["jobs"]) > 1:
        jobs = Table("job", "status", "post", "uplift", "reward alone", "wall s",
                     title=f"jobs (ended: {r['end']})")
        for k, (j, res) in enumerate(zip(r["jobs"], info["jobs"], strict=True), 1):
            jobs.add_row(str(k), j["status"], *(f"{v:.4f}" if v is not None else "—" for v in
                         (j["post"], j["uplift"], j["total"])), f"{res['wall_seconds']:.1f}")
        console.print(jobs)
    if "job" in info:
        job_dir = env.runs_dir / "jobs" / info["job"]["job_id"]
        console.print(f"job bundle and result: {job_dir}")
        from ait_env.jobs.result import JobResult
        from ait_env.observe.plots import plot_job_curves
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
    from ait_env.processes import sigterm_as_exit

    with sigterm_as_exit():  # a SIGTERM stops the running jobs too, not only this process
        main()
