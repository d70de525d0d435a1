"""The folder store: a Store on a local (or mounted) folder, with atomic writes."""

from __future__ import annotations

import builtins
import fcntl
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from orchestrator.errors import OrchError
from orchestrator.store.base import HashCache, Select, SyncResult, atomic_write, files_under


def _copy_tree(
    src_root: Path, dst_root: Path, hashes: HashCache, only: Select | None = None, prune: Select | None = None
) -> SyncResult:
    result = SyncResult()
    for src in files_under(src_root):
        rel = str(src.relative_to(src_root))
        if only is not None and not only(rel):
            continue
        dst = dst_root / rel
        try:
            if dst.is_file() and dst.stat().st_size == src.stat().st_size and hashes.digest(dst) == hashes.digest(src):
                result.skipped += 1
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.sync.tmp")
            shutil.copy2(src, tmp)
            os.replace(tmp, dst)
        except FileNotFoundError:  # the writer replaced or removed it meanwhile; the next sync catches up
            continue
        result.copied += 1
        result.bytes += dst.stat().st_size
    if prune is not None:
        for dst in files_under(dst_root):
            rel = str(dst.relative_to(dst_root))
            if prune(rel) and not (src_root / rel).exists():
                dst.unlink(missing_ok=True)
                result.deleted += 1
    return result


LOCK_WAIT_S = 10.0


def _lock(fd: int, wait_s: float) -> bool:
    """flock(LOCK_EX) within wait_s (closing fd releases it)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


class LocalStore:
    """A store in a local folder."""

    metered = False

    def __init__(self, root: str):
        self.root = Path(root)
        self.url = str(self.root)
        self.hashes = HashCache()

    def _path(self, key: str) -> Path:
        return self.root / key

    def put_bytes(self, key: str, data: bytes) -> None:
        atomic_write(self._path(key), data)

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def get_versioned(self, key: str) -> tuple[bytes | None, str | None]:
        data = self.get_bytes(key)
        return data, None if data is None else hashlib.sha256(data).hexdigest()

    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        """Writers of a folder's records take turns (flock on the folder). The new file is written and
        fsynced before the lock is taken, so the lock is held for a compare and a rename only: a writer
        stopped or stalled (SIGSTOP, a slow disk) while holding it blocks the others for microseconds, not
        for ever. A lock not had within LOCK_WAIT_S counts as a changed record (None: decide again)."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd_tmp, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd_tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                if not _lock(fd, LOCK_WAIT_S):
                    return None
                if self.get_versioned(key)[1] != version:
                    return None
                os.replace(tmp, path)
                return hashlib.sha256(data).hexdigest()
            finally:
                os.close(fd)
        finally:
            Path(tmp).unlink(missing_ok=True)

    def list(self, prefix: str) -> builtins.list[str]:
        base = self._path(prefix)
        return [str(p.relative_to(self.root)) for p in files_under(base)]

    def sync_up(self, local_dir: Path, prefix: str, prune: Select | None = None, indexed: bool = True) -> SyncResult:
        return _copy_tree(Path(local_dir), self._path(prefix), self.hashes, prune=prune)

    def sync_down(
        self, prefix: str, local_dir: Path, only: Select | None = None, stale_ok: Select | None = None
    ) -> SyncResult:
        return _copy_tree(self._path(prefix), Path(local_dir), self.hashes, only=only)

    def delete_prefix(self, prefix: str) -> int:
        base = self._path(prefix)
        n = len(list(files_under(base)))
        shutil.rmtree(base, ignore_errors=True)
        return n


def usable_folder(path: Path, what: str, fix: str) -> Path:
    """Create `path` if needed and check that it can be written; else a clear error (exit 2) naming it and the fix."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / ".probe").touch()
    except OSError as exc:
        raise OrchError(f"cannot use {what} {path}: {exc.strerror or exc}. {fix}", exit_code=2) from None
    return path
