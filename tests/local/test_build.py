"""The model build (``ait_env.local.build``): the whole pipeline on a micro catalog, its progress
reporting, its pool's shutdown, its float path and what it says about the pinned baselines."""

from __future__ import annotations

import json

import pytest
import torch

from ait_env.local import catalog
from ait_env.local.model import TinyLM
from ait_env.local.pretrain import PretrainConfig
from ait_env.local.tokenizer import ChatTokenizer


def test_build_micro_catalog_end_to_end_and_deterministic(monkeypatch, tmp_path) -> None:
    """The whole build (corpus, tokenizer, pretraining, hidden-eval scores, cache dir, verify) with a
    micro catalog, twice: same weights."""
    from ait_env.local import build as B

    monkeypatch.setenv("AIT_CACHE_DIR", str(tmp_path / "cache"))
    micro = {
        "micro-s": catalog.LocalModelSpec(name="micro-s", role="small", hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=2, intermediate_size=64,
                                          pretrain=PretrainConfig(steps=12, batch_size=4, drill_steps=4,
                                                                  drill_batch=4)),
        "micro-m": catalog.LocalModelSpec(name="micro-m", role="larger", hidden_size=48, num_hidden_layers=2,
                                          num_attention_heads=2, intermediate_size=96,
                                          pretrain=PretrainConfig(steps=12, batch_size=4, drill_steps=4,
                                                                  drill_batch=4)),
    }
    monkeypatch.setattr(catalog, "CATALOG", micro)
    # in this process (jobs=0), whose torch already runs the machine's own kernels: the native path
    monkeypatch.setattr(catalog, "BUILD", catalog.BuildSettings(corpus_per_family=12, tokenizer_sample=72,
                                                                vocab_size=512, eval_limit=2, float_path="native"))
    monkeypatch.setattr(B, "EVAL_GROUPS", (("arithmetic", "persona"), ("triage",)))
    metas = B.build(force=False, jobs=0, progress=False, evaluate=True)
    assert set(metas) == {"micro-s", "micro-m"}
    for name, meta in metas.items():
        d = catalog.model_dir(name)
        assert d == tmp_path / "cache" / name and catalog.is_current(name)
        assert meta["role"] == micro[name].role and meta["params"] > 0
        assert set(meta["base_scores"]) == {"arithmetic", "persona", "triage"}
        assert meta["corpus_hash"] and meta["weights_hash"] and meta["fingerprint"] == catalog.fingerprint(name)
        fp = meta["float_path"]   # what the weights' float arithmetic depended on, recorded by the worker
        assert fp["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and fp["threads"] == 1
        assert fp["torch"] == torch.__version__ and fp["tokenizers"]
        assert TinyLM.load(d).cfg.hidden_size == micro[name].hidden_size
        assert ChatTokenizer.load(d).vocab_size <= 512
    again = B.build(["micro-s"], force=True, jobs=0, progress=False)   # without --eval: not scored
    assert again["micro-s"]["weights_hash"] == metas["micro-s"]["weights_hash"]
    assert again["micro-s"]["base_scores"] == {} and again["micro-s"]["mean_base_score"] is None
    assert "no pinned baselines" in B.pinned_match(again["micro-s"])
    assert B.build(["micro-s"], jobs=0, progress=False)["micro-s"]["built_at"] == again["micro-s"]["built_at"]


def test_parallel_build_progress_bars_follow_the_workers_progress_files(tmp_path) -> None:
    from ait_env.local import build as B

    names = list(catalog.CATALOG)
    bars = B._ParallelBars(names, str(tmp_path), enabled=True)
    (tmp_path / f"{names[0]}.progress").write_text("121 0.4321")
    (tmp_path / f"{names[1]}.progress").write_text("garbage")  # a partial write is skipped, not fatal
    bars.refresh(done=set())
    tasks = {t.description: t for t in bars.prog.tasks}
    assert tasks[f"pretrain {names[0]}"].completed == 121 and tasks[f"pretrain {names[0]}"].fields["loss"] == "0.4321"
    assert tasks[f"pretrain {names[1]}"].completed == 0
    bars.refresh(done={names[1]})
    assert tasks[f"pretrain {names[1]}"].completed == tasks[f"pretrain {names[1]}"].total
    bars.close()
    assert B._ParallelBars(names, str(tmp_path), enabled=False).prog is None


def test_a_terminated_build_takes_its_pool_workers_with_it(tmp_path) -> None:
    """SIGTERM to a build (its pool under ``sigterm_as_exit``) terminates the pretraining workers too."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "pool.py"
    script.write_text(
        "import multiprocessing as mp, sys, time\n"
        "from ait_env.local.build import sigterm_as_exit\n"
        "if __name__ == '__main__':\n"
        "    with sigterm_as_exit(), mp.get_context('spawn').Pool(2) as pool:\n"
        "        r = [pool.apply_async(time.sleep, (120,)) for _ in range(2)]\n"
        "        print(' '.join(str(p.pid) for p in pool._pool), flush=True)\n"
        "        r[0].get()\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    workers = [int(x) for x in proc.stdout.readline().split()]
    assert len(workers) == 2
    time.sleep(1.0)  # the tasks are running
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purposes
            return f.read().split()[2] != "Z"

    deadline = time.time() + 10
    while any(alive(p) for p in workers) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in workers), "pool workers outlived the terminated build"


def test_build_says_whether_its_weights_are_the_pinned_ones(monkeypatch) -> None:
    from ait_env.baselines import BaselineEntry, BaselineStore
    from ait_env.local import build as B

    pins = {("arithmetic", "ait-tiny-m", h): BaselineEntry(backend="local", family="arithmetic", model="ait-tiny-m",
                                                            score=0.5, model_hash=h) for h in ("abc", "xyz")}
    monkeypatch.setattr(BaselineStore, "entries", lambda self: pins)
    assert B.pinned_match({"name": "ait-tiny-m", "weights_hash": "abc"}) == "weights match the pinned baselines"
    assert B.pinned_match({"name": "ait-tiny-m", "weights_hash": "xyz"}) == "weights match the pinned baselines"
    other = B.pinned_match({"name": "ait-tiny-m", "weights_hash": "def"})
    assert other.startswith("weights differ from the pinned baselines' (abc, xyz)") and "seed_baselines.py" in other
    built_here = B.pinned_match({"name": "ait-tiny-m", "weights_hash": "def",
                                 "float_path": {"cpu_capability": "AVX512", "torch": "2.13.0+cpu"}})
    assert "(built with AVX512 kernels, torch 2.13.0+cpu)" in built_here and "vector instructions" in built_here
    assert "no pinned baselines" in B.pinned_match({"name": "ait-tiny-s", "weights_hash": "abc"})


def test_float_path_settings_reach_a_fresh_process_and_are_restored(monkeypatch) -> None:
    """The build's worker processes start torch under the float path's environment; the portable
    path runs torch's AVX2 kernels and MKL's reproducible AVX2 branch, and the ``float_path`` record
    says so. The parent's environment is left as it was."""
    import os
    import subprocess
    import sys

    from ait_env.local import build as B

    for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MKL_CBWR", "AUTO")
    code = ("import json; from ait_env.local.build import check_float_path; "
            "from ait_env.local.pretrain import float_path; check_float_path('portable'); print(json.dumps(float_path()))")
    with B.float_path_env("portable"):
        assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2" and os.environ["MKL_CBWR"] == "AVX2"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert os.environ["MKL_CBWR"] == "AUTO" and "ATEN_CPU_CAPABILITY" not in os.environ
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("this CPU has no AVX2: the portable path cannot run here")
    assert out.returncode == 0, out.stderr
    fp = json.loads(out.stdout.strip().splitlines()[-1])
    assert fp["cpu_capability"] == "AVX2" and fp["mkl_cbwr"] == "AVX2" and fp["aten_cpu_capability"] == "avx2"
    with pytest.raises(ValueError, match="unknown float path"):
        with B.float_path_env("fast"):
            pass


def test_a_process_that_already_runs_other_kernels_cannot_take_the_portable_path() -> None:
    from ait_env.local import build as B

    B.check_float_path("native")   # no settings: any kernels
    if torch.backends.cpu.get_cpu_capability() == "AVX2":
        B.check_float_path("portable")
        return
    with pytest.raises(RuntimeError, match="before torch starts"):
        B.check_float_path("portable")


def test_only_a_non_native_float_path_enters_the_fingerprint(monkeypatch) -> None:
    assert catalog.BuildSettings().float_path == "portable"   # the pinned weights' path
    portable = catalog.fingerprint("ait-tiny-m")
    monkeypatch.setattr(catalog, "BUILD", catalog.BuildSettings(float_path="native"))
    native = catalog.fingerprint("ait-tiny-m")
    assert native != portable
    monkeypatch.setattr(catalog, "BUILD", catalog.BuildSettings())
    assert catalog.fingerprint("ait-tiny-m") == portable
