"""orch command line. Each command parses, calls one function, prints. Only this module prints."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import List, Optional, Tuple

import click

from .errors import NotFound, OrchError

EPILOG = "Docs: README.md. Runs keep going when orch exits; `orch down SWEEP` stops everything."


def _console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


def expected_errors(fn):
    """Expected errors print their message and exit with their code; no traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OrchError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except Exception as exc:  # an AWS answer nobody turned into words yet: still no traceback
            if not type(exc).__module__.startswith("botocore"):
                raise
            from .ec2 import explain

            click.echo(f"error: {explain(exc, 'an AWS call')}", err=True)
            sys.exit(1)

    return wrapper


# --- resolving arguments ------------------------------------------------------------------------


def load_sweep_arg(arg: str):
    """A sweep file path, or the name of a sweep launched from this machine."""
    from .spec import load_sweep, sweep_from_record
    from .state import State
    from .store import get_json, open_store

    if arg.endswith((".yaml", ".yml")) or os.sep in arg or Path(arg).is_file():
        return load_sweep(arg)
    rec = State().sweep(arg)
    data = get_json(open_store(rec.store_url), f"{rec.name}/sweep.json")
    if data is None:
        raise NotFound(f"sweep {arg!r}: its store {rec.store_url} has no sweep.json any more. Launch its file again.")
    return sweep_from_record(data, rec.spec_path)


def resolve_run(arg: str) -> Tuple[object, str]:
    """RUN or SWEEP/RUN -> (sweep, run id), searching the sweeps launched from here."""
    from .state import State

    if re.match(r"^i-[0-9a-f]{8,17}$", arg):  # an instance id, as users of the seed tooling type it
        for rec in State().sweeps():
            if rec.backend != "aws":
                continue
            sweep = load_sweep_arg(rec.name)
            run_id = _parts(sweep)[0].run_of_instance(arg)
            if run_id:
                return sweep, run_id
        raise NotFound(f"instance {arg} belongs to no running run of a sweep launched from here.")
    if "/" in arg:
        name, run_id = arg.split("/", 1)
        candidates = [load_sweep_arg(name)]
    else:
        run_id = arg
        candidates = []
        for rec in State().sweeps():
            try:
                candidates.append(load_sweep_arg(rec.name))
            except OrchError:
                continue
    hits = [s for s in candidates if any(r.run_id == run_id for r in s.runs)]
    if not hits:
        raise NotFound(f"no run {run_id!r} in {'that sweep' if '/' in arg else 'any sweep launched from here'}. List runs with `orch status SWEEP`.")
    if len(hits) > 1:
        names = ", ".join(f"{s.spec.name}/{run_id}" for s in hits)
        raise NotFound(f"run {run_id!r} exists in several sweeps; name one: {names}")
    return hits[0], run_id


def _parts(sweep):
    from .backends import backend_for
    from .state import State
    from .store import open_store

    return backend_for(sweep), open_store(sweep.store_url), State()


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
@expected_errors
def launch(sweep_file: str, dry_run: bool, detach: bool):
    """Launch (or continue) the sweep in SWEEP_FILE and watch it.

    A second launch of the same sweep adopts what runs, skips what finished and
    retries failures up to max_restarts. Ctrl-C hands the loop to a background
    controller; runs keep going.

    \b
    Example:
      orch launch experiments/local-smoke.yaml --dry-run
    """
    from .spec import load_sweep

    sweep = load_sweep(sweep_file)
    con = _console()
    if dry_run:
        con.print(f"sweep [bold]{sweep.spec.name}[/]: {len(sweep.runs)} runs on backend {sweep.spec.backend}, "
                  f"max_parallel {sweep.spec.max_parallel}, store {sweep.store_url}")
        for run in sweep.runs:
            con.print(f"  {run.run_id}: {run.command}", markup=False)
        if sweep.spec.backend == "aws":
            from .backends import backend_for

            plan = backend_for(sweep).plan()
            for row in plan["choices"]:
                price = f"${row['spot_usd_per_h']:.4f}/h" if row["spot_usd_per_h"] is not None else "no spot price"
                con.print(f"  choice {row['type']} in {row['az']}: {price}", markup=False)
            est = plan["estimate_usd_max"]
            con.print(f"estimated cost at most ${est:.2f} ({plan['runs']} runs x {plan['hours_per_run_max']:.1f} h at the cheapest spot price; "
                      "runs that end sooner cost less)" if est is not None else "estimated cost unknown: no spot price history", markup=False)
        con.print("dry run: nothing launched.")
        return
    from .controller import Controller
    from .state import SweepLock

    backend, store, state = _parts(sweep)
    lock = SweepLock(state.home, sweep.spec.name)
    lock.acquire()
    backend.preflight()
    controller = Controller(sweep, backend, store, state)
    new = controller.prepare()
    con.print(f"{'launching' if new else 'continuing'} sweep [bold]{sweep.spec.name}[/]: {len(sweep.runs)} runs, "
              f"max_parallel {sweep.spec.max_parallel}, store {sweep.store_url}")
    if detach:
        lock.release()
        pid = _spawn_controller(sweep)
        con.print(f"controller running in the background (pid {pid}). Watch: `orch status {sweep.spec.name} --watch`.")
        return
    try:
        progress = _watch(con, controller.run)
    except KeyboardInterrupt:
        lock.release()
        pid = _spawn_controller(sweep)
        con.print(f"\ndetached: runs keep going, the controller continues in the background (pid {pid}).\n"
                  f"Watch: `orch status {sweep.spec.name} --watch`. Stop everything: `orch down {sweep.spec.name}`.")
        return
    finally:
        lock.release()
    _finish(con, progress)


def _watch(con, run_fn):
    """Drive run_fn(on_progress) with a live table on a terminal, one line per change otherwise."""
    from rich.live import Live

    from .render import runs_table

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
                con.print(f"{time.strftime('%H:%M:%S')} {r.run_id}: {r.state} (attempt {r.attempt}){extra}", markup=False)

    progress = run_fn(on_progress)
    con.print(runs_table(progress))
    return progress


def _finish(con, progress):
    from .render import failure_report

    failed = progress.failed
    for line in failure_report(failed):
        con.print(line, markup=False)
    from .render import spend_text

    ok = sum(1 for r in progress.runs if r.state == "succeeded")
    spend = spend_text(progress)
    con.print(f"sweep {progress.sweep} done: {ok} of {len(progress.runs)} runs succeeded"
              + (f", {spend}" if spend else "") + f". Results: `orch collect {progress.sweep}`.")
    if failed:
        sys.exit(1)


def _spawn_controller(sweep) -> int:
    from .spec import orch_home
    from .state import SweepLock
    from .wait import Timeout, retry_until

    log_dir = orch_home() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = open(log_dir / f"{sweep.spec.name}-controller.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "_controller", str(sweep.path)],
        stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
    )
    lock = SweepLock(orch_home(), sweep.spec.name)
    try:
        retry_until(lambda: lock.holder() == proc.pid or proc.poll() is not None, 15, 0.05, "the background controller")
    except Timeout:
        pass
    if proc.poll() is not None:
        raise OrchError(f"the background controller exited at once (code {proc.returncode}); see {log_file.name}")
    return proc.pid


@main.command("_controller", hidden=True)
@click.argument("sweep_file")
@expected_errors
def controller_cmd(sweep_file: str):
    """The background controller (used by --detach and Ctrl-C)."""
    import logging

    from .controller import Controller
    from .spec import load_sweep
    from .state import SweepLock

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sweep = load_sweep(sweep_file)
    backend, store, state = _parts(sweep)
    lock = SweepLock(state.home, sweep.spec.name)
    lock.acquire()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    controller = Controller(sweep, backend, store, state)
    controller.prepare()
    progress = controller.run()
    click.echo(f"sweep {sweep.spec.name} done: {len(progress.failed)} failed")


@main.command()
@click.argument("sweep", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Keep the table live until the sweep is done.")
@expected_errors
def status(sweep: Optional[str], as_json: bool, watch: bool):
    """Show the runs of SWEEP (a name or a sweep file), or every sweep launched from here.

    \b
    Example:
      orch status local-smoke --json
    """
    from .controller import observe
    from .render import runs_table, summary_line
    from .state import State, SweepLock
    from .wait import retry_until

    con = _console()
    if sweep is None:
        state = State()
        rows = []
        for rec in state.sweeps():
            try:
                sw = load_sweep_arg(rec.name)
                backend, store, _ = _parts(sw)
                p = observe(sw, backend, store)
                summary = summary_line(p)
            except OrchError as exc:
                summary = f"unreadable: {exc}"
            holder = SweepLock(state.home, rec.name).holder()
            rows.append({"sweep": rec.name, "backend": rec.backend, "store": rec.store_url, "runs": summary,
                         "controller_pid": holder})
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        if not rows:
            con.print("no sweeps launched from here yet. Start one: `orch launch experiments/local-smoke.yaml`.")
        for row in rows:
            ctl = f", controller pid {row['controller_pid']}" if row["controller_pid"] else ""
            con.print(f"{row['sweep']} ({row['backend']}{ctl}): {row['runs']}  store={row['store']}", markup=False)
        return
    sw = load_sweep_arg(sweep)
    backend, store, _ = _parts(sw)
    if as_json:
        p = observe(sw, backend, store)
        click.echo(json.dumps({"sweep": p.sweep, "done": p.done, "spend_usd": p.spend_usd, "budget_usd": p.budget_usd,
                               "runs": [asdict(r) for r in p.runs]}, indent=2))
        return
    if watch:
        def run_fn(on_progress):
            last = []

            def once():
                last[:] = [observe(sw, backend, store)]
                on_progress(last[0])
                return last[0].done

            retry_until(once, None, 1.0)
            return last[0]

        _watch(con, run_fn)
        return
    con.print(runs_table(observe(sw, backend, store)))


@main.command()
@click.argument("run")
@expected_errors
def attach(run: str):
    """Open an interactive terminal in RUN's tmux session (detach: Ctrl-b d).

    RUN is a run id, or SWEEP/RUN when several sweeps have it.

    \b
    Example:
      orch attach 'lr=0.1,seed=0'
    """
    sweep, run_id = resolve_run(run)
    backend, _, _ = _parts(sweep)
    sys.exit(backend.attach(run_id))


@main.command()
@click.argument("run")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the log grows, until the run ends.")
@click.option("--attempt", type=int, help="Which attempt's log (default: the latest).")
@expected_errors
def logs(run: str, follow: bool, attempt: Optional[int]):
    """Print RUN's log (the command's stdout and stderr) from the store.

    \b
    Example:
      orch logs 'lr=0.1,seed=0' -f
    """
    from .status import ACTIVE, read_status
    from .wait import retry_until

    sweep, run_id = resolve_run(run)
    _, store, _ = _parts(sweep)
    name = sweep.spec.name
    n = attempt or read_status(store, name, run_id).attempt
    if not n:
        raise NotFound(f"run {run_id} has not started yet, so it has no log.")
    key = f"{name}/{run_id}/logs/{n}.log"
    printed = 0

    def pump() -> bool:
        nonlocal printed
        data = store.get_bytes(key) or b""
        if len(data) > printed:
            sys.stdout.write(data[printed:].decode(errors="replace"))
            sys.stdout.flush()
            printed = len(data)
        st = read_status(store, name, run_id)
        return not follow or (st.attempt != n or st.state not in ACTIVE)

    if store.get_bytes(key) is None and not follow:
        raise NotFound(f"no log for attempt {n} of {run_id} in the store yet ({key}).")
    retry_until(pump, None, 0.5)
    pump()


@main.command()
@click.argument("sweep")
@click.option("--out", type=click.Path(file_okay=False), help="Output folder (default: results/<sweep>).")
@expected_errors
def collect(sweep: str, out: Optional[str]):
    """Gather SWEEP's results: a table here, runs.csv, runs.json and curves.png in --out.

    \b
    Example:
      orch collect local-smoke --out results/smoke
    """
    from .collect import collect as gather
    from .collect import write_outputs
    from .render import results_table

    sw = load_sweep_arg(sweep)
    _, store, _ = _parts(sw)
    results = gather(sw, store)
    out_dir = Path(out or Path("results") / sw.spec.name)
    paths = write_outputs(results, out_dir)
    con = _console()
    con.print(results_table(results))
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
    from .controller import cancel_run

    sweep, run_id = resolve_run(run)
    backend, store, _ = _parts(sweep)
    was = cancel_run(sweep, backend, store, run_id)
    click.echo(f"cancelled {sweep.spec.name}/{run_id}" + ("" if was else " (it was not running)"))


@main.group()
def chaos():
    """Fault injection: prove that your training code survives what spot instances do to it."""


@chaos.command("interrupt")
@click.argument("run")
@click.option("--grace", default=120.0, show_default=True, help="Seconds the run gets to checkpoint before its host goes.")
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
    from .controller import chaos_interrupt

    sweep, run_id = resolve_run(run)
    backend, store, _ = _parts(sweep)
    st = chaos_interrupt(sweep, backend, store, run_id, grace)
    click.echo(f"interrupted {sweep.spec.name}/{run_id}: {st.reason or st.state}")


@main.command()
@click.argument("sweep", required=False)
@click.option("--all", "everything", is_flag=True, help="Every sweep launched from here, and anything orch made in their regions.")
@expected_errors
def down(sweep: Optional[str], everything: bool):
    """Stop everything of SWEEP: its controller, every run, and (aws) its instances,
    launch template, security group and instance profile. Safe to repeat, and to rerun
    after a failure halfway.

    Stopped runs resume (from their checkpoints) on the next `orch launch`.

    \b
    Example:
      orch down local-smoke
      orch down --all
    """
    from .state import State

    if everything == bool(sweep):
        raise OrchError("name one SWEEP, or pass --all (not both).")
    names = [sweep] if sweep else [rec.name for rec in State().sweeps()]
    for name in names:
        for line in _down_one(load_sweep_arg(name)):
            click.echo(line)
    if everything:
        for region, by_sweep in _scan_regions().items():
            for name in sorted(set(by_sweep) - set(names)):
                from . import ec2 as api

                removed = api.teardown(api.client("ec2", region), api.client("iam", region), name)
                click.echo(f"{region}: removed {len(removed)} resource(s) of unknown sweep {name}: {', '.join(removed)}")
    if not names and not everything:
        click.echo("no sweeps launched from here.")


def _down_one(sw) -> List[str]:
    from .controller import stop_sweep
    from .state import SweepLock
    from .wait import Timeout, retry_until

    out = []
    backend, store, state = _parts(sw)
    lock = SweepLock(state.home, sw.spec.name)
    pid = lock.holder()
    if pid and pid > 0:
        try:
            os.kill(pid, signal.SIGTERM)
            retry_until(lambda: lock.holder() is None, 15, 0.1, f"controller {pid} to exit")
        except ProcessLookupError:
            pass
        except Timeout:
            os.kill(pid, signal.SIGKILL)
        out.append(f"stopped controller pid {pid}")
    stopped = stop_sweep(sw, backend, store)
    out.append(f"stopped {len(stopped)} run(s): {', '.join(stopped)}" if stopped else f"nothing of sweep {sw.spec.name} is running.")
    removed = backend.teardown()
    if removed:
        out.append(f"removed {len(removed)} resource(s): {', '.join(removed)}")
    return out


def _scan_regions():
    """{region: {sweep: [resource, ...]}} over the regions of every aws sweep launched from here."""
    from . import ec2 as api
    from .state import State

    regions = set()
    for rec in State().sweeps():
        if rec.backend == "aws":
            try:
                regions.add(load_sweep_arg(rec.name).spec.aws.region)
            except OrchError:
                continue
    out = {}
    for region in sorted(regions):
        try:
            out[region] = api.orch_resources(api.client("ec2", region), api.client("iam", region))
        except Exception as exc:  # botocore errors: say which region, keep going
            raise api.explain(exc, f"scanning {region}") from None
    return out


@main.command()
@expected_errors
def gc():
    """List what orch made and what still exists (instances, security groups, launch
    templates, instance profiles), by sweep, in the regions of the sweeps launched from
    here. Removes nothing: `orch down SWEEP` or `orch down --all` does.

    \b
    Example:
      orch gc
    """
    from .state import State

    known = {rec.name for rec in State().sweeps()}
    found = False
    for region, by_sweep in _scan_regions().items():
        for name, items in sorted(by_sweep.items()):
            found = True
            tag = "" if name in known else " (not launched from here)"
            click.echo(f"{region} {name}{tag}: {len(items)} resource(s)")
            for item in items:
                click.echo(f"  {item}")
    if not found:
        click.echo("nothing of orch's exists in the regions of your sweeps.")


if __name__ == "__main__":
    main()
