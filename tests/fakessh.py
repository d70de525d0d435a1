"""Machines a user already has, for `backend: ssh` tests: real OpenSSH sshd's on loopback addresses of their own.

orch makes none of them: a test starts them, as a lab's workstations exist before orch. Each has its own address
(127.N.0.k, N held by the fake cloud's loopback claim), its own host key, home and tmux server (TMUX_TMPDIR), and
an ORCH_FAKE_HOST marker in the environment sshd gives its sessions, so that killing a host ends everything that
ran there and nothing else. Logins are root's here (one user on this machine): the homes differ, the user does not.
Faults are real: kill() stops sshd and every process of the host (powered off), rekey() gives it a new host key
(reinstalled), start() brings it back with its disk as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from orchestrator.remote.ssh import new_host_key
from orchestrator.wait import retry_until
from tests.fakecloud.cloud import SSH_PORT, SSHD, claim_net, power_off, processes_of


class SshHost:
    def __init__(self, root: Path, ip: str, name: str, env: dict[str, str] | None = None):
        self.root, self.ip, self.name = root, ip, name
        self.extra_env = env or {}
        self.home = root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.tmux_dir = Path(tempfile.mkdtemp(prefix="ofs-"))
        self.sshd: subprocess.Popen | None = None
        self.private, self.public = new_host_key()

    @property
    def label(self) -> str:
        return f"root@{self.ip}:{SSH_PORT}"

    @property
    def marker(self) -> str:
        return f"ssh-{self.name}"

    def start(self, authorized: str) -> None:
        key = self.root / "host_key"
        key.write_text(self.private)
        key.chmod(0o600)
        auth = self.root / "authorized_keys"
        auth.write_text(authorized)
        env = {
            "HOME": str(self.home),
            "TMUX_TMPDIR": str(self.tmux_dir),
            "ORCH_FAKE_HOST": self.marker,
            "OMP_NUM_THREADS": "1",
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            **self.extra_env,
        }
        config = [
            f"ListenAddress {self.ip}",
            f"Port {SSH_PORT}",
            f"HostKey {key}",
            f"AuthorizedKeysFile {auth}",
            f"PidFile {self.root / 'sshd.pid'}",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "AllowTcpForwarding yes",
            "SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()),
        ]
        (self.root / "sshd_config").write_text("\n".join(config) + "\n")
        Path("/run/sshd").mkdir(exist_ok=True)
        self.sshd = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")],
            stdout=open(self.root / "sshd.log", "ab"),
            stderr=subprocess.STDOUT,
        )
        retry_until(self._listening, 20, 0.05, f"sshd on {self.ip}")

    def _listening(self) -> bool:
        import socket

        with contextlib.suppress(OSError), socket.create_connection((self.ip, SSH_PORT), timeout=1):
            return True
        return False

    def kill(self) -> None:
        """Powered off: sshd with every connection it serves, and everything that ran on the host, stop at once (its
        disk stays). A connection's own sshd process is not in the marked environment: it goes as sshd's child."""
        power_off(self.sshd, self.marker)

    def rekey(self) -> None:
        """Reinstalled: a new host key (the next start() presents it)."""
        self.private, self.public = new_host_key()

    def processes(self) -> list[int]:
        return processes_of(self.marker)

    def foreign(self) -> subprocess.Popen:
        """A process of someone else's on the host (same marker, not started by orch)."""
        env = dict(os.environ, ORCH_FAKE_HOST=self.marker, HOME=str(self.home))
        return subprocess.Popen(["sleep", "600"], env=env)


class SshHosts:
    """n hosts, a login key for them and a known_hosts file that vouches for them (as a user's own files)."""

    def __init__(self, folder: Path, n: int, env: dict[str, str] | None = None):
        from tests.conftest import make_identity

        self.folder = folder
        self.net, self._lock = claim_net()
        self.identity = make_identity(folder / "user", "orch-user")
        self.known_hosts = folder / "user" / "known_hosts"
        self.hosts = [
            SshHost(folder / f"host{k}", f"127.{self.net}.0.{k + 1}", f"{self.net}-{k}", env) for k in range(n)
        ]

    def __enter__(self) -> SshHosts:
        for h in self.hosts:
            h.start(self.identity.with_name("id_ed25519.pub").read_text())
        self.vouch()
        return self

    def vouch(self) -> None:
        """known_hosts as `ssh` leaves it after the user checked each key."""
        self.known_hosts.write_text(
            "".join(f"[{h.ip}]:{SSH_PORT} {' '.join(h.public.split()[:2])}\n" for h in self.hosts)
        )

    def restart(self, k: int) -> None:
        self.hosts[k].start(self.identity.with_name("id_ed25519.pub").read_text())

    def __exit__(self, *exc) -> None:
        for h in self.hosts:
            h.kill()
            shutil.rmtree(h.tmux_dir, ignore_errors=True)
        self._lock.close()

    def section(self, extra: str = "", gpus: int | None = None) -> str:
        """The sweep's `ssh:` section for these hosts (`gpus`: each as a mapping that says it has so many)."""
        if gpus is None:
            hosts = "".join(f"\n    - {h.label}" for h in self.hosts)
        else:
            hosts = "".join(f"\n    - host: {h.label}\n      gpus: {gpus}" for h in self.hosts)
        return f"ssh:\n  hosts:{hosts}\n  key: {self.identity}\n  known_hosts: {self.known_hosts}\n{extra}"
