"""`orch attach`, `orch logs` and `orch cancel`: one run, live in its tmux window, from the store, or stopped."""

from __future__ import annotations

import sys

import click

from orchestrator.cli.common import expected_errors, load_sweep_arg, resolve_run, sweep_parts
from orchestrator.control.actions import cancel_run
from orchestrator.control.lease import read_lease
from orchestrator.errors import NotFound, OrchError
from orchestrator.store import layout
from orchestrator.store.status import ACTIVE, read_status
from orchestrator.wait import retry_until


@click.command()
@click.argument("run")
@click.option(
    "--node",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Which node of a run that spans several instances (`resources: nodes:`); 0 is the rendezvous node.",
)
@expected_errors
def attach(run: str, node: int):
    """Open an interactive terminal in RUN's tmux session (detach: Ctrl-b d).

    RUN is a run id, or SWEEP/RUN when several sweeps have it.

    \b
    Example:
      orch attach 'lr=0.1,seed=0'
      orch attach run --node 1     # node 1 of a run on several instances
    """
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise NotFound(
            f"orch attach needs a terminal: it opens {run}'s tmux window. From a script, follow its log: `orch logs "
            f"{run} -f`."
        )
    sweep, run_id = resolve_run(run)
    backend, _, _ = sweep_parts(sweep)
    sys.exit(backend.attach(run_id, node))


@click.command()
@click.argument("run")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the log grows, until the run ends.")
@click.option("--attempt", type=click.IntRange(min=1), help="Which attempt's log, 1 or more (default: the latest).")
@click.option(
    "--node",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="A multi-node run's node (0 is the run's own log; K > 0 that node's copy of the command).",
)
@click.option(
    "--controller",
    is_flag=True,
    help="RUN names a sweep: print its remote controller's own log (`orch launch --remote`) from the store.",
)
@expected_errors
def logs(run: str, follow: bool, attempt: int | None, node: int, controller: bool):
    """Print RUN's log (the command's stdout and stderr) from the store.

    \b
    Example:
      orch logs 'lr=0.1,seed=0' -f
      orch logs --controller my-sweep
    """

    if controller:
        _controller_log(run, follow)
        return

    sweep, run_id = resolve_run(run)
    _, store, _ = sweep_parts(sweep)
    name = sweep.spec.name
    n = attempt or read_status(store, name, run_id).attempt
    if not n:
        raise NotFound(f"run {run_id} has not started yet, so it has no log.")
    if node >= max(1, sweep.spec.resources.nodes if sweep.spec.resources else 1):
        raise OrchError(
            f"run {run_id} has no node {node}: its nodes are 0 … "
            f"{(sweep.spec.resources.nodes if sweep.spec.resources else 1) - 1}.",
            exit_code=2,
        )
    key = layout.log_key(name, run_id, n, node)
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


def _controller_log(sweep_arg: str, follow: bool) -> None:
    """The remote controller's log (its supervisor copies it into the store every few seconds)."""

    sweep = load_sweep_arg(sweep_arg)
    _, store, _ = sweep_parts(sweep)
    key = layout.controller_log_key(sweep.spec.name)
    if store.get_bytes(key) is None and not follow:
        raise NotFound(
            f"sweep {sweep.spec.name} has no remote controller's log in the store ({key}): it runs with "
            f"`orch launch --remote`. A controller on this machine logs to its terminal or to "
            f"$ORCH_HOME/logs/{sweep.spec.name}-controller.log."
        )
    printed = 0

    def pump() -> bool:
        nonlocal printed
        data = store.get_bytes(key) or b""
        if len(data) < printed:  # the store keeps the log's tail: it was cut at the front
            printed = 0
        if len(data) > printed:
            sys.stdout.write(data[printed:].decode(errors="replace"))
            sys.stdout.flush()
            printed = len(data)
        lease, _ = read_lease(store, sweep.spec.name)
        return not follow or lease is None or not lease.alive()

    retry_until(pump, None, 1.0)


@click.command()
@click.argument("run")
@expected_errors
def cancel(run: str):
    """Stop RUN for good: its command is terminated and it is not retried.

    \b
    Example:
      orch cancel 'lr=0.1,seed=0'
    """
    sweep, run_id = resolve_run(run)
    backend, store, _ = sweep_parts(sweep)
    click.echo(cancel_run(sweep, backend, store, run_id))
