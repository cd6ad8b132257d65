"""Finding hidden-eval questions in an agent's dataset, however they were disguised.

The probe compares the questions of the agent's dataset with the family's hidden set (outside the
sandbox; the hidden set never enters it). A question counts as a copy when its *canonical form*
equals a hidden question's, or contains one at sentence boundaries (a hidden question padded with
text before it, or after its end). The canonical form (:func:`canonical`) undoes what changes how a
question looks but not what it asks:

- Unicode compatibility forms (NFKC: full-width letters, ligatures, non-breaking spaces), combining
  marks (accents added to letters), format and control characters (zero-width spaces and joiners,
  soft hyphens, byte-order marks, bidirectional marks), digits of other scripts, common Cyrillic and
  Greek letters that look Latin, typographic dashes, minus signs and quotes;
- case, and whitespace: the text becomes its tokens (runs of letters and digits, single symbols)
  joined by one space, so ``3+4 ?``, ``3 + 4?`` and ``3\u00a0+\u200b4?`` are the same;
- quotes, and the sentence punctuation at the very end (``?``, ``.``, ``!``).

What it does not catch: a question re-worded, or with its numbers or names changed, is a new
question. Instance identity (:attr:`task_families.base.Instance.key`, the hidden-set hashes) is a
separate, unchanged hash.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

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
_END = ("?", ".", "!")


def _clean(text: str) -> str:
    out: list[str] = []
    for ch in unicodedata.normalize("NFKD", text):
        cat = unicodedata.category(ch)
        if cat[0] in "CM":          # control, format, unassigned, surrogates; combining marks
            if ch in "\t\n\r\x0b\x0c":
                out.append(" ")
            continue
        if ch in _QUOTES:
            continue
        digit = unicodedata.decimal(ch, None)
        out.append(str(digit) if digit is not None else ch)
    return unicodedata.normalize("NFKC", "".join(out)).casefold().translate(_HOMOGLYPHS)


def canonical(question: str) -> str:
    """The canonical form of ``question`` (module docstring), without its final sentence punctuation."""
    tokens = _TOKEN.findall(_clean(str(question)))
    while tokens and tokens[-1] in _END:
        tokens.pop()
    return " ".join(tokens)


class LeakIndex:
    """The hidden questions of one family, ready to be looked for in many dataset questions."""

    def __init__(self, hidden_questions: Iterable[str]) -> None:
        forms = sorted({f for f in (canonical(q) for q in hidden_questions) if f}, key=len, reverse=True)
        self.size = len(forms)
        # a hidden form at token boundaries, then the end of the text or a sentence end
        self._pattern = re.compile(r"(?:^| )(?:" + "|".join(re.escape(f) for f in forms) + r")(?: [?.!]|$)") \
            if forms else None

    def is_copy(self, question: str) -> bool:
        return self._pattern is not None and self._pattern.search(canonical(question)) is not None

    def count(self, questions: Iterable[str]) -> int:
        """How many of ``questions`` are copies of hidden questions."""
        return sum(1 for q in questions if self.is_copy(q))
