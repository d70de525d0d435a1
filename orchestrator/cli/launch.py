"""`orch launch` and `orch _controller` (the background controller): parse, call control/launch.py, print."""

from __future__ import annotations

import contextlib
import logging
import sys

import click

from orchestrator.backends.registry import backend_for, entry, load_sweep
from orchestrator.cli import remote as remote_controller
from orchestrator.cli.code_words import code_lines
from orchestrator.cli.common import expected_errors, make_console, sweep_parts
from orchestrator.cli.render import dry_run_lines, failure_report, spend_text, watch_progress
from orchestrator.control import launch as control
from orchestrator.control.code import with_snapshot


@click.command()
@click.argument("sweep_file", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Validate and print the runs and their commands; launch nothing.")
@click.option("--detach", is_flag=True, help="Run the controller in the background and return at once.")
@click.option("--all", "every", is_flag=True, help="With --dry-run: print every run (without it, the first 50).")
@click.option(
    "--remote",
    is_flag=True,
    help="aws: run the controller on an on-demand instance (`aws.controller`) in the sweep's home region (its store's "
    "bucket's), so this machine may sleep; returns once it runs.",
)
@expected_errors
def launch(sweep_file: str, dry_run: bool, detach: bool, every: bool, remote: bool):
    """Launch (or continue) the sweep in SWEEP_FILE and watch it.

    A second launch of the same sweep adopts what runs, skips what finished and
    retries failures up to max_restarts. Ctrl-C hands the loop to a background
    controller; runs keep going.

    \b
    Example:
      orch launch experiments/local-smoke.yaml --dry-run
    """
    sweep = with_snapshot(load_sweep(sweep_file))  # `workdir:`: the code the runs get, taken now
    con = make_console()
    if remote:
        remote_controller.check(sweep)
    if dry_run:
        freed = control.check_like_launch(sweep)
        if freed:
            con.print(freed, markup=False)
        backend = backend_for(sweep)
        plan = backend.plan()
        words = entry(sweep.spec.backend).plan_lines
        more = (remote_controller.controller_line(sweep, plan),) if remote and plan else ()
        more += tuple(control.check_deadline(sweep, backend, control.existing_store(sweep)))
        note = control.code_note(sweep)
        for line in dry_run_lines(sweep, words(sweep, plan) if plan and words else None, every, more):
            if note and line.startswith("code: "):  # the snapshot taken now is not what the runs get: say which is
                line, note = note, None
            con.print(line, markup=False)
        return
    if remote:  # a deadline in the past or out of reach is refused here too, before anything is bought
        for line in control.check_deadline(sweep, backend_for(sweep), control.existing_store(sweep)):
            con.print(line, markup=False)
        remote_controller.launch_remote(con, sweep)
        return
    note = control.code_note(sweep)  # before the launch records a new sweep's code
    this = control.Launch(sweep, *sweep_parts(sweep), on_event=lambda event: _tell(con, sweep, event, note))
    progress = this.run(detach, lambda run_fn: watch_progress(con, run_fn))
    if progress is not None:
        _finish(con, progress)


def _tell(con, sweep, event: control.Event, note: str | None = None) -> None:
    """What the launch says as it goes."""
    name = sweep.spec.name
    if isinstance(event, control.TookOver):
        _say(con, f"took the sweep over from a controller on {event.where} (silent for {event.silent_s:.0f} s)")
    elif isinstance(event, control.NameFreed):
        con.print(event.text, markup=False)
    elif isinstance(event, control.DeadlineNote):
        for line in event.lines:
            con.print(line, markup=False)
    elif isinstance(event, control.Started):
        con.print(
            f"{'launching' if event.new else 'continuing'} sweep [bold]{name}[/]: {len(sweep.runs)} runs, "
            f"max_parallel {sweep.spec.max_parallel}, store {sweep.store_url}"
        )
        lines = code_lines(sweep.snapshot, sweep.spec.setup)
        for line in [note, *lines[1:]] if note else lines:
            con.print(line, markup=False)
    elif isinstance(event, control.Detached):
        con.print(f"controller running in the background (pid {event.pid}). Watch: `orch status {name} --watch`.")
    elif isinstance(event, control.HandedOff):
        _say(
            con,
            f"\ndetached: runs keep going, the controller continues in the background (pid {event.pid}).\n"
            f"Watch: `orch status {name} --watch`. Stop everything: `orch down {name}`.",
        )
    elif isinstance(event, control.NotifyWaiting):
        _say(
            con,
            f"notify: {event.pending} message(s) not delivered yet (a receiver is down or slow): at most "
            f"{event.patience_s:.0f} s more here, then a background sender keeps trying; `orch status {name}` "
            "names the receiver.",
        )
    elif isinstance(event, control.Stopped):
        _say(con, f"\n{event.text}")
        _flush()  # the process ends at once after this event (os._exit)


def _say(con, text: str) -> None:
    """Print if there is still a terminal to print to (after SIGHUP there may be none)."""
    with contextlib.suppress(OSError):
        con.print(text, markup=False)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):
            stream.flush()


def _finish(con, progress):
    failed = progress.failed
    for line in failure_report(failed):
        con.print(line, markup=False)
    ok = sum(1 for r in progress.runs if r.state == "succeeded")
    spend = spend_text(progress)
    con.print(
        f"sweep {progress.sweep} done: {ok} of {len(progress.runs)} runs succeeded"
        + (f", {spend}" if spend else "")
        + f". Results: `orch collect {progress.sweep}`."
    )
    if failed:
        sys.exit(1)


@click.command("_controller", hidden=True)
@click.argument("sweep_file")
@click.option("--remote-settings", type=click.Path(dir_okay=False), help="On a remote controller's instance.")
@expected_errors
def controller_cmd(sweep_file: str, remote_settings: str | None):
    """The background controller (used by --detach and Ctrl-C, and on a remote controller's instance)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sweep = load_sweep(sweep_file)
    backend, store, state = sweep_parts(sweep)
    if remote_settings:
        backend = remote_controller.controller_backend(sweep, remote_settings)
    con = make_console()

    def tell(event: control.Event) -> None:
        if isinstance(event, control.TookOver):
            _say(con, f"took the sweep over from a controller on {event.where} (silent for {event.silent_s:.0f} s)")
        elif isinstance(event, control.NotStarting):
            click.echo(f"sweep {sweep.spec.name}: stopped by `orch down`; not starting.")
        elif isinstance(event, control.Stopped):
            click.echo(event.text)

    progress = control.serve(sweep, backend, store, state, tell, remote=bool(remote_settings))
    if progress is not None:
        click.echo(f"sweep {sweep.spec.name} done: {len(progress.failed)} failed")
