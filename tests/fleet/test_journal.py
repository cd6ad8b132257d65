"""The job journal: one claim per key across threads and processes, attach / attempts / results written
once, re-attach after a restart, a dead orchestrator's unsent claim taken over once, a job's cost handed out
once."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

import pytest

from fleet.journal import Billing, Journal, JournalRow, owner_alive


def _claim_many(path: str, keys: list[str], who: str, out: "multiprocessing.Queue[tuple[str, str]]") -> None:
    j = Journal(path)
    for k in keys:
        row, new = j.claim(k, claimant=who)
        if new:
            j.attach(k, f"{who}-{k}", row.attempt)
            out.put((k, who))


def test_two_processes_claiming_the_same_keys_send_each_once(tmp_path):
    path = str(tmp_path / "runpod_journal.sqlite")
    Journal(path)
    keys = [f"k{i}" for i in range(150)]
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[tuple[str, str]] = ctx.Queue()
    procs = [ctx.Process(target=_claim_many, args=(path, keys[::step], f"p{step}", out)) for step in (1, -1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    claims = [out.get(timeout=5) for _ in range(len(keys))]
    assert sorted(k for k, _ in claims) == sorted(keys)          # each key claimed exactly once
    j = Journal(path)
    assert all(j.get(k).job_id == f"{who}-{k}" for k, who in claims)   # by the one who sent it


def test_claim_attach_result_and_restart(tmp_path):
    j = Journal.in_run_dir(tmp_path)
    row, new = j.claim("a", claimant="job-1", episode_id="ep")
    assert new and row.status == "submitted" and row.job_id is None
    assert j.claim("a", claimant="job-2") == (j.get("a"), False)        # joined, not claimed again
    assert j.attach("a", "rp-1", attempt=1) and not j.attach("a", "rp-x", attempt=2)
    assert j.update_status("a", "in_progress", "rp-1") and not j.update_status("a", "in_queue", "rp-other")
    restarted = Journal(tmp_path / "runpod_journal.sqlite")              # a new orchestrator
    assert [(r.key, r.job_id, r.status) for r in restarted.in_flight()] == [("a", "rp-1", "in_progress")]
    bill = Billing(delay_time_ms=1000, execution_time_ms=9000, gpu_type="NVIDIA A40", gpus_per_worker=2,
                   cost_usd=0.0068)
    assert restarted.record_result("a", "rp-1", {"result": {"status": "succeeded"}}, bill, "succeeded")
    assert not j.record_result("a", "rp-1", {"result": {"status": "job_failed"}}, bill)  # a second sighting
    done = j.get("a", history=True)
    assert done.status == "completed" and done.result == {"result": {"status": "succeeded"}}
    assert (done.gpu_type, done.gpus_per_worker, done.cost_usd) == ("NVIDIA A40", 2, 0.0068)
    assert j.in_flight() == [] and j.claim("a", claimant="job-3")[1] is False       # served, not resent
    assert j.spent_usd() == j.spent_usd("ep") == 0.0068 and j.spent_usd("other") == 0


def test_retries_are_attempts_and_infra_failed_rows_are_claimed_again(tmp_path):
    j = Journal.in_run_dir(tmp_path)
    j.claim("a", claimant="job-1")
    j.attach("a", "rp-1")
    won = []
    threads = [threading.Thread(target=lambda: won.append(j.next_attempt("a", "rp-1", "failed", "worker lost",
                                                                         Billing(cost_usd=0.01))))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won, key=str) == [2] + [None] * 7                     # one caller opened attempt 2
    j.attach("a", "rp-2", attempt=2)
    assert j.finish("a", "rp-2", "infra_failed", "gave up", Billing(cost_usd=0.02))
    assert not j.finish("a", "rp-2", "infra_failed", "again")
    row: JournalRow = j.get("a", history=True)
    assert [(h["attempt"], h["job_id"], h["status"]) for h in row.history] == [
        (1, "rp-1", "failed"), (2, "rp-2", "infra_failed")]
    assert j.take_charge("a") == 0.03 and j.take_charge("a") is None    # the cost is handed out once
    again, new = j.claim("a", claimant="job-9")                         # infra_failed says nothing of the job
    assert new and again.attempt == again.first_attempt == 3 and again.cost_usd == 0 and not again.charged
    assert j.spent_usd() == 0.03


def test_a_dead_orchestrators_unsent_claim_is_taken_over_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    dead = ctx.Process(target=int)
    dead.start()
    dead.join()
    import socket

    owner = f"{socket.gethostname()}:{dead.pid}:abcd"
    assert not owner_alive(owner) and owner_alive("another-host:1:x")
    j = Journal.in_run_dir(tmp_path)
    row, _ = j.claim("a", claimant="job-1", owner=owner)
    assert [j.take_over("a", row.attempt, owner, owner="me") for _ in range(3)] == [True, False, False]
    assert j.get("a").owner == "me"


def test_the_journal_is_in_the_run_dir_and_holds_no_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", "rp-secret-0123456789")
    j = Journal.in_run_dir(tmp_path)
    j.claim("a", claimant="job-1")
    assert Path(j.path) == tmp_path / "runpod_journal.sqlite"
    assert b"rp-secret" not in j.path.read_bytes()


def test_the_clock_is_wall_time_by_default_and_injectable(tmp_path):
    from fleet.journal import Session

    before = time.time()
    j = Journal(tmp_path / "wall.sqlite")
    row, _ = j.claim("k", claimant="job")
    assert before <= row.created <= time.time()                     # default: time.time, as before

    t = [100.0]
    sim = Journal(tmp_path / "sim.sqlite", now=lambda: t[0])
    sim.open_session(Session(id="s", owner="o", started=0.0, heartbeat=0.0, active_usd_per_s=0.5))
    row, _ = sim.claim("k", claimant="job")
    t[0] = 160.0
    sim.attach("k", "r1")
    t[0] = 220.0
    assert sim.record_result("k", "r1", {"status": "succeeded"}, Billing(cost_usd=1.0))
    row = sim.get("k", history=True)
    assert (row.created, row.submitted_at, row.finished_at, row.history[0]["ended"]) == (100.0, 160.0, 220.0,
                                                                                         220.0)
    assert sim.run_costs(live=frozenset({"s"})).active == 0.5 * 220.0   # an open session ends at its now()
    sim.close_session("s", now=0.0)                                      # an explicit 0.0 is honoured
    assert sim.sessions()[0].ended == 0.0


# ---------------------------------------------------------------------------------------------- issue 32
def test_an_attempt_is_recorded_before_it_is_sent_and_one_sent_unseen_blocks_a_new_claim(tmp_path):
    t = [1000.0]
    j = Journal(tmp_path / "j.sqlite", now=lambda: t[0])
    row, _ = j.claim("a", claimant="job-1", owner="me")
    assert not j.mark_sending("a", row.attempt, "tag-1", owner="someone-else")   # not the owner's
    assert j.mark_sending("a", row.attempt, "tag-1", owner="me", hard_end=1100.0) == 1000.0   # sent_at
    assert not j.mark_sending("a", row.attempt, "tag-2", owner="me")             # sent once
    a = j.attempt_row("a", 1)
    assert (a["tag"], a["sent_at"], a["hard_end"], a["status"]) == ("tag-1", 1000.0, 1100.0, "sending")
    assert [r.status for r in j.in_flight()] == ["sending"]
    # its id never came back: charged at its bound, estimated
    assert j.finish("a", None, "infra_failed", "answer lost", Billing(cost_usd=0.5, estimated=True))
    assert j.get("a").estimated_usd == 0.5 and j.run_costs().estimated == 0.5
    assert j.claim("a", claimant="job-2") == (j.get("a"), False)      # may still run: not claimed again
    t[0] = 1101.0
    assert j.claim("a", claimant="job-2")[1]                          # past its hard end: claimed again


def test_reservations_hold_bounds_and_never_pass_a_budget_across_writers(tmp_path):
    j = Journal(tmp_path / "j.sqlite")
    for k in range(8):
        j.claim(f"k{k}", claimant=f"job-{k}", episode_id="ep")
    out: list[str] = []
    threads = [threading.Thread(target=lambda k=k: out.append(j.reserve(f"k{k}", 1, 1.0, 0.5, run_limit=5.9)))
               for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(out).count("") == 3 and j.reserved_usd() == 4.5        # 3 x (1.0 + 0.5) <= 5.9 < 4 x 1.5
    assert all("run budget" in w for w in out if w)
    held = next(f"k{k}" for k in range(8) if j.attempt_row(f"k{k}", 1)["reserved_usd"])
    assert j.reserve(held, 1, 1.0, 0.5, run_limit=5.9) == ""              # a re-check: within the limit
    j.attach(held, "rp-1")
    j.record_result(held, "rp-1", {"result": {}}, Billing(cost_usd=2.5, idle_usd=0.5))
    assert j.reserved_usd() == 3.0                                        # the bill replaced its bound
    free = next(f"k{k}" for k in range(8) if not j.attempt_row(f"k{k}", 1)["reserved_usd"]
                and j.attempt_row(f"k{k}", 1)["ended"] is None)
    why = j.reserve(free, 1, 1.0, 0.5, run_limit=5.9, episode_limit=3.0)
    assert "episode budget: episode ep committed" in why or "run budget" in why


def test_an_owner_is_live_while_its_session_beats_and_a_dead_ones_row_is_adopted_once(tmp_path):
    from fleet.journal import Session, this_owner

    t = [1000.0]
    j = Journal(tmp_path / "j.sqlite", now=lambda: t[0])
    j.open_session(Session(id="s1", owner=this_owner(), started=1000.0, heartbeat=1000.0))
    j.claim("a", claimant="job-1", owner="s1")
    assert j.owner_live("s1", stale_s=60)
    t[0] = 1061.0
    assert not j.owner_live("s1", stale_s=60)                 # silent too long: not polling
    j.beat("s1")
    assert j.owner_live("s1", stale_s=60)
    j.close_session("s1")
    assert not j.owner_live("s1", stale_s=60)                 # closed: whatever its process does
    won = [j.adopt("a", "s1", f"s{k}") for k in (2, 3, 4)]
    assert [w is not None for w in won] == [True, False, False] and j.get("a").owner == "s2"


def test_a_corrected_estimate_replaces_the_bound_in_the_attempt_and_the_row(tmp_path):
    j = Journal(tmp_path / "j.sqlite")
    j.claim("a", claimant="job-1")
    j.attach("a", "rp-1")
    j.next_attempt("a", "rp-1", "expired", "gone", Billing(execution_time_ms=90_000, cost_usd=0.9,
                                                           idle_usd=0.1, estimated=True))
    j.attach("a", "rp-2", attempt=2)
    j.record_result("a", "rp-2", {"result": {}}, Billing(execution_time_ms=10_000, cost_usd=0.1))
    (est,) = j.estimated_attempts()
    assert (est["job_id"], est["cost_usd"]) == ("rp-1", 0.9) and j.get("a").cost_usd == pytest.approx(1.0)
    assert not j.correct_attempt("a", 2, Billing(cost_usd=5.0))          # only an estimate is corrected
    assert j.correct_attempt("a", 1, Billing(execution_time_ms=20_000, cost_usd=0.2, idle_usd=0.1))
    row = j.get("a")
    assert row.cost_usd == pytest.approx(0.3) and row.estimated_usd == 0 and j.estimated_attempts() == []
    assert j.spent_usd() == pytest.approx(0.3) and row.execution_time_ms == 30_000


def test_an_attempt_sent_and_never_identified_makes_later_ids_doubtful(tmp_path):
    """unseen_before: an attempt sent without a recorded id (queued unseen, its sender dead, or detached) may
    hold an id the provider gives again; one that surely queued nothing (ended unbilled) or is identified
    does not; the window is the caller's."""
    j = Journal.in_run_dir(tmp_path)
    for key in ("a", "b", "c"):
        j.claim(key, claimant=f"job-{key}")
    sent_a = j.mark_sending("a", 1, "tag-a", hard_end=None)
    assert sent_a is not None
    assert j.unseen_before("b", 1, sent_a - 10, sent_a + 10)           # a: sent, its id never written
    assert not j.unseen_before("a", 1, sent_a - 10, sent_a + 10)       # not itself
    assert not j.unseen_before("b", 1, sent_a + 1, sent_a + 10)        # outside the window
    assert j.attach("a", "rp-1")
    assert not j.unseen_before("b", 1, sent_a - 10, sent_a + 10)       # identified
    j.detach("a", "rp-1")
    assert j.unseen_before("b", 1, sent_a - 10, sent_a + 10)           # detached: its own job is unseen again
    k = Journal.in_run_dir(tmp_path / "other")
    k.claim("c", claimant="job-c")
    sent_c = k.mark_sending("c", 1, "tag-c")
    assert sent_c is not None and k.unseen_before("d", 1, sent_c - 10, sent_c + 10)
    assert k.next_attempt("c", None, "failed", "429: nothing queued", Billing()) == 2   # surely queued nothing
    assert not k.unseen_before("d", 1, sent_c - 10, sent_c + 10)
    k.close()
    j.close()


def test_an_id_another_attempt_has_is_never_attached(tmp_path):
    from fleet.journal import ATTACHED, DUPLICATE_ID, MOVED_ON

    j = Journal.in_run_dir(tmp_path)
    for key in ("a", "b"):
        j.claim(key, claimant=f"job-{key}")
    assert j.attach_many([("a", "rp-1", 1)]) == [ATTACHED]
    # a provider that answers job b's run call with job a's id: b must not follow (and be scored with) a's job
    assert j.attach_many([("b", "rp-1", 1), ("a", "rp-9", 7)]) == [DUPLICATE_ID, MOVED_ON]
    assert j.get("b").job_id is None and j.get("a").job_id == "rp-1"
    assert not j.attach("b", "rp-1") and j.attach("b", "rp-2")
    assert j.attach("a", "rp-1")          # the same attempt again: its own id, not a duplicate
