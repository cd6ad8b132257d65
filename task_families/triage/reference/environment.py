"""Reference environment for the triage family (verifiers 0.2.0 classic API).

Dataset: fresh incident ids from the same distribution as the eval (solutions of 2-5 calls, mixed
difficulty), generated from this job's own seed; reference answers come from triaging each incident
with the family's own tools (follow "timeouts calling X" from the alerting service, read the root's
failure, check the deploys for an error spike). Reward: the eval's partial credit (0.5 for the
service + 0.5 for the action), weighted 0.9, plus 0.1 for making at least the calls a full triage
needs (a correct, tool-using transcript scores 1.0).
"""

from __future__ import annotations

import random
import re
import string

import verifiers as vf
from datasets import Dataset

from family_tools import TOOLS, alerts, deploys, logs

SYSTEM_PROMPT = ("Triage the incident: call alerts, then logs for each service down the chain of "
                 "timeouts, and deploys after a sudden error spike. Reply "
                 "'Answer: service=<name>;action=<rollback|restart|scale_up|fix_config>'.")
ACTIONS = ("restart", "scale_up", "rollback", "fix_config")
_SERVICE = re.compile(r"service\s*[=:]?\s*([a-z]+)", re.IGNORECASE)
_ACTION = re.compile(r"action\s*[=:]?\s*([a-z][a-z _-]*)", re.IGNORECASE)


def triage(incident: str) -> tuple[str, str, int]:
    """(root service, action, tool calls used) by playing the tools like an on-call engineer."""
    service = alerts(incident).split(":", 1)[0]
    calls = 1
    while True:
        line = logs(incident, service)
        calls += 1
        m = re.search(r"timeouts calling (\w+)", line)
        if m is None:
            break
        service = m.group(1)
    if "OOMKilled" in line:
        return service, "restart", calls
    if "CPU at" in line:
        return service, "scale_up", calls
    history = deploys(incident)
    calls += 1
    for entry in history.split("; "):
        if f" {service} config change" in entry:
            return service, "fix_config", calls
        if f" {service} deploy" in entry:
            return service, "rollback", calls
    return service, "rollback", calls


def make_question(rng: random.Random, difficulty: float) -> dict:
    target = 2 + round(3 * difficulty)
    alphabet = string.ascii_lowercase + string.digits
    while True:
        incident = "inc-" + "".join(rng.choice(alphabet) for _ in range(4))
        service, action, calls = triage(incident)
        if calls == target:
            break
    return {"question": f"Incident {incident} is open. Find the root-cause service and the fix.",
            "answer": f"service={service};action={action}", "info": {"n_calls": calls}}


def build_dataset(num_examples: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    return Dataset.from_list([make_question(rng, rng.random()) for _ in range(num_examples)])


def _final_text(completion) -> str:
    for msg in reversed(completion or []):
        if msg["role"] == "assistant" and msg.get("content"):
            text = msg["content"]
            return text.rsplit("</think>", 1)[-1]
    return ""


def _parse(text: str):
    s, a = _SERVICE.search(text), _ACTION.search(text)
    action = None
    if a:
        letters = re.sub(r"[^a-z]", "", a.group(1).lower())
        action = next((c for c in ACTIONS if letters.startswith(c.replace("_", ""))), None)
    return (s.group(1).lower() if s else None), action


def triage_score(completion, answer, **kwargs) -> float:
    text = _final_text(completion)
    idx = text.lower().rfind("answer:")
    if idx < 0:
        return 0.0
    rest = text[idx + len("answer:"):].strip()
    service, action = _parse(rest.splitlines()[0] if rest else "")
    want_service, want_action = _parse(str(answer))
    right_service = service is not None and service == want_service
    right_action = action is not None and action == want_action
    return 0.5 * right_service + 0.5 * right_action


def tool_use(completion, info, **kwargs) -> float:
    calls = sum(len(msg.get("tool_calls") or []) for msg in completion or [] if msg["role"] == "assistant")
    needed = max(1, int((info or {}).get("n_calls", 2)))
    return min(1.0, calls / needed)


def load_environment(num_examples: int = 4000, seed: int = 12345, **kwargs) -> vf.Environment:
    dataset = build_dataset(num_examples, seed)
    rubric = vf.Rubric(funcs=[triage_score, tool_use], weights=[0.9, 0.1])
    # 8 turns like the eval (5 calls + answer at most, plus slack); job.toml raises seq_len to fit 4 tool schemas
    return vf.ToolEnv(dataset=dataset, tools=TOOLS, rubric=rubric, system_prompt=SYSTEM_PROMPT, max_turns=8)
