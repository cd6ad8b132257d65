"""Static stage of the validation probe: nothing the agent wrote is executed.

Checks, in order, collecting every failure (not only the first):
1. ``job.toml`` exists, is TOML, matches the schema (unknown keys rejected) and the task's bounds;
2. the environment module named by ``[job] environment`` exists, and every ``.py`` file parses;
3. the environment module defines a top-level ``load_environment``;
4. imports are on the allow-list: a stdlib subset, ``verifiers``, ``datasets``, the family's tool
   module and the workspace's own modules; obviously dangerous builtins and dunder escapes are refused;
5. file sizes and counts are within the workspace quotas;
6. no top-level module or package of the workspace is named like an importable module (the standard
   library, installed packages, prime-rl's dependencies): the code prime-rl imports must be the code
   that was validated; and no module or folder name changes under Unicode NFKC normalisation (Python
   normalises identifiers, so ``ｆamily_tools`` is imported as ``family_tools``: a name that aliases the
   family's module, an installed one or another file).
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import sys
import unicodedata
from pathlib import Path

from ait_env.jobs.bundle import shadows_tools
from ait_env.jobs.primerl import PRIME_RL_ENV_MODULES, PRIME_RL_TAG, config_rules, renderer_for
from ait_env.jobs.schema import Job, check_bounds, load_toml, validate_job
from ait_env.probe.report import ProbeFailure
from ait_env.sandbox.workspace import WorkspaceQuota
from task_families.base import AST_LOCK, TOOLS_MODULE_NAME, Bounds

ALLOWED_STDLIB = frozenset({
    "__future__", "abc", "bisect", "calendar", "collections", "copy", "dataclasses", "datetime",
    "decimal", "enum", "fractions", "functools", "hashlib", "heapq", "itertools", "json", "math",
    "numbers", "operator", "random", "re", "statistics", "string", "textwrap", "typing",
    "typing_extensions", "unicodedata",
})
ALLOWED_THIRD_PARTY = frozenset({"verifiers", "datasets"})
_OWN_PACKAGES = frozenset({"ait_env", "task_families", "gpu", "trainers", "benchmarks", "research", "scripts",
                           "tests", "examples"})
_CHECKOUT = Path(__file__).resolve().parents[2]
#: parsing is serialized with every other Python parse of the process (task_families.base.AST_LOCK)
_PARSE_LOCK = AST_LOCK
FORBIDDEN_CALLS = frozenset({"__import__", "eval", "exec", "compile", "open", "breakpoint", "input",
                             "globals", "vars", "memoryview"})
FORBIDDEN_ATTRS = frozenset({"__subclasses__", "__globals__", "__builtins__", "__code__", "__closure__",
                             "__import__", "__loader__", "__spec__", "__dict__", "__class__", "__bases__",
                             "__mro__", "f_globals", "f_locals", "gi_frame", "tb_frame"})


def _fail(code: str, where: str, message: str, fix: str = "") -> ProbeFailure:
    return ProbeFailure(stage="static", code=code, where=where, message=message, fix=fix)


def _check_module(path: str, tree: ast.AST, local_modules: set[str]) -> list[ProbeFailure]:
    out: list[ProbeFailure] = []
    allowed = ALLOWED_STDLIB | ALLOWED_THIRD_PARTY | {TOOLS_MODULE_NAME} | local_modules
    allowed_text = ", ".join(sorted(ALLOWED_THIRD_PARTY | {TOOLS_MODULE_NAME})) + " and the stdlib modules " \
        + ", ".join(sorted(ALLOWED_STDLIB - {"__future__", "typing_extensions"}))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                names = []  # relative import of a workspace module
            else:
                names = [node.module or ""]
        for name in names:
            top = name.split(".")[0]
            if top not in allowed:
                out.append(_fail("forbidden_import", f"{path}:{node.lineno}",
                                 f"import of {name!r} is not allowed",
                                 f"Only these imports are allowed: {allowed_text}."))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            out.append(_fail("forbidden_call", f"{path}:{node.lineno}", f"call to {node.func.id}() is not allowed",
                             "Environments must not read files, execute strings or import dynamically; "
                             "build data in code."))
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRS:
            out.append(_fail("forbidden_attribute", f"{path}:{node.lineno}",
                             f"access to {node.attr!r} is not allowed", "Remove the introspection."))
        if isinstance(node, ast.Name) and node.id in {"__builtins__", "__loader__", "__spec__"}:
            out.append(_fail("forbidden_attribute", f"{path}:{node.lineno}",
                             f"use of {node.id!r} is not allowed", "Remove the introspection."))
    return out


def _importable(name: str) -> bool:
    """Whether ``import name`` finds something where the job runs: the standard library, anything
    installed in this interpreter (the current folder and the project checkout left out), prime-rl's
    own dependencies, and this project's packages."""
    if name in sys.stdlib_module_names or name in sys.builtin_module_names or name in PRIME_RL_ENV_MODULES:
        return True
    if name in _OWN_PACKAGES or name.startswith("ait_"):
        return True
    here = {"", os.getcwd(), str(_CHECKOUT)}
    # a job package imported in this process (tests) puts its own folder on sys.path: not an install
    path = [p for p in sys.path if p not in here and not Path(p).name.startswith("ait_job_")]
    try:
        return importlib.machinery.PathFinder.find_spec(name, path) is not None
    except (ImportError, ValueError):
        return True


def _shadowing(rel: dict[str, Path]) -> list[ProbeFailure]:
    """Top-level module and package names of the workspace that an installed module also has: prime-rl
    imports the job's package next to its own dependencies, so which of the two an import reaches
    would depend on what was imported first."""
    out: list[ProbeFailure] = []
    tops: dict[str, str] = {}
    for name in rel:
        first = name.split("/")[0]
        if "/" in name:
            tops.setdefault(first, first + "/")
        elif name.endswith(".py"):
            tops.setdefault(name[:-3], name)
    for name in sorted({n.split("/")[0] + ("/" if "/" in n else "") for n in rel if shadows_tools(n)}):
        out.append(_fail("tools_shadowed", name, f"{name!r} would be imported as {TOOLS_MODULE_NAME!r} instead of "
                         f"the family's own {TOOLS_MODULE_NAME}.py (the inner model's tools must be the family's, "
                         "unchanged in training and in the hidden eval)",
                         f"Remove or rename it; import the tools with `from {TOOLS_MODULE_NAME} import TOOLS`."))
    aliases = sorted({part for name in rel if name.endswith(".py") or "/" in name
                      for part in name.split("/")[:-1] + [name.split("/")[-1].removesuffix(".py")]
                      if unicodedata.normalize("NFKC", part) != part})
    for part in aliases:
        out.append(_fail("module_name", part, f"{part!r} is not in Unicode normal form NFKC: Python imports it as "
                         f"{unicodedata.normalize('NFKC', part)!r} (it normalises identifiers), so the name can "
                         f"alias another module ({TOOLS_MODULE_NAME!r}, an installed package or another file)",
                         "Rename it with plain ASCII letters, digits and underscores, and update job.environment "
                         "and your imports."))
    for module, where in sorted(tops.items()):
        if module == TOOLS_MODULE_NAME or not module.isidentifier() or module in aliases:
            continue
        if _importable(module):
            out.append(_fail("module_name", where, f"{module!r} is also the name of an installed module; an "
                             "import of it could load that module instead of your file (or the reverse)",
                             f"Rename it, e.g. to 'my_{module}', and update job.environment and your imports."))
    return out


def run_static(root: Path, bounds: Bounds, family: str,
               quota: WorkspaceQuota | None = None) -> tuple[Job | None, bool, list[ProbeFailure]]:
    """Run the static checks on a workspace directory.

    Returns ``(job, parsable, failures)``; ``job`` is None when job.toml did not match the schema (a job
    that breaks a prime-rl rule is returned with that failure), and ``parsable`` says whether job.toml
    was TOML and every Python file parsed.
    """
    quota = quota or WorkspaceQuota()
    failures: list[ProbeFailure] = []
    parsable = True
    files = sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink())
    rel = {p.relative_to(root).as_posix(): p for p in files if "__pycache__" not in p.parts}

    # 5. quotas (cheap, first so a bloated workspace is reported even if other checks pass)
    if len(rel) > quota.max_files:
        failures.append(_fail("quota", "workspace", f"{len(rel)} files (limit {quota.max_files})",
                              "Delete files you do not need."))
    total = 0
    for name, p in rel.items():
        if p.is_symlink():
            failures.append(_fail("symlink", name, "symbolic links are not allowed", "Remove it."))
            continue
        size = p.stat().st_size
        total += size
        if size > quota.max_file_bytes:
            failures.append(_fail("quota", name, f"{size} bytes (limit {quota.max_file_bytes})",
                                  "Generate data in code instead of inlining it."))
    if total > quota.max_total_bytes:
        failures.append(_fail("quota", "workspace", f"{total} bytes in all (limit {quota.max_total_bytes})",
                              "Shorten your files."))

    # 1. job.toml
    job: Job | None = None
    if "job.toml" not in rel:
        parsable = False
        failures.append(_fail("missing_file", "job.toml", "job.toml is missing",
                              "Write job.toml (see INSTRUCTIONS.md)."))
    else:
        try:
            text = rel["job.toml"].read_text(encoding="utf-8")
        except UnicodeDecodeError:
            text = None
            parsable = False
            failures.append(_fail("encoding", "job.toml", "job.toml is not UTF-8", "Rewrite it as text."))
        if text is not None:
            raw, issues = load_toml(text)
            if raw is None:
                parsable = False
            else:
                job, issues = validate_job(raw)
            for iss in issues:
                failures.append(_fail("schema", iss.where, iss.message, iss.fix))
            if job is not None:
                for iss in check_bounds(job, bounds, family):
                    failures.append(_fail("bounds", iss.where, iss.message, iss.fix))
            if raw is not None:  # prime-rl's own rules, reported together with the schema's issues
                model = raw["job"].get("base_model") if isinstance(raw.get("job"), dict) else None
                override = bounds.model_renderers.get(model) if isinstance(model, str) else None
                ours = isinstance(model, str) and model in bounds.base_models and override is None \
                    and renderer_for(model) is None
                if ours:   # a model the backend offers and its executor cannot render: our configuration
                    failures.append(_fail(
                        "backend_config", "job.toml: job.base_model",
                        f"the backend offers base_model {model!r}, but the trainer executor it runs has no chat "
                        f"renderer for it (prime-rl {PRIME_RL_TAG}'s map does not know it and the backend "
                        "names none): a configuration error on our side, not in your job",
                        "Nothing to fix in your job; this is not counted against you."))
                for iss in config_rules(raw, renderer_override=override):
                    if ours and iss.where == "job.toml: job.base_model":
                        continue
                    if not any(f.where == iss.where and f.code in ("bounds", "schema") for f in failures):
                        failures.append(_fail("prime_rl", iss.where, iss.message, iss.fix))

    failures.extend(_shadowing(rel))

    # 2-4. Python sources
    local_modules = {Path(n).stem for n in rel if n.endswith(".py") and "/" not in n}
    local_modules |= {n.split("/")[0] for n in rel if "/" in n}
    trees: dict[str, ast.AST] = {}
    for name, p in rel.items():
        if not name.endswith(".py") or p.is_symlink():
            continue
        if name == f"{TOOLS_MODULE_NAME}.py":
            continue  # ours, read-only; replaced by the family's copy when the job is bundled
        try:
            source = p.read_text(encoding="utf-8")
            with _PARSE_LOCK:  # CPython 3.11's AST constructor is not thread-safe (envs step in threads)
                tree = ast.parse(source, filename=name)
                compile(tree, name, "exec")  # compile-time errors ast.parse lets through (__future__ placement)
            trees[name] = tree
        except UnicodeDecodeError:
            parsable = False
            failures.append(_fail("encoding", name, "not UTF-8 text", "Rewrite the file as text."))
        except SyntaxError as exc:
            parsable = False
            failures.append(_fail("syntax_error", f"{name}:{exc.lineno}", f"{exc.msg}",
                                  "Fix the Python syntax (read_file the file to see it)."))
    for name, tree in trees.items():
        failures.extend(_check_module(name, tree, local_modules))

    env_name = job.job.environment if job is not None else "environment.py"
    if job is not None:
        if not env_name.endswith(".py") or env_name.startswith("/") or ".." in env_name.split("/"):
            failures.append(_fail("schema", "job.toml: job.environment",
                                  f"environment must be a .py file in the workspace, got {env_name!r}",
                                  'Use environment = "environment.py".'))
        elif env_name not in rel:
            parsable = False
            failures.append(_fail("missing_file", env_name, f"the environment module {env_name!r} does not exist",
                                  "Write it, or point job.environment at your module."))
    if env_name in trees:
        tree = trees[env_name]
        defs = {n.name for n in getattr(tree, "body", []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if "load_environment" not in defs:
            failures.append(_fail("missing_entrypoint", env_name,
                                  "no top-level function load_environment(**kwargs)",
                                  "Define def load_environment(**kwargs) -> vf.Environment at module level."))
    return job, parsable, failures
