import os

import pytest

from ait_env.sandbox.workspace import Workspace, WorkspaceError, WorkspaceQuota


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("hello world\nhello again\n")
    return Workspace(root, WorkspaceQuota(max_file_bytes=100, max_files=4, max_total_bytes=250),
                     read_only={"family_tools.py"})


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/passwd", "~/x", "", "   ", ".", "a\\b",
                                  "a\x00b", "x" * 300])
def test_traversal_and_bad_paths_refused(ws, path):
    with pytest.raises(WorkspaceError):
        ws.write(path, "data")
    with pytest.raises(WorkspaceError):
        ws.read(path)


def test_normalised_paths_work(ws):
    ws.write("./sub//b.txt", "x")
    assert ws.read("sub/b.txt") == "x"
    assert "sub/b.txt" in ws.files()


def test_symlink_escape_refused(ws, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    os.symlink(secret, ws.root / "link.txt")
    os.symlink(tmp_path, ws.root / "dirlink")
    with pytest.raises(WorkspaceError, match="symbolic link"):
        ws.read("link.txt")
    with pytest.raises(WorkspaceError, match="symbolic link"):
        ws.write("dirlink/new.txt", "x")
    assert not (tmp_path / "new.txt").exists()
    with pytest.raises(WorkspaceError):
        ws.write("link.txt", "overwrite")
    assert secret.read_text() == "top secret"


def test_file_size_quota(ws):
    with pytest.raises(WorkspaceError, match="limit per file is 100"):
        ws.write("big.txt", "x" * 101)
    assert not (ws.root / "big.txt").exists()


def test_file_count_quota(ws):
    ws.write("b.txt", "1")
    ws.write("c.txt", "1")
    ws.write("d.txt", "1")
    with pytest.raises(WorkspaceError, match="limit 4"):
        ws.write("e.txt", "1")
    ws.write("d.txt", "overwrite is fine")


def test_total_bytes_quota(ws):
    ws.write("b.txt", "x" * 100)
    ws.write("c.txt", "x" * 100)
    with pytest.raises(WorkspaceError, match="limit 250"):
        ws.write("d.txt", "x" * 100)
    assert not (ws.root / "d.txt").exists()


def test_bad_utf8_refused_on_read(ws):
    (ws.root / "bin.dat").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(WorkspaceError, match="not UTF-8"):
        ws.read("bin.dat")


def test_lone_surrogate_and_nul_refused_on_write(ws):
    with pytest.raises(WorkspaceError, match="UTF-8"):
        ws.write("s.txt", "bad \udcff text")
    with pytest.raises(WorkspaceError, match="NUL"):
        ws.write("s.txt", "a\x00b")


def test_edit_unique_match(ws):
    line = ws.edit("a.txt", "world", "there")
    assert line == 1
    assert ws.read("a.txt").startswith("hello there")


def test_edit_ambiguous_and_missing(ws):
    with pytest.raises(WorkspaceError, match="occurs 2 times.*lines 1, 2"):
        ws.edit("a.txt", "hello", "bye")
    with pytest.raises(WorkspaceError, match="not found"):
        ws.edit("a.txt", "absent", "x")
    with pytest.raises(WorkspaceError, match="empty"):
        ws.edit("a.txt", "", "x")
    with pytest.raises(WorkspaceError, match="no file"):
        ws.edit("nope.txt", "a", "b")
    assert ws.read("a.txt") == "hello world\nhello again\n"


def test_read_only_file(ws):
    (ws.root / "family_tools.py").write_text("def f(): pass\n")
    with pytest.raises(WorkspaceError, match="read-only"):
        ws.write("family_tools.py", "hacked")
    with pytest.raises(WorkspaceError, match="read-only"):
        ws.edit("family_tools.py", "pass", "hacked")
    assert ws.read("family_tools.py") == "def f(): pass\n"


def test_directory_errors(ws):
    ws.write("d/x.txt", "1")
    with pytest.raises(WorkspaceError, match="directory"):
        ws.read("d")
    with pytest.raises(WorkspaceError, match="is a file"):
        ws.write("a.txt/inner.txt", "x")


def test_template_copy_removed_when_collected_or_at_exit(tmp_path):
    import gc
    from pathlib import Path
    import subprocess
    import sys

    tpl = tmp_path / "tpl"
    tpl.mkdir()
    (tpl / "job.toml").write_text("x = 1\n")
    ws = Workspace.from_template(tpl, parent=tmp_path)
    root = ws.root
    del ws
    gc.collect()
    assert not root.exists()
    # an env that is never closed: the copy goes at interpreter exit
    code = ("import sys, pathlib\nfrom ait_env.sandbox.workspace import Workspace\n"
            "ws = Workspace.from_template(pathlib.Path(sys.argv[1]), parent=pathlib.Path(sys.argv[2]))\n"
            "print(ws.root)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tpl), str(tmp_path)], capture_output=True,
                         text=True, timeout=60, check=True)
    assert not Path(out.stdout.strip()).exists()
    # destroy() still works and the finaliser does not run twice
    ws2 = Workspace.from_template(tpl, parent=tmp_path)
    ws2.destroy()
    assert not ws2.root.exists()
