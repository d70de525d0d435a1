"""Data staging: the sweep's `data:` entries copied to the host before a command starts.

Once per host: each `to:` folder keeps a manifest of what it holds (`.orch-staged.json`: the
source, and per file its size and ETag), so later attempts and other runs on the same host
fetch nothing; a file already there with the same size and content (e.g. baked into the image:
no manifest yet) is kept. Transfers run in parallel (S3: boto3's transfer manager, multipart for
large objects), go to a temporary name and are renamed when verified: the size, and the SHA-256 that
`orch data push` recorded for the file (its sync index, `.orch-sync.json`, or the object's `sha256`
metadata), computed over the downloaded bytes — botocore's own check covers only single-part objects
fetched whole (multipart uploads carry composite checksums, ranged GETs none). An object orch did not
upload has only its size checked (and botocore's checksum where S3 has a full-object one); an ETag is not
trusted as an MD5 after a download (it is none for SSE-KMS objects and multipart uploads). Runs staging
the same folder take turns (a lock).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from orchestrator.contract import bucket_problem
from orchestrator.store.base import sha256_file
from orchestrator.store.s3url import SCHEME, is_s3, parse_s3

log = logging.getLogger("orch.agent")

MANIFEST = ".orch-staged.json"
LOCK = ".orch-staging.lock"
SKIP = (".orch-sync.json",)  # orch's own sync index, when the prefix was uploaded with `orch data push`
MD5_MAX = 256 * 1024 * 1024  # files up to this size are checked against a single-part ETag


@dataclass
class StageResult:
    source: str
    to: str
    files: int = 0  # files the source holds
    fetched: int = 0  # files copied this time
    bytes: int = 0  # bytes copied this time


def _same(path: Path, size: int, etag: str) -> bool:
    """A local file that already is the object: same size, and for a single-part object the same MD5."""
    try:
        if path.stat().st_size != size:
            return False
    except FileNotFoundError:
        return False
    etag = etag.strip('"')
    if "-" in etag or size > MD5_MAX or not etag:  # multipart ETags are not an MD5 of the content: size it is
        return True
    return sha256_file(path, "md5") == etag


def _listing_s3(client, url: str) -> dict[str, tuple[int, str]]:
    where = parse_s3(url)
    bucket, prefix = where.bucket, where.folder
    out: dict[str, tuple[int, str]] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix) :]
            if rel and not rel.endswith("/") and rel.rsplit("/", 1)[-1] not in SKIP:
                out[rel] = (int(obj["Size"]), obj.get("ETag", ""))
    return out


LARGE = 8 * 1024 * 1024  # above this, downloads are ranged GETs and botocore checks no checksum


def _recorded_sha256(client, url: str) -> dict[str, str]:
    """{relative path: sha256} from the sync index `orch data push` keeps under the prefix; {} without one."""
    where = parse_s3(url)
    bucket, prefix = where.bucket, where.folder
    try:
        index = json.loads(client.get_object(Bucket=bucket, Key=prefix + SKIP[0])["Body"].read())
    except Exception:  # none (not pushed by orch), unreadable or not JSON: each object's metadata, else size only
        return {}
    return {rel: str(meta["sha256"]) for rel, meta in index.items() if isinstance(meta, dict) and meta.get("sha256")}


def _object_sha256(client, url: str, rel: str):
    where = parse_s3(url)
    bucket, prefix = where.bucket, where.folder
    try:
        return client.head_object(Bucket=bucket, Key=prefix + rel).get("Metadata", {}).get("sha256")
    except Exception:
        return None


def _listing_local(folder: Path) -> dict[str, tuple[int, str]]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(folder))] = (st.st_size, f"{st.st_mtime_ns}")
    return out


def inside(dest: Path, rel: str) -> bool:
    """A relative key names a file inside `dest`: no absolute path, no '..', '.' or empty part, and no link out."""
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in rel:
        return False
    root = dest.resolve()
    return (root / rel).resolve().is_relative_to(root)


def stage(source: str, to: str, client=None, workers: int = 16) -> StageResult:
    """Make `to` hold what `source` holds (s3://bucket/prefix/ or a local folder); fetch only what differs."""
    dest = Path(os.path.expanduser(to))
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run on this host staging the same folder: wait for it
        return _stage_locked(source, dest, client, workers)


def _stage_locked(source: str, dest: Path, client, workers: int) -> StageResult:
    s3 = is_s3(source)
    if s3 and client is None:
        import boto3

        client = boto3.client("s3")
    want = _listing_s3(client, source) if s3 else _listing_local(Path(os.path.expanduser(source)))
    if not want:
        raise FileNotFoundError(f"data source {source} holds no files")
    outside = sorted(rel for rel in want if not inside(dest, rel))
    if outside:  # a key like `x/../../../etc/cron.d/y` is anyone-with-write-access-to-the-prefix's file on every host
        raise OSError(
            f"data source {source}: {len(outside)} key(s) would be written outside {dest}, e.g. {outside[0]!r} "
            f"(a '..' part, an absolute path, an empty name, or under a link in {dest} that points out of it); "
            "nothing was staged. Remove or rename those objects"
        )
    manifest = dest / MANIFEST
    try:
        had = json.loads(manifest.read_text()) if manifest.exists() else {}
    except ValueError:
        had = {}
    known = had.get("files", {}) if had.get("source") == source else {}
    todo = [
        rel
        for rel, (size, tag) in want.items()
        if not (known.get(rel) == [size, tag] and (dest / rel).is_file() and (dest / rel).stat().st_size == size)
        and not (s3 and _same(dest / rel, size, tag))
    ]
    result = StageResult(source=source, to=str(dest), files=len(want))
    recorded = _recorded_sha256(client, source) if s3 and todo else {}

    def fetch(rel: str) -> int:
        size, tag = want[rel]
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.orch-part")
        if s3:
            where = parse_s3(source)
            # An ETag is no MD5 for SSE-KMS/SSE-C objects or multipart uploads: the size and the SHA-256 orch
            # recorded are checked below (botocore's own check covers only small single-part objects).
            client.download_file(where.bucket, where.folder + rel, str(tmp), ExtraArgs={"ChecksumMode": "ENABLED"})
        else:
            shutil.copyfile(Path(os.path.expanduser(source)) / rel, tmp)
        # a large object outside the index (a sub-prefix of what was pushed): its own metadata, one HEAD
        digest = recorded.get(rel) or (_object_sha256(client, source, rel) if s3 and size > LARGE else None)
        if tmp.stat().st_size != size or (digest and sha256_file(tmp) != digest):
            tmp.unlink(missing_ok=True)
            raise OSError(
                f"{source}{rel}: the copy does not match the source (size, or the SHA-256 `orch data push` recorded); "
                "nothing was kept. Try again; if it persists, push the data again"
            )
        os.replace(tmp, target)
        return size

    if todo:
        with ThreadPoolExecutor(min(workers, len(todo))) as pool:
            sizes = list(pool.map(fetch, todo))
        result.fetched, result.bytes = len(todo), sum(sizes)
    tmp = manifest.with_name(MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"source": source, "files": {rel: [size, tag] for rel, (size, tag) in want.items()}}))
    os.replace(tmp, manifest)
    return result


def stage_all(entries: list[dict[str, str]], client=None) -> list[StageResult]:
    """Every `data:` entry of a task, in order; raises with the entry named when one cannot be staged."""
    results = []
    for entry in entries:
        try:
            results.append(stage(entry["from"], entry["to"], client))
        except Exception as exc:
            raise OSError(f"staging {entry['from']} to {entry['to']}: {exc}") from exc
    return results


def push(local_dir: Path, url: str, client=None) -> StageResult:
    """`orch data push`: upload a folder to s3://bucket/prefix/ (only files whose content changed since
    the last push, by sha256), then check that every file is in S3 with its size."""
    from orchestrator.errors import OrchError
    from orchestrator.store.s3 import S3Store

    where = parse_s3(url) if is_s3(url) else None
    problem = bucket_problem(where.bucket) if where is not None else None
    if where is None or problem or not where.prefix:
        raise OrchError(
            f"{url}: {problem + '; ' if problem else ''}give a bucket and a prefix, e.g. s3://my-bucket/datasets/cifar10/",
            exit_code=2,
        )
    local = {str(p.relative_to(local_dir)): p.stat().st_size for p in sorted(Path(local_dir).rglob("*")) if p.is_file()}
    if not local:
        raise OrchError(f"{local_dir}: no files to push", exit_code=2)
    store = S3Store(f"{SCHEME}{where.bucket}", client=client)
    try:
        store.check()
    except OrchError as exc:  # said for a sweep's `store:`; here the bucket is the URL's
        raise OrchError(str(exc).replace("or fix `store:`", f"or fix the URL ({url})"), exit_code=2) from None
    before = {
        rel: size for rel, (size, _) in _listing_s3(store.client, url).items()
    }  # the index alone would miss a deleted object
    done = store.sync_up(Path(local_dir), where.prefix, there=before)
    there = _listing_s3(store.client, url)
    bad = sorted(rel for rel, size in local.items() if there.get(rel, (None, ""))[0] != size)
    if bad:
        raise OrchError(
            f"{url}: {len(bad)} file(s) are not in S3 as they are here after the upload (e.g. {bad[0]}); push again"
        )
    return StageResult(source=str(local_dir), to=url, files=len(local), fetched=done.copied, bytes=done.bytes)
