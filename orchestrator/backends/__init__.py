"""Backends turn a run into a process on some host: this machine (local) or EC2 spot (aws)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Backend

if TYPE_CHECKING:  # the agent imports this package on hosts; keep pydantic out of its start-up
    from ..spec import Sweep


def backend_for(sweep: "Sweep") -> Backend:
    if sweep.spec.backend == "local":
        from .local import LocalBackend

        return LocalBackend(sweep)
    from .aws import AwsBackend

    return AwsBackend(sweep)
