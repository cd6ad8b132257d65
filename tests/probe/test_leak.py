"""Copies of hidden-eval questions are found however they are disguised (issue: untrusted
submissions, item 4)."""

from __future__ import annotations

import random

import pytest

from ait_env.probe.leak import LeakIndex, canonical
from ait_env.secrets import hidden_keys, hidden_questions, hidden_set_hash
from task_families import FAMILY_NAMES, get_family

FULLWIDTH = {c: chr(ord(c) + 0xFEE0) for c in map(chr, range(0x21, 0x7F))}
HOMOGLYPHS = {"a": "\u0430", "e": "\u0435", "o": "\u043e", "p": "\u0440", "c": "\u0441", "x": "\u0445"}

DISGUISES = {
    "zero_width_inside": lambda q: q[:3] + "\u200b" + q[3:],
    "zero_width_everywhere": lambda q: "\u200b".join(q),
    "space_before_question_mark": lambda q: q.rstrip("?") + " ?",
    "no_question_mark": lambda q: q.rstrip("?"),
    "period_instead": lambda q: q.rstrip("?") + ".",
    "upper_case": str.upper,
    "double_spaces_and_tabs": lambda q: q.replace(" ", " \t "),
    "non_breaking_spaces": lambda q: q.replace(" ", "\u00a0"),
    "fullwidth": lambda q: "".join(FULLWIDTH.get(c, c) for c in q),
    "cyrillic_lookalikes": lambda q: "".join(HOMOGLYPHS.get(c, c) for c in q),
    "combining_accents": lambda q: "".join(c + "\u0301" if c.isalpha() else c for c in q),
    "soft_hyphens_and_joiners": lambda q: q.replace(" ", "\u00ad \u2060"),
    "bom_and_bidi_marks": lambda q: "\ufeff\u200e" + q + "\u200f",
    "quoted": lambda q: f'"{q}"',
    "prefixed": lambda q: "Question: " + q,
    "suffixed_after_the_question": lambda q: q + " Answer with the final value only.",
    "spaced_punctuation": lambda q: q.replace(",", " , ").replace("(", "( ").replace(")", " )"),
}


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("disguise", sorted(DISGUISES))
def test_every_disguised_hidden_question_is_found(family, disguise):
    hidden = hidden_questions(family)
    index = LeakIndex(hidden)
    sample = random.Random(0).sample(hidden, 25)
    missed = [q for q in sample if not index.is_copy(DISGUISES[disguise](q))]
    assert not missed, missed[:3]


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_fresh_questions_are_not_flagged_more_than_exact_copies(family):
    """The normalisation must not turn distinct questions into copies: on a fresh draw it flags exactly
    what the old exact key flagged (accidental repeats of short questions)."""
    hidden = hidden_questions(family)
    exact = hidden_keys(family)
    fresh = get_family(family).generate(424242, 3000)
    assert LeakIndex(hidden).count(i.question for i in fresh) == sum(1 for i in fresh if i.key in exact)


def test_a_longer_question_that_extends_a_hidden_one_is_not_a_copy():
    index = LeakIndex(["What is (3+4)*5?"])
    assert index.is_copy("what is (3 + 4) * 5")
    assert not index.is_copy("What is (3+4)*5+1?")
    assert not index.is_copy("What is (3+4)*56?")


def test_canonical_form():
    assert canonical("What  is 3+4 ?") == canonical("what is 3 + 4") == "what is 3 + 4"


def test_instance_identity_and_the_hidden_set_hashes_are_unchanged():
    """Leak detection has its own normalisation; the hashes that baselines record are the pinned ones."""
    assert hidden_set_hash("arithmetic") == "3533a68ee85abdcb"
    assert hidden_set_hash("triage") == "d92406d460353708"


def test_the_probe_rejects_a_dataset_of_disguised_hidden_questions(make_env):
    pytest.importorskip("verifiers")
    from hostile import submit, with_env

    disguised = [DISGUISES["zero_width_inside"](q) for q in hidden_questions("arithmetic")[:30]]
    files = with_env(suffix="\n_own_dataset = build_dataset\n\n\n"
                            "def build_dataset(num_examples: int, seed: int) -> Dataset:\n"
                            "    rows = _own_dataset(num_examples, seed).to_list()\n"
                            f"    rows += [{{'question': q, 'answer': '0'}} for q in {disguised!r}]\n"
                            "    return Dataset.from_list(rows)\n")
    obs, _ = submit(make_env(family="arithmetic"), files)
    assert "[eval_leak]" in obs and "copies of hidden-eval questions" in obs, obs
