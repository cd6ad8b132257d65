"""Tools of the triage family (held out): hash-defined incidents over a fixed service graph."""

from __future__ import annotations

from ait_env.config import family_settings
from task_families.base import Instance
from task_families.triage import tools
from task_families.triage.family import FAMILY, parse_answer
from task_families.triage.tools import alerts, dependencies, deploys, logs


def test_triage_is_held_out():
    assert family_settings("triage").held_out is True


def test_tools_are_deterministic():
    for inc in ("inc-7fk2", "inc-0000", "inc-zzzz"):
        assert alerts(inc) == alerts(inc.upper() + " ")
        assert deploys(inc) == deploys(inc)
        for s in tools.SERVICES:
            assert logs(inc, s) == logs(inc, s.upper())
            assert len(logs(inc, s)) <= 100
        assert len(deploys(inc)) <= 100


def test_hand_checked_example():
    inc = "inc-7fk2"
    assert alerts(inc) == "gateway: error rate 10% (SLO 1%)"
    assert logs(inc, "gateway") == "gateway: timeouts calling api on 10% of requests"
    assert logs(inc, "api") == "api: OOMKilled, container restarted 7 times in 10 min"
    assert logs(inc, "db") == "db: no errors"
    assert deploys(inc) == "11:47 email deploy v2.2; 07:55 search deploy v4.2"
    assert dependencies("api") == "api depends on: auth, db, cache, search"
    assert dependencies("db") == "db depends on: nothing"
    inst = FAMILY.generate(1, 1)[0]
    facts = tools.incident_facts(inst.info["incident"])
    assert inst.answer == f"service={facts['root']};action={facts['action']}"


def test_chain_follows_the_dependency_graph():
    for n in range(300):
        facts = tools.incident_facts(f"inc-{n:04d}")
        chain = facts["chain"]
        for caller, callee in zip(chain, chain[1:]):
            assert callee in tools.DEPENDENCIES[caller]
        entries = deploys(f"inc-{n:04d}")
        if facts["action"] == "rollback":
            assert f"{facts['root']} deploy" in entries
        elif facts["action"] == "fix_config":
            assert f"{facts['root']} config change" in entries
        else:
            assert f" {facts['root']} " not in f" {entries} "


def test_bad_arguments_are_error_text():
    for bad in ("7fk2", "inc-7fk", "inc-7fk2x", "", "INC_7FK2"):
        assert alerts(bad).startswith("error: unknown incident")
        assert deploys(bad).startswith("error: unknown incident")
        assert logs(bad, "api").startswith("error: unknown incident")
    assert logs("inc-7fk2", "mainframe").startswith("error: unknown service 'mainframe'")
    assert dependencies("mainframe").startswith("error: unknown service")


def test_partial_credit_and_difficulty():
    easy, hard = FAMILY.generate(3, 1, difficulty=0.0)[0], FAMILY.generate(3, 1, difficulty=1.0)[0]
    assert len(FAMILY.solution(easy)) == 2 and len(FAMILY.solution(hard)) == 5
    inst = Instance(question="q", answer="service=db;action=scale_up", info={"chain": ["api", "db"]})
    assert parse_answer("service: DB, action: scale up") == ("db", "scale_up")
    assert FAMILY.check(inst, "Answer: service=db;action=scale_up") == 1.0
    assert FAMILY.check(inst, "Answer: service=db;action=restart") == 0.5
    assert FAMILY.check(inst, "Answer: service=api;action=scale-up") == 0.5
    assert FAMILY.check(inst, "Answer: service=api;action=rollback") == 0.0
    assert FAMILY.check(inst, "service=db;action=scale_up") == 0.0
