"""`notify:` — where a sweep tells its user what matters (docs/guides/notifications.md).

A sink is one Apprise URL (Slack, Discord, e-mail, ntfy, a JSON webhook, …), written in the file (`url:`) or
named by an environment variable that holds it (`url_env:`), so a secret need not be in the file. The URL is
checked here, at validation, with Apprise's own parser: a scheme Apprise does not know, or a URL it cannot read,
is refused before anything is bought. Nothing here sends; control/notify.py does.
"""

from __future__ import annotations

import os
from enum import Enum

from pydantic import Field, model_validator

from orchestrator.sweep.spec_types import KEY_RE, Strict


class Event(str, Enum):
    """What a sweep tells (every message names the sweep and the event)."""

    ENDED = "ended"  # the sweep ended: counts per state, best run or trial, time and $ to the target, $ spent
    FAILED = "failed"  # a run failed for good: its reason and the last lines of its log
    TARGET = "target"  # the target first reached, by which run
    BEST = "best"  # `search:` — a new best trial
    BUDGET = "budget"  # 80% of budget_usd spent, and reached
    INTERRUPTED = "interrupted"  # a spot interruption (off by default: a sweep can have many)
    CONTROLLER = "controller"  # a remote controller restarted by its supervisor, or gone
    DEADLINE = "deadline"  # `deadline:` — the sweep fell behind its schedule (runs go on-demand), or missed it
    TEST = "test"  # `orch notify test` only


# Every event but `interrupted` (and `test`, which only `orch notify test` sends).
DEFAULT_EVENTS = (
    Event.ENDED,
    Event.FAILED,
    Event.TARGET,
    Event.BEST,
    Event.BUDGET,
    Event.CONTROLLER,
    Event.DEADLINE,
)
CHOOSABLE = [e.value for e in Event if e is not Event.TEST]


def parse_url(url: str):
    """Apprise's plugin object for `url`, or None when Apprise cannot read it (unknown scheme, bad form)."""
    import apprise  # a third of a second: only sweeps with `notify:` pay it

    return apprise.Apprise.instantiate(url, suppress_exceptions=True)


def redacted(url: str) -> str:
    """The form a URL is shown in (status, logs, the store): Apprise hides its secrets (tokens, passwords)."""
    from urllib.parse import urlsplit

    plugin = parse_url(url)
    shown = plugin.url(privacy=True) if plugin is not None else url
    parts = urlsplit(shown)
    host = parts.netloc.rsplit("@", 1)[-1]  # no user or password, even a masked one
    # a path can be a secret too (a webhook's token): only the scheme and the host are shown
    return f"{parts.scheme}://{host}" + ("/…" if parts.path.strip("/") else "")


class NotifySink(Strict):
    """One place notifications go: an Apprise URL, or the environment variable that holds one."""

    url: str | None = Field(
        None,
        min_length=1,
        description="An Apprise URL, e.g. json://hooks.example.com/orch, mailto://user:pass@example.com, "
        "slack://TokenA/TokenB/TokenC/#channel. Shown redacted; never written to the store.",
    )
    url_env: str | None = Field(
        None,
        min_length=1,
        description="The name of an environment variable that holds the URL (read where the controller starts).",
    )
    events: list[Event] = Field(
        default_factory=lambda: list(DEFAULT_EVENTS),
        min_length=1,
        description=f"Which events this sink gets, of {', '.join(CHOOSABLE)} (default: all but interrupted).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> NotifySink:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give exactly one of `url:` (an Apprise URL) or `url_env:` (a variable that holds one)")
        if self.url_env is not None and not KEY_RE.match(self.url_env):
            raise ValueError(f"url_env {self.url_env!r} is not an environment variable name (letters, digits, _)")
        if self.url is not None and parse_url(self.url) is None:
            raise ValueError(_unreadable(self.url))
        if Event.TEST in self.events:
            raise ValueError("`test` is sent by `orch notify test` only; choose from " + ", ".join(CHOOSABLE))
        return self

    def resolve(self, env: dict | None = None) -> str:
        """The URL itself: from the file, or from the variable (this process's environment by default)."""
        if self.url is not None:
            return self.url
        value = (os.environ if env is None else env).get(self.url_env or "", "").strip()
        if not value:
            raise ValueError(
                f"the environment variable {self.url_env} is not set: export {self.url_env}='<an Apprise URL>' "
                "before launching, or remove this sink"
            )
        if parse_url(value) is None:
            raise ValueError(f"{self.url_env} holds {_unreadable(value)}")
        return value

    def label(self) -> str:
        """How the sink is named in output: its variable, or its URL redacted."""
        return f"${self.url_env}" if self.url_env else redacted(self.url or "")


def _unreadable(url: str) -> str:
    scheme = url.split("://", 1)[0] if "://" in url else url[:20]
    return (
        f"a URL Apprise cannot read (scheme {scheme!r}): write one of Apprise's URLs, e.g. json://host/path, "
        "mailto://user:pass@example.com or slack://TokenA/TokenB/TokenC (https://github.com/caronc/apprise/wiki)"
    )
