"""orch command line. Each command parses, calls one function, prints. Only the CLI (this package) prints."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import click

from orchestrator.cli.common import (  # noqa: F401
    EPILOG,
    expected_errors,
    explained,
    load_sweep_arg,
    make_console,
    resolve_run,
    sweep_parts,
)
from orchestrator.errors import OrchError

# --- commands -----------------------------------------------------------------------------------


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="orch")
def main():
    """Run deep-learning experiment sweeps on spot GPUs or on this machine.

    \b
    Example:
      orch launch experiments/local-smoke.yaml
      orch status
      orch collect local-smoke
    """


@main.command()
@click.argument("sweep_file", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Validate and print the runs and their commands; launch nothing.")
@click.option("--detach", is_flag=True, help="Run the controller in the background and return at once.")
@click.option("--all", "every", is_flag=True, help="With --dry-run: print every run (without it, the first 50).")
@click.option(
    "--remote",
    is_flag=True,
    help="aws: run the controller on an on-demand instance of the sweep's region (`aws.controller`), so this "
    "machine may sleep; returns once it runs.",
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
    from orchestrator.backends.registry import load_sweep

    sweep = load_sweep(sweep_file)
    con = make_console()
    if remote:
        from orchestrator.backends.aws.remote import check_remote

        check_remote(sweep)
    if dry_run:
        _check_like_launch(sweep)
        from orchestrator.backends.registry import backend_for
        from orchestrator.cli.render import dry_run_lines

        for line in dry_run_lines(sweep, backend_for(sweep).plan(), every, remote):
            con.print(line, markup=False)
        return
    if remote:
        from orchestrator.cli.remote import launch_remote

        launch_remote(con, sweep)
        return
    from orchestrator.control.controller import Controller
    from orchestrator.control.state import SweepLock
    from orchestrator.store import layout
    from orchestrator.store.base import get_json

    backend, store, state = sweep_parts(sweep)
    lock = SweepLock(state.home, sweep.spec.name)
    lock.acquire()
    lock.clear_stop()  # a launch after `orch down` runs the sweep again
    lease = _take_lease(con, sweep, store, state)  # before preflight: a sweep run elsewhere buys nothing here
    # SIGTERM or a closed terminal in the first seconds (preflight makes the security group, template and
    # profile on AWS) is treated like Ctrl-C there: whatever preflight made is removed before orch exits.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _hand_off)
    controller = Controller(sweep, backend, store, state)
    controller.lease = lease
    fresh = (
        get_json(store, layout.sweep_key(sweep.spec.name)) is None
    )  # a sweep seen before keeps what it has (its runs use it)
    try:
        backend.preflight()
        new = controller.prepare()
    except KeyboardInterrupt:
        removed = backend.teardown() if fresh else []
        lease.release("interrupted before the sweep started")
        lock.release()
        raise OrchError(
            f"interrupted before the sweep started; removed what this launch had made ({len(removed)} resource(s)). "
            f"Nothing new runs.",
            exit_code=130,
        ) from None
    except BaseException:
        lease.release("the launch failed before the sweep started")
        raise
    con.print(
        f"{'launching' if new else 'continuing'} sweep [bold]{sweep.spec.name}[/]: {len(sweep.runs)} runs, "
        f"max_parallel {sweep.spec.max_parallel}, store {sweep.store_url}"
    )
    if detach:
        lease.release("handed to a background controller")
        lock.release()
        pid = _spawn_controller(sweep)
        con.print(f"controller running in the background (pid {pid}). Watch: `orch status {sweep.spec.name} --watch`.")
        return
    _run_here(con, sweep, controller, lock)


def _run_here(con, sweep, controller, lock) -> None:
    """The loop in this process, with its table. Closing the terminal (SIGHUP) or a plain `kill` (SIGTERM)
    is treated like Ctrl-C: the loop is handed to a background controller, so queued runs still start."""
    from orchestrator.control.lease import LeaseLost

    try:
        progress = _watch(con, controller.run)
    except KeyboardInterrupt:  # (the loop released the lease on its way out)
        if lock.stop_asked():
            _stopped_by_down(con, sweep)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the hand-off itself is not interrupted
            signal.signal(sig, signal.SIG_IGN)
        lock.release()
        pid = _spawn_controller(sweep)
        _say(
            con,
            f"\ndetached: runs keep going, the controller continues in the background (pid {pid}).\n"
            f"Watch: `orch status {sweep.spec.name} --watch`. Stop everything: `orch down {sweep.spec.name}`.",
        )
        return
    except LeaseLost as exc:
        if not exc.stopped:
            raise
        _say(con, f"\n{exc}")
        return
    finally:
        lock.release()
    _finish(con, progress)


def _take_lease(con, sweep, store, state):
    """The sweep's lease in the store: one controller per sweep, whatever machine or ORCH_HOME runs it."""
    from orchestrator.control.lease import Lease

    lease = Lease(store, sweep.spec.name, state.home, str(sweep.path)).acquire()
    if lease.took_over is not None:
        _say(
            con,
            f"took the sweep over from a controller on {lease.took_over.holder.where()} "
            f"(silent for {lease.took_over.age():.0f} s)",
        )
    return lease


def _hand_off(signum, _frame):
    raise KeyboardInterrupt  # the same path as Ctrl-C


def _stopped_by_down(con, sweep) -> None:
    """`orch down` signalled this launch: a stop, not a hand-off. The process ends at once, lock held to the
    end, so `orch down` (waiting for the lock) stops the runs only once nothing of this launch can start more:
    provisioning threads still in flight would otherwise start an agent, or buy an instance, after it."""
    import os

    _say(con, f"\nstopped by `orch down {sweep.spec.name}`: no controller continues this sweep.")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):
            stream.flush()
    os._exit(143)


def _say(con, text: str) -> None:
    """Print if there is still a terminal to print to (after SIGHUP there may be none)."""
    with contextlib.suppress(OSError):
        con.print(text, markup=False)


def _check_like_launch(sweep) -> None:
    """A dry run refuses what the launch would refuse, without creating anything."""
    from orchestrator.control.controller import check_recorded
    from orchestrator.control.state import State
    from orchestrator.store import open_store

    if sweep.store_url.startswith("s3://") or Path(sweep.store_url).is_dir():
        check_recorded(sweep, open_store(sweep.store_url), State())
    else:
        State().check_same_store(sweep.spec.name, str(sweep.path), sweep.store_url)


def _watch(con, run_fn):
    """Drive run_fn(on_progress) with a live table on a terminal, one line per change otherwise."""
    from rich.live import Live

    from orchestrator.cli.render import runs_table

    if con.is_terminal:
        with Live(console=con, refresh_per_second=4, transient=False) as live:
            return run_fn(lambda p: live.update(runs_table(p)))
    seen = {}

    def on_progress(p):
        for r in p.runs:
            key = (r.state, r.attempt)
            if seen.get(r.run_id) != key:
                seen[r.run_id] = key
                extra = f" ({r.reason})" if r.reason and r.state not in ("running", "starting") else ""
                con.print(
                    f"{time.strftime('%H:%M:%S')} {r.run_id}: {r.state} (attempt {r.attempt}){extra}", markup=False
                )

    progress = run_fn(on_progress)
    con.print(runs_table(progress))
    return progress


def _finish(con, progress):
    from orchestrator.cli.render import failure_report

    failed = progress.failed
    for line in failure_report(failed):
        con.print(line, markup=False)
    from orchestrator.cli.render import spend_text

    ok = sum(1 for r in progress.runs if r.state == "succeeded")
    spend = spend_text(progress)
    con.print(
        f"sweep {progress.sweep} done: {ok} of {len(progress.runs)} runs succeeded"
        + (f", {spend}" if spend else "")
        + f". Results: `orch collect {progress.sweep}`."
    )
    if failed:
        sys.exit(1)


def _spawn_controller(sweep) -> int:
    from orchestrator.control.state import SweepLock
    from orchestrator.sweep.spec import orch_home
    from orchestrator.wait import Timeout, retry_until

    log_dir = orch_home() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = open(log_dir / f"{sweep.spec.name}-controller.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "_controller", str(sweep.path)],
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lock = SweepLock(orch_home(), sweep.spec.name)
    with contextlib.suppress(Timeout):
        retry_until(lambda: lock.holder() == proc.pid or proc.poll() is not None, 15, 0.05, "the background controller")
    if proc.poll() is not None:
        if lock.stop_asked():
            raise OrchError(f"stopped by `orch down {sweep.spec.name}`: no controller continues this sweep.", 143)
        raise OrchError(f"the background controller exited at once (code {proc.returncode}); see {log_file.name}")
    return proc.pid


@main.command("_controller", hidden=True)
@click.argument("sweep_file")
@click.option("--remote-settings", type=click.Path(dir_okay=False), help="On a remote controller's instance.")
@expected_errors
def controller_cmd(sweep_file: str, remote_settings: str | None):
    """The background controller (used by --detach and Ctrl-C, and on a remote controller's instance)."""
    import logging

    from orchestrator.backends.registry import load_sweep
    from orchestrator.control.controller import Controller
    from orchestrator.control.lease import LeaseLost
    from orchestrator.control.state import SweepLock

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sweep = load_sweep(sweep_file)
    backend, store, state = sweep_parts(sweep)
    if remote_settings:  # its backend sees the sweep with the controller's own key, group and profile
        from orchestrator.backends.aws.remote import RemoteSettings, remote_view
        from orchestrator.backends.registry import backend_for

        settings = RemoteSettings.read(Path(remote_settings))
        os.environ.update(settings.notify_env)  # `notify:`'s url_env sinks, as the laptop had them
        backend = backend_for(remote_view(sweep, settings))
    lock = SweepLock(state.home, sweep.spec.name)
    lock.acquire()
    con = make_console()
    lease = _take_lease(con, sweep, store, state)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if lock.stop_asked():  # `orch down` came while a launch handed the loop over: the stop wins
        click.echo(f"sweep {sweep.spec.name}: stopped by `orch down`; not starting.")
        return
    controller = Controller(sweep, backend, store, state)
    controller.lease = lease
    if remote_settings:  # nobody waits on this instance: it keeps trying to deliver before it ends
        from orchestrator.control.notify import REMOTE_PATIENCE_S

        controller.notify_patience_s, controller.notify_hand_off = REMOTE_PATIENCE_S, False
    controller.prepare()
    try:
        progress = controller.run()
    except LeaseLost as exc:
        if not exc.stopped:
            raise
        click.echo(str(exc))
        return
    click.echo(f"sweep {sweep.spec.name} done: {len(progress.failed)} failed")


def _status_of_every_sweep(con, as_json: bool) -> None:
    """`orch status` without a sweep: one line per sweep launched from here (a sweep out of reach says why)."""
    from orchestrator.cli.render import summary_line
    from orchestrator.control.actions import observe
    from orchestrator.control.state import State, SweepLock

    state = State()
    rows = []
    for rec in state.sweeps():
        try:
            sw = load_sweep_arg(rec.name)
            backend, store, _ = sweep_parts(sw)
            p = observe(sw, backend, store)
            summary = summary_line(p)
        except Exception as exc:  # one sweep out of reach (its cloud's credentials, say): list the others
            err = explained(exc)
            if err is None:
                raise
            summary = f"unreadable: {err}"
        holder = SweepLock(state.home, rec.name).holder()
        rows.append(
            {
                "sweep": rec.name,
                "backend": rec.backend,
                "store": rec.store_url,
                "runs": summary,
                "controller_pid": holder,
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        con.print("no sweeps launched from here yet. Start one: `orch launch experiments/local-smoke.yaml`.")
    for row in rows:
        ctl = f", controller pid {row['controller_pid']}" if row["controller_pid"] else ""
        con.print(f"{row['sweep']} ({row['backend']}{ctl}): {row['runs']}  store={row['store']}", markup=False)


@main.command()
@click.argument("sweep", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Keep the table live until the sweep is done.")
@click.option(
    "--all",
    "every",
    is_flag=True,
    help="Read every run's record and list every run (by default: the sweep's summary record, the records of "
    "active runs, and a table of active and newest finished runs with counts per state).",
)
@expected_errors
def status(sweep: str | None, as_json: bool, watch: bool, every: bool):
    """Show the runs of SWEEP (a name or a sweep file), or every sweep launched from here.

    It reads the sweep's summary record and the records of its active runs: a
    second at any sweep size. --json lists every run (from the summary).

    \b
    Example:
      orch status local-smoke --json
    """
    from orchestrator.cli.render import runs_table
    from orchestrator.control.actions import observe
    from orchestrator.wait import retry_until

    con = make_console()
    if sweep is None:
        _status_of_every_sweep(con, as_json)
        return
    sw = load_sweep_arg(sweep)
    backend, store, _ = sweep_parts(sw)
    if as_json:
        from orchestrator.control.lease import read_lease

        p = observe(sw, backend, store, every)
        lease = read_lease(store, sw.spec.name)[0]
        click.echo(
            json.dumps(
                {
                    "sweep": p.sweep,
                    "done": p.done,
                    "spend_usd": p.spend_usd,
                    "budget_usd": p.budget_usd,
                    "runs": [asdict(r) for r in p.runs],
                    "controller": None if lease is None else {**lease.to_json(), "alive": lease.alive()},
                },
                indent=2,
            )
        )
        return
    if watch:

        def run_fn(on_progress):
            last = []

            def once():
                last[:] = [observe(sw, backend, store, every)]
                on_progress(last[0])
                return last[0].done

            retry_until(once, None, 1.0)
            return last[0]

        _watch(con, run_fn)
        return
    progress = observe(sw, backend, store, every)
    con.print(runs_table(progress, every))
    if sw.spec.search is not None:
        from orchestrator.cli.render import search_status_line
        from orchestrator.control.trials import search_progress

        con.print(search_status_line(search_progress(sw, store)), markup=False)
    from orchestrator.control.notify import status_lines

    for line in status_lines(store, sw):
        con.print(line, markup=False)
    if not progress.done:
        con.print(_controller_line(sw, store), markup=False)


def _controller_line(sw, store) -> str:
    """Where the sweep's controller runs (its lease in the store), or that none does and how to continue."""
    from orchestrator.control.lease import read_lease

    lease, _ = read_lease(store, sw.spec.name)
    name, again = sw.spec.name, f"`orch launch {sw.path}`"
    if lease is not None and lease.alive():
        return f"controller: {lease.holder.where()}, last heartbeat {lease.age():.0f} s ago."
    if lease is not None and lease.ended is None:
        return (
            f"no controller is running for {name}: the one on {lease.holder.where()} is gone (no heartbeat for "
            f"{lease.age():.0f} s). Queued and interrupted runs will not start; continue the sweep with {again}."
        )
    return f"no controller is running for {name}: queued and interrupted runs will not start. Continue it with {again}."


@main.command()
@click.argument("sweep")
@click.option("--out", type=click.Path(file_okay=False), help="Output folder (default: results/<sweep>).")
@click.option(
    "--wide", is_flag=True, help="Show every column, however narrow the terminal (runs.csv always has them all)."
)
@click.option(
    "--tensorboard",
    "tb_dir",
    type=click.Path(file_okay=False),
    help="Also write TensorBoard event files there (one folder per run; needs the board extra). "
    "`orch tensorboard SWEEP` keeps them current and serves them.",
)
@expected_errors
def collect(sweep: str, out: str | None, wide: bool, tb_dir: str | None):
    """Gather SWEEP's results: a table here, runs.csv, runs.json and curves.png in --out.

    \b
    Example:
      orch collect local-smoke --out results/smoke
    """
    from orchestrator.cli.render import results_table
    from orchestrator.control.collect import collect as gather
    from orchestrator.control.collect import write_outputs

    sw = load_sweep_arg(sweep)
    _, store, _ = sweep_parts(sw)
    results = gather(sw, store)
    out_dir = Path(out or Path("results") / sw.spec.name)
    paths = write_outputs(results, out_dir)
    con = make_console()
    table = results_table(results, width=con.width, wide=wide)
    con.width = max(con.width, table.needed_width)  # longer lines rather than cut ids, states, times
    con.print(table)
    from orchestrator.cli.render import results_notes

    for line in results_notes(results):
        con.print(line, markup=False)
    if tb_dir:
        from orchestrator.control.board import Board

        board = Board(sw, store, Path(tb_dir), option="--tensorboard")
        n = board.update()
        board.close()
        con.print(
            f"wrote TensorBoard event files to {tb_dir} ({n} metrics lines). View: tensorboard --logdir {tb_dir}",
            markup=False,
        )
    con.print(f"wrote {', '.join(str(p) for p in paths)}", markup=False)


@main.command()
@click.argument("run")
@expected_errors
def cancel(run: str):
    """Stop RUN for good: its command is terminated and it is not retried.

    \b
    Example:
      orch cancel 'lr=0.1,seed=0'
    """
    from orchestrator.control.actions import cancel_run

    sweep, run_id = resolve_run(run)
    backend, store, _ = sweep_parts(sweep)
    click.echo(cancel_run(sweep, backend, store, run_id))


from orchestrator.cli.ami import ami  # noqa: E402
from orchestrator.cli.board import tensorboard  # noqa: E402
from orchestrator.cli.notify import notify_drain_cmd, notify_group  # noqa: E402
from orchestrator.cli.ops import aws_group, chaos, data, down, gc  # noqa: E402  (registered below)
from orchestrator.cli.remote import supervise_cmd  # noqa: E402
from orchestrator.cli.runs import attach, logs  # noqa: E402

main.add_command(ami)
main.add_command(chaos)
main.add_command(data)
main.add_command(down)
main.add_command(gc)
main.add_command(aws_group)
main.add_command(attach)
main.add_command(logs)
main.add_command(tensorboard)
main.add_command(supervise_cmd)
main.add_command(notify_group)
main.add_command(notify_drain_cmd)


if __name__ == "__main__":
    main()
