"""Training a real LLM agent against ``AIT/JobWriting-v0`` on this machine (the laptop path of the outer loop).

- :mod:`ait_env.agent_training.demos`: expert demonstrations (:mod:`ait_env.agents.experts`) collected into a
  resumable JSONL file, for behaviour cloning (:mod:`ait_env.agent_models.sft`).
- :mod:`ait_env.agent_training.rl`: GRPO through the env, with verifiers' own rollout code playing the
  episodes (the env as the verifiers environment ``ait-job-writing``, text tool mode) against the agent's
  local endpoint, and the project's GRPO update (:mod:`cpu.grpo`) on exactly the sampled tokens.
- :mod:`ait_env.agent_training.scoring`: the agent scored by the LLM runner (:mod:`ait_env.agents.llm`) through
  its endpoint, with transcripts.

The trainer that runs them in order, resumably, is ``trainers/local_llm.py`` (``+pilot=laptop-llm``).
"""
