"""Running shell commands on a host: this machine here, an instance over SSH in remote/ssh.py.

The two differ only in their primitives — run a command, put a file — and answer with the same
Result, so whatever a run needs done on its host (the stop protocol, a notice) is written once.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import OrchError


@dataclass
class Result:
    code: int
    out: str
    err: str


class Runner:
    """What every host runner offers; subclasses supply run() and put_bytes()."""

    def run(self, command: str, timeout: float = 120, stdin: bytes | None = None) -> Result:
        raise NotImplementedError

    def put_bytes(self, data: bytes, path: str, mode: int = 0o600) -> None:
        raise NotImplementedError

    def check(self, command: str, timeout: float = 120, stdin: bytes | None = None) -> str:
        """run(), and an OrchError with the command's stderr when it fails."""
        r = self.run(command, timeout, stdin)
        if r.code != 0:
            raise OrchError(f"command failed ({r.code}): {command[:80]}: {r.err.strip()[-500:]}")
        return r.out

    def close(self) -> None:
        pass


class LocalRunner(Runner):
    """This machine, through bash."""

    def run(self, command: str, timeout: float = 120, stdin: bytes | None = None) -> Result:
        try:
            p = subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Result(124, "", f"timed out after {timeout:.0f} s")
        return Result(p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))

    def put_bytes(self, data: bytes, path: str, mode: int = 0o600) -> None:
        target = Path(os.path.expanduser(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
