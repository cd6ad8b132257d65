"""The flawed-teacher pretraining corpus of the local models (fast: no training)."""

from __future__ import annotations

import json

import pytest

from cpu.tiny_models import catalog
from cpu.tiny_models import corpus as C
from cpu.tiny_models.chat import IM_END, render
from cpu.tiny_models.tokenizer import ChatTokenizer
from ait_env.hidden.secrets import hidden_keys
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
    assert set(stats) == set(C.CORPUS_FAMILIES)
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
    import ait_env.hidden.secrets as secrets

    real = secrets.hidden_keys
    monkeypatch.setattr(secrets, "hidden_keys", lambda f, *a, **k: real(f, *a, **k) | (planted if f == fam else set()))
    c = C.build_corpus(10, families=[fam])
    keys = [t.key for t in c.transcripts]
    assert len(keys) == 10 and not planted & set(keys)


def test_transcripts_use_real_tools_and_scores_match(small_corpus: C.Corpus) -> None:
    # a stateful family's tools answer from the episode's world: replay each transcript on a fresh one
    stateful = {f: {i.key: i for c in range(3) for i in get_family(f).generate(C.CORPUS_SEED + c, 64)}
                for f in {t.family for t in small_corpus.transcripts} if get_family(f).state_args}
    assert "warehouse" in stateful
    for t in small_corpus.transcripts:
        fam = get_family(t.family)
        world = fam.new_world(stateful[t.family][t.key]) if t.family in stateful else None
        msgs = t.messages
        assert msgs[0]["role"] == "system" and msgs[1]["role"] == "user"
        assert msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls")
        for i, m in enumerate(msgs):
            for tc in m.get("tool_calls") or []:
                name = tc["function"]["name"]
                args = json.loads(tc["function"]["arguments"])
                assert name in fam.tool_names
                assert msgs[i + 1]["role"] == "tool"
                assert msgs[i + 1]["content"] == fam.call_tool(name, args, world)
        assert t.text == render(msgs, fam.tool_schemas())
        assert len(msgs) <= 2 + 2 * fam.eval_max_turns


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
