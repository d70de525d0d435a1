"""The one waiting helper: poll a function until it returns something truthy."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Timeout(Exception):
    """retry_until gave up; the message says what was awaited."""


def retry_until(
    fn: Callable[[], T | None],
    timeout: float | None,
    interval: float,
    what: str = "condition",
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call fn every `interval` seconds until it returns a truthy value, which is returned.

    timeout=None waits forever (loops that end on their own, like a controller pass loop).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        result = fn()
        if result:
            return result
        if deadline is not None and time.monotonic() >= deadline:
            raise Timeout(f"timed out after {timeout:.0f}s waiting for {what}")
        sleep(interval)
