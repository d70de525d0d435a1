"""`orch tensorboard`: a sweep's store as a live TensorBoard, kept current while the sweep runs."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import click

from orchestrator.cli.common import expected_errors, load_sweep_arg, sweep_parts
from orchestrator.control.board import Board, need_tensorboard
from orchestrator.errors import OrchError
from orchestrator.host.attempt import group_runs
from orchestrator.wait import Timeout, retry_until

PASS_S = 2.0  # seconds between conversions


@click.command()
@click.argument("sweep")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=6006,
    show_default=True,
    help="Port of the TensorBoard server (0: a free one).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address it listens on (0.0.0.0 makes it reachable from other machines).",
)
@click.option(
    "--logdir",
    type=click.Path(file_okay=False),
    help="Where the event files go (default: results/<sweep>/tensorboard).",
)
@expected_errors
def tensorboard(sweep: str, port: int, host: str, logdir: str | None):
    """Show SWEEP in TensorBoard, live: every run's metrics as scalars, its params and final/best metrics as HParams.

    The store (local folder or S3) is turned into a TensorBoard log directory, then TensorBoard
    serves it; every few seconds the new metrics lines are added (only what is new), runs that
    start later appear, a run resumed after a preemption continues its curve. Works while the
    sweep runs and after it ended. Ctrl-C stops it. Needs the board extra: pip install 'orch[board]'.

    \b
    Example:
      orch tensorboard local-smoke --port 6006
    """

    need_tensorboard()
    sw = load_sweep_arg(sweep)
    _, store, _ = sweep_parts(sw)
    port = _free_port(host, port)  # before anything is written: a clear error, and never another server's URL
    folder = Path(logdir or Path("results") / sw.spec.name / "tensorboard")
    board = Board(sw, store, folder)
    lines = board.update()
    server = None
    for sig in (signal.SIGTERM, signal.SIGHUP):  # `kill` or a closed terminal: the same clean stop as Ctrl-C
        signal.signal(sig, _as_interrupt)
    try:
        server = _start(folder, host, port)
        _await_answer(server, host, port)
        click.echo(
            f"TensorBoard for sweep {sw.spec.name}: http://{host}:{port}/  (event files in {folder}; {lines} metrics "
            "lines so far)"
        )
        click.echo("Kept current every 2 s. Ctrl-C stops it.")
        while True:
            _check_alive(server, port)
            time.sleep(PASS_S)
            board.update()
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):  # after SIGHUP there may be no terminal left
            click.echo("stopped.")
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # a second signal does not cut the cleanup short
            signal.signal(sig, signal.SIG_IGN)
        if server is not None:
            _stop_group(server.proc)
        board.close()


def _free_port(host: str, port: int) -> int:
    """The port TensorBoard will listen on (port 0: a free one), checked here: an address that is none of this
    machine's, or a port another server holds, is a clear error."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, port))
            return s.getsockname()[1]
    except socket.gaierror:
        raise OrchError(
            f"--host {host}: not an address (give an IP address of this machine, e.g. 127.0.0.1 or 0.0.0.0).",
            exit_code=2,
        ) from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise OrchError(
                f"port {port} on {host} is in use (another TensorBoard?). Pass another with --port, or --port 0 for "
                "a free one.",
                exit_code=2,
            ) from None
        raise OrchError(
            f"--host {host}: cannot listen there ({exc.strerror or exc}); give an address of this machine, e.g. "
            "127.0.0.1 or 0.0.0.0.",
            exit_code=2,
        ) from None


@dataclass(frozen=True)
class _Server:
    proc: subprocess.Popen
    stderr: IO[str]  # what it writes there says why it exited


def _start(folder: Path, host: str, port: int) -> _Server:
    args = ["--logdir", str(folder), "--port", str(port), "--host", host, "--reload_interval", "2"]
    err = tempfile.TemporaryFile("w+")  # a file, not a pipe: a pipe nobody reads fills up and blocks TensorBoard
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", *args],
        stdout=subprocess.DEVNULL,
        stderr=err,
        start_new_session=True,  # its own process group: stopped whole (it starts a data server of its own)
        preexec_fn=_die_with_parent,
    )
    return _Server(proc, err)


def _await_answer(server: _Server, host: str, port: int) -> None:
    """Until TensorBoard answers on its port (its URL is printed only then), or exits."""
    target = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host

    def answers() -> bool:
        _check_alive(server, port)
        try:
            with socket.create_connection((target, port), timeout=1):
                return True
        except OSError:
            return False

    retry_until(answers, None, 0.2, "TensorBoard to answer")


def _check_alive(server: _Server, port: int) -> None:
    code = server.proc.poll()
    if code is not None:
        err = _stderr_tail(server)
        raise OrchError(f"TensorBoard exited (code {code}) on port {port}: {' | '.join(err)}", exit_code=1)


def _stderr_tail(server: _Server) -> list[str]:
    """The last lines TensorBoard wrote to its stderr file: why it exited."""
    server.stderr.seek(0)
    return server.stderr.read().strip().splitlines()[-3:]


def _as_interrupt(_signum, _frame):
    raise KeyboardInterrupt


def _die_with_parent() -> None:
    """In the child: a SIGTERM when orch itself dies, even of SIGKILL (Linux; elsewhere the handlers above serve)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop_group(proc: subprocess.Popen) -> None:
    """TensorBoard and whatever it started (its data server): SIGTERM to the group, SIGKILL after 10 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            retry_until(lambda: not group_runs(proc.pid) and proc.poll() is not None, 10, 0.1, "TensorBoard to stop")
            break
        except Timeout:
            continue
    if proc.poll() is None:
        proc.wait()
