"""`workdir:` — the user's project folder as one content-addressed snapshot, taken at launch.

Which files: in a git repository, its tracked files and its untracked files that git does not ignore (under the
folder); elsewhere every file. Then, in both cases, less what `.orchignore` (gitignore syntax) excludes, less orch's
own (the sweep file itself, the store and the work folder when they lie inside, `.git/`, `__pycache__/`, `.venv/`),
less files that look like secrets (left out, and said at launch: pass secrets with `env:`). A link stays a link when
it points inside the folder; one pointing out of it is refused (the snapshot would not be the folder). The snapshot
is a reproducible gzipped tar (sorted, mtime 0, owner 0), named by the sha256 of its contents: the same files give
the same name on every machine, so a host unpacks each snapshot once (host/workdir.py).

Every refusal names the sweep file's `workdir:` line, the files and the fix, before anything is bought.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import os
import stat
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import SpecError

IGNORE_FILE = ".orchignore"
DEFAULT_MAX_MB = 100
# orch's own, never the user's code: excluded whatever git or .orchignore say.
BUILTIN_EXCLUDES = (".git/", "__pycache__/", "*.pyc", ".venv/")
# Files that look like secrets: left out of every snapshot (docs/guides/workdir.md). Pass secrets with `env:`.
SECRET_PATTERNS = (
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
    ".netrc",
    ".pgpass",
    "credentials",
    "credentials.json",
    ".aws/",
    ".ssh/",
)


@dataclass(frozen=True)
class Snapshot:
    """A project folder as one archive; what the sweep records of it (`summary()`) and what hosts unpack (`data`)."""

    root: Path  # the folder, absolute
    digest: str  # sha256 of the contents (names, kinds, modes, bytes), first 16 hex digits
    files: dict[str, str]  # name -> sha256 of its bytes, or "link:<target>"
    size: int  # bytes of the files' contents
    data: bytes  # the gzipped tar
    left_out: list[str] = field(default_factory=list)  # names that look like secrets, not shipped
    git_commit: str = ""  # HEAD of the repository the folder lies in ("" outside git)
    git_dirty: bool = False  # the folder has changes git has not committed

    @property
    def archive_sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def summary(self) -> dict:
        """What sweep.json keeps of it (the file list goes to the store beside the archive)."""
        return {
            "digest": self.digest,
            "archive_sha256": self.archive_sha256,
            "files": len(self.files),
            "bytes": self.size,
            "archive_bytes": len(self.data),
            "git_commit": self.git_commit,
            "git_dirty": self.git_dirty,
            "left_out": list(self.left_out),
        }


def take(folder: Path, where: str, excluded: list[Path] | None = None, max_mb: float = DEFAULT_MAX_MB) -> Snapshot:
    """The snapshot of `folder`; `where` is `file:line: workdir` for errors; `excluded`: paths orch writes (the sweep
    file, the store, the work folder) left out when they lie inside."""
    root = folder.resolve()
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise SpecError(f"{where}: {folder} {what}. Fix: name your project's folder, relative to the sweep file.")
    ignore = _ignore_spec(root, where)
    skip = {p.resolve() for p in excluded or []}
    names, left_out = [], []

    def skipped(rel: str, folder: bool = False) -> bool:
        path = root / rel
        return any(path == s or s in path.parents for s in skip) or ignore.match_file(rel + ("/" if folder else ""))

    for rel in _candidates(root, skipped):
        if skipped(rel):
            continue
        if _secrets().match_file(rel):
            left_out.append(rel)
            continue
        names.append(rel)
    entries = _entries(root, sorted(set(names)), where, max_mb)
    digest, files = _digest(entries)
    commit, dirty = _git_state(root)
    size = sum(len(data) for _name, kind, data in entries if kind != "link")
    return Snapshot(root, digest, files, size, _archive(entries), sorted(left_out), commit, dirty)


def _ignore_spec(root: Path, where: str):
    import pathspec

    lines = list(BUILTIN_EXCLUDES)
    ignore = root / IGNORE_FILE
    if ignore.is_file():
        try:
            lines += ignore.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(f"{where}: cannot read {ignore} ({exc}). Fix: make it a readable text file.") from None
    return pathspec.GitIgnoreSpec.from_lines(lines)


@functools.cache
def _secrets():
    """SECRET_PATTERNS as a spec, made on first use (pathspec imported by a launch only: `orch --help` stays quick)."""
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(SECRET_PATTERNS)


def _candidates(root: Path, skipped) -> Iterator[str]:
    """Relative names of what may go: git's listing inside a work tree, else every entry (links not followed)."""
    listed = _git_listing(root)
    if listed is not None:
        for rel in listed:
            path = root / rel
            if path.is_dir() and not path.is_symlink():  # a submodule: its files, walked
                yield from (f"{rel}/{sub}" for sub in _walk(path, lambda r, f=False: skipped(f"{rel}/{r}", f)))
            elif path.exists() or path.is_symlink():  # (a tracked file deleted since is no file)
                yield rel
        return
    yield from _walk(root, skipped)


def _walk(root: Path, skipped) -> Iterator[str]:
    """Every file and link under root; a folder that is ignored is not entered (a large `data/` costs nothing)."""
    for top, dirs, files in os.walk(root, followlinks=False):
        base = Path(top).relative_to(root)
        kept = []
        for name in dirs:
            rel = str(base / name)
            if (Path(top) / name).is_symlink():  # os.walk lists a link to a folder as a folder: it is a link
                yield rel
            elif not skipped(rel, True):
                kept.append(name)
        dirs[:] = kept
        yield from (str(base / name) for name in files)


def _git_listing(root: Path) -> list[str] | None:
    try:
        inside = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"], capture_output=True, text=True, timeout=30
        )
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            timeout=120,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [os.fsdecode(n) for n in out.split(b"\0") if n]


def _git_state(root: Path) -> tuple[str, bool]:
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        if head.returncode != 0:
            return "", False
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "."], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.SubprocessError):
        return "", False
    return head.stdout.strip(), bool(status.stdout.strip())


Entry = tuple[str, str, bytes]  # (name, kind: "file" | "exec" | "link", bytes or the link's target)


def _entries(root: Path, names: list[str], where: str, max_mb: float) -> list[Entry]:
    """Each name's kind and bytes; refused: a name that is not UTF-8, a link out of the folder, a file it cannot
    read, and more than `max_mb` in all (named before any file is read)."""
    bad = [n for n in names if not _utf8(n)]
    if bad:
        shown = ", ".join(ascii(n) for n in bad[:5])
        raise SpecError(
            f"{where}: file names that are not UTF-8: {shown}. Fix: rename them, or list them in {IGNORE_FILE}."
        )
    sizes, links = {}, {}
    for name in names:
        path = root / name
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            links[name] = os.readlink(path)
            _check_link(root, name, links[name], where)
        elif stat.S_ISREG(st.st_mode):
            sizes[name] = st.st_size
    _check_size(sizes, where, max_mb)
    out: list[Entry] = []
    for name in names:
        if name in links:
            out.append((name, "link", links[name].encode()))
        elif name in sizes:
            path = root / name
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise SpecError(
                    f"{where}: cannot read {name} ({exc.strerror}). Fix: make it readable, or list it in {IGNORE_FILE}."
                ) from None
            out.append((name, "exec" if os.access(path, os.X_OK) else "file", data))
    return out


def _utf8(name: str) -> bool:
    try:
        name.encode()
        return True
    except UnicodeEncodeError:
        return False


def _check_link(root: Path, name: str, target: str, where: str) -> None:
    resolved = Path(os.path.normpath(root / Path(name).parent / target))
    if os.path.isabs(target) or not (resolved == root or root in resolved.parents):
        raise SpecError(
            f"{where}: {name} is a link to {target}, outside the folder; orch never follows a link out of it. Fix: "
            f"copy what it points to into the folder, list it in {IGNORE_FILE}, or stage data with `data:`."
        )


def _check_size(sizes: dict[str, int], where: str, max_mb: float) -> None:
    total = sum(sizes.values())
    if total <= max_mb * 1e6:
        return
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    shown = ", ".join(f"{n} ({s / 1e6:.1f} MB)" for n, s in largest)
    raise SpecError(
        f"{where}: the folder holds {total / 1e6:.1f} MB, over the {max_mb:g} MB that `workdir_max_mb` allows; "
        f"largest: {shown}. Fix: list what the runs do not need in {IGNORE_FILE} (gitignore syntax), stage data "
        "with `data:`, or raise `workdir_max_mb`."
    )


def _digest(entries: list[Entry]) -> tuple[str, dict[str, str]]:
    h = hashlib.sha256()
    files = {}
    for name, kind, data in entries:
        files[name] = f"link:{data.decode()}" if kind == "link" else hashlib.sha256(data).hexdigest()
        h.update(f"{name}\0{kind}\0{files[name]}\0".encode())
    return h.hexdigest()[:16], files


def _archive(entries: list[Entry]) -> bytes:
    """A reproducible tar.gz: the same entries give the same bytes (sorted, mtime 0, owner 0)."""
    buf = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=6, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name, kind, data in entries:
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid = 0, 0, 0
            if kind == "link":
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, data.decode(), 0o777
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o755 if kind == "exec" else 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def changed_files(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Names added, removed or changed between two file lists (for a relaunch refused over changed code)."""
    return sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
