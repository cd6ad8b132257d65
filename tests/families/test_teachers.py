"""The families' flawed teachers (``task_families/<name>/teacher.py``): clean demonstrations solve the
task, the flaw tables are consistent and graded, and the scratchpads say what they claim (fast)."""

from __future__ import annotations

import json

from ait_env.hidden.secrets import hidden_set
from task_families import FAMILY_NAMES, get_family
from task_families.calendar import teacher as cal
from task_families.teacher import (FLAW_KINDS, describe_flaws, final_content, get_teacher, oracle_ladder,
                                   teacher_completion)


def test_clean_teacher_solves_the_hidden_sets() -> None:
    """With no flaws the teacher is a correct solver: every flaw is a behaviour choice on top of it."""
    for fam_name in FAMILY_NAMES:
        fam = get_family(fam_name)
        insts = hidden_set(fam_name)[:60]
        for i, inst in enumerate(insts):
            comp, used = teacher_completion(fam_name, inst, mode="clean", seed=i)
            assert not used
            assert fam.check(inst, final_content(comp)) == 1.0, (fam_name, inst.question, comp[-1])


def test_oracle_ladder_is_graded() -> None:
    """Greedy oracle: base in a weak band, several distinct intermediate scores, ceiling 1."""
    for fam_name in FAMILY_NAMES:
        ladder = [s for _, s in oracle_ladder(fam_name, hidden_set(fam_name)[:150])]
        assert ladder[0] <= 0.7, (fam_name, ladder)   # perfect-skill bound; trained models score lower
        assert ladder[-1] >= 0.95, (fam_name, ladder)
        assert len({round(s, 2) for s in ladder}) >= 4, (fam_name, ladder)


def test_flaw_table_is_consistent() -> None:
    kinds = set(FLAW_KINDS)
    for fam in FAMILY_NAMES:
        flaws = get_teacher(fam).flaws
        keys = [f.key for f in flaws]
        assert len(keys) == len(set(keys))
        assert {f.kind for f in flaws} <= kinds
        assert len({f.kind for f in flaws if f.rate > 0.5}) >= 2, fam   # several kinds of visible flaw
        assert all(0.0 <= f.rate <= 1.0 for f in flaws)
    assert all(f.key in describe_flaws() for fam in FAMILY_NAMES for f in get_teacher(fam).flaws)


def test_units_scratchpad_tracks_the_route() -> None:
    """Each call is preceded by the units still to reach after it; the last call by ``left: none``."""
    fam = get_family("units")
    for i, inst in enumerate(fam.generate(11, 40)):
        comp, used = teacher_completion("units", inst, mode="clean", seed=i)
        calls = [m for m in comp if m.get("tool_calls")]
        route = inst.info["route"]
        assert len(calls) == len(route) - 1
        for j, m in enumerate(calls):
            assert m["content"] == "left: " + (" ".join(route[j + 2:]) or "none") + "\n"


def test_calendar_scratchpad_lists_unions_and_walks_to_the_answer() -> None:
    from task_families.calendar import tools as ctools

    fam = get_family("calendar")
    assert cal.mask_note([False] * 15 + [True], 60) == "busy 60: 09..10..11..12..13..14..15..16.x"
    assert (cal.listing_note("09:00-10:00, 13:00-14:30, 16:30-17:00")
            == "09-10 09 09h; 13-14h 13 13h 14; 16h-17 16h")
    union = [True, False, True, True, False, False, False] + [True] * 9
    assert cal.free_note(union, 60, 2) == ("free 60: 09xa10xx11ab", 4)
    assert cal.free_note(union, 30, 1) == ("free 30: 09xa", 1)
    assert cal.free_note(union, 90, 3) == ("free 90: 09xa10xx11ab12c", 4)
    full = "free 30: " + "".join(f"{h:02d}xx" for h in range(9, 17))
    assert cal.free_note([True] * 16, 30, 1) == (full, None)
    for i, inst in enumerate(fam.generate(12, 40)):
        comp, _ = teacher_completion("calendar", inst, mode="clean", seed=i)
        people, day, minutes = inst.info["people"], inst.info["day"], inst.info["minutes"]
        after = [m["content"].split("\n") for m in comp[2::2]]   # the messages after each tool result
        assert len(after) == len(people)
        for j, lines in enumerate(after):
            mine = ctools.busy_mask(people[j], day)
            listed = [x for part in lines[0].split("; ") for x in part.split()[1:]] if lines[0] != "free" else []
            assert listed == [cal.half_label(k) for k in range(ctools.N_SLOTS) if mine[k]]
            union = [any(col) for col in zip(*(ctools.busy_mask(p, day) for p in people[:j + 1]))]
            assert lines[1] == cal.mask_note(union, minutes)
        walk = after[-1][2]
        assert walk.startswith(f"free {minutes}: ")
        # the walk copies the union line, free marks counting the run, and ends on the run it answers
        union_marks = after[-1][1].split(": ")[1]
        assert [c == "x" for c in walk.split(": ")[1] if not c.isdigit()] == [
            c == "x" for c in union_marks if not c.isdigit()][:sum(not c.isdigit() for c in walk.split(": ")[1])]
        assert walk.endswith(cal.RUN_MARKS[minutes // 30 - 1])
        calls = [m for m in comp if m.get("tool_calls")]
        assert [m["content"].split("\n")[-2] for m in calls] == [
            f"left {minutes}: " + (" ".join(people[j + 1:]) or "none") for j in range(len(people))]
        assert comp[-1]["content"].endswith(f"Answer: {inst.answer}")


def test_inventory_scratchpad_keeps_the_cheapest_quote() -> None:
    """After every quote the teacher writes the cheapest feasible quote so far; the answer copies it."""
    fam = get_family("inventory")
    n_best = 0
    for i, inst in enumerate(fam.generate(13, 40)):
        comp, _ = teacher_completion("inventory", inst, mode="clean", seed=i)
        best: tuple[int, str] | None = None
        # comp: find_suppliers call, its result, then (message, quote result) pairs, then the answer
        for call, result, after in zip(comp[2::2], comp[3::2], comp[4::2]):
            supplier = json.loads(call["tool_calls"][0]["function"]["arguments"])["supplier"]
            if result["content"].startswith("cost="):
                quote = (int(result["content"][5:]), supplier)
                best = min(best, quote) if best else quote
            assert after["content"].split("\n")[0] == (f"best: {best[1]} {best[0]}" if best else "best: none")
            n_best += 1
        if best:
            assert comp[-1]["content"] == f"best: {best[1]} {best[0]}\nAnswer: supplier={best[1]};cost={best[0]}"
    assert n_best > 40
