"""The bundle's wire format: a round trip, and a decoder that refuses hostile payloads while streaming,
quickly, with one error type, and leaves nothing behind (item 5 of the security issue)."""

from __future__ import annotations

import base64
import gzip
import io
import json
import tarfile
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from task_families import reference_files
from ait_env.jobs.bundle import JobBundle
from ait_env.jobs.wire import MAX_BUNDLE_FILES, BundleWireError, pack_bundle, unpack_bundle
from tests.helpers import make_bundle


def _bundle(tmp_path):
    return make_bundle(reference_files("arithmetic", "Qwen/Qwen3-1.7B"), tmp_path)


def _encode(tar_bytes: bytes) -> str:
    return base64.b64encode(gzip.compress(tar_bytes)).decode()


def _tar(members: list[tuple[str, bytes]], manifest: dict | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if manifest is not None:
            data = json.dumps(manifest).encode()
            info = tarfile.TarInfo("manifest.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _refused(payload: str, tmp_path, match: str | None = None, within_s: float = 10.0) -> None:
    t0 = time.monotonic()
    with pytest.raises(BundleWireError, match=match):
        unpack_bundle(payload, tmp_path / "out")
    assert time.monotonic() - t0 < within_s
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir()), "something was left behind"


def test_round_trip(tmp_path):
    b = _bundle(tmp_path)
    out = unpack_bundle(pack_bundle(b.root), tmp_path / "out")
    JobBundle.load(out).verify()
    assert {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} == {"manifest.json", *b.manifest.files}


def test_a_negative_base256_member_size_is_refused_at_its_header(tmp_path):
    """216 characters once made the decoder loop for minutes, growing ~22 MB/s."""
    header = bytearray(tarfile.TarInfo("a").tobuf(format=tarfile.USTAR_FORMAT))
    header[124:136] = b"\xff" * 12            # size: base-256, -1
    header[148:156] = b" " * 8
    header[148:156] = (f"{sum(header):06o}\0 ").encode()
    payload = _encode(bytes(header) + b"\0" * 1024)
    assert len(payload) < 300
    _refused(payload, tmp_path, "too large|malformed")


def test_millions_of_empty_members_stop_at_the_member_limit(tmp_path):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as z:
        empty = tarfile.TarInfo("e")
        for i in range(MAX_BUNDLE_FILES * 4):
            empty.name = f"f{i}"
            z.write(empty.tobuf())
    _refused(base64.b64encode(buf.getvalue()).decode(), tmp_path, "more than")


def test_a_compression_bomb_stops_at_the_size_limit(tmp_path):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9) as z:
        for name in ("a", "b"):
            info = tarfile.TarInfo(name)
            info.size = 60 * 2**20
            z.write(info.tobuf())
            for _ in range(60):
                z.write(b"\0" * 2**20)
    _refused(base64.b64encode(buf.getvalue()).decode(), tmp_path, "too large|inflates")


@pytest.mark.parametrize("members, manifest, match", [
    ([("a.py", b"1"), ("a.py", b"2")], {"job_id": "j", "files": {"a.py": ""}}, "twice|clashes"),
    ([("a", b"1"), ("a/b.py", b"2")], {"job_id": "j", "files": {"a": "", "a/b.py": ""}}, "clashes"),
    ([("a/b.py", b"2"), ("a", b"1")], {"job_id": "j", "files": {"a": "", "a/b.py": ""}}, "clashes"),
    ([("a.py", b"1")], {"job_id": "job1\n", "files": {"a.py": ""}}, "not a plain name"),
    ([("a.py", b"1")], {"job_id": "j", "files": {}}, "exactly those its manifest lists"),
    ([("../a.py", b"1")], {"job_id": "j", "files": {"../a.py": ""}}, "not a plain relative file"),
    ([("a.py", b"1")], None, "no manifest"),
    ([("a.py", b"1")], ["not", "an", "object"], "not a JSON object"),
])
def test_malformed_archives_are_refused_before_anything_is_written(tmp_path, members, manifest, match):
    tar = _tar(members, manifest if isinstance(manifest, dict) else None)
    if isinstance(manifest, list):
        tar = _tar([("manifest.json", json.dumps(manifest).encode()), *members])
    _refused(_encode(tar), tmp_path, match)


@pytest.mark.parametrize("payload", ["", "!!!", "A" * 7, 12345, base64.b64encode(b"\x1f\x8b garbage").decode()])
def test_what_is_not_a_payload_is_refused(tmp_path, payload):
    _refused(payload, tmp_path)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8),
       cut=st.none() | st.integers(0, 12_000))
def test_any_corruption_is_a_bundle_or_a_refusal(tmp_path_factory, edits, cut):
    """Bytes of a real bundle's tar changed (headers, sizes, names) or cut: the decoder either returns a
    bundle or raises BundleWireError, quickly, and never anything else."""
    tmp = tmp_path_factory.mktemp("w")
    raw = bytearray(gzip.decompress(base64.b64decode(pack_bundle(_BUNDLE.root))))
    for pos, value in edits:
        if pos < len(raw):
            raw[pos] = value
    if cut is not None:
        raw = raw[:cut]
    t0 = time.monotonic()
    try:
        unpack_bundle(_encode(bytes(raw)), tmp / "out")
    except BundleWireError:
        pass
    assert time.monotonic() - t0 < 5


@pytest.fixture(autouse=True, scope="module")
def _reference_bundle(tmp_path_factory):
    global _BUNDLE
    _BUNDLE = _bundle(tmp_path_factory.mktemp("ref"))


_BUNDLE: JobBundle
