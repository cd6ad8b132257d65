"""A corpus of bad submissions, one per failure class: each is rejected with the expected failure,
within its time limit, and the test process is unharmed (issue: validation probe)."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("verifiers")

from ait_env.probe import ValidationProbe  # noqa: E402
from hostile import LOAD, MODEL, reference, with_env, with_job  # noqa: E402
from ait_env.probe.dynamic import DynamicProbe, DynamicSettings, probe_sandbox  # noqa: E402
from ait_env.sandbox import SandboxLimits, SandboxSettings  # noqa: E402
from ait_env.hidden.secrets import hidden_set  # noqa: E402
from task_families import get_family  # noqa: E402
from task_families.base import TOOLS_MODULE_NAME, Bounds  # noqa: E402

WALL = 6.0
FAMILY = get_family("arithmetic")
SECRET = "sk-test-SECRET-0123456789"
HIDDEN_TEXT = "HIDDEN-EVAL-CONTENT-7f3a"


@pytest.fixture(scope="module")
def sandbox():
    sb = probe_sandbox(SandboxSettings(limits=SandboxLimits(cpu_seconds=4, memory_mb=768, file_size_mb=8,
                                                      max_processes=24, wall_seconds=WALL)))
    yield sb
    sb.destroy()


@pytest.fixture(scope="module")
def probe(sandbox):
    settings = DynamicSettings(sandbox=sandbox.settings)
    return ValidationProbe(dynamic=DynamicProbe(settings, sandbox=sandbox))


@pytest.fixture(scope="module")
def task():
    bounds = Bounds(base_models=["Qwen/Qwen3-0.6B", MODEL], max_steps=200, max_batch_size=512,
                    max_group_size=32, max_seq_len=8192, max_tokens=2048)
    return FAMILY.make_task(0, bounds)


@pytest.fixture(scope="module")
def secret_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("secrets")
    hidden = d / "hidden_eval.jsonl"
    hidden.write_text('{"question": "' + HIDDEN_TEXT + '"}\n')
    hidden.chmod(0o600)
    os.environ["AIT_FAKE_API_KEY"] = SECRET
    yield {"hidden": str(hidden), "dir": str(d)}
    os.environ.pop("AIT_FAKE_API_KEY", None)


@pytest.fixture(scope="module")
def listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    hits: list[str] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                hits.append("connected")
                conn.close()
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield {"port": srv.getsockname()[1], "hits": hits}
    stop.set()
    srv.close()


RUBRIC = ("rubric = vf.Rubric(funcs=[correct_answer, calculator_use], weights=[0.9, 0.1])",)



def rubric_returning(expr: str) -> dict[str, str]:
    return with_env(replace=(RUBRIC[0], f"rubric = vf.Rubric(funcs=[lambda completion, **kw: {expr}], weights=[1.0])"))


def cases(secret_files, listener) -> dict[str, tuple[dict[str, str], str]]:
    hidden_q = [i.question for i in hidden_set("arithmetic")[:30]]
    port = listener["port"]
    return {
        # ---- static
        "unknown_key": (with_job("[prime_rl.sampling]", "[prime_rl.sampling]\ntop_p = 0.9"), "schema"),
        "max_steps_above_bound": (with_job("max_steps = 60", "max_steps = 5000"), "bounds"),
        "model_not_allowed": (with_job(f'base_model = "{MODEL}"', 'base_model = "meta/llama-70b"'), "bounds"),
        "batch_not_divisible": (with_job("batch_size = 128", "batch_size = 100"), "prime_rl"),
        "temperature_out_of_range": (with_job("temperature = 1.0", "temperature = 3.5"), "schema"),
        "toml_syntax": (with_job("[prime_rl]", "[prime_rl"), "schema"),
        "python_syntax": (with_env(suffix="\ndef broken(:\n    pass\n"), "syntax_error"),
        "forbidden_import": (with_env(prefix="import subprocess\n"), "forbidden_import"),
        "forbidden_call": (with_env(suffix="\nDATA = open('/etc/passwd').read()\n"), "forbidden_call"),
        "dunder_escape": (with_env(suffix="\nX = ().__class__.__bases__[0].__subclasses__()\n"), "forbidden_attribute"),
        "no_entrypoint": (with_env(replace=("def load_environment(", "def make_environment(")), "missing_entrypoint"),
        "missing_module": (with_job('environment = "environment.py"', 'environment = "env2.py"'), "missing_file"),
        # ---- dynamic: crashes, hangs, resources
        "import_exception": (with_env(suffix="\nraise RuntimeError('boom at import')\n"), "import_error"),
        "exit_at_import": (with_env(suffix="\nraise SystemExit(3)\n"), "exit_called"),
        "infinite_loop_import": (with_env(suffix="\nwhile True:\n    pass\n"), "hang"),
        "infinite_loop_rubric": (with_env(replace=("def correct_answer(completion, answer, **kwargs) -> float:\n",
                                                   "def correct_answer(completion, answer, **kwargs) -> float:\n"
                                                   "    while True:\n        pass\n")), "hang"),
        "memory_bomb": (with_env(replace=(LOAD, "    hog = [bytearray(50_000_000) for _ in range(100)]\n" + LOAD)),
                        "memory_limit"),
        "fork_bomb": (with_env(prefix="from verifiers.utils.client_utils import os\n",
                               replace=(LOAD, "    while True:\n        os.fork()\n" + LOAD)), None),
        "file_size_bomb": (with_env(prefix="from verifiers.utils.client_utils import os\n",
                                    replace=(LOAD, "    fd = os.open('big.bin', os.O_WRONLY | os.O_CREAT)\n"
                                                   "    while True:\n        os.write(fd, b'x' * 1_000_000)\n" + LOAD)),
                           None),
        # ---- dynamic: escapes
        "read_api_key": (with_env(prefix="from verifiers.utils.client_utils import os\n",
                                  replace=(LOAD, "    raise ValueError('key=' + repr(os.environ.get('AIT_FAKE_API_KEY')))\n"
                                           + LOAD)), "load_error"),
        "open_hidden_file": (with_env(prefix="from verifiers.utils.client_utils import os\n",
                                      replace=(LOAD, f"    fd = os.open({secret_files['hidden']!r}, os.O_RDONLY)\n"
                                                     "    raise ValueError(os.read(fd, 100))\n" + LOAD)), "load_error"),
        "connect_localhost": (with_env(prefix="from verifiers.utils.serve_utils import socket\n",
                                       replace=(LOAD, f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                                                + LOAD)), "load_error"),
        "write_outside_copy": (with_env(prefix="from verifiers.utils.client_utils import os\n",
                                        replace=(LOAD, f"    fd = os.open({secret_files['dir'] + '/pwned'!r}, "
                                                       "os.O_WRONLY | os.O_CREAT)\n" + LOAD)), "load_error"),
        # ---- dynamic: contract
        "not_an_env": (with_env(replace=("    return vf.ToolEnv(", "    return {'not': 'an env'}\n    vf.ToolEnv(")),
                       "not_verifiers_env"),
        "nan_reward": (rubric_returning("float('nan')"), "rubric_nonfinite"),
        "inf_reward": (rubric_returning("float('inf')"), "rubric_nonfinite"),
        "constant_reward": (rubric_returning("1.0"), "constant_reward"),
        "rubric_raises": (rubric_returning("1 / 0"), "rubric_error"),
        "extra_tool": (with_env(suffix="\ndef peek(x: str) -> str:\n    \"\"\"Peek.\n\n    Args:\n        x: thing.\n    \"\"\"\n"
                                       "    return x\n",
                                replace=("tools=TOOLS,", "tools=TOOLS + [peek],")), "wrong_tools"),
        "redefined_tool": (with_env(suffix="\ndef calculator(expression: str) -> str:\n    \"\"\"Fake.\n\n    Args:\n"
                                           "        expression: e.\n    \"\"\"\n    return '0'\n",
                                    replace=("tools=TOOLS,", "tools=[calculator],")), "wrong_tools"),
        # wraps the reference's build_dataset (whatever its recipe) and appends hidden questions
        "eval_copied": (with_env(suffix="\n_own_dataset = build_dataset\n\n\n"
                                        "def build_dataset(num_examples: int, seed: int) -> Dataset:\n"
                                        "    rows = _own_dataset(num_examples, seed).to_list()\n"
                                        f"    rows += [{{'question': q, 'answer': '0'}} for q in {hidden_q!r}]\n"
                                        "    return Dataset.from_list(rows)\n"), "eval_leak"),
        "oversized_prompt": (with_env(replace=('SYSTEM_PROMPT = ("Solve', 'SYSTEM_PROMPT = ("x " * 4000 + "Solve')),
                             "seq_len"),
        "tiny_dataset": (with_job("num_examples = 4000", "num_examples = 3"), "dataset_size"),
        "empty_answers": (with_env(replace=('"answer": str(value)', '"answer": ""')), "empty_answers"),
    }


def test_corpus(probe, task, tmp_path, secret_files, listener):
    corpus = cases(secret_files, listener)
    assert len(corpus) >= 25
    results = {}
    problems: list[str] = []
    for name, (files, expected) in corpus.items():
        ws = tmp_path / name
        ws.mkdir()
        for fname, text in files.items():
            (ws / fname).write_text(text)
        (ws / f"{TOOLS_MODULE_NAME}.py").write_text(FAMILY.tools_source())
        t0 = time.monotonic()
        report, job = probe.run(ws, task, FAMILY)
        elapsed = time.monotonic() - t0
        text = report.render()
        results[name] = (report, elapsed)
        codes = [f.code for f in report.failures]
        ok_codes = ({"resource_limit", "timeout", "memory_limit", "load_error", "no_result"} if expected is None
                    else {"timeout", "resource_limit"} if expected == "hang"
                    # an allocation loop may hit the CPU-time limit before the address-space limit on a
                    # loaded machine: either way a resource limit stopped it
                    else {"memory_limit", "resource_limit"} if expected == "memory_limit" else {expected})
        if report.ok or job is not None or not set(codes) & ok_codes:
            problems.append(f"{name}: expected {sorted(ok_codes)}, got {codes}\n{text[:600]}")
        if elapsed > WALL + 10:
            problems.append(f"{name}: took {elapsed:.1f} s")
        if SECRET in text or HIDDEN_TEXT in text:
            problems.append(f"{name}: a secret leaked into the report")
        if not all(f.where and f.message for f in report.failures):
            problems.append(f"{name}: a failure without where/message")
    assert not problems, "\n\n".join(problems)
    assert not listener["hits"], "sandboxed code reached a socket on the host's 127.0.0.1"
    assert not Path(secret_files["dir"], "pwned").exists()
    assert "key=None" in results["read_api_key"][0].render()


def _reference_workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ok"
    ws.mkdir()
    for fname, text in reference().items():
        (ws / fname).write_text(text)
    return ws


def test_reference_passes_and_sandbox_survives(probe, task, tmp_path):
    # after every attack above (module-scoped sandbox), a good job still validates
    report, job = probe.run(_reference_workspace(tmp_path), task, FAMILY)
    assert report.ok and job is not None, report.render()
    assert report.stages_run == ["static", "dynamic"] and report.sandbox


def test_other_processes_of_the_sandbox_uid_never_change_a_verdict(probe, sandbox, task, tmp_path):
    """Every sandbox drops to one uid, and RLIMIT_NPROC counts that uid's processes and threads machine-wide:
    other sandboxes' work (a local job's rollout worker beside a probe) made a good job's rollouts fail with
    "can't start new thread" (CI, 2026-12-05). With a pids cgroup holding the sandbox, that cgroup alone caps it."""
    import subprocess

    from ait_env.sandbox.zygote import UNPRIVILEGED

    from ait_env.sandbox.jail import cgroup_for

    if os.getuid() != 0:
        pytest.skip("needs root (to run processes as the sandbox uid)")
    probe_cg = subprocess.Popen(["sleep", "5"])
    cg, _ = cgroup_for(probe_cg.pid, 8)
    probe_cg.kill()
    probe_cg.wait()
    if cg is None:
        pytest.skip("no writable pids cgroup here: RLIMIT_NPROC is the only cap, shared by the sandbox uid")
    cg.rmdir()
    others = [subprocess.Popen(["sleep", "120"], preexec_fn=lambda: os.setuid(UNPRIVILEGED))
              for _ in range(sandbox.settings.limits.max_processes + 8)]
    try:
        report, job = probe.run(_reference_workspace(tmp_path), task, FAMILY)
        assert report.ok and job is not None, report.render()
    finally:
        for p in others:
            p.kill()
            p.wait()


def test_prompt_tokens_are_counted_with_the_models_tokenizer_on_openai_tool_schemas(sandbox, task, tmp_path):
    # a backend with tokenizers (local) hands the probe its counter; the probe must hand it the
    # environment's tools as OpenAI-style schemas (dicts), whatever verifiers' own tool type is
    seen: list[tuple[str, list, list]] = []

    def counter(model, messages, tools):
        seen.append((model, messages, tools))
        return 10_000 if model == MODEL else None  # more than any seq_len bound: the probe must say so

    probe = ValidationProbe(dynamic=DynamicProbe(DynamicSettings(sandbox=sandbox.settings), sandbox=sandbox,
                                                 token_counter=counter))
    ws = tmp_path / "count"
    ws.mkdir()
    for fname, text in reference().items():
        (ws / fname).write_text(text)
    report, job = probe.run(ws, task, FAMILY)
    assert seen, "the backend's counter was not used"
    model, messages, tools = seen[-1]
    assert model == MODEL and messages and all(isinstance(m, dict) for m in messages)
    assert sorted(t["function"]["name"] for t in tools) == sorted(FAMILY.tool_names)
    assert not report.ok and "counted with the model's tokenizer" in report.render()


FALLBACK_CASES = ["read_api_key", "open_hidden_file", "connect_localhost", "write_outside_copy", "fork_bomb",
                  "import_exception", "constant_reward"]


def test_fallback_mode_is_loud_and_still_blocks_escapes(task, tmp_path, secret_files, listener, capfd):
    sb = probe_sandbox(SandboxSettings(mode="fallback", limits=SandboxLimits(cpu_seconds=4, memory_mb=768,
                                                                       file_size_mb=8, max_processes=24,
                                                                       wall_seconds=WALL)))
    probe = ValidationProbe(dynamic=DynamicProbe(DynamicSettings(sandbox=sb.settings), sandbox=sb))
    try:
        corpus = cases(secret_files, listener)
        for name in FALLBACK_CASES:
            files, expected = corpus[name]
            ws = tmp_path / name
            ws.mkdir()
            for fname, text in files.items():
                (ws / fname).write_text(text)
            report, job = probe.run(ws, task, FAMILY)
            text = report.render()
            assert not report.ok, name
            assert SECRET not in text and HIDDEN_TEXT not in text, (name, text)
            assert report.sandbox.startswith("fallback"), report.sandbox
        assert "WEAKER MODE" in capfd.readouterr().err
        assert not listener["hits"]
        assert not Path(secret_files["dir"], "pwned").exists()
    finally:
        sb.destroy()
