"""The controller's connection to one ssh host: kept open, checked against known_hosts, counted down when it fails.

It also carries the host's way to the store: a port on the host's loopback that its sshd forwards, over this
connection, to the controller's store server (server.py); the port and the server's token go into a 0600 file on
the host, which the agents read (store/tunneled.py). Only the controller connects: the host never dials out.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from orchestrator.backends.ssh.settings import HostSpec
from orchestrator.errors import OrchError
from orchestrator.remote.runners import Result
from orchestrator.remote.ssh import Connection, Target, UnknownHost, connect_known

log = logging.getLogger("orch.ssh")

DOWN_S = 15.0  # a host that did not answer is not asked again for this long (a pass must not wait on it each time)
CONNECT_S = 8.0
COMMAND_S = 30.0


def tunnel_file(sweep: str) -> str:
    return f"~/orch/tunnels/{sweep}.json"


class HostDown(OrchError):
    """The host does not answer (or its connection broke); its runs count as lost when it stays so."""


class Link:
    def __init__(self, spec: HostSpec, key: str | None, known_hosts: str):
        self.spec, self.key, self.known_hosts = spec, key, known_hosts
        self.conn: Connection | None = None
        self.port: int | None = None  # the forwarded port on the host, while this connection lives
        self.down_until = 0.0
        self.why_down = ""
        self.silent_since: float | None = None  # since when listings got no answer (backend.list)
        self.lock = threading.Lock()

    @property
    def target(self) -> Target:
        return Target(self.spec.address, self.spec.port, self.spec.user, self.key or "", "")

    def connection(self) -> Connection:
        with self.lock:
            if self.conn is not None and self.conn.alive():
                return self.conn
            self._drop()
            if time.time() < self.down_until:
                raise HostDown(f"{self.spec.label}: {self.why_down}")
            try:
                self.conn = connect_known(self.target, self.known_hosts, timeout=CONNECT_S)
            except UnknownHost:
                raise
            except OrchError as exc:
                self.down(str(exc))
                raise HostDown(str(exc)) from None
            self.conn.keepalive(5)
            return self.conn

    def down(self, why: str) -> None:
        self.down_until, self.why_down = time.time() + DOWN_S, why
        self._drop()

    def _drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn, self.port = None, None

    def run(self, command: str, timeout: float = COMMAND_S, stdin: bytes | None = None) -> Result:
        conn = self.connection()
        try:
            r = conn.run(command, timeout=timeout, stdin=stdin)
        except (TimeoutError, OSError, EOFError) as exc:
            self.down(f"the connection broke ({type(exc).__name__}: {exc})")
            raise HostDown(f"{self.spec.label}: the connection broke") from None
        except Exception as exc:  # paramiko's SSHException (a channel refused): the transport is unusable
            if type(exc).__module__.startswith("paramiko"):
                self.down(f"{type(exc).__name__}: {exc}")
                raise HostDown(f"{self.spec.label}: {exc}") from None
            raise
        if r.code == -1:  # no exit status: the connection went with the command
            self.down("the connection broke mid-command")
            raise HostDown(f"{self.spec.label}: the connection broke mid-command")
        return r

    def check(self, command: str, timeout: float = COMMAND_S, stdin: bytes | None = None) -> str:
        r = self.run(command, timeout, stdin)
        if r.code != 0:
            raise OrchError(f"{self.spec.label}: `{command[:60]}` failed ({r.code}): {(r.err or r.out).strip()[-300:]}")
        return r.out

    def put_bytes(self, data: bytes, path: str, mode: int = 0o600) -> None:
        conn = self.connection()
        try:
            conn.put_bytes(data, path, mode)
        except (OSError, EOFError) as exc:
            self.down(f"the connection broke ({exc})")
            raise HostDown(f"{self.spec.label}: the connection broke") from None

    def tunnel(self, sweep: str, server_port: int, token: str) -> None:
        """The host's way to the store server, over this connection (once per connection)."""
        conn = self.connection()
        with self.lock:
            if self.port is not None:
                return
            try:
                port = conn.forward_back(server_port)
            except OrchError as exc:
                raise OrchError(
                    f"{self.spec.label}: {exc}; the agents reach the store that way. Allow it in its sshd_config: "
                    "`AllowTcpForwarding remote` (or yes)"
                ) from None
        self.put_bytes(json.dumps({"port": port, "token": token}).encode(), tunnel_file(sweep))
        self.port = port
        log.info("%s: store reachable there at 127.0.0.1:%s", self.spec.label, port)

    def close(self) -> None:
        with self.lock:
            self._drop()
