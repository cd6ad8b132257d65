"""Triage family (held out): on-call incident triage with alerts, logs, deploys and dependency tools.

A question names an incident ("Incident inc-7fk2 is open. Find the root-cause service and the fix.").
The model reads the alert, follows the logs from the alerting service down the chain of
"timeouts calling X" to the root-cause service, reads its failure (OOM -> restart, saturation ->
scale_up, an error spike -> check the recent deploys: a deploy -> rollback, a config change ->
fix_config) and answers ``service=<name>;action=<action>``. Difficulty (0..1) sets the number of
calls (2..5: one alert, one log per service on the chain, plus the deploys when needed).

Partial credit: the checker reads ``service=`` and ``action=`` after the last "Answer:" (after
removing ``<think>`` blocks) and scores 0.5 for the right root-cause service plus 0.5 for the right
action.
"""

from __future__ import annotations

import random
import re
import string

from task_families.base import Instance, TaskFamily, ToolStep, answer_text
from task_families.triage import tools

_SERVICE = re.compile(r"service\s*[=:]?\s*([a-z]+)", re.IGNORECASE)
_ACTION = re.compile(r"action\s*[=:]?\s*([a-z][a-z _-]*)", re.IGNORECASE)
_ANSWER = re.compile(r"service=([a-z]+);action=([a-z_]+)")
_NEEDS_DEPLOYS = ("rollback", "fix_config")


def parse_answer(text: str | None) -> tuple[str | None, str | None]:
    """(service, action) from an answer line such as "service=db;action=rollback"."""
    text = text or ""
    s, a = _SERVICE.search(text), _ACTION.search(text)
    service = s.group(1).lower() if s else None
    action = None
    if a:
        letters = re.sub(r"[^a-z]", "", a.group(1).lower())
        for canon in tools.ACTIONS:
            if letters.startswith(canon.replace("_", "")):
                action = canon
                break
    return service, action


def incident_calls(facts: dict) -> int:
    return 1 + len(facts["chain"]) + (1 if facts["action"] in _NEEDS_DEPLOYS else 0)
_INCIDENT = re.compile(r"(?<![a-z0-9])inc\s*-\s*([a-z0-9]{4})(?![a-z0-9])")



class TriageFamily(TaskFamily):
    name = "triage"
    title = "On-call incident triage with observability tools"
    goal = ("Teach the base model to triage an incident such as 'Incident inc-7fk2 is open. Find the root-cause "
            "service and the fix.'. Tools return the firing alerts, per-service log summaries, recent deploys "
            "and service dependencies. The model must start from the alerting service, follow the logs "
            "('timeouts calling X') down to the service that is really failing, read how it fails "
            "(out of memory, saturated, or an error spike that a recent deploy or config change explains) "
            "and answer with that service and one action: rollback, restart, scale_up or fix_config.")
    tools_module = tools
    eval_system_prompt = ("Triage the incident: call alerts, then logs for each service down the chain of "
                          "timeouts, and deploys after a sudden error spike. Reply "
                          "'Answer: service=<name>;action=<rollback|restart|scale_up|fix_config>'.")
    answer_format = ("after the last 'Answer:' in the model's final message (after any <think> block), "
                     "'service=<name>;action=<action>' is read: 0.5 for the right root-cause service plus 0.5 "
                     "for the right action (rollback, restart, scale_up or fix_config); averaged over questions.")

    def instance_signatures(self, text: str) -> set[str]:
        """A question is its incident: every incident id in ``text`` (the tools derive the whole incident
        from it)."""
        return set(_INCIDENT.findall(text))

    def generate_one(self, rng: random.Random, difficulty: float) -> Instance:
        target = 2 + round(3 * difficulty)
        alphabet = string.ascii_lowercase + string.digits
        while True:
            incident = "inc-" + "".join(rng.choice(alphabet) for _ in range(4))
            facts = tools.incident_facts(incident)
            if incident_calls(facts) == target:
                break
        question = f"Incident {incident} is open. Find the root-cause service and the fix."
        return Instance(question=question, answer=f"service={facts['root']};action={facts['action']}",
                        difficulty=difficulty,
                        info={"incident": incident, "chain": facts["chain"], "action": facts["action"],
                              "n_calls": target})

    def solution(self, instance: Instance) -> list[ToolStep]:
        info = instance.info
        inc = info["incident"]
        steps = [ToolStep(name="alerts", arguments={"incident": inc})]
        steps += [ToolStep(name="logs", arguments={"incident": inc, "service": s}) for s in info["chain"]]
        if info["action"] in _NEEDS_DEPLOYS:
            steps.append(ToolStep(name="deploys", arguments={"incident": inc}))
        return steps

    def check(self, instance: Instance, response: str) -> float:
        want = _ANSWER.fullmatch(instance.answer)
        assert want is not None, instance.answer
        service, action = parse_answer(answer_text(response))
        return 0.5 * (service == want.group(1)) + 0.5 * (action == want.group(2))

    def perturb_answer(self, instance: Instance, rng: random.Random) -> str:
        want = _ANSWER.fullmatch(instance.answer)
        assert want is not None, instance.answer
        service, action = want.group(1), want.group(2)
        chain = instance.info.get("chain") or [service]
        r = rng.random()
        if r < 0.4 and len(chain) > 1:
            service = rng.choice(chain[:-1])  # stopped too early on the chain
        elif r < 0.7:
            action = rng.choice([a for a in tools.ACTIONS if a != action])
        else:
            service = rng.choice([s for s in tools.SERVICES if s != service])
            action = rng.choice([a for a in tools.ACTIONS if a != action])
        return f"service={service};action={action}"


FAMILY = TriageFamily()
