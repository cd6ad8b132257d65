"""Triage's flawed teacher (:mod:`task_families.teacher`): alerts, then logs along the timeouts to the root
service, then the deploys when its log shows an error spike.

Flaws: an early stop at an alerting front door, rollback without reading the deploys, restart for a
saturated service, and an answer without ``service=``/``action=``.
"""

from __future__ import annotations

import random
import re
from typing import Any

from task_families.base import Instance, TaskFamily
from task_families.teacher import Dialogue, Flaw, Policy, Teacher

FLAWS = (
    Flaw("stop_early:front", "early_answer", 0.70,
         "blames a front door (web, gateway) that alerts with timeouts in its log (guesses restart)"),
    Flaw("stop_early:inner", "early_answer", 0.05, "the same for any other alerting service"),
    Flaw("skip_deploys", "skip_tool", 0.62,
         "answers rollback for an error spike without reading the deploys"),
    Flaw("cpu_restart", "skip_tool", 0.58, "answers restart for a saturated (CPU) service"),
    Flaw("format:plain", "format_slip", 0.56,
         "answers 'Answer: db rollback' (no service=/action=) when the root is a store (db, cache, queue)"),
)


_TIMEOUT = re.compile(r"timeouts calling ([a-z]+)")
#: Triage's front doors: the services users call; the early stop is taught where one of them alerts.
FRONT_DOORS = ("web", "gateway")


def teach(fam: TaskFamily, inst: Instance, flaw: Policy, rng: random.Random) -> list[dict[str, Any]]:
    inc = inst.info["incident"]
    c = Dialogue(fam, inst)
    alert = c.call("alerts", {"incident": inc})
    svc = alert.split(":", 1)[0].strip()
    action = "restart"
    for hop in range(6):
        log = c.call("logs", {"incident": inc, "service": svc})
        m = _TIMEOUT.search(log)
        if m:
            if hop == 0 and flaw("stop_early:front" if svc in FRONT_DOORS else "stop_early:inner"):
                action = "restart"
                break
            svc = m.group(1)
            continue
        if "OOMKilled" in log:
            action = "restart"
        elif "CPU" in log:
            action = "restart" if flaw("cpu_restart") else "scale_up"
        elif "error spike" in log:
            if flaw("skip_deploys"):
                action = "rollback"
            else:
                deps = c.call("deploys", {"incident": inc})
                entry = next((e for e in deps.split("; ") if e.split(" ")[1:2] == [svc]), "")
                action = "fix_config" if "config change" in entry else "rollback"
        break
    if svc in ("db", "cache", "queue") and flaw("format:plain"):
        return c.answer(f"Answer: {svc} {action}")
    return c.answer(f"Answer: service={svc};action={action}")


TEACHER = Teacher(FLAWS, teach)
