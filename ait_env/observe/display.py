"""What the scripts show a person: long text clipped where a reader can tell, results labelled as what
they are.

- :func:`clip` shortens text to at most ``limit`` characters, cut at the last line break (else the last
  space) before the limit, never inside a word when either exists, and says how much was left out:
  ``… [cut: 1,234 more characters]``. Text within the limit comes back unchanged.
- :func:`status_label` names a reward status for a table or a log line; a surrogate backend's
  ``scored`` is never shown bare (``scored (SURROGATE: stub backend's formula, nothing trained)``).
"""

from __future__ import annotations

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
