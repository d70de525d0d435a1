"""An S3 location as orch writes it: `s3://bucket/prefix` (a store, a `data:` source, `orch data push`).

Standard library only: the host's staging reads these too.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.contract import bucket_problem

SCHEME = "s3://"


@dataclass(frozen=True)
class S3Url:
    bucket: str
    prefix: str  # without a slash at either end; "" for the whole bucket

    @property
    def folder(self) -> str:
        """The prefix as a folder ("a/b/"), so that a listing of a/b never takes in a/bc; "" for the bucket."""
        return f"{self.prefix}/" if self.prefix else ""


def is_s3(url: str) -> bool:
    return url.startswith(SCHEME)


def parse_s3(url: str) -> S3Url:
    """s3://bucket/a/b/ -> S3Url("bucket", "a/b"). The bucket's name is not checked (see bucket_problem)."""
    if not is_s3(url):
        raise ValueError(f"{url!r} is not an s3:// URL")
    bucket, _, prefix = url[len(SCHEME) :].partition("/")
    return S3Url(bucket, prefix.strip("/"))


def valid_bucket(name: str) -> bool:
    return bucket_problem(name) is None
