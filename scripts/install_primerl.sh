#!/usr/bin/env bash
# Install prime-rl v0.7.0 (commit d334ea52) the way its own lock lays it out, on any Linux x86_64 machine
# (no GPU needed), into a cache outside this repository:
#
#   bash scripts/install_primerl.sh [--source PATH_OR_URL] [--submodule NAME=SOURCE]...
#                                   [--git-dep NAME=SOURCE]... [--dest DIR] [--python PYTHON3.12]
#
# What it makes (DEST, default ~/.cache/ai-trains-ai/prime-rl-v0.7.0):
#   DEST/prime-rl/          the checkout at the tag (commit checked), with the submodules its lock installs
#                           editable: deps/verifiers (verifiers 0.2.0), deps/renderers, deps/pydantic-config
#   DEST/prime-rl/.venv/    Python 3.12 venv, exactly the packages of prime-rl's uv.lock (`uv export
#                           --frozen --no-dev`, installed with `uv pip install --no-deps`): prime-rl,
#                           prime-rl-configs, verifiers, renderers and prime-pydantic-config as *editable*
#                           installs (as `uv sync` makes them), everything else from the registry
#   DEST/requirements.txt   what was installed; DEST/SKIPPED.txt what was not, and why
#   DEST/INSTALLED          written last: the install is complete
# Point the worker at it with AIT_PRIME_RL_DIR=DEST/prime-rl (gpu/selfcheck.py, gpu/primerl_executor.py).
#
# SOURCE forms (for --source and --submodule): a git URL, a local git repository (a checkout or a bare
# mirror), or, for a submodule only, `pypi:<name>==<version>`: that release's sdist unpacked in the
# submodule's folder and installed editable (for a submodule whose git host is out of reach; the script
# says which it used). Default: GitHub, the URLs of prime-rl's .gitmodules (SSH rewritten to https).
# --git-dep NAME=SOURCE installs a git dependency of the lock (`NAME @ git+https://...@COMMIT`, e.g. torchtitan)
# from SOURCE (a git URL or a local repository, e.g. a mirror) at the lock's commit, not editable (as `uv sync`
# installs a git source); files whose objects a partial mirror lacks are left out and listed in SKIPPED.txt.
#
# What the lock has that a registry-only machine cannot fetch, and what this script does instead (listed
# in SKIPPED.txt): torch/torchvision/torchaudio `+cu128` come from download.pytorch.org: the same versions
# from PyPI (CUDA builds there too; no CPU build of torch 2.11.0 is on PyPI); vLLM 0.24.0+cu129 is a
# GitHub release wheel: vllm==0.24.0 from PyPI; torchtitan, dion, flash-linear-attention (git sources, the
# trainer's; unless --git-dep gives a source) and the optional extras (flash-attn wheels on GitHub, flash-attn-3 on a PyTorch index,
# disagg) are not installed. `rl --dry-run`, the orchestrator's env server and the config schema need
# none of them; a training run on a GPU does (use gpu/Dockerfile there).
set -euo pipefail

TAG=v0.7.0
COMMIT=d334ea52940b47f426293a7d146239e3fbf91caa
UV_VERSION=0.11.7               # prime-rl's pyproject: [tool.uv] required-version = ">=0.11.1"
SOURCE=https://github.com/PrimeIntellect-ai/prime-rl.git
DEST=${AIT_PRIMERL_HOME:-$HOME/.cache/ai-trains-ai/prime-rl-$TAG}
PYTHON=""
declare -A SUBSRC=()
declare -A GITSRC=()
NEEDED_SUBMODULES=(verifiers renderers pydantic-config)   # the editable [tool.uv.sources] of the lock

die() { echo "install_primerl: $*" >&2; exit 1; }
say() { echo "[install_primerl $(date +%H:%M:%S)] $*"; }

while [[ $# -gt 0 ]]; do
  case $1 in
    --source) SOURCE=$2; shift 2 ;;
    --submodule) [[ $2 == *=* ]] || die "--submodule takes NAME=SOURCE (NAME: ${NEEDED_SUBMODULES[*]})"
                 SUBSRC[${2%%=*}]=${2#*=}; shift 2 ;;
    --git-dep) [[ $2 == *=* ]] || die "--git-dep takes NAME=SOURCE (NAME: a git dependency of the lock, e.g. torchtitan)"
               GITSRC[${2%%=*}]=${2#*=}; shift 2 ;;
    --dest) DEST=$2; shift 2 ;;
    --python) PYTHON=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//' | head -n -1; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
T0=$(date +%s)
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
REPO=$DEST/prime-rl
rm -f "$DEST/INSTALLED"

# --- Python 3.12 (prime-rl: requires-python = "~=3.12.0") -------------------------------------------------
find_python() {
  local c
  for c in "$PYTHON" python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12 \
           /usr/local/bin/python3.12; do
    [[ -n $c ]] || continue
    if "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      "$c" -c 'import sys; print(sys.executable)'; return 0
    fi
  done
  return 1
}
PY=$(find_python) || die "no Python 3.12 found (prime-rl $TAG needs ~=3.12.0): install one (pyenv install 3.12, apt-get install python3.12) or pass --python"
say "Python: $PY"

# --- uv (in its own venv under DEST) ---------------------------------------------------------------------
UV=$DEST/uv/bin/uv
if ! "$UV" --version 2>/dev/null | grep -q "^uv $UV_VERSION"; then
  "$PY" -m venv "$DEST/uv"
  "$DEST/uv/bin/pip" install -q "uv==$UV_VERSION"
fi

# --- the checkout at the tag ---------------------------------------------------------------------------
if [[ ! -d $REPO/.git ]]; then
  say "cloning $SOURCE"
  git clone -q --no-checkout "$SOURCE" "$REPO"
fi
git -C "$REPO" -c advice.detachedHead=false checkout -q -f "$COMMIT" \
  || die "commit $COMMIT (tag $TAG) is not in $SOURCE"
[[ $(git -C "$REPO" rev-parse HEAD) == "$COMMIT" ]] || die "HEAD is not $COMMIT"
echo "$COMMIT" > "$REPO/.ait-commit"

submodule_url() {   # the URL of .gitmodules, SSH rewritten to https (prime-rl's own install.sh does so)
  git -C "$REPO" config -f .gitmodules "submodule.$1.url" | sed 's#^git@github.com:#https://github.com/#'
}
for name in "${NEEDED_SUBMODULES[@]}"; do
  path=$(git -C "$REPO" config -f .gitmodules "submodule.$name.path")
  want=$(git -C "$REPO" ls-tree HEAD "$path" | awk '{print $3}')
  src=${SUBSRC[$name]:-$(submodule_url "$name")}
  if [[ $src == pypi:* ]]; then
    req=${src#pypi:}
    say "$path: sdist $req from the registry (the submodule pins $want; its git host was not used)"
    rm -rf "${REPO:?}/$path" "$DEST/sdist-$name"
    mkdir -p "$DEST/sdist-$name" "$REPO/$path"
    "$DEST/uv/bin/pip" download -q --no-deps --no-binary :all: -d "$DEST/sdist-$name" "$req"
    tar -xzf "$DEST/sdist-$name"/*.tar.gz -C "$REPO/$path" --strip-components=1
    echo "$path: sdist $req instead of git $want" >> "$DEST/SKIPPED.new"
    continue
  fi
  say "$path: $src @ $want"
  git -C "$REPO" submodule init -- "$path" >/dev/null
  git -C "$REPO" config "submodule.$name.url" "$src"
  git -C "$REPO" -c protocol.file.allow=always submodule update -q --force -- "$path" \
    || die "submodule $path: commit $want not found in $src (give another with --submodule $name=SOURCE)"
  [[ $(git -C "$REPO/$path" rev-parse HEAD) == "$want" ]] || die "$path is not at $want"
done

# --- the lock, as requirements ---------------------------------------------------------------------------
say "exporting uv.lock (frozen, no dev group, no extras)"
(cd "$REPO" && "$UV" export --frozen --no-dev --no-hashes --format requirements-txt --no-header \
   --no-annotate -o "$DEST/requirements.locked.txt" >/dev/null)
GITDEPS="${!GITSRC[*]}" "$PY" - "$DEST/requirements.locked.txt" "$DEST/requirements.txt" "$DEST/SKIPPED.new" \
  "$DEST/gitdeps.txt" <<'PYEOF'
"""Rewrite the exported lock for the registries this machine reaches (see the script's header)."""
import os
import re
import sys

src, dst, skipped, gitdeps = sys.argv[1:5]
given = set(os.environ.get("GITDEPS", "").split())
out, skip, git = [], [], []
for line in open(src):
    line = line.rstrip("\n")
    if not line.strip() or line.lstrip().startswith("#"):
        continue
    req, _, marker = line.partition(" ; ")
    tail = f" ; {marker}" if marker else ""
    m = re.match(r"^(torch|torchvision|torchaudio)==([\w.]+)\+cu\d+$", req)
    if m:
        out.append(f"{m[1]}=={m[2]}{tail}")
        skip.append(f"{req}: download.pytorch.org is out of reach; {m[1]}=={m[2]} from PyPI instead")
        continue
    m = re.match(r"^vllm @ https://github\.com/.*/vllm-([\d.]+)\+cu\d+-", req)
    if m:
        if "x86_64" in marker and "!=" not in marker:
            out.append(f"vllm=={m[1]} ; platform_machine == 'x86_64'")
            skip.append(f"vllm {m[1]}+cu129 (GitHub release wheel): vllm=={m[1]} from PyPI instead")
        continue
    m = re.match(r"^([\w.-]+) @ git\+(\S+?)@([0-9a-f]{7,40})$", req)
    if m and m[1] in given:
        git.append(f"{m[1]} {m[3]} {m[2]}")
        given.discard(m[1])
        continue
    if re.match(r"^[\w.-]+ @ (git\+)?https://", req):
        skip.append(f"{req}: not in a registry (git or GitHub source); not installed")
        continue
    out.append(line)
if given:
    sys.exit(f"install_primerl: --git-dep {' '.join(sorted(given))}: not a git dependency of the lock")
open(dst, "w").write("\n".join(out) + "\n")
open(gitdeps, "w").write("".join(f"{g}\n" for g in git))
with open(skipped, "a") as f:
    f.write("\n".join(skip) + "\n")
    f.write("extras flash-attn (GitHub wheel), flash-attn-3 (PyTorch test index), flash-attn-cute, disagg, "
            "gpt-oss, modelexpress, quack: not installed (gpu/Dockerfile installs flash-attn on a GPU image)\n")
PYEOF
mv "$DEST/SKIPPED.new" "$DEST/SKIPPED.txt"

# --- the venv ---------------------------------------------------------------------------------------
say "installing $(grep -c . "$DEST/requirements.txt") requirements into $REPO/.venv"
[[ -x $REPO/.venv/bin/python ]] || "$UV" venv -q --python "$PY" "$REPO/.venv"
(cd "$REPO" && "$UV" pip install --python "$REPO/.venv/bin/python" --no-deps -r "$DEST/requirements.txt")
# the lock's git dependencies given with --git-dep: the source at the locked commit, installed as uv sync would
while read -r name rev url; do
  src=${GITSRC[$name]}
  repo=$src
  if [[ ! -d $src ]]; then   # a URL: a bare clone in DEST
    repo=$DEST/git-$name.git
    [[ -d $repo ]] || git clone -q --bare "$src" "$repo" || die "--git-dep $name: cannot clone $src"
  fi
  git -C "$repo" cat-file -e "$rev^{commit}" 2>/dev/null \
    || die "--git-dep $name: commit $rev (the lock's, from $url) is not in $src"
  # a partial mirror may lack some blobs (large test assets): archive the rest, say which are left out
  missing=$(git -C "$repo" ls-tree -r "$rev" | awk '$2 == "blob" {print $3}' \
            | git -C "$repo" cat-file --batch-check | awk '$2 == "missing" {print $1}')
  excludes=()
  for obj in $missing; do
    excludes+=(":(exclude)$(git -C "$repo" ls-tree -r "$rev" | awk -v o="$obj" '$3 == o {print $4; exit}')")
  done
  rm -rf "${DEST:?}/git-$name" && mkdir -p "$DEST/git-$name"
  git -C "$repo" archive "$rev" -- . "${excludes[@]}" | tar -x -C "$DEST/git-$name"
  say "$name: $src @ $rev (the lock's $url)${missing:+; $(echo $missing | wc -w) file(s) absent there left out}"
  "$UV" pip install --python "$REPO/.venv/bin/python" --no-deps "$DEST/git-$name"
  echo "$name @ git+$url@$rev  # from $src" >> "$DEST/requirements.txt"
  [[ -z $missing ]] || echo "$name: installed from $src @ $rev without ${excludes[*]#:(exclude)} (objects absent there)" \
    >> "$DEST/SKIPPED.txt"
done < "$DEST/gitdeps.txt"
# PyPI's torch 2.11.0 for Linux x86_64 is a CUDA 13.0 build (the lock's +cu128 build links the CUDA 12
# libraries the lock lists); without its own CUDA libraries `import torch` fails even on a CPU, and
# prime-rl's orchestrator imports torch (src/prime_rl/trainer/runs.py, through orchestrator/envs.py).
# So the torch family is installed a second time *with* its dependencies; uv reports what changed.
TORCH_REQS=$(grep -E '^(torch|torchvision|torchaudio)==' "$DEST/requirements.txt" | cut -d' ' -f1)
say "torch from PyPI with its own CUDA libraries: $(echo $TORCH_REQS)"
"$UV" pip install --python "$REPO/.venv/bin/python" $TORCH_REQS 2>&1 | tee "$DEST/torch-deps.txt"
echo "torch's CUDA 13 libraries from PyPI in addition to the lock (see torch-deps.txt)" >> "$DEST/SKIPPED.txt"

# --- check: the editable layout and the entry points --------------------------------------------------
"$REPO/.venv/bin/python" - <<'PYEOF'
import importlib.metadata as md
import json

for dist in ("prime-rl", "prime-rl-configs", "verifiers", "renderers", "prime-pydantic-config"):
    raw = md.distribution(dist).read_text("direct_url.json") or "{}"
    info = json.loads(raw)
    assert info.get("dir_info", {}).get("editable"), f"{dist} is not an editable install: {raw}"
    print(f"  {dist} {md.version(dist)} editable at {info['url']}")
for dist in ("torch", "vllm", "transformers"):
    print(f"  {dist} {md.version(dist)}")
PYEOF
"$REPO/.venv/bin/rl" --help >/dev/null || die "the installed rl does not start"
touch "$DEST/INSTALLED"
say "done in $(( $(date +%s) - T0 )) s; $(du -sh "$DEST" | cut -f1) in $DEST"
say "skipped (see $DEST/SKIPPED.txt):"; sed 's/^/  /' "$DEST/SKIPPED.txt"
echo "export AIT_PRIME_RL_DIR=$REPO"
