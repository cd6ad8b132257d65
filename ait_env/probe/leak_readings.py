"""The readings of a text the leak check compares (:mod:`ait_env.probe.leak`): the text cleaned (Unicode
folded, look-alike letters undone, quotes and spacing evened), a question's canonical form, and the views under
which a hidden item could hide in what the model sees: numbers written in words, hex or digit by digit, Roman
numerals, letters spread apart, words reversed (:func:`views`). Pure functions over strings, bounded in size."""

from __future__ import annotations

import re
import unicodedata

#: look-alike letters of other scripts (lowercase, after case folding) -> the Latin letter
_HOMOGLYPHS = str.maketrans({
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c",
    "т": "t", "у": "y", "х": "x", "ѕ": "s", "і": "i", "ї": "i", "ј": "j", "ԁ": "d", "һ": "h", "ӏ": "l",
    "ԛ": "q", "ԝ": "w", "α": "a", "β": "b", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p",
    "τ": "t", "υ": "u", "χ": "x", "ϲ": "c", "ı": "i",
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2212": "-", "\u00d7": "*",
    "\u2217": "*", "\u2215": "/", "\u2044": "/",
})
_QUOTES = set("'\"`\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u00ab\u00bb\u2039\u203a")
_TOKEN = re.compile(r"\w+|[^\w\s]")
#: ASCII quotes go, line breaks stay (they end clauses), other control characters become spaces
_ASCII = {**{c: None for c in range(32)}, 9: " ", 11: " ", 12: " ", 10: "\n", 13: "\n", 127: None,
          ord("'"): None, ord('"'): None, ord("`"): None}
_END = ("?", ".", "!")
_WS = re.compile(r"\s+")
_SPACES = re.compile(r"[^\S\n]+")


# ---------------------------------------------------------------------------------- normalisation
def clean(text: str, fold_case: bool = True) -> str:
    """``text`` with Unicode compatibility forms, marks, format characters, look-alike letters and other
    scripts' digits undone, and case folded (what :meth:`~task_families.base.TaskFamily.instance_signatures`
    reads; ``fold_case=False`` keeps the case). Line breaks stay (they end clauses), tabs become spaces,
    other control characters go."""
    if text.isascii():  # the common case, the same result without the per-character walk
        return text.translate(_ASCII).lower() if fold_case else text.translate(_ASCII)
    out: list[str] = []
    for ch in unicodedata.normalize("NFKD", text):
        if ch.isascii():
            out.append(ch.translate(_ASCII))
            continue
        cat = unicodedata.category(ch)
        if cat[0] in "CM":          # control, format, unassigned, surrogates; combining marks
            if ch in "\u0085\u2028\u2029":
                out.append("\n")
            continue
        if ch in _QUOTES:
            continue
        digit = unicodedata.decimal(ch, None)
        out.append(str(digit) if digit is not None else ch)
    out_text = unicodedata.normalize("NFKC", "".join(out))
    return (out_text.casefold() if fold_case else out_text).translate(_HOMOGLYPHS)


def canonical(question: str) -> str:
    """The canonical form of ``question`` (:func:`clean`, then its tokens joined by one space), without its
    final sentence punctuation: ``3+4 ?``, ``3 + 4?`` and ``3\u00a0+\u200b4?`` are one form."""
    tokens = _TOKEN.findall(clean(str(question)))
    while tokens and tokens[-1] in _END:
        tokens.pop()
    return " ".join(tokens)


_UNITS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine".split())}
_UNITS["oh"] = 0
_TEENS = {w: 10 + i for i, w in enumerate(
    "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}
_TENS["fourty"] = 40
_SCALES = {"thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
_NUMBER_WORD = sorted({*_UNITS, *_TEENS, *_TENS, *_SCALES, "hundred"} - {"oh"}, key=len, reverse=True)
_NW = "|".join(_NUMBER_WORD)
#: substrings of every number word (a text without any spells no number)
_NUMBER_STEMS = ("zero", "one", "two", "thr", "thi", "four", "fort", "fiv", "six", "seven", "eight", "nine", "ten",
                 "elev", "twel",
                 "fif", "twent", "hundred", "thousand", "million", "billion")
_NUMBER_RUN = re.compile(rf"\b(?:{_NW})(?:(?:\s+|\s*[-,]\s*)(?:{_NW}|and|point|oh)\b)*\b")
#: numbers or common words written backwards (``ruof``, ``d2x0``, ``eht``): the text is read reversed
#: character by character too
_REVERSED_NUMBER_WORD = re.compile(r"\b(?:" + "|".join(w[::-1] for w in _NUMBER_WORD) + r"|[0-9a-f]+[xob]0"
                                   r"|eht|fo|dna|si|ot|tahw|hcihw|nehw|neht|era|morf)\b")
_RADIX = re.compile(r"(?<![\w.])0([xob])([0-9a-f]+)\b")
#: "p fifty-two" reads "p 52": an id's letter is joined to its number (not a, i or x: words, and a product)
_GLUE = re.compile(r"(?<![\w.])([b-hj-wyz])[\s-]+(\d+)\b")
_DIGIT_RUN = re.compile(r"\b\d(?: \d\b)+")
_ROMAN = re.compile(r"^m{0,3}(?:cm|cd|d?c{0,3})(?:xc|xl|l?x{0,3})(?:ix|iv|v?i{0,3})$")
_ROMAN_TOKEN = re.compile(r"(?<![\w.])[ivxlcdm]+(?![\w.])")
#: a word capitalised at its end (``tahW``): a sentence written backwards
_REVERSED_CAPITAL = re.compile(r"\b[a-z]+[A-Z]\b")
_UPPER_ROMAN_ANY = re.compile(r"(?<![\w.])[IVXLCDM]+(?![\w.])")
_UPPER_ROMAN = re.compile(r"(?<![\w.])[IVXLCDM]{2,}(?![\w.])")
_ROMAN_VALUES = {"i": 1, "v": 5, "x": 10, "l": 50, "c": 100, "d": 500, "m": 1000}
#: what the punctuation-folded reading drops: every ASCII symbol but arithmetic, arrows, ``=`` and ``:``,
#: and a period that is not a decimal point
_FOLD = {c: " " for c in map(ord, "!\"#$%&',;<?@[\\]^_`{|}~")}
_STRAY_PERIOD = re.compile(r"(?<!\d)\.|\.(?!\d)")


def _fold(text: str) -> str:
    return _STRAY_PERIOD.sub(" ", text.translate(_FOLD)) if "." in text else text.translate(_FOLD)


def _group(words: list[str], i: int, hyphen_joins: bool = True) -> tuple[int | None, int]:
    """A number below 1000 written in words from ``words[i]`` (``forty five``, ``forty - five``, ``nine
    hundred and two``); (None, i) when none starts there."""
    n = len(words)

    def tens_unit(j: int) -> tuple[int, int]:
        value = _TENS[words[j]]
        j += 1
        k = j + 1 if hyphen_joins and j < n and words[j] == "-" else j
        if k < n and words[k] in _UNITS and _UNITS[words[k]]:
            return value + _UNITS[words[k]], k + 1
        return value, j

    if i < n and words[i] in _TENS:
        return tens_unit(i)
    if i >= n or not (words[i] in _UNITS or words[i] in _TEENS):
        return None, i
    value = _UNITS.get(words[i], _TEENS.get(words[i], 0))
    i += 1
    if i < n and words[i] == "hundred":
        value *= 100
        i += 1
        j = i + 1 if i < n and words[i] == "and" else i
        if j < n and words[j] in _TENS:
            rest, i = tens_unit(j)
            value += rest
        elif j < n and (words[j] in _TEENS or (words[j] in _UNITS and _UNITS[words[j]])):
            value += _UNITS.get(words[j], _TEENS.get(words[j], 0))
            i = j + 1
    return value, i


def _words_to_numbers(run: str, hyphen_joins: bool = True) -> str:
    """One run of number words as decimal numbers: several numbers stay apart, a hyphen that does not join
    tens and units (``twenty-two``) is a minus sign, a comma separates."""
    words = re.findall(r"[a-z]+|[-,]", run)
    out: list[str] = []
    i, n = 0, len(words)
    while i < n:
        w = words[i]
        if w in _UNITS and i + 1 < n and words[i + 1] in _UNITS:  # digit by digit: "four five" = 45
            digits = ""
            while i < n and words[i] in _UNITS:
                digits += str(_UNITS[words[i]])
                i += 1
            out.append(digits)
        else:
            value, j = _group(words, i, hyphen_joins)
            if value is None:
                out.append(w)
                i += 1
                continue
            i, total = j, 0
            while i < n and words[i] in _SCALES:
                total += value * _SCALES[words[i]]
                i += 1
                k = i + 1 if i < n and words[i] == "and" else i
                value, j = _group(words, k, hyphen_joins)
                if value is None:
                    value = 0
                    break
                i = j
            out.append(str(total + value))
        if i + 1 < n and words[i] == "point" and words[i + 1] in _UNITS:  # "ninety-one point six"
            i += 1
            frac = ""
            while i < n and words[i] in _UNITS:
                frac += str(_UNITS[words[i]])
                i += 1
            out[-1] += "." + frac
    return " ".join(out)


def _radix(m: re.Match[str]) -> str:
    base = {"x": 16, "o": 8, "b": 2}[m.group(1)]
    try:
        return str(int(m.group(2)[:64], base))
    except ValueError:
        return m.group(0)


def decode_numbers(text: str, hyphen_joins: bool = True) -> str:
    """``text`` (cleaned) with its numbers in one form, decimal digits: number words (``forty-five``, ``one
    hundred and two``, ``ninety-one point six``, digit by digit ``four five``), ``0x``/``0o``/``0b``
    literals, and digits written one by one (``4 5``) joined; a letter just before a number it names
    (``p fifty-two``) is joined to it. ``hyphen_joins=False`` reads ``twenty-one`` as ``20 - 1``."""
    out = text
    if any(w in text for w in _NUMBER_STEMS):  # (cheap substring tests first: most texts spell no number)
        out = _NUMBER_RUN.sub(lambda m: _words_to_numbers(m.group(0), hyphen_joins), text)
    if "0x" in out or "0o" in out or "0b" in out:
        out = _RADIX.sub(_radix, out)
    if out is not text:
        out = _GLUE.sub(r"\1\2", out)
    return _DIGIT_RUN.sub(_digit_run, out)


def _digit_run(m: re.Match[str]) -> str:
    before = m.string[m.start() - 1:m.start()]
    return m.group(0) if before == "." else m.group(0).replace(" ", "")


def _roman_value(tok: str) -> int:
    total, prev = 0, 0
    for ch in reversed(tok.lower()):
        v = _ROMAN_VALUES[ch]
        total += -v if v < prev else v
        prev = max(prev, v)
    return total


def _upper_roman(m: re.Match[str]) -> str:
    return str(_roman_value(m.group(0))) if _ROMAN.match(m.group(0).lower()) else m.group(0)


def _roman(m: re.Match[str]) -> str:
    tok = m.group(0)
    if not _ROMAN.match(tok.lower()):
        return tok
    if tok == "x":  # "3 x 4" is a product: a lone x between numbers stays
        before, after = m.string[:m.start()].rstrip()[-1:], m.string[m.end():].lstrip()[:1]
        if before.isdigit() and (after.isdigit() or after == "("):
            return tok
    return str(_roman_value(tok))


def decode_roman(text: str) -> str:
    """``text`` (cleaned) with valid Roman numerals (``xlv``, ``iv``) as decimal numbers."""
    return _ROMAN_TOKEN.sub(_roman, text)


#: a run of at least five characters, each followed by a separator (``w h a t   i s``, ``w.h.a.t. .i.s``: the
#: original spaces and periods became longer runs of it); one pattern per separator
_SPREAD_BY = {" ": re.compile(r"(?:\S {1,7}){4,}\S"),
              **{c: re.compile(rf"(?:[^\n]{re.escape(c)}{{1,3}}){{4,}}[^{re.escape(c)}\n]")
                 for c in ".-_,/|~:;"}}


def _unspread(span: str, sep: str) -> str:
    """One spread run read back: the most common run length of ``sep`` is the separator's, and those runs
    go; a longer run was the original text's own ``sep`` (one is kept)."""
    runs = re.compile(re.escape(sep) + "+")
    lengths = [len(r) for r in runs.findall(span)]
    usual = max(sorted(set(lengths)), key=lengths.count)
    return runs.sub(lambda m: "" if len(m.group(0)) <= usual else sep, span)


def _despread(line: str) -> str:
    """A line with runs written with a separator between all their characters (``w h a t   i s``,
    ``w.h.a.t. .i.s``, ``w..h..a..t``) read back; any other text is unchanged."""
    if len(line) < 9:
        return line
    out = line
    for sep, pattern in _SPREAD_BY.items():
        if out.count(sep) >= 4:
            out = pattern.sub(lambda m, s=sep: _unspread(m.group(0), s), out)
    return out


def _reversed_roman(text: str) -> bool:
    """Whether ``text`` has a Roman numeral written backwards (``vlx``: an invalid numeral whose reverse,
    ``xlv``, is valid)."""
    return any(len(t) > 1 and not _ROMAN.match(t) and _ROMAN.match(t[::-1])
               for t in _ROMAN_TOKEN.findall(text))


_WORD = re.compile(r"\w+(?:\.\d+)?|[^\w\s]")


def _reverse_words(text: str, tokens: bool = True) -> str:
    """Each line's words in reverse order: its tokens (numbers with their decimals, words, symbols), or
    with ``tokens=False`` the runs between spaces (``forty-nine``, ``cost?``)."""
    if tokens:
        return "\n".join(" ".join(reversed(_WORD.findall(line))) for line in text.split("\n"))
    return "\n".join(" ".join(reversed(line.split())) for line in text.split("\n"))


def _readings(text: str) -> list[tuple[str, bool]]:
    """:func:`views` with, for each, whether it is also compared as text (the forward readings; the others
    are read as instances only)."""
    cased = clean(str(text), fold_case=False)
    spread = "\n".join(_despread(line) for line in cased.split("\n"))
    forms = [cased] if spread == cased else [cased, spread]
    folded = [form.casefold().translate(_HOMOGLYPHS) for form in forms]
    # written backwards: a sentence capitalised at its end, numbers spelt backwards, or Roman numerals (which
    # read as other numerals backwards: IV, VI): the text reversed character by character is read too
    if any(_REVERSED_CAPITAL.search(f) or _UPPER_ROMAN_ANY.search(f) for f in forms) or \
            any(_REVERSED_NUMBER_WORD.search(f) or _reversed_roman(f) for f in folded):
        forms += [f[::-1] for f in forms]
    bases: list[str] = []
    for form in forms:
        bases.append(form.casefold().translate(_HOMOGLYPHS))
        if _UPPER_ROMAN.search(form):  # "CCXX mm": upper case tells the numeral from the unit
            bases.append(_UPPER_ROMAN.sub(_upper_roman, form).casefold().translate(_HOMOGLYPHS))
    out: list[tuple[str, bool]] = []
    seen: set[str] = set()

    def add(view: str, as_text: bool = False) -> str:
        view = _SPACES.sub(" ", view).strip()
        if view and view not in seen:
            seen.add(view)
            out.append((view, as_text))
        return view

    def decoded(view: str) -> None:  # numbers decoded and punctuation folded, with Roman numerals and without
        numbers = decode_numbers(view)
        add(_fold(numbers))
        add(_fold(decode_roman(numbers)))
        add(decode_numbers(_fold(view)))  # "two ; hundred ; and ; twenty": punctuation cut the number apart
        if "-" in view and numbers != view:  # "twenty-one" may be 20-1: every hyphen a minus too
            add(_fold(decode_numbers(view, hyphen_joins=False)))

    for base in bases:
        if base in seen:
            continue
        base = add(base, True)
        numbers = add(decode_numbers(base), True)
        add(decode_roman(numbers))
        decoded(base)
        decoded(_reverse_words(base))
        decoded(_reverse_words(base, tokens=False))
    return out


def views(text: str) -> list[str]:
    """The readings of ``text`` a hidden question is looked for in (module docstring), distinct, the
    cleaned text first: the text as it is, with its numbers decoded, with Roman numerals decoded and with
    its punctuation folded; with its words in reverse order (all decoded and folded); and, when it spells
    numbers or Roman numerals backwards, reversed character by character. Spread-out lines are read back
    and upper-case Roman numerals decoded as further texts to read."""
    return [view for view, _ in _readings(text)]


def _form(text: str) -> tuple[str, ...]:
    """The canonical tokens of a cleaned text, without its final sentence punctuation."""
    tokens = _TOKEN.findall(text)
    while tokens and tokens[-1] in _END:
        tokens.pop()
    return tuple(tokens)


def _variants(question: str) -> list[str]:
    """A hidden question as written and reversed character by character (the index holds both, so a text
    needs no reversed reading of its own unless it spells numbers backwards)."""
    base = _WS.sub(" ", clean(question)).strip()
    return [base, base[::-1]]
