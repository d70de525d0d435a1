"""Several runs on one instance (packing): the host's own register of which slot (a set of GPUs)
each run holds, so that the instance terminates after its last run and never under a new one.

`~/orch/slots/slot.<k>` holds `<run>#<attempt>` while that run uses slot k; `terminating` marks a
host whose last run has left. Both the controller (claiming a slot over SSH, `CLAIM` below) and
the agents (leaving one) change it only under the same lock (`flock` on `~/orch/slots/.lock`), so
a run is never placed on a host that is about to terminate.

Runs on the host (the agent imports it): standard library, and host/aws/tags.py to untag its slot.
"""

from __future__ import annotations

import fcntl
import logging
from pathlib import Path

log = logging.getLogger("orch.agent")

SLOTS_DIR = "orch/slots"  # under $HOME
# The controller's claim of slot $1 for "$2" (run#attempt): 0 claimed, 3 the host is terminating, 4 the slot is taken.
CLAIM = (
    'd="$HOME/orch/slots"; mkdir -p "$d" && exec 9>"$d/.lock" && flock 9 || exit 5; '
    '[ -e "$d/terminating" ] && exit 3; [ -e "$d/slot.$1" ] && exit 4; printf "%s\\n" "$2" > "$d/slot.$1"'
)


def slot_value(run_id: str, attempt: int) -> str:
    return f"{run_id}#{attempt}"


def slot_run(value: str) -> str:
    """The run a slot value names."""
    return value.rpartition("#")[0]


def slot_attempt(value: str) -> tuple[str, int]:
    """(run, attempt) a slot value names (attempt 0 when it names none)."""
    run, _, attempt = value.rpartition("#")
    return run, int(attempt) if attempt.isdigit() else 0


def leave(slot: int, value: str, home: Path | None = None) -> bool:
    """This run gives up its slot; True when it was the host's last run (the host is then marked terminating)."""
    d = (home or Path.home()) / SLOTS_DIR
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        mine = d / f"slot.{slot}"
        if mine.exists() and mine.read_text().strip() == value:
            mine.unlink()
        if any(d.glob("slot.*")):
            return False
        (d / "terminating").touch()
        return True


def doom(home: Path | None = None) -> None:
    """A spot notice: no new run may come to this host (its runs checkpoint and leave)."""
    d = (home or Path.home()) / SLOTS_DIR
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (d / "terminating").touch()


def untag(slot: int, value: str) -> None:
    """Remove this run's `orch:slot:<k>` tag from its instance (only while it still names this run)."""
    from orchestrator.host.aws.tags import remove_own

    remove_own({f"orch:slot:{slot}": value})
