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


def _shortcut(inst: Instance) -> tuple[bool, bool]:
    """(skipping the last person is right, ignoring the meeting length is right) for ``inst``."""
    from task_families.calendar.family import shortcuts

    return shortcuts([tools.busy_mask(p, inst.info["day"]) for p in inst.info["people"]], inst.info["minutes"],
                     inst.answer)


def test_experimental_rules_change_how_often_a_shortcut_pays_and_natural_is_the_default() -> None:
    import pytest

    natural = FAMILY.generate(21, 600)
    assert natural == FAMILY.generate(21, 600, rule="natural")
    five = [i for i in natural if len(i.info["people"]) == 5]
    assert sum(_shortcut(i)[0] for i in five) / len(five) > 0.7      # skipping the last person mostly pays
    wrong = FAMILY.generate(21, 300, rule="shortcuts_wrong")
    assert all(_shortcut(i) == (False, False) for i in wrong)
    balanced = FAMILY.generate(21, 600, rule="balanced")
    assert {len(i.info["people"]) for i in balanced} == {2, 3, 4, 5}
    for k in (2, 3, 4, 5):
        skips = [_shortcut(i)[0] for i in balanced if len(i.info["people"]) == k]
        assert 0.35 <= sum(skips) / len(skips) <= 0.65, (k, sum(skips), len(skips))
    long = [_shortcut(i)[1] for i in balanced if i.info["minutes"] > 30]
    assert 0.4 <= sum(long) / len(long) <= 0.6
    assert len(FAMILY.hidden_eval(5, rule="balanced")) == 300
    with pytest.raises(ValueError, match="unknown calendar rule"):
        FAMILY.generate(21, 1, rule="easy")
