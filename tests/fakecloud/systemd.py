"""The fake image's systemd: what `systemctl enable --now UNIT_FILE...` does on the remote controller's instance.

It runs standalone (the fake image's `systemctl` execs this file), never as root's real systemd: a fake host is a
set of processes on the test machine. For each unit file it records the unit as enabled and starts a manager
process that does what systemd.service(5) says of the few settings orch's units use:
  ExecStart= (double-quoted words; `%%` and `$$` are a literal % and $), Environment= (on top of the host's),
  WorkingDirectory=, StandardOutput=append:FILE (StandardError=inherit), Restart=always|on-failure|no with
  RestartSec=, and KillMode=control-group: when the main process exits, what it left running in its group (here:
  its process group) is stopped before any restart: SIGTERM, waited for up to TimeoutStopSec= (90 s), then SIGKILL.
The manager writes the main process's pid to `$ORCH_FAKE_HOST_ROOT/systemd/<unit>.pid` and its own pid to
`<unit>.manager` (a test that kills the manager plays a systemd that gave up on the unit). Anything else systemctl
could be asked answers exit 1, so a start script that needs more fails here as it would look for more there.
Every process started on a fake host carries ORCH_FAKE_HOST, so all of this stops with the instance.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path


def parse(path: Path) -> dict[str, list[str]]:
    """The [Service] settings: key -> every value given (Environment= may repeat)."""
    section, out = "", {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        if section == "Service":
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def words(value: str) -> list[str]:
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(value)]


def state_dir() -> Path:
    d = Path(os.environ["ORCH_FAKE_HOST_ROOT"]) / "systemd"
    d.mkdir(exist_ok=True)
    return d


def manage(unit: Path) -> None:
    """Run the unit's main process, restarted as its Restart= says, until it need not be."""
    name = unit.name
    while True:
        cfg = parse(unit)
        env = dict(os.environ)
        for assignment in cfg.get("Environment", []):
            for w in words(assignment):
                k, _, v = w.partition("=")
                env[k] = v
        log = cfg.get("StandardOutput", ["inherit"])[0]
        out = open(log.removeprefix("append:"), "ab") if log.startswith("append:") else subprocess.DEVNULL
        proc = subprocess.Popen(
            words(cfg["ExecStart"][0]),
            env=env,
            cwd=cfg.get("WorkingDirectory", [str(Path.home())])[0],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the unit's control group
        )
        (state_dir() / f"{name}.pid").write_text(str(proc.pid))
        code = proc.wait()
        stop(proc.pid, float(cfg.get("TimeoutStopSec", ["90"])[0]))
        restart = cfg.get("Restart", ["no"])[0]
        if restart != "always" and not (restart == "on-failure" and code != 0):
            return
        time.sleep(float(cfg.get("RestartSec", ["0.1"])[0]))


def stop(group: int, patience: float) -> None:
    """KillMode=control-group once the main process exited: SIGTERM to what it left, then (as systemd) wait for all
    of it to exit, up to TimeoutStopSec=, before SIGKILL. Only then may a restart begin."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    end = time.monotonic() + patience
    while running_in(group) and time.monotonic() < end:
        time.sleep(0.2)
    if running_in(group):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def running_in(group: int) -> bool:
    """Whether a process of the group still runs (a zombie nobody reaped yet does not)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            state, _ppid, pgrp = (d / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == group and state not in ("Z", "X"):
            return True
    return False


def main(argv: list[str]) -> int:
    if argv[:1] == ["_manage"]:
        manage(Path(argv[1]))
        return 0
    if argv[:2] != ["enable", "--now"] or len(argv) < 3 or not all(a.startswith("/") for a in argv[2:]):
        sys.stderr.write(f"fake systemctl: only `enable --now /path/unit...` is imitated, not {argv}\n")
        return 1
    for path in argv[2:]:
        unit = Path(path)
        if "ExecStart" not in parse(unit):
            sys.stderr.write(f"fake systemctl: {unit} has no ExecStart=\n")
            return 1
        (state_dir() / f"{unit.name}.enabled").write_text(str(unit))
        manager = subprocess.Popen(
            [sys.executable, __file__, "_manage", str(unit)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(state_dir() / f"{unit.name}.manager.log", "ab"),
            start_new_session=True,
        )
        (state_dir() / f"{unit.name}.manager").write_text(str(manager.pid))
        sys.stdout.write(f"Created symlink /etc/systemd/system/{unit.name} → {unit}.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
