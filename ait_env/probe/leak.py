"""Finding hidden-eval questions in what a model is given, however they were written.

**One reader of what the model sees, one normaliser, one matcher**, used by every leak check: the
validation probe (:mod:`ait_env.probe.dynamic`, on what the sandbox reports), the training audit
(:mod:`ait_env.probe.training_audit`, on the requests the model was sampled on, locally and from prime-rl's
traces on a GPU). The hidden questions never leave the orchestrator's process.

1. :func:`model_texts` turns a chat request (OpenAI messages and tool schemas, as a trainer sends them)
   into the texts the model reads: each message's content with its **content parts joined** as chat
   templates join them (a question cut into several parts is one text again), every other field of the
   message (names, tool calls and their arguments), and each tool schema as its **keys and values** in
   order (tool names, parameter names, descriptions, enums: a question placed as a parameter name is read).
2. :func:`views` (:mod:`ait_env.probe.leak_readings`) normalises one text into the few readings a hidden question
   could hide in:

   - :func:`clean`: Unicode compatibility forms (NFKC), combining marks, format and control characters
     (zero-width, soft hyphens, bidirectional marks), other scripts' digits, look-alike Cyrillic and Greek
     letters, typographic dashes and quotes, case; whitespace runs become one space;
   - text **spread out** with one separator between all its characters (``W h a t``, ``W.h.a.t``), line by
     line, is read back;
   - **numbers** in one form (:func:`decode_numbers`): written in words (``forty-five``, ``one hundred and
     two``, ``ninety-one point six``), digit by digit (``four five``, ``4 5``), hexadecimal, octal or binary
     literals (``0x2d``), and (:func:`decode_roman`) Roman numerals (``XLV``) become decimal digits;
   - **punctuation** folded: separators inserted between the tokens (``4 ; + ; 9``) are dropped;
   - **reversed** text, character by character or word by word (and both).

   Views are readings, not rewrites: each is matched on its own, so a view that misreads an honest text
   (``one box`` as ``1 box``) costs nothing unless it states a whole hidden instance.
3. :class:`LeakIndex` matches each view against the hidden set twice: as **instances**, with each family's
   own parser (:meth:`task_families.base.TaskFamily.instance_signatures`: an arithmetic chain whatever its
   brackets or operator words, a meeting's people in any order, an order's items in any order and
   notation, ...), and as **canonical text** (:func:`canonical`: a hidden question at sentence boundaries,
   padded or not). A question with other numbers, people or items is a new question.

What this cannot see (an encoding nobody listed: a cipher, a translation, a lookup the model learns) the
**outcome check** prices instead (:mod:`ait_env.hidden.outcome`: a trained model that scores far better on
the hidden questions than on fresh ones of the same generator is forfeited). Instance identity
(:attr:`task_families.base.Instance.key`, the hidden-set hashes) is a separate, unchanged hash.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ait_env.jobs.guard import bound_digits
from ait_env.probe.leak_readings import _END, _TOKEN, _form, _readings, _variants
from ait_env.probe.leak_readings import canonical, clean, decode_numbers, decode_roman, views  # noqa: F401  (re-exported)

#: distinct hidden questions a job may state before it counts as a leak (accidental collisions of short
#: questions: an honest generator draws from the same space as the hidden set); the probe and the training
#: audit both use it
LEAK_TOLERANCE = 2
#: bounds of :func:`model_texts` on hostile structures: nesting depth, and characters per request (a
#: request cannot carry more: the local endpoint refuses bodies over 8 MB, and a model reads far less)
MAX_DEPTH = 32
MAX_CHARS = 8_000_000


# ---------------------------------------------------------------------------------- what the model sees
def _scalar(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 256 else None  # never str() a 5,000-digit integer
    if isinstance(value, float):
        return repr(value)
    return None


def structure_texts(value: Any, max_chars: int = MAX_CHARS) -> list[str]:
    """A JSON-like ``value`` (a tool schema, a message's fields) as the model may read it, in document order:
    its keys and scalar values together, its keys alone, its values alone, each joined by one space, and
    each object's own keys (a tool's parameter names, as a template that lists only them shows them), on
    lines of their own, joined by one space and by nothing; without the punctuation that would cut a
    question placed across several keys or values.
    Bounded in depth (:data:`MAX_DEPTH`) and size; never raises (objects that are not JSON data are
    skipped)."""
    both: list[str] = []
    keys: list[str] = []
    values: list[str] = []
    siblings: list[str] = []
    total = 0
    stack: list[tuple[Any, int, bool]] = [(value, 0, False)]
    while stack and total < max_chars:
        item, depth, is_key = stack.pop()
        text = _scalar(item)
        if text is not None:
            both.append(text)
            (keys if is_key else values).append(text)
            total += len(text) + 1
            continue
        if depth >= MAX_DEPTH:
            continue
        if hasattr(item, "model_dump") and not isinstance(item, type):
            try:
                item = item.model_dump()
            except Exception:  # noqa: BLE001 - an object we cannot read shows the model nothing we can check
                continue
        if isinstance(item, dict):
            children: list[tuple[Any, int, bool]] = []
            for k, v in item.items():
                children += [(k, depth + 1, True), (v, depth + 1, False)]
            if len(item) > 1:
                names = [t for t in map(_scalar, item) if t is not None]
                siblings += [" ".join(names), "".join(names)]   # a question may be cut inside a word
                total += 2 * len(siblings[-1])
        elif isinstance(item, (list, tuple)):
            children = [(c, depth + 1, False) for c in item]
        else:
            continue
        stack.extend(reversed(children))
    out = [" ".join(both)]
    if keys and values:
        out += [" ".join(keys), " ".join(values)]
    if siblings:
        out.append("\n".join(siblings))
    return [t[:max_chars] for t in out if t]


def structure_text(value: Any, max_chars: int = MAX_CHARS) -> str:
    """:func:`structure_texts`' first reading: keys and values together."""
    texts = structure_texts(value, max_chars)
    return texts[0] if texts else ""


def content_text(content: Any) -> str:
    """A message's content as the model reads it: a string as it is, content parts joined with nothing
    between them (as chat templates join them), other values by :func:`structure_text`."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = []
        for part in content[:100_000]:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(structure_text(part))
        return "".join(parts)
    return structure_text(content)


def message_texts(message: Any) -> list[str]:
    """The texts one chat message shows the model: its content (:func:`content_text`) and every other field
    (:func:`structure_texts`: role, name, tool calls with their names and arguments)."""
    if hasattr(message, "model_dump") and not isinstance(message, type):
        try:
            message = message.model_dump()
        except Exception:  # noqa: BLE001
            return []
    if not isinstance(message, dict):
        return [structure_text(message)]
    rest = {k: v for k, v in message.items() if k != "content"}
    return [t for t in (content_text(message.get("content")), *structure_texts(rest)) if t]


def model_texts(messages: Any, tools: Any = None) -> list[str]:
    """Every text a chat request shows the model: each message's (:func:`message_texts`) and each tool
    schema's keys and values (:func:`structure_texts`). Never raises, whatever the request holds."""
    out: list[str] = []
    for message in messages if isinstance(messages, (list, tuple)) else [messages] if messages else []:
        out += message_texts(message)
    for tool in tools if isinstance(tools, (list, tuple)) else [tools] if tools else []:
        out += structure_texts(tool)
    return out


# ---------------------------------------------------------------------------------- matching
class LeakIndex:
    """The hidden questions of one family, ready to be looked for in many texts (:meth:`find`): as instances
    (with ``family``: :meth:`~task_families.base.TaskFamily.instance_signatures`) and as canonical text, in
    every reading :func:`views` gives, the hidden questions themselves read forwards and reversed."""

    def __init__(self, hidden_questions: Iterable[str], family: Any = None) -> None:
        questions = [str(q) for q in hidden_questions]
        self.size = len(questions)
        self._family = family
        self._by_form: dict[tuple[str, ...], int] = {}
        self._by_signature: dict[str, int] = {}
        self._own: dict[str, int] = {}   # signatures of the questions as written (what `signatures` counts)
        for i, q in enumerate(questions):
            for k, variant in enumerate(_variants(q)):
                tokens = _form(variant)
                if tokens:
                    self._by_form.setdefault(tokens, i)
                if family is not None:
                    for sig in family.instance_signatures(variant):
                        self._by_signature.setdefault(sig, i)
                        if k == 0:
                            self._own.setdefault(sig, i)
        self._lengths = sorted({len(f) for f in self._by_form})

    @property
    def signatures(self) -> int:
        """How many hidden instances the family's parser recognises."""
        return len(set(self._own.values()))

    def _copies(self, view: str) -> set[int]:
        """Hidden questions whose canonical form is a run of the view's tokens that ends at a sentence end
        (``?``, ``.``, ``!``), a line end or the end of the text: a copy, possibly padded before or after."""
        found: set[int] = set()
        for line in view.split("\n"):
            tokens = _TOKEN.findall(line)
            for e in range(1, len(tokens) + 1):
                if e < len(tokens) and tokens[e] not in _END:
                    continue
                for n in self._lengths:
                    if n > e:
                        break
                    i = self._by_form.get(tuple(tokens[e - n:e]))
                    if i is not None:
                        found.add(i)
        return found

    def find(self, text: str) -> set[int]:
        """Indices (in the hidden set) of the hidden questions that ``text`` states in any of its
        :func:`views`: a canonical copy at sentence boundaries, or the same instance however it is worded."""
        found: set[int] = set()
        for view, as_text in _readings(str(text)):
            if as_text and self._by_form:
                found |= self._copies(view)
            if self._family is not None and self._by_signature:
                # a family's parser reads numbers with int()/float(): digit runs bounded first (the guard)
                for sig in self._family.instance_signatures(bound_digits(view)):
                    if sig in self._by_signature:
                        found.add(self._by_signature[sig])
        return found

    def is_copy(self, question: str) -> bool:
        return bool(self.find(question))

    def count(self, questions: Iterable[str]) -> int:
        """How many of ``questions`` state a hidden question (read in batches: only a batch that states one
        is read again question by question)."""
        n = 0
        for batch in _batches([str(q) for q in questions]):
            if len(batch) == 1 or self.find("\n".join(batch)):
                n += sum(1 for q in batch if self.find(q))
        return n

    def leaked(self, texts: Iterable[str]) -> set[int]:
        """The distinct hidden questions stated anywhere in ``texts`` (read in batches of lines: a line end
        ends a clause, as between separate texts)."""
        out: set[int] = set()
        for batch in _batches([str(t) for t in texts]):
            out |= self.find("\n".join(batch))
        return out


def _batches(texts: list[str], size: int = 64, max_chars: int = 65_536) -> Iterable[list[str]]:
    """``texts`` in consecutive batches of at most ``size`` texts and about ``max_chars`` characters: one
    reading of many short texts costs about as much as one of a single text."""
    batch: list[str] = []
    chars = 0
    for text in texts:
        if batch and (len(batch) >= size or chars + len(text) > max_chars):
            yield batch
            batch, chars = [], 0
        batch.append(text)
        chars += len(text) + 1
    if batch:
        yield batch
