"""The bundle's wire format: a job bundle as one base64 string (a gzip tar), and back.

:func:`pack_bundle` writes ``manifest.json`` and exactly the files it lists (no outputs, logs or
results). :func:`unpack_bundle` is the decoder a GPU worker runs on a payload that crossed a network, so
it treats the payload as hostile and is bounded **while streaming**, before anything is allocated or
written: the base64 size, the decompressed bytes (a gzip bomb stops at the limit), the number of
members, each member's size (a negative or huge header size is refused at its header), the total size,
and the wall time. Only plain files (and folders) with plain relative names are accepted, each once, a
file never where a folder is; the manifest's job id must be a plain name, entirely, and the files must
be exactly those the manifest lists. Nothing is written until the whole archive has passed; then it is
written to a temporary folder and renamed into place, so a refused payload leaves nothing behind.
Every refusal is a :class:`BundleWireError` (a ``ValueError``) that says what was wrong.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
import zlib
from pathlib import Path, PurePosixPath

#: a base64 bundle larger than this is refused before decoding (Runpod's ``/run`` takes 10 MB in all)
MAX_BUNDLE_B64 = 8 * 2**20
#: limits of an unpacked bundle: its files' bytes, its members, the decoder's wall time
MAX_BUNDLE_BYTES = 64 * 2**20
MAX_BUNDLE_FILES = 5000
MAX_UNPACK_SECONDS = 30.0
#: tar headers, pax records and padding on top of the files' bytes
_HEADER_ALLOWANCE = 16 * 2**20
_MAX_NAME = 400
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class BundleWireError(ValueError):
    """A payload that is not a bundle :func:`pack_bundle` could have made (the message says why)."""


def pack_bundle(bundle_dir: Path) -> str:
    """The bundle as a compact base64 tar.gz: ``manifest.json`` and exactly the files it lists. Raises
    ``ValueError`` when it would not fit a Runpod request."""
    root = Path(bundle_dir)
    manifest = json.loads((root / "manifest.json").read_text())
    buf = io.BytesIO()
    # regular files only, without owner names or times (nothing of this host travels, and the same bundle
    # packs to the same bytes) at gzip level 6: half the time of tar.add at level 9, and packing is the
    # largest cost of a submit on the runpod backend (docs/fleet.md, "Dispatch")
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for rel in ["manifest.json", *sorted(manifest["files"])]:
            path = root / rel
            if path.is_symlink() or not path.is_file():
                raise BundleWireError(f"bundle {root.name}: {rel} is not a regular file")
            content = path.read_bytes()
            info = tarfile.TarInfo(rel)
            info.size, info.mode = len(content), 0o644
            tar.addfile(info, io.BytesIO(content))
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    if len(data) > MAX_BUNDLE_B64:
        raise ValueError(f"bundle {root.name} is {len(data) / 2**20:.1f} MB as base64, over the worker's "
                         f"{MAX_BUNDLE_B64 / 2**20:.0f} MB (Runpod /run takes 10 MB): keep data files out of "
                         "jobs")
    return data


class _Inflate(io.RawIOBase):
    """The gzip-decompressed bytes of ``raw``, refused past ``limit`` bytes or after ``deadline``."""

    def __init__(self, raw: bytes, limit: int, deadline: float) -> None:
        self._raw = memoryview(raw)
        self._pos = 0
        self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._pending = b""
        self._out = 0
        self._limit = limit
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        if time.monotonic() > self._deadline:
            raise BundleWireError(f"the bundle took more than {MAX_UNPACK_SECONDS:.0f} s to decode")
        try:
            while not self._pending:
                if self._z.unconsumed_tail:
                    src = self._z.unconsumed_tail
                elif not self._z.eof and self._pos < len(self._raw):
                    src = bytes(self._raw[self._pos:self._pos + 65536])
                    self._pos += len(src)
                else:
                    break  # the end of the gzip member (anything after it is ignored)
                self._pending = self._z.decompress(src, 65536)
        except zlib.error as exc:
            raise BundleWireError(f"the bundle payload is not a gzip tar archive ({exc}); send pack_bundle()'s "
                                  "output") from None
        n = min(len(b), len(self._pending))
        b[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        self._out += n
        if self._out > self._limit:
            raise BundleWireError(f"the bundle inflates past {self._limit / 2**20:.0f} MB (a compression bomb?)")
        return n


def _member_path(m: tarfile.TarInfo) -> PurePosixPath:
    name = m.name
    if not name or len(name) > _MAX_NAME or "\x00" in name or "\\" in name or name.startswith("/"):
        raise BundleWireError(f"bundle archive member {name[:80]!r} is not a plain relative file")
    path = PurePosixPath(name)
    if any(p in ("", ".", "..") for p in path.parts) or len(path.parts) > 32:
        raise BundleWireError(f"bundle archive member {name[:80]!r} is not a plain relative file")
    return path


def _read_members(raw: bytes, deadline: float) -> dict[PurePosixPath, bytes]:
    files: dict[PurePosixPath, bytes] = {}
    dirs: set[PurePosixPath] = set()
    total = members = 0
    stream = io.BufferedReader(_Inflate(raw, MAX_BUNDLE_BYTES + _HEADER_ALLOWANCE, deadline))
    try:
        tar = tarfile.open(fileobj=stream, mode="r|")
    except (tarfile.TarError, EOFError) as exc:
        raise BundleWireError(f"the bundle payload is not a gzip tar archive ({exc}); send pack_bundle()'s "
                              "output") from None
    with tar:
        while True:
            try:
                m = tar.next()
            except (tarfile.TarError, EOFError, OverflowError, MemoryError) as exc:
                raise BundleWireError(f"the bundle archive is malformed ({type(exc).__name__}: {exc})") from None
            if m is None:
                break
            members += 1
            if members > MAX_BUNDLE_FILES:
                raise BundleWireError(f"bundle archive has more than {MAX_BUNDLE_FILES} members")
            if time.monotonic() > deadline:
                raise BundleWireError(f"the bundle took more than {MAX_UNPACK_SECONDS:.0f} s to decode")
            path = _member_path(m)
            if not (m.isreg() or m.isdir()):
                raise BundleWireError(f"bundle archive member {m.name[:80]!r} is not a plain relative file")
            if m.size < 0 or m.size > MAX_BUNDLE_BYTES or total + m.size > MAX_BUNDLE_BYTES:
                raise BundleWireError(f"bundle archive too large (a member of {m.size} bytes; at most "
                                      f"{MAX_BUNDLE_BYTES / 2**20:.0f} MB in all)")
            total += m.size
            parents = set(path.parents) - {PurePosixPath(".")}
            if path in files or parents & files.keys() or (m.isreg() and path in dirs):
                raise BundleWireError(f"bundle archive member {m.name[:80]!r} appears twice or clashes "
                                      "with a file or folder of the same name")
            dirs |= parents
            if m.isdir():
                dirs.add(path)
                continue
            f = tar.extractfile(m)
            try:
                data = f.read() if f is not None else b""
            except (tarfile.TarError, EOFError, zlib.error) as exc:   # the stream ends inside the member
                raise BundleWireError(f"bundle archive member {m.name[:80]!r} is truncated ({exc})") from None
            if len(data) != m.size:
                raise BundleWireError(f"bundle archive member {m.name[:80]!r} is truncated")
            files[path] = data
    return files


def unpack_bundle(data: str, parent: Path) -> Path:
    """Unpack :func:`pack_bundle`'s output into ``parent/<job_id>`` and return that folder (module docstring;
    :class:`BundleWireError` on anything else)."""
    deadline = time.monotonic() + MAX_UNPACK_SECONDS
    if not isinstance(data, str) or len(data) > MAX_BUNDLE_B64:
        size = len(data) / 2**20 if isinstance(data, str) else 0.0
        raise BundleWireError(f"bundle payload of {size:.1f} MB is over {MAX_BUNDLE_B64 / 2**20:.0f} MB"
                              if isinstance(data, str) else "the bundle payload must be a base64 string")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BundleWireError(f"the bundle payload is not base64 ({exc})") from None
    files = _read_members(raw, deadline)
    manifest_bytes = files.get(PurePosixPath("manifest.json"))
    if manifest_bytes is None:
        raise BundleWireError("bundle archive has no manifest.json")
    try:
        manifest = json.loads(manifest_bytes)
    except (ValueError, RecursionError) as exc:
        raise BundleWireError(f"the bundle's manifest.json is not JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise BundleWireError("the bundle's manifest.json is not a JSON object")
    job_id = manifest.get("job_id")
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise BundleWireError(f"bundle job id {str(job_id)[:80]!r} is not a plain name")
    listed = manifest.get("files")
    have = {p.as_posix() for p in files} - {"manifest.json"}
    if not isinstance(listed, dict) or set(listed) != have:
        extra = sorted(have - set(listed or {}))[:5] if isinstance(listed, dict) else []
        raise BundleWireError("the bundle's files are not exactly those its manifest lists"
                              + (f" (not listed: {extra})" if extra else ""))
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    dest = parent / job_id
    if dest.exists():
        raise BundleWireError(f"bundle {job_id} was already unpacked in {parent}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{job_id}.", dir=parent))
    try:
        for path, content in files.items():
            target = tmp.joinpath(*path.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "xb") as f:
                f.write(content)
            os.chmod(target, 0o644)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
