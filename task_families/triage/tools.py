"""Tools of the triage family (the inner model calls these; identical in training and eval).

The world is a fixed service graph (``DEPENDENCIES``) and a hash-defined incident for every id of
the form ``inc-`` + 4 letters/digits. An incident has an alerting service, a chain of failing
dependencies ending at the root-cause service, and a cause that decides the fix:
out of memory -> restart, saturation -> scale_up, a bad deploy -> rollback, a bad config
change -> fix_config. Every tool is a pure function of its arguments.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

DEPENDENCIES: dict[str, tuple[str, ...]] = {
    "web": ("api", "cdn"),
    "gateway": ("api", "auth"),
    "api": ("auth", "db", "cache", "search"),
    "billing": ("db", "queue", "email"),
    "worker": ("queue", "db", "email"),
    "search": ("db", "cache"),
    "auth": ("db", "cache"),
    "email": ("queue",),
    "cdn": (),
    "db": (),
    "cache": (),
    "queue": (),
}
SERVICES = tuple(DEPENDENCIES)
DEPENDENTS: dict[str, tuple[str, ...]] = {s: tuple(c for c in SERVICES if s in DEPENDENCIES[c]) for s in SERVICES}
ACTIONS = ("restart", "scale_up", "rollback", "fix_config")

_ID = re.compile(r"inc-[a-z0-9]{4}")


def _h(*parts: str) -> int:
    return int(hashlib.sha256(":".join(("triage",) + parts).encode("utf-8")).hexdigest()[:12], 16)


def _hhmm(minutes: int) -> str:
    minutes %= 24 * 60
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


@lru_cache(maxsize=4096)
def _facts(incident: str) -> dict:
    root = SERVICES[_h(incident, "root") % len(SERVICES)]
    chain = [root]  # built upwards from the root cause to the alerting service
    for i in range(_h(incident, "hops") % 3):
        callers = DEPENDENTS[chain[0]]
        if not callers:
            break
        chain.insert(0, callers[_h(incident, "caller", str(i)) % len(callers)])
    action = ACTIONS[_h(incident, "cause") % len(ACTIONS)]
    spike = 8 * 60 + _h(incident, "spike") % (12 * 60)
    others = [s for s in SERVICES if s not in chain]
    deploys = []
    for j in range(1 + _h(incident, "noise") % 2):
        svc = others.pop(_h(incident, "noise", str(j)) % len(others))
        when = spike - 30 - _h(incident, "noise-t", str(j)) % 300
        kind = "config change" if _h(incident, "noise-k", str(j)) % 3 == 0 else \
            f"deploy v{1 + _h(incident, 'v', str(j)) % 4}.{_h(incident, 'w', str(j)) % 10}"
        deploys.append((when, f"{svc} {kind}"))
    if action == "rollback":
        deploys.append((spike - 1 - _h(incident, "lag") % 9,
                        f"{chain[-1]} deploy v{1 + _h(incident, 'rv') % 4}.{_h(incident, 'rw') % 10}"))
    elif action == "fix_config":
        deploys.append((spike - 1 - _h(incident, "lag") % 9, f"{chain[-1]} config change"))
    deploys.sort(reverse=True)
    return {"chain": chain, "root": chain[-1], "action": action, "spike": _hhmm(spike),
            "deploys": [f"{_hhmm(t)} {what}" for t, what in deploys],
            "pct": 5 + _h(incident, "pct") % 60}


def incident_facts(incident: str) -> dict:
    """The hidden facts of a canonical incident id (not a tool): alerting chain, root cause, fix."""
    facts = _facts(incident)
    return {**facts, "chain": list(facts["chain"]), "deploys": list(facts["deploys"])}


def _incident(incident: str) -> str | None:
    inc = str(incident).strip().lower()
    return inc if _ID.fullmatch(inc) else None


def _bad_incident(incident: str) -> str:
    return f"error: unknown incident {str(incident)[:20]!r}; ids look like inc-7fk2"


def alerts(incident: str) -> str:
    """Alerts firing for an incident.

    Args:
        incident: Incident id, e.g. "inc-7fk2".

    Returns:
        The firing alerts, e.g. "web: error rate 23% (SLO 1%)", or a message starting with "error:".
    """
    inc = _incident(incident)
    if inc is None:
        return _bad_incident(incident)
    facts = incident_facts(inc)
    return f"{facts['chain'][0]}: error rate {facts['pct']}% (SLO 1%)"


def logs(incident: str, service: str) -> str:
    """One service's log summary during an incident.

    Args:
        incident: Incident id, e.g. "inc-7fk2".
        service: Service name, e.g. "api".

    Returns:
        A one-line log summary for that service, or a message starting with "error:".
    """
    inc = _incident(incident)
    if inc is None:
        return _bad_incident(incident)
    svc = str(service).strip().lower()
    if svc not in DEPENDENCIES:
        return f"error: unknown service {str(service)[:20]!r}; services: {' '.join(SERVICES)}"
    facts = incident_facts(inc)
    chain = facts["chain"]
    if svc not in chain:
        return f"{svc}: no errors"
    i = chain.index(svc)
    n = 2 + _h(inc, "n", svc) % 9
    if i < len(chain) - 1:
        return f"{svc}: timeouts calling {chain[i + 1]} on {facts['pct'] - i}% of requests"
    if facts["action"] == "restart":
        return f"{svc}: OOMKilled, container restarted {n} times in 10 min"
    if facts["action"] == "scale_up":
        return f"{svc}: CPU at 9{n - 2}%, {n * 400} requests queued, no crashes"
    return f"{svc}: error spike since {facts['spike']}, 500s on {facts['pct']}% of requests"


def deploys(incident: str) -> str:
    """Recent deploys and config changes before an incident, newest first.

    Args:
        incident: Incident id, e.g. "inc-7fk2".

    Returns:
        Entries such as "14:01 db deploy v2.4; 11:20 email config change", or a message starting with "error:".
    """
    inc = _incident(incident)
    if inc is None:
        return _bad_incident(incident)
    return "; ".join(incident_facts(inc)["deploys"])


def dependencies(service: str) -> str:
    """Services that a service calls.

    Args:
        service: Service name, e.g. "api".

    Returns:
        E.g. "api depends on: auth, db, cache, search", or a message starting with "error:".
    """
    svc = str(service).strip().lower()
    if svc not in DEPENDENCIES:
        return f"error: unknown service {str(service)[:20]!r}; services: {' '.join(SERVICES)}"
    return f"{svc} depends on: {', '.join(DEPENDENCIES[svc]) or 'nothing'}"


TOOLS = [alerts, logs, deploys, dependencies]
