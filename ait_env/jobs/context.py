"""One job's context: what a job is judged against, derived once where it is judged and passed down.

A job's family, the hidden set that scores it (its hash and the label of the seeds that drew it), the base
models it is compared with and the hash of the weights each would be trained from on this build. The env's
``get_baseline_scores``, the reward's ``best_pre``, the backends' job keys, the runner's phases and the GPU
worker's baseline requests read these fields from one :class:`JobContext` instead of deriving them again.

This kernel module only holds the type: :func:`ait_env.hidden.secrets.job_context` makes one (it reads the
installation's hidden-eval seeds), a backend makes the orchestrator's (:meth:`ait_env.backends.base.Backend.
job_context`, with the weights it would build) and the runner the one of the process that scores the job
(with its executor's weights). Two processes may hold different contexts for one job (a GPU worker given other
seeds): results say which seeds scored them, and :meth:`~ait_env.backends.base.Backend.check_hidden_seeds`
refuses a result scored on another set than the orchestrator's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class JobContext:
    """What one job of ``family`` is judged against (module docstring)."""

    family: str
    #: the hash of the hidden eval set this process scores ``family`` with
    hidden_set_hash: str
    #: which hidden-eval seeds drew that set ("published" or "private:<hash>")
    hidden_seeds: str
    #: the base models the job is compared with (the task's allowed models)
    models: tuple[str, ...] = ()
    #: model -> hash of the weights this build trains it from ("" or absent: unknown)
    weights: Mapping[str, str] = field(default_factory=dict)

    def weights_hash(self, model: str) -> str:
        """The built weights' hash of ``model`` ("" when unknown)."""
        return self.weights.get(model, "")
