"""The code a host needs, as a content-hashed tarball built in memory: the agent's side of orchestrator
(`host/`, `store/`, `contract.py`, `errors.py`, `wait.py`) and the trainer — nothing the controller alone
uses (tests/repo/test_layers.py checks that what is shipped imports only what is shipped)."""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path

# Paths relative to the repository root: a folder ships its *.py files, recursively.
SHIPPED = (
    "orchestrator/__init__.py",
    "orchestrator/contract.py",
    "orchestrator/errors.py",
    "orchestrator/wait.py",
    "orchestrator/host",
    "orchestrator/store",
    "trainer",
)
# A remote controller (`orch launch --remote`) runs all of orch, and ships the hosts' bundle from its own copy.
CONTROLLER_SHIPPED = ("orchestrator", "trainer")


@dataclass(frozen=True)
class Bundle:
    digest: str  # sha256 of the sources, first 16 hex digits; names the folder on the host
    data: bytes  # gzipped tar

    @property
    def remote_dir(self) -> str:
        return f"~/orch/code/{self.digest}"


def _sources(root: Path, parts=SHIPPED):
    for part in parts:
        for path in [root / part] if part.endswith(".py") else sorted((root / part).rglob("*.py")):
            yield path, str(path.relative_to(root))


def build(root: Path | None = None, parts=SHIPPED) -> Bundle:
    root = root or Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for path, name in _sources(root, parts):
            data = path.read_bytes()
            h.update(name.encode() + b"\0" + data)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0  # reproducible
            tar.addfile(info, io.BytesIO(data))
    return Bundle(h.hexdigest()[:16], buf.getvalue())


def install_command(bundle: Bundle) -> str:
    """Unpack stdin into the bundle's folder unless it is already there (uploaded once per host).

    Runs packed on one instance install at the same moment: one unpacks under a lock (`flock`, util-linux) while the
    others wait, then find it complete. A folder without `.complete` (an install cut off) is unpacked again from
    scratch, never trusted. stdin is read to its end either way, so the sender never writes into a closed channel."""
    d = bundle.remote_dir.replace("~/", "$HOME/")
    unpack = (
        'if test -f "$1/.complete"; then cat >/dev/null; '
        'else rm -rf "$1" && mkdir -p "$1" && tar xzf - -C "$1" && touch "$1/.complete"; fi'
    )
    return (
        f'if test -f "{d}/.complete"; then cat >/dev/null; '
        f'else mkdir -p "$HOME/orch/code" && flock "{d}.lock" sh -c {shlex.quote(unpack)} sh "{d}"; fi'
    )
