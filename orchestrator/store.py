"""The store: where status, metrics, logs and checkpoints live (a local folder, or S3 for the aws backend).

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
from typing import Any, Callable, Iterable, List, Optional, Protocol

from .errors import OrchError


Select = Callable[[str], bool]  # relative path ('ckpt/12/state.pt') -> whether it takes part


@dataclass
class SyncResult:
    """What one sync moved."""

    copied: int = 0  # files written to the destination
    skipped: int = 0  # files already identical there
    bytes: int = 0  # bytes written
    deleted: int = 0  # files pruned from the destination


class Store(Protocol):
    url: str

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def get_bytes(self, key: str) -> Optional[bytes]: ...

    def list(self, prefix: str) -> List[str]: ...

    def sync_up(self, local_dir: Path, prefix: str, prune: Optional[Select] = None) -> SyncResult:
        """Copy what changed; then delete from the store the files `prune` selects that are gone locally."""

    def sync_down(self, prefix: str, local_dir: Path, only: Optional[Select] = None) -> SyncResult:
        """Copy what differs from the store; with `only`, just the files it selects."""

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


def _copy_tree(src_root: Path, dst_root: Path, hashes: HashCache, only: Optional[Select] = None, prune: Optional[Select] = None) -> SyncResult:
    result = SyncResult()
    for src in _files(src_root):
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
        for dst in _files(dst_root):
            rel = str(dst.relative_to(dst_root))
            if prune(rel) and not (src_root / rel).exists():
                dst.unlink(missing_ok=True)
                result.deleted += 1
    return result


class LocalStore:
    """A store in a local folder."""

    def __init__(self, root: str):
        self.root = Path(root)
        self.url = str(self.root)
        self.hashes = HashCache()

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

    def sync_up(self, local_dir: Path, prefix: str, prune: Optional[Select] = None) -> SyncResult:
        return _copy_tree(Path(local_dir), self._path(prefix), self.hashes, prune=prune)

    def sync_down(self, prefix: str, local_dir: Path, only: Optional[Select] = None) -> SyncResult:
        return _copy_tree(self._path(prefix), Path(local_dir), self.hashes, only=only)

    def delete_prefix(self, prefix: str) -> int:
        base = self._path(prefix)
        n = len(list(_files(base)))
        shutil.rmtree(base, ignore_errors=True)
        return n


SYNC_INDEX = ".orch-sync.json"  # per synced prefix: {relative path: {"size", "sha256"}} of what was uploaded
MULTIPART_THRESHOLD = 16 * 1024 * 1024


class S3Store:
    """A store under s3://bucket/prefix, through boto3/s3transfer (honours AWS_ENDPOINT_URL).

    sync_up compares content: every object carries its sha256 (user metadata), and each synced
    folder keeps an index of what it holds, so a re-sync of unchanged files is one GET plus local
    hashing (cached by size + mtime for the life of the process), and a changed file of the same
    size is still uploaded. Files upload in parallel; large ones in parallel parts.
    """

    def __init__(self, url: str, client=None, workers: int = 16):
        import boto3
        from boto3.s3.transfer import TransferConfig

        rest = url[len("s3://"):]
        self.bucket, _, prefix = rest.partition("/")
        self.prefix = prefix.strip("/")
        self.url = url.rstrip("/")
        self.client = client or boto3.client("s3")
        self.workers = workers
        self.transfer = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_THRESHOLD, max_concurrency=8)
        self.hashes = HashCache()

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _missing(self, exc) -> bool:
        return exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound")

    def check(self) -> None:
        """Fail with the next step when the bucket is missing or not ours."""
        from botocore.exceptions import ClientError, NoCredentialsError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except NoCredentialsError:
            raise OrchError("No AWS credentials found. Run `aws configure` or set AWS_PROFILE.") from None
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("404", "NoSuchBucket", "NotFound"):
                raise OrchError(f"bucket {self.bucket} does not exist. Create it (`aws s3 mb s3://{self.bucket}`) or fix `store:`.") from None
            if code in ("403", "AccessDenied", "Forbidden"):
                raise OrchError(f"access to bucket {self.bucket} is denied. Use a bucket your credentials may write, or fix their policy.") from None
            raise

    def put_bytes(self, key: str, data: bytes) -> None:
        digest = hashlib.sha256(data).hexdigest()
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, Metadata={"sha256": digest})

    def get_bytes(self, key: str) -> Optional[bytes]:
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except ClientError as exc:
            if self._missing(exc):
                return None
            if exc.response.get("Error", {}).get("Code") in ("AccessDenied", "403") and not self._exists(key):
                return None  # S3 answers 403, not 404, for a missing key to a caller that may not list the bucket itself
            raise

    def _exists(self, key: str) -> bool:
        """Whether a key exists, by listing its own prefix (what an instance role may do where it may not GET a missing key)."""
        full = self._key(key)
        answer = self.client.list_objects_v2(Bucket=self.bucket, Prefix=full, MaxKeys=1)
        return any(o["Key"] == full for o in answer.get("Contents", []))

    def list(self, prefix: str) -> List[str]:
        base = self._key(prefix).rstrip("/") + "/"
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
            for obj in page.get("Contents", []):
                out.append(obj["Key"][len(self.prefix) + 1:] if self.prefix else obj["Key"])
        return out

    def _index(self, prefix: str) -> dict:
        data = self.get_bytes(f"{prefix}/{SYNC_INDEX}")
        try:
            return json.loads(data) if data else {}
        except ValueError:
            return {}

    def _upload(self, path: Path, key: str, digest: str) -> None:
        self.client.upload_file(str(path), self.bucket, self._key(key), ExtraArgs={"Metadata": {"sha256": digest}}, Config=self.transfer)

    def sync_up(self, local_dir: Path, prefix: str, prune: Optional[Select] = None) -> SyncResult:
        from concurrent.futures import ThreadPoolExecutor

        local_dir = Path(local_dir)
        index = self._index(prefix)
        result = SyncResult()
        todo = []
        for path in _files(local_dir):
            rel = str(path.relative_to(local_dir))
            try:
                digest = self.hashes.digest(path)
            except FileNotFoundError:
                continue
            if index.get(rel, {}).get("sha256") == digest:
                result.skipped += 1
                continue
            todo.append((path, rel, digest))
        gone = [rel for rel in index if prune is not None and prune(rel) and not (local_dir / rel).exists()]
        if not todo and not gone:
            return result
        if todo:
            with ThreadPoolExecutor(min(self.workers, len(todo))) as pool:
                sizes = list(pool.map(lambda t: (self._upload(t[0], f"{prefix}/{t[1]}", t[2]), t[0].stat().st_size)[1], todo))
            for (path, rel, digest), size in zip(todo, sizes):
                index[rel] = {"size": size, "sha256": digest}
            result.copied, result.bytes = len(todo), sum(sizes)
        for i in range(0, len(gone), 1000):  # what the command deleted (old checkpoints) goes from the store too
            batch = gone[i:i + 1000]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": self._key(f"{prefix}/{rel}")} for rel in batch]})
        for rel in gone:
            index.pop(rel, None)
        result.deleted = len(gone)
        self.put_bytes(f"{prefix}/{SYNC_INDEX}", json.dumps(index, sort_keys=True).encode())
        return result

    def sync_down(self, prefix: str, local_dir: Path, only: Optional[Select] = None) -> SyncResult:
        from concurrent.futures import ThreadPoolExecutor

        local_dir = Path(local_dir)
        result = SyncResult()
        todo = []
        for rel, meta in self._index(prefix).items():
            if only is not None and not only(rel):
                continue
            dst = local_dir / rel
            if dst.is_file() and self.hashes.digest(dst) == meta.get("sha256"):
                result.skipped += 1
                continue
            todo.append((rel, dst))

        def fetch(item):
            rel, dst = item
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.sync.tmp")
            self.client.download_file(self.bucket, self._key(f"{prefix}/{rel}"), str(tmp), Config=self.transfer)
            os.replace(tmp, dst)
            return dst.stat().st_size

        if todo:
            with ThreadPoolExecutor(min(self.workers, len(todo))) as pool:
                result.bytes = sum(pool.map(fetch, todo))
        result.copied = len(todo)
        return result

    def delete_prefix(self, prefix: str) -> int:
        keys = [self._key(k) for k in self.list(prefix)]
        for i in range(0, len(keys), 1000):
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})
        return len(keys)


def usable_folder(path: Path, what: str, fix: str) -> Path:
    """Create `path` if needed and check that it can be written; else a clear error (exit 2) naming it and the fix."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / ".probe").touch()
    except OSError as exc:
        raise OrchError(f"cannot use {what} {path}: {exc.strerror or exc}. {fix}", exit_code=2) from None
    return path


def open_store(url: str) -> Store:
    if url.startswith("s3://"):
        return S3Store(url)
    usable_folder(Path(url), "the store folder", "Pick a writable `store:` path.")
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
    store.put_bytes(key, (json.dumps(plain_json(obj), indent=2, sort_keys=True, allow_nan=False) + "\n").encode())


def plain_json(obj: Any) -> Any:
    """A copy that strict JSON can hold: NaN and infinities (which Python writes as NaN/Infinity) become null."""
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, dict):
        return {k: plain_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_json(v) for v in obj]
    return obj


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
