"""The sandbox for untrusted agent code: a resident, isolated process that runs one confined child per
request (:mod:`ait_env.sandbox.host` on the orchestrator's side, :mod:`ait_env.sandbox.zygote` and
:mod:`ait_env.sandbox.confine` inside). Used by the validation probe and by the local executor's
rollout worker; what it guarantees is in ``docs/security.md``. Beside it: the agent's workspace and its
quotas (:mod:`ait_env.sandbox.workspace`). The process toolkit it shares with the workers is
:mod:`ait_env.processes`."""

from ait_env.sandbox.host import (
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxSettings,
    bwrap_path,
    remove_tree,
    shared_sandbox,
)

__all__ = ["Sandbox", "SandboxError", "SandboxLimits", "SandboxSettings", "bwrap_path", "remove_tree",
           "shared_sandbox"]
