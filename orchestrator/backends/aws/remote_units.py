"""How the remote controller's processes stay up: two systemd units, started by one script over SSH.

`orch-supervisor.service` runs the supervisor (control/supervisor.py): systemd starts it again after an
out-of-memory kill or any crash (Restart=on-failure) and at every boot (WantedBy=multi-user.target), and stops
what it left running first (KillMode=control-group), so a restarted supervisor never meets its old controller.
`orch-watchdog.service` runs the watchdog (control/watchdog.py), which shares nothing with the supervisor but the
store: whatever else died, it terminates the instance within minutes of the sweep's lease ending or lapsing.

An image without systemd or without passwordless sudo (a custom `aws.controller.image`) gets both processes
started with nohup instead; the watchdog then still ends the instance, but nothing restarts either after a crash
or a reboot, and the start script says so in the supervisor's log.
"""

from __future__ import annotations

import shlex

SUPERVISOR_UNIT = "orch-supervisor.service"
WATCHDOG_UNIT = "orch-watchdog.service"
START_SCRIPT = "start.sh"
RESTART_S = 10  # systemd's pause before a restart; StartLimitIntervalSec=0: it never gives up


def _systemd_quote(word: str) -> str:
    """One word of ExecStart=/Environment=: double-quoted, with systemd's specifiers (%) and variables ($)
    taken literally."""
    if any(c in word for c in "\n\r\0"):
        raise ValueError(f"no line breaks in a unit file: {word!r}")
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def unit(what: str, user: str, workdir: str, env: dict[str, str], argv: list[str], log: str, restart: str) -> str:
    """A service unit that runs `argv` as `user` in `workdir`, its output appended to `log`."""
    lines = [
        "[Unit]",
        f"Description=orch remote controller: {what}",
        "Wants=network-online.target",
        "After=network-online.target",
        "StartLimitIntervalSec=0",
        "",
        "[Service]",
        "Type=simple",
        f"User={user}",
        f"WorkingDirectory={_systemd_quote(workdir)[1:-1]}",
        *(f"Environment={_systemd_quote(f'{k}={v}')}" for k, v in env.items()),
        "ExecStart=" + " ".join(_systemd_quote(a) for a in argv),
        f"Restart={restart}",
        f"RestartSec={RESTART_S}",
        "KillMode=control-group",
        f"StandardOutput=append:{log}",
        "StandardError=inherit",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def units(user: str, base: str, python: str, settings: str, env: dict[str, str]) -> dict[str, str]:
    """{file name: text} of the two units for a controller installed in `base`."""
    cli = [python, "-m", "orchestrator.cli"]
    return {
        SUPERVISOR_UNIT: unit(
            "supervisor", user, base, env, [*cli, "_supervise", settings], f"{base}/supervisor.log", "on-failure"
        ),
        WATCHDOG_UNIT: unit(
            "watchdog (ends the instance once its sweep's lease ended or lapsed)",
            user,
            base,
            env,
            [*cli, "_watchdog", settings],
            f"{base}/watchdog.log",
            "always",
        ),
    }


def start_script(base: str, python: str, settings: str, env: dict[str, str]) -> str:
    """The script that starts both: systemd units where the image has systemd and passwordless sudo, else nohup.
    It prints which."""
    q = shlex.quote
    assigns = " ".join(f"{k}={q(v)}" for k, v in env.items())

    def nohup(command: str, log: str) -> str:
        cli = f"{q(python)} -m orchestrator.cli {command} {q(settings)}"
        return f"{assigns} nohup setsid {cli} >> {log} 2>&1 < /dev/null &"

    return f"""#!/bin/sh
# orch: start the remote controller's supervisor and watchdog (orchestrator/backends/aws/remote_units.py)
cd {q(base)} || exit 1
if command -v systemctl >/dev/null 2>&1 && \\
   sudo -n systemctl enable --now {q(base + "/" + SUPERVISOR_UNIT)} {q(base + "/" + WATCHDOG_UNIT)} >> units.log 2>&1
then
  echo systemd
else
  echo "$(date '+%Y-%m-%d %H:%M:%S') no systemd (or no passwordless sudo): supervisor and watchdog started with \\
nohup; nothing restarts them after a crash or a reboot (see units.log)" >> supervisor.log
  {nohup("_supervise", "supervisor.log")}
  {nohup("_watchdog", "watchdog.log")}
  echo nohup
fi
"""
