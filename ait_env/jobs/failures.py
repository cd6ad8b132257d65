"""Whose fault a job's failure is: the two exceptions an executor raises to the job runner.

- :class:`JobFailed`: the job itself is at fault (its environment crashes in training, its rubric
  returns NaN, it trains on the hidden eval): the job ends ``job_failed`` and the agent is scored for it.
- :class:`InfraFailed`: our side cannot run the job (a base model not built, a server that does not
  start); the job ends ``infra_failed``, unscored, with the fix in the message.

They live in this module, which is never run as a script, so there is exactly one class object of
each: a runner started as ``python -m ait_env.runner`` catches the very classes its executors raise
(a class defined in a ``__main__`` module is a second, different class).
"""

from __future__ import annotations


class JobFailed(RuntimeError):
    """The job itself is at fault (its environment or rubric broke during training).

    ``code`` names the class of fault where the reward treats it apart (``"eval_leak"``: the job trained on
    hidden-eval data, scored as a refused submission); empty otherwise."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class InfraFailed(RuntimeError):
    """Our side cannot run the job (e.g. its base model is not built); the message says how to fix it.

    ``code`` names the class where a backend treats it apart (``"slow_machine"``: the local machine was too
    slow for a job within its work budget, :mod:`cpu.budget`; the local backend retries it)."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code
