"""Build the local base models: ``python -m cpu.tiny_models.build [--force] [--eval] [--models a,b]``.

Contract: models that are current (:func:`cpu.tiny_models.catalog.is_current`) are kept, and when all the
requested ones are the command prints one line (``local models current: ... (cached in <dir>)``) and
exits; otherwise it builds the others and says at each phase what it does:

1. in this process, once: the flawed-teacher corpus (:func:`cpu.tiny_models.corpus.build_corpus`, fixed
   size, seed and family weights, hidden questions excluded and asserted absent), one BPE tokenizer
   trained on its first texts (:func:`cpu.tiny_models.corpus.train_corpus_tokenizer`) and the encoded
   examples, shared by every model through the build's work folder;
2. a pool of ``--jobs`` worker processes (default 2), each single-threaded: on a shared 2-core machine
   two single-threaded processes are much faster than one process with two OpenMP threads (which stall
   whenever another job holds a core), and a fixed thread count keeps the weights reproducible. The
   workers start under the catalog's float path (:data:`catalog.FLOAT_PATHS`: ``portable`` by default,
   which caps torch's and MKL's kernels at AVX2 so that CPUs of one vendor with AVX2 build the same
   weights; MKL honours its AVX2 branch on Intel CPUs only) and each model's ``ait_model.json`` records
   the path it took (``float_path``, with the MKL branch that really ran);
3. every requested model pretrains in its own task (:func:`cpu.tiny_models.pretrain.pretrain`), the
   larger first (it is on the critical path). Progress (:class:`BuildProgress`): on a terminal one bar
   per model; when output goes to a file or a pipe, one plain line per model every 30 seconds (step,
   loss, elapsed, time left);
4. with ``--eval`` only: as soon as a model is trained, its greedy hidden-eval scores
   (:mod:`cpu.tiny_models.quick_eval`, all 300 questions of every family) are measured in two tasks of
   three families each, on whichever worker is free (about a minute on the critical path; the pinned
   baselines, ``scripts/seed_baselines.py``, are the scores the jobs use);
5. each model directory is written into the cache atomically (``<name>.tmp-<pid>`` renamed over
   ``<name>``) with ``ait_model.json``, and verified (:func:`cpu.tiny_models.catalog.verify`); one line per
   model says whether its weights are the ones the pinned baselines were measured on (their
   ``model_hash``, :func:`pinned_match`).

Where the time goes (2 cores): pretraining the larger model is ~96% of the wall time; the data take
~10 s (corpus ~3 s, tokenizer ~0.5 s, encoding ~5 s, which already uses both cores).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from cpu.tiny_models import catalog
from ait_env.processes import sigterm_as_exit

#: The hidden-eval families split in two tasks of similar cost (transcript lengths).
EVAL_GROUPS = (("calendar", "arithmetic", "persona"), ("units", "inventory", "triage"))


def prepare_data(workdir: Path, report: BuildProgress | None = None) -> dict[str, Any]:
    """Corpus, tokenizer and encoded examples under ``workdir``; returns their description. Says each
    phase on ``report``."""
    from cpu.tiny_models.corpus import (CORPUS_SEED, FAMILY_WEIGHTS, build_corpus, encode_corpus,
                                      train_corpus_tokenizer)
    from cpu.tiny_models.tokenizer import ChatTokenizer

    say = report.line if report is not None else (lambda text: None)
    t0 = t = time.perf_counter()
    corpus = build_corpus(catalog.BUILD.corpus_per_family, seed=CORPUS_SEED + catalog.BUILD.seed,
                          weights=FAMILY_WEIGHTS)
    say(f"[build] corpus: {len(corpus.transcripts):,} transcripts, hash {corpus.hash()}, "
        f"{time.perf_counter() - t:.1f}s")
    t = time.perf_counter()
    tok = ChatTokenizer(train_corpus_tokenizer(corpus.texts()[:catalog.BUILD.tokenizer_sample],
                                               catalog.BUILD.vocab_size))
    say(f"[build] tokenizer: {tok.vocab_size:,} tokens, {time.perf_counter() - t:.1f}s")
    t = time.perf_counter()
    examples = encode_corpus(tok, corpus.transcripts)
    lengths: dict[str, list[int]] = {}
    for tr, (ids, _) in zip(corpus.transcripts, examples):
        lengths.setdefault(tr.family, []).append(len(ids))
    tok.tok.save(str(workdir / "tokenizer.json"))
    with open(workdir / "examples.pkl", "wb") as f:
        pickle.dump(examples, f, protocol=pickle.HIGHEST_PROTOCOL)
    say(f"[build] encoded: {sum(len(ids) for ids, _ in examples):,} tokens, {time.perf_counter() - t:.1f}s")
    return {"corpus_hash": corpus.hash(), "corpus_size": len(corpus.transcripts),
            "corpus_stats": corpus.stats(),
            "token_lengths": {k: {"mean": round(sum(v) / len(v), 1), "p95": sorted(v)[int(0.95 * len(v))],
                                  "max": max(v)} for k, v in lengths.items()},
            "seconds": round(time.perf_counter() - t0, 1)}


def _load_tok(workdir: str) -> Any:
    from tokenizers import Tokenizer

    from cpu.tiny_models.tokenizer import ChatTokenizer

    return ChatTokenizer(Tokenizer.from_file(str(Path(workdir) / "tokenizer.json")))


def progress_path(workdir: str | Path, name: str) -> Path:
    """The file a pretraining task writes its progress to: ``step total loss seconds`` (one line)."""
    return Path(workdir) / f"{name}.progress"


def _pretrain_task(name: str, workdir: str, on_progress: Callable[[], None] | None = None) -> dict[str, Any]:
    """Pretrain one model and save it (weights + tokenizer) under ``workdir/<name>``; its progress goes to
    :func:`progress_path` every 10 steps and at the last one (then ``on_progress``, in-process builds)."""
    import torch

    from cpu.tiny_models.chat import IM_START
    from cpu.tiny_models.model import param_count
    from cpu.tiny_models.pretrain import float_path, pretrain, save_model_dir, weights_hash

    torch.set_num_threads(catalog.BUILD.threads_per_model)
    check_float_path(catalog.BUILD.float_path)
    t0 = time.perf_counter()
    spec = catalog.CATALOG[name]
    tok = _load_tok(workdir)
    with open(Path(workdir) / "examples.pkl", "rb") as f:
        examples = pickle.load(f)
    cfg = spec.tiny_config(tok.vocab_size, tok.im_end_id, tok.pad_id, catalog.BUILD.max_position_embeddings)
    out_file = progress_path(workdir, name)
    total = spec.pretrain.steps + spec.pretrain.drill_steps

    def write(step: int, of: int, loss: float) -> None:  # read by the parent (BuildProgress)
        tmp = out_file.with_suffix(".tmp")
        tmp.write_text(f"{step} {of} {loss:.4f} {time.perf_counter() - t0:.1f}")
        os.replace(tmp, out_file)  # the reader never sees a partial line
        if on_progress is not None:
            on_progress()

    def on_step(step: int, loss: float) -> None:
        if step % 10 == 0:
            write(step + 1, total, loss)

    model, stats = pretrain(cfg, examples, spec.pretrain, tok.pad_id, start_id=tok.tok.token_to_id(IM_START),
                            end_id=tok.im_end_id, progress=False, label=name, on_step=on_step)
    write(stats["steps"], stats["steps"], stats["loss_last"])  # the final state, whatever the last write was
    out = Path(workdir) / name
    save_model_dir(out, model, tok, {"name": name})
    return {"name": name, "dir": str(out), "params": param_count(model), "config": cfg.to_hf(),
            "weights_hash": weights_hash(model), "float_path": float_path(),
            "pretrain_stats": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in stats.items()},
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
    (:func:`cpu.tiny_models.pretrain.mkl_branch`)."""
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

    from cpu.tiny_models import quick_eval

    torch.set_num_threads(catalog.BUILD.threads_per_model)
    t0 = time.perf_counter()
    model, tok = quick_eval.load_dir(model_dir)
    scores = {}
    for fam in families:
        s = quick_eval.score_in_process(model, tok, fam, limit=catalog.BUILD.eval_limit)
        scores[fam] = {"score": round(s.score, 4), "ci95": round(s.ci95, 4), "ci_low": round(s.ci_low, 4),
                       "ci_high": round(s.ci_high, 4), "n": s.n, "stop_reasons": s.stop_reasons,
                       "mean_turns": round(s.mean_turns, 2), "seconds": round(s.seconds, 1)}
    return {"name": name, "scores": scores, "seconds": round(time.perf_counter() - t0, 1)}


def _finish(name: str, trained: dict[str, Any], scores: dict[str, Any], data_info: dict[str, Any],
            eval_seconds: float) -> dict[str, Any]:
    from task_families import FAMILY_NAMES

    from cpu.tiny_models import quick_eval

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
    from cpu.tiny_models.pretrain import jsonable

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


def build(names: list[str] | None = None, *, force: bool = False, jobs: int = 2, progress: bool = True,
          evaluate: bool = False, stream: TextIO | None = None) -> dict[str, dict[str, Any]]:
    """Build the given models (default: all) unless current; returns their ``ait_model.json``.

    ``jobs`` worker processes (``jobs=0``: everything in this process, one task after the other);
    ``evaluate``: also measure each model's greedy hidden-eval scores (``base_scores``); ``progress``:
    say what happens on ``stream`` (default stdout; see :class:`BuildProgress`)."""
    names = list(names or catalog.CATALOG)
    for n in names:
        catalog.model_dir(n)  # validates the name
    todo = [n for n in names if force or not catalog.is_current(n)]
    out: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    if todo:
        with tempfile.TemporaryDirectory(prefix="ait-build-") as wd, float_path_env(catalog.BUILD.float_path):
            report = BuildProgress(wd, enabled=progress, stream=stream)
            report.line(f"[build] building {', '.join(todo)} (cache: {catalog.cache_root()}): data, then "
                        "pretraining")
            try:
                if jobs <= 0:
                    info = prepare_data(Path(wd), report)
                    for n in todo:
                        report.start([n])
                        trained = _pretrain_task(n, wd, on_progress=report.refresh)
                        report.done(n, trained_line(trained, evaluate))
                        parts = [_eval_task(n, trained["dir"], g) for g in EVAL_GROUPS] if evaluate else []
                        scores = {k: v for p in parts for k, v in p["scores"].items()}
                        out[n] = _finish(n, trained, scores, info, sum(p["seconds"] for p in parts))
                        report.line(model_line(out[n]))
                else:
                    out.update(_build_parallel(todo, wd, jobs, report, evaluate))
            finally:
                report.close()
    for n in names:
        out[n] = catalog.verify(n)
    if progress:
        said = (f"[build] built {', '.join(todo)} in {_duration(time.perf_counter() - t0)}" if todo
                else f"local models current: {', '.join(names)} (cached in {catalog.cache_root()})")
        print(said, file=stream or sys.stdout, flush=True)
    return out


def _build_parallel(todo: list[str], wd: str, jobs: int, report: BuildProgress,
                    evaluate: bool) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    # the data first, then the pool: starting the workers (torch's import) during the data phase gained
    # nothing measurable on 2 busy cores (both are CPU-bound)
    info = prepare_data(Path(wd), report)
    ctx = mp.get_context("spawn")
    with sigterm_as_exit(), ctx.Pool(jobs) as pool:
        # the larger model first: it is on the critical path
        order = sorted(todo, key=lambda n: -catalog.CATALOG[n].hidden_size * catalog.CATALOG[n].num_hidden_layers)
        pending = {n: pool.apply_async(_pretrain_task, (n, wd)) for n in order}
        trained: dict[str, dict[str, Any]] = {}
        evals: dict[str, list[Any]] = {}
        report.start(order, workers=min(jobs, len(order)))
        while pending or evals:
            report.refresh()
            for n, r in list(pending.items()):
                if r.ready():
                    trained[n] = r.get()
                    del pending[n]
                    report.done(n, trained_line(trained[n], evaluate))
                    evals[n] = ([pool.apply_async(_eval_task, (n, trained[n]["dir"], g)) for g in EVAL_GROUPS]
                                if evaluate else [])
            for n, rs in list(evals.items()):
                if all(r.ready() for r in rs):
                    parts = [r.get() for r in rs]
                    scores = {k: v for p in parts for k, v in p["scores"].items()}
                    out[n] = _finish(n, trained[n], scores, info, max((p["seconds"] for p in parts), default=0.0))
                    del evals[n]
                    report.line(model_line(out[n]))
            if pending or evals:
                time.sleep(0.5)
    return out


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class BuildProgress:
    """What a build shows while it runs, on ``stream`` (stdout by default); nothing when not ``enabled``.

    - :meth:`line`: a phase line (``[build] corpus: ...``), printed as it happens.
    - Pretraining progress is read from the files the tasks write (:func:`progress_path`). On a terminal:
      one rich bar per model, set to its total when the model is done (:meth:`done`). Anywhere else (a
      file or a pipe, where rich would draw the bars only when they stop): one plain line per model
      every ``every`` seconds, ``[build] ait-tiny-m: step 420/1800, loss 0.512, 1m35s elapsed, about
      5m10s left``.
    - ``clock`` gives the seconds of the plain lines' cadence (tests pass their own).
    """

    def __init__(self, workdir: str | Path, *, enabled: bool = True, stream: TextIO | None = None,
                 every: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.workdir = Path(workdir)
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout
        self.tty = enabled and bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = every
        self.clock = clock
        self.names: list[str] = []
        self.finished: set[str] = set()
        self.last_line: dict[str, float] = {}
        self.prog: Any = None
        self.tasks: dict[str, Any] = {}

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.prog is not None:  # above the live bars
            self.prog.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, file=self.stream, flush=True)

    def start(self, names: list[str], workers: int = 0) -> None:
        """Pretraining of ``names`` begins (in ``workers`` processes, 0: in this one)."""
        self.names += [n for n in names if n not in self.names]
        now = self.clock()
        for n in names:
            self.last_line[n] = now
        steps = ", ".join(f"{n} ({self._total(n):,} steps)" for n in names)
        where = f" in {workers} worker processes, one thread each" if workers else ""
        self.line(f"[build] pretraining {steps}{where}")
        if not self.tty or not self.enabled:
            return
        if self.prog is None:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self.prog = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(),
                                 TimeRemainingColumn(), console=Console(file=self.stream))
            self.prog.start()
        for n in names:
            self.tasks[n] = self.prog.add_task(f"pretrain {n}", total=self._total(n), loss="-")

    @staticmethod
    def _total(name: str) -> int:
        spec = catalog.CATALOG[name].pretrain
        return spec.steps + spec.drill_steps

    def read(self, name: str) -> tuple[int, int, str, float] | None:
        """(step, total, loss, seconds) from the model's progress file, None before the first write."""
        try:
            step, total, loss, seconds = progress_path(self.workdir, name).read_text().split()
            return int(step), int(total), loss, float(seconds)
        except (OSError, ValueError):
            return None

    def refresh(self) -> None:
        if not self.enabled:
            return
        now = self.clock()
        for n in self.names:
            if n in self.finished:
                continue
            got = self.read(n)
            if got is None:
                continue
            step, total, loss, seconds = got
            if self.prog is not None:
                self.prog.update(self.tasks[n], completed=step, total=total, loss=loss)
            elif now - self.last_line[n] >= self.every:
                self.last_line[n] = now
                left = seconds / max(step, 1) * (total - step)
                self.line(f"[build] {n}: step {step:,}/{total:,}, loss {loss}, {_duration(seconds)} elapsed, "
                          f"about {_duration(left)} left")

    def done(self, name: str, summary: str) -> None:
        """``name`` finished pretraining: its bar shows the final state; ``summary`` is printed."""
        self.finished.add(name)
        if self.prog is not None and name in self.tasks:
            got = self.read(name)
            task = self.tasks[name]
            total = got[1] if got else self._total(name)
            self.prog.update(task, completed=total, total=total, **({"loss": got[2]} if got else {}))
        self.line(summary)

    def close(self) -> None:
        if self.prog is not None:
            self.prog.refresh()
            self.prog.stop()
            self.prog = None


def trained_line(trained: dict[str, Any], evaluate: bool) -> str:
    """One line for a pretrained model (before it is written to the cache)."""
    st = trained["pretrain_stats"]
    scoring = "; scoring it on the hidden sets" if evaluate else ""
    return (f"[build] {trained['name']}: pretrained in {_duration(trained['seconds'])} "
            f"({st['steps']:,} steps, loss {st['loss_first']:.2f} -> {st['loss_last']:.3f}){scoring}")


def pinned_match(meta: dict[str, Any]) -> str:
    """Whether a built model's weights are the ones its pinned local baselines were measured on, and
    what follows from it; one short clause."""
    from ait_env.hidden.baselines import BaselineStore

    pins = [e for (_, m, _), e in BaselineStore("local").entries().items() if m == meta["name"] and e.model_hash]
    if not pins:
        return "no pinned baselines for this model; jobs measure its untrained score themselves"
    if any(not e.measured_on_other_weights(meta["weights_hash"]) for e in pins):
        return "weights match the pinned baselines"
    return ("weights differ from the pinned build's (another CPU or corpus); the first job of each family "
            "measures its untrained score and pins it for this build (or measure them all at once into your own "
            "store, runs/baselines/local.json: python scripts/seed_baselines.py backend=local)")


def model_line(meta: dict[str, Any]) -> str:
    """One line for a model written to the cache: size, weights hash, whether they are the pinned ones,
    and its base scores when the build measured them."""
    scores = ""
    if meta["base_scores"]:
        each = " ".join(f"{k}={v['score']:.2f}" for k, v in meta["base_scores"].items())
        scores = f"; base scores {each} (mean {meta['mean_base_score']:.3f})"
    return (f"[build] {meta['name']} ({meta['role']}, {meta['params']:,} params, weights "
            f"{meta['weights_hash']}): {pinned_match(meta)}{scores}")


def ensure_built(name: str, *, force: bool = False, progress: bool = True) -> Path:
    """The model's directory, built first when missing, stale or ``force``; always verified."""
    d = catalog.model_dir(name)
    if force or not catalog.is_current(name):
        build([name], force=True, progress=progress)
    catalog.verify(name)
    return d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cpu.tiny_models.build", description=__doc__.split("\n\n")[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when the cached models are current")
    ap.add_argument("--models", default=",".join(catalog.CATALOG), help="comma-separated catalog names")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (one thread each)")
    ap.add_argument("--eval", action="store_true",
                    help="also score each model on every family's hidden set (greedy, ~1 min more)")
    ap.add_argument("--json", action="store_true",
                    help="then print one JSON line per model (name, dir, weights hash, scores)")
    ap.add_argument("--quiet", action="store_true", help="print nothing but errors (and --json's lines)")
    args = ap.parse_args(argv)
    from ait_env.hidden.secrets import use_hidden_seeds

    use_hidden_seeds("published")   # the pinned build: its corpus, fingerprint and --eval scores (also in workers)
    names = [m.strip() for m in args.models.replace(" ", ",").split(",") if m.strip()]
    metas = build(names, force=args.force, jobs=args.jobs, progress=not args.quiet, evaluate=args.eval)
    if args.json:
        for n, m in metas.items():
            print(json.dumps({"name": n, "dir": str(catalog.model_dir(n)), "params": m.get("params"),
                              "weights_hash": m.get("weights_hash"),
                              "mean_base_score": m.get("mean_base_score"),
                              "base_scores": {k: v["score"] for k, v in m.get("base_scores", {}).items()}}))
    return 0


if __name__ == "__main__":
    # the canonical module's main, not this __main__ copy's: one class object per exception and type
    from ait_env.extras import missing_extras_exit

    with missing_extras_exit("python -m cpu.tiny_models.build"):  # a missing extra: one line, exit 3
        from cpu.tiny_models.build import main as _main

        raise SystemExit(_main())
