"""Backends that run job bundles. :func:`make_backend` builds one from its settings by name."""

from __future__ import annotations

from ait_env.backends.base import Backend, BackendSettings, JobHandle, JobResult, ModelInfo

__all__ = ["Backend", "BackendSettings", "JobHandle", "JobResult", "ModelInfo", "make_backend"]


def make_backend(settings: BackendSettings) -> Backend:
    if settings.name == "stub":
        from ait_env.backends.stub import StubBackend

        return StubBackend(settings)
    if settings.name == "local":
        from ait_env.backends.local import LocalBackend

        return LocalBackend(settings)
    raise ValueError(f"unknown backend {settings.name!r}; available: stub, local. "
                     "Pass backend='stub' or add conf/backend/<name>.yaml with a matching implementation.")
