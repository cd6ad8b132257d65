"""Tools of the calendar family: hash-defined busy slots per person and weekday."""

from __future__ import annotations

from task_families.base import Instance
from task_families.calendar import tools
from task_families.calendar.family import FAMILY, earliest_common_slot, looked_up, parse_time
from task_families.calendar.tools import busy_slots


def test_busy_slots_is_deterministic_and_well_formed():
    for n in range(1, 100, 3):
        for day in tools.DAYS:
            out = busy_slots(f"p{n}", day)
            assert out == busy_slots(f"P{n} ", day.upper())
            assert len(out) <= 100
            if out != "none":
                spans = [s.split("-") for s in out.split(", ")]
                flat = [t for span in spans for t in span]
                assert flat == sorted(flat) and "09:00" <= flat[0] and flat[-1] <= "17:00"
    assert busy_slots("p3", "Tuesday") == busy_slots("p3", "Tue")


def test_hand_checked_example():
    assert busy_slots("p3", "Tue") == "09:00-11:00, 12:00-13:00, 15:30-17:00"
    assert busy_slots("p8", "Tue") == "09:00-10:00, 12:30-13:30, 15:00-16:30"
    assert busy_slots("p12", "Tue") == "09:00-10:30, 11:30-13:30, 15:00-16:30"
    # together busy 09:00-11:00, 11:30-13:30, 15:00-17:00 -> free 11:00-11:30 and 13:30-15:00
    masks = [tools.busy_mask(p, "Tue") for p in ("p3", "p8", "p12")]
    assert earliest_common_slot(masks, 30) == "11:00"
    assert earliest_common_slot(masks, 60) == "13:30"
    assert earliest_common_slot(masks, 120) is None
    inst = Instance(question="When is the earliest 60-minute slot on Tue when p3, p8 and p12 are all free?",
                    answer="13:30", info={"people": ["p3", "p8", "p12"], "day": "Tue", "minutes": 60, "n_calls": 3})
    assert [s.arguments for s in FAMILY.solution(inst)] == [{"person": p, "day": "Tue"} for p in ("p3", "p8", "p12")]


def test_bad_arguments_are_error_text():
    for bad in ("p0", "p100", "12", "x", ""):
        assert busy_slots(bad, "Mon").startswith("error: unknown person")
    assert busy_slots("p3", "Sat").startswith("error: unknown day 'Sat'")
    assert busy_slots("p3", "2024-05-01").startswith("error: unknown day")


def test_difficulty_sets_people_and_checker_reads_times():
    easy, hard = FAMILY.generate(3, 1, difficulty=0.0)[0], FAMILY.generate(3, 1, difficulty=1.0)[0]
    assert len(FAMILY.solution(easy)) == 2 and len(FAMILY.solution(hard)) == 5
    assert parse_time("9:30") == "09:30" and parse_time("2:00 pm") == "14:00" and parse_time("soon") is None
    inst = Instance(question="q", answer="14:00", info={})
    assert FAMILY.check(inst, "Answer: 2:00 PM") == 1.0
    assert FAMILY.check(inst, "Answer: 14:00 (everyone is free)") == 1.0
    assert FAMILY.check(inst, "Answer: 14:30") == 0.0
    assert FAMILY.check(inst, "14:00") == 0.0


def test_looked_up_reads_structured_calls_and_skips_broken_arguments() -> None:
    call = lambda args: {"function": {"name": "busy_slots", "arguments": args}}  # noqa: E731
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call('{"person": "p3", "day": "Mon"}')]},
        {"role": "tool", "content": "busy"},
        {"role": "assistant", "content": "", "tool_calls": [call("{not json"), call('["p9"]'),
                                                            call({"person": "p8", "day": "Mon"})]},
    ]
    assert looked_up(msgs) == {"p3", "p8"}
    assert looked_up([]) == set()


def _reference_env():
    """The calendar reference environment module, imported as a job bundle would (``family_tools``)."""
    import importlib.util
    import sys
    from pathlib import Path

    sys.modules.setdefault("family_tools", tools)
    path = Path(FAMILY.template_dir).parent / "reference" / "environment.py"
    spec = importlib.util.spec_from_file_location("calendar_reference_env", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _shortcut(inst: Instance) -> tuple[bool, bool]:
    """(skipping the last person is right, ignoring the meeting length is right) for ``inst``."""
    masks = [tools.busy_mask(p, inst.info["day"]) for p in inst.info["people"]]
    minutes = inst.info["minutes"]
    skip = earliest_common_slot(masks[:-1], minutes) == inst.answer
    ignore = minutes > 30 and earliest_common_slot(masks, 30) == inst.answer
    return skip, ignore


def test_every_step_rule_leaves_no_shortcut_and_natural_questions_have_them() -> None:
    import pytest

    insts = FAMILY.generate(21, 200)
    assert all(_shortcut(i) == (False, False) for i in insts)
    assert {len(i.info["people"]) for i in insts} == {2, 3, 4, 5}  # every size still drawn
    natural = FAMILY.generate(21, 200, rule="natural")
    shortcuts = [_shortcut(i) for i in natural]
    assert sum(s for s, _ in shortcuts) > 40 and sum(g for _, g in shortcuts) > 10
    assert FAMILY.pretraining_instances(21, 50) == FAMILY.generate(21, 50, rule="natural")
    with pytest.raises(ValueError, match="unknown calendar rule"):
        FAMILY.generate(21, 1, rule="easy")


def test_reference_environment_draws_the_hidden_sets_kind_of_question() -> None:
    env = _reference_env()
    for inst in FAMILY.generate(22, 150, rule="natural"):
        info = inst.info
        want = _shortcut(inst) == (False, False)
        assert env.every_step_counts(info["people"], info["day"], info["minutes"], inst.answer) == want
    rows = env.build_dataset(60, seed=3, min_difficulty=0.0, max_difficulty=1.0)
    for row in rows:
        people = row["question"].split(" when ")[1].removesuffix(" are both free?").removesuffix(" are all free?")
        names = people.replace(" and ", ", ").split(", ")
        day = row["question"].split(" on ")[1].split(" ")[0]
        minutes = int(row["question"].split("earliest ")[1].split("-minute")[0])
        assert env.earliest_slot(names, day, minutes) == row["answer"]
        assert env.every_step_counts(names, day, minutes, row["answer"])
