"""The store: where runs keep their records, metrics, logs and checkpoints — a folder or an S3 prefix.

`base` has the Store protocol and the helpers every store shares; `folder` and `s3` the two stores, `tunneled` the
store as an ssh host reaches it (through its controller);
`status` the run records written in a store (one writer per record, conditional writes); `lifecycle`
a run's life as types (the record, its states and stop reasons, the transitions that change them).
`layout` names every key of the store's layout; `s3url` splits an s3://bucket/prefix location.
This package imports only `orchestrator.errors` and `orchestrator.contract` (it ships to hosts).
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.store.base import Store
from orchestrator.store.folder import LocalStore, usable_folder
from orchestrator.store.s3url import is_s3


def open_store(url: str) -> Store:
    if url.startswith("tunnel:"):  # a host of `backend: ssh`: through its controller's SSH connection
        from orchestrator.store.tunneled import TunnelStore

        return TunnelStore(url)
    if is_s3(url):
        from orchestrator.store.s3 import S3Store

        return S3Store(url)
    usable_folder(Path(url), "the store folder", "Pick a writable `store:` path.")
    return LocalStore(url)
