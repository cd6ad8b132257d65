"""Backends that run job bundles. :func:`make_backend` builds one from its settings by name."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from ait_env.backends.base import Backend, BackendOptionsError, JobHandle
from ait_env.jobs.result import JobResult
from ait_env.jobs.settings import BackendSettings, ModelInfo, TokenCounter

__all__ = ["Backend", "BackendOptionsError", "BackendSettings", "JobHandle", "JobResult", "ModelInfo",
           "TokenCounter", "backend_factory", "make_backend"]


def make_backend(settings: BackendSettings, runs_dir: Path | str | None = None) -> Backend:
    """A new backend for ``settings``; the caller owns it (close it, or use it as a context manager).
    ``runs_dir``: where its jobs write (None: the per-user default, :func:`ait_env.conf.default_runs_dir`)."""
    if settings.name == "stub":
        from ait_env.backends.stub import StubBackend

        return StubBackend(settings, runs_dir)
    if settings.name == "local":
        from ait_env.backends.local import LocalBackend

        return LocalBackend(settings, runs_dir)
    if settings.name == "gpu-local":
        from ait_env.backends.gpu_local import GpuLocalBackend

        return GpuLocalBackend(settings, runs_dir)
    if settings.name == "runpod":
        from ait_env.backends.runpod import RunpodBackend

        return RunpodBackend(settings, runs_dir)
    if settings.name == "skypilot":
        from ait_env.backends.skypilot import SkypilotBackend

        return SkypilotBackend(settings, runs_dir)
    raise ValueError(f"unknown backend {settings.name!r}; available: stub, local, gpu-local, runpod, skypilot. "
                     "Pass backend='stub' or add conf/backend/<name>.yaml with a matching implementation.")


def backend_factory(spec: str | None) -> Callable[..., Backend]:
    """:func:`make_backend`, or the ``module:Class`` that ``spec`` names (a custom or test backend, built as
    ``Class(settings, runs_dir)``): what adapters that build their own backend accept as ``backend_factory``."""
    if not spec:
        return make_backend
    mod, _, attr = spec.partition(":")
    if not mod or not attr:
        raise ValueError(f"backend_factory {spec!r}: give 'module:Class' (e.g. 'my_backends:FlakyBackend')")
    return getattr(importlib.import_module(mod), attr)
