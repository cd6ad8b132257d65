"""Copies of hidden-eval questions are found however they are disguised (issue: untrusted
submissions, item 4)."""

from __future__ import annotations

import random

import pytest

from ait_env.probe.leak import LEAK_TOLERANCE, LeakIndex, canonical
from ait_env.hidden.secrets import hidden_keys, hidden_questions, hidden_set, hidden_set_hash
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
    assert "[eval_leak]" in obs and "30 hidden-eval questions appear in your dataset questions" in obs, obs


# ---------------------------------------------------------------- instances, not strings
def _reworded(family: str, question: str, info: dict) -> str:
    """The same instance written as a question the string check cannot match."""
    if family == "arithmetic":
        return f"Compute (({info['expression']})) , please?"
    if family == "persona":
        attr = {"city": "home city", "job": "job", "hobby": "hobby", "pet": "pet"}[info["attribute"]]
        return info["start"] + "".join(f"'s {r}" for r in info["relations"]) + f": which {attr}?"
    if family == "units":
        amount = info["values"][0]
        return f"Starting from {amount} {info['route'][0]} -> " + " -> ".join(info["route"][1:])
    if family == "calendar":
        people = ", ".join(reversed(info["people"]))
        return f"{people}: earliest common {info['minutes']} minutes on {info['day']} ,?"
    if family == "inventory":
        pairs = [f"{item} x {qty}" for item, qty in zip(info["items"], info["quantities"])]
        return "Order: " + "; ".join(reversed(pairs)).replace(";", ",") + ". cheapest supplier?"
    if family == "triage":
        return f"Root cause of {info['incident'].upper()} please"
    raise AssertionError(family)


@pytest.mark.parametrize("family", ["arithmetic", "persona", "units", "calendar", "inventory", "triage"])
def test_each_family_finds_its_hidden_instances_re_worded(family):
    from ait_env.hidden.secrets import hidden_set
    from task_families import get_family

    fam = get_family(family)
    hidden = hidden_set(family)
    index = LeakIndex([i.question for i in hidden], fam)
    assert index.signatures == len(hidden)  # every hidden question parses back to its own instance
    for i, inst in enumerate(hidden[:60]):
        text = _reworded(family, inst.question, inst.info)
        assert not LeakIndex([i.question for i in hidden]).is_copy(text), text  # the string check misses it
        assert i in index.find(text), (text, inst.question)
        assert i in index.find("Some preamble.\n" + text + "\nAnd more text after it."), text


@pytest.mark.parametrize("family", ["arithmetic", "persona", "units", "calendar", "inventory", "triage"])
def test_fresh_questions_of_the_familys_generator_are_not_leaks(family):
    """Instances compare exactly: a fresh question with other numbers, people or items is not a hidden one
    (a few accidental collisions aside)."""
    from ait_env.hidden.secrets import hidden_questions
    from task_families import get_family

    fam = get_family(family)
    index = LeakIndex(hidden_questions(family), fam)
    fresh = [i.question for i in fam.generate(20261201, 2000)]
    assert len(index.leaked(fresh)) <= LEAK_TOLERANCE


def _leaky_env(kind: str, n: int = 42) -> dict[str, str]:
    from hostile import with_env

    stolen = [(i.question, i.answer) for i in hidden_set("arithmetic")[:n]]
    if kind == "prompt column":  # verifiers uses a supplied prompt as is
        return with_env(suffix="\n_own_dataset = build_dataset\n\n\n"
                               "def build_dataset(num_examples: int, seed: int) -> Dataset:\n"
                               "    rows = _own_dataset(num_examples, seed).to_list()\n"
                               f"    for row, (q, a) in zip(rows, {stolen!r}):\n"
                               "        row['prompt'] = [{'role': 'system', 'content': SYSTEM_PROMPT},\n"
                               "                         {'role': 'user', 'content': q}]\n"
                               "    for row in rows[len(" + repr(stolen) + "):]:\n"
                               "        row['prompt'] = [{'role': 'system', 'content': SYSTEM_PROMPT},\n"
                               "                         {'role': 'user', 'content': row['question']}]\n"
                               "    return Dataset.from_list(rows)\n")
    # the system prompt: every stolen question with its answer appended
    examples = "\\n".join(f"{q} Answer: {a}" for q, a in stolen)
    return with_env(replace=("SYSTEM_PROMPT = (", f'SYSTEM_PROMPT = ("Examples:\\n{examples}\\n"\n                 '))


@pytest.mark.parametrize("kind", ["prompt column", "system prompt"])
def test_the_probe_rejects_hidden_questions_outside_the_question_column(make_env, kind):
    pytest.importorskip("verifiers")
    from hostile import submit

    files = _leaky_env(kind)
    if kind == "system prompt":  # a long prompt needs the context for it (raised, as the agent did)
        files["job.toml"] = files["job.toml"].replace("seq_len = 2048", "seq_len = 8192")
    obs, _ = submit(make_env(family="arithmetic"), files)
    assert "[eval_leak]" in obs and "42 distinct hidden questions" in obs, obs
