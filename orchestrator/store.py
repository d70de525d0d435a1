"""The store: where status, metrics, logs and checkpoints live (a local folder; S3 comes with the aws backend).

Keys are '/'-separated paths relative to the store root (<sweep>/<run>/status.json ...).
Local writes are temp file + fsync + rename, so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, List, Optional, Protocol

from .errors import OrchError


@dataclass
class SyncResult:
    """What one sync moved."""

    copied: int = 0  # files written to the destination
    skipped: int = 0  # files already identical there
    bytes: int = 0  # bytes written


class Store(Protocol):
    url: str

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def get_bytes(self, key: str) -> Optional[bytes]: ...

    def list(self, prefix: str) -> List[str]: ...

    def sync_up(self, local_dir: Path, prefix: str) -> SyncResult: ...

    def sync_down(self, prefix: str, local_dir: Path) -> SyncResult: ...

    def delete_prefix(self, prefix: str) -> int: ...


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


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(root: Path) -> Iterable[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".tmp"))


def _same(src: Path, dst: Path) -> bool:
    """Cheap check first (size + mtime, which copies preserve), content hash only when they disagree."""
    if not dst.is_file():
        return False
    a, b = src.stat(), dst.stat()
    if a.st_size != b.st_size:
        return False
    if a.st_mtime_ns == b.st_mtime_ns:
        return True
    return sha256_file(src) == sha256_file(dst)


def _copy_tree(src_root: Path, dst_root: Path) -> SyncResult:
    result = SyncResult()
    for src in _files(src_root):
        dst = dst_root / src.relative_to(src_root)
        if _same(src, dst):
            result.skipped += 1
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.sync.tmp")
        try:
            shutil.copy2(src, tmp)
            os.replace(tmp, dst)
        except FileNotFoundError:  # the writer replaced or removed it meanwhile; next sync catches up
            tmp.unlink(missing_ok=True)
            continue
        result.copied += 1
        result.bytes += dst.stat().st_size
    return result


class LocalStore:
    """A store in a local folder."""

    def __init__(self, root: str):
        self.root = Path(root)
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / key

    def put_bytes(self, key: str, data: bytes) -> None:
        atomic_write(self._path(key), data)

    def get_bytes(self, key: str) -> Optional[bytes]:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def list(self, prefix: str) -> List[str]:
        base = self._path(prefix)
        return [str(p.relative_to(self.root)) for p in _files(base)]

    def list_dirs(self, prefix: str) -> List[str]:
        base = self._path(prefix)
        return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []

    def sync_up(self, local_dir: Path, prefix: str) -> SyncResult:
        return _copy_tree(Path(local_dir), self._path(prefix))

    def sync_down(self, prefix: str, local_dir: Path) -> SyncResult:
        return _copy_tree(self._path(prefix), Path(local_dir))

    def delete_prefix(self, prefix: str) -> int:
        base = self._path(prefix)
        n = len(list(_files(base)))
        shutil.rmtree(base, ignore_errors=True)
        return n


def open_store(url: str) -> Store:
    if url.startswith("s3://"):
        raise OrchError(f"{url}: S3 stores come with the aws backend, which this version does not have yet.")
    try:
        Path(url).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OrchError(f"cannot create the store folder {url}: {exc.strerror}. Pick a writable `store:` path.") from None
    return LocalStore(url)


def get_json(store: Store, key: str) -> Optional[Any]:
    data = store.get_bytes(key)
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def put_json(store: Store, key: str, obj: Any) -> None:
    store.put_bytes(key, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def read_jsonl(data: Optional[bytes]) -> List[dict]:
    """Parse JSON lines, ignoring a torn last line (a writer may be mid-line)."""
    out = []
    for line in (data or b"").splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out
