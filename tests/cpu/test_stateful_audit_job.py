"""The training audit on a real stateful job (slow: a few minutes on 2 cores; ``pytest -m slow``): the warehouse
reference job, a few steps on the built ait-tiny-m, has every tool result the model was shown replayed on a
fresh world of its row and passes (no false ``foreign_tools`` on the calls a real model makes, errors and all),
and its outcome check (60 hidden against 60 fresh questions) does not forfeit it (issue 46)."""

from __future__ import annotations

import pytest

pytest.importorskip("verifiers")

from ait_env.config import load_group  # noqa: E402
from ait_env.jobs.settings import BackendSettings  # noqa: E402
from ait_env.runner import run  # noqa: E402
from task_families import reference_files  # noqa: E402
from tests.helpers import make_bundle  # noqa: E402

MODEL = "ait-tiny-m"


@pytest.mark.slow
def test_a_real_warehouse_job_passes_the_stateful_audit_and_the_outcome_check(tmp_path):
    from cpu.tiny_models import catalog

    if not catalog.is_current(MODEL):
        pytest.skip(f"{MODEL} is not built here: python -m cpu.tiny_models.build")
    files = reference_files("warehouse", MODEL, backend="local")
    files["job.toml"] = files["job.toml"].replace("max_steps = 40", "max_steps = 4")
    settings = BackendSettings.model_validate(load_group("backend", "local"))
    settings.options.update(eval_every=0, eval_limit=60, outcome_fresh=60)
    result = run(make_bundle(files, tmp_path, family="warehouse").root, settings, progress=False)
    assert result.status == "succeeded", result.log_tail
    assert "outcome check: hidden" in result.log_tail
