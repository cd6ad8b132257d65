"""Issue 47's torn writes, as a property: the orchestrator dies at any write of the journal, and the next one
on the run dir finishes the run with the money rules intact.

Each example draws a fault schedule of :mod:`tests.backends.test_runpod_property` and a crash point: the k-th
journal write transaction (every write of the journal goes through ``Journal._tx``), either just **before** it
(nothing of it written) or just **after** its commit (written, and nothing after it). At that point the first
:class:`RunpodBackend` dies as a SIGKILL would leave it: its journal and its Runpod client refuse every later
call (no ``finally`` of a dead process writes or cancels anything), its session is never closed. Then, on the
same simulated clock, a second backend opens the same run dir (a restarted orchestrator: it adopts the dead
session's rows once its heartbeat is stale), the same jobs are submitted again, and the run is driven to the
end. Checked:

- every job the fake Runpod ran has exactly one journal attempt, charged at least what Runpod bills for it
  (never negative; at most the bill where the bill was read), and the journal's total lies between Runpod's
  bill and the bill plus what was charged at bounds (:func:`tests.backends.property_rules.check_money`);
- nothing is left in flight, every job ends with a final status, and no job gets another job's result.

An id Runpod gives twice is drawn too (the other property's ``ids_reused``), also where the process died
between the first holder's send and the write of its id, so that nothing records whose id it is: a COMPLETED
status is told by the tag the worker echoes (another attempt's result is never served), and a final status
without a tag (FAILED, TIMED_OUT, CANCELLED) is not taken as this attempt's while an attempt sent before it was
never identified (charged at its bound, estimated, and the id detached).
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ait_env.backends.runpod import RunpodBackend
from fleet.journal import Journal
from tests.backends.property_rules import check_money, drive
from tests.backends.test_runpod_property import BOUND_S, DT, LIMITS, RATE, Clock, make_fake, schedules
from tests.backends.test_runpod_backend import bundles
from tests.backends.test_runpod_backend import settings as backend_settings


class Crash(BaseException):
    """The orchestrator process died here (a BaseException: no ``except Exception`` of the code catches it)."""


class Dying:
    """The journal's write transactions, counted; the k-th one crashes the process (before or after it)."""

    def __init__(self, at: int, after: bool) -> None:
        self.at, self.after, self.n, self.dead = at, after, 0, False
        self.original = Journal._tx
        #: while True, every journal that writes is the first orchestrator's (its constructor's writes too)
        self.first_phase = True
        self.victims: list[Any] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        dying = self

        @contextmanager
        def tx(journal: Any) -> Any:
            if dying.first_phase and not any(journal is v for v in dying.victims):
                dying.victims.append(journal)
            victim = any(journal is v for v in dying.victims)
            if victim and dying.dead:
                raise Crash("the process is gone")
            if not victim:                       # the restarted orchestrator's journal: never crashes
                with dying.original(journal) as db:
                    yield db
                return
            dying.n += 1
            if dying.n == dying.at and not dying.after:
                dying.dead = True
                raise Crash(f"killed before write {dying.n}")
            with dying.original(journal) as db:
                yield db
            if dying.n == dying.at:
                dying.dead = True
                raise Crash(f"killed after write {dying.n}")

        monkeypatch.setattr(Journal, "_tx", tx)


class DeadClient:
    """The dead process's Runpod client: every call after the crash raises :class:`Crash`."""

    def __init__(self, client: Any, dying: Dying) -> None:
        self._client, self._dying = client, dying

    def __getattr__(self, name: str) -> Any:
        if self._dying.dead:
            raise Crash(f"the process is gone ({name})")
        return getattr(self._client, name)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    return bundles(tmp_path_factory.mktemp("crash-property"), 4)


@pytest.fixture(scope="module")
def base_settings() -> Any:
    return backend_settings(**LIMITS)


def run_crash_schedule(s: dict[str, Any], crash: tuple[int, bool], jobs: list[Any], root: Path, base: Any,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    ids = [j.job_id for j in jobs[: s["jobs"]]]
    fake, _ = make_fake(s, ids, clock)
    per_job = (BOUND_S + 5) * RATE
    opts = {**base.options, "max_in_flight": s["max_in_flight"], "retry_budget": s["retry_budget"],
            "run_budget_usd": None}
    settings_ = base.model_copy(update={"options": opts})
    limit_s = max(s["stagger"]) + s["jobs"] * (s["retry_budget"] + 1) * (BOUND_S + 2 * 8 + 2 * DT) + 60
    dying = Dying(*crash)
    with monkeypatch.context() as m:
        dying.install(m)
        try:      # the first orchestrator, from its start to its close: every journal write may be its last
            first = RunpodBackend(settings_, root / "runs", show_progress=False, client=DeadClient(fake, dying),
                                  clock=clock, threads=False)
            drive(first, jobs, s, clock, dt=DT, limit_s=limit_s, budget=None, per_job=per_job)
            first.close()
        except Crash:
            pass
        dying.first_phase = False
        event(f"crashed: {'before' if not dying.after else 'after'} a write" if dying.dead else "no crash")
        # the restarted orchestrator, once the dead one's heartbeat is stale; the dead one's client stays dead
        stale_s = settings_.options.get("owner_stale_s", 120.0)
        clock.t += stale_s + DT
        second = RunpodBackend(settings_, root / "runs", show_progress=False, client=fake, clock=clock,
                               threads=False)
        try:
            drive(second, jobs, {**s, "stagger": [0] * s["jobs"]}, clock, dt=DT,
                  limit_s=limit_s + stale_s * 2, budget=None, per_job=per_job)
            for _ in range(int(BOUND_S / DT) + 2):
                if not fake.running():
                    break
                clock.t += DT
            assert not fake.running()
            bills = fake.bills()
            check_money(second, [(job["tag"], job["id"], bills[job["id"]]) for job in fake.store.all()],
                        wrong_id_allowed=lambda a: a["estimated"] == 1 and bool(s["ids_reused"]))
        finally:
            second.close()


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(s=schedules(), at=st.integers(1, 24), after=st.booleans())
def test_a_crash_at_any_journal_write_then_a_restart_keeps_the_money_rules(pool, base_settings, monkeypatch,
                                                                          s, at, after):
    with tempfile.TemporaryDirectory(prefix="ait-crash-") as tmp:
        run_crash_schedule(s, (at, after), pool, Path(tmp), base_settings, monkeypatch)
