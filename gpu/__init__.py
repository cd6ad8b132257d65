"""The GPU worker (see ``gpu/README.md``): ``worker.py`` (bundle in, ``result.json`` out: CLI, Runpod
handler, local executor), ``isolation.py`` (the training jail), ``selfcheck.py`` (versions, GPUs, model
files), ``primerl_executor.py`` (prime-rl v0.7.0 as the runner's ``gpu`` trainer executor),
``primerl_logs.py``, ``vllm_server.py`` (the hidden eval's vLLM), ``processes.py`` (process trees),
``runpod_api.py`` (the Runpod Serverless job API and endpoint management client), ``endpoint.py`` +
``endpoint.yaml`` (``python -m gpu.endpoint up|status|down``), ``prices.py`` (dated $/GPU-s), and the pinned
image (``Dockerfile``, ``requirements.lock``)."""
