"""The store in S3 (s3://bucket/prefix): the same Store as a local folder, through boto3."""

from __future__ import annotations

import builtins
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orchestrator.errors import OrchError
from orchestrator.store.base import HashCache, Select, SyncResult, files_under, sha256_file
from orchestrator.store.s3url import parse_s3

SYNC_INDEX = ".orch-sync.json"  # per synced prefix: {relative path: {"size", "sha256"}} of what was uploaded
MULTIPART_THRESHOLD = 16 * 1024 * 1024


class S3Store:
    """A store under s3://bucket/prefix, through boto3/s3transfer (honours AWS_ENDPOINT_URL).

    sync_up compares content: every object carries its sha256 (user metadata), and each synced
    folder keeps an index of what it holds, so a re-sync of unchanged files is one GET plus local
    hashing (cached by size + mtime for the life of the process), and a changed file of the same
    size is still uploaded. Files upload in parallel; large ones in parallel parts.
    """

    metered = True  # S3 bills every request: PUT, COPY, POST, LIST $0.005 and GET $0.0004 per 1,000 (Standard)

    def __init__(self, url: str, client=None, workers: int = 16):
        from boto3.s3.transfer import TransferConfig

        from orchestrator.store.clients import client as boto_client

        where = parse_s3(url)
        self.bucket, self.prefix = where.bucket, where.prefix
        self.url = url.rstrip("/")
        self.client = client or boto_client("s3")
        self.workers = workers
        self.transfer = TransferConfig(
            multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_THRESHOLD, max_concurrency=8
        )
        self.hashes = HashCache()
        # {prefix: the index this store last wrote there}: a run folder has one writer (its attempt's agent), so
        # once it has written an index it knows what the store holds without a GET per sync
        self._written: dict[str, dict] = {}

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
                raise OrchError(
                    f"bucket {self.bucket} does not exist. Create it (`aws s3 mb s3://{self.bucket}`) or fix `store:`."
                ) from None
            if code in ("403", "AccessDenied", "Forbidden"):
                raise OrchError(
                    f"access to bucket {self.bucket} is denied. Use a bucket your credentials may write, or fix their "
                    "policy."
                ) from None
            raise

    def region(self) -> str:
        """The bucket's region (GetBucketLocation): a sweep's home region (docs/guides/regions.md)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            where = self.client.get_bucket_location(Bucket=self.bucket).get("LocationConstraint")
        except (ClientError, BotoCoreError) as exc:
            raise OrchError(f"cannot find the region of bucket {self.bucket} (GetBucketLocation): {exc}") from None
        # S3 answers no constraint for us-east-1 and the legacy `EU` for eu-west-1 (S3 API reference)
        return {"EU": "eu-west-1"}.get(where or "", where or "us-east-1")

    def put_bytes(self, key: str, data: bytes) -> None:
        digest = hashlib.sha256(data).hexdigest()
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, Metadata={"sha256": digest})

    def get_bytes(self, key: str) -> bytes | None:
        return self.get_versioned(key)[0]

    def get_versioned(self, key: str) -> tuple[bytes | None, str | None]:
        from botocore.exceptions import ClientError

        for again in (True, False):
            try:
                answer = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
                return answer["Body"].read(), answer["ETag"]
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "NoSuchBucket":  # S3 says so before any policy is read
                    raise OrchError(
                        f"bucket {self.bucket} does not exist. Create it (`aws s3 mb s3://{self.bucket}`) or fix "
                        "`store:`."
                    ) from None
                if self._missing(exc):
                    return None, None
                if exc.response.get("Error", {}).get("Code") not in ("AccessDenied", "403"):
                    raise
                if not self.exists(key):
                    return (
                        None,
                        None,
                    )  # S3 answers 403, not 404, for a missing key to a caller that may not list the bucket itself
                if not again:
                    raise
                # it is listed now: written between the GET and the LIST (another node's notice, say); read it
        return None, None

    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        """S3 conditional writes: If-Match the ETag read, or If-None-Match * for a new key; the new ETag, or None."""
        from botocore.exceptions import ClientError

        condition = {"IfMatch": version} if version else {"IfNoneMatch": "*"}
        try:
            return self.client.put_object(
                Bucket=self.bucket,
                Key=self._key(key),
                Body=data,
                Metadata={"sha256": hashlib.sha256(data).hexdigest()},
                **condition,
            )["ETag"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in (
                "PreconditionFailed",
                "ConditionalRequestConflict",
                "412",
                "409",
            ):
                return None
            raise

    def exists(self, key: str) -> bool:
        """Whether a key exists, by listing its own prefix (what an instance role may do where it may not GET a missing
        key)."""
        full = self._key(key)
        answer = self.client.list_objects_v2(Bucket=self.bucket, Prefix=full, MaxKeys=1)
        return any(o["Key"] == full for o in answer.get("Contents", []))

    def list(self, prefix: str) -> builtins.list[str]:
        base = self._key(prefix).rstrip("/") + "/"
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
            for obj in page.get("Contents", []):
                out.append(obj["Key"][len(self.prefix) + 1 :] if self.prefix else obj["Key"])
        return out

    def _index(self, prefix: str) -> dict:
        data = self.get_bytes(f"{prefix}/{SYNC_INDEX}")
        try:
            return json.loads(data) if data else {}
        except ValueError:
            return {}

    def _upload(self, path: Path, key: str, digest: str) -> None:
        # ChecksumAlgorithm: S3 keeps a SHA-256 of every object orch uploads, so a download can be verified whatever the
        # ETag is (not an MD5 under SSE-KMS or for multipart uploads)
        self.client.upload_file(
            str(path),
            self.bucket,
            self._key(key),
            ExtraArgs={"Metadata": {"sha256": digest}, "ChecksumAlgorithm": "SHA256"},
            Config=self.transfer,
        )

    def sync_up(
        self,
        local_dir: Path,
        prefix: str,
        prune: Select | None = None,
        indexed: bool = True,
        *,
        there: dict[str, int] | None = None,
    ) -> SyncResult:
        """`there` ({key under prefix: size}, from a listing): index entries it contradicts (an object deleted
        or replaced behind orch's back) are uploaded again instead of trusted."""
        local_dir = Path(local_dir)
        if prefix in self._written and there is None:
            index = dict(self._written[prefix])
        else:
            index = self._index(prefix) if indexed else {}
        if there is not None:
            index = {rel: meta for rel, meta in index.items() if there.get(rel) == meta.get("size")}
        result = SyncResult()
        todo = []
        for path in files_under(local_dir):
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
            self._written[prefix] = dict(index)
            return result
        if todo:
            with ThreadPoolExecutor(min(self.workers, len(todo))) as pool:
                sizes = list(
                    pool.map(lambda t: (self._upload(t[0], f"{prefix}/{t[1]}", t[2]), t[0].stat().st_size)[1], todo)
                )
            for (_path, rel, digest), size in zip(todo, sizes):
                index[rel] = {"size": size, "sha256": digest}
            result.copied, result.bytes = len(todo), sum(sizes)
        for i in range(0, len(gone), 1000):  # what the command deleted (old checkpoints) goes from the store too
            batch = gone[i : i + 1000]
            self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": self._key(f"{prefix}/{rel}")} for rel in batch]}
            )
        for rel in gone:
            index.pop(rel, None)
        result.deleted = len(gone)
        if indexed:
            self.put_bytes(f"{prefix}/{SYNC_INDEX}", json.dumps(index, sort_keys=True).encode())
        self._written[prefix] = dict(index)
        return result

    def sync_down(
        self, prefix: str, local_dir: Path, only: Select | None = None, stale_ok: Select | None = None
    ) -> SyncResult:

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
            todo.append((rel, dst, meta.get("sha256")))

        def fetch(item):
            rel, dst, digest = item
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.sync.tmp")
            key = self._key(f"{prefix}/{rel}")
            self.client.download_file(self.bucket, key, str(tmp), Config=self.transfer)
            # Large objects come in ranged GETs and carry composite (multipart) checksums, which botocore does not
            # check: the SHA-256 orch recorded at upload is what a download is held to, whatever its size.
            if digest and sha256_file(tmp) != digest:
                if stale_ok is None or not stale_ok(rel):
                    tmp.unlink(missing_ok=True)
                    raise OrchError(
                        f"s3://{self.bucket}/{key}: the download does not match the SHA-256 orch recorded when it "
                        "uploaded it (corrupted in transit or changed in S3); nothing was kept"
                    )
                result.stale.append(rel)  # the index is older than the file: S3's bytes are kept
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
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]]})
        return len(keys)
