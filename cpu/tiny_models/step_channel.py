"""The step barrier between a local training run and its sandboxed rollout worker (``GET /ait/work`` and
``POST /ait/results`` of :mod:`cpu.tiny_models.endpoint`): work items out, untrusted rollout results back,
one step at a time and bounded (:class:`StepChannel`)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from ait_env.jobs import guard


class WorkerGone(RuntimeError):
    """The rollout worker ended before posting the awaited results."""


#: the most bytes of JSON one post of rollout results may have (a step of the local backend's largest batch,
#: 128 rollouts, is well under 1 MB; the rest is room for long errors and many metrics)
MAX_RESULT_BYTES = 2 * 2**20
#: the bounds of a post of rollout results (:mod:`ait_env.jobs.guard`)
RESULT_LIMITS = guard.Limits(max_chars=MAX_RESULT_BYTES, max_items=200_000)


class StepChannel:
    """Work items for the sandboxed rollout worker and the results it posts back, one step at a time.

    The worker runs the agent's code, so what it posts is untrusted, and what it can make this process hold
    is bounded (:meth:`post_json`): results are taken only for a step the trainer awaits — the worker's hello
    (step -1), then each published step until its results are taken — and only once; one post is at most
    ``max_result_bytes`` of JSON within :data:`RESULT_LIMITS`, and the results route reads one post at a time
    (:attr:`reading`). So the channel holds at most two results (the hello and one step's) and one body being
    read. A post for any other step is refused (409) and dropped. A post that cannot be read at all (too
    large, not JSON, past the bounds, no integer ``step``) is refused (413/400) and fails the step being
    awaited: the trainer gets an ``error`` result that says why (the job's fault, at once, not a timeout)."""

    def __init__(self, max_result_bytes: int = MAX_RESULT_BYTES) -> None:
        self._cond = threading.Condition()
        self._work: dict[str, Any] | None = None
        self._results: dict[int, Any] = {}
        self._done = False
        self._aborted: str | None = None
        self.max_result_bytes = max_result_bytes
        self._awaited: set[int] = {-1}   # steps whose results may still come
        self._fault: str | None = None   # why a post that could not be read was refused
        #: the results route holds it while it reads and parses a post (one body in memory at a time)
        self.reading = asyncio.Lock()

    def publish(self, work: dict[str, Any]) -> None:
        with self._cond:
            self._work = work
            self._awaited.add(int(work["step"]))
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def next_work(self, after_step: int, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._done and (self._work is None or self._work["step"] <= after_step):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return {"done": True} if self._done else dict(self._work or {})

    def abort(self, reason: str) -> None:
        """The rollout worker is gone: wake up whoever waits for results."""
        with self._cond:
            self._aborted = reason
            self._cond.notify_all()

    def post(self, step: int, results: Any) -> str | None:
        """Take ``results`` for ``step``; the reason when the step is not awaited (they are dropped)."""
        with self._cond:
            if step not in self._awaited or self._done:
                return (f"no results are awaited for step {step} (only the step the trainer published, once); "
                        "post each step's results once, after its work item")
            self._awaited.discard(step)
            self._results[step] = results
            self._cond.notify_all()
            return None

    def post_json(self, raw: bytes | None, length: int | None = None) -> tuple[int, str]:
        """A post of the results route: ``raw`` is its body (None: longer than :attr:`max_result_bytes`,
        ``length`` bytes if known). Returns the HTTP status and what it says (module contract above)."""
        if raw is None:
            size = f"{length:,} bytes" if length is not None else "more"
            return self._refuse(413, f"the rollout worker posted {size} of results; at most "
                                     f"{self.max_result_bytes:,} bytes are taken per post: return shorter errors "
                                     "and fewer metrics from the environment")
        try:
            body = guard.loads(raw, RESULT_LIMITS, what="the rollout worker's results")
        except guard.Refused as exc:
            return self._refuse(400, str(exc))
        step = body.get("step") if isinstance(body, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            return self._refuse(400, "the rollout worker's results must be a JSON object with an integer 'step'")
        why = self.post(step, body)
        return (409, why) if why is not None else (200, "ok")

    def _refuse(self, status: int, why: str) -> tuple[int, str]:
        """Refuse a post that cannot be attributed to a step: the step being awaited fails with ``why``."""
        with self._cond:
            self._fault = self._fault or why
            self._cond.notify_all()
        return status, why

    def wait_results(self, step: int, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while step not in self._results:
                if self._fault is not None:
                    self._awaited.discard(step)
                    why, self._fault = self._fault, None
                    return {"step": step, "error": why}
                if self._aborted is not None:
                    raise WorkerGone(self._aborted)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no rollout results for step {step} within {timeout:.0f} s")
                self._cond.wait(left)
            return self._results.pop(step)
