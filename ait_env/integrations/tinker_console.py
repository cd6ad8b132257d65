"""What the Tinker outer loop (``trainers/tinker_grpo.py``) prints on the console.

The cookbook's console is made for a terminal: every step it prints a table of a few hundred metrics
and up to two whole trajectory groups (system prompt, task, every file the agent wrote) through the
``logging`` module, with ANSI colour codes even when the output goes to a file. Within
:func:`compact_console` all of that still reaches the run's ``logs.log``, ``metrics.jsonl`` and
``config.json``, and the console (the cookbook's stream handler) shows instead:

- one line per training step (:func:`step_line`: episodes, mean reward, statuses, share validated,
  uplift, LLM cost per episode, step time) and one per evaluation (:func:`eval_line`), from the rows
  the cookbook writes to ``metrics.jsonl``;
- one line per trajectory group the cookbook prints (:func:`group_line`: each episode's reward and
  status) in place of the dump;
- the cookbook's other messages, less its loops' start/stop chatter, with their level from WARNING up;
  colour codes only when the stream is a terminal. The configuration print is left out
  (``config.json`` has it).

Nothing here changes what is trained or recorded: while the block runs it replaces the cookbook's
``PrettyPrintLogger`` (:class:`CompactMetricsLogger`) and its ``configure_logging_module``
(:func:`configure_logging`: the same ``logs.log``, a compact console handler).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from tinker_cookbook.utils import ml_log

logger = logging.getLogger("ait_env.tinker")

#: The cookbook's per-step dump of a trajectory group (``rl.train.print_group``) starts with this.
GROUP_DUMP = "====== Trajectory Group ======"
#: Messages of the cookbook's loops that say only that a loop started, waits or stopped, or that a fresh
#: run has no checkpoint to resume from (a resume says so in its own message).
_CHATTER = re.compile(r"^\[(dataloader_loop|trajectory_group_worker_loop|training_loop|evaluation_loop)\] "
                      r"(Terminated|Received shutdown signal|No more data|Last worker exited)"
                      r"|^Wrote metrics to |^Logging to: |^No checkpoints found ")
_COLOURS = {"DEBUG": "\033[94m", "INFO": "\033[92m", "WARNING": "\033[93m", "ERROR": "\033[91m",
            "CRITICAL": "\033[95m"}


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) else None


#: Reward statuses in the order a reader looks for them (others follow by name).
STATUS_ORDER = ("scored", "job_failed", "invalid", "unparsable", "aborted", "infra_failed")


def _statuses(metrics: dict[str, Any], prefix: str, episodes: int) -> str:
    """``scored 7, invalid 1``: how many episodes ended in each status (from the shares in ``metrics``;
    statuses no episode ended in are left out)."""
    head = prefix + "ait/status/"
    shares = {k[len(head):]: float(v) for k, v in metrics.items() if k.startswith(head) and _num(v)}
    rank = {s: i for i, s in enumerate(STATUS_ORDER)}
    order = sorted(shares, key=lambda s: (rank.get(s, len(rank)), s))
    return ", ".join(f"{s} {round(shares[s] * episodes)}" for s in order)


def _env_summary(metrics: dict[str, Any], prefix: str) -> str:
    """Episodes, reward and statuses of the rows under ``prefix`` (``env/all/``, ``test/env/heldout/``)."""
    n = int(_num(metrics.get(prefix + "total_episodes")) or 0)
    reward = _num(metrics.get(prefix + "ait/reward"))
    text = f"{n} episodes" + (f", reward {reward:.3f}" if reward is not None else "")
    statuses = _statuses(metrics, prefix, n)
    return text + (f" ({statuses})" if statuses else "")


def step_line(metrics: dict[str, Any], step: int | None, elapsed: float | None = None, *,
              dry_run: bool = False) -> str:
    """One line for a training step's row of ``metrics.jsonl`` (``elapsed``: seconds since the start); a
    dry run's line starts ``DRY RUN`` and shows no LLM cost (a scripted policy, nothing billed)."""
    p = "env/all/" if "env/all/total_episodes" in metrics else "env/train/"
    parts = [_env_summary(metrics, p)]
    validated, uplift = _num(metrics.get(p + "ait/validated")), _num(metrics.get(p + "ait/uplift"))
    usd = _num(metrics.get(p + "ait/llm_usd"))
    if validated is not None:
        parts.append(f"validated {validated:.0%}")
    if uplift is not None:
        parts.append(f"uplift {uplift:+.3f}")
    if usd is not None and not dry_run:
        parts.append(f"LLM ${usd:.4f}/episode")
    if elapsed is not None:
        parts.append(f"{elapsed:.0f}s elapsed")
    return f"{'DRY RUN ' if dry_run else ''}step {step if step is not None else metrics.get('step', '?')}: " \
        + ", ".join(parts)


def eval_line(metrics: dict[str, Any], step: int | None, *, dry_run: bool = False) -> str:
    """One line for an evaluation row (``test/env/<tag>/...``): the training families and the held-out one
    (``DRY RUN`` first in a dry run)."""
    tags = sorted({k.split("/")[2] for k in metrics
                   if k.startswith("test/env/") and k.endswith("/total_episodes")})
    shown = [t for t in ("train", "heldout") if t in tags] or tags
    parts = [f"{'held-out family' if t == 'heldout' else 'training families' if t == 'train' else t} "
             f"{_env_summary(metrics, f'test/env/{t}/')}" for t in shown]
    return f"{'DRY RUN ' if dry_run else ''}eval at step {step if step is not None else metrics.get('step', '?')}: " \
        + "; ".join(parts)


def group_line(dump: str) -> str:
    """One line for the cookbook's dump of a trajectory group: each episode's reward and status."""
    episodes = []
    for block in re.split(r"\*{6} trajectory idx=", dump)[1:]:
        m = re.match(r"(\d+), reward=([-\d.e+]+|nan)", block)
        if not m:
            continue
        status = re.search(r"ait/status/(\w+): 1\.0\b", block)
        episodes.append(f"{float(m.group(2)):.3f} {status.group(1) if status else '?'}")
    if not episodes:
        return "trajectory group (details in logs.log)"
    return f"trajectory group of {len(episodes)}: rewards {', '.join(episodes)} (transcripts in logs.log)"


class CompactMetricsLogger(ml_log.Logger):
    """Stands in for the cookbook's ``PrettyPrintLogger``: a line per step or evaluation, no config print."""

    dry_run = False  # DryRunMetricsLogger: every line says DRY RUN, none an LLM cost

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def log_hparams(self, config: Any) -> None:
        return None

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if not metrics:
            return
        is_eval = any(k.startswith("test/") for k in metrics)
        line = (eval_line(metrics, step, dry_run=self.dry_run) if is_eval
                else step_line(metrics, step, time.monotonic() - self.t0, dry_run=self.dry_run))
        logger.info(line)


class DryRunMetricsLogger(CompactMetricsLogger):
    """:class:`CompactMetricsLogger` of a dry run."""

    dry_run = True


class ConsoleFormatter(logging.Formatter):
    """The console handler's formatter: the message, after its level when that is WARNING or above
    (coloured only on a terminal); a trajectory group's dump as :func:`group_line`."""

    def __init__(self, colour: bool) -> None:
        super().__init__("%(message)s")
        self.colour = colour

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if GROUP_DUMP in message[:80]:
            message = group_line(message)
        elif record.exc_info:
            message = super().format(record)
        if record.levelno < logging.WARNING:
            return message
        level = record.levelname
        if self.colour:
            level = f"{_COLOURS.get(level, '')}{level}\033[0m"
        return f"[{level}] {message}"


def _not_chatter(record: logging.LogRecord) -> bool:
    return not (record.levelno <= logging.INFO and record.name.startswith("tinker_cookbook")
                and _CHATTER.search(record.getMessage()))


def configure_logging(path: str, level: int = logging.INFO) -> logging.Logger:
    """Stands in for the cookbook's ``configure_logging_module``: the root logger writes everything to
    ``path`` (plain text, as the cookbook does) and to stderr in the compact form (:class:`ConsoleFormatter`,
    loop chatter left out); other handlers are removed."""
    import shlex
    import sys

    root = logging.getLogger()
    root.setLevel(level)
    for h in root.handlers[:]:
        root.removeHandler(h)
        h.close()
    to_file = logging.FileHandler(path, mode="a", encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(name)s:%(lineno)d [%(levelname)s] %(message)s"))
    root.addHandler(to_file)
    root.info("command line: %s", shlex.join(sys.argv) if sys.argv else "")  # in the file only
    root.addHandler(console_handler())
    return root


def console_handler() -> logging.Handler:
    """A stderr handler in the compact form: :class:`ConsoleFormatter` (colour only on a terminal), loop
    chatter left out."""
    console = logging.StreamHandler()
    console.setFormatter(ConsoleFormatter(colour=bool(getattr(console.stream, "isatty", lambda: False)())))
    console.addFilter(_not_chatter)
    return console


@contextmanager
def compact_console(dry_run: bool = False) -> Iterator[None]:
    """Within the block, the cookbook's console is the compact one described in the module docstring
    (``dry_run``: its lines say so)."""
    with mock.patch.object(ml_log, "PrettyPrintLogger", DryRunMetricsLogger if dry_run else CompactMetricsLogger), \
            mock.patch.object(ml_log, "configure_logging_module", configure_logging):
        yield
