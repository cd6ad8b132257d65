"""A confined directory the agent edits through text tools.

Contract:
- Every path is relative, POSIX-style, without ``..`` or empty/``.`` parts, without NUL or
  control characters; it must resolve (symlinks included) inside the workspace root.
- Files are UTF-8 text only; a file that does not decode is refused on read and on write.
- Quotas: bytes per file, number of files, total bytes. A write that would break a quota is
  refused and leaves the workspace unchanged.
- Some files may be read-only (e.g. the family's tool module shipped for reference).
- A workspace made by :meth:`from_template` owns its folder: :meth:`destroy`, garbage collection
  or interpreter exit removes it.
- Every refusal raises :class:`WorkspaceError` with a message that says how to fix the call;
  nothing else is raised for bad agent input.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, Field


class WorkspaceError(Exception):
    """A tool call on the workspace was refused; the message is shown to the agent."""


class WorkspaceQuota(BaseModel):
    max_file_bytes: int = Field(65536, ge=1)
    max_files: int = Field(32, ge=1)
    max_total_bytes: int = Field(262144, ge=1)
    max_list_entries: int = Field(200, ge=1)


_MAX_PATH_CHARS = 200


class Workspace:
    """A sandboxed folder. Create with :meth:`from_template` or on an existing directory."""

    def __init__(self, root: Path, quota: WorkspaceQuota | None = None,
                 read_only: set[str] | None = None) -> None:
        self.root = Path(root).resolve()
        self.quota = quota or WorkspaceQuota()
        self.read_only = set(read_only or ())
        self._finalizer: weakref.finalize | None = None  # set when this object owns its folder

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_template(cls, template: Path, parent: Path | None = None,
                      quota: WorkspaceQuota | None = None,
                      read_only: dict[str, str] | None = None) -> "Workspace":
        """Copy ``template`` into a fresh directory; add ``read_only`` files (name -> text)."""
        root = Path(tempfile.mkdtemp(prefix="ait-ws-", dir=parent))
        if template.is_dir():
            shutil.copytree(template, root, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        ws = cls(root, quota, set())
        # the copy is owned by this object: removed by destroy(), or when it is collected or the
        # interpreter exits (an env that is never closed must not leave folders behind)
        ws._finalizer = weakref.finalize(ws, shutil.rmtree, str(root), True)
        for name, text in (read_only or {}).items():
            target = ws.resolve(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            ws.read_only.add(ws.normalise(name))
        return ws

    def destroy(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        if self._finalizer is not None:
            self._finalizer.detach()

    # ------------------------------------------------------------------ paths
    @staticmethod
    def normalise(path: str) -> str:
        """Validate a relative path and return its canonical POSIX form."""
        if not isinstance(path, str) or not path.strip():
            raise WorkspaceError("path must be a non-empty string such as 'job.toml'.")
        if len(path) > _MAX_PATH_CHARS:
            raise WorkspaceError(f"path is longer than {_MAX_PATH_CHARS} characters.")
        if any(ord(c) < 32 or c == "\x7f" for c in path):
            raise WorkspaceError("path contains control characters; use plain file names.")
        if "\\" in path:
            raise WorkspaceError("use '/' as the path separator, not '\\'.")
        p = PurePosixPath(path)
        if p.is_absolute() or path.startswith("~"):
            raise WorkspaceError(
                f"absolute paths are not allowed ({path!r}); use a path relative to the "
                "workspace root, e.g. 'environment.py'.")
        parts = [part for part in path.split("/") if part not in ("", ".")]
        if not parts:
            raise WorkspaceError("path names the workspace root; name a file such as 'job.toml'.")
        if ".." in parts:
            raise WorkspaceError(f"'..' is not allowed in paths ({path!r}); stay inside the workspace.")
        return "/".join(parts)

    def resolve(self, path: str) -> Path:
        """Absolute path inside the root; refuses anything that escapes it (symlinks included)."""
        rel = self.normalise(path)
        target = self.root / rel
        # Refuse every symlink on the way, even one that points inside: links are never ours.
        cur = self.root
        for part in rel.split("/"):
            cur = cur / part
            if cur.is_symlink():
                raise WorkspaceError(f"{rel!r} goes through a symbolic link; links are not allowed.")
        real = Path(os.path.realpath(target))
        if real != self.root and self.root not in real.parents:
            raise WorkspaceError(f"{rel!r} resolves outside the workspace.")
        return target

    # ------------------------------------------------------------------ queries
    def files(self) -> list[str]:
        out: list[str] = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                full = Path(dirpath) / name
                out.append(full.relative_to(self.root).as_posix())
        return sorted(out)

    def exists(self, path: str) -> bool:
        return self.resolve(path).is_file()

    # ------------------------------------------------------------------ operations
    def read(self, path: str) -> str:
        target = self.resolve(path)
        rel = self.normalise(path)
        if target.is_dir():
            raise WorkspaceError(f"{rel!r} is a directory; use list_files to see what it holds.")
        if not target.is_file():
            raise WorkspaceError(f"no file {rel!r}; use list_files to see the workspace.")
        data = target.read_bytes()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WorkspaceError(f"{rel!r} is not UTF-8 text ({exc.reason} at byte {exc.start}).") from None

    def write(self, path: str, content: str) -> int:
        """Create or replace a text file; returns the number of bytes written."""
        rel = self.normalise(path)
        target = self.resolve(path)
        if rel in self.read_only:
            raise WorkspaceError(f"{rel!r} is read-only (provided for reference); write your own file.")
        if not isinstance(content, str):
            raise WorkspaceError("content must be a string.")
        if "\x00" in content:
            raise WorkspaceError("content contains NUL bytes; only text files are allowed.")
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise WorkspaceError(f"content is not valid UTF-8 text ({exc.reason}).") from None
        q = self.quota
        if len(data) > q.max_file_bytes:
            raise WorkspaceError(
                f"{rel!r} would be {len(data)} bytes; the limit per file is {q.max_file_bytes} bytes. "
                "Split it or generate data in code instead of inlining it.")
        if target.is_dir():
            raise WorkspaceError(f"{rel!r} is a directory; choose a file name.")
        sizes = dict(self.listing())
        is_new = rel not in sizes
        if is_new and len(sizes) >= q.max_files:
            raise WorkspaceError(f"the workspace already holds {len(sizes)} files (limit "
                                 f"{q.max_files}); edit an existing file instead.")
        new_total = sum(sizes.values()) - sizes.get(rel, 0) + len(data)
        if new_total > q.max_total_bytes:
            raise WorkspaceError(f"the workspace would hold {new_total} bytes (limit "
                                 f"{q.max_total_bytes}); shorten your files.")
        # Parent components must be real directories inside the root.
        parent = target.parent
        for anc in [parent, *parent.parents]:
            if anc == self.root or self.root not in anc.parents:
                break
            if anc.exists() and not anc.is_dir():
                raise WorkspaceError(f"{anc.relative_to(self.root).as_posix()!r} is a file, not a folder.")
        parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        return len(data)

    def edit(self, path: str, old: str, new: str) -> int:
        """Replace the unique exact occurrence of ``old`` with ``new``; returns the line of the edit."""
        rel = self.normalise(path)
        if not isinstance(old, str) or not isinstance(new, str):
            raise WorkspaceError("old_text and new_text must be strings.")
        if old == "":
            raise WorkspaceError("old_text is empty; give the exact text to replace "
                                 "(use write_file to create or overwrite a file).")
        text = self.read(path)
        count = text.count(old)
        if count == 0:
            raise WorkspaceError(f"old_text was not found in {rel!r}; read_file it and copy the exact text, "
                                 "whitespace included.")
        if count > 1:
            lines = []
            start = 0
            for _ in range(min(count, 5)):
                i = text.index(old, start)
                lines.append(str(text.count("\n", 0, i) + 1))
                start = i + 1
            raise WorkspaceError(f"old_text occurs {count} times in {rel!r} (lines {', '.join(lines)}); "
                                 "include more surrounding text so it matches exactly once.")
        idx = text.index(old)
        self.write(path, text.replace(old, new, 1))
        return text.count("\n", 0, idx) + 1

    def listing(self) -> list[tuple[str, int]]:
        return [(f, (self.root / f).lstat().st_size) for f in self.files()]
