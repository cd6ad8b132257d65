"""What prime-rl v0.7.0 writes to its logs, read back: per-step metrics, and the failures a job causes.

prime-rl v0.7.0 (commit d334ea52) writes no metrics file; the per-step numbers are in log lines. Their
formats, from the source at that tag (only the format was taken, not code):

- every line is loguru's ``HH:mm:ss <LEVEL:>7> <message>``, coloured with ANSI codes (the launcher sets
  ``LOGURU_FORCE_COLORS=1`` for trainer and orchestrator: ``src/prime_rl/entrypoints/rl.py``;
  ``src/prime_rl/utils/logger.py`` ``setup_logger``); with ``log.json_logging`` one JSON object per line
  whose ``message`` is the same text (``build_log_entry``). The trainer's lines pass through ``torchrun
  --tee``, which writes ``[<role><local_rank>]:`` in front (``[trainer0]:``; torch's
  ``torch/distributed/elastic/multiprocessing/tail_log.py``, checked in torch 2.13's copy), so a step is
  found anywhere in the line;
- orchestrator, one per shipped batch (``src/prime_rl/orchestrator/orchestrator.py`` ``log_train_batch``):
  ``Step N | <time> | Reward R | Trainable a/b (p%) | Turns T | Branches B | Max Off-Policy k | Error e% |
  Truncation t%``;
- trainer, one per optimizer step (``src/prime_rl/trainer/rl/train.py``): ``Step N | <time> | Loss L |
  Entropy E [| Mismatch KL K] [| Grad. Norm G] | LR x.xxe-yy | Throughput T tokens/s | MFU m% | Peak Mem.
  M GiB``; values are ``f"{x:.4f}"``, so a non-finite one reads ``nan`` / ``inf``; ``<time>`` is
  ``format_time`` (``450ms``, ``2.1s``, ``1m 3s``, ``2h 5m``, ``1d 3h``). Both count steps from 1.

Failures the job causes, by the text that reports them:

- its environment raises in ``load_environment``: verifiers 0.2.0 ``verifiers/utils/env_utils.py`` logs
  ``Failed to load environment <id> with args <args>: <error>`` and raises ``RuntimeError("Failed to load
  environment '<id>': <error>")``, in the env server's log ``<output_dir>/logs/envs/train/<name>.log``
  (``src/prime_rl/orchestrator/envs.py``, ``orchestrator.py``); the orchestrator then waits for the env
  server (up to ``ENV_SERVER_SPAWN_TIMEOUT`` = 600 s, or without end) -- so the run is stopped at once;
- every group errored or had equal rewards for ``MAX_CONSECUTIVE_EMPTY_BATCHES`` steps: the orchestrator
  raises ``... consecutive empty train batches ...`` (``orchestrator.py`` ``finalize_train_batch``);
- the trainer runs out of GPU memory: torch's ``torch.OutOfMemoryError: CUDA out of memory. Tried to
  allocate ...`` in ``trainer.log`` (the same message in ``inference.log`` is vLLM's memory share: ours);
- a non-finite loss or mean reward in a step line (the RL trainer has no NaN guard).

An environment that fails to import or load does not end the run by itself: with the default elastic
worker pool the env server reports its address before a worker loads the environment and the orchestrator's
``info()`` waits without end (verifiers 0.2.0 ``verifiers/v1/serve/pool.py`` ``serve_env``; prime-rl
``src/prime_rl/orchestrator/envs.py`` ``Env.start``). :func:`env_start_failure` reads the first traceback of
an env server's log before the first training step and says whose fault it is: verifiers 0.2.0 turns
**every** ``ImportError`` of the import or of ``load_environment`` into ``Could not import '<id>'
environment`` (``verifiers/utils/env_utils.py``), so only ``No module named '<the job's package>'`` is ours
(the bundle's ``src/`` is on ``PYTHONPATH`` and the probe imported the same package); a traceback through
verifiers' environment loading (``env_utils.py``, the legacy bridge's ``legacy.py``: ``load_environment``,
``set_kwargs``, ``get_dataset``) or through the job's package is the job's; anything else is ours.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ait_env.jobs import guard

Source = Literal["launcher", "orchestrator", "trainer", "inference", "env"]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STEP = re.compile(r"(?<![(\w])Step (\d+) \| ")
_LEVEL = re.compile(r"^\s*(?:\[[^\]]*\]:?\s*)?\d\d:\d\d:\d\d\s+"
                    r"(TRACE|DEBUG|INFO|SUCCESS|WARNING|ERROR|CRITICAL)\b")
_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf|-inf)%?$")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|d|h|m|s)")

#: step-line field -> (curve name, divisor: percentages become fractions); the result's ``curves``
ORCHESTRATOR_FIELDS: dict[str, tuple[str, float]] = {
    "Reward": ("train_reward", 1.0), "Trainable": ("trainable_frac", 1.0), "Turns": ("turns", 1.0),
    "Error": ("rollout_error_rate", 100.0), "Truncation": ("truncation_rate", 100.0),
}
TRAINER_FIELDS: dict[str, tuple[str, float]] = {
    "Loss": ("loss", 1.0), "Entropy": ("entropy", 1.0), "Mismatch KL": ("mismatch_kl", 1.0),
    "Grad. Norm": ("grad_norm", 1.0), "LR": ("lr", 1.0), "Throughput": ("train_tokens_per_s", 1.0),
    "MFU": ("mfu", 100.0), "Peak Mem.": ("peak_memory_gib", 1.0),
}


def clean(line: str) -> str:
    """A log line without ANSI codes and trailing whitespace; a JSON log line becomes its message."""
    text = _ANSI.sub("", line).rstrip()
    if text.startswith("{") and text.endswith("}"):
        try:  # the agent's environment logs here too: bounded (a deeply nested line raised RecursionError)
            obj = guard.loads(text, what="a log line")
        except guard.Refused:
            return text
        if isinstance(obj, dict) and isinstance(obj.get("message"), str):
            stamp = str(obj.get("timestamp", ""))[11:19] or "00:00:00"
            extra = f"\n{obj['exception']}" if isinstance(obj.get("exception"), str) else ""
            return f"{stamp} {obj.get('level', 'INFO')!s:>7} {obj['message']}{extra}"
    return text


def level(line: str) -> str | None:
    """The loguru level of a cleaned line (None when it has none: a traceback, vLLM's own logging)."""
    m = _LEVEL.match(line)
    return m.group(1) if m else None


def duration_seconds(text: str) -> float | None:
    """Seconds of a prime-rl ``format_time`` string (``450ms``, ``2.1s``, ``1m 3s``, ``2h 5m``, ``1d 3h``)."""
    parts = _DURATION.findall(text.strip())
    if not parts or _DURATION.sub("", text).strip():
        return None
    unit = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    return sum(float(v) * unit[u] for v, u in parts)


def _value(token: str) -> float | None:
    if "/" in token:  # Trainable a/b
        a, _, b = token.partition("/")
        try:
            return float(a) / float(b) if float(b) else None
        except ValueError:
            return None
    if not _NUMBER.match(token):
        return None
    return float(token.rstrip("%"))


@dataclass
class StepLine:
    """One parsed step line: its step, its seconds, and its named values (curve names, scaled)."""

    source: Literal["orchestrator", "trainer"]
    step: int
    seconds: float | None
    values: dict[str, float] = field(default_factory=dict)

    def non_finite(self) -> dict[str, float]:
        return {k: v for k, v in self.values.items() if not math.isfinite(v)}


def parse_step(line: str, source: Literal["orchestrator", "trainer"]) -> StepLine | None:
    """The step line in ``line`` (raw or cleaned), or None when it is not one."""
    text = clean(line)
    m = _STEP.search(text)
    if not m:
        return None
    fields = ORCHESTRATOR_FIELDS if source == "orchestrator" else TRAINER_FIELDS
    parts = [p.strip() for p in text[m.end():].split(" | ")]
    out = StepLine(source=source, step=int(m.group(1)), seconds=duration_seconds(parts[0]) if parts else None)
    for part in parts[1:]:
        tokens = part.split()
        for i in range(1, len(tokens)):
            value = _value(tokens[i].strip("()"))
            if value is not None:
                name = " ".join(tokens[:i])
                if name in fields:
                    key, divisor = fields[name]
                    out.values[key] = value / divisor
                break
    return out


@dataclass(frozen=True)
class Signal:
    """A failure read from a log: ``blame`` "job" (the job's own fault) or "infra"."""

    kind: Literal["env_load", "env_import", "empty_batches", "oom"]
    blame: Literal["job", "infra"]
    source: Source
    line: str


def failure_signal(line: str, source: Source) -> Signal | None:
    """The failure a cleaned log line reports (see the module docstring), or None."""
    if source == "env" and "Failed to load environment" in line:
        return Signal("env_load", "job", source, line)
    if source == "env" and "Could not import '" in line:
        return Signal("env_import", "infra", source, line)
    if source == "orchestrator" and "consecutive empty train batches" in line:
        return Signal("empty_batches", "job", source, line)
    if "CUDA out of memory" in line or "OutOfMemoryError" in line:
        return Signal("oom", "job" if source == "trainer" else "infra", source, line)
    return None


TRACEBACK = "Traceback (most recent call last)"
_IGNORED = "Exception ignored in"        # Python's unraisable-exception report: not a failure
_JOB_FRAMES = ("verifiers/utils/env_utils.py", "verifiers/v1/legacy.py", "Failed to load environment",
               "Could not import '")


@dataclass(frozen=True)
class EnvFailure:
    """The first failure of an env server before training started (:func:`env_start_failure`)."""

    blame: Literal["job", "infra"]
    kind: Literal["import", "load", "server"]
    text: str      # the traceback, with the few lines logged just before it


def starts_traceback(lines: Sequence[str], i: int) -> bool:
    """Line ``i`` opens a traceback that reports a failure (not an ``Exception ignored in`` report)."""
    return TRACEBACK in lines[i] and not (i and _IGNORED in lines[i - 1])


def env_start_failure(lines: Sequence[str], env_module: str) -> EnvFailure | None:
    """The first failing traceback in an env server's (cleaned) log lines and whose fault it is (module
    docstring), or None when there is none."""
    start = next((i for i in range(len(lines)) if starts_traceback(lines, i)), None)
    if start is None:
        return None
    block = list(lines[max(0, start - 3):])
    text = "\n".join(block)
    if re.search(rf"No module named '{re.escape(env_module)}[.']", text):
        return EnvFailure("infra", "import", text)
    kind: Literal["import", "load"] = ("import" if "Could not import '" in text or "Failed to import" in text
                                       else "load")
    if any(f in text for f in _JOB_FRAMES) or f"/{env_module}/" in text:
        return EnvFailure("job", kind, text)
    return EnvFailure("infra", "server", text)
