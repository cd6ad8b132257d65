"""The task-family contract.

A family is one module folder ``task_families/<name>/`` with:

- ``tools.py``: the inner model's tools as plain Python functions (type hints + Google docstrings),
  listed in ``TOOLS``. The same file is used unchanged by training jobs (copied into each job bundle
  as ``family_tools.py``) and by the hidden eval.
- ``family.py``: a :class:`TaskFamily` subclass: the task spec the agent sees, a seeded instance
  generator with a difficulty knob, an answer checker, dev examples, and the hidden eval set built
  from a secret seed that never enters a workspace.
- ``template/``: the workspace the agent starts from (``INSTRUCTIONS.md``, ``job.toml``,
  ``environment.py``).
- ``teacher.py``: the family's flawed teacher for the local backend's pretraining corpus, a
  ``TEACHER = Teacher(flaws, teach)`` (contract in :mod:`task_families.teacher`): the flaw table (each
  habit, the context it depends on and its rate) and a function that demonstrates one instance with the
  real tools, asking the policy at every habit. The local base models learn the family from it.
- ``reference/``: the family's reference job (``environment.py``, ``job.toml``, and ``job.local.toml``
  for the local backend), which the scripted reference agent (:mod:`ait_env.agents.reference`) submits.

Instances are plain records (question, answer, info). Their ``key`` is a hash of the normalised
question, used to keep dev examples, training data and pretraining data apart from the hidden set.

A **stateful** family (``warehouse``) also has a world per episode that its tools change: it sets
``state_args`` (the tools' world parameter, which the harness fills and the model never sees) and
implements ``new_world`` (from the instance's ``info``), ``score`` (the final state and the answer) and
``job_info`` (the world spec a job's dataset row carries). Every harness goes through ``call_tool(name,
arguments, world)`` and ``score(instance, response, world)`` with one world per episode, so the same calls
serve both kinds.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import re
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, ClassVar

from pydantic import BaseModel, Field

#: One lock for every Python parse in this process (``ast.parse``; the arithmetic family's calculator is one).
#: CPython 3.11's AST constructor keeps its recursion depth in interpreter-wide state and starts it at the
#: calling thread's depth: two threads parsing at once fail with "SystemError: AST constructor recursion
#: depth mismatch" (seen in a fresh-clone CI: the local outer loop's episodes step in threads, one in the
#: static probe while another's probe decision called the calculator). The static probe parses under it
#: and :meth:`TaskFamily.call_tool` runs tools under it; tools are fast and never call back.
AST_LOCK = threading.Lock()


#: Name under which a family's tool module is importable inside a workspace and a job bundle.
TOOLS_MODULE_NAME = "family_tools"
#: Name of the read-only workspace module that holds a task's public data (:meth:`TaskFamily.task_data_source`).
TASK_DATA_MODULE_NAME = "task_data"


class Instance(BaseModel):
    """One question of a family, with its reference answer."""

    question: str
    answer: str
    info: dict[str, Any] = Field(default_factory=dict)
    difficulty: float = 0.5

    @property
    def key(self) -> str:
        return question_key(self.question)


def question_key(question: str) -> str:
    """Stable hash of a question, insensitive to case and whitespace: an instance's identity (hidden
    sets are drawn and hashed by it). Leak detection uses a stronger normalisation of its own
    (``ait_env.probe.leak``)."""
    norm = re.sub(r"\s+", " ", question.strip().lower())
    return hashlib.sha256(norm.encode("utf-8")).hexdigest()[:16]


def instances_hash(instances: list[Instance]) -> str:
    """Which set of instances this is (order-free): baselines and eval results record it."""
    keys = sorted({inst.key for inst in instances})
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


class ToolStep(BaseModel):
    """One tool call of a reference solution."""

    name: str
    arguments: dict[str, Any]


class Bounds(BaseModel):
    """Strict constraint bounds a job must respect (the backend may tighten them)."""

    base_models: list[str]
    max_steps: int
    max_batch_size: int
    max_group_size: int
    max_seq_len: int
    max_tokens: int
    max_examples: int = 100_000
    min_examples: int = 16
    wall_clock_minutes: int = 60
    #: Chat renderer of models that prime-rl's own renderer map does not know (e.g. the local
    #: backend's tiny models, which carry their own chat template).
    model_renderers: dict[str, str] = Field(default_factory=dict)


class TaskSpec(BaseModel):
    """What the agent is asked to do in one episode."""

    family: str
    instance_id: str
    title: str
    text: str
    bounds: Bounds
    dev_examples: list[Instance]
    tool_names: list[str]


def tool_schema(fn: Callable[..., Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """OpenAI function schema of a typed, Google-docstringed tool function; the parameters in ``skip``
    (a stateful family's world, which the harness injects) are left out of what the model sees."""
    sig = inspect.signature(fn)
    doc = inspect.getdoc(fn) or ""
    summary = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    arg_docs: dict[str, str] = {}
    if "Args:" in doc:
        block = doc.split("Args:", 1)[1].split("Returns:", 1)[0]
        for line in block.splitlines():
            m = re.match(r"\s*(\w+)(?: \([^)]*\))?:\s*(.+)", line)
            if m:
                arg_docs[m.group(1)] = m.group(2).strip()
    types = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}
    props: dict[str, Any] = {}
    required: list[str] = []
    hints = getattr(fn, "__annotations__", {})
    for name, p in sig.parameters.items():
        if name in skip:
            continue
        ann = hints.get(name, str)
        if isinstance(ann, str):
            ann = {"int": int, "float": float, "str": str, "bool": bool}.get(ann, str)
        props[name] = {"type": types.get(ann, "string"), "description": arg_docs.get(name, "")}
        if p.default is inspect.Parameter.empty:
            required.append(name)
    return {"type": "function", "function": {"name": fn.__name__, "description": summary,
            "parameters": {"type": "object", "properties": props, "required": required}}}


# ---------------------------------------------------------------- reading a response
def strip_think(text: str | None) -> str:
    """Drop reasoning: everything up to the last ``</think>`` and any unclosed ``<think>`` tail.

    Every checker reads a response through this, and so does the hidden eval's tool-call reader
    (:mod:`ait_env.jobs.toolcalls`)."""
    text = text or ""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text.split("<think>", 1)[0]


def answer_text(response: str | None) -> str | None:
    """The first line after the last "Answer:" (any case; reasoning removed), or None without one."""
    text = strip_think(response)
    idx = text.lower().rfind("answer:")
    if idx < 0:
        return None
    rest = text[idx + len("answer:"):].strip()
    return rest.splitlines()[0].strip() if rest else ""


#: where a question can end inside a longer text: line breaks, ``? ! ; |`` and a period before whitespace (a
#: decimal point is not one)
_SEGMENT_END = re.compile(r"[\n\r?!;|]+|\.(?=\s|$)")


def text_segments(text: str) -> list[str]:
    """The clauses of ``text`` one question can occupy (for :meth:`TaskFamily.instance_signatures`)."""
    return [seg for seg in _SEGMENT_END.split(text) if seg.strip()]


def order_signatures(text: str, qty_item: re.Pattern[str], item_qty: re.Pattern[str]) -> set[str]:
    """The orders ``text`` states, as signatures ``item=qty,...`` (items sorted): in each clause
    (:func:`text_segments`), every (quantity, item) pair that ``qty_item`` (groups: quantity, item) or
    ``item_qty`` (groups: item, quantity) finds; two or more pairs in one clause make an order."""
    found = set()
    for seg in text_segments(text):
        pairs = {(item, int(qty)) for qty, item in qty_item.findall(seg)}
        pairs |= {(item, int(qty)) for item, qty in item_qty.findall(seg)}
        if len(pairs) >= 2:
            found.add(",".join(f"{item}={qty}" for item, qty in sorted(pairs)))
    return found


def and_list(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``: items as a question names them."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


class TaskFamily(ABC):
    """Base class of every task family. Subclasses set the class attributes and implement the
    generator and checker; everything else (spec text, dev examples, hidden set) is derived."""

    name: ClassVar[str]
    title: ClassVar[str]
    #: What the agent must teach, in a few sentences.
    goal: ClassVar[str]
    #: The family's tool module (``task_families/<name>/tools.py``).
    tools_module: ClassVar[ModuleType]
    #: System prompt the hidden eval gives the inner model.
    eval_system_prompt: ClassVar[str]
    #: How the checker reads a response, shown to the agent.
    answer_format: ClassVar[str]
    #: Tool-loop turns the hidden eval allows the inner model.
    eval_max_turns: ClassVar[int] = 8
    #: Sampling max tokens per turn in the hidden eval.
    eval_max_tokens: ClassVar[int] = 256
    hidden_eval_size: ClassVar[int] = 300
    dev_pool_seed: ClassVar[int] = 1_000_003
    dev_examples_shown: ClassVar[int] = 3

    # ---------------------------------------------------------------- to implement
    def instance_signatures(self, text: str) -> set[str]:
        """The instances of this family that ``text`` states, however it is worded, as signatures: what
        identifies an instance (its numbers, people, items, route...) in a canonical order, so that a
        question re-written (other brackets, the people listed in another order, other punctuation or
        wording around the same facts) has the same signature as the original. ``text`` may be long (a
        system prompt of many questions) and arrives normalised: case-folded, Unicode compatibility forms
        and look-alike letters undone (:func:`ait_env.probe.leak.clean`). The leak check compares the
        signatures of an agent's texts with those of the hidden set's questions, so each hidden question
        must yield its own. Default: none (the string comparison alone)."""
        return set()

    @abstractmethod
    def generate_one(self, rng: random.Random, difficulty: float) -> Instance:
        """One instance drawn with ``rng`` at ``difficulty`` in [0, 1] (:meth:`generate` clamps it)."""

    @abstractmethod
    def check(self, instance: Instance, response: str) -> float:
        """Score of the inner model's final response in [0, 1]."""

    @abstractmethod
    def solution(self, instance: Instance) -> list[ToolStep]:
        """The tool calls, in order, of a correct solution (arguments may use earlier results,
        which the generator knows)."""

    def final_answer(self, instance: Instance) -> str:
        """The final message of a correct solution."""
        return f"Answer: {instance.answer}"

    def wrong_answer(self, instance: Instance, rng: random.Random) -> str:
        """A plausible but wrong final message (for rubric tests and flawed demonstrations)."""
        for _ in range(100):
            cand = self.perturb_answer(instance, rng)
            if self.check(instance, f"Answer: {cand}") < 1.0:
                return f"Answer: {cand}"
        return "Answer: unknown"

    def perturb_answer(self, instance: Instance, rng: random.Random) -> str:
        """A nearby wrong answer; families override when answers are not integers."""
        try:
            return str(int(instance.answer) + rng.choice([-10, -2, -1, 1, 2, 10]))
        except ValueError:
            return instance.answer[::-1] or "x"

    # ---------------------------------------------------------------- the world (stateful families)
    def new_world(self, instance: Instance) -> Any:
        """A fresh world for one episode of ``instance``, which the tools read and change (stateful families;
        every other family has none). Every harness makes one per episode and hands it to
        :meth:`call_tool` and :meth:`score`, so two episodes never share one."""
        return None

    def job_info(self, instance: Instance) -> dict[str, Any]:
        """The ``info`` a job's dataset row carries for ``instance`` (its layout is documented to the agent):
        a stateful family's world spec, from which the job's ``setup_state`` builds each rollout's world.
        The probe's scripted rollouts of the dev examples use it. Default: nothing."""
        return {}

    def score(self, instance: Instance, response: str, world: Any = None) -> float:
        """What every harness scores an episode with: the checker of the final response and, in a stateful
        family, of the ``world`` the episode's tool calls left (default: :meth:`check` alone)."""
        return self.check(instance, response)

    def replay(self, instance: Instance, completion: list[dict[str, Any]]) -> Any:
        """The world after the structured tool calls of ``completion`` (OpenAI-style messages), applied in
        order to a fresh world: how a finished transcript is scored (None for a stateless family)."""
        world = self.new_world(instance)
        if world is None:
            return None
        for msg in completion:
            if not isinstance(msg, dict) or msg.get("role") != "assistant":
                continue
            for call in msg.get("tool_calls") or []:
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict):
                    continue
                raw = fn.get("arguments")
                try:
                    args = raw if isinstance(raw, dict) else json.loads(raw or "{}")
                except (TypeError, ValueError):
                    continue
                if isinstance(args, dict):
                    self.call_tool(str(fn.get("name") or ""), args, world)
        return world

    def score_completion(self, instance: Instance, completion: list[dict[str, Any]]) -> float:
        """:meth:`score` of a finished completion: its last message, and the world its tool calls leave."""
        final = str(completion[-1].get("content") or "") if completion else ""
        return self.score(instance, final, self.replay(instance, completion))

    # ---------------------------------------------------------------- tools and transcripts
    #: Tool parameters that are the episode's world, filled by the harness (never by the model, never in
    #: the schema it sees); empty for a stateless family.
    state_args: ClassVar[tuple[str, ...]] = ()

    def call_tool(self, name: str, arguments: dict[str, Any], world: Any = None) -> str:
        """Run one of the family's tools like a tool env would (errors become text). A stateful family's
        tool gets ``world`` as its state arguments; the model cannot pass those itself."""
        fn = {t.__name__: t for t in self.tools}.get(name)
        if fn is None:
            return f"error: unknown tool {name!r}"
        if self.state_args:
            if world is None:
                raise ValueError(f"family {self.name!r} is stateful: call its tools with the episode's world "
                                 "(TaskFamily.new_world)")
            arguments = {k: v for k, v in arguments.items() if k not in self.state_args}
            arguments.update({a: world for a in self.state_args})
        try:
            with AST_LOCK:
                return str(fn(**arguments))
        except Exception as exc:  # noqa: BLE001 - tool errors are observations for the model
            return f"error: {exc}"

    def eval_messages(self, instance: Instance) -> list[dict[str, Any]]:
        """The prompt the hidden eval sends: system prompt + the question."""
        return [{"role": "system", "content": self.eval_system_prompt},
                {"role": "user", "content": instance.question}]

    def transcript(self, instance: Instance, *, correct: bool = True, steps: int | None = None,
                   rng: random.Random | None = None) -> list[dict[str, Any]]:
        """A completion (assistant/tool messages after the prompt) that solves ``instance``.

        ``steps`` truncates the tool calls (an early stop); ``correct=False`` ends with a wrong
        answer. Tool results come from really calling the family's tools."""
        rng = rng or random.Random(0)
        plan = self.solution(instance)
        if steps is not None:
            plan = plan[:steps]
        world = self.new_world(instance)
        out: list[dict[str, Any]] = []
        for i, step in enumerate(plan):
            cid = f"call_{i}"
            out.append({"role": "assistant", "content": "", "tool_calls": [{
                "id": cid, "type": "function",
                "function": {"name": step.name, "arguments": json.dumps(step.arguments)}}]})
            out.append({"role": "tool", "tool_call_id": cid,
                        "content": self.call_tool(step.name, step.arguments, world)})
        final = self.final_answer(instance) if correct else self.wrong_answer(instance, rng)
        out.append({"role": "assistant", "content": final})
        return out

    # ---------------------------------------------------------------- derived
    @property
    def tools(self) -> list[Callable[..., Any]]:
        return list(self.tools_module.TOOLS)

    @property
    def tool_names(self) -> list[str]:
        return [t.__name__ for t in self.tools]

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [tool_schema(t, self.state_args) for t in self.tools]

    def tools_source(self) -> str:
        return Path(inspect.getfile(self.tools_module)).read_text(encoding="utf-8")

    def task_data_source(self, spec: "TaskSpec") -> str:
        """The read-only workspace module ``task_data.py`` of one task (:mod:`task_families.task_data`)."""
        from task_families.task_data import task_data_source

        return task_data_source(self, spec)

    @property
    def template_dir(self) -> Path:
        return Path(inspect.getfile(type(self))).parent / "template"

    def instructions_text(self) -> str:
        """The workspace's INSTRUCTIONS.md: the family's notes plus the common job format."""
        own = self.template_dir / "INSTRUCTIONS.md"
        common = Path(__file__).parent / "JOB_FORMAT.md"
        parts = [p.read_text(encoding="utf-8") for p in (own, common) if p.is_file()]
        return "\n".join(parts)

    def generate(self, seed: int, n: int, difficulty: float | None = None, **options: Any) -> list[Instance]:
        """``n`` instances from ``seed``; ``difficulty=None`` mixes difficulties uniformly; ``options`` go
        to :meth:`generate_one` (a family's own knobs, for experiments; the eval uses the defaults)."""
        rng = random.Random(f"{self.name}:{seed}")
        out = []
        for _ in range(n):
            d = rng.random() if difficulty is None else min(1.0, max(0.0, float(difficulty)))
            out.append(self.generate_one(rng, d, **options))
        return out

    def dev_pool(self, **options: Any) -> list[Instance]:
        """Public dev examples (never in the hidden set); ``options`` as in :meth:`generate`."""
        return self.generate(self.dev_pool_seed, 40, **options)

    def hidden_eval(self, secret_seed: int, **options: Any) -> list[Instance]:
        """The hidden eval set; dev-pool questions are excluded by key. ``options`` (as in
        :meth:`generate`) draw a set of another distribution from the same seed, for experiments."""
        dev = {i.key for i in self.dev_pool(**options)}
        out: list[Instance] = []
        seen: set[str] = set()
        rng_seed = secret_seed
        while len(out) < self.hidden_eval_size:
            for inst in self.generate(rng_seed, self.hidden_eval_size, **options):
                if inst.key in dev or inst.key in seen:
                    continue
                seen.add(inst.key)
                out.append(inst)
                if len(out) == self.hidden_eval_size:
                    break
            rng_seed += 1
        return out

    def make_task(self, seed: int, bounds: Bounds) -> TaskSpec:
        """The task spec of one episode instance (its dev examples are drawn with ``seed``)."""
        rng = random.Random(f"task:{self.name}:{seed}")
        dev = rng.sample(self.dev_pool(), self.dev_examples_shown)
        instance_id = f"{self.name}-{seed}"
        return TaskSpec(family=self.name, instance_id=instance_id, title=self.title,
                        text=self.spec_text(bounds, dev), bounds=bounds, dev_examples=dev,
                        tool_names=self.tool_names)

    def spec_text(self, bounds: Bounds, dev: list[Instance]) -> str:
        tools = "\n".join(f"- `{s['function']['name']}`: {s['function']['description']}"
                          for s in self.tool_schemas())
        examples = "\n".join(
            f"{i}. question: {json.dumps(e.question)}\n   answer: {json.dumps(e.answer)}"
            for i, e in enumerate(dev, 1))
        models = ", ".join(f"`{m}`" for m in bounds.base_models)
        world_args = ", ".join(f"`{a}`" for a in self.state_args)
        stateful = "" if not self.state_args else f"""
This family is **stateful**: each question has its own world that the tools change, and the eval scores
the state an episode leaves. The tools take the world as their last argument ({world_args}), which the
model never sees: your environment must build one world per rollout and pass it to every tool call
(INSTRUCTIONS.md, "Stateful families").
"""
        return f"""# Task: {self.title}

{self.goal}
{stateful}
## How the trained model is evaluated (hidden eval)
The model gets each hidden question as the user message, after this system prompt:
> {self.eval_system_prompt}

It may call these tools (module `{TOOLS_MODULE_NAME}`, read-only in your workspace) for up to
{self.eval_max_turns} turns, at temperature 0 with at most {self.eval_max_tokens} tokens per turn:
{tools}

Scoring: {self.answer_format}
The hidden questions are drawn from the same generator as the dev examples, at mixed difficulty;
you never see them, and copying dev examples into training data does not help.

## Constraints (hard limits, checked when you submit)
- base model: one of {models}
- max_steps <= {bounds.max_steps}, batch_size <= {bounds.max_batch_size}, group_size <= {bounds.max_group_size}
- seq_len <= {bounds.max_seq_len}, sampling max_tokens <= {bounds.max_tokens}
- dataset rows: {bounds.min_examples}..{bounds.max_examples}; wall clock <= {bounds.wall_clock_minutes} min

## Dev examples
{examples}
(The eval's system prompt and these examples are also importable: `from {TASK_DATA_MODULE_NAME} import SYSTEM_PROMPT,
DEV_EXAMPLES`, read-only in your workspace.)

Read INSTRUCTIONS.md for the job format, then write `job.toml` and `environment.py` and call
`submit_job`. Use `get_baseline_scores` to see how the untrained base models score.
"""
