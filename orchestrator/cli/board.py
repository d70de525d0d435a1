"""`orch tensorboard`: a sweep's store as a live TensorBoard, kept current while the sweep runs."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import click

from orchestrator.cli.common import _parts, expected_errors, load_sweep_arg
from orchestrator.errors import OrchError

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
def tensorboard(sweep: str, port: int, host: str, logdir: Optional[str]):
    """Show SWEEP in TensorBoard, live: every run's metrics as scalars, its params and final/best metrics as HParams.

    The store (local folder or S3) is turned into a TensorBoard log directory, then TensorBoard
    serves it; every few seconds the new metrics lines are added (only what is new), runs that
    start later appear, a run resumed after a preemption continues its curve. Works while the
    sweep runs and after it ended. Ctrl-C stops it. Needs the board extra: pip install 'orch[board]'.

    \b
    Example:
      orch tensorboard local-smoke --port 6006
    """
    from orchestrator.control.board import Board, need_tensorboard

    need_tensorboard()
    sw = load_sweep_arg(sweep)
    _, store, _ = _parts(sw)
    folder = Path(logdir or Path("results") / sw.spec.name / "tensorboard")
    board = Board(sw, store, folder)
    lines = board.update()
    if port == 0:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(folder),
            "--port",
            str(port),
            "--host",
            host,
            "--reload_interval",
            "2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    click.echo(
        f"TensorBoard for sweep {sw.spec.name}: http://{host}:{port}/  (event files in {folder}; {lines} metrics lines "
        "so far)"
    )
    click.echo("Kept current every 2 s. Ctrl-C stops it.")
    try:
        while True:
            if proc.poll() is not None:
                err = (proc.stderr.read() or "").strip().splitlines()[-3:]
                raise OrchError(
                    f"TensorBoard exited (code {proc.returncode}): {' | '.join(err)}. "
                    f"Is port {port} in use? Pass another with --port.",
                    exit_code=1,
                )
            time.sleep(PASS_S)
            board.update()
    except KeyboardInterrupt:
        click.echo("stopped.")
    finally:
        board.close()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
