"""Build the local base models: ``python -m ait_env.local.build [--force] [--eval] [--models ait-tiny-s,ait-tiny-m]``.

1. the flawed-teacher corpus (:func:`ait_env.local.corpus.build_corpus`, fixed size, seed and family
   weights, hidden questions excluded and asserted absent) and one BPE tokenizer trained on its first
   texts (:func:`ait_env.local.corpus.train_corpus_tokenizer`), shared by both models;
2. a pool of ``--jobs`` worker processes (default 2), each single-threaded: on a shared 2-core machine
   two single-threaded processes are much faster than one process with two OpenMP threads (which
   stall whenever another job holds a core), and a fixed thread count keeps the weights reproducible.
   The workers start under the catalog's float path (:data:`catalog.FLOAT_PATHS`: ``portable`` by
   default, which caps torch's and MKL's kernels at AVX2 so that CPUs of one vendor with AVX2 build the
   same weights; MKL honours its AVX2 branch on Intel CPUs only) and each model's ``ait_model.json``
   records the path it took (``float_path``, with the MKL branch that really ran).
   Every requested model pretrains in its own task (:func:`ait_env.local.pretrain.pretrain`);
3. with ``--eval`` only: as soon as a model is trained, its greedy hidden-eval scores
   (:mod:`ait_env.local.quick_eval`, all 300 questions of every family) are measured in two tasks of
   three families each, on whichever worker is free (about a minute on the critical path; the pinned
   baselines, ``scripts/seed_baselines.py``, are the scores the jobs use);
4. each model directory is written into the cache atomically (``<name>.tmp-<pid>`` renamed over
   ``<name>``) with ``ait_model.json``, and verified (:func:`ait_env.local.catalog.verify`); the build
   says whether its weights are the ones the pinned baselines were measured on (their ``model_hash``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ait_env.local import catalog

#: The hidden-eval families split in two tasks of similar cost (transcript lengths).
EVAL_GROUPS = (("calendar", "arithmetic", "persona"), ("units", "inventory", "triage"))


def prepare_data(workdir: Path, progress: bool = True) -> dict[str, Any]:
    """Corpus, tokenizer and encoded examples under ``workdir``; returns their description."""
    from ait_env.local.corpus import (CORPUS_SEED, FAMILY_WEIGHTS, build_corpus, encode_corpus,
                                      train_corpus_tokenizer)
    from ait_env.local.tokenizer import ChatTokenizer

    t0 = time.perf_counter()
    corpus = build_corpus(catalog.BUILD.corpus_per_family, seed=CORPUS_SEED + catalog.BUILD.seed, weights=FAMILY_WEIGHTS)
    tok = ChatTokenizer(train_corpus_tokenizer(corpus.texts()[:catalog.BUILD.tokenizer_sample], catalog.BUILD.vocab_size))
    examples = encode_corpus(tok, corpus.transcripts)
    lengths: dict[str, list[int]] = {}
    for t, (ids, _) in zip(corpus.transcripts, examples):
        lengths.setdefault(t.family, []).append(len(ids))
    tok.tok.save(str(workdir / "tokenizer.json"))
    with open(workdir / "examples.pkl", "wb") as f:
        pickle.dump(examples, f, protocol=pickle.HIGHEST_PROTOCOL)
    info = {"corpus_hash": corpus.hash(), "corpus_size": len(corpus.transcripts), "corpus_stats": corpus.stats(),
            "token_lengths": {k: {"mean": round(sum(v) / len(v), 1), "p95": sorted(v)[int(0.95 * len(v))],
                                  "max": max(v)} for k, v in lengths.items()},
            "seconds": round(time.perf_counter() - t0, 1)}
    if progress:
        print(f"[build] corpus: {info['corpus_size']} transcripts, hash {info['corpus_hash']}, tokenizer "
              f"{tok.vocab_size} tokens, {info['seconds']}s", flush=True)
    return info


def _load_tok(workdir: str) -> Any:
    from tokenizers import Tokenizer

    from ait_env.local.tokenizer import ChatTokenizer

    return ChatTokenizer(Tokenizer.from_file(str(Path(workdir) / "tokenizer.json")))


def _pretrain_task(name: str, workdir: str, progress: bool) -> dict[str, Any]:
    """Pretrain one model and save it (weights + tokenizer) under ``workdir/<name>``."""
    import torch

    from ait_env.local.chat import IM_START
    from ait_env.local.model import param_count
    from ait_env.local.pretrain import float_path, pretrain, save_model_dir, weights_hash

    torch.set_num_threads(catalog.BUILD.threads_per_model)
    check_float_path(catalog.BUILD.float_path)
    t0 = time.perf_counter()
    spec = catalog.CATALOG[name]
    tok = _load_tok(workdir)
    with open(Path(workdir) / "examples.pkl", "rb") as f:
        examples = pickle.load(f)
    cfg = spec.tiny_config(tok.vocab_size, tok.im_end_id, tok.pad_id, catalog.BUILD.max_position_embeddings)
    progress_file = Path(workdir) / f"{name}.progress"

    def on_step(step: int, loss: float) -> None:  # read by the parent's progress bars
        if step % 10 == 0:
            progress_file.write_text(f"{step + 1} {loss:.4f}")

    model, stats = pretrain(cfg, examples, spec.pretrain, tok.pad_id, start_id=tok.tok.token_to_id(IM_START),
                            end_id=tok.im_end_id, progress=progress, label=name, on_step=on_step)
    out = Path(workdir) / name
    save_model_dir(out, model, tok, {"name": name})
    return {"name": name, "dir": str(out), "params": param_count(model), "config": cfg.to_hf(),
            "weights_hash": weights_hash(model), "float_path": float_path(), "pretrain_stats": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in stats.items()},
            "seconds": round(time.perf_counter() - t0, 1)}


@contextmanager
def float_path_env(path: str) -> Iterator[None]:
    """Within the block, the environment carries the float path's settings (:data:`catalog.FLOAT_PATHS`),
    so the worker processes the build spawns start torch and MKL on that path; restored afterwards."""
    if path not in catalog.FLOAT_PATHS:
        raise ValueError(f"unknown float path {path!r}; choose one of {sorted(catalog.FLOAT_PATHS)}")
    saved = {k: os.environ.get(k) for k in catalog.FLOAT_PATHS[path]}
    os.environ.update(catalog.FLOAT_PATHS[path])
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_float_path(path: str) -> None:
    """Raise unless this process's torch runs the float path's kernels: torch and MKL read the settings
    once, when they start, so a process that had already used torch cannot switch. MKL's branch is set
    by the worker processes' environment at start and recorded after pretraining
    (:func:`ait_env.local.pretrain.mkl_branch`)."""
    import torch

    want = catalog.FLOAT_PATHS[path].get("ATEN_CPU_CAPABILITY")
    have = torch.backends.cpu.get_cpu_capability()
    if want and have.lower() != want.lower():
        raise RuntimeError(
            f"the build's float path {path!r} needs torch's {want.upper()} kernels, but this process runs "
            f"{have}: its settings ({catalog.FLOAT_PATHS[path]}) must be in the environment before torch "
            "starts. Build with worker processes (--jobs 1 or more), or export them and start again; a CPU "
            f"without {want.upper()} cannot take this path.")


def _eval_task(name: str, model_dir: str, families: tuple[str, ...]) -> dict[str, Any]:
    import torch

    from ait_env.local import quick_eval

    torch.set_num_threads(catalog.BUILD.threads_per_model)
    t0 = time.perf_counter()
    model, tok = quick_eval.load(model_dir)
    scores = {}
    for fam in families:
        s = quick_eval.evaluate(model, tok, fam, limit=catalog.BUILD.eval_limit)
        scores[fam] = {"score": round(s.score, 4), "ci95": round(s.ci95, 4), "ci_low": round(s.ci_low, 4),
                       "ci_high": round(s.ci_high, 4), "n": s.n, "stop_reasons": s.stop_reasons,
                       "mean_turns": round(s.mean_turns, 2), "seconds": round(s.seconds, 1)}
    return {"name": name, "scores": scores, "seconds": round(time.perf_counter() - t0, 1)}


def _finish(name: str, trained: dict[str, Any], scores: dict[str, Any], data_info: dict[str, Any],
            eval_seconds: float) -> dict[str, Any]:
    from task_families import FAMILY_NAMES

    from ait_env.local import quick_eval

    spec = catalog.CATALOG[name]
    ordered = {f: scores[f] for f in FAMILY_NAMES if f in scores}
    meta = {"name": name, "role": spec.role, "description": spec.description, "params": trained["params"],
            "config": trained["config"], "pretrain": spec.pretrain, "build_seed": catalog.BUILD.seed, "build": catalog.BUILD,
            "fingerprint": catalog.fingerprint(name), "weights_hash": trained["weights_hash"],
            "float_path": trained["float_path"],
            "corpus_hash": data_info["corpus_hash"], "corpus_size": data_info["corpus_size"],
            "corpus_stats": data_info["corpus_stats"], "token_lengths": data_info["token_lengths"],
            "pretrain_stats": trained["pretrain_stats"], "eval_max_tokens": quick_eval.LOCAL_MAX_TOKENS,
            "base_scores": ordered,
            "mean_base_score": (round(sum(v["score"] for v in ordered.values()) / len(ordered), 4) if ordered
                                else None),
            "seconds": {"pretrain": trained["seconds"], "eval": round(eval_seconds, 1)},
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    src = Path(trained["dir"])
    from ait_env.local.pretrain import jsonable

    (src / "ait_model.json").write_text(json.dumps(meta, indent=1, default=jsonable) + "\n")
    final = catalog.model_dir(name)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f"{name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(src, tmp)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return json.loads((final / "ait_model.json").read_text())


def build(names: list[str] | None = None, *, force: bool = False, jobs: int = 2,
          progress: bool = True, evaluate: bool = False) -> dict[str, dict[str, Any]]:
    """Build the given models (default: all) unless current; returns their ``ait_model.json``.

    ``jobs`` worker processes (``jobs=0``: everything in this process, one task after the other);
    ``evaluate``: also measure each model's greedy hidden-eval scores (``base_scores``)."""
    names = list(names or catalog.CATALOG)
    for n in names:
        catalog.model_dir(n)  # validates the name
    todo = [n for n in names if force or not catalog.is_current(n)]
    out: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    if todo:
        with tempfile.TemporaryDirectory(prefix="ait-build-") as wd, float_path_env(catalog.BUILD.float_path):
            info = prepare_data(Path(wd), progress)
            if jobs <= 0:
                for n in todo:
                    trained = _pretrain_task(n, wd, progress)
                    parts = [_eval_task(n, trained["dir"], g) for g in EVAL_GROUPS] if evaluate else []
                    scores = {k: v for p in parts for k, v in p["scores"].items()}
                    out[n] = _finish(n, trained, scores, info, sum(p["seconds"] for p in parts))
                    if progress:
                        _print_meta(out[n])
            else:
                out.update(_build_parallel(todo, wd, info, jobs, progress, evaluate))
    for n in names:
        out[n] = catalog.verify(n)
    if progress and todo:
        print(f"[build] built {', '.join(todo)} in {time.perf_counter() - t0:.0f}s", flush=True)
    return out


@contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Within the block, SIGTERM raises ``SystemExit(143)`` instead of killing the process outright, so
    a ``with Pool(...)`` block terminates its workers (a killed build would otherwise leave them
    pretraining for minutes, orphaned). Only in the main thread; the previous handler is restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _build_parallel(todo: list[str], wd: str, info: dict[str, Any], jobs: int,
                    progress: bool, evaluate: bool) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    ctx = mp.get_context("spawn")
    with sigterm_as_exit(), ctx.Pool(jobs) as pool:
        # the larger model first: it is on the critical path
        order = sorted(todo, key=lambda n: -catalog.CATALOG[n].hidden_size * catalog.CATALOG[n].num_hidden_layers)
        pending = {n: pool.apply_async(_pretrain_task, (n, wd, False)) for n in order}
        trained: dict[str, dict[str, Any]] = {}
        evals: dict[str, list[Any]] = {}
        bars = _ParallelBars(order, wd, progress)
        while pending or evals:
            bars.refresh(done=set(trained))
            for n, r in list(pending.items()):
                if r.ready():
                    trained[n] = r.get()
                    del pending[n]
                    if progress:
                        st = trained[n]["pretrain_stats"]
                        print(f"[build] {n}: pretrained in {trained[n]['seconds']}s ({st['steps']:.0f} steps, "
                              f"loss {st['loss_first']:.2f} -> {st['loss_last']:.3f}, {trained[n]['params']:,} "
                              f"params){'; evaluating' if evaluate else ''}", flush=True)
                    evals[n] = ([pool.apply_async(_eval_task, (n, trained[n]["dir"], g)) for g in EVAL_GROUPS]
                                if evaluate else [])
            for n, rs in list(evals.items()):
                if all(r.ready() for r in rs):
                    parts = [r.get() for r in rs]
                    scores = {k: v for p in parts for k, v in p["scores"].items()}
                    out[n] = _finish(n, trained[n], scores, info, max((p["seconds"] for p in parts), default=0.0))
                    del evals[n]
                    if progress:
                        _print_meta(out[n])
            time.sleep(0.5)
        bars.close()
    return out


class _ParallelBars:
    """One rich progress bar per model pretraining in a worker (workers write ``<name>.progress``)."""

    def __init__(self, names: list[str], workdir: str, enabled: bool) -> None:
        self.files = {n: Path(workdir) / f"{n}.progress" for n in names}
        self.prog = None
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.prog = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("loss {task.fields[loss]}"), TimeRemainingColumn())
        self.tasks = {}
        for n in names:
            spec = catalog.CATALOG[n].pretrain
            self.tasks[n] = self.prog.add_task(f"pretrain {n}", total=spec.steps + spec.drill_steps, loss="-")
        self.prog.start()

    def refresh(self, done: set[str]) -> None:
        if self.prog is None:
            return
        for n, f in self.files.items():
            if n in done:
                self.prog.update(self.tasks[n], completed=self.prog.tasks[self.tasks[n]].total)
                continue
            try:
                step, loss = f.read_text().split()
            except (OSError, ValueError):
                continue
            self.prog.update(self.tasks[n], completed=int(step), loss=loss)

    def close(self) -> None:
        if self.prog is not None:
            self.prog.stop()


def pinned_match(meta: dict[str, Any]) -> str:
    """Whether a built model's weights are the ones its pinned local baselines were measured on."""
    from ait_env.baselines import BaselineStore

    pins = [e for (_, m, _), e in BaselineStore("local").entries().items() if m == meta["name"] and e.model_hash]
    if not pins:
        return "no pinned baselines with a weights hash for this model"
    if any(not e.measured_on_other_weights(meta["weights_hash"]) for e in pins):
        return "weights match the pinned baselines"
    stale = sorted({e.model_hash for e in pins})
    fp = meta.get("float_path") or {}
    mkl = f", MKL branch {fp['mkl_branch']}" if fp.get("mkl_branch") else ""
    where = f" (built with {fp.get('cpu_capability')} kernels, torch {fp.get('torch')}{mkl})" if fp else ""
    return (f"weights differ from the pinned baselines' ({', '.join(stale)}){where}: another corpus, or the "
            "same one built on a CPU with other vector instructions or of another vendor "
            "(docs/local_backend.md, 'Reproducibility across machines'); jobs measure this model's base score "
            "themselves; python "
            "scripts/seed_baselines.py backend=local pin=true pins this build too")


def _print_meta(meta: dict[str, Any]) -> None:
    if meta["base_scores"]:
        scores = " ".join(f"{k}={v['score']:.2f}" for k, v in meta["base_scores"].items())
        scored = f", eval {meta['seconds']['eval']}s; base {scores} (mean {meta['mean_base_score']:.3f})"
    else:
        scored = " (not scored: --eval measures the base scores)"
    print(f"[build] {meta['name']} ({meta['role']}, {meta['params']:,} params): pretrain "
          f"{meta['seconds']['pretrain']}s{scored}; {pinned_match(meta)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ait_env.local.build", description=__doc__.split("\n\n")[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when the cached models are current")
    ap.add_argument("--models", default=",".join(catalog.CATALOG), help="comma-separated catalog names")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (one thread each)")
    ap.add_argument("--eval", action="store_true",
                    help="also score each model on every family's hidden set (greedy, ~1 min more)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    names = [m.strip() for m in args.models.replace(" ", ",").split(",") if m.strip()]
    metas = build(names, force=args.force, jobs=args.jobs, progress=not args.quiet, evaluate=args.eval)
    for n, m in metas.items():
        print(json.dumps({"name": n, "dir": str(catalog.model_dir(n)), "params": m.get("params"),
                          "mean_base_score": m.get("mean_base_score"),
                          "base_scores": {k: v["score"] for k, v in m.get("base_scores", {}).items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
