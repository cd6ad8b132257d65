"""The poller: every job in flight read on every sweep, every deadline checked (also while status reads
fail), cancels retried, each final status recorded and its waiter woken."""

from __future__ import annotations

import math
from typing import Any, Literal

from fleet.billing import RunpodJobStatus
from fleet.journal import Billing
from fleet.dispatch.engine import IN_FLIGHT, AttemptGone
from fleet.dispatch.state import _Entry, _State, _log


class _Polling(_State):
    """The poller: a part of :class:`fleet.dispatch.Dispatcher` (the module docstring says what it does)."""

    def pump(self) -> None:
        """One turn of the submitters and the poller, on the caller's thread (``threads=False``: a test
        or simulator drives the backend on its own clock)."""
        while self._send_next(block=False):
            pass
        self._sweep()

    def _poll_loop(self) -> None:
        """A sweep every ``poll_interval_s`` (never more often: a sweep goes over every job tracked), until
        :meth:`close` wakes it."""
        while not self._stop.is_set():
            try:
                self._sweep()
            except Exception:  # noqa: BLE001 - the poller must outlive one bad sweep
                _log.exception("%s poller sweep failed; retrying", self.engine.name)
            self._wake.wait(self.options.poll_interval_s)

    def _sweep(self) -> None:
        """Beat; adopt rows whose owner is gone; read the statuses that are due (backing off the unreadable
        ones); check every deadline; push every cancel that is due; follow rows others own."""
        o, now = self.options, self._clock()
        if now - self._beat_at >= o.owner_stale_s / 4:
            self._beat_at = now
            self.journal.beat(self._session_id)
        if now >= self._adopt_at:
            self._adopt_at = now + o.owner_stale_s / 2
            self._adopt_orphans()
        self._attach_sent()
        own: list[_Entry] = []
        foreign: list[_Entry] = []
        with self._lock:
            for e in self._entries.values():
                if e.state == "done":
                    continue
                if e.state == "foreign":
                    foreign.append(e)
                elif e.state in ("sent", "cancelling") and e.job_id:
                    own.append(e)
        due = [e for e in own if e.state == "sent" and e.next_poll <= now]
        answers = self._statuses([e.job_id for e in due if e.job_id])
        batch: list[tuple[_Entry, RunpodJobStatus, dict[str, Any], Billing]] = []
        for entry in due:
            if self._stop.is_set():
                break
            if entry.state == "sent" and entry.job_id in answers:
                self._poll(entry, answers[entry.job_id], batch)
        self._record(batch)
        now = self._clock()
        for entry in own:   # deadlines: on every sweep, whatever the status reads did
            if entry.state == "sent" and now >= entry.sent_at + self.limits(entry.kind).deadline_s:
                limit = self.limits(entry.kind).deadline_s
                seen = f" (status unreadable {entry.status_errors} time(s): {entry.last_error[:200]})" \
                    if entry.status_errors else ""
                self._begin_cancel(entry, "timed_out", f"no result from {entry.job_id} within its deadline of "
                                                       f"{limit:.0f} s{seen}")
            elif entry.state == "cancelling" and now >= entry.cancel_next:
                self._try_cancel(entry)
        for entry in foreign:
            self._follow(entry)

    def _statuses(self, ids: list[str]) -> dict[str, Any]:
        """The status of each id, or the error its read raised."""
        if not ids:
            return {}
        try:
            return dict(self.engine.statuses(ids))
        except Exception as exc:  # noqa: BLE001 - every id gets the error
            return {i: exc for i in ids}

    def _poll(self, entry: _Entry, answer: Any, batch: list[Any] | None = None) -> None:
        """Act on the status of ``entry``'s attempt (``answer``: a status or the error its read raised);
        results to record go to ``batch`` when given (:meth:`_record`)."""
        job_id, o, now = entry.job_id, self.options, self._clock()
        assert job_id is not None
        if isinstance(answer, AttemptGone):
            # the job is gone (its result expired, or its ttl ran out): it may have run up to now, if this id is
            # surely this attempt's job (seen in flight under it); an id never seen so (an adopted attempt, an id
            # the provider gave twice while the first holder's record was lost) may name another job, and this
            # attempt's own may still run: its whole bound
            why, bill = self._unless_anothers(entry, f"the result of {job_id} expired before it was read "
                                                     f"({answer}); charged at its bound, estimated",
                                              self._bound_bill(entry, now if entry.seen else None))
            self._attempt_failed(entry, "expired", why, bill)
            return
        if isinstance(answer, Exception):
            entry.status_errors += 1
            entry.last_error = f"{type(answer).__name__}: {answer}"
            entry.next_poll = now + min(o.status_backoff_max_s, o.poll_interval_s * 2 ** entry.status_errors)
            if entry.status_errors in (1, 4) or entry.status_errors % 10 == 0:
                _log.warning("status of job %s unreadable (%d in a row; next read in %.1f s; its "
                             "deadline decides): %s", job_id, entry.status_errors, entry.next_poll - now,
                             entry.last_error[:300])
            return
        st = answer
        entry.status_errors, entry.next_poll = 0, now + o.poll_interval_s
        if st.status in IN_FLIGHT:
            if st.status != entry.seen:
                entry.seen = st.status
                self.journal.update_status(entry.key, IN_FLIGHT[st.status], job_id)  # type: ignore[arg-type]
                where = "in queue" if st.status == "IN_QUEUE" else "running"
                self.say(f"{entry.claimant}: {where} ({job_id}"
                          + (f" on worker {st.worker_id})" if st.worker_id else ")"))
            return
        self._final(entry, st, batch)

    def _final(self, entry: _Entry, st: RunpodJobStatus, batch: list[Any] | None = None) -> None:
        """Act on a final status of the current attempt."""
        job_id = entry.job_id
        if st.status == "COMPLETED":
            self._completed(entry, st, batch)
        elif st.status == "CANCELLED" and job_id in self._cancelled:
            self._end(entry, job_id, "cancelled by this orchestrator (close)", self._bill(entry, st), "cancelled")
        elif st.status in ("FAILED", "TIMED_OUT", "CANCELLED"):
            what = {"FAILED": "failed without a result from our handler (worker lost, image pull, out of "
                              "GPUs)",
                    "TIMED_OUT": f"timed out on {self.engine.name.capitalize()} (the request's execution "
                                 "timeout)",
                    "CANCELLED": f"was cancelled on {self.engine.name.capitalize()}'s side"}[st.status]
            detail = f": {str(st.error)[:300]}" if st.error else ""
            why, bill = self._unless_anothers(entry, f"{self.engine.name.capitalize()} job {job_id} {what}{detail}",
                                              self._bill(entry, st))
            self._attempt_failed(entry, "timed_out" if st.status == "TIMED_OUT" else "failed", why, bill)
        else:
            _log.warning("%s job %s has an unknown status %r; polling on", self.engine.name, job_id, st.status)

    def _unless_anothers(self, entry: _Entry, why: str, bill: Billing) -> tuple[str, Billing]:
        """``(why, bill)`` of an attempt that ends on what its id says without our tag (a failed, timed-out,
        cancelled or expired status): as given, unless the id may be one the engine gave before to an attempt
        whose id was never recorded (sent within the window in which the engine still answers that attempt's
        status). Then the status, its bill and a confirmed cancel may be that job's while this attempt's own
        runs on unread: its whole bound, estimated, and the id detached, so no later correction reads the other
        job's bill for it."""
        lim = self.limits(entry.kind)
        span = lim.bound_s + self.engine.send_retry_s + self.engine.status_kept_s
        since = entry.sent_at - span if math.isfinite(span) else -math.inf
        if entry.job_id is None or not self.journal.unseen_before(entry.key, entry.attempt, since, self._clock()):
            return why, bill
        self.journal.detach(entry.key, entry.job_id)
        entry.job_id = None
        return (why + "; an attempt sent before it was never identified, so what its id says may be that one's "
                      "(an id given twice): charged at its bound, estimated", self._bound_bill(entry, None))

    def _begin_cancel(self, entry: _Entry, status: Literal["failed", "timed_out"], why: str) -> None:
        with self._lock:
            if entry.state != "sent":
                return
            entry.state, entry.cancel_status, entry.cancel_why = "cancelling", status, why
            entry.cancel_tries, entry.cancel_next = 0, self._clock()
        self._try_cancel(entry)

    def _try_cancel(self, entry: _Entry) -> None:
        """Cancel the attempt; once Runpod confirms (or its ttl passed: it cannot run any more), bill it and
        retry or end the job. Until then nothing is sent again; the cancel is retried with backoff."""
        job_id, o, now = entry.job_id, self.options, self._clock()
        assert job_id is not None
        confirmed = self._cancel(job_id)
        lim = self.limits(entry.kind)
        if not confirmed:
            entry.cancel_tries += 1
            if now < entry.sent_at + lim.bound_s:
                entry.cancel_next = now + min(o.status_backoff_max_s, o.poll_interval_s * 2 ** entry.cancel_tries)
                return
            why = f"{entry.cancel_why}; the cancel was not confirmed, but its ttl of {lim.bound_s:.0f} s has passed"
            self._attempt_failed(entry, entry.cancel_status, why + "; charged at its bound, estimated",
                                 self._bound_bill(entry, None))
            return
        st = self.engine.read(job_id)   # its final bill (or a result that came just before the cancel)
        if st is not None and st.status == "COMPLETED":
            self._completed(entry, st)
            return
        if st is None or st.status not in ("CANCELLED", "FAILED", "TIMED_OUT"):
            bill = self._bound_bill(entry, now)   # cancelled by now, its bill unread
            why = entry.cancel_why + "; cancelled, its bill unread: charged up to the cancel, estimated"
        else:
            bill, why = self._bill(entry, st), entry.cancel_why + "; cancelled"
        why, bill = self._unless_anothers(entry, why, bill)
        self._attempt_failed(entry, entry.cancel_status, why, bill)

    def _completed(self, entry: _Entry, st: RunpodJobStatus, batch: list[Any] | None = None) -> None:
        """A COMPLETED attempt: check its result and record it (into ``batch`` when given)."""
        job_id = entry.job_id
        out = st.output
        if not (isinstance(out, dict) and isinstance(out.get("result"), dict)):
            self._attempt_failed(entry, "failed", f"{self.engine.name.capitalize()} job {job_id} completed "
                                                  f"without our handler's result (output {str(out)[:200]!r})",
                                 self._bill(entry, st))
            return
        result = out["result"]
        tag = (self.journal.attempt_row(entry.key, entry.attempt) or {}).get("tag")
        if tag and out.get("tag") not in (None, tag):
            # another attempt's result (the worker echoes the request's tag): an id the engine gave twice,
            # one of them to an attempt queued unseen. Never served; handled as the case below
            self._end(entry, job_id, f"{self.engine.name} job {job_id} answered with the result of attempt "
                                     f"{str(out.get('tag'))[:80]!r}, not {tag!r} (an id given twice); not served, "
                                     "not resent: charged at its bound, estimated", self._bound_bill(entry, None))
            self.journal.detach(entry.key, job_id)
            return
        if entry.kind == "job" and result.get("job_id") != entry.claimant:
            # another job's result under this attempt's id (an id the engine gave twice, one of them to a job
            # queued unseen): never served as this job's. Whether this attempt's own job was queued is unknown:
            # charged at its bound, estimated, not resent (see SendUncertain in _run)
            self._end(entry, job_id, f"{self.engine.name} job {job_id} answered with the result of job "
                                     f"{str(result.get('job_id'))[:80]!r}, not {entry.claimant!r} (an id given "
                                     "twice); not served, not resent: charged at its bound, estimated",
                      self._bound_bill(entry, None))
            self.journal.detach(entry.key, job_id)
            return
        worker = result.get("worker") if isinstance(result.get("worker"), dict) else {}
        bill = self._bill(entry, st, worker)
        problem = self._non_replica(worker)
        if problem:   # deterministic: the endpoint's workers run another image or versions than pinned
            self._end(entry, job_id, f"non-replica worker: {problem}. Not retried: every worker of this "
                                     "endpoint would answer the same; deploy the pinned image (Runpod: "
                                     "python -m fleet.endpoint up) or change require_revision/expected_versions", bill)
            return
        problem = self._on_result(entry.kind, out)
        if problem:
            self._attempt_failed(entry, "failed", problem, bill)
            return
        if batch is not None:
            batch.append((entry, st, out, bill))
        else:
            self._record([(entry, st, out, bill)])

    def _record(self, batch: list[tuple[_Entry, RunpodJobStatus, dict[str, Any], Billing]]) -> None:
        """Record the results of ``batch`` (one write transaction) and end their jobs."""
        if not batch:
            return
        done = self.journal.record_results([(e.key, e.job_id, out, bill, str(out["result"].get("status", "")))
                                            for e, _, out, bill in batch])
        for (entry, _, out, bill), recorded in zip(batch, done):
            if not recorded:   # another orchestrator recorded it, or moved the row on
                self._to_foreign(entry)
                continue
            billed_s = math.ceil((bill.delay_time_ms + bill.execution_time_ms) / 1000 - 1e-9)
            self.say(f"{entry.claimant}: done ({entry.job_id}: {out['result'].get('status')}, "
                      f"{bill.gpus_per_worker}x {bill.gpu_type}, {billed_s} s billed, ${bill.cost_usd:.4f}; "
                      f"idle <= ${bill.idle_usd:.4f} to the run)")
            self._done(entry)

    def _non_replica(self, worker: dict[str, Any]) -> str:
        """Why the worker that produced a result is not the pinned one ("" when it is)."""
        o, problems = self.options, []
        if o.require_revision and worker.get("image_revision") != o.require_revision:
            problems.append(f"image revision {worker.get('image_revision')!r}, pinned {o.require_revision!r}")
        versions = worker.get("versions") or {}
        problems += [f"{k} {versions.get(k) or 'missing'}, pinned {v}" for k, v in o.expected_versions.items()
                     if versions.get(k) != v]
        return "; ".join(problems)
