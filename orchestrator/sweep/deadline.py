"""`deadline:` as written: an absolute time with a zone (`2026-12-11T18:00Z`) or a duration from the sweep's first
launch (`90m`, `36h`, `2d`, `1h30m`). Parsing only; what a deadline does is control/schedule.py's.

A duration counts from the first launch (the sweep record's `launched_at`), so a relaunch with the same text keeps the
same moment; a changed text moves it (control/launch.py says so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?[smhd])+")
LONGEST_S = 10 * 365 * 86400  # a deadline further than this is a typo (and past year 9999 no clock can show it)
EXAMPLES = "an absolute time with its zone (2026-12-11T18:00Z, 2026-12-11T19:00+01:00) or a duration (90m, 36h, 2d)"


class BadDeadline(ValueError):
    """The text is neither form; the message says which forms are."""


@dataclass(frozen=True)
class Deadline:
    """One of the two forms: `at` (seconds since the epoch) for a time, `after_s` for a duration."""

    text: str
    at: float | None = None
    after_s: float | None = None

    def moment(self, launched_at: float) -> float:
        """The deadline as seconds since the epoch, for a sweep first launched at `launched_at`."""
        return self.at if self.at is not None else launched_at + (self.after_s or 0.0)


def parse(value: object) -> Deadline:
    """A deadline from sweep.yaml's value: a string (or the datetime YAML makes of `2026-12-11T18:00:00Z`)."""
    if isinstance(value, datetime):
        return _absolute(value, value.isoformat())
    if not isinstance(value, str) or not value.strip():
        raise BadDeadline(f"a deadline is {EXAMPLES}")
    text = value.strip()
    if _DURATION.fullmatch(text):
        seconds = sum(float(n) * UNITS[u] for n, u in _PART.findall(text))
        if seconds <= 0:
            raise BadDeadline(f"{text!r} is no time at all: a duration from the first launch is above 0, e.g. 36h")
        if seconds > LONGEST_S:
            raise BadDeadline(f"{text!r} is more than 10 years: a duration from the first launch, e.g. 36h")
        return Deadline(text, after_s=seconds)
    try:  # (Python 3.10's fromisoformat does not read a trailing Z)
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in "zZ" else text)
    except ValueError:
        raise BadDeadline(f"{text!r} is neither: a deadline is {EXAMPLES}") from None
    return _absolute(when, text)


def _absolute(when: datetime, text: str) -> Deadline:
    if when.tzinfo is None:
        raise BadDeadline(
            f"{text!r} has no zone: write it with one (Z for UTC, or +01:00), e.g. {text}Z — orch runs on machines "
            "whose clocks may be set to another zone"
        )
    if when.year > datetime.now(timezone.utc).year + 10:
        raise BadDeadline(f"{text!r} is more than 10 years away: a typo? e.g. 2026-12-11T18:00Z")
    return Deadline(text, at=when.astimezone(timezone.utc).timestamp())


def shown(moment: float) -> str:
    """A moment as the docs write deadlines: UTC, to the minute."""
    return datetime.fromtimestamp(moment, timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def span(seconds: float) -> str:
    """A length of time in the largest units that read well: 45s, 12m, 3h05m, 2d04h."""
    s = max(0, round(seconds))
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
