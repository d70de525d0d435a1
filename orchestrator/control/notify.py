"""Notifications (`notify:`): what a pass saw becomes messages, sent off the loop through Apprise, once each.

The controller hands every pass's Progress to `Notifier.observe`, which finds the events in it (a run failed for
good, the target first met, a new best trial, 80% and 100% of the budget, the end: notify_events.py, a pure reading
of the progress, cheap) and queues a message per sink that wants the event. A thread of its own sends them, retrying
each with backoff, so a slow or dead receiver never delays a pass.

Once each: every message has a key (`failed:<run>`, `target`, `budget:80`, `ended`, …) and the outbox record in the
store (`<sweep>/notify.json`, one writer at a time) keeps, per message and sink, whether it was delivered. A
controller killed and launched again reads it, sends what was still pending and nothing twice. (A kill between a
receiver's "200 OK" and the record's write sends that one message again: the only duplicate possible.)
When the loop ends with messages still pending (a receiver down), the laptop's controller hands them to a
background sender (`orch _notify`), which keeps trying for DRAIN_S; the remote controller keeps trying itself
before its instance ends. URLs are never written anywhere: the outbox names each sink by a redacted label and a
short hash.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from orchestrator.control.notify_events import ENDED, Facts, Message, keyed_end, messages_of, title_of
from orchestrator.control.views import Progress
from orchestrator.errors import OrchError
from orchestrator.store.base import Store
from orchestrator.store.layout import notify_key
from orchestrator.sweep.notify import Event, NotifySink

log = logging.getLogger("orch.notify")

VERSION = 1
BACKOFF_S = (2.0, 4.0, 8.0, 16.0, 32.0, 60.0)  # waits between tries of one message to one sink (then 60 s each)
FAILING_AFTER = 3  # tries in a row that failed before a sink is reported as failing (status, log)
PATIENCE_S = 10.0  # what the laptop's loop waits at its end for pending messages before handing them off (not
# when every one waits on a receiver that failed: those go to the background sender at once)
SLOW_S = 1.0  # a receiver that keeps the loop's end waiting this long is named on the terminal
REMOTE_PATIENCE_S = 900.0  # what a remote controller waits (no one is blocked; its instance costs ~$0.003)
DRAIN_S = 900.0  # how long the background sender keeps trying


@dataclass(frozen=True)
class Sink:
    """A resolved sink: where (the URL, kept in memory only), what it wants, and how it is named."""

    url: str
    events: tuple[Event, ...]
    label: str  # redacted: safe for output, logs and the store

    @property
    def id(self) -> str:
        return hashlib.sha256(self.url.encode()).hexdigest()[:12]


@dataclass
class SinkState:
    label: str
    tries_failed: int = 0  # in a row
    last_error: str = ""
    delivered: int = 0

    @property
    def failing(self) -> bool:
        return self.tries_failed >= FAILING_AFTER


@dataclass
class Outbox:
    """notify.json: every message queued and, per sink, when it was delivered (None: pending)."""

    messages: dict[str, dict] = field(default_factory=dict)  # key -> {event, title, body, to: {sink id: sent_at}}
    sinks: dict[str, SinkState] = field(default_factory=dict)
    problem: str = ""  # why the stored record could not be read (this one starts afresh), for `orch status`

    def to_json(self) -> dict:
        sinks = {k: {"label": s.label, "tries_failed": s.tries_failed, "last_error": s.last_error,
                     "delivered": s.delivered} for k, s in self.sinks.items()}  # fmt: skip
        return {"version": VERSION, "messages": self.messages, "sinks": sinks}

    @classmethod
    def parse(cls, data: bytes | None) -> Outbox:
        """The record as stored; an unreadable one (`problem` says why) is started afresh (at worst a message is sent
        again)."""
        if data is None:
            return cls()
        try:
            raw = json.loads(data)
            sinks = {k: SinkState(**v) for k, v in raw.get("sinks", {}).items()}
            messages = {k: dict(v, to=dict(v["to"])) for k, v in raw.get("messages", {}).items()}
            _check_types(sinks, messages)
            return cls(messages=messages, sinks=sinks)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            return cls(problem=f"{type(exc).__name__}: {exc}")

    def pending(self) -> list[tuple[str, str]]:
        return [(k, s) for k, m in self.messages.items() for s, at in m["to"].items() if at is None]


def _check_types(sinks: dict[str, SinkState], messages: dict[str, dict]) -> None:
    """Every field as orch writes it, else ValueError (a hand-edited or damaged record is not half used)."""
    for k, s in sinks.items():
        counts = (s.tries_failed, s.delivered)
        if not (isinstance(s.label, str) and isinstance(s.last_error, str)) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in counts
        ):
            raise ValueError(f"sink {k!r} has a field of the wrong type")
    for k, m in messages.items():
        stamps = m["to"].values()
        if not all(isinstance(at, (int, float)) and not isinstance(at, bool) or at is None for at in stamps):
            raise ValueError(f"message {k!r} has a delivery time that is not a number")
        if not all(isinstance(m.get(f, ""), str) for f in ("event", "title", "body")):
            raise ValueError(f"message {k!r} has a text field that is not a string")


def read_outbox(store: Store, sweep: str) -> Outbox:
    try:
        data = store.get_bytes(notify_key(sweep))
    except OSError as exc:  # a folder where the record should be, say: the sender's writes fail and are logged
        return Outbox(problem=f"cannot be read ({exc.strerror or exc})")
    return Outbox.parse(data)


def resolve(sinks: list[NotifySink], env: dict | None = None) -> list[Sink]:
    """The sinks with their URLs (a variable is read now); raises ValueError naming the sink that cannot be."""
    out = []
    for i, s in enumerate(sinks):
        try:
            out.append(Sink(url=s.resolve(env), events=tuple(s.events), label=s.label()))
        except ValueError as exc:
            raise ValueError(f"notify[{i}]: {exc}") from None
    return out


# --- sending ---------------------------------------------------------------------------------------


def deliver(url: str, title: str, body: str) -> tuple[bool, str]:
    """One try through Apprise: (delivered, what went wrong — without the URL's secrets)."""
    import apprise

    hub = apprise.Apprise()
    hub.add(url)
    with apprise.LogCapture(level=logging.WARNING, fmt="%(message)s") as captured:
        ok = bool(hub.notify(title=title, body=body))
        # without a path LogCapture yields a StringIO; its __enter__ is unannotated (pyright infers its file branch too)
        said = captured.getvalue().strip().splitlines()  # pyright: ignore[reportAttributeAccessIssue]
    return ok, "" if ok else _scrub(said[-1] if said else "not delivered", url)


def _scrub(text: str, url: str) -> str:
    parts = urlsplit(url)
    for secret in [parts.password, parts.username, *parts.path.split("/"), *parts.query.split("&")]:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "…")
    return text[:300]


class Notifier:
    """Queues messages as passes show events; one thread sends them (see the module doc)."""

    def __init__(self, store: Store, sweep: str, sinks: list[Sink]):
        self.store, self.sweep, self.sinks = store, sweep, {s.id: s for s in sinks}
        self.outbox = read_outbox(store, sweep)
        if self.outbox.problem:  # (`orch status` says so too)
            log.warning("notify: the outbox record cannot be read (%s); starting a new one", self.outbox.problem)
        for s in sinks:
            self.outbox.sinks.setdefault(s.id, SinkState(label=s.label)).label = s.label
        self._cv = threading.Condition()
        self._next_try: dict[str, float] = {}  # sink id -> when it is tried again (after a failure)
        self._closing = False  # the loop ended: send what is pending, then stop
        self._done = False  # stop now
        self._thread: threading.Thread | None = None
        self._unsaved = 0  # deliveries recorded in memory whose record write has not returned yet

    def start(self) -> Notifier:
        self._thread = threading.Thread(target=self._run, name="orch-notify", daemon=True)
        self._thread.start()
        with self._cv:
            self._cv.notify()
        return self

    def observe(self, progress: Progress, facts: Facts) -> None:
        """Queue what this pass shows that was never queued (cheap: no request, no send)."""
        self.queue(messages_of(progress, facts))

    def queue(self, messages: list[Message]) -> None:
        """What no sink was told yet, the end last (keyed_end: an end after news told after an earlier end is new)."""
        with self._cv:
            for m in [m for m in messages if m.key != ENDED] + [m for m in messages if m.key == ENDED]:
                m = keyed_end(m, list(self.outbox.messages)) if m.key == ENDED else m
                to = {s.id: None for s in self.sinks.values() if m.event in s.events}
                if to and m.key not in self.outbox.messages:
                    self.outbox.messages[m.key] = {"event": m.event.value, "title": m.title, "body": m.body, "to": to}
            self._cv.notify()

    def pending(self) -> int:
        with self._cv:
            return len([p for p in self.outbox.pending() if p[1] in self.sinks])

    def close(self, patience_s: float, on_wait: Callable[[int], None] | None = None, hand_off: bool = False) -> int:
        """Stop after sending what is pending, waiting at most `patience_s`; the number still pending. `on_wait` is told
        once when a receiver keeps the caller waiting (a try failed, or SLOW_S passed). `hand_off`: stop waiting as soon
        as every pending message waits on a receiver that just failed (its retry is the background sender's)."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        start = time.monotonic()
        deadline, told = start + patience_s, on_wait is None
        while self._sending() and time.monotonic() < deadline:
            failed, waiting = self._failed()
            if not told and (failed or time.monotonic() - start >= SLOW_S):
                on_wait(self.pending())  # type: ignore[misc]  (told is False only with a callback)
                told = True
            if hand_off and waiting and not self._unsaved:
                break
            with self._cv:  # woken by each send (`send`): the end of a launch waits for the news, not for a poll
                self._cv.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
        with self._cv:
            self._done = True
            self._cv.notify()
            snapshot = json.dumps(self.outbox.to_json()).encode()
        left = self.pending()
        if left:  # a message queued since the receiver's last try is in no record yet: the hand-off reads the record
            self._save(snapshot)
        return left

    def _sending(self) -> bool:
        """The sender runs and has work: a message pending, or a delivery whose record is not written yet."""
        return self._thread is not None and self._thread.is_alive() and bool(self.pending() or self._unsaved)

    def _failed(self) -> tuple[bool, bool]:
        """(a pending message's receiver failed its last try, every pending message waits for such a retry)."""
        with self._cv:
            sinks = {sink for _, sink in self.outbox.pending() if sink in self.sinks}
            now = time.monotonic()
            backing_off = {sink for sink in sinks if self._next_try.get(sink, 0.0) > now}
        return bool(backing_off), bool(sinks) and backing_off == sinks

    def _due(self, now: float) -> tuple[tuple[str, str] | None, float]:
        wait = 3600.0
        for pair in self.outbox.pending():
            if pair[1] not in self.sinks:
                continue  # a sink this controller no longer has (the file changed): left as it is
            at = self._next_try.get(pair[1], 0.0)
            if at <= now:
                return pair, 0.0
            wait = min(wait, at - now)
        return None, wait

    def _run(self) -> None:
        while True:
            with self._cv:
                pair, wait = self._due(time.monotonic())
                if pair is None:
                    if self._done:
                        return
                    self._cv.wait(timeout=min(wait, 1.0) if self._closing else wait)
                    continue
            self.send(pair)

    def due(self, now: float) -> tuple[str, str] | None:
        """The (message key, sink id) to try next at `now` (monotonic), or None."""
        with self._cv:
            return self._due(now)[0]

    def send(self, pair: tuple[str, str]) -> None:
        """One try of one message to one sink, recorded in the outbox record (the sender thread's step; the invariant
        harness steps it so, without the thread)."""
        with self._cv:
            msg, sink = self.outbox.messages[pair[0]], self.sinks[pair[1]]
        ok, why = deliver(sink.url, msg["title"], msg["body"])  # outside the lock: observe never waits on it
        with self._cv:
            self._record(pair, sink, ok, why)
            snapshot = json.dumps(self.outbox.to_json()).encode()  # in the order queued: sent in that order
            self._unsaved += 1
        try:
            self._save(snapshot)
        finally:
            with self._cv:
                self._unsaved -= 1
                self._cv.notify_all()

    def _record(self, pair: tuple[str, str], sink: Sink, ok: bool, why: str) -> None:
        state = self.outbox.sinks[sink.id]
        if ok:
            self.outbox.messages[pair[0]]["to"][sink.id] = time.time()
            state.tries_failed, state.last_error, state.delivered = 0, "", state.delivered + 1
            log.info("notify: %s sent to %s", pair[0], sink.label)
            return
        state.tries_failed, state.last_error = state.tries_failed + 1, why
        # the sink waits, all its messages with it: a receiver that is down is not asked once per message
        self._next_try[sink.id] = time.monotonic() + BACKOFF_S[min(state.tries_failed, len(BACKOFF_S)) - 1]
        if state.tries_failed == FAILING_AFTER:
            log.warning(
                "notify: %s keeps failing (%d tries in a row: %s); the sweep goes on and it is tried again",
                sink.label, state.tries_failed, why,
            )  # fmt: skip

    def _save(self, data: bytes) -> None:
        try:
            self.store.put_bytes(notify_key(self.sweep), data)
        except Exception as exc:  # the store may be down too: the next delivery writes the record again
            log.warning("notify: the outbox record could not be written: %s", exc)


def for_sweep(store: Store, sweep, env: dict | None = None) -> Notifier | None:
    """The sweep's notifier (started), or None without `notify:`."""
    sinks = sweep.spec.notify
    if not sinks:
        return None
    return Notifier(store, sweep.spec.name, resolve(sinks, env)).start()


def hand_off(sweep_path: str) -> None:
    """Leave what is still pending to a background sender (`orch _notify`), so the launch returns on time."""
    subprocess.Popen(  # noqa: S603 - our own interpreter and module
        [sys.executable, "-m", "orchestrator.cli", "_notify", str(sweep_path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


@dataclass(frozen=True)
class Delivery:
    """One sink's answer to `orch notify test`."""

    label: str
    delivered: bool
    error: str = ""


def send_test(sweep) -> list[Delivery]:
    """One message to every sink of the sweep, now, one try each (`orch notify test`). Records nothing."""
    sinks = resolve(sweep.spec.notify or [])
    title = title_of(sweep.spec.name, "test")
    out = []
    for s in sinks:
        events = ", ".join(e.value for e in s.events)
        body = f"A test message from `orch notify test` for sweep {sweep.spec.name}. This sink is told of: {events}."
        ok, why = deliver(s.url, title, body)
        out.append(Delivery(s.label, ok, why))
    return out


def drain(store: Store, sweep, patience_s: float = DRAIN_S) -> int:
    """The background sender: send what the outbox still holds, for at most `patience_s`; what is left."""
    if not sweep.spec.notify:
        return 0
    notifier = Notifier(store, sweep.spec.name, resolve(sweep.spec.notify)).start()
    return notifier.close(patience_s)


def check(sweep) -> None:
    """Before a launch buys anything: every sink resolves (its variable is set and holds a URL Apprise reads)."""
    try:
        resolve(sweep.spec.notify or [])
    except ValueError as exc:
        raise OrchError(f"{sweep.path}: {exc}", exit_code=2) from None


def status_lines(store: Store, sweep) -> list[str]:
    """What `orch status` says of the notifications: sinks that keep failing, messages still pending."""
    box = read_outbox(store, sweep.spec.name)  # (a sweep read back by name has no `notify:`: URLs are not kept)
    out = []
    if box.problem:
        out.append(
            f"notify: {store.url}/{notify_key(sweep.spec.name)} is not a notification record orch can read "
            f"({box.problem}); the controller starts a new one (a message may be sent again). Fix: move it aside."
        )
    for sid, s in box.sinks.items():
        pending = sum(1 for m in box.messages.values() if m["to"].get(sid, 0) is None)
        if s.failing:
            out.append(
                f"notify: {s.label} keeps failing ({s.tries_failed} tries in a row: {s.last_error}); "
                f"{pending} message(s) pending, retried. Check it with `orch notify test {sweep.path}`."
            )
        elif pending:
            out.append(f"notify: {pending} message(s) to {s.label} pending.")
    return out


def tell_now(store: Store, sweep, message: Message, patience_s: float = 60.0) -> int:
    """Send one message outside a controller's loop (the supervisor's `controller` events), once, recorded in the
    outbox like the rest; what is still pending after `patience_s`."""
    if not sweep.spec.notify:
        return 0
    notifier = Notifier(store, sweep.spec.name, resolve(sweep.spec.notify))
    notifier.queue([message])
    return notifier.start().close(patience_s)
