"""The GPU worker: ``worker.py`` (bundle in, ``result.json`` out), ``isolation.py``, ``selfcheck.py``
and the pinned image; see ``gpu/README.md``."""
