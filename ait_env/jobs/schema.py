"""``job.toml``: the schema of the job an agent writes.

Three tables, unknown keys rejected everywhere:

- ``[job]``: ``family``, ``base_model``, ``environment`` (the module file in the workspace that
  defines ``load_environment(**env)``);
- ``[prime_rl]``: the exposed prime-rl v0.7.0 surface, with prime-rl's own names and defaults:
  ``max_steps, seq_len, batch_size, group_size`` plus sub-tables ``sampling`` (temperature,
  max_tokens), ``optim`` (type, lr, weight_decay, max_norm, betas1, betas2, mu), ``scheduler``
  (constant / linear / cosine with warmup_steps, decay_steps, min_lr), ``loss`` (default / ipo and
  their parameters) and ``algo`` (grpo / max_rl);
- ``[env]``: keyword arguments for ``load_environment``.

:func:`parse_job` turns TOML text into a :class:`Job` or a list of :class:`JobIssue` that name the
field and say how to fix it (types, ranges, unknown keys). :func:`check_bounds` enforces a family's
:class:`Bounds` on a parsed job. prime-rl's own cross-field rules (batch divisible by group size,
scheduler needs, optimizer parameters, renderer) are version-specific and live with the rest of the
prime-rl adapter, :func:`ait_env.jobs.primerl.config_rules`.
"""

from __future__ import annotations

import math
import tomllib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from task_families.base import Bounds


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobSection(_Strict):
    family: str
    base_model: str
    environment: str = "environment.py"


class Sampling(_Strict):
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    max_tokens: int = Field(512, ge=1)


class Optim(_Strict):
    type: Literal["adamw", "sgd", "muon", "sign_sgd"] = "adamw"
    lr: float = Field(1e-6, ge=0.0)
    weight_decay: float = Field(0.01, ge=0.0)
    max_norm: float | None = Field(1.0, ge=0.0)
    betas1: float = Field(0.9, ge=0.0, lt=1.0)
    betas2: float = Field(0.999, ge=0.0, lt=1.0)
    mu: float = Field(0.95, ge=0.0, lt=1.0)


class ConstantScheduler(_Strict):
    type: Literal["constant"] = "constant"


class LinearScheduler(_Strict):
    type: Literal["linear"] = "linear"
    warmup_steps: int = Field(10, ge=0)
    decay_steps: int = Field(10, ge=0)
    min_lr: float = Field(0.0, ge=0.0)


class CosineScheduler(_Strict):
    type: Literal["cosine"] = "cosine"
    warmup_steps: int = Field(10, ge=0)
    min_lr: float = Field(0.0, ge=0.0)


Scheduler = Annotated[ConstantScheduler | LinearScheduler | CosineScheduler, Field(discriminator="type")]


class DefaultLoss(_Strict):
    type: Literal["default"] = "default"
    dppo_mask_low: float = Field(0.2, ge=0.0)
    dppo_mask_high: float = Field(0.2, ge=0.0)
    adv_tau: float = Field(1.0, ge=0.0)
    kl_tau: float = Field(1e-3, ge=0.0)


class IPOLoss(_Strict):
    type: Literal["ipo"] = "ipo"
    ipo_threshold: float = Field(0.1, ge=0.0)
    adv_tau: float = Field(1.0, ge=0.0)
    kl_tau: float = Field(1e-3, ge=0.0)


Loss = Annotated[DefaultLoss | IPOLoss, Field(discriminator="type")]


class Algo(_Strict):
    type: Literal["grpo", "max_rl"] = "grpo"


class PrimeRL(_Strict):
    max_steps: int = Field(ge=1)
    seq_len: int = Field(2048, ge=64)
    batch_size: int = Field(128, ge=1)
    group_size: int = Field(8, ge=1)
    sampling: Sampling = Field(default_factory=Sampling)
    optim: Optim = Field(default_factory=Optim)
    scheduler: Scheduler = Field(default_factory=ConstantScheduler)
    loss: Loss = Field(default_factory=DefaultLoss)
    algo: Algo = Field(default_factory=Algo)


#: How deep ``[env]`` values may nest (tables and arrays); deeper is refused, not parsed further.
MAX_ENV_DEPTH = 16


def json_value_problem(value: Any, where: str = "env", depth: int = 0) -> str | None:
    """Why ``value`` is not a JSON value (``None`` when it is): ``[env]`` is handed to
    ``load_environment`` through JSON (the sandbox's request, prime-rl's config), so TOML dates and
    times, NaN and infinity, and non-string keys cannot pass."""
    if depth > MAX_ENV_DEPTH:
        return f"{where} nests deeper than {MAX_ENV_DEPTH} levels"
    if isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where} = {value!r} is not a finite number"
    if isinstance(value, list):
        for i, item in enumerate(value):
            if (problem := json_value_problem(item, f"{where}[{i}]", depth + 1)) is not None:
                return problem
        return None
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                return f"{where} has a key {k!r} that is not a string"
            if (problem := json_value_problem(item, f"{where}.{k}", depth + 1)) is not None:
                return problem
        return None
    return f"{where} is a TOML {type(value).__name__}, which JSON cannot carry"


class Job(_Strict):
    job: JobSection
    prime_rl: PrimeRL
    env: dict[str, Any] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _json_only(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = json_value_problem(value)
        if problem is not None:
            raise ValueError(f"{problem}; [env] values must be strings, numbers, booleans, arrays or tables "
                             "(write dates and times as strings)")
        return value


class JobIssue(BaseModel):
    """One problem with job.toml: where, what, and how to fix it."""

    where: str
    message: str
    fix: str = ""


_TAGS = {"constant", "linear", "cosine", "default", "ipo"}


def _loc(loc: tuple[Any, ...]) -> str:
    """Dotted field path, without pydantic's discriminator tags."""
    parts: list[str] = []
    prev: Any = None
    for p in loc:
        if not (prev in ("scheduler", "loss") and p in _TAGS):
            parts.append(str(p))
        prev = p
    return ".".join(parts) if parts else "(top level)"


#: TOML integers are 64-bit signed (the TOML 1.0 spec: "If an integer cannot be represented losslessly, an
#: error must be thrown"); Python's parser accepts any size, and a 20,000-digit one breaks JSON, ``str``
#: (Python's 4,300-digit limit) and every consumer after it
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


def _big_int(value: Any, where: str, depth: int = 0) -> str | None:
    """The dotted key of the first integer outside 64 bits in a parsed TOML value (None if there is none)."""
    if depth > MAX_ENV_DEPTH + 4:
        return None  # refused elsewhere for its depth
    if isinstance(value, int) and not isinstance(value, bool):
        return where if not INT_MIN <= value <= INT_MAX else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, item in items:
        if (found := _big_int(item, f"{where}[{k}]" if isinstance(k, int) else f"{where}.{k}" if where else str(k),
                              depth + 1)) is not None:
            return found
    return None


def load_toml(text: str) -> tuple[dict[str, Any] | None, list[JobIssue]]:
    """job.toml text as a TOML table, or the issue that says why it is not TOML (integers are 64-bit, as
    the TOML spec requires)."""
    try:
        raw = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, ValueError) as exc:
        reason = "it nests too deeply" if isinstance(exc, RecursionError) else str(exc)
        return None, [JobIssue(where="job.toml", message=f"not valid TOML: {reason}",
                               fix="Check quotes, brackets and '=' signs; strings need double quotes.")]
    try:
        where = _big_int(raw, "")
    except RecursionError:
        return None, [JobIssue(where="job.toml", message="it nests too deeply to validate",
                               fix="Pass flat values to load_environment.")]
    if where is not None:
        return None, [JobIssue(where=f"job.toml: {where}", message="not valid TOML: an integer outside the 64-bit "
                               f"range {INT_MIN}..{INT_MAX}", fix="Use a smaller number.")]
    return raw, []


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for any value (an int too long for ``repr`` included)."""
    try:
        text = repr(value)
    except ValueError:  # Python's integer string conversion limit
        return f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def validate_job(raw: dict[str, Any]) -> tuple[Job | None, list[JobIssue]]:
    """A TOML table as a :class:`Job` (types, ranges, unknown keys), or issues naming each field. prime-rl's
    cross-field rules are :func:`ait_env.jobs.primerl.config_rules`, applied by the probe."""
    if (problem := json_value_problem(raw.get("env", {}))) is not None and "nests deeper" in problem:
        # refused before the schema walks it (deep nesting is what makes recursive validators fail)
        return None, [JobIssue(where="job.toml: env", message=problem, fix="Pass flat values to load_environment.")]
    try:
        return Job.model_validate(raw), []
    except RecursionError:
        return None, [JobIssue(where="job.toml", message="it nests too deeply to validate",
                               fix="Pass flat values to load_environment.")]
    except ValidationError as exc:
        issues = []
        for err in exc.errors():
            where = "job.toml: " + _loc(tuple(err["loc"]))
            kind = err["type"]
            msg = err["msg"]
            if kind == "extra_forbidden":
                fix = "Remove this key; see INSTRUCTIONS.md for the allowed keys (names are exact)."
                msg = "unknown key"
            elif kind == "missing":
                fix = "Add this required key."
            elif kind == "union_tag_invalid" or kind == "literal_error":
                fix = "Use one of the allowed values."
            else:
                fix = ""
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            value = err.get("input")
            if kind not in ("missing", "extra_forbidden") and not isinstance(value, (dict, list)):
                msg = f"{msg} (got {short_repr(value)})"
            issues.append(JobIssue(where=where, message=msg, fix=fix))
        return None, issues


def parse_job(text: str) -> tuple[Job | None, list[JobIssue]]:
    """Parse and validate job.toml text. Returns (job, []) or (None, issues)."""
    raw, issues = load_toml(text)
    return (None, issues) if raw is None else validate_job(raw)


def check_bounds(job: Job, bounds: Bounds, family: str) -> list[JobIssue]:
    """Enforce the task's hard limits; every message names the field and the allowed range."""
    out: list[JobIssue] = []
    p = job.prime_rl

    def limit(field: str, value: int, maximum: int, minimum: int = 1) -> None:
        if not minimum <= value <= maximum:
            out.append(JobIssue(where=f"job.toml: {field}",
                                message=f"{field} = {value} is outside the allowed range {minimum}..{maximum}",
                                fix=f"Set {field} between {minimum} and {maximum}."))

    if job.job.family != family:
        out.append(JobIssue(where="job.toml: job.family", message=f"family is {job.job.family!r} but this "
                            f"task is {family!r}", fix=f'Set family = "{family}".'))
    if job.job.base_model not in bounds.base_models:
        out.append(JobIssue(where="job.toml: job.base_model",
                            message=f"base_model {job.job.base_model!r} is not allowed",
                            fix="Use one of: " + ", ".join(repr(m) for m in bounds.base_models)))
    limit("prime_rl.max_steps", p.max_steps, bounds.max_steps)
    limit("prime_rl.batch_size", p.batch_size, bounds.max_batch_size)
    limit("prime_rl.group_size", p.group_size, bounds.max_group_size, minimum=2)
    limit("prime_rl.seq_len", p.seq_len, bounds.max_seq_len, minimum=64)
    limit("prime_rl.sampling.max_tokens", p.sampling.max_tokens, min(bounds.max_tokens, p.seq_len))
    return out
