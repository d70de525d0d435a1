"""Before a command runs on a host: the sweep's data, `workdir:`'s snapshot unpacked once per host, `setup:` once per
host and snapshot.

The snapshot comes from the store (`<sweep>/.orch-code/<digest>.tar.gz`, put there at launch), is checked against
the sha256 its task names, and is unpacked read-only to `code_dir` — under a lock, so runs packed on one host that
start together unpack it once, and into a temporary folder renamed into place, so a cut-off unpack is never taken
for the snapshot. `setup:` runs the same way: under a lock, in `code_dir`, its output in the attempt's log (`orch
logs`), and a marker beside the folder once it succeeded, so later runs on the host skip it. A failure leaves no
marker: the next attempt, on this host or another, runs it again.

Runs on the host (the agent imports it): standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import logging
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from orchestrator.contract import RunTask
from orchestrator.host import folder
from orchestrator.host.env import HostFacts
from orchestrator.store import layout
from orchestrator.store.base import Store

log = logging.getLogger("orch.agent")

POLL_S = 0.2
Count = Callable[..., None]


def ready_marker(code_dir: Path) -> Path:
    return code_dir.with_name(code_dir.name + ".ok")


def setup_marker(code_dir: Path, setup: str) -> Path:
    """One per setup command: a sweep of the same code with another `setup:` runs its own."""
    return code_dir.with_name(f"{code_dir.name}.setup-{hashlib.sha256(setup.encode()).hexdigest()[:12]}.ok")


@contextlib.contextmanager
def locked(path: Path, stopped: Callable[[], bool]) -> Iterator[bool]:
    """An exclusive lock on `path` (flock), waited for while `stopped()` is False; yields False when stopped first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if stopped():
                    yield False
                    return
                time.sleep(POLL_S)
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Preparing(Protocol):
    """What of the agent (host/agent.py) readies its host: its task and facts, store, log, and where it says why."""

    task: RunTask
    here: HostFacts
    store: Store
    log_file: Path
    reporter: Any  # its count(up=, down=) adds bytes moved; `superseded`: the record is another attempt's
    stop_requested: Any  # a StopReason once orch asked the attempt to stop
    stage_error: str | None
    setup_error: str | None

    def doing(self, reason: str) -> None: ...


def before_command(agent: Preparing) -> bool:
    """The host made ready for the command: the sweep's data (host/folder.py), then `workdir:`'s snapshot and
    `setup:`, each once per host. False when one failed: the agent's stage_error or setup_error says why."""
    here, t, count = agent.here, agent.task, agent.reporter.count
    if here.data:
        agent.doing(f"staging {len(here.data)} data set(s)")
        agent.stage_error = folder.stage(here.data, agent.store, agent.log_file, count) or None
    if agent.stage_error or here.code_dir is None:
        return not agent.stage_error

    def stopped() -> bool:
        return agent.stop_requested is not None or agent.reporter.superseded

    agent.doing(f"fetching the code ({t.code})")
    error = ensure_code(agent.store, t, here.code_dir, agent.log_file, count, stopped)
    if not error and t.setup:
        agent.doing(f"setting up: {t.setup}")
        error = run_setup(t, here.code_dir, here.command_env(t), agent.log_file, stopped)
    agent.setup_error = error or None
    return not error


def ensure_code(store: Store, task: RunTask, code_dir: Path, log_file: Path, count: Count, stopped) -> str:
    """The snapshot unpacked at code_dir (once per host); what went wrong, or ""."""
    if ready_marker(code_dir).exists():
        _say(log_file, f"code {task.code}: on this host already")
        return ""
    with locked(code_dir.with_name(code_dir.name + ".lock"), stopped) as held:
        if not held:
            return "stopped while waiting for another run to unpack the code"
        if ready_marker(code_dir).exists():  # another run on this host unpacked it meanwhile
            _say(log_file, f"code {task.code}: unpacked by another run on this host")
            return ""
        began = time.monotonic()
        data = store.get_bytes(layout.code_key(task.sweep, task.code))
        if data is None:
            return f"the code snapshot {task.code} is not in the store ({layout.code_key(task.sweep, task.code)})"
        count(down=len(data))
        if hashlib.sha256(data).hexdigest() != task.code_sha256:
            return f"the code snapshot {task.code} in the store does not match its recorded sha256 (changed or cut off)"
        try:
            files = _unpack(data, code_dir)
        except (OSError, tarfile.TarError) as exc:
            return f"could not unpack the code snapshot {task.code}: {exc}"
        ready_marker(code_dir).touch()
        _say(
            log_file,
            f"code {task.code}: {files} files, {len(data) / 1e6:.2f} MB fetched and unpacked in "
            f"{time.monotonic() - began:.2f} s to {code_dir} (once for this host)",
        )
    return ""


def _unpack(data: bytes, code_dir: Path) -> int:
    """Into a fresh temporary folder beside code_dir, made read-only, then renamed into place."""
    tmp = code_dir.with_name(f"{code_dir.name}.tmp-{os.getpid()}")
    for stale in (tmp, code_dir):  # an unpack cut off before its marker is never trusted
        if stale.exists():
            _make_writable(stale)
            shutil.rmtree(stale)
    tmp.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        if hasattr(tarfile, "data_filter"):  # links out of the folder, absolute or `..` names: refused
            tar.extractall(tmp, filter="data")
        else:
            for m in members:
                if m.name.startswith("/") or ".." in Path(m.name).parts:
                    raise tarfile.TarError(f"unsafe name {m.name!r}")
            tar.extractall(tmp)  # noqa: S202 (names checked above; our own archive, its sha256 checked)
    _make_read_only(tmp)
    tmp.rename(code_dir)
    return sum(1 for m in members if not m.isdir())


def _make_read_only(root: Path) -> None:
    for top, dirs, files in os.walk(root):
        for name in files:
            path = Path(top) / name
            if not path.is_symlink():
                path.chmod(path.stat().st_mode & 0o555)
        for name in dirs:
            path = Path(top) / name
            if not path.is_symlink():
                path.chmod(0o555)
    root.chmod(0o555)


def _make_writable(root: Path) -> None:
    for top, dirs, _files in os.walk(root):
        for name in dirs:
            with contextlib.suppress(OSError):
                (Path(top) / name).chmod(0o755)
    with contextlib.suppress(OSError):
        root.chmod(0o755)


def run_setup(task: RunTask, code_dir: Path, env: dict[str, str], log_file: Path, stopped) -> str:
    """`setup:` once per host and snapshot, in code_dir; what went wrong (with the log's tail), or ""."""
    marker = setup_marker(code_dir, task.setup)
    if marker.exists():
        return ""
    with locked(marker.with_name(marker.name + ".lock"), stopped) as held:
        if not held:
            return "stopped while waiting for another run's setup"
        if marker.exists():
            _say(log_file, "setup: done by another run on this host")
            return ""
        _say(log_file, f"setup (once per host and code {task.code}): {task.setup}")
        began = time.monotonic()
        code = _run(task.setup, code_dir, env, log_file, stopped)
        if code == 0:
            marker.touch()
            _say(log_file, f"setup done in {time.monotonic() - began:.1f} s")
            return ""
    what = "stopped" if code is None else f"exit code {code}"
    _say(log_file, f"setup failed ({what})")
    return f"setup failed ({what}); the command did not run (`orch logs {task.run_id}`)"


def _run(command: str, cwd: Path, env: dict[str, str], log_file: Path, stopped) -> int | None:
    """The command in its own process group, its output appended to the log; None when stopped (group ended)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=cwd,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        while proc.poll() is None:
            if stopped():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                return None
            time.sleep(POLL_S)
    return proc.returncode


def _say(log_file: Path, text: str) -> None:
    """A line of orch's in the attempt's log (`orch logs` shows it) and the agent's."""
    log.info("%s", text)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a") as f:
        f.write(f"[orch] {text}\n")
