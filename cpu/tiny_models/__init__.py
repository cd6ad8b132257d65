"""The project's own tiny chat models, built on this machine: architecture (``model``), tokenizer and chat
format (``tokenizer``, ``chat``), pre-training corpus and run (``corpus``, ``pretrain``), the build and its
catalog (``build`` writes what ``catalog`` reads; loading never builds), inference (``engine``,
``kv_reuse``, the OpenAI-compatible ``endpoint``) and a quick in-process eval (``quick_eval``)."""
