"""tmux on the controller's machine, through libtmux's objects: the sessions of local runs.

One Server per process on orch's own socket (`orch`, or $ORCH_TMUX_SOCKET); the host side
(the agent) uses `tmux.py`, which needs only the tmux binary.
"""

from __future__ import annotations

import shutil

from orchestrator.errors import OrchError
from orchestrator.host.tmux import socket_name


def _server():
    if shutil.which("tmux") is None:
        raise OrchError("tmux is not installed. Install it (`apt-get install tmux` or `brew install tmux`) and retry.")
    import libtmux  # imported here so `orch --help` stays instant

    return libtmux.Server(socket_name=socket_name())


def sessions(prefix: str = "") -> list[str]:
    """Names of live sessions starting with prefix; none when no server runs."""
    from libtmux.exc import LibTmuxException

    try:
        return [name for s in _server().sessions if (name := s.session_name or "").startswith(prefix)]
    except LibTmuxException:  # "no server running" / "error connecting"
        return []


def has_session(name: str) -> bool:
    return _server().has_session(name, exact=True)


def new_session(name: str, command: str, window: str, cwd: str, env: dict[str, str] | None = None) -> None:
    """Start a detached session whose first window runs `command`; fails if the name is taken."""
    from libtmux.exc import LibTmuxException

    try:
        _server().new_session(
            session_name=name,
            window_name=window,
            window_command=command,
            start_directory=cwd,
            attach=False,
            x=200,
            y=50,
            environment=env or None,
        )
    except LibTmuxException as exc:
        raise OrchError(f"tmux new-session {name} failed: {exc}") from None


def kill_session(name: str) -> bool:
    """Kill a session (its processes get SIGHUP); False when it did not exist."""
    server = _server()
    if not server.has_session(name, exact=True):
        return False
    session = server.sessions.get(session_name=name, default=None)
    if session is None:
        return False
    session.kill()
    return True
