"""A stub backend whose "pod" is lost for jobs marked ``simulate_infra_failure`` (the ``infra`` plan); the
Tinker adapter builds it once per run (``AdapterConfig.backend_factory = "flaky_backend:FlakyStubBackend"``)."""

from __future__ import annotations

from typing import Any

from ait_env.backends.stub import StubBackend


class FlakyStubBackend(StubBackend):
    def run(self, bundle: Any, timeout: float | None = None) -> Any:
        if bundle.job.env.get("simulate_infra_failure"):
            raise RuntimeError("pod lost (simulated)")
        return super().run(bundle, timeout)
