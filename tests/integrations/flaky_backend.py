"""A stub backend whose "pod" is lost for jobs marked ``simulate_infra_failure`` (the ``infra`` plan)."""

from __future__ import annotations

from typing import Any

from ait_env.backends.stub import StubBackend
from ait_env.config import compose
from ait_env.env import JobWritingEnv


class FlakyStubBackend(StubBackend):
    def run(self, bundle: Any, timeout: float | None = None) -> Any:
        if bundle.job.env.get("simulate_infra_failure"):
            raise RuntimeError("pod lost (simulated)")
        return super().run(bundle, timeout)


def make_env(cfg: Any) -> JobWritingEnv:
    settings = compose(backend=cfg.backend, overrides=cfg.env_overrides)
    return JobWritingEnv(settings=settings, backend_impl=FlakyStubBackend(settings.backend))
