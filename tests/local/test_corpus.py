"""The flawed-teacher pretraining corpus of the local models (fast: no training)."""

from __future__ import annotations

import json

import pytest

from ait_env.local import catalog
from ait_env.local import corpus as C
from ait_env.local.chat import IM_END, render
from ait_env.local.tokenizer import ChatTokenizer
from ait_env.secrets import hidden_keys, hidden_set
from task_families import FAMILY_NAMES, get_family


@pytest.fixture(scope="module")
def small_corpus() -> C.Corpus:
    return C.build_corpus(60)


@pytest.fixture(scope="module")
def tok(small_corpus: C.Corpus) -> ChatTokenizer:
    return ChatTokenizer(C.train_corpus_tokenizer(small_corpus.texts(), 1024))


def test_corpus_is_deterministic(small_corpus: C.Corpus) -> None:
    again = C.build_corpus(60)
    assert again.hash() == small_corpus.hash()
    assert [t.key for t in again.transcripts] == [t.key for t in small_corpus.transcripts]
    assert C.build_corpus(60, seed=C.CORPUS_SEED + 1).hash() != small_corpus.hash()


def test_every_family_present_with_flawed_and_correct_transcripts(small_corpus: C.Corpus) -> None:
    stats = small_corpus.stats()
    assert set(stats) == set(FAMILY_NAMES)
    for fam, s in stats.items():
        assert s["n"] == 60
        assert 0.1 <= s["correct"] <= 0.75, (fam, s)   # weak but not hopeless teacher
        assert s["flawed"] >= 0.3, (fam, s)


def test_no_hidden_question_in_corpus(small_corpus: C.Corpus) -> None:
    for fam in FAMILY_NAMES:
        hidden = hidden_keys(fam)
        keys = {t.key for t in small_corpus.transcripts if t.family == fam}
        assert not keys & hidden


def test_hidden_questions_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant corpus questions into the 'hidden set': the build drops them and still returns n."""
    fam = "arithmetic"
    plain = C.family_transcripts(fam, 10)
    planted = {t.key for t in plain[:4]}
    import ait_env.secrets as secrets

    real = secrets.hidden_keys
    monkeypatch.setattr(secrets, "hidden_keys", lambda f: real(f) | (planted if f == fam else set()))
    c = C.build_corpus(10, families=[fam])
    keys = [t.key for t in c.transcripts]
    assert len(keys) == 10 and not planted & set(keys)


def test_transcripts_use_real_tools_and_scores_match(small_corpus: C.Corpus) -> None:
    for t in small_corpus.transcripts:
        fam = get_family(t.family)
        msgs = t.messages
        assert msgs[0]["role"] == "system" and msgs[1]["role"] == "user"
        assert msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls")
        for i, m in enumerate(msgs):
            for tc in m.get("tool_calls") or []:
                name = tc["function"]["name"]
                args = json.loads(tc["function"]["arguments"])
                assert name in fam.tool_names
                assert msgs[i + 1]["role"] == "tool"
                assert msgs[i + 1]["content"] == fam.call_tool(name, args)
        assert t.text == render(msgs, fam.tool_schemas())
        assert len(msgs) <= 2 + 2 * fam.eval_max_turns


def test_clean_teacher_solves_the_hidden_sets() -> None:
    """With no flaws the teacher is a correct solver: every flaw is a behaviour choice on top of it."""
    for fam_name in FAMILY_NAMES:
        fam = get_family(fam_name)
        insts = hidden_set(fam_name)[:60]
        for i, inst in enumerate(insts):
            comp, used = C.teacher_completion(fam_name, inst, mode="clean", seed=i)
            assert not used
            assert fam.check(inst, C.final_content(comp)) == 1.0, (fam_name, inst.question, comp[-1])


def test_oracle_ladder_is_graded() -> None:
    """Greedy oracle: base in a weak band, several distinct intermediate scores, ceiling 1."""
    for fam_name in FAMILY_NAMES:
        ladder = [s for _, s in C.oracle_ladder(fam_name, hidden_set(fam_name)[:150])]
        assert ladder[0] <= 0.7, (fam_name, ladder)   # perfect-skill bound; trained models score lower
        assert ladder[-1] >= 0.95, (fam_name, ladder)
        assert len({round(s, 2) for s in ladder}) >= 4, (fam_name, ladder)


def test_flaw_table_is_consistent() -> None:
    kinds = {"early_answer", "skip_tool", "copy_slip", "format_slip", "wrong_tool"}
    for fam, flaws in C.FLAWS.items():
        assert fam in FAMILY_NAMES
        keys = [f.key for f in flaws]
        assert len(keys) == len(set(keys))
        assert {f.kind for f in flaws} <= kinds
        assert len({f.kind for f in flaws if f.rate > 0.5}) >= 2, fam   # several kinds of visible flaw
        assert all(0.0 <= f.rate <= 1.0 for f in flaws)
    assert all(f.key in C.describe_flaws() for flaws in C.FLAWS.values() for f in flaws)


def test_loss_mask_covers_exactly_the_assistant_outputs(small_corpus: C.Corpus, tok: ChatTokenizer) -> None:
    for t in small_corpus.transcripts[:40]:
        fam = get_family(t.family)
        tools = fam.tool_schemas()
        ids, mask = C.encode_transcript(tok, t.messages, tools)
        assert len(ids) == len(mask)
        trained = tok.decode([i for i, m in zip(ids, mask) if m])
        expected = ""
        for m in t.messages:
            if m["role"] == "assistant":
                expected += render([m])[len("<|im_start|>assistant\n"):].rstrip("\n")
        assert trained == expected
        assert trained.count(IM_END) == sum(m["role"] == "assistant" for m in t.messages)
        # the eval prompt tokenizes to a prefix of the transcript, and the first trained token follows it
        prompt = tok.encode_chat(t.messages[:2], tools, add_generation_prompt=True)
        assert ids[:len(prompt)] == prompt
        assert not any(mask[:len(prompt)]) and mask[len(prompt)] == 1


def test_batched_encoding_matches_and_words_copy_as_one_token(small_corpus: C.Corpus, tok: ChatTokenizer) -> None:
    ts = small_corpus.transcripts[:30]
    batched = C.encode_corpus(tok, ts)
    for t, got in zip(ts, batched):
        assert got == C.encode_transcript(tok, t.messages, get_family(t.family).tool_schemas())
    # a word is the same token after a space (question) and inside a JSON string (tool call)
    assert tok.encode(" neighbor")[-1] == tok.encode('"neighbor"')[1]
    assert tok.decode(tok.encode("Exchange 620 CHF to BRL")) == "Exchange 620 CHF to BRL"


def test_token_lengths_fit_the_context(small_corpus: C.Corpus, tok: ChatTokenizer) -> None:
    over: dict[str, int] = {}
    count: dict[str, int] = {}
    for t in small_corpus.transcripts:
        ids, _ = C.encode_transcript(tok, t.messages, get_family(t.family).tool_schemas())
        count[t.family] = count.get(t.family, 0) + 1
        over[t.family] = over.get(t.family, 0) + (len(ids) > catalog.BUILD.max_position_embeddings)
    # every family, calendar's 5-person conversations included, fits the models' context
    assert all(n == 0 for n in over.values()), over


def test_units_scratchpad_tracks_the_route() -> None:
    """Each call is preceded by the units still to reach after it; the last call by ``left: none``."""
    fam = get_family("units")
    for i, inst in enumerate(fam.generate(11, 40)):
        comp, used = C.teacher_completion("units", inst, mode="clean", seed=i)
        calls = [m for m in comp if m.get("tool_calls")]
        route = inst.info["route"]
        assert len(calls) == len(route) - 1
        for j, m in enumerate(calls):
            assert m["content"] == "left: " + (" ".join(route[j + 2:]) or "none") + "\n"


def test_calendar_scratchpad_lists_unions_and_walks_to_the_answer() -> None:
    from task_families.calendar import tools as ctools

    fam = get_family("calendar")
    assert C.mask_note([False] * 15 + [True], 60) == "busy 60: 09..10..11..12..13..14..15..16.x"
    assert (C.listing_note("09:00-10:00, 13:00-14:30, 16:30-17:00")
            == "09-10 09 09h; 13-14h 13 13h 14; 16h-17 16h")
    union = [True, False, True, True, False, False, False] + [True] * 9
    assert C.free_note(union, 60, 2) == ("free 60: 09xa10xx11ab", 4)
    assert C.free_note(union, 30, 1) == ("free 30: 09xa", 1)
    assert C.free_note(union, 90, 3) == ("free 90: 09xa10xx11ab12c", 4)
    assert C.free_note([True] * 16, 30, 1) == ("free 30: " + "".join(f"{h:02d}xx" for h in range(9, 17)), None)
    for i, inst in enumerate(fam.generate(12, 40)):
        comp, _ = C.teacher_completion("calendar", inst, mode="clean", seed=i)
        people, day, minutes = inst.info["people"], inst.info["day"], inst.info["minutes"]
        after = [m["content"].split("\n") for m in comp[2::2]]   # the messages after each tool result
        assert len(after) == len(people)
        for j, lines in enumerate(after):
            mine = ctools.busy_mask(people[j], day)
            listed = [x for part in lines[0].split("; ") for x in part.split()[1:]] if lines[0] != "free" else []
            assert listed == [C.half_label(k) for k in range(ctools.N_SLOTS) if mine[k]]
            union = [any(col) for col in zip(*(ctools.busy_mask(p, day) for p in people[:j + 1]))]
            assert lines[1] == C.mask_note(union, minutes)
        walk = after[-1][2]
        assert walk.startswith(f"free {minutes}: ")
        # the walk copies the union line, free marks counting the run, and ends on the run it answers
        union_marks = after[-1][1].split(": ")[1]
        assert [c == "x" for c in walk.split(": ")[1] if not c.isdigit()] == [
            c == "x" for c in union_marks if not c.isdigit()][:sum(not c.isdigit() for c in walk.split(": ")[1])]
        assert walk.endswith(C.RUN_MARKS[minutes // 30 - 1])
        calls = [m for m in comp if m.get("tool_calls")]
        assert [m["content"].split("\n")[-2] for m in calls] == [
            f"left {minutes}: " + (" ".join(people[j + 1:]) or "none") for j in range(len(people))]
        assert comp[-1]["content"].endswith(f"Answer: {inst.answer}")


def test_inventory_scratchpad_keeps_the_cheapest_quote() -> None:
    """After every quote the teacher writes the cheapest feasible quote so far; the answer copies it."""
    fam = get_family("inventory")
    n_best = 0
    for i, inst in enumerate(fam.generate(13, 40)):
        comp, _ = C.teacher_completion("inventory", inst, mode="clean", seed=i)
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
