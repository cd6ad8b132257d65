"""Train the job-writing agent with Tinker: importance-sampling GRPO on a LoRA, async off-policy.

    python trainers/tinker_grpo.py +pilot=smoke                 # needs TINKER_API_KEY
    python trainers/tinker_grpo.py +pilot=7                     # then +pilot=7b, then +pilot=7c (warm starts)
    python trainers/tinker_grpo.py +pilot=smoke dry_run=true    # no key: offline service, scripted policy
    python trainers/tinker_grpo.py +pilot=7b --cfg job          # print the composed config

Contract:

- The pilot (``conf/pilot/<name>.yaml``) sets the model, renderer, LoRA rank, learning rate, group size,
  groups per batch, steps, per-turn and per-episode token limits, turn limit, the async off-policy bound,
  the warm start, the backend and its pool, budgets, prices and the eval cadence; ``env.*`` / ``reward.*``
  overrides reach every episode.
- Without the ``tinker`` extra (real run or dry run) it exits with status 3 and one line saying how to
  install it (:mod:`ait_env.extras`), before anything else.
- Without ``TINKER_API_KEY`` (and without ``dry_run=true``) it exits with status 2 before importing the
  cookbook or touching the disk, saying what to set and how to run the loop locally instead.
- Logs go to ``<run_dir>/<pilot>`` (``<pilot>-dryrun`` for dry runs): the cookbook's ``metrics.jsonl``
  (one row per step, plus evaluation rows), ``checkpoints.jsonl``, ``config.json``, ``logs.log`` (every
  message, with the transcripts of the trajectory groups it logs), and this run's cost ledger ``costs.jsonl``.
- Console (``console=compact``, the default; :mod:`ait_env.integrations.tinker_console`): one line per step,
  evaluation and logged trajectory group, colour only on a terminal; ``console=full`` is the cookbook's
  own (metric tables, whole transcripts). A dry run's first line says it is one, and so does every step
  line; its token prices are zero (:func:`run_prices`: nothing is billed) and its charts carry
  ``DRY RUN`` (``run_label.txt`` in the log dir, read by ``trainers/plot_run.py``).
- Resume: rerunning the same pilot resumes from the last full checkpoint in its log dir (weights and
  optimizer state, batch index), which the cookbook does by itself; a warm start is then ignored.
- Warm start: ``warm_start: {pilot: 7}`` loads the *weights* of that pilot's final checkpoint (the last
  row of its ``checkpoints.jsonl`` with a ``state_path``) with a fresh optimizer and step 0;
  ``warm_start: {checkpoint: tinker://...}`` names a checkpoint directly.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

REPO = Path(__file__).resolve().parents[1]
RECIPE = "ai_trains_ai_tinker_grpo"
ENTRY = "trainers/tinker_grpo.py"


def missing_key_message(pilot: str) -> str:
    return (
        "error: TINKER_API_KEY is not set, so the Tinker outer loop cannot start (nothing was started).\n"
        "  - Train on Tinker: export TINKER_API_KEY=<your key from the Tinker console> and rerun:\n"
        f"      python trainers/tinker_grpo.py +pilot={pilot}\n"
        "  - Use a self-hosted Tinker-compatible server: export TINKER_API_KEY=tml-dummy and add\n"
        "      pilot.base_url=http://127.0.0.1:<port>   (docs/tinker.md)\n"
        "  - Run the whole loop locally, without any account:\n"
        f"      python trainers/tinker_grpo.py +pilot={pilot} dry_run=true\n"
        "    (an offline service and a scripted policy drive the same rollouts, rewards, checkpoints and\n"
        "    metrics; the agent does not learn), and `bash scripts/main.sh` runs one real episode on this\n"
        "    machine (scripted agent, local backend)."
    )


def quote_numeric_pilot(argv: list[str]) -> list[str]:
    """``+pilot=7`` would reach Hydra as the integer 7, which a config group rejects: quote it."""
    return [re.sub(r"^(\+?pilot)=(\d+)$", r"\1='\2'", a) for a in argv]


def log_dir(cfg: DictConfig, name: str | None = None, dry_run: bool | None = None) -> Path:
    dry = bool(cfg.dry_run) if dry_run is None else dry_run
    base = Path(str(cfg.run_dir))
    base = base if base.is_absolute() else Path.cwd() / base
    return base / (str(name if name is not None else cfg.pilot.name) + ("-dryrun" if dry else ""))


def resolve_warm_start(cfg: DictConfig) -> str | None:
    """The checkpoint path to load weights from, or None (see the module docstring)."""
    ws = cfg.pilot.get("warm_start")
    if not ws:
        return None
    if ws.get("checkpoint"):
        return str(ws.checkpoint)
    prev = str(ws.get("pilot") or "")
    if not prev:
        raise SystemExit("pilot.warm_start needs 'pilot: <name>' or 'checkpoint: tinker://...'")
    from tinker_cookbook import checkpoint_utils

    prev_dir = log_dir(cfg, prev)
    rows = [r for r in checkpoint_utils.load_checkpoints_file(str(prev_dir)) if r.has("state_path")]
    final = [r for r in rows if r.name == "final"] or rows
    if not final:
        raise SystemExit(
            f"pilot {cfg.pilot.name} warm-starts from pilot {prev}'s final checkpoint, but "
            f"{prev_dir / 'checkpoints.jsonl'} has none. Run `python trainers/tinker_grpo.py +pilot={prev}"
            f"{' dry_run=true' if cfg.dry_run else ''}` first, or set pilot.warm_start.checkpoint=tinker://...")
    return str(final[-1].state_path)


def env_overrides(cfg: DictConfig, run_log: Path) -> dict[str, Any]:
    p = cfg.pilot
    env = OmegaConf.to_container(cfg.env, resolve=True)
    assert isinstance(env, dict)
    env["max_turns"] = int(p.max_turns)
    env["ledger"] = {**dict(env.get("ledger") or {}), "path": str(run_log / "costs.jsonl"),
                     "global_budget_usd": p.budgets.get("run_usd"), "episode_budget_usd": p.budgets.get("episode_usd")}
    out: dict[str, Any] = {"env": env, "reward": OmegaConf.to_container(cfg.reward, resolve=True)}
    options = OmegaConf.to_container(p.backend.options, resolve=True) if p.backend.get("options") else {}
    if options:
        out["backend"] = {"options": options}  # validated by the backend's typed options
    return out


def pilot_backend(cfg: DictConfig, environ: Any = None) -> tuple[str, str]:
    """(the backend this pilot's jobs run on, why). ``pilot.backend.name: auto`` picks ``runpod`` when
    ``RUNPOD_API_KEY`` and an endpoint id (``RUNPOD_ENDPOINT_ID`` or ``pilot.backend.options.endpoint_id``)
    are set, else ``pilot.backend.fallback`` (default ``local``); a dry run never picks runpod."""
    p = cfg.pilot
    name = str(p.backend.name)
    if name != "auto":
        return name, "pilot.backend.name"
    env = os.environ if environ is None else environ
    opts = p.backend.get("options") or {}
    fallback = str(p.backend.get("fallback") or "local")
    if cfg.get("dry_run"):
        return fallback, "auto; a dry run never dispatches to Runpod"
    if env.get("RUNPOD_API_KEY") and (env.get("RUNPOD_ENDPOINT_ID") or opts.get("endpoint_id")):
        return "runpod", "auto: RUNPOD_API_KEY and an endpoint id are set"
    return fallback, "auto: RUNPOD_API_KEY or RUNPOD_ENDPOINT_ID is not set"


def _wandb_project(cfg: DictConfig) -> str | None:
    """The W&B project (the cookbook's own logger), or None; ``wandb.mode=offline`` needs no account."""
    w = cfg.get("wandb") or {}
    if not w.get("project"):
        return None
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        raise SystemExit("wandb.project is set but wandb is not installed: pip install wandb "
                         "(or leave wandb.project unset; metrics.jsonl is written either way)")
    os.environ.setdefault("WANDB_MODE", str(w.get("mode") or "online"))
    return str(w.project)


def run_prices(cfg: DictConfig) -> dict[str, Any]:
    """The pilot's dated token prices; a dry run's are zero (a scripted policy, no LLM: nothing is billed,
    so its ledger, metrics and console show no LLM cost)."""
    prices = OmegaConf.to_container(cfg.pilot.prices, resolve=True)
    assert isinstance(prices, dict)
    if cfg.get("dry_run"):
        return {"prefill": 0.0, "cached_prefill": 0.0, "sample": 0.0, "train": 0.0,
                "as_of": str(prices.get("as_of", "")), "source": "dry run: a scripted policy, nothing billed"}
    return prices


def build_train_config(cfg: DictConfig) -> Any:
    """The cookbook's ``train.Config`` for this pilot (chz does no type checks: every value is cast)."""
    import json

    from tinker_cookbook.rl import train

    from ait_env.conf import conf_dir, group_options
    from ait_env.integrations.tinker_datasets import JobWritingDatasetBuilder, drop_infra_strategy
    from ait_env.observe.plots import run_label, write_run_label

    from ait_env.hidden.secrets import default_hidden_seeds

    p = cfg.pilot
    seeds = default_hidden_seeds("private", cfg.get("hidden_seeds"))   # before any job runner starts: inherited
    backend, why = pilot_backend(cfg)
    print(f"pilot {p.name}: jobs run on backend {backend} ({why}); hidden_seeds {seeds.label}", file=sys.stderr,
          flush=True)
    if not (conf_dir() / "backend" / f"{backend}.yaml").is_file():
        raise SystemExit(f"pilot {p.name} runs its jobs on backend {backend!r}, which this checkout does not have "
                         f"(no conf/backend/{backend}.yaml; available: {', '.join(group_options('backend'))}). "
                         "Pick one with pilot.backend.name=<name>.")
    run_log = log_dir(cfg)
    run_log.mkdir(parents=True, exist_ok=True)
    write_run_label(run_log, run_label(surrogate=backend == "stub", backend=backend, dry_run=bool(cfg.dry_run),
                                       hidden_seeds=seeds.label))
    resuming = (run_log / "checkpoints.jsonl").is_file()
    warm = None if resuming else resolve_warm_start(cfg)
    g = int(p.group_size)
    k = p.get("async", {}).get("max_steps_off_policy")
    builder = JobWritingDatasetBuilder(
        model_name=str(p.model), renderer_name=str(p.renderer), group_size=g, groups_per_batch=int(p.groups_per_batch),
        n_batches=int(p.steps), seed=int(p.seed), backend=backend,
        env_overrides_json=json.dumps(env_overrides(cfg, run_log)), max_tokens=int(p.max_tokens),
        max_trajectory_tokens=int(p.max_trajectory_tokens) if p.get("max_trajectory_tokens") else None,
        eval_heldout_groups=int(p.eval.heldout_groups), eval_train_groups=int(p.eval.train_groups),
        eval_group_size=int(p.eval.group_size), prices_json=json.dumps(run_prices(cfg)),
        run_budget_usd=float(p.budgets.run_usd) if p.budgets.get("run_usd") is not None else None,
        run_id=f"{p.name}{'-dryrun' if cfg.dry_run else ''}", backend_factory=cfg.get("backend_factory"),
        env_threads=int(p.rollout.env_threads))
    return train.Config(
        learning_rate=float(p.learning_rate), dataset_builder=builder, model_name=str(p.model), recipe_name=RECIPE,
        max_tokens=int(p.max_tokens), log_path=str(run_log), renderer_name=str(p.renderer),
        lora_rank=int(p.lora_rank), loss_fn=str(p.loss_fn), temperature=float(p.temperature),
        eval_every=int(p.eval.every), save_every=int(p.save_every), load_checkpoint_path=warm,
        rollout_error_tolerance=drop_infra_strategy(g, int(p.rollout.min_group), int(p.rollout.max_retries),
                                                    float(p.rollout.timeout_s) if p.rollout.get("timeout_s") else None),
        async_config=(train.AsyncConfig(max_steps_off_policy=int(k), groups_per_batch=int(p.groups_per_batch))
                      if k is not None else None),
        base_url=str(p.base_url) if p.get("base_url") else None, max_steps=int(p.steps),
        wandb_project=_wandb_project(cfg), wandb_name=str(p.name) if _wandb_project(cfg) else None,
        num_groups_to_log=1, rollout_json_export=False)


def dry_run_banner(cfg: DictConfig) -> str:
    """The first line of a dry run: what it is and what it is not."""
    p = cfg.pilot
    backend = pilot_backend(cfg)[0]
    surrogate = " (surrogate scores)" if backend == "stub" else ""
    return ("OFFLINE dry run: a scripted policy plays the agent (no Tinker account, no model; nothing "
            f"learns); pilot {p.name}: {int(p.steps)} steps x {int(p.groups_per_batch)} groups x {int(p.group_size)} "
            f"episodes on backend {backend}{surrogate}")


def run(cfg: DictConfig, record: Any = None) -> Path:
    """Build and run the loop (hosted / self-hosted, or offline when ``dry_run``); returns the log dir.
    Every episode of the run shares one backend, closed when the run ends."""
    import asyncio
    from contextlib import ExitStack

    from tinker_cookbook.rl import train

    from ait_env.integrations.tinker import close_run_backends
    from ait_env.integrations.tinker_console import compact_console

    console = str(cfg.get("console") or "compact")
    if console not in ("compact", "full"):
        raise SystemExit(f"console={console!r}: choose console=compact (a line per step) or console=full "
                         "(the cookbook's own console)")
    config = build_train_config(cfg)
    logging.getLogger(__name__).info("pilot %s: logging to %s", cfg.pilot.name, config.log_path)
    try:
        with ExitStack() as stack:
            if console == "compact":
                stack.enter_context(compact_console(dry_run=bool(cfg.dry_run)))
            if cfg.dry_run:
                run_offline(cfg, config, record)
            else:
                asyncio.run(train.main(config))
    finally:
        close_run_backends(config.dataset_builder.run_id)  # the run's one backend (every episode shared it)
    return Path(config.log_path)


def run_offline(cfg: DictConfig, config: Any, record: Any = None) -> None:
    """The loop with the offline service and a scripted policy (``dry_run=true``)."""
    import asyncio
    from unittest import mock

    import tinker
    from tinker_cookbook.rl import train

    from ait_env.integrations.tinker import get_renderer
    from ait_env.integrations.tinker_offline import (
        OfflineRecord,
        ScriptedPolicy,
        build_local_tokenizer,
        offline_service_client,
        register_local_tokenizer,
    )

    tok_dir = Path(os.environ.get("AIT_CACHE_DIR", Path.home() / ".cache" / "ai-trains-ai")) / "tokenizers" / "local-bpe"
    register_local_tokenizer(str(cfg.pilot.model), build_local_tokenizer(tok_dir))
    record = record if record is not None else OfflineRecord()
    policy = lambda: ScriptedPolicy(get_renderer(str(cfg.pilot.renderer), str(cfg.pilot.model)))
    with mock.patch.object(tinker, "ServiceClient", offline_service_client(policy, record)):
        asyncio.run(train.main(config))


@hydra.main(version_base="1.3", config_path="../conf", config_name="tinker_grpo")
def main(cfg: DictConfig) -> None:
    from ait_env.extras import missing_extras_exit

    with missing_extras_exit(ENTRY):
        _main(cfg)


def _main(cfg: DictConfig) -> None:
    from ait_env.observe.display import no_bars_unless_terminal
    from ait_env.extras import require

    if cfg.get("pilot") is None:
        raise SystemExit("choose a pilot: python trainers/tinker_grpo.py +pilot=<smoke|7|7b|7c> (conf/pilot/)")
    if cfg.pilot.get("trainer", "tinker") != "tinker":
        raise SystemExit(f"pilot {cfg.pilot.name} is for trainers/{cfg.pilot.trainer}.py, not the Tinker trainer")
    # a real run and a dry run both drive the cookbook: checked before the key, whose advice is a dry run
    require(ENTRY + (" dry_run=true" if cfg.dry_run else ""), "tinker", "tinker_cookbook", "tinker")
    if not cfg.dry_run and not os.environ.get("TINKER_API_KEY"):
        print(missing_key_message(str(cfg.pilot.name)), file=sys.stderr)
        raise SystemExit(2)
    no_bars_unless_terminal()  # a tee'd log gets lines, not tqdm redraws
    if cfg.dry_run:
        print(dry_run_banner(cfg), flush=True)
    if str(cfg.get("console") or "compact") == "compact":
        from ait_env.integrations.tinker_console import console_handler

        logging.basicConfig(level=logging.INFO, handlers=[console_handler()])
    else:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = run(cfg)
    print(f"done: {out}/metrics.jsonl; charts: python trainers/plot_run.py {out}")


if __name__ == "__main__":
    from ait_env.processes import sigterm_as_exit

    sys.argv = quote_numeric_pilot(sys.argv)
    with sigterm_as_exit():  # a SIGTERM stops the running jobs too, not only this process
        main()
