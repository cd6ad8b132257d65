"""A real LLM learns the job-writing task on a laptop: SmolLM2-135M-Instruct (from a registry package) is
warm-started by behaviour cloning on expert episodes, then RL-trained with GRPO through ``AIT/JobWriting-v0``.

    python trainers/local_llm.py +pilot=laptop-llm                       # the whole path (hours on 2 cores)
    python trainers/local_llm.py +pilot=laptop-llm pilot.rl.settings.lr=0 pilot.name=laptop-llm-control \\
        pilot.warm_from=runs/local_llm/laptop-llm/warm pilot.base_evals=[] pilot.evals=[]  # the lr-0 control
    python trainers/local_llm.py +pilot=laptop-llm-smoke                 # minutes: every stage, tiny sizes

Stages, each resumable (run the same command again: finished stages are skipped, a stage in progress goes on
from its last checkpoint), all under ``<run_dir>/<pilot.name>/``:

1. ``model``: the agent model from its registry package, de-quantized once into the model cache
   (:mod:`ait_env.agent_models.obtain`); its weights hash is recorded in ``summary.json``.
2. ``demos``: expert demonstrations (:mod:`ait_env.agent_training.demos`) on the training families, on each
   backend of ``pilot.demos.backends`` -> ``demos.jsonl``.
3. ``sft``: behaviour cloning (:mod:`ait_env.agent_models.sft`) -> the checkpoint ``warm/``; ``sft.jsonl`` logs
   every step; ``sft_ckpt/`` (weights + optimizer) every ``pilot.sft.save_every`` steps for resuming. Skipped
   with ``pilot.warm_from=<checkpoint>`` (a run that reuses another run's warm start, e.g. the control).
4. ``eval/*``: the model scored by the LLM runner (:mod:`ait_env.agent_training.scoring`): warm-started on
   each entry of ``pilot.evals``, then zero-shot (the untrained model) on each of ``pilot.base_evals`` (the
   training families and the held-out one, per backend), with transcripts under ``eval/<label>/transcripts/``;
   an eval cut short goes on from its last finished episode (:func:`ait_env.agents.llm.run`, ``resume``).
5. ``rl``: GRPO through the env (:mod:`ait_env.agent_training.rl`) on ``pilot.rl.backend`` ->
   ``metrics.jsonl`` (one row per step: batch reward mean and 95% CI, status mix, validation share, seconds),
   ``rollouts.jsonl``, ``rl_ckpt/`` after every step and ``final/`` at the end.
6. ``eval_final_*``: the RL-trained model scored like the warm one (``pilot.final_evals``).

``summary.json`` gathers every stage's figures: the weights hashes, the evaluation rows, the first and last
quarter of the RL steps (mean batch reward with 95% CIs and whether the gain exceeds both) and the charts
(``charts/reward.png``: batch reward per step with its CI). The hidden eval's seeds are this installation's
private ones unless ``hidden_seeds=published``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from ait_env.agents.llm import ResumeMismatch
from ait_env.observe.metrics import mean_ci


def quarters(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """First vs last quarter of the RL steps: mean batch reward (episodes pooled) with its 95% CI."""
    steps = len(rows)
    q = max(1, steps // 4)
    out: dict[str, Any] = {"quarter_steps": q}
    for name, part in (("first", rows[:q]), ("last", rows[-q:])):
        vals = [r for row in part for r in row["rewards"]]
        mean, half = mean_ci(vals)
        out[name] = {"episodes": len(vals), "mean_reward": mean, "ci95": half}
    f, last = out["first"], out["last"]
    gain = None if f["mean_reward"] is None or last["mean_reward"] is None else last["mean_reward"] - f["mean_reward"]
    out["reward_gain"] = gain
    out["gain_beyond_both_cis"] = bool(gain is not None and f["ci95"] is not None and last["ci95"] is not None
                                       and gain > f["ci95"] + last["ci95"])
    return out


class Run:
    """One pilot's run folder and its stages (module docstring)."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.p = cfg.pilot
        self.out = Path(str(cfg.run_dir)) / str(self.p.name)
        self.out.mkdir(parents=True, exist_ok=True)
        self.summary_path = self.out / "summary.json"
        self.summary: dict[str, Any] = json.loads(self.summary_path.read_text()) if self.summary_path.is_file() else {}
        self.t0 = time.time()

    def log(self, text: str) -> None:
        print(f"[{time.time() - self.t0:6.0f}s] {text}", flush=True)

    def save_summary(self) -> None:
        self.summary_path.write_text(json.dumps(self.summary, indent=1, default=str) + "\n")

    def overrides(self) -> dict[str, Any]:
        env = OmegaConf.to_container(self.cfg.env, resolve=True)
        assert isinstance(env, dict)
        if self.p.get("env"):  # the pilot's own env settings
            env.update(OmegaConf.to_container(self.p.env, resolve=True))
        env["runs_dir"] = str(self.out / "runs")
        return {"env": env, "reward": OmegaConf.to_container(self.cfg.reward, resolve=True)}

    # ------------------------------------------------------------------ stages
    def model(self) -> Any:
        from ait_env.agent_models.load import load_agent

        agent = load_agent(str(self.p.model))
        self.summary.setdefault("model", {"name": agent.name, "source": agent.meta.get("package"),
                                          "weights_hash": agent.weights_hash, "path": str(agent.path)})
        self.save_summary()
        return agent

    def demos(self) -> list[dict[str, Any]]:
        from ait_env.agent_training.demos import collect
        from ait_env.integrations.verifiers_env import resolve_families

        d = self.p.demos
        over = self.overrides()
        over["env"]["max_turns"] = max(6, int(over["env"].get("max_turns") or 0))   # an expert needs up to 5 turns
        demos = collect(self.out / "demos.jsonl", resolve_families(str(self.p.families)), int(d.per_family),
                        list(d.backends), dict(d.weights), seed=int(d.seed), overrides=over, log=self.log)
        counts: dict[str, int] = {}
        for x in demos:
            counts[x["strategy"]] = counts.get(x["strategy"], 0) + 1
        self.summary["demos"] = {"count": len(demos), "strategies": counts}
        self.save_summary()
        return demos

    def sft(self, agent: Any, demos: list[dict[str, Any]]) -> Any:
        import torch

        from ait_env.agent_models.load import load_agent, save_checkpoint
        from ait_env.agent_models.sft import SFTSettings, behaviour_clone, encode_conversation

        warm = self.out / "warm"
        if self.p.get("warm_from"):
            src = Path(str(self.p.warm_from))
            self.log(f"[sft] warm start taken from {src}")
            return load_agent(src)
        if (warm / "model.safetensors").is_file():
            self.log(f"[sft] done before: {warm}")
            return load_agent(warm)
        s = SFTSettings(**OmegaConf.to_container(self.p.sft.settings, resolve=True))  # type: ignore[arg-type]
        data = [encode_conversation(agent.tok, x["messages"], x["trained"]) for x in demos]
        ckpt = self.out / "sft_ckpt"
        start, opt_state = 0, None
        if (ckpt / "state.pt").is_file():
            agent = load_agent(ckpt)
            state = torch.load(ckpt / "state.pt", weights_only=False)
            start, opt_state = int(state["step"]), state["optimizer"]
            self.log(f"[sft] resuming at step {start} from {ckpt}")
        log_path = self.out / "sft.jsonl"
        every = int(self.p.sft.save_every)
        tokens = sum(e.trained for e in data)
        self.log(f"[sft] {len(data)} conversations, {tokens:,} trained tokens, {s.epochs} epochs, batch {s.batch}, "
                 f"lr {s.lr}, train_layers {s.train_layers or 'all'}")
        holder: dict[str, Any] = {}

        def on_step(entry: Any) -> None:
            with open(log_path, "a") as f:
                f.write(json.dumps(entry.__dict__) + "\n")
            self.log(f"[sft] step {entry.step}/{entry.of} loss {entry.loss:.4f} lr {entry.lr:.2e} "
                     f"tokens {entry.tokens} ({entry.seconds:.0f} s)")
            if every and entry.step % every == 0 and entry.step < entry.of and "opt" in holder:
                save_checkpoint(agent, ckpt, {"stage": "sft", "step": entry.step})
                torch.save({"step": entry.step, "optimizer": holder["opt"].state_dict()}, ckpt / "state.pt")

        t = time.time()
        logs, _ = behaviour_clone(agent, data, s, on_step=on_step, start_step=start, optimizer_state=opt_state,
                                  on_optimizer=lambda o: holder.__setitem__("opt", o))
        save_checkpoint(agent, warm, {"stage": "sft", "settings": OmegaConf.to_container(self.p.sft.settings),
                                      "demos": len(data), "trained_tokens": tokens})
        shutil.rmtree(ckpt, ignore_errors=True)
        self.summary["sft"] = {"seconds": round(time.time() - t, 1), "steps": logs[-1].step if logs else start,
                               "first_loss": logs[0].loss if logs else None, "last_loss": logs[-1].loss if logs else None,
                               "weights_hash": agent.weights_hash}
        self.save_summary()
        return agent

    def evaluate(self, agent: Any, evals: Any, prefix: str) -> None:
        from ait_env.agent_training.scoring import score_agent
        from ait_env.integrations.verifiers_env import resolve_families

        for e in evals:
            label = f"{prefix}{e.label}"
            out = self.out / "eval" / label
            asked = {"weights_hash": agent.weights_hash, "backend": str(e.backend), "families": str(e.families),
                     "episodes_per_family": int(e.episodes),
                     "max_tokens": int(e.get("max_tokens") or self.p.max_tokens),
                     "temperature": float(e.get("temperature", self.p.temperature))}
            if e.get("max_turns"):  # a shorter turn limit for this evaluation only (the zero-shot model never ends)
                asked["max_turns"] = int(e.max_turns)
            before = self.summary.get("evals", {}).get(label, {})
            if (out / "results.json").is_file():
                changed = {k: (before.get(k), v) for k, v in asked.items() if before.get(k) != v}
                if not changed:
                    self.log(f"[eval] {label}: done before")
                    continue
                self.log(f"[eval] {label}: scored before with other settings {changed}: scoring again")
            t = time.time()
            self.log(f"[eval] {label}: {e.episodes} episodes of {e.families} on {e.backend}")
            over = self.overrides()
            if str(e.backend) == "local" and self.p.get("local_options"):
                over["backend"] = {"options": OmegaConf.to_container(self.p.local_options, resolve=True)}
            if "max_turns" in asked:
                over["env"]["max_turns"] = asked["max_turns"]

            def score(resume: bool) -> dict[str, Any]:
                return score_agent(agent, resolve_families(str(e.families)), int(e.episodes), backend=str(e.backend),
                                   out=out, seed=int(e.get("seed", 0)), temperature=asked["temperature"],
                                   max_tokens=asked["max_tokens"], concurrency=int(self.p.concurrency),
                                   overrides=over, log=self.log, resume=resume)

            try:  # an eval cut short by a stop goes on from its last finished episode
                rows = score(resume=True)
            except ResumeMismatch as err:
                self.log(f"[eval] {label}: {err}; scoring again")
                shutil.rmtree(out)
                rows = score(resume=False)
            self.summary.setdefault("evals", {})[label] = {
                **asked, "seconds": round(time.time() - t, 1),
                **{k: rows["all"][k] for k in ("episodes", "kept", "mean_reward", "ci95", "validation_rate", "status")}}
            self.save_summary()

    def rl(self, agent: Any) -> Any:
        import torch

        from ait_env.agent_models.load import load_agent, save_checkpoint
        from ait_env.agent_training.rl import AgentGRPO, RLSettings
        from ait_env.backends import make_backend
        from ait_env.config import compose

        final = self.out / "final"
        if (final / "model.safetensors").is_file():
            self.log(f"[rl] done before: {final}")
            return load_agent(final)
        r = self.p.rl
        s = RLSettings(**OmegaConf.to_container(r.settings, resolve=True))  # type: ignore[arg-type]
        ckpt = self.out / "rl_ckpt"
        metrics = self.out / "metrics.jsonl"
        start, opt_state = 0, None
        if (ckpt / "state.pt").is_file():
            agent = load_agent(ckpt)
            state = torch.load(ckpt / "state.pt", weights_only=False)
            start, opt_state = int(state["step"]), state.get("optimizer")
            self.log(f"[rl] resuming at step {start} from {ckpt}")
        else:
            metrics.write_text("")
            (self.out / "rollouts.jsonl").write_text("")
        over = self.overrides()
        backend_over = OmegaConf.to_container(r.backend, resolve=True)
        assert isinstance(backend_over, dict)
        name = str(backend_over.pop("name"))
        settings = compose(backend=name, overrides={**over, "backend": backend_over})
        backend = make_backend(settings.backend, settings.env.runs_path)
        self.log(f"[rl] {s.steps} steps x {s.groups} groups x {s.group_size} episodes on {name}"
                 f"{' (SURROGATE scores)' if backend.surrogate else ''}, lr {s.lr}, temperature {s.temperature}")
        try:
            with AgentGRPO(agent, backend, s, overrides=over, optimizer_state=opt_state) as trainer:
                for step in range(start, s.steps):
                    rec = trainer.step(step)
                    mean, half = mean_ci(rec.rewards)
                    row = {"step": step, "reward_mean": mean, "reward_ci95": half, "rewards": rec.rewards,
                           "dropped": rec.dropped, "statuses": rec.statuses, "validated": rec.validated,
                           "families": rec.families, "rollout_s": round(rec.rollout_seconds, 1),
                           "train_s": round(rec.train_seconds, 1), "lr": rec.lr,
                           **{f"optim/{k}": v for k, v in rec.metrics.items()}}
                    with open(metrics, "a") as f:
                        f.write(json.dumps(row) + "\n")
                    with open(self.out / "rollouts.jsonl", "a") as f:
                        for x in rec.rollouts:
                            f.write(json.dumps({"step": step, **x}) + "\n")
                    save_checkpoint(agent, ckpt, {"stage": "rl", "step": step + 1})
                    torch.save({"step": step + 1, "optimizer": trainer.opt.state_dict() if trainer.opt else None},
                               ckpt / "state.pt")
                    self.log(f"[rl] step {step + 1}/{s.steps}: reward {mean if mean is None else round(mean, 3)}"
                             f" ± {half if half is None else round(half, 3)} ({len(rec.rewards)} kept, {rec.dropped}"
                             f" dropped), validated {rec.validated:.2f}, {rec.statuses}, rollouts "
                             f"{rec.rollout_seconds:.0f} s, update {rec.train_seconds:.0f} s")
        finally:
            backend.close()
        save_checkpoint(agent, final, {"stage": "rl", "settings": OmegaConf.to_container(r.settings),
                                       "backend": name})
        shutil.rmtree(ckpt, ignore_errors=True)
        rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        self.summary["rl"] = {"steps": len(rows), "weights_hash": agent.weights_hash, **quarters(rows)}
        self.save_summary()
        return agent

    def charts(self) -> None:
        metrics = self.out / "metrics.jsonl"
        if not metrics.is_file():
            return
        rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        if not rows:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.8), layout="constrained")
        xs = [r["step"] + 1 for r in rows if r["reward_mean"] is not None]
        ys = [r["reward_mean"] for r in rows if r["reward_mean"] is not None]
        es = [r["reward_ci95"] or 0.0 for r in rows if r["reward_mean"] is not None]
        ax.errorbar(xs, ys, yerr=es, fmt="o-", capsize=3, label=f"{self.p.name} (lr {self.p.rl.settings.lr})")
        ax.set_xlabel("RL step")
        ax.set_ylabel("batch mean reward (95% CI)")
        ax.set_title(f"{self.summary.get('model', {}).get('name', '')} through AIT/JobWriting-v0 "
                     f"({self.p.rl.backend.name} backend)", fontsize=10)
        ax.legend(loc="lower right", fontsize=8)
        (self.out / "charts").mkdir(exist_ok=True)
        fig.savefig(self.out / "charts" / "reward.png", dpi=120)
        plt.close(fig)


def run(cfg: DictConfig) -> Path:
    p = cfg.pilot
    if p.get("trainer") != "local_llm":
        raise SystemExit(f"pilot {p.get('name')!r} is not a local LLM pilot (trainer: {p.get('trainer')!r}); use "
                         "+pilot=laptop-llm or +pilot=laptop-llm-smoke (conf/pilot/)")
    import torch

    from ait_env.hidden.secrets import default_hidden_seeds

    if int(p.threads) > 0:
        torch.set_num_threads(int(p.threads))
    torch.manual_seed(int(p.seed))
    r = Run(cfg)
    seeds = default_hidden_seeds("private", cfg.get("hidden_seeds"))
    r.summary["hidden_seeds"] = seeds.label
    r.log(f"local LLM pilot {p.name} -> {r.out} (hidden seeds {seeds.label})")
    agent = r.model()
    r.log(f"[model] {agent.name}: weights {agent.weights_hash} ({agent.path})")
    demos = r.demos() if not p.get("warm_from") else []
    agent = r.sft(agent, demos)
    r.evaluate(agent, p.get("evals") or [], "warm_")
    if p.get("base_evals"):   # before RL, which takes hours: the zero-shot row stands beside the warm one
        from ait_env.agent_models.load import load_agent

        r.evaluate(load_agent(str(p.model)), p.base_evals, "zero_")
    agent = r.rl(agent)
    r.charts()
    r.evaluate(agent, p.get("final_evals") or [], "final_")
    r.summary["seconds_this_invocation"] = round(time.time() - r.t0, 1)
    r.save_summary()
    r.log(f"done: {r.summary_path}")
    return r.out


@hydra.main(version_base="1.3", config_path="../conf", config_name="local_llm")
def main(cfg: DictConfig) -> None:
    from ait_env.extras import missing_extras_exit, require
    from ait_env.observe.display import no_bars_unless_terminal

    if cfg.get("pilot") is None:
        raise SystemExit("choose a pilot: python trainers/local_llm.py +pilot=<laptop-llm|laptop-llm-smoke> (conf/pilot/)")
    require("trainers/local_llm.py", "local", "torch")
    require("trainers/local_llm.py", "agent", "gguf")
    no_bars_unless_terminal()
    with missing_extras_exit("trainers/local_llm.py"):
        run(cfg)


if __name__ == "__main__":
    from ait_env.processes import sigterm_as_exit

    with sigterm_as_exit():
        main()
