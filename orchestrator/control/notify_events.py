"""What a pass means to `notify:`: the events a Progress shows, as messages (a pure reading, cheap).

`messages_of` finds them (a run failed for good, interrupted, the target first met, a new best trial, 80% and 100%
of the budget, the end); each message has a key (`failed:<run>`, `target`, `budget:80`, `ended`, …) that
control/notify.py's outbox sends at most once per sink. `facts_of` gathers what they need besides the runs.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from orchestrator.control.collect import best_trial, collect
from orchestrator.control.raised import BUDGET_STOP
from orchestrator.control.trials import Trials
from orchestrator.control.views import Progress, RunView, usd
from orchestrator.store.base import Store
from orchestrator.store.status import CANCELLED, FAILED
from orchestrator.sweep.notify import Event
from orchestrator.sweep.spec import Sweep

log = logging.getLogger("orch.notify")

ENDED = "ended"  # the key of the sweep's end (`ended:N` for an end told again: keyed_end)
LOG_LINES = 15  # of a failed run's log tail, in its message
BODY_MAX = 3500  # characters of a message body (Slack and Discord cut longer ones)


@dataclass(frozen=True)
class Message:
    key: str  # one per event and subject: sent at most once per sink
    event: Event
    title: str
    body: str


@dataclass
class Facts:
    """What the events are found in besides the runs: the search's best so far, and the end's summary."""

    best: tuple[int, float, dict] | None = None  # (trial number, value told, params) with `search:`
    metric: str = ""  # the search's metric
    ended: str = ""  # the end's summary lines (best run, time and $ to the target), made by the caller


def messages_of(progress: Progress, facts: Facts) -> list[Message]:
    """Every event this progress shows (the outbox drops those already queued)."""
    sweep, out = progress.sweep, []
    for r in progress.runs:
        if r.final and r.state == FAILED:
            out.append(_failed(sweep, r))
        if r.preemptions:  # each interruption raises the count: one message per interruption
            text = f"{r.run_id} was interrupted ({r.preemptions} so far); it resumes from its last checkpoint."
            title = title_of(sweep, f"run {r.run_id} interrupted")
            out.append(Message(f"interrupted:{r.run_id}:{r.preemptions}", Event.INTERRUPTED, title, text))
    reached = [r for r in progress.runs if r.reached]
    if reached and progress.target:
        first = min(reached, key=lambda r: r.finished_at or math.inf)
        t = progress.target
        cmp = ">=" if t.get("mode") == "max" else "<="
        text = f"{first.run_id} reached {t['metric']} {cmp} {t['value']}."
        out.append(Message("target", Event.TARGET, title_of(sweep, "target reached"), text))
    if facts.best is not None:
        number, value, params = facts.best
        text = f"trial {number}: {facts.metric} = {value:.6g} with {_params(params)}"
        out.append(Message(f"best:{number}", Event.BEST, title_of(sweep, "new best trial"), text))
    out += _budget(progress)
    out += _deadline(progress)
    if progress.done:
        out.append(Message(ENDED, Event.ENDED, title_of(sweep, "ended"), _ended(progress, facts)))
    return out


def keyed_end(end: Message, queued: list[str]) -> Message:
    """The sweep's end, keyed so that it is news when it is (`queued`: the outbox's keys in the order queued): a
    sweep that went on after its end was told (a relaunch that found a run to do again, its record damaged, say)
    ends again, and that end is told again after what came since, as `ended again (N)`: an end is the last word."""
    ends = [k for k in queued if k == ENDED or k.startswith(ENDED + ":")]
    if not ends or queued[-1] in ends:
        return Message(ends[-1], end.event, end.title, end.body) if ends else end
    n = len(ends) + 1
    return Message(f"{ENDED}:{n}", end.event, f"{end.title} again ({n})", end.body)


def facts_of(sweep: Sweep, store: Store, trials: Trials | None, progress: Progress) -> Facts:
    """What notifications need besides the runs: the search's best trial so far, and at the end a summary."""
    facts = Facts()
    if trials is not None:
        valued = [(t.value, t) for t in trials.study.record.trials if t.value is not None]
        if valued:
            value, best = (max if trials.mode == "max" else min)(valued, key=lambda vt: vt[0])
            facts.best, facts.metric = (best.number, value, dict(best.params)), trials.metric
    if progress.done:
        facts.ended = ended_summary(sweep, store)
    return facts


def ended_summary(sweep: Sweep, store: Store) -> str:
    """The end's message beyond the counts: the best trial or run, and time and dollars to the target."""
    try:
        res = collect(sweep, store)
    except Exception as exc:  # a summary is worth less than the message itself
        log.warning("notify: no summary for the end's message: %s", exc)
        return ""
    lines = []
    best = best_trial(res) if sweep.spec.search is not None else None
    if best is not None and res.search is not None and best.trial_value is not None:
        lines.append(f"best trial: {best.run_id} ({res.search.metric} {best.trial_value:.6g})")
    if res.economics is not None:
        lines += res.economics.words()
    return "\n".join(lines)


def title_of(sweep: str, what: str) -> str:
    return f"orch: sweep {sweep}: {what}"


def _params(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "no params"


def _failed(sweep: str, r: RunView) -> Message:
    tail = "\n".join((r.log_tail or "").splitlines()[-LOG_LINES:])
    code = f" (exit code {r.exit_code})" if r.exit_code is not None else ""
    text = f"{r.run_id} failed for good after {r.attempt} attempt(s){code}: {r.reason or 'no reason recorded'}"
    if tail:
        text += f"\n\nthe last lines of its log:\n{tail}"
    return Message(f"failed:{r.run_id}", Event.FAILED, title_of(sweep, f"run {r.run_id} failed"), _cut(text))


def _budget(progress: Progress) -> list[Message]:
    budget, spend = progress.budget_usd, progress.spend_usd
    if not budget:
        return []
    out = []
    for share, key in ((0.8, "budget:80"), (1.0, "budget:100")):
        if spend >= share * budget:
            what = "reached: no new run or attempt starts" if share >= 1 else "80% spent"
            text = f"{usd(spend)} of the budget of {usd(budget)} spent ({what})."
            title = title_of(progress.sweep, "budget reached" if share >= 1 else "80% of the budget spent")
            out.append(Message(key, Event.BUDGET, title, text))
    return out


def _deadline(progress: Progress) -> list[Message]:
    """`deadline:` — behind its schedule (told once: the runs that must go on-demand now do), and missed."""
    d = progress.deadline
    if d is None:
        return []
    out = []
    if not d.on_schedule:
        text = f"{d.line(d.now)}. Runs that would be late are bought on-demand."
        out.append(Message("deadline:behind", Event.DEADLINE, title_of(progress.sweep, "behind its deadline"), text))
    unrun = [r.run_id for r in progress.runs if r.state == CANCELLED and r.reason.startswith(BUDGET_STOP)]
    if d.now > d.deadline and not progress.done:
        text = f"{d.line(d.now)}; the runs left go on (those waiting for a host are bought on-demand)."
        out.append(Message("deadline:missed", Event.DEADLINE, title_of(progress.sweep, "deadline missed"), text))
    elif unrun and progress.done:  # budget_usd wins: the work of these runs is not done by the deadline
        text = f"{len(unrun)} run(s) never ran: budget_usd was reached first (the budget wins over the deadline)."
        out.append(Message("deadline:missed", Event.DEADLINE, title_of(progress.sweep, "deadline not met"), text))
    return out


def _ended(progress: Progress, facts: Facts) -> str:
    counts = ", ".join(f"{n} {state}" for state, n in sorted(progress.counts().items()))
    lines = [f"{len(progress.runs)} runs: {counts}.", f"spent: {usd(progress.spend_usd)}."]
    if facts.ended:
        lines.append(facts.ended)
    return _cut("\n".join(lines))


def _cut(text: str) -> str:
    return text if len(text) <= BODY_MAX else text[: BODY_MAX - 1] + "…"


def controller_message(sweep: str, key: str, text: str) -> Message:
    return Message(f"controller:{key}", Event.CONTROLLER, title_of(sweep, "controller"), text)
