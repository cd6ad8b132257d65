import json
import multiprocessing as mp

import pytest

from ait_env.observe.ledger import BudgetExceeded, CostLedger, CostRecord
from tests.helpers import call


def _writer(path, n, tag):
    ledger = CostLedger(path)
    for i in range(n):
        ledger.append(CostRecord(kind="llm", episode_id=tag, tokens_in=i, usd=0.01))


def test_concurrent_appends_are_whole_lines(tmp_path):
    path = tmp_path / "costs.jsonl"
    procs = [mp.Process(target=_writer, args=(path, 50, f"ep{k}")) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    lines = path.read_text().splitlines()
    assert len(lines) == 200 and all(json.loads(line)["kind"] == "llm" for line in lines)
    assert CostLedger(path).spent("ep1") == pytest.approx(0.5)


def test_torn_line_is_skipped_and_next_append_starts_fresh(tmp_path):
    path = tmp_path / "costs.jsonl"
    ledger = CostLedger(path)
    ledger.append(CostRecord(kind="gpu_job", usd=1.0))
    with open(path, "ab") as f:
        f.write(b'{"kind": "gpu_job", "usd": 99')  # crash mid-write
    ledger.append(CostRecord(kind="gpu_job", usd=2.0))
    assert [r.usd for r in ledger.records()] == [1.0, 2.0]


def test_budgets(tmp_path):
    ledger = CostLedger(tmp_path / "c.jsonl", global_budget_usd=10.0, episode_budget_usd=3.0)
    ledger.append(CostRecord(kind="gpu_job", episode_id="a", usd=2.5))
    ledger.check_budget("a", 0.5)
    with pytest.raises(BudgetExceeded, match="episode budget exceeded.*episode_budget_usd"):
        ledger.check_budget("a", 1.0)
    ledger.append(CostRecord(kind="gpu_job", episode_id="b", usd=7.0))
    with pytest.raises(BudgetExceeded, match="global budget exceeded.*global_budget_usd"):
        ledger.check_budget("c", 1.0)


def test_dispatch_refused_when_over_budget(make_env, runs_dir):
    from task_families import reference_files

    env = make_env(family="arithmetic", overrides={"env": {"ledger": {"global_budget_usd": 1.0}},
                                                   "backend": {"cost_usd_per_job": 2.0}})
    env.reset(seed=0)
    files = reference_files("arithmetic", "Qwen/Qwen3-0.6B")
    env.step("".join(call("write_file", path=k, content=v) for k, v in files.items()))
    obs, r, term, _, info = env.step(call("submit_job"))
    assert term and "global budget exceeded" in obs
    assert info["reward"]["status"] == "infra_failed" and info["reward"]["drop"] and r == 0.0
    assert not (runs_dir / "costs.jsonl").exists()  # nothing was spent


def test_a_reservation_holds_a_jobs_bound_until_its_charge_settles_it(tmp_path):
    """Issue 32, item 3 (the env's side of the one budget mechanism): a job's bound is held from when it is
    accepted; a second job that would pass the budget with it is refused although nothing is spent yet;
    the charge settles the hold, a release frees it, a reservation of a dead process lapses."""
    ledger = CostLedger(tmp_path / "c.jsonl", global_budget_usd=10.0, episode_budget_usd=6.0)
    first = ledger.reserve("a", 4.0, what="job-1")
    assert ledger.reserved() == 4.0 and ledger.spent() == 0.0          # held, not spent
    with pytest.raises(BudgetExceeded, match=r"episode budget exceeded: episode a spent \$0.00 \+ held \$4.00"):
        ledger.reserve("a", 3.0)
    other = ledger.reserve("b", 5.0)
    with pytest.raises(BudgetExceeded, match=r"global budget exceeded: spent \$0.00 \+ held for jobs in flight"):
        ledger.check_budget("c", 2.0)
    ledger.settle(first, CostRecord(kind="gpu_job", episode_id="a", usd=1.5))   # the real charge
    assert ledger.spent() == 1.5 and ledger.reserved() == 5.0
    ledger.settle(other)                                                        # nothing was charged
    assert ledger.reserved() == 0.0 and ledger.spent() == 1.5
    ledger.reserve(None, 8.0, ttl_s=-1)                                         # a dead process's hold
    assert ledger.reserved() == 0.0 and ledger.reserve(None, 8.0)


def _reserver(path, out):
    ledger = CostLedger(path, global_budget_usd=5.0)
    try:
        ledger.reserve(None, 1.0)
        out.put(1)
    except BudgetExceeded:
        out.put(0)


def test_concurrent_reservations_never_pass_the_budget(tmp_path):
    path = tmp_path / "c.jsonl"
    out: mp.Queue = mp.Queue()
    procs = [mp.Process(target=_reserver, args=(path, out)) for _ in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert sum(out.get(timeout=5) for _ in procs) == 5 and CostLedger(path).reserved() == 5.0
