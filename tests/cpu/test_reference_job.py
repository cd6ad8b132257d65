"""The real thing, end to end (slow: about 3 minutes on 2 cores; run with ``pytest -m slow``): the
arithmetic reference job trains the built ait-tiny-m through the one runner and lifts its hidden-eval
score. On the pinned build (weights hash of the pins) it reproduces the published post score exactly."""

from __future__ import annotations

import pytest

pytest.importorskip("verifiers")

from task_families import reference_files  # noqa: E402
from ait_env.jobs.settings import BackendSettings  # noqa: E402
from ait_env.config import load_group  # noqa: E402
from ait_env.runner import run  # noqa: E402
from ait_env.hidden.secrets import job_context
from tests.helpers import make_bundle  # noqa: E402

MODEL = "ait-tiny-m"
#: measured on the pinned build (docs/local_backend.md, "Reference jobs": 0.487 -> 0.757)
PINNED_WEIGHTS, PINNED_POST = "12747047dd569176", 0.7567


@pytest.mark.slow
def test_the_arithmetic_reference_job_lifts_the_model(tmp_path):
    from cpu.tiny_models import catalog

    if not catalog.is_current(MODEL):
        pytest.skip(f"{MODEL} is not built here: python -m cpu.tiny_models.build")
    bundle = make_bundle(reference_files("arithmetic", MODEL, backend="local"), tmp_path)
    result = run(bundle.root, BackendSettings.model_validate(load_group("backend", "local")), progress=False,
                 baselines_dir=tmp_path / "baselines")
    assert result.status == "succeeded", result.log_tail
    pre = result.baselines[MODEL]
    assert result.post_score is not None and result.post_score - pre >= 0.15, (pre, result.post_score)
    if catalog.weights_hash(MODEL) == PINNED_WEIGHTS:
        assert round(result.post_score, 4) == PINNED_POST
    else:  # another build: the job measured the base itself and pinned it for the next job
        from ait_env.hidden.baselines import BaselineStore

        store = BaselineStore("local", user_dir=tmp_path / "baselines")
        assert store.for_job(job_context("arithmetic", [MODEL], {MODEL: catalog.weights_hash(MODEL)}))[0] == {MODEL: pre}
