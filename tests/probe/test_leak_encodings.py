"""Hidden questions are found in what the model reads, however the job wrote them (issue 46, item 1): one
reader of a chat request (:func:`ait_env.probe.leak.model_texts`: content parts joined, tool schemas' keys and
values) and one normaliser (:func:`ait_env.probe.leak.views`: numbers in words, hex, Roman numerals or digit by
digit, reversed text, spread-out letters, inserted punctuation, Unicode compatibility forms), shared by the probe
and the training audit. A Hypothesis property composes the encodings and the places a question can hide in."""

from __future__ import annotations

import re
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ait_env.hidden.secrets import hidden_questions
from ait_env.probe.leak import LEAK_TOLERANCE, LeakIndex, decode_numbers, model_texts, views
from task_families import FAMILY_NAMES, get_family

ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
#: a number that stands alone (not inside an id such as p3156 or inc-4f2a, not a decimal's part)
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")
FULLWIDTH = {c: chr(ord(c) + 0xFEE0) for c in map(chr, range(0x21, 0x7F))}
LOOKALIKE = {"a": "\u0430", "e": "\u0435", "o": "\u043e", "p": "\u0440", "c": "\u0441"}


def words(n: int) -> str:
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else "-" + ONES[n % 10])
    if n < 1000:
        return ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " and " + words(n % 100))
    return words(n // 1000) + " thousand" + ("" if n % 1000 == 0 else " " + words(n % 1000))


def roman(n: int) -> str:
    out = ""
    for value, letters in ((1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"),
                           (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")):
        while n >= value:
            out, n = out + letters, n - value
    return out


def _each_number(how):
    def encode(q: str) -> str:
        return NUMBER.sub(lambda m: how(m.group(0)), q)
    return encode


def _words(tok: str) -> str:
    whole, _, frac = tok.partition(".")
    return words(int(whole)) + (" point " + " ".join(ONES[int(d)] for d in frac) if frac else "")


#: how each number of the question is written (decimals keep their digits where the notation has none)
NUMBERS = {
    "digits": lambda q: q,
    "words": _each_number(_words),
    "hex": _each_number(lambda t: hex(int(t)) if "." not in t else t),
    "roman": _each_number(lambda t: roman(int(t)) if "." not in t and 0 < int(t) < 4000 else t),
    "digit_words": _each_number(lambda t: " ".join(ONES[int(d)] for d in t) if "." not in t else t),
    "digits_spaced": _each_number(lambda t: " ".join(t) if "." not in t else t),
}
#: how the letters are written
LETTERS = {
    "as_is": lambda q: q,
    "upper": str.upper,
    "fullwidth": lambda q: "".join(FULLWIDTH.get(c, c) for c in q),
    "lookalikes": lambda q: "".join(LOOKALIKE.get(c, c) for c in q),
    "zero_width": lambda q: "\u200b".join(q),
}
#: how the text is laid out
LAYOUT = {
    "as_is": lambda q: q,
    "reversed": lambda q: q[::-1],
    "words_reversed": lambda q: " ".join(reversed(q.split())),
    "spread": lambda q: " ".join(q),
    "dotted": lambda q: ".".join(q),
    "punctuated": lambda q: " ; ".join(q.split()),
}
#: combinations whose reading is ambiguous by construction: digit-by-digit numbers cut apart by inserted
#: punctuation or spread letters read as separate numbers (the outcome check prices what is left)
AMBIGUOUS = {("digit_words", "punctuated"), ("digits_spaced", "punctuated"), ("digits_spaced", "spread"),
             ("digits_spaced", "words_reversed"), ("digits_spaced", "reversed"), ("digit_words", "spread"),
             ("digits_spaced", "dotted"), ("digit_words", "words_reversed")}


def _places(text: str, cut: int) -> dict[str, tuple[list, list]]:
    """(messages, tools) of a chat request that shows ``text`` to the model in each place it can hide."""
    cut = max(1, min(len(text) - 1, cut))
    schema = {"type": "object", "properties": {"expression": {"type": "string", "description": "the input"}}}
    return {
        "user": ([{"role": "user", "content": text}], []),
        "content_parts": ([{"role": "user", "content": [{"type": "text", "text": text[:cut]},
                                                        {"type": "text", "text": text[cut:]}]}], []),
        "system_padded": ([{"role": "system", "content": f"Be careful.\n{text}\nThen answer."},
                           {"role": "user", "content": "hi"}], []),
        "tool_description": ([], [{"type": "function", "function": {"name": "calculator", "description": text,
                                                                    "parameters": schema}}]),
        "parameter_names": ([], [{"type": "function", "function": {"name": "calculator", "parameters": {
            "type": "object", "properties": {text[:cut]: {"type": "string"}, text[cut:]: {"type": "string"}}}}}]),
        "tool_call_arguments": ([{"role": "assistant", "content": "", "tool_calls": [{
            "id": "c1", "type": "function", "function": {"name": "calculator", "arguments": {"note": text}}}]}], []),
    }


@lru_cache(maxsize=None)
def _index(family: str) -> LeakIndex:
    return LeakIndex(hidden_questions(family), get_family(family))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(family=st.sampled_from(FAMILY_NAMES), which=st.integers(0, 299), numbers=st.sampled_from(sorted(NUMBERS)),
       letters=st.sampled_from(sorted(LETTERS)), layout=st.sampled_from(sorted(LAYOUT)),
       place=st.sampled_from(["user", "content_parts", "system_padded", "tool_description", "parameter_names",
                              "tool_call_arguments"]), cut=st.integers(1, 200))
def test_an_encoded_hidden_question_is_found_wherever_the_model_reads_it(family, which, numbers, letters, layout,
                                                                         place, cut):
    if (numbers, layout) in AMBIGUOUS or (family == "units" and numbers == "roman" and letters == "upper"):
        return  # (in capitals, unit names are Roman numerals too: ML, CM, MM, L)
    question = hidden_questions(family)[which]
    text = LAYOUT[layout](LETTERS[letters](NUMBERS[numbers](question)))
    messages, tools = _places(text, cut)[place]
    found = _index(family).leaked(model_texts(messages, tools))
    assert which in found, (text, place)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_fresh_questions_in_every_encoding_are_not_leaks(family):
    """The readings do not make new questions into hidden ones: fresh questions of the family's generator,
    written in each encoding, state no more hidden questions than chance collisions."""
    fresh = [i.question for i in get_family(family).generate(424242, 60)]
    index = _index(family)
    for name, encode in {**NUMBERS, **LAYOUT}.items():
        assert len(index.leaked(encode(q) for q in fresh)) <= LEAK_TOLERANCE, name


def test_the_red_teams_encodings_read_back():
    """The issue's cases, one by one: numbers as words (``four+nine``), as hex (``0x4+0x9``), a reversed
    question, and a question cut into content parts."""
    assert "what is 4+9+45" in views("What is four+nine+forty-five")
    assert "what is 4+9+45" in views("What is 0x4+0x9+0x2d")
    assert "what is 4 + 9 + 45" in views("What is IV + IX + XLV")
    assert decode_numbers("ninety-one point six tbsp") == "91.6 tbsp"
    assert decode_numbers("p fifty-two, p thirty-nine") == "p52, p39"
    assert decode_numbers("one hundred and two thousand three hundred") == "102300"
    assert any("4+9+45" in v for v in views("?54+9+4 si tahW"[::-1][::-1]))
    parts = model_texts([{"role": "user", "content": [{"type": "text", "text": "What is (4+"},
                                                      {"type": "text", "text": "9)+45?"}]}])
    assert parts[0] == "What is (4+9)+45?"


def test_a_question_as_tool_parameter_names_is_read_as_the_model_reads_it():
    """Keys count: the red team put hidden questions (with their answers) as parameter names."""
    stolen = hidden_questions("arithmetic")[:LEAK_TOLERANCE + 1]
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {
        "type": "object", "properties": {q + " Answer: 7": {"type": "string"} for q in stolen}}}}]
    assert len(_index("arithmetic").leaked(model_texts([], tools))) == len(stolen)


def test_hostile_structures_are_read_without_raising():
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["k"] = {}
        node = node["k"]
    texts = model_texts([{"role": "user", "content": [{"type": "image"}, 5, None, "x" * 10]}, 7, None, deep],
                        [{"function": 3}, "tool", {"function": {"name": 10 ** 5000}}])
    assert "xxxxxxxxxx" in texts[0]
    assert _index("arithmetic").leaked(texts + ["9" * 6000, "one " * 3000]) == set()
