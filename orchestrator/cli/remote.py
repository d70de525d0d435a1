"""`orch launch --remote` (the laptop's side) and `orch _supervise` (what runs on the controller's instance)."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from orchestrator.cli.common import _parts, expected_errors
from orchestrator.errors import OrchError

FIRST_PASS_S = 300.0  # after the install: the supervisor starts, the controller takes the lease (its first pass)


def launch_remote(con, sweep) -> None:
    """Validate and prepare here as a launch does, start the controller on its instance, return once its lease is
    in the store (or adopt the one that already runs)."""
    from orchestrator.backends.aws.remote import check_remote, launch_controller, live_controllers
    from orchestrator.control.controller import Controller
    from orchestrator.control.lease import read_lease, refusal

    check_remote(sweep)
    backend, store, state = _parts(sweep)
    name = sweep.spec.name
    lease, _ = read_lease(store, name)
    if lease is not None and lease.alive():
        if not lease.holder.instance_id:
            raise OrchError(refusal(name, lease, str(sweep.path)), exit_code=2)
        con.print(
            f"sweep {name} already runs on its remote controller: {lease.holder.where()}, last heartbeat "
            f"{lease.age():.0f} s ago. Adopted; nothing new started.",
            markup=False,
        )
        _follow(con, name)
        return
    backend.preflight()
    new = Controller(sweep, backend, store, state).prepare()
    for old in live_controllers(
        backend.ec2, sweep
    ):  # its lease lapsed: that controller is gone, its instance serves nobody
        from orchestrator.aws.ec2 import terminate

        terminate(backend.ec2, [old["instance_id"]])
        con.print(f"terminated {old['instance_id']}, the sweep's earlier controller (its lease lapsed)", markup=False)
    con.print(
        f"{'launching' if new else 'continuing'} sweep [bold]{name}[/]: {len(sweep.runs)} runs, max_parallel "
        f"{sweep.spec.max_parallel}, store {sweep.store_url}; its controller on a "
        f"{sweep.spec.aws.controller.instance_type}"
    )
    ctl = launch_controller(backend.state, backend.bootstrap(), say=lambda text: con.print(text, markup=False))
    _wait_first_pass(store, name, ctl)
    con.print(
        f"the controller runs on instance {ctl.instance_id} ({ctl.instance_type}, {ctl.region}); this machine "
        "may sleep now.",
        markup=False,
    )
    _follow(con, name)


def _wait_first_pass(store, name: str, ctl) -> None:
    from orchestrator.aws import ec2 as api
    from orchestrator.control.lease import read_lease
    from orchestrator.store import layout
    from orchestrator.wait import Timeout, retry_until

    def taken() -> bool:
        lease, _ = read_lease(store, name)
        return lease is not None and lease.holder.instance_id == ctl.instance_id

    try:
        retry_until(taken, FIRST_PASS_S, 1.0, "the remote controller's first pass")
    except Timeout:
        log = (store.get_bytes(layout.controller_log_key(name)) or b"").decode(errors="replace")[-1500:]
        api.terminate(api.client("ec2", ctl.region), [ctl.instance_id])
        raise OrchError(
            f"the controller on {ctl.instance_id} did not take the sweep within {FIRST_PASS_S:.0f} s; its instance "
            f"is terminated. Its log:\n{log or '(none in the store)'}\n`orch down {name}` removes the rest."
        ) from None


def _follow(con, name: str) -> None:
    con.print(
        f"Follow: `orch status {name} --watch`, its log: `orch logs --controller {name}`. "
        f"Stop everything: `orch down {name}`.",
        markup=False,
    )


@click.command("_supervise", hidden=True)
@click.argument("settings_file", type=click.Path(exists=True, dir_okay=False))
@expected_errors
def supervise_cmd(settings_file: str):
    """On the controller's instance: run the sweep's controller, restarting it, until the sweep is done."""
    from orchestrator.aws import ec2 as api
    from orchestrator.backends.aws.remote import RemoteSettings
    from orchestrator.control.supervisor import Supervisor
    from orchestrator.store import open_store
    from orchestrator.sweep.load import load_sweep

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = RemoteSettings.read(Path(settings_file))
    sweep = load_sweep(settings.sweep_file)
    log_path = Path(settings_file).with_name("controller.log")

    def terminate(instance_id: str) -> None:
        api.terminate(api.client("ec2", settings.region), [instance_id])

    ending = Supervisor(settings, sweep.spec.name, open_store(sweep.store_url), log_path, terminate).run()
    click.echo(f"supervisor ended: {ending.reason}")
