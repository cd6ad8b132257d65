"""The CPU worker, the local twin of ``gpu/``: it runs the same job bundle through the same runner contract,
on the project's own tiny models and this machine's CPU. The runner's ``local`` trainer executor
(``executor``), the GRPO trainer (``trainer``, ``grpo``, ``budget``) and its sandboxed rollout workers
(``rollout_worker``) that load the job's environment, and the tiny models themselves (``tiny_models``: built
here, served by its OpenAI-compatible endpoint). Like ``gpu/`` it knows no orchestrator, no fleet and no agent
(``.importlinter``); the ``local`` backend starts it."""

from ait_env.extras import install_excepthook

install_excepthook()   # `python -m cpu.tiny_models.build` without torch says which extra, in one line
