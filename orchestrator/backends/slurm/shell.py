"""Where Slurm's commands run: this machine (no `slurm.login`), or the login node over SSH, its host key checked
against the user's known_hosts as the ssh backend checks its hosts (remote/ssh.py: connect_known). The connection is
kept and made again when it breaks; a login node that does not answer reads as Slurm not answering (retried)."""

from __future__ import annotations

import getpass
import logging
import threading

from orchestrator.backends.slurm.settings import SlurmSection
from orchestrator.errors import OrchError
from orchestrator.remote.runners import LocalRunner, Result, Runner
from orchestrator.remote.ssh import Connection, Target, UnknownHost, connect_known
from orchestrator.remote.ssh_names import HOST_RE

log = logging.getLogger("orch.slurm")


def login_target(settings: SlurmSection) -> Target | None:
    if settings.login is None:
        return None
    m = HOST_RE.match(settings.login)
    assert m is not None  # validated
    return Target(m["host"].strip("[]"), int(m["port"] or 22), m["user"] or getpass.getuser(), settings.key or "", "")


class LoginShell(Runner):
    def __init__(self, target: Target, known_hosts: str):
        self.target, self.known_hosts = target, known_hosts
        self.conn: Connection | None = None
        self.lock = threading.Lock()

    def _connection(self) -> Connection:
        with self.lock:
            if self.conn is None or not self.conn.alive():
                self.conn = connect_known(self.target, self.known_hosts, timeout=10.0)
                self.conn.keepalive(15)
            return self.conn

    def run(self, command: str, timeout: float = 120, stdin: bytes | None = None) -> Result:
        try:
            r = self._connection().run(command, timeout=timeout, stdin=stdin)
        except UnknownHost:
            raise
        except (OrchError, OSError, EOFError) as exc:
            self.close()
            return Result(255, "", f"cannot reach the login node: {exc}")
        if r.code == -1:
            self.close()
            return Result(255, "", "cannot reach the login node: the connection broke mid-command")
        return r

    def put_bytes(self, data: bytes, path: str, mode: int = 0o600) -> None:
        try:
            self._connection().put_bytes(data, path, mode)
        except UnknownHost:
            raise
        except (OSError, EOFError) as exc:
            self.close()
            raise OrchError(f"cannot reach the login node: {exc}") from None

    def close(self) -> None:
        with self.lock:
            if self.conn is not None:
                self.conn.close()
            self.conn = None


def shell_for(settings: SlurmSection) -> Runner:
    target = login_target(settings)
    return LocalRunner() if target is None else LoginShell(target, settings.known_hosts)
