"""SSH with pinned host keys: paramiko with RejectPolicy against exactly the key orch generated.

Host keys are never trusted on first use: the controller generates an ed25519 host key per
instance, hands it over in the cloud-config user data, and accepts only that key.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import OrchError
from orchestrator.remote.runners import Result, Runner
from orchestrator.wait import Timeout, retry_until

log = logging.getLogger("orch.ssh")


class HostKeyMismatch(OrchError):
    """The host answered with a key other than the pinned one: possibly not our instance."""


@dataclass(frozen=True)
class Target:
    """Where and how to log in."""

    address: str  # IP to dial
    port: int
    user: str
    identity: str  # private key file
    host_key: str  # pinned public host key, OpenSSH format ("ssh-ed25519 AAAA...")


def new_host_key() -> tuple[str, str]:
    """(private key in OpenSSH PEM, public key line) of a fresh ed25519 host key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return private, public


def public_key_of(identity: str) -> str:
    path = Path(os.path.expanduser(identity))
    pub = path.with_name(path.name + ".pub")
    if not pub.is_file():
        raise OrchError(
            f"no public key {pub} next to `aws.ssh.identity` {path}. Create a key pair: ssh-keygen -t ed25519 -f {path}"
        )
    return pub.read_text().strip()


ALSO_SUFFIX = ".also.pub"  # beside a key: public keys (one a line) the instances accept besides the key's own


def authorized_keys(identity: str) -> list[str]:
    """The public keys an instance accepts: the identity's own, and those of `<identity>.also.pub` when it exists
    (a remote controller's key has the laptop's there, so `orch attach` from the laptop reaches its hosts)."""
    path = Path(os.path.expanduser(identity))
    also = path.with_name(path.name + ALSO_SUFFIX)
    extra = [line.strip() for line in also.read_text().splitlines() if line.strip()] if also.is_file() else []
    return [public_key_of(identity), *extra]


def _host_id(t: Target) -> str:
    return t.address if t.port == 22 else f"[{t.address}]:{t.port}"


class Connection(Runner):
    """An instance over SSH (paramiko, pinned host key)."""

    def __init__(self, client):
        self.client = client

    def run(self, command: str, timeout: float = 120, stdin: bytes | None = None) -> Result:
        stdin_f, stdout, stderr = self.client.exec_command(command, timeout=timeout)
        if stdin is not None:
            stdin_f.write(stdin)
            stdin_f.channel.shutdown_write()
        out, err = stdout.read().decode(errors="replace"), stderr.read().decode(errors="replace")
        return Result(stdout.channel.recv_exit_status(), out, err)

    def stream(self, command: str, on_line, timeout: float = 3600) -> Result:
        """run(), handing each line of output (stdout and stderr together) to on_line as it comes."""
        chan = self.client.get_transport().open_session(timeout=30)
        chan.set_combine_stderr(True)
        chan.settimeout(timeout)
        chan.exec_command(command)
        out, pending = [], b""
        for data in iter(lambda: chan.recv(4096), b""):
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                text = line.decode(errors="replace")
                out.append(text)
                on_line(text)
        if pending:
            out.append(pending.decode(errors="replace"))
            on_line(out[-1])
        return Result(chan.recv_exit_status(), "\n".join(out), "")

    def alive(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

    def keepalive(self, seconds: int) -> None:
        """A keep-alive packet every `seconds`: a host that went away is noticed by the connection itself."""
        transport = self.client.get_transport()
        if transport is not None:
            transport.set_keepalive(seconds)

    def forward_back(self, local_port: int) -> int:
        """A port on the host's loopback that its sshd forwards, over this connection, to `local_port` on this
        machine's loopback (ssh -R 0:127.0.0.1:local_port); returns the host's port. The host dials nothing."""
        transport = self.client.get_transport()
        if transport is None:
            raise OrchError("the connection is closed")
        try:
            return transport.request_port_forward("127.0.0.1", 0, handler=_forwarder(local_port))
        except Exception as exc:  # noqa: BLE001 - paramiko's SSHException: sshd refused (AllowTcpForwarding no)
            raise OrchError(f"sshd refused to forward a port back ({exc})") from None

    def bytes_moved(self) -> int:
        """Bytes sent and received on this connection so far (paramiko's packet counters; they restart at a rekey)."""
        transport = self.client.get_transport()
        if transport is None:
            return 0
        p = transport.packetizer
        return p._Packetizer__sent_bytes + p._Packetizer__received_bytes  # noqa: SLF001 - no public counter

    def put_bytes(self, data: bytes, remote: str, mode: int = 0o600) -> None:
        """Write a file atomically on the host (~ allowed)."""
        quoted = remote.replace("~/", "$HOME/", 1) if remote.startswith("~/") else shlex.quote(remote)
        self.check(
            f'umask 077; mkdir -p "$(dirname "{quoted}")" && cat > "{quoted}.tmp" && chmod {mode:o} "{quoted}.tmp" && '
            f'mv "{quoted}.tmp" "{quoted}"',
            stdin=data,
        )

    def close(self) -> None:
        """Close; a connection broken half-way (an interrupt inside paramiko) must not hide why it is closed."""
        try:
            self.client.close()
        except Exception as exc:  # noqa: BLE001 - closing is best effort; the host is terminated or the error raised
            log.debug("closing the SSH connection: %s: %s", type(exc).__name__, exc)


def connect(
    target: Target, timeout: float, interval: float = 2.0, between: Callable[[], None] = lambda: None
) -> Connection:
    """Connect, retrying while sshd is not up, until `timeout`; a wrong host key fails at once. `between` runs after
    each refused try: it raises to stop the retries (the machine is known to be gone)."""
    import paramiko

    hostkey = paramiko.Ed25519Key(data=_key_blob(target.host_key))
    pkey = _load_identity(target.identity)
    last: list[str] = [""]

    def attempt():
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.get_host_keys().add(_host_id(target), hostkey.get_name(), hostkey)
        try:
            client.connect(
                target.address,
                port=target.port,
                username=target.user,
                pkey=pkey,
                timeout=10,
                banner_timeout=10,
                auth_timeout=10,
                allow_agent=False,
                look_for_keys=False,
            )
            return Connection(client)
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyMismatch(
                f"{target.address}:{target.port} presented host key {exc.key.get_base64()[:16]}..., not the one orch "
                "pinned. "
                "Refusing to connect (a different machine answered); the instance is terminated."
            ) from None
        except (TimeoutError, OSError, paramiko.SSHException, EOFError) as exc:
            client.close()
            last[0] = f"{type(exc).__name__}: {exc}"
            between()
            return None

    try:
        return retry_until(attempt, timeout, interval, f"sshd on {target.address}:{target.port}")
    except Timeout:
        raise OrchError(
            f"could not reach sshd on {target.address}:{target.port} within {timeout:.0f}s ({last[0]}). "
            "Check the security group, `aws.ssh.address` and the image's sshd."
        ) from None


class UnknownHost(OrchError):
    """A machine the user's known_hosts does not vouch for (absent, or with another key): never trusted on first use."""


def connect_known(target: Target, known_hosts: str, timeout: float = 10.0) -> Connection:
    """A machine the user already has (`backend: ssh`), its host key checked against the user's known_hosts file;
    `target.identity` "" lets paramiko use the SSH agent and ~/.ssh/id_* as ssh does. One try, no retry: a host that
    does not answer is the caller's to count as down."""
    import paramiko

    where = target.address if target.port == 22 else f"[{target.address}]:{target.port}"
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    path = os.path.expanduser(known_hosts)
    if os.path.isfile(path):
        client.load_host_keys(path)
    scan = f"ssh-keyscan -p {target.port} {target.address}"
    try:
        client.connect(
            target.address,
            port=target.port,
            username=target.user,
            pkey=_load_identity(target.identity) if target.identity else None,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            allow_agent=not target.identity,
            look_for_keys=not target.identity,
        )
        return Connection(client)
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise UnknownHost(
            f"{where} answered with host key {exc.key.get_name()} {exc.key.get_base64()[:24]}..., not the one "
            f"{path} has for it: the machine was reinstalled, or another machine answers. Refused. If you know why it "
            f"changed, remove the old line (ssh-keygen -R '{where}' -f {path}) and add the new key after checking its "
            f"fingerprint with the machine's owner ({scan})."
        ) from None
    except paramiko.AuthenticationException:
        client.close()
        key = target.identity or "the SSH agent and ~/.ssh/id_*"
        raise OrchError(
            f"{where}: {target.user} was refused with {key}. Put its public key in {target.user}'s "
            f"~/.ssh/authorized_keys there (ssh-copy-id -p {target.port} {target.user}@{target.address}), or name the "
            "right one in `ssh.key`."
        ) from None
    except paramiko.SSHException as exc:
        client.close()
        if "not found in known_hosts" in str(exc):
            raise UnknownHost(
                f"{where} is not in {path}: orch never trusts a host key on first use. Log in once with "
                f"`ssh -p {target.port} {target.user}@{target.address}` and check the fingerprint it shows, or add it "
                f"with `{scan} >> {path}` after checking it (`ssh.known_hosts` names another file)."
            ) from None
        raise OrchError(f"{where}: SSH refused: {exc}") from None
    except (TimeoutError, OSError, EOFError) as exc:
        client.close()
        raise OrchError(f"{where}: cannot reach sshd ({type(exc).__name__}: {exc})") from None


def _forwarder(local_port: int):
    """paramiko's handler for a forwarded connection: pump it both ways to `local_port`, on threads of its own (the
    handler runs on the transport's thread and must not block)."""

    def handle(channel, origin, server) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", local_port), timeout=10)
        except OSError:
            channel.close()
            return
        sock.settimeout(None)
        threading.Thread(target=_pump, args=(channel, sock), daemon=True, name="forward-in").start()
        threading.Thread(target=_pump, args=(sock, channel), daemon=True, name="forward-out").start()

    return handle


def _pump(src, dst) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except (OSError, EOFError):
        pass
    finally:
        for end in (src, dst):
            with contextlib.suppress(OSError):
                end.close()


def _key_blob(public_line: str) -> bytes:
    import base64

    parts = public_line.split()
    if len(parts) < 2 or parts[0] != "ssh-ed25519":
        raise OrchError(f"not an ed25519 public key: {public_line[:40]}")
    return base64.b64decode(parts[1])


def _load_identity(identity: str):
    import paramiko

    path = os.path.expanduser(identity)
    if not os.path.isfile(path):
        raise OrchError(
            f"SSH identity {path} not found. Set `aws.ssh.identity` or create one: ssh-keygen -t ed25519 -f {path}"
        )
    for kind in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return kind.from_private_key_file(path)
        except (paramiko.SSHException, ValueError):
            continue
    raise OrchError(f"cannot read SSH identity {path} (encrypted keys need ssh-agent, which orch does not use).")


def known_hosts_file(target: Target, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{target.address}_{target.port}"
    path.write_text(f"{_host_id(target)} {target.host_key}\n")
    return path


def attach_argv(target: Target, remote_command: str, known_hosts: Path) -> list[str]:
    """A system `ssh -t` that trusts exactly the pinned key."""
    return [
        "ssh",
        "-t",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-i",
        os.path.expanduser(target.identity),
        "-p",
        str(target.port),
        f"{target.user}@{target.address}",
        remote_command,
    ]


def interactive(target: Target, remote_command: str) -> int:
    """Fallback when there is no ssh binary: a paramiko pty bridged to this terminal."""
    import select
    import sys
    import termios
    import tty

    conn = connect(target, timeout=30)
    chan = conn.client.get_transport().open_session()
    cols, rows = os.get_terminal_size() if sys.stdin.isatty() else (120, 40)
    chan.get_pty(term=os.environ.get("TERM", "xterm"), width=cols, height=rows)
    chan.exec_command(remote_command)
    old = termios.tcgetattr(sys.stdin) if sys.stdin.isatty() else None
    try:
        if old:
            tty.setraw(sys.stdin.fileno())
        while not chan.exit_status_ready():
            r, _, _ = select.select([chan, sys.stdin], [], [], 0.2)
            if chan in r:
                data = chan.recv(4096)
                if not data:
                    break
                os.write(sys.stdout.fileno(), data)
            if sys.stdin in r:
                chan.send(os.read(sys.stdin.fileno(), 1024))
        return chan.recv_exit_status()
    finally:
        if old:
            termios.tcsetattr(sys.stdin, termios.TCSADRAIN, old)
        conn.close()
