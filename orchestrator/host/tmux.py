"""tmux on the host side: what the agent needs (a window for the command, is it there, who is
attached), through the tmux binary alone, so an instance's Python needs no libtmux.

orch's own server: socket `orch`, or $ORCH_TMUX_SOCKET. The controller's machine drives tmux
through libtmux's objects instead (`backends/local/tmux_server.py`).
"""

from __future__ import annotations

import os
import subprocess

from orchestrator.errors import OrchError

SOCKET_ENV = "ORCH_TMUX_SOCKET"


def socket_name() -> str:
    return os.environ.get(SOCKET_ENV) or "orch"


def _tmux(*args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["tmux", "-L", socket_name(), *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise OrchError(
            "tmux is not installed. Install it (`apt-get install tmux` or `brew install tmux`) and retry."
        ) from None


def new_window(session: str, window: str, command: str, cwd: str) -> None:
    p = _tmux("new-window", "-d", "-t", f"={session}:", "-n", window, "-c", cwd, command)
    if p.returncode != 0:
        raise OrchError(f"tmux new-window in {session} failed: {p.stderr.strip()}")


def has_window(session: str, window: str) -> bool:
    p = _tmux("list-windows", "-t", f"={session}", "-F", "#{window_name}")
    return p.returncode == 0 and window in p.stdout.splitlines()


def clients(session: str) -> int:
    """How many terminals are attached to a session."""
    p = _tmux("list-clients", "-t", f"={session}", "-F", "#{client_name}")
    return len(p.stdout.splitlines()) if p.returncode == 0 else 0


def attach_argv(session: str, window: str) -> list[str]:
    """argv for an interactive attach (the CLI execs it in the user's terminal)."""
    return ["tmux", "-L", socket_name(), "attach-session", "-t", f"={session}:{window}"]
