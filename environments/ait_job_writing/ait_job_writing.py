"""The verifiers environment id ``ait-job-writing``: ``verifiers.load_environment("ait-job-writing", **args)``
imports this module and calls :func:`load_environment` (``ait_env.integrations.verifiers_env``, where the
arguments and the contract are documented; docs/verifiers.md)."""

from ait_env.integrations.verifiers_env import load_environment

__all__ = ["load_environment"]
