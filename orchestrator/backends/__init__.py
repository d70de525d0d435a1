"""Backends turn a run into a process on some host: this machine (local) or EC2 spot (aws)."""

from __future__ import annotations

from ..spec import Sweep
from .base import Backend


def backend_for(sweep: Sweep) -> Backend:
    if sweep.spec.backend == "local":
        from .local import LocalBackend

        return LocalBackend(sweep)
    from ..errors import OrchError

    raise OrchError(f"backend {sweep.spec.backend!r} is not available in this version; use `backend: local`.")
