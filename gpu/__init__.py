"""The GPU worker (see ``gpu/README.md``): ``worker.py`` (bundle in, ``result.json`` out: CLI, Runpod
handler, local executor), ``isolation.py`` (the training jail), ``selfcheck.py`` (versions, GPUs, model
files), ``primerl_executor.py`` (prime-rl v0.7.0 as the runner's ``gpu`` trainer executor),
``primerl_logs.py``, ``primerl_traces.py``, ``vllm_server.py`` (the hidden eval's vLLM), ``gpu_share.py``,
``venv_paths.py``, and the pinned image (``Dockerfile``, ``requirements.lock``). The fleet that sends it
jobs is the ``fleet`` package; neither imports the other."""
