"""The model build (``cpu.tiny_models.build``): the whole pipeline on a micro catalog, its progress
reporting, its pool's shutdown, its float path and what it says about the pinned baselines."""

from __future__ import annotations

import io
import json

import pytest
import torch

from cpu.tiny_models import catalog
from cpu.tiny_models.model import TinyLM
from cpu.tiny_models.pretrain import PretrainConfig
from cpu.tiny_models.tokenizer import ChatTokenizer


def test_build_micro_catalog_end_to_end_and_deterministic(monkeypatch, tmp_path) -> None:
    """The whole build (corpus, tokenizer, pretraining, hidden-eval scores, cache dir, verify) with a
    micro catalog, twice: same weights."""
    from cpu.tiny_models import build as B

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
    log = io.StringIO()
    metas = B.build(force=False, jobs=0, evaluate=True, stream=log)
    assert set(metas) == {"micro-s", "micro-m"}
    said = log.getvalue()
    for phase in ("[build] corpus: ", "[build] tokenizer: ", "[build] encoded: ",
                  "[build] pretraining micro-s", "[build] micro-s: pretrained in ", "[build] micro-m (larger, ",
                  "[build] built micro-s, micro-m"):
        assert phase in said, (phase, said)
    assert "no pinned baselines" in said and "--eval" not in said and "\x1b" not in said
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
    log = io.StringIO()
    assert B.build(["micro-s"], jobs=0, stream=log)["micro-s"]["built_at"] == again["micro-s"]["built_at"]
    assert log.getvalue() == f"local models current: micro-s (cached in {tmp_path / 'cache'})\n"


def _write_progress(workdir, name: str, step: int, total: int, loss: float, seconds: float) -> None:
    from cpu.tiny_models import build as B

    B.progress_path(workdir, name).write_text(f"{step} {total} {loss:.4f} {seconds:.1f}")


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_build_progress_to_a_file_prints_a_plain_line_per_model_every_30_seconds(tmp_path) -> None:
    """Output redirected (not a terminal): no bars, a line per model at the cadence, with step, total,
    loss, elapsed and time left, read from the workers' progress files."""
    import io

    from cpu.tiny_models import build as B

    out, clock = io.StringIO(), _Clock()
    report = B.BuildProgress(tmp_path, stream=out, clock=clock)
    assert not report.tty
    report.line("[build] corpus: 18,900 transcripts")
    report.start(["ait-tiny-m", "ait-tiny-s"], workers=2)
    assert report.prog is None
    _write_progress(tmp_path, "ait-tiny-m", 181, 1800, 1.2345, 30.0)
    B.progress_path(tmp_path, "ait-tiny-s").write_text("garbage")  # a stray write is skipped, not fatal
    clock.now = 10.0
    report.refresh()
    assert out.getvalue().count("\n") == 2  # nothing yet: the first lines come after 30 s
    clock.now = 31.0
    report.refresh()
    lines = out.getvalue().splitlines()
    assert lines[1] == ("[build] pretraining ait-tiny-m (1,800 steps), ait-tiny-s (1,600 steps) in 2 worker "
                        "processes, one thread each")
    assert lines[2] == "[build] ait-tiny-m: step 181/1,800, loss 1.2345, 30s elapsed, about 4m28s left"
    assert len(lines) == 3
    clock.now = 40.0
    report.refresh()
    assert len(out.getvalue().splitlines()) == 3  # not again before another 30 s
    report.done("ait-tiny-m", "[build] ait-tiny-m: pretrained in 4m30s")
    clock.now = 100.0
    report.refresh()  # a finished model has no more progress lines
    report.close()
    assert out.getvalue().splitlines()[3:] == ["[build] ait-tiny-m: pretrained in 4m30s"]
    assert "\x1b" not in out.getvalue()


def test_build_progress_on_a_terminal_ends_with_every_bar_complete(tmp_path) -> None:
    """On a terminal: one bar per model following the progress files; a finished model's bar shows
    its total even when the last write it saw was an earlier step (1791 of 1800)."""
    import io

    from cpu.tiny_models import build as B

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    report = B.BuildProgress(tmp_path, stream=Terminal())
    report.start(["ait-tiny-m", "ait-tiny-s"], workers=2)
    _write_progress(tmp_path, "ait-tiny-m", 1791, 1800, 0.044, 300.0)
    _write_progress(tmp_path, "ait-tiny-s", 121, 1600, 0.4321, 20.0)
    report.refresh()
    tasks = {t.description: t for t in report.prog.tasks}
    assert tasks["pretrain ait-tiny-m"].completed == 1791
    assert tasks["pretrain ait-tiny-s"].completed == 121
    assert tasks["pretrain ait-tiny-s"].fields["loss"] == "0.4321"
    report.done("ait-tiny-m", "[build] ait-tiny-m: pretrained")
    assert tasks["pretrain ait-tiny-m"].completed == tasks["pretrain ait-tiny-m"].total == 1800
    report.close()
    assert report.prog is None
    quiet = B.BuildProgress(tmp_path, enabled=False, stream=Terminal())
    quiet.start(["ait-tiny-m"])
    quiet.line("nothing")
    assert quiet.prog is None and quiet.stream.getvalue() == ""


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
        "from ait_env.processes import sigterm_as_exit\n"
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
    from ait_env.hidden.baselines import BaselineEntry, BaselineStore
    from cpu.tiny_models import build as B

    pins = {("arithmetic", "ait-tiny-m", h): BaselineEntry(backend="local", family="arithmetic", model="ait-tiny-m",
                                                            score=0.5, model_hash=h) for h in ("abc", "xyz")}
    monkeypatch.setattr(BaselineStore, "entries", lambda self: pins)
    assert B.pinned_match({"name": "ait-tiny-m", "weights_hash": "abc"}) == "weights match the pinned baselines"
    assert B.pinned_match({"name": "ait-tiny-m", "weights_hash": "xyz"}) == "weights match the pinned baselines"
    other = B.pinned_match({"name": "ait-tiny-m", "weights_hash": "def",
                            "float_path": {"cpu_capability": "AVX512", "torch": "2.13.0+cpu"}})
    assert other.startswith("weights differ from the pinned build's (another CPU or corpus)")
    # the hint writes the user's store, never the one shipped with the package (pin=true rewrites that)
    assert "python scripts/seed_baselines.py backend=local)" in other and "pin=true" not in other
    assert "\n" not in other and "AVX" not in other and "MKL" not in other and "--" not in other
    assert "no pinned baselines" in B.pinned_match({"name": "ait-tiny-s", "weights_hash": "abc"})
    line = B.model_line({"name": "ait-tiny-m", "role": "larger", "params": 430752, "weights_hash": "def",
                         "base_scores": {}})
    assert line.startswith("[build] ait-tiny-m (larger, 430,752 params, weights def): weights differ")


def test_float_path_settings_reach_a_fresh_process_and_are_restored(monkeypatch) -> None:
    """The build's worker processes start torch under the float path's environment; the portable
    path runs torch's AVX2 kernels and MKL's reproducible AVX2 branch, and the ``float_path`` record
    says so. The parent's environment is left as it was."""
    import os
    import subprocess
    import sys

    from cpu.tiny_models import build as B

    for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MKL_CBWR", "AUTO")
    code = ("import json; from cpu.tiny_models.build import check_float_path; "
            "from cpu.tiny_models.pretrain import float_path; check_float_path('portable'); print(json.dumps(float_path()))")
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
    from cpu.tiny_models import build as B

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
