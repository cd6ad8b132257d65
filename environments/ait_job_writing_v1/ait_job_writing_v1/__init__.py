"""The verifiers v1 environment id ``ait-job-writing-v1``: verifiers imports this package (the id with ``-`` as
``_``) and takes its one ``Taskset`` and its ``Env`` (``ait_env.integrations.verifiers_v1_env``, where the
contract is documented; docs/verifiers.md)."""

from ait_env.integrations.verifiers_v1_env import JobWritingEnvV1, JobWritingTaskset

__all__ = ["JobWritingEnvV1", "JobWritingTaskset"]
