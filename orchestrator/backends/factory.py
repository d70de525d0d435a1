"""Which backend a sweep runs on (`backend:` in its spec).

A module of its own, not the package's face: the backends import the package's modules (`bundle`),
so a factory in `__init__` that imports them would close an import circle.
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
