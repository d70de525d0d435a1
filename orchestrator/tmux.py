"""The one choke point for tmux: orch's own server (socket `orch`, or $ORCH_TMUX_SOCKET) via libtmux."""

from __future__ import annotations

import os
import shutil
from typing import Dict, List, Optional

from .errors import OrchError

SOCKET_ENV = "ORCH_TMUX_SOCKET"


def socket_name() -> str:
    return os.environ.get(SOCKET_ENV) or "orch"


class _Plain:
    """tmux without libtmux (an instance whose Python lacks it): the same `cmd` through subprocess."""

    def cmd(self, *args: str):
        import subprocess
        from types import SimpleNamespace

        p = subprocess.run(["tmux", "-L", socket_name(), *args], capture_output=True, text=True)
        return SimpleNamespace(returncode=p.returncode, stdout=p.stdout.splitlines(), stderr=p.stderr.splitlines())


def _server():
    if shutil.which("tmux") is None:
        raise OrchError("tmux is not installed. Install it (`apt-get install tmux` or `brew install tmux`) and retry.")
    try:
        import libtmux  # imported here so `orch --help` stays instant
    except ImportError:
        return _Plain()
    return libtmux.Server(socket_name=socket_name())


def _run(*args: str) -> List[str]:
    result = _server().cmd(*args)
    if result.returncode != 0:
        raise OrchError(f"tmux {' '.join(args[:2])} failed: {' '.join(result.stderr).strip()}")
    return list(result.stdout)


def sessions(prefix: str = "") -> List[str]:
    """Names of live sessions starting with prefix; none when no server runs."""
    result = _server().cmd("list-sessions", "-F", "#{session_name}")
    if result.returncode != 0:  # "no server running" / "error connecting": no sessions
        return []
    return [name for name in result.stdout if name.startswith(prefix)]


def has_session(name: str) -> bool:
    return _server().cmd("has-session", "-t", f"={name}").returncode == 0


def new_session(name: str, command: str, window: str, cwd: str, env: Optional[Dict[str, str]] = None) -> None:
    """Start a detached session whose first window runs `command`; fails if the name is taken."""
    args = ["new-session", "-d", "-s", name, "-n", window, "-c", cwd, "-x", "200", "-y", "50"]
    for key, value in (env or {}).items():
        args += ["-e", f"{key}={value}"]
    _run(*args, command)


def new_window(session: str, window: str, command: str, cwd: str) -> None:
    _run("new-window", "-d", "-t", f"={session}:", "-n", window, "-c", cwd, command)


def has_window(session: str, window: str) -> bool:
    result = _server().cmd("list-windows", "-t", f"={session}", "-F", "#{window_name}")
    return result.returncode == 0 and window in result.stdout


def clients(session: str) -> int:
    """How many terminals are attached to a session."""
    result = _server().cmd("list-clients", "-t", f"={session}", "-F", "#{client_name}")
    return len(result.stdout) if result.returncode == 0 else 0


def kill_session(name: str) -> bool:
    """Kill a session (its processes get SIGHUP); False when it did not exist."""
    return _server().cmd("kill-session", "-t", f"={name}").returncode == 0


def attach_argv(session: str, window: str) -> List[str]:
    """argv for an interactive attach (the CLI execs it in the user's terminal)."""
    return ["tmux", "-L", socket_name(), "attach-session", "-t", f"={session}:{window}"]
