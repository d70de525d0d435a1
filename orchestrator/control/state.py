"""Local cache and journal under $ORCH_HOME: which sweeps exist where, what the controller did, who holds a sweep.

The store is the source of truth; this only remembers where to look and keeps a journal.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import NotFound, OrchError
from orchestrator.store import layout, open_store
from orchestrator.store.folder import usable_folder
from orchestrator.store.s3url import is_s3
from orchestrator.sweep.spec import orch_home

SCHEMA = """
CREATE TABLE IF NOT EXISTS sweeps (
  name TEXT PRIMARY KEY, spec_path TEXT NOT NULL, store_url TEXT NOT NULL,
  backend TEXT NOT NULL, launched_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS events (
  ts REAL NOT NULL, sweep TEXT NOT NULL, run TEXT, event TEXT NOT NULL, detail TEXT);
"""


@dataclass(frozen=True)
class SweepRecord:
    """Where a sweep launched from this machine lives."""

    name: str  # sweep name
    spec_path: str  # the sweep file it was launched from
    store_url: str  # its store
    backend: str  # local | aws
    launched_at: float  # unix seconds of the first launch


class State:
    def __init__(self, home: Path | None = None):
        self.home = home or orch_home()
        usable_folder(self.home, "ORCH_HOME", "Set ORCH_HOME to a folder you can write, or unset it (default ~/.orch).")
        self.path = self.home / "state.db"

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30)
        db.executescript(SCHEMA)
        return db

    def remember(self, name: str, spec_path: str, store_url: str, backend: str) -> None:
        with closing(self._db()) as db, db:
            db.execute(
                "INSERT INTO sweeps VALUES (?,?,?,?,?) ON CONFLICT(name) DO UPDATE SET "
                "spec_path=excluded.spec_path, store_url=excluded.store_url, backend=excluded.backend",
                (name, spec_path, store_url, backend, time.time()),
            )

    def check_same_store(self, name: str, spec_path: str, store_url: str) -> str | None:
        """A name launched from here names one sweep (its lock and its runs' tmux sessions are named by it): another
        store under the same name is refused while the recorded store still holds that sweep. A name whose store no
        longer does (a deleted clone's, say) is free: returns a line saying the name now means this sweep."""
        for rec in self.sweeps():
            if rec.name != name or rec.store_url == store_url:
                continue
            if not store_holds(rec):
                return (
                    f"the name {name!r} was launched from here before with store {rec.store_url}, which holds no "
                    "sweep.json of it any more: it names this sweep now."
                )
            raise OrchError(
                f"{spec_path}: sweep {name!r} was launched from here from {rec.spec_path} with store "
                f"{rec.store_url}, which still holds it; this file says store {store_url}. Give this sweep another "
                f"`name:`, or point `store:` back, or give the name to this file: `orch forget {name}` (after "
                f"`orch down {name}` while that sweep runs; its results stay in {rec.store_url}).",
                exit_code=2,
            )
        return None

    def forget(self, name: str) -> None:
        """This machine no longer lists the sweep; its store and whatever it made are not touched."""
        with closing(self._db()) as db, db:
            db.execute("DELETE FROM sweeps WHERE name=?", (name,))

    def sweeps(self) -> list[SweepRecord]:
        with closing(self._db()) as db:
            return [SweepRecord(*row) for row in db.execute("SELECT * FROM sweeps ORDER BY launched_at")]

    def sweep(self, name: str) -> SweepRecord:
        for rec in self.sweeps():
            if rec.name == name:
                return rec
        known = ", ".join(r.name for r in self.sweeps()) or "none yet"
        raise NotFound(f"no sweep named {name!r} was launched from here (known: {known}). Pass the sweep file instead.")

    def journal(self, sweep: str, event: str, run: str | None = None, detail: str = "") -> None:
        with closing(self._db()) as db, db:
            db.execute("INSERT INTO events VALUES (?,?,?,?,?)", (time.time(), sweep, run, event, detail))

    def events(self, sweep: str) -> list[tuple]:
        with closing(self._db()) as db:
            return list(db.execute("SELECT ts, run, event, detail FROM events WHERE sweep=? ORDER BY ts", (sweep,)))


def store_holds(rec: SweepRecord) -> bool:
    """Whether the sweep's store still holds its record; a store out of reach (no credentials for its bucket, say)
    may: only a store seen without it (its folder gone, or no sweep.json in it) does not."""
    if not is_s3(rec.store_url):
        return Path(rec.store_url, layout.sweep_key(rec.name)).exists()
    try:
        return open_store(rec.store_url).exists(layout.sweep_key(rec.name))
    except Exception:  # out of reach is not gone: the name stays bound to it
        return True


class SweepLock:
    """One controller per sweep on this machine: an flock held for the controller's lifetime."""

    def __init__(self, home: Path, sweep: str):
        self.path = home / "locks" / f"{sweep}.lock"
        self.sweep = sweep
        self.fd: int | None = None

    def holder(self) -> int | None:
        """pid of the controller holding the lock, or None."""
        if not self.path.exists():
            return None
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        except BlockingIOError:
            text = self.path.read_text().strip()
            return int(text) if text.isdigit() else -1
        finally:
            os.close(fd)

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = self.holder()
            raise OrchError(
                f"sweep {self.sweep!r} is already being run by controller pid {pid}. "
                f"Watch it with `orch status {self.sweep} --watch`, or stop it with `orch down {self.sweep}`.",
                exit_code=2,  # as the lease's refusal (control/lease.py): one answer to a second launch
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd

    # `orch down` leaves a mark beside the lock before it signals the holder, and the next launch removes it:
    # a launch told to hand off and a background controller just starting see it and start nothing, so a stop
    # wins over a hand-off whichever signal reached whichever process (the mark is written before the holder
    # is read, and a controller looks at it after it holds the lock).
    def ask_stop(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._stop_mark.write_text(str(time.time()))

    def stop_asked(self) -> bool:
        return self._stop_mark.exists()

    def clear_stop(self) -> None:
        self._stop_mark.unlink(missing_ok=True)

    @property
    def _stop_mark(self) -> Path:
        return self.path.with_suffix(".down")

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
