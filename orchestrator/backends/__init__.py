"""Backends turn a run into a process on some host: this machine (`local`, tmux through
`tmux_server`) or EC2 spot instances (`aws/`). They compose the parts below them and differ only in
primitives (run on a host, put a file, list, acquire, release); `base` holds the interface and the
dataclasses that cross it, `bundle` the code shipped to hosts.

May import `aws`, `host`, `remote`, `store`, `sweep`, `contract`, `errors`, `wait`; never `control`
or `cli`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.backends.base import Backend

if TYPE_CHECKING:
    from orchestrator.sweep.spec import Sweep


def backend_for(sweep: "Sweep") -> Backend:
    if sweep.spec.backend == "local":
        from orchestrator.backends.local import LocalBackend

        return LocalBackend(sweep)
    from orchestrator.backends.aws.backend import AwsBackend

    return AwsBackend(sweep)
