"""The prime-rl v0.7.0 adapter: a validated :class:`~ait_env.jobs.schema.Job` -> ``rl.toml``, plus
prime-rl's own config rules as :class:`~ait_env.jobs.schema.JobIssue` lists.

All version-specific knowledge (key names, defaults, the renderer map, the weights layout) lives in
this module, so a later prime-rl/verifiers stack is a second adapter next to this one.

Pinned stack: prime-rl tag ``v0.7.0`` (commit d334ea52940b47f426293a7d146239e3fbf91caa, 2026-07-13)
with verifiers 0.2.0 (its ``deps/verifiers`` submodule pin 6c64ce6). The keys below mirror these files
at that tag (paths relative to the prime-rl repository):

- ``packages/prime-rl-configs/src/prime_rl/configs/rl.py`` -- ``RLConfig``: top-level ``max_steps``,
  ``seq_len``, ``output_dir``, ``clean_output_dir``; ``[model] name`` (``SharedModelConfig``);
  ``[ckpt]`` (``SharedCheckpointConfig``; a bare table enables trainer + orchestrator checkpoints);
  ``[wandb]`` (``SharedWandbConfig``, left out = W&B off); ``[inference]`` (present = the ``rl``
  launcher starts vLLM); ``[deployment]`` (``num_train_gpus`` / ``num_infer_gpus``, default 1 + 1).
- ``packages/prime-rl-configs/src/prime_rl/utils/validation.py`` -- ``propagate_shared_fields``:
  ``max_steps`` -> trainer + orchestrator, ``seq_len`` -> ``trainer.model.seq_len`` +
  ``orchestrator.seq_len``, ``model.name`` -> trainer/orchestrator/inference, ``output_dir`` ->
  ``trainer.output_dir`` and ``orchestrator.output_dir = <output_dir>/run_default``.
- ``packages/prime-rl-configs/src/prime_rl/configs/trainer.py`` -- ``[trainer.optim]``
  (``AdamWConfig`` betas1/betas2, ``MuonConfig`` mu/betas1/betas2, ``SGDConfig``, ``SignSGDConfig``;
  all share lr/weight_decay/max_norm), ``[trainer.scheduler]`` (``constant`` / ``linear``
  warmup_steps, decay_steps, min_lr / ``cosine`` warmup_steps, min_lr), ``[trainer.loss]``
  (``default`` dppo_mask_low/high, adv_tau, kl_tau / ``ipo`` ipo_threshold, adv_tau, kl_tau),
  ``[trainer.ckpt]`` (``CheckpointConfig``: ``weights`` on by default, ``weights_only``).
- ``packages/prime-rl-configs/src/prime_rl/configs/orchestrator.py`` -- ``[orchestrator]``
  ``batch_size`` and ``group_size`` (alias ``rollouts_per_example``; validator ``resolve_batching``:
  "Batch size must be divisible by the number of samples per problem"), ``[orchestrator.algo]``,
  ``[orchestrator.renderer]`` (validator ``validate_renderer_auto_resolves``),
  ``[orchestrator.train.sampling]`` ``temperature`` (0..2) and ``max_completion_tokens`` (alias
  ``max_tokens``, deprecated), ``[[orchestrator.train.env]]`` ``id`` / ``args`` / ``name`` (the v0
  fields of verifiers 0.2.0 ``verifiers/v1/env.py::EnvConfig``: ``load_environment(id, **args)``),
  ``[orchestrator.eval]`` + ``[[orchestrator.eval.env]]``.
- ``packages/prime-rl-configs/src/prime_rl/configs/algorithm.py`` -- ``AlgoConfig`` union:
  ``grpo`` (default) and ``max_rl`` both exist at v0.7.0.
- ``src/prime_rl/trainer/scheduler.py`` -- runtime asserts (not config-time!): cosine needs
  ``max_steps`` (decay = max_steps - warmup_steps), linear needs warmup or decay > 0 and
  ``max_steps - decay_steps >= warmup_steps``.
- ``src/prime_rl/trainer/ckpt.py`` (``WeightCheckpointManager``, ``setup_ckpt_managers``),
  ``src/prime_rl/utils/pathing.py`` (``get_weights_dir``) and ``src/prime_rl/trainer/rl/train.py``
  (steps count from 1; the final weight checkpoint is written after the last step): HF weights +
  config + tokenizer land in ``<output_dir>/weights/step_N/`` (a ``STABLE`` file marks a complete
  one), always for ``N = max_steps`` when ``[ckpt]`` is on. ``[trainer.ckpt] weights_only = true``
  skips the (large, resume-only) optimizer/DCP checkpoint.
- ``deps/renderers`` @ 5904fa2 (``renderers.base.MODEL_RENDERER_MAP``; the closest PyPI release is
  renderers 0.1.8.dev61): the Qwen3 entries are mirrored in :data:`MODEL_RENDERER_MAP`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from ait_env.jobs.schema import Job, JobIssue, Optim, PrimeRL

PRIME_RL_TAG = "v0.7.0"
PRIME_RL_COMMIT = "d334ea52940b47f426293a7d146239e3fbf91caa"
VERIFIERS_VERSION = "0.2.0"

#: Subset of ``renderers.base.MODEL_RENDERER_MAP`` (renderers pinned by prime-rl v0.7.0): the text
#: Qwen3 models this project can train. ``renderer = "auto"`` fails config validation for any model
#: not in the real map (e.g. a local path), so the rendered rl.toml names the renderer explicitly.
MODEL_RENDERER_MAP: dict[str, str] = {
    "Qwen/Qwen3-0.6B": "qwen3",
    "Qwen/Qwen3-1.7B": "qwen3",
    "Qwen/Qwen3-4B": "qwen3",
    "Qwen/Qwen3-4B-Instruct-2507": "qwen3",
    "Qwen/Qwen3-4B-Thinking-2507": "qwen3",
    "Qwen/Qwen3-8B": "qwen3",
    "Qwen/Qwen3-14B": "qwen3",
}
# Not "PrimeIntellect/Qwen3-*": "prime-qwen3": that renderer came to renderers in 0.1.8.dev58 (2026-07-10),
# after the commit prime-rl v0.7.0 pins (5904fa2, bumped 2026-07-03 "for Laguna-XS-2.1 support"; its
# nearest release, 0.1.8.dev54, and dev55 have no prime-qwen3). tests/jobs/test_primerl.py checks this map
# against the installed renderers (AIT_PRIMERL_CONFIGS_PYTHON).

#: Top-level modules importable where prime-rl runs a job (its dependencies' import names, from the
#: ``[project] dependencies`` of prime-rl's ``pyproject.toml``, read from a stored copy at commit 005c286;
#: verified against that copy only). An agent module of the same name would be shadowed by, or shadow,
#: the installed one; the probe refuses such names (besides anything importable on this machine).
PRIME_RL_ENV_MODULES = frozenset({
    "prime_rl", "prime", "verifiers", "renderers", "datasets", "pyarrow", "numpy", "torch", "torchvision",
    "torchaudio", "torchdata", "torchtitan", "transformers", "vllm", "vllm_router", "liger_kernel", "wandb",
    "ring_flash_attn", "flash_attn", "flash_attn_3", "fla", "tilelang", "dion", "mooncake", "zmq", "loguru",
    "beartype", "jaxtyping", "aiolimiter", "tenacity", "openai", "orjson", "rich", "setproctitle", "uvloop",
    "pynvml", "pybase64", "psutil", "triton", "pydantic", "pydantic_config", "tomli", "tomli_w",
})

#: Renderer configs that take ``enable_thinking`` (``renderers.configs.Qwen3RendererConfig``).
_THINKING_RENDERERS = frozenset({"qwen3"})

#: ``[trainer.optim]`` type-specific parameters and their v0.7.0 defaults (trainer.py). Every
#: optimizer also takes lr, weight_decay and max_norm (``BaseOptimizerConfig``).
OPTIM_PARAMS: dict[str, dict[str, float]] = {
    "adamw": {"betas1": 0.9, "betas2": 0.999},
    "muon": {"mu": 0.95, "betas1": 0.9, "betas2": 0.95},
    "sgd": {},
    "sign_sgd": {},
}
_OPTIM_COMMON = ("lr", "weight_decay", "max_norm")

#: Our ``[prime_rl.algo] type`` -> ``[orchestrator.algo] type`` (algorithm.py).
ALGO_TYPES: dict[str, str] = {"grpo": "grpo", "max_rl": "max_rl"}


_HEADER = (f"# prime-rl {PRIME_RL_TAG} rl.toml (verifiers {VERIFIERS_VERSION}, classic environment API),\n"
           "# rendered from job.toml by ait_env.jobs.primerl. Launch: uv run rl @ rl.toml\n")


class PrimeRLRenderError(ValueError):
    """The job cannot be expressed as a valid prime-rl v0.7.0 config."""

    def __init__(self, issues: list[JobIssue]):
        self.issues = issues
        super().__init__("; ".join(f"{i.where}: {i.message}" for i in issues))


@dataclass(frozen=True)
class RenderOptions:
    """Knobs of the rendered config that are not part of the agent's job.

    ``None`` means "leave prime-rl's default" (the key is not written).
    """

    #: Write only HF weights (``weights/step_N``), no optimizer/DCP state (cannot resume, much smaller).
    weights_only: bool = True
    #: Save HF weights every N steps too (``[ckpt] interval``); None = only at the final step.
    ckpt_interval: int | None = None
    #: Also run the job's environment as an eval env (``[orchestrator.eval]``); off by default.
    eval_env: bool = False
    eval_interval: int = 10
    eval_num_examples: int = 64
    #: ``load_environment`` kwargs for the eval env; None = the job's ``[env]``.
    eval_args: dict[str, Any] | None = None
    #: Explicit renderer name; None = from :data:`MODEL_RENDERER_MAP`.
    renderer: str | None = None
    #: Qwen3 renderer ``enable_thinking`` (prime-rl default: true).
    enable_thinking: bool | None = None
    #: ``[trainer.model] attn`` (v0.7.0 default ``flash_attention_2``).
    attn: str | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    enforce_eager: bool | None = None
    num_train_gpus: int | None = None
    num_infer_gpus: int | None = None
    clean_output_dir: bool = False
    env_vars: dict[str, str] = field(default_factory=dict)


# ----------------------------------------------------------------------------- rendering

def renderer_for(model: str) -> str | None:
    """The v0.7.0 renderer name for a model id, or None when prime-rl has none."""
    return MODEL_RENDERER_MAP.get(model)


def weights_dir(output_dir: str | Path, step: int) -> Path:
    """Where prime-rl v0.7.0 writes servable HF weights for ``step`` (``weights/step_N``)."""
    return Path(output_dir) / "weights" / f"step_{step}"


def final_weights_dir(job: Job, output_dir: str | Path) -> Path:
    """The weights of the last step (always written when ``[ckpt]`` is on)."""
    return weights_dir(output_dir, job.prime_rl.max_steps)


def _optim_table(job: Job) -> dict[str, Any]:
    o = job.prime_rl.optim
    out: dict[str, Any] = {"type": o.type}
    for k in _OPTIM_COMMON:
        v = getattr(o, k)
        out[k] = "None" if v is None else v   # prime-rl's BaseConfig reads the string "None" as None
    for k, default in OPTIM_PARAMS[o.type].items():
        out[k] = getattr(o, k) if k in o.model_fields_set else default
    return out


def rl_config_dict(job: Job, *, env_id: str, output_dir: str | Path,
                   options: RenderOptions | None = None) -> dict[str, Any]:
    """The rl.toml content as a dict (see :func:`render_rl_toml`)."""
    opts = options or RenderOptions()
    issues = config_rules(job, renderer_override=opts.renderer)
    if issues:
        raise PrimeRLRenderError(issues)
    p = job.prime_rl
    renderer: dict[str, Any] = {"name": opts.renderer or renderer_for(job.job.base_model)}
    if opts.enable_thinking is not None and renderer["name"] in _THINKING_RENDERERS:
        renderer["enable_thinking"] = opts.enable_thinking

    cfg: dict[str, Any] = {"max_steps": p.max_steps, "seq_len": p.seq_len, "output_dir": str(output_dir)}
    if opts.clean_output_dir:
        cfg["clean_output_dir"] = True
    if opts.env_vars:
        cfg["env_vars"] = dict(sorted(opts.env_vars.items()))
    cfg["model"] = {"name": job.job.base_model}
    cfg["ckpt"] = {} if opts.ckpt_interval is None else {"interval": opts.ckpt_interval}
    if opts.num_train_gpus is not None or opts.num_infer_gpus is not None:
        dep: dict[str, Any] = {"type": "single_node"}
        if opts.num_train_gpus is not None:
            dep["num_train_gpus"] = opts.num_train_gpus
        if opts.num_infer_gpus is not None:
            dep["num_infer_gpus"] = opts.num_infer_gpus
        cfg["deployment"] = dep

    trainer: dict[str, Any] = {}
    if opts.attn is not None:
        trainer["model"] = {"attn": opts.attn}
    trainer["ckpt"] = {"weights_only": opts.weights_only}
    trainer["optim"] = _optim_table(job)
    trainer["scheduler"] = p.scheduler.model_dump()
    trainer["loss"] = p.loss.model_dump()
    cfg["trainer"] = trainer

    train_env: dict[str, Any] = {"id": env_id, "name": job.job.family}
    if job.env:
        train_env["args"] = dict(job.env)
    orch: dict[str, Any] = {
        "batch_size": p.batch_size,
        "group_size": p.group_size,
        "algo": {"type": ALGO_TYPES[p.algo.type]},
        "renderer": renderer,
        "train": {
            "sampling": {"temperature": p.sampling.temperature,
                         "max_completion_tokens": p.sampling.max_tokens},
            "env": [train_env],
        },
    }
    if opts.eval_env:
        eval_env: dict[str, Any] = {"id": env_id, "name": job.job.family}
        eval_args = job.env if opts.eval_args is None else opts.eval_args
        if eval_args:
            eval_env["args"] = dict(eval_args)
        orch["eval"] = {
            "interval": opts.eval_interval,
            "num_examples": opts.eval_num_examples,
            "sampling": {"temperature": 0.0, "max_completion_tokens": p.sampling.max_tokens},
            "env": [eval_env],
        }
    cfg["orchestrator"] = orch

    inference: dict[str, Any] = {}
    if opts.gpu_memory_utilization is not None:
        inference["gpu_memory_utilization"] = opts.gpu_memory_utilization
    model: dict[str, Any] = {}
    if opts.max_model_len is not None:
        model["max_model_len"] = opts.max_model_len
    if opts.enforce_eager is not None:
        model["enforce_eager"] = opts.enforce_eager
    if model:
        inference["model"] = model
    cfg["inference"] = inference
    return cfg


def render_rl_toml(job: Job, *, env_id: str, output_dir: str | Path,
                   options: RenderOptions | None = None) -> str:
    """Render ``job`` as a prime-rl v0.7.0 ``rl.toml``.

    ``env_id`` is the importable package prime-rl loads (``load_environment(**[env])``), normally
    :func:`ait_env.jobs.bundle.env_id_for`; ``output_dir`` is the run directory (HF weights end up in
    :func:`final_weights_dir`). W&B stays off (no ``[wandb]``). Raises :class:`PrimeRLRenderError`
    when a rule of :func:`config_rules` fails (a renderer never writes a config prime-rl would refuse).
    """
    return _HEADER + tomli_w.dumps(rl_config_dict(job, env_id=env_id, output_dir=output_dir, options=options))


# ----------------------------------------------------------------------------- rules

def _issue(field_: str, message: str, fix: str) -> JobIssue:
    return JobIssue(where=f"job.toml: {field_}", message=message, fix=fix)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _table(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def config_rules(raw: dict[str, Any] | Job, *, renderer_override: str | None = None) -> list[JobIssue]:
    """prime-rl v0.7.0's cross-field rules, the one implementation, on job.toml's table (or a parsed
    :class:`Job`). Values that are missing take the schema's defaults; a value of the wrong type is left
    to the schema's own issue, so the rules can run (and be reported together with schema issues) on a
    job that does not parse. Every issue names the field and the allowed range or the fix."""
    if isinstance(raw, Job):
        raw = raw.model_dump(exclude_unset=True)
    out: list[JobIssue] = []
    p = _table(raw.get("prime_rl"))
    steps = _int(p.get("max_steps"))
    batch = _int(p.get("batch_size", PrimeRL.model_fields["batch_size"].default))
    group = _int(p.get("group_size", PrimeRL.model_fields["group_size"].default))
    # orchestrator.py resolve_batching
    if batch and group and batch > 0 and group > 0 and batch % group:
        lo = group * max(1, batch // group)
        hi = lo + group if lo < batch else lo
        out.append(_issue("prime_rl.batch_size", f"batch_size ({batch}) must be divisible by group_size ({group})",
                          f"Set batch_size to a multiple of group_size, e.g. {lo}" + (f" or {hi}." if hi != lo else ".")))
    # trainer/scheduler.py (runtime asserts prime-rl only hits at trainer start)
    sched = _table(p.get("scheduler"))
    kind = sched.get("type", "constant")
    warm = _int(sched.get("warmup_steps", 10))
    decay = _int(sched.get("decay_steps", 10))
    if kind == "cosine" and steps and warm is not None and warm >= steps:
        out.append(_issue("prime_rl.scheduler.warmup_steps",
                          f"scheduler.warmup_steps = {warm} must be < max_steps ({steps}) for a cosine schedule "
                          f"(it decays over max_steps - warmup_steps steps); allowed range 0..{steps - 1}",
                          f"Set warmup_steps between 0 and {steps - 1}, or raise max_steps."))
    if kind == "linear" and warm is not None and decay is not None:
        if warm + decay == 0:
            out.append(_issue("prime_rl.scheduler", "a linear scheduler needs warmup_steps > 0 or decay_steps > 0",
                              'Set warmup_steps and/or decay_steps (>= 1), or use type = "constant".'))
        elif steps and warm + decay > steps:
            out.append(_issue("prime_rl.scheduler.decay_steps",
                              f"scheduler.warmup_steps + decay_steps = {warm} + {decay} = {warm + decay} must be "
                              f"<= max_steps ({steps})", f"Lower warmup_steps and decay_steps so their sum is at "
                              f"most {steps}, or raise max_steps."))
    optim = _table(p.get("optim"))
    lr = _num(optim.get("lr", Optim.model_fields["lr"].default))
    min_lr = _num(sched.get("min_lr", 0.0))
    if kind in ("linear", "cosine") and lr is not None and min_lr is not None and min_lr > lr:
        out.append(_issue("prime_rl.scheduler.min_lr", f"scheduler.min_lr = {min_lr:g} is above optim.lr = {lr:g}; "
                          f"allowed range 0..{lr:g}",
                          "Set min_lr at most lr (the schedule warms up from and decays to min_lr)."))
    # trainer.py: each optimizer config forbids the parameters of the others
    otype = optim.get("type", "adamw")
    if otype in OPTIM_PARAMS:
        allowed = OPTIM_PARAMS[otype]
        for k in sorted(set(optim) - set(_OPTIM_COMMON) - {"type"} - set(allowed)):
            if k in Optim.model_fields:  # an unknown key is the schema's issue
                takes = ", ".join((*_OPTIM_COMMON, *allowed))
                out.append(_issue(f"prime_rl.optim.{k}", f"optim.{k} is not a parameter of optim.type = {otype!r}",
                                  f"Remove optim.{k}; {otype!r} takes only: {takes}."))
    # orchestrator.py validate_renderer_auto_resolves
    model = _table(raw.get("job")).get("base_model")
    if isinstance(model, str) and renderer_override is None and renderer_for(model) is None:
        out.append(_issue("job.base_model", f"prime-rl {PRIME_RL_TAG} has no chat renderer for base_model {model!r} "
                          "(it is not in renderers' MODEL_RENDERER_MAP)",
                          "Pick a supported model: " + ", ".join(MODEL_RENDERER_MAP) + "."))
    return out


def token_budget_rule(job: Job, *, prompt_tokens: int, max_turns: int) -> list[JobIssue]:
    """The rule that needs the environment: ``prompt_tokens + max_turns x max_tokens <= seq_len`` (prime-rl
    silently truncates longer samples). ``prompt_tokens``: tokens of the longest prompt with tool schemas
    under the base model's tokenizer; ``max_turns``: the environment's model-turn limit."""
    if prompt_tokens < 0 or max_turns < 1:
        raise ValueError("prompt_tokens must be >= 0 and max_turns >= 1")
    p = job.prime_rl
    need = prompt_tokens + max_turns * p.sampling.max_tokens
    if need <= p.seq_len:
        return []
    room = (p.seq_len - prompt_tokens) // max_turns
    hint = (f"lower sampling.max_tokens to at most {room}" if room >= 1
            else "shorten the prompt (system prompt, tool schemas)")
    return [_issue("prime_rl.seq_len",
                   f"the prompt ({prompt_tokens} tokens) plus max_turns ({max_turns}) x sampling.max_tokens "
                   f"({p.sampling.max_tokens}) = {need} tokens exceeds seq_len ({p.seq_len})",
                   f"Raise seq_len to at least {need} (within the task limit), {hint}, "
                   "or lower the environment's max_turns.")]

