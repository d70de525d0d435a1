"""The store: where status, metrics, logs and checkpoints live (a local folder, or S3 for the aws backend).

Keys are '/'-separated paths relative to the store root (<sweep>/<run>/status.json ...).
Local writes are temp file + fsync + rename, so a reader never sees half a file.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator.contract import finite

Select = Callable[[str], bool]  # relative path ('ckpt/12/state.pt') -> whether it takes part


@dataclass
class SyncResult:
    """What one sync moved."""

    copied: int = 0  # files written to the destination
    skipped: int = 0  # files already identical there
    bytes: int = 0  # bytes written
    deleted: int = 0  # files pruned from the destination
    stale: list[str] = field(default_factory=list)  # kept although their index's digest was another (stale_ok)


class Store(Protocol):
    url: str
    metered: bool  # each request is billed (S3): readers poll what changed, not everything

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def get_bytes(self, key: str) -> bytes | None: ...

    def list(self, prefix: str) -> builtins.list[str]: ...

    def exists(self, key: str) -> bool:
        """Whether the key exists, in one small request (S3: a LIST of its own name; no body is read)."""
        ...

    def sync_up(self, local_dir: Path, prefix: str, prune: Select | None = None, indexed: bool = True) -> SyncResult:
        """Copy what changed; then delete from the store the files `prune` selects that are gone locally.
        `indexed=False`: a folder nobody syncs down (the logs, read key by key): S3 keeps no index of it, and what
        was uploaded is remembered by this process only (a new process uploads the folder's files once)."""
        ...

    def sync_down(
        self, prefix: str, local_dir: Path, only: Select | None = None, stale_ok: Select | None = None
    ) -> SyncResult:
        """Copy what differs from the store; with `only`, just the files it selects. A file that does not match
        the digest its index recorded is refused (OrchError), unless `stale_ok` selects it: then the index is
        taken to be older than the file (its uploader was lost between the upload and the index) and the store's
        bytes are kept (listed in `stale`)."""
        ...

    def delete_prefix(self, prefix: str) -> int: ...

    def get_versioned(self, key: str) -> tuple[bytes | None, str | None]:
        """The object and its version (None, None when missing): what put_if compares against."""
        ...

    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        """Write only if the key still holds `version` (None: only if it does not exist); the new
        version, or None (nothing written) when it changed."""
        ...


def atomic_write(path: Path, data: bytes) -> None:
    """Write via temp file + fsync + rename, so the file is either old or new, never torn."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_file(path: Path, algorithm: str = "sha256") -> str:
    """A file's digest (sha256 by default), read in 1 MiB chunks."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def files_under(root: Path) -> Iterable[Path]:
    """The files of a folder to sync: every regular file, and every link to a file inside the folder (synced as the
    file it names). A link out of the folder is never followed: what it names is not the folder's (links_out says
    which); a link to a folder is not walked (what is inside the folder is synced where it really lies)."""
    if not root.is_dir():
        return []
    top = root.resolve()
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and not p.name.endswith(".tmp") and (not p.is_symlink() or _inside(p, top))
    )


def links_out(root: Path) -> list[str]:
    """The links under root that name something outside it (files_under leaves them out), relative to root."""
    if not root.is_dir():
        return []
    top = root.resolve()
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_symlink() and not _inside(p, top))


def _inside(link: Path, top: Path) -> bool:
    try:
        target = link.resolve()
    except (OSError, RuntimeError):  # a loop of links
        return False
    return target == top or top in target.parents


class HashCache:
    """sha256 of files, recomputed only when (size, mtime, ctime, inode) change.

    ctime cannot be set by a writer, so a rewrite with the same size and a restored mtime is
    still noticed: syncs compare content while hashing each file once per change.
    """

    def __init__(self):
        self._seen: dict = {}

    def digest(self, path: Path) -> str:
        st = path.stat()
        key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        hit = self._seen.get(path)
        if hit and hit[0] == key:
            return hit[1]
        value = sha256_file(path)
        self._seen[path] = (key, value)
        return value


def get_json(store: Store, key: str) -> Any | None:
    data = store.get_bytes(key)
    if data is None:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than any record orch writes
        return None


def json_bytes(obj: Any) -> bytes:
    """How orch writes a JSON record: strict JSON (NaN and infinities as null), sorted, indented."""
    return (json.dumps(plain_json(obj), indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def put_json(store: Store, key: str, obj: Any) -> None:
    store.put_bytes(key, json_bytes(obj))


def plain_json(obj: Any) -> Any:
    """A copy that strict JSON can hold: NaN and infinities (which Python writes as NaN/Infinity) become null."""
    if isinstance(obj, float) and finite(obj) is None:
        return None
    if isinstance(obj, dict):
        return {k: plain_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_json(v) for v in obj]
    return obj


def read_jsonl(data: bytes | None) -> list[dict]:
    """Parse JSON lines, ignoring a torn last line (a writer may be mid-line)."""
    out = []
    for line in (data or b"").splitlines():
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # a torn line, or one nested deeper than Python parses
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out
