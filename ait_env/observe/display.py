"""What the scripts show a person: long text clipped where a reader can tell, results labelled as what
they are.

- :func:`clip` shortens text to at most ``limit`` characters, cut at the last line break (else the last
  space) before the limit, never inside a word when either exists, and says how much was left out:
  ``… [cut: 1,234 more characters]``. Text within the limit comes back unchanged.
- :func:`status_label` names a reward status for a table or a log line; a surrogate backend's
  ``scored`` is never shown bare (``scored (SURROGATE: stub backend's formula, nothing trained)``).
- :func:`no_bars_unless_terminal`: an entry point whose stderr is a file or a pipe (a tee'd log) turns
  off tqdm progress bars for itself and the processes it starts (``TQDM_DISABLE``, which tqdm ≥ 4.66
  reads; ``HF_DATASETS_DISABLE_PROGRESS_BARS`` for datasets), so a log holds lines, not bar redraws.
"""

from __future__ import annotations

import os
import sys
from typing import Any, MutableMapping

CUT_MARKER = "… [cut: {n:,} more characters]"


def clip(text: str, limit: int) -> str:
    """``text`` when it has at most ``limit`` characters, else its head cut at a line or word boundary
    followed by :data:`CUT_MARKER` (the head alone never exceeds ``limit``; the marker is extra)."""
    if limit < 1:
        raise ValueError(f"clip needs a positive limit, got {limit}")
    if len(text) <= limit:
        return text
    head = text[:limit]
    for sep in ("\n", " "):
        at = head.rfind(sep)
        if at >= limit // 2:  # a boundary that keeps at least half of what fits
            head = head[:at]
            break
    head = head.rstrip()
    sep = "\n" if "\n" in text[len(head):len(head) + 1] else " "
    return f"{head}{sep}{CUT_MARKER.format(n=len(text) - len(head))}"


def status_label(status: str, backend: str, surrogate: bool) -> str:
    """The reward status as a person should read it: a surrogate backend's score says it is one."""
    if surrogate and status == "scored":
        return f"scored (SURROGATE: {backend} backend's formula, nothing trained)"
    return status


def no_bars_unless_terminal(stream: Any = None, environ: MutableMapping[str, str] | None = None) -> bool:
    """Disable tqdm bars (here and in child processes) when ``stream`` (default: stderr) is not a
    terminal; a variable the user set is kept. Returns whether bars were disabled."""
    stream = sys.stderr if stream is None else stream
    environ = os.environ if environ is None else environ
    try:
        terminal = bool(stream.isatty())
    except (AttributeError, ValueError):
        terminal = False
    if terminal:
        return False
    environ.setdefault("TQDM_DISABLE", "1")
    environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    return True
