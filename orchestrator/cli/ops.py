"""CLI commands that stop or break things on purpose (down, gc, chaos) and `orch data push`. What a backend made
beyond a sweep's own teardown (aws: its regions' leftovers) is reached through the registry's `leftovers`."""

from __future__ import annotations

import os
import re
import signal
import socket
from pathlib import Path

import click

from orchestrator.backends import registry
from orchestrator.cli.common import as_launched, expected_errors, explained, load_sweep_arg, resolve_run, sweep_parts
from orchestrator.control.actions import chaos_drop, chaos_interrupt, stop_sweep
from orchestrator.control.lease import RENEW_S, request_stop, wait_released
from orchestrator.control.state import State, SweepLock
from orchestrator.errors import OrchError
from orchestrator.host.staging import push
from orchestrator.wait import Timeout, retry_until


@click.group()
def chaos():
    """Fault injection: prove that your training code survives what spot instances do to it."""


@chaos.command("interrupt")
@click.argument("run")
@click.option(
    "--grace",
    default=120.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds the run gets to checkpoint before its host goes (more than 0).",
)
@expected_errors
def chaos_interrupt_cmd(run: str, grace: float):
    """Send RUN a spot interruption notice, then take its host away.

    The agent asks the command to checkpoint (SIGUSR1), syncs it to the store and
    marks the run interrupted; then the host is terminated (locally: its tmux
    session is killed). The controller resumes the run on a new host from the
    newest verified checkpoint; preemptions do not count against max_restarts.

    \b
    Example:
      orch chaos interrupt 'lr=0.1,seed=0'
    """

    sweep, run_id = resolve_run(run)
    backend, store, _ = sweep_parts(sweep)
    st = chaos_interrupt(sweep, backend, store, run_id, grace)
    click.echo(f"interrupted {sweep.spec.name}/{run_id}: {st.reason or st.state}")


@chaos.command("drop")
@click.argument("run")
@expected_errors
def chaos_drop_cmd(run: str):
    """Take RUN's host away without warning: no notice, no checkpoint (a power cut, a
    network gone). Locally its tmux session is killed; on AWS its instance terminated; on
    ssh hosts its session there ended (the machine itself stays yours); on Slurm its job
    cancelled. The controller
    resumes the run from its newest checkpoint in the store; the work since is lost.

    \b
    Example:
      orch chaos drop 'lr=0.1,seed=0'
    """

    sweep, run_id = resolve_run(run)
    backend, _, _ = sweep_parts(sweep)
    dropped = chaos_drop(sweep, backend, run_id)
    click.echo(f"dropped the host(s) of {sweep.spec.name}/{run_id} without warning: {', '.join(dropped)}")


@click.command()
@click.argument("sweep", required=False)
@click.option(
    "--all", "everything", is_flag=True, help="Every sweep launched from here, and anything orch made in their regions."
)
@expected_errors
def down(sweep: str | None, everything: bool):
    """Stop everything of SWEEP: its controller, every run, and (aws) its instances,
    launch template, security group and instance profile. Safe to repeat, and to rerun
    after a failure halfway.

    Stopped runs resume (from their checkpoints) on the next `orch launch`.

    \b
    Example:
      orch down local-smoke
      orch down --all
    """

    if everything and sweep:
        raise OrchError("name one SWEEP or pass --all, not both.", exit_code=2)
    if not everything and not sweep:
        raise OrchError(
            "which sweep? `orch down SWEEP` stops one (`orch status` lists them); `orch down --all` stops every sweep "
            "launched from here.",
            exit_code=2,
        )
    known = {rec.name for rec in State().sweeps()}
    if sweep and sweep not in known and _made_by(sweep):  # a backend's leftovers (aws: an image build's)
        _down_leftovers(sweep)
        return
    names = [sweep] if sweep else sorted(known)
    failed = []
    for name in names:
        try:
            _down_one(name, known)
        except Exception as exc:  # --all: one sweep out of reach (no credentials for its cloud) stops no other
            err = explained(exc)
            if err is None or not everything:
                raise
            failed.append(name)
            click.echo(f"{name}: not stopped: {err}", err=True)
    if everything:
        failed += _down_unknown(set(names))
    if failed:
        raise OrchError(
            f"{len(failed)} could not be stopped ({', '.join(failed)}): fix what each says above, then run "
            "`orch down --all` again."
        )
    if not names and not everything:
        click.echo("no sweeps launched from here.")


def _made_by(name: str) -> list[str]:
    """The backends that give names like `name` to what is no sweep's (aws: `ami-RECIPE`, an image build's)."""
    return [b for b, left in registry.with_leftovers() if left.names is not None and re.fullmatch(left.names, name)]


def _down_unknown(names: set) -> list[str]:
    """`orch down --all`: what orch made in the places (aws: regions) of the sweeps launched from here, of sweeps not
    known here. Returns the places that could not be searched (each said why)."""

    problems: list[str] = []
    for left, place, by_sweep in _scan(problems):
        for name in sorted(set(by_sweep) - names):
            removed = left.remove(place, name)
            click.echo(f"{place}: removed {len(removed)} resource(s) of unknown sweep {name}: {', '.join(removed)}")
    for line in problems:
        click.echo(line, err=True)
    return [line.split(":")[0] for line in problems]


def _down_leftovers(name: str) -> None:
    """`orch down ami-RECIPE`: what an interrupted `orch ami build` left, in every region orch knows of."""

    found = False
    for left, place, by_sweep in _scan(only=_made_by(name)):
        if name in by_sweep:
            found = True
            removed = left.remove(place, name)
            click.echo(f"{place}: removed {len(removed)} resource(s) of {name}: {', '.join(removed)}")
    if not found:
        click.echo(f"nothing of {name} exists in the regions orch knows of (`orch gc` lists what does).")


def _down_one(arg: str, known: set) -> None:
    """Stop one sweep, printing as it goes. Its controller first, by name, when the sweep is known here: the
    lock is on this machine, so that much works even when the sweep's store or cloud cannot be reached."""

    if arg in known:
        _stop_controller(arg)
    sw = load_sweep_arg(arg)
    if arg not in known:  # a file: the sweep its launch recorded (the file may have been edited since)
        sw = as_launched(sw)
        _stop_controller(sw.spec.name)
    backend, store, _ = sweep_parts(sw)
    for line in _stop_elsewhere(sw, store):
        click.echo(line)
    stopped = stop_sweep(sw, backend, store)
    click.echo(
        f"stopped {len(stopped)} run(s): {', '.join(stopped)}"
        if stopped
        else f"nothing of sweep {sw.spec.name} is running."
    )
    removed = backend.teardown()
    places: dict[str, list[str]] = {}  # a sweep over several regions names each thing's region: `REGION: id`
    for item in removed:
        where, _, what = item.rpartition(": ")
        places.setdefault(where, []).append(what)
    for where, items in places.items():
        click.echo(f"{where + ': ' if where else ''}removed {len(items)} resource(s): {', '.join(items)}")


def _stop_controller(name: str) -> None:

    lock = SweepLock(State().home, name)
    lock.ask_stop()  # before the holder is read: whoever holds the lock next sees it and hands nothing on
    pid = lock.holder()
    if pid and pid > 0:
        try:
            os.kill(pid, signal.SIGTERM)
            retry_until(lambda: lock.holder() is None, 15, 0.1, f"controller {pid} to exit")
        except ProcessLookupError:
            pass
        except Timeout:
            os.kill(pid, signal.SIGKILL)
        click.echo(f"stopped controller pid {pid}")


def _stop_elsewhere(sw, store) -> list[str]:
    """A controller of another machine or ORCH_HOME (its lease in the store is live): asked to stop through
    the lease, and waited for, so that it does not start again what this command stops."""

    lease = request_stop(store, sw.spec.name, by=f"orch down on {socket.gethostname()} pid {os.getpid()}")
    if lease is None:
        return []
    if wait_released(store, sw.spec.name, timeout=RENEW_S * 4):
        return [f"stopped the controller on {lease.holder.where()}"]
    return [
        f"the controller on {lease.holder.where()} did not answer the stop request within {RENEW_S * 4:.0f} s; "
        "its runs are stopped anyway (an instance it runs on goes with the sweep's resources)"
    ]


def _scan(problems: list[str] | None = None, only: list[str] | None = None):
    """(leftovers, place, {sweep: [resource, ...]}) over each backend that makes things outliving a sweep's teardown
    (`only`: those named), in the places of its sweeps launched from here (registry.Leftovers). A sweep that cannot be
    read for want of its cloud is left out; a place that cannot be searched raises, or with `problems` given adds a
    line saying why to it and is left out."""

    for backend, left in registry.with_leftovers():
        if only is not None and backend not in only:
            continue
        sweeps = []
        for rec in State().sweeps():
            if rec.backend != backend:
                continue
            try:
                sweeps.append(load_sweep_arg(rec.name))
            except Exception as exc:
                if explained(exc) is None:
                    raise
        for place, by_sweep in left.scan(sweeps, problems).items():
            yield left, place, by_sweep


@click.command()
@expected_errors
def gc():
    """List what orch made and what still exists (instances, security groups, launch
    templates; instance profiles once, under `iam`: IAM is global), by sweep, in the regions of
    the sweeps launched from here, each with the command that removes it (`orch down SWEEP`; an image build's leftovers:
    `orch down ami-RECIPE`; images themselves: `orch ami list` / `orch ami rm`). Removes nothing.

    \b
    Example:
      orch gc
    """

    known = {rec.name for rec in State().sweeps()}
    found = False
    for _, place, by_sweep in _scan():
        for name, items in sorted(by_sweep.items()):
            found = True
            tag = "" if name in known else " (not launched from here)"
            click.echo(f"{place} {name}{tag}: {len(items)} resource(s); remove with `orch down {name}`")
            for item in items:
                click.echo(f"  {item}")
    if not found:
        click.echo("nothing of orch's exists in the regions of your sweeps.")


@click.command()
@click.argument("sweep")
@expected_errors
def forget(sweep: str):
    """Take SWEEP off this machine's list of sweeps, so that its name may name another
    sweep (a second clone's, say). Nothing in its store and nothing it made is touched:
    `orch status FILE` still reads it, and launching its file lists it here again.
    Refused while it runs here: `orch down SWEEP` first.

    \b
    Example:
      orch forget local-smoke
    """

    state = State()
    rec = state.sweep(sweep)
    pid = SweepLock(state.home, sweep).holder()
    live = [] if pid else _live_runs(sweep)
    if pid or live:
        running = f"its controller (pid {pid})" if pid else f"{len(live)} of its runs ({', '.join(live)})"
        raise OrchError(
            f"sweep {sweep!r} still runs here: {running}. Stop it first with `orch down {sweep}` (stopped runs resume "
            f"from their checkpoints when its file is launched again), then `orch forget {sweep}`.",
            exit_code=2,
        )
    state.forget(sweep)
    click.echo(
        f"forgot sweep {sweep} (launched from {rec.spec_path}, store {rec.store_url}); its store is untouched: "
        f"`orch status {rec.spec_path}` reads it, and launching that file lists it here again."
    )


def _live_runs(name: str) -> list[str]:
    """The runs of the sweep its backend lists as running; none when the sweep cannot be read (its store is gone)."""
    try:
        sw = load_sweep_arg(name)
        return sorted(host.run_id for host in sweep_parts(sw)[0].list())
    except Exception as exc:
        if explained(exc) is None:
            raise
        return []


@click.group()
def data():
    """Data sets for the `data:` entries of sweeps."""


@data.command("push")
@click.argument("local_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("url")
@expected_errors
def data_push(local_dir: Path, url: str):
    """Upload LOCAL_DIR to URL (s3://bucket/prefix/): only files that changed since the last push,
    then every file is checked in S3. A sweep's `data: [{from: URL, to: DIR}]` stages it to hosts.

    \b
    Example:
      orch data push ~/data/imagenette2 s3://my-bucket/datasets/imagenette2/
    """

    r = push(local_dir, url)
    click.echo(f"{url}: {r.files} files, {r.fetched} uploaded ({r.bytes / 1e6:.1f} MB), every file verified in S3")
