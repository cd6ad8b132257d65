"""Text spaces for LLM turns.

Gymnasium's ``spaces.Text`` only accepts characters from a charset (alphanumerics by default) and
rejects the empty string; LLM text needs any Unicode string. :class:`UnicodeText` accepts every
``str`` up to ``max_length`` characters and samples printable text with spaces, punctuation,
newlines and some non-ASCII characters, so ``check_env`` exercises the malformed-action path.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces

_SAMPLE_CHARS = string.printable + "éßø—…中文🙂<>{}\"'"


class UnicodeText(spaces.Text):
    """Any string of length ``min_length..max_length`` (default 0..max_length)."""

    def __init__(self, max_length: int, *, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length=max_length, min_length=min_length, charset=_SAMPLE_CHARS, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:  # noqa: ARG002
        length = int(self.np_random.integers(self.min_length, min(self.max_length, 256) + 1))
        idx = self.np_random.integers(0, len(_SAMPLE_CHARS), size=length)
        return "".join(_SAMPLE_CHARS[i] for i in np.asarray(idx))

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (isinstance(other, UnicodeText) and other.min_length == self.min_length
                and other.max_length == self.max_length)
