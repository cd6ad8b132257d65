"""The training audit: what the model is actually given during training, checked where it trains.

The validation probe loads the agent's environment once, in its own sandbox request, and checks what the
environment reports. An environment can tell that load apart from training (its arguments, its folder,
the time) and behave differently there; any check it can detect, it can evade. This audit needs no
cooperation: it reads the conversations the model was sampled on and trained from — the requests the
sandboxed rollout worker sent to the model endpoint, recorded by the endpoint itself outside the sandbox
(:attr:`cpu.tiny_models.endpoint.Record.messages`) — so what it checks is exactly what training used. On a
GPU the same audit reads prime-rl's per-step rollout traces (:mod:`gpu.primerl_traces`).

- **Hidden-eval leaks**: every text the model reads (:func:`ait_env.probe.leak.model_texts`: every message,
  system, user, tool, assistant (an environment can forge few-shot turns), content parts joined, and every
  tool schema's keys and values: names, parameter names, descriptions), looked for in every normalised
  reading (:func:`ait_env.probe.leak.views`) with the probe's :class:`ait_env.probe.leak.LeakIndex` (copies
  and re-worded instances). More than ``tolerance`` distinct hidden questions seen fail the job with code
  ``eval_leak``.
- **The family's tools, unchanged**: every tool result the model was shown is compared with what the
  family's own tool returns for the same call (``str(tool(**arguments))``, as verifiers 0.2.0's
  ``ToolEnv.call_tool`` formats it); a different answer, or a tool list that is not the family's, fails
  the job with code ``foreign_tools``. Calls the family's tool refuses (bad arguments, an unknown tool)
  are not compared: their error text is the environment's ``error_formatter``'s to choose. A stateful
  family's results depend on the rollout's world, which the requests do not carry (it is in the dataset
  row's ``info``, never shown to the model): where the trainer passes the row's ``info`` (the local
  backend: the rollout worker reports each group's row), the rollout's tool calls are replayed in order on a
  fresh world built from it, and every result must match; where it does not (prime-rl's traces), only the
  tool list is checked and the probe's scripted rollouts stand for the results.

Both codes void the job's validation in the reward (:data:`ait_env.episode.reward.FORFEITING_FAULTS`). Each
message is read once per job (by content hash), so the cost grows with new text only. What the audit reads
passes :func:`ait_env.jobs.guard.check` first: a request it cannot read in full (nesting, integers or sizes
past the guard's bounds, values that are not JSON data) fails the job (``job_failed``) instead of being
skipped, since an unread message could hide a leak.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

from ait_env.jobs import guard
from ait_env.jobs.failures import JobFailed
from ait_env.probe.leak import LEAK_TOLERANCE, LeakIndex, message_texts, model_texts
from task_families.base import Instance, TaskFamily

#: how many message hashes a job remembers (a bound on memory; beyond it messages are read again)
MAX_SEEN = 500_000


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class TrainingAudit:
    """See the module docstring. :meth:`review` raises :class:`~ait_env.jobs.failures.JobFailed`."""

    def __init__(self, family: TaskFamily, hidden_questions: Sequence[str], tolerance: int = LEAK_TOLERANCE) -> None:
        self.family = family
        self.index = LeakIndex(hidden_questions, family)
        self.tolerance = tolerance
        self.tools = {t.__name__: t for t in family.tools}
        self.leaked: dict[int, str] = {}          # hidden index -> the role that carried it
        self.seen: set[str] = set()
        self.checked_results = 0

    def review(self, conversations: Iterable[tuple[Any, ...]]) -> None:
        """Check each ``(messages, tools)`` or ``(messages, tools, info)`` a training request carried; ``info``
        is the dataset row's ``info`` of the rollout the request belongs to (a stateful family's tool results
        are replayed on a fresh world built from it; ``None`` where the trainer does not know the row)."""
        for item in conversations:
            messages, tools, info = (tuple(item) + (None, None, None))[:3]
            try:
                guard.check(messages, what="a training request's messages")
                guard.check(tools, what="a training request's tool list")
            except guard.Refused as exc:
                raise JobFailed(f"your environment gave the model data the training audit cannot read ({exc}); "
                                "keep prompts, tool schemas and tool results plain text and small JSON") from None
            if tools:
                self._check_tool_list(tools)
            if isinstance(messages, list):
                self._check_messages(messages)
                if self.family.state_args and info is not None:
                    self._replay_stateful(messages, info)
        if len(self.leaked) > self.tolerance:
            roles = sorted(set(self.leaked.values()))
            raise JobFailed(f"your environment gave the model {len(self.leaked)} hidden-eval questions during "
                            f"training (in {', '.join(roles)} content), compared as instances and as text; the "
                            "validation probe did not see them. Training on the evaluation set is not allowed.",
                            code="eval_leak")

    # ------------------------------------------------------------------ checks
    def _remember(self, key: str) -> bool:
        """True the first time ``key`` is seen."""
        if key in self.seen:
            return False
        if len(self.seen) >= MAX_SEEN:
            self.seen.clear()
        self.seen.add(key)
        return True

    def _check_tool_list(self, tools: list[Any]) -> None:
        if not self._remember(_digest("tools", tools)):
            return
        self._scan(model_texts([], tools), "tool schema")
        names = {str((t.get("function") if isinstance(t.get("function"), dict) else t).get("name"))
                 for t in tools if isinstance(t, dict)}
        if names != set(self.tools):
            raise JobFailed(f"your environment offered the model the tools {sorted(names)} during training; the "
                            f"tools must be exactly the family's {sorted(self.tools)}", code="foreign_tools")

    def _check_messages(self, messages: list[Any]) -> None:
        calls: dict[str, tuple[str, Any]] = {}
        for msg in messages:
            if not isinstance(msg, dict):
                continue
            role = str(msg.get("role"))
            tool_calls = msg.get("tool_calls")
            for call in tool_calls if isinstance(tool_calls, list) else []:
                if isinstance(call, dict):  # OpenAI's nested form, or verifiers v1's flat {id, name, arguments}
                    fn = call.get("function") if isinstance(call.get("function"), dict) else call
                    calls[str(call.get("id"))] = (str(fn.get("name")), fn.get("arguments"))
            if not self._remember(_digest("msg", msg)):
                continue
            self._scan(message_texts(msg), role)
            if role == "tool" and str(msg.get("tool_call_id")) in calls:
                self._check_result(*calls[str(msg.get("tool_call_id"))], msg.get("content"))

    def _scan(self, texts: list[str], role: str) -> None:
        for text in texts:
            for i in self.index.find(text):
                self.leaked.setdefault(i, role)

    def _replay_stateful(self, messages: list[Any], info: Any) -> None:
        """A stateful family's tool results, replayed: the rollout's tool calls, in the order the messages
        show them, on a fresh world of its row (:meth:`~task_families.base.TaskFamily.new_world` from the
        row's ``info``, the layout INSTRUCTIONS.md gives) must give exactly the results the model was shown.
        A call the family's tool refuses is not compared (its error text is the environment's to choose);
        the world it leaves is the family's either way."""
        if not self._remember(_digest("replay", info, messages)):
            return
        try:
            world = self.family.new_world(Instance(question="", answer="", info=info if isinstance(info, dict) else {}))
        except Exception as exc:  # noqa: BLE001 - the row's info is the agent's data
            raise JobFailed(f"the training audit cannot build the world of a training row from its info "
                            f"({type(exc).__name__}: {str(exc)[:200]}): each row's info must carry the world as "
                            "INSTRUCTIONS.md lays it out (the audit replays every rollout's tool calls on it to "
                            "check that the model is shown the family's own tool results)",
                            code="foreign_tools") from None
        calls: dict[str, tuple[str, Any]] = {}
        for msg in messages:
            if not isinstance(msg, dict):
                continue
            tool_calls = msg.get("tool_calls")
            for call in tool_calls if isinstance(tool_calls, list) else []:
                if isinstance(call, dict):
                    fn = call.get("function") if isinstance(call.get("function"), dict) else call
                    calls[str(call.get("id"))] = (str(fn.get("name")), fn.get("arguments"))
            if msg.get("role") != "tool" or str(msg.get("tool_call_id")) not in calls:
                continue
            name, arguments = calls.pop(str(msg.get("tool_call_id")))
            try:
                args = guard.loads(arguments, what="the call's arguments") if isinstance(arguments, str) else arguments
            except guard.Refused:
                continue
            if name not in self.tools or not isinstance(args, dict):
                continue
            expected = self.family.call_tool(name, args, world)
            if expected.startswith("error:"):
                continue
            self.checked_results += 1
            if msg.get("content") != expected:
                raise JobFailed(f"during training the tool {name!r} answered {str(msg.get('content'))[:120]!r} to "
                                f"{json.dumps(args, default=str)[:200]}, but the family's {name} on that rollout's "
                                f"world returns {expected[:120]!r}: the inner model's tools must be the family's "
                                "own on the rollout's own fresh world (do not wrap, replace or post-process them, "
                                "and do not share a world between rollouts)", code="foreign_tools")

    def _check_result(self, name: str, arguments: Any, content: Any) -> None:
        fn = self.tools.get(name)
        if fn is None or self.family.state_args:
            return  # an unknown tool: the environment answers with its own error text
        try:
            args = guard.loads(arguments, what="the call's arguments") if isinstance(arguments, str) else arguments
            if not isinstance(args, dict):
                return
            expected = str(fn(**args))
        except Exception:  # noqa: BLE001 - the family's tool refuses the call: error texts are not compared
            return
        self.checked_results += 1
        if content != expected:
            raise JobFailed(f"during training the tool {name!r} answered {str(content)[:120]!r} to "
                            f"{json.dumps(args)[:200]}, but the family's {name} returns {expected[:120]!r}: the "
                            "inner model's tools must be the family's own, unchanged (do not wrap, replace or "
                            "post-process them)", code="foreign_tools")
