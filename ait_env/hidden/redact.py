"""What the agent may read about our machine: host paths are redacted from every message that crosses
from the validation probe, the sandbox, the runner or a backend into an observation.

:func:`for_agent` rewrites

- the agent's own files, wherever they were copied (a sandbox request folder, a bundle's package), to
  their workspace-relative names: ``"/sandbox/req-1a2b3c4d5e/environment.py"`` -> ``"environment.py"``;
- the Python installation, its site-packages, this project's checkout, the temporary folder and the
  home folder to short labels (``<site-packages>/verifiers/envs/environment.py``, ``<python>/json/...``);
- any other absolute path of two or more components to ``<path>/<last component>``, except the
  sandbox's own folders and system ones (``/scratch``, ``/dev``, ``/proc``, ``/etc``, ...).

The env applies it once, to the text of every ``submit_job`` outcome; tool outputs that only echo the
agent's own workspace (``read_file``) are never rewritten.
"""

from __future__ import annotations

import functools
import re
import site
import sys
import sysconfig
import tempfile
from pathlib import Path

#: a folder holding a copy of the agent's files: a sandbox request folder or a bundle's package
_AGENT_DIRS = re.compile(r"""[^\s"'()<>]*/(?:req-[0-9a-f]{10}/(?:ait_job_\w+/)?|src/ait_job_\w+/)""")
_ANY_PATH = re.compile(r"""(?<![\w.~<>/:-])/[\w.+@-]+(?:/[\w.+@-]+)+""")
#: paths that name nothing of the host: the sandbox's own folders and the usual system ones
_KEEP = ("/scratch/", "/sandbox/", "/dev/", "/proc/", "/sys/", "/etc/", "/tmp/")


@functools.cache
def _prefixes() -> tuple[tuple[str, str], ...]:
    found: dict[str, str] = {}

    def add(path: str | None, label: str) -> None:
        if path:
            for p in {str(path), str(Path(path).resolve())}:
                if len(p) > 1:
                    found.setdefault(p.rstrip("/"), label)

    for sp in [*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_paths()["purelib"],
               sysconfig.get_paths()["platlib"]]:
        add(sp, "<site-packages>")
    add(sysconfig.get_paths()["stdlib"], "<python>")
    add("/opt/ait", "<sandbox>")
    add(Path(__file__).resolve().parents[2].as_posix(), "<ait>")   # the checkout (ait_env/hidden/redact.py)
    for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix):
        add(prefix, "<python-prefix>")
    add(tempfile.gettempdir(), "<tmp>")
    add(str(Path.home()), "~")
    # longest first, so that site-packages wins over the prefix that contains it
    return tuple(sorted(found.items(), key=lambda kv: -len(kv[0])))


def for_agent(text: str) -> str:
    """``text`` with every host path redacted (see the module docstring)."""
    if not text:
        return text
    out = _AGENT_DIRS.sub("", text)
    for prefix, label in _prefixes():
        out = out.replace(prefix + "/", label + "/")
    return _ANY_PATH.sub(lambda m: m.group(0) if m.group(0).startswith(_KEEP)
                         else "<path>/" + m.group(0).rsplit("/", 1)[-1], out)
