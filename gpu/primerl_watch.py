"""Watching a prime-rl run while it goes (a thread): its logs tailed and forwarded (the launcher's, the
orchestrator's, the trainer's, each env server's, the agent's prints capped), its steps parsed into curves, and
the run stopped on the first sign of a job failure or at its deadline (the verdict is
:class:`gpu.primerl_executor.PrimeRLExecutor`'s to raise: :mod:`gpu.primerl_verdicts`). The log line formats
are prime-rl v0.7.0's (:mod:`gpu.primerl_logs`)."""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING

from ait_env.processes import ProcessTree
from gpu.primerl_logs import Signal, Source, StepLine, clean, failure_signal, level, parse_step, starts_traceback

if TYPE_CHECKING:
    from gpu.primerl_executor import PrimeRLExecutor

#: the orchestrator's line once an env server answered (src/prime_rl/orchestrator/envs.py ``Env.start``:
#: ``Env {name} ready: num_tasks=... group_scoring=...``; the server's log is ``logs/envs/<split>/{name}.log``)
_ENV_READY = re.compile(r"\bEnv (\S+) ready: num_tasks=")
_LAUNCHER_STARTED = "Startup complete"   # rl.py: "Startup complete. Showing orchestrator logs..."
_LAUNCHER_FINISHED = "Training finished!"
_ENV_LINES_FORWARDED = 2000   # per env log: the agent's prints cannot flood the job log

class _Tail:
    """New complete lines of a file that another process appends to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.buf = b""

    def read(self, final: bool = False) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read(1 << 22)
        except OSError:
            data = b""
        self.pos += len(data)
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        if final and self.buf:
            lines, self.buf = [*lines, self.buf], b""
        return [line.decode("utf-8", "replace").split("\r")[-1] for line in lines]


class _RunWatch:
    """Reads prime-rl's logs while it runs (a thread): forwards them, parses steps, stops the run on a
    job failure or at the deadline. ``verdict`` is the exception :meth:`PrimeRLExecutor.train` raises."""

    def __init__(self, ex: PrimeRLExecutor, tree: ProcessTree, launcher_log: Path, deadline: float) -> None:
        self.ex, self.tree, self.deadline = ex, tree, deadline
        logs = ex.out / "logs"
        self.tails: dict[Path, tuple[Source, str, _Tail]] = {
            launcher_log: ("launcher", "prime-rl launcher", _Tail(launcher_log)),
            **{logs / f"{s}.log": (s, f"prime-rl {s}", _Tail(logs / f"{s}.log"))
               for s in ("orchestrator", "trainer", "inference")}}  # type: ignore[misc]
        self.steps: dict[str, dict[int, StepLine]] = {"orchestrator": {}, "trainer": {}}
        self.signals: list[Signal] = []
        self.env_lines: dict[str, deque[str]] = {}
        self.env_failed: str | None = None   # the env log whose server failed before the first step
        self.env_started: dict[str, float] = {}   # env server name -> when its log appeared (monotonic)
        self.env_ready: set[str] = set()          # env servers the orchestrator reported ready
        self.recent: deque[str] = deque(maxlen=40)
        self.verdict: Exception | None = None
        self.first_step_at: float | None = None
        self.finished = threading.Event()
        self._launched = False
        self._forwarded: dict[Path, int] = {}
        self._settle_until: float | None = None
        self._rebuild: Callable[[], Exception] | None = None
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ait-primerl-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._halt.set()
        self._thread.join(timeout=60)

    # -- the loop
    def _loop(self) -> None:
        try:
            while not self._halt.is_set():
                self._read_logs()
                if self.verdict is None:
                    self._check()
                if self._settle_until is not None and time.monotonic() >= self._settle_until:
                    self._settle_until = None
                    if self._rebuild is not None:
                        self.verdict = self._rebuild()
                    self.tree.kill()
                if self.tree.poll() is not None:
                    self.tree.kill()   # the launcher is gone; its children go too
                    self._read_logs(final=True)
                    return
                time.sleep(self.ex.opts.poll_s)
        except Exception as exc:  # noqa: BLE001 - a dead watch must not leave the run unsupervised
            self.verdict = self.verdict or RuntimeError(
                f"the prime-rl log watch failed: {type(exc).__name__}: {exc}")
            self.tree.kill()
        finally:
            self.finished.set()

    def _read_logs(self, final: bool = False) -> None:
        for path in sorted((self.ex.out / "logs" / "envs").glob("*/*.log")):
            if path not in self.tails:
                self.tails[path] = ("env", f"env {path.parent.name}/{path.stem}", _Tail(path))
                self.env_started.setdefault(path.stem, time.monotonic())
        for path, (source, label, tail) in list(self.tails.items()):
            for raw in tail.read(final):
                self._line(path, source, label, clean(raw))

    def _line(self, path: Path, source: Source, label: str, text: str) -> None:
        if not text:
            return
        if source == "launcher":
            # after startup the launcher tails orchestrator.log to its stdout: keep only its own verdicts
            if _LAUNCHER_STARTED in text:
                self._launched = True
            elif (self._launched and level(text) not in ("ERROR", "WARNING")
                  and _LAUNCHER_FINISHED not in text):
                return
        if source == "inference" and not any(k in text for k in ("ERROR", "WARNING", "Error", "Traceback",
                                                                 "out of memory")):
            return  # vLLM's info lines stay in inference.log
        if source == "env":
            lines = self.env_lines.setdefault(label, deque(maxlen=80))
            lines.append(text)
            # a traceback before its server is ready is a load failure; after it, a rollout's error, which
            # prime-rl counts (Error %, the empty-batch rule) and goes on with
            if (self.env_failed is None and not self.steps["trainer"] and path.stem not in self.env_ready
                    and starts_traceback(lines, len(lines) - 1)):
                self.env_failed = label
            n = self._forwarded[path] = self._forwarded.get(path, 0) + 1
            if n > _ENV_LINES_FORWARDED:
                if n == _ENV_LINES_FORWARDED + 1:
                    self.ex.log(f"[{label}] ... further lines only in {path}")
                return
        self.recent.append(f"[{label}] {text}")
        self.ex.log(f"[{label}] {text}")
        sig = failure_signal(text, source)
        if sig is not None:
            self.signals.append(sig)
        if source == "orchestrator":
            ready = _ENV_READY.search(text)
            if ready:
                self.env_ready.add(ready.group(1))
        if source in ("orchestrator", "trainer"):
            step = parse_step(text, source)  # type: ignore[arg-type]
            if step is not None and step.step not in self.steps[source]:
                self.steps[source][step.step] = step
                if source == "trainer":
                    self.first_step_at = self.first_step_at or time.monotonic()

    def _check(self) -> None:
        """A job failure that prime-rl does not end by itself (NaN, an env that failed to load), or the
        deadline."""
        for source in ("trainer", "orchestrator"):
            for step in self.steps[source].values():
                bad = step.non_finite()
                if bad:
                    self._stop(self.ex.non_finite_failure(step, bad))
                    return
        if self.env_failed is not None or any(s.kind == "env_load" for s in self.signals):
            # the orchestrator would wait for this env server without end: stop now, and build the
            # verdict once the rest of the traceback has arrived
            self._stop(self.ex.env_failure(self), settle_s=2.0, rebuild=lambda: self.ex.env_failure(self))
            return
        late = self.env_not_ready()
        if late is not None:
            # prime-rl would wait 600 s for its address, then without end for its answer: stop now
            self._stop(self.ex.env_ready_failure(self, late), settle_s=1.0,
                       rebuild=lambda: self.ex.env_ready_failure(self, late))
            return
        if time.monotonic() > self.deadline:
            self._stop(self.ex.deadline_failure(self))

    def env_not_ready(self) -> str | None:
        """The first env server started more than ``env_ready_timeout_s`` ago that the orchestrator has not
        reported ready, before the first training step (None: none)."""
        if self.steps["trainer"]:
            return None
        limit = self.ex.opts.env_ready_timeout_s
        now = time.monotonic()
        for name, started in self.env_started.items():
            if name not in self.env_ready and now - started > limit:
                return name
        return None

    def _stop(self, verdict: Exception, settle_s: float = 0.0,
              rebuild: Callable[[], Exception] | None = None) -> None:
        """Record the verdict and stop the run (after ``settle_s``, then ``rebuild`` the verdict from the
        lines that arrived meanwhile: a traceback follows its error line)."""
        self.verdict = verdict
        self.ex.log(f"stopping prime-rl: {str(verdict).splitlines()[0]}")
        if settle_s:
            self._settle_until = time.monotonic() + settle_s
            self._rebuild = rebuild
        else:
            self.tree.kill()

    def curves(self, max_steps: int) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for source, prefix in (("orchestrator", "orchestrator_"), ("trainer", "")):
            rows = [self.steps[source][k] for k in sorted(self.steps[source]) if k <= max_steps]
            if not rows:
                continue
            for key in rows[0].values:
                if all(key in r.values for r in rows):
                    out[key] = [r.values[key] for r in rows]
            if all(r.seconds is not None for r in rows):
                out[f"{prefix}step_seconds"] = [float(r.seconds or 0.0) for r in rows]
        return out
