"""Training the tiny models on CPU: the runner's ``local`` trainer executor (``executor``), the GRPO trainer
(``trainer``, ``grpo``) and its sandboxed rollout workers (``rollout_worker``) that load the job's
environment."""
