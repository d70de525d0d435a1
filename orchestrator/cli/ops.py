"""CLI commands that stop or break things on purpose: down, gc, chaos."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from pathlib import Path

import click

from orchestrator.aws import ec2 as api
from orchestrator.aws.ec2 import client
from orchestrator.aws.policy import DEFAULT_IMAGE_OWNERS, boundary_policy, controller_policy
from orchestrator.aws.teardown import orch_resources, teardown
from orchestrator.backends.aws.regions import settings as aws_settings
from orchestrator.cli.common import expected_errors, explained, load_sweep_arg, resolve_run, sweep_parts
from orchestrator.contract import bucket_problem
from orchestrator.control.actions import chaos_interrupt, stop_sweep
from orchestrator.control.lease import RENEW_S, request_stop, wait_released
from orchestrator.control.state import State, SweepLock
from orchestrator.errors import OrchError
from orchestrator.host.staging import push
from orchestrator.sweep.spec import orch_home
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
    if (
        sweep and sweep not in known and sweep.startswith("ami-")
    ):  # an image build's leftovers (builder, its group, template)
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


def _down_unknown(names: set) -> list[str]:
    """`orch down --all`: what orch tagged in the regions of the sweeps launched from here, of sweeps not known
    here. Returns the regions that could not be searched (each said why)."""

    problems: list[str] = []
    for region, by_sweep in _scan_regions(problems).items():
        for name in sorted(set(by_sweep) - names):
            removed = teardown(client("ec2", region), client("iam", region), name)
            click.echo(f"{region}: removed {len(removed)} resource(s) of unknown sweep {name}: {', '.join(removed)}")
    for line in problems:
        click.echo(line, err=True)
    return [line.split(":")[0] for line in problems]


def _down_leftovers(name: str) -> None:
    """`orch down ami-RECIPE`: what an interrupted `orch ami build` left, in every region orch knows of."""

    found = False
    for region, by_sweep in _scan_regions().items():
        if name in by_sweep:
            found = True
            removed = teardown(client("ec2", region), client("iam", region), name)
            click.echo(f"{region}: removed {len(removed)} resource(s) of {name}: {', '.join(removed)}")
    if not found:
        click.echo(f"nothing of {name} exists in the regions orch knows of (`orch gc` lists what does).")


def _down_one(arg: str, known: set) -> None:
    """Stop one sweep, printing as it goes. Its controller first, by name, when the sweep is known here: the
    lock is on this machine, so that much works even when the sweep's store or cloud cannot be reached."""

    if arg in known:
        _stop_controller(arg)
    sw = load_sweep_arg(arg)
    if arg not in known:
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


def _scan_regions(problems: list[str] | None = None):
    """{region: {sweep: [resource, ...]}} over the regions of every aws sweep launched from here. A region that
    cannot be searched raises, or with `problems` given adds a line saying why to it and is left out."""

    regions = set()
    for rec in State().sweeps():
        if rec.backend == "aws":
            try:
                regions.update(aws_settings(load_sweep_arg(rec.name)).regions)
            except Exception as exc:
                if explained(exc) is None:
                    raise
                continue

    built = orch_home() / "ami-regions"  # where `orch ami build` ran: its builders are found there too
    regions |= set(built.read_text().split()) if built.exists() else set()
    out = {}
    for region in sorted(regions):
        try:
            out[region] = orch_resources(api.client("ec2", region), api.client("iam", region))
        except Exception as exc:  # botocore errors: say which region
            if problems is None:
                raise api.explain(exc, f"scanning {region}") from None
            problems.append(f"{region}: not searched for orch's resources: {api.explain(exc, f'scanning {region}')}")
    return out


@click.command()
@expected_errors
def gc():
    """List what orch made and what still exists (instances, security groups, launch
    templates, instance profiles), by sweep, in the regions of the sweeps launched from
    here, each with the command that removes it (`orch down SWEEP`; an image build's leftovers:
    `orch down ami-RECIPE`; images themselves: `orch ami list` / `orch ami rm`). Removes nothing.

    \b
    Example:
      orch gc
    """

    known = {rec.name for rec in State().sweeps()}
    found = False
    for region, by_sweep in _scan_regions().items():
        for name, items in sorted(by_sweep.items()):
            found = True
            tag = "" if name in known else " (not launched from here)"
            click.echo(f"{region} {name}{tag}: {len(items)} resource(s); remove with `orch down {name}`")
            for item in items:
                click.echo(f"  {item}")
    if not found:
        click.echo("nothing of orch's exists in the regions of your sweeps.")


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


@click.group("aws")
def aws_group():
    """AWS setup: what the credentials that run orch need."""


def _bucket_names(*names: str | None) -> None:

    for name in names:
        problem = bucket_problem(name) if name is not None else None
        if problem:
            raise OrchError(
                f"{name!r} is not a bucket name: {problem}. Give the name alone, without s3:// or a prefix",
                exit_code=2,
            )


_BUCKET_HELP = "The store's bucket (from `store: s3://BUCKET/prefix`); default: YOUR-BUCKET, to fill in."
_DATA_HELP = "A bucket that `data:` entries read from or `orch data push` writes to (repeatable)."


_REGION_HELP = "A region orch may use EC2 in (repeatable); default: every region."
_OWNER_HELP = (
    "An owner of the images sweeps launch from, as EC2's ec2:Owner names it: `amazon` (the default), an account id, "
    "`aws-marketplace` (repeatable). The account's own images are always allowed."
)
_VPC_HELP = "A VPC whose subnets launches may use (repeatable); default: any VPC."
MANAGED_POLICY_MAX = 6144  # IAM and STS quotas: a managed policy's characters, white space not counted


def _scope_options(command):
    for option in (
        click.option("--vpc", "vpcs", multiple=True, help=_VPC_HELP),
        click.option("--image-owner", "owners", multiple=True, help=_OWNER_HELP),
        click.option("--region", "regions", multiple=True, help=_REGION_HELP),
    ):
        command = option(command)
    return command


def _printed(doc: dict, what: str) -> str:
    """The document as `aws iam create-policy` takes it; one IAM would refuse for its size is an error naming why."""
    size = len(re.sub(r"\s", "", json.dumps(doc)))
    if size > MANAGED_POLICY_MAX:
        raise OrchError(
            f"the {what} would be {size:,} characters, over the {MANAGED_POLICY_MAX:,} IAM allows a managed policy: "
            "name fewer --data-bucket, --region, --image-owner or --vpc (a region left out keeps orch out of it)",
            exit_code=2,
        )
    return json.dumps(doc, indent=2)


@aws_group.command("policy")
@click.option("--bucket", help=_BUCKET_HELP)
@click.option("--data-bucket", "data_buckets", multiple=True, help=_DATA_HELP)
@_scope_options
@expected_errors
def aws_policy(bucket: str | None, data_buckets: tuple, regions: tuple, owners: tuple, vpcs: tuple):
    """Print the IAM policy the credentials that run orch need, as JSON, for `aws iam create-policy`.

    It covers sweeps (EC2 Fleet, launch templates, security and placement groups, the instance profile
    orch creates), `orch launch --remote`, `orch ami`, the store and data buckets. Roles can be made only
    with orch's permissions boundary (`orch aws boundary`, created once by an admin), which no one holding
    this policy can change or remove; EC2 resources are changed or removed only when they carry orch's tags, and
    launches are scoped per resource type (tagged at creation, orch's security groups and templates, images of the
    account or of --image-owner, no untagged snapshot of the account, --vpc's subnets, --region's regions).
    It is longer than the 2,048 characters IAM allows a user's inline policies: create it as a managed
    policy and attach it. docs/aws.md explains each statement.

    \b
    Example:
      orch aws policy --bucket my-bucket --data-bucket my-datasets > orch-policy.json
      aws iam create-policy --policy-name orch --policy-document file://orch-policy.json
      aws iam attach-user-policy --user-name me --policy-arn arn:aws:iam::ACCOUNT-ID:policy/orch
    """

    _bucket_names(bucket, *data_buckets)
    doc = controller_policy(bucket, data_buckets, regions, owners or DEFAULT_IMAGE_OWNERS, vpcs)
    click.echo(_printed(doc, "policy"))


@aws_group.command("boundary")
@click.option("--bucket", help=_BUCKET_HELP)
@click.option("--data-bucket", "data_buckets", multiple=True, help=_DATA_HELP)
@_scope_options
@expected_errors
def aws_boundary(bucket: str | None, data_buckets: tuple, regions: tuple, owners: tuple, vpcs: tuple):
    """Print the permissions boundary every role orch creates carries, for an admin to create once.

    It caps any role orch makes, whatever the role's own policy says, at what a sweep's instances need: a
    host's (the store, reading data buckets, KMS through S3, terminating or untagging instances tagged
    orch:sweep) and a remote controller's (`orch launch --remote`: EC2 reads, launches of its sweep's hosts,
    changes only to what carries orch:sweep, passing orch-* roles to EC2; no IAM write). It holds only for
    credentials EC2 delivers to an instance (ec2:SourceInstanceARN): a role assumed any other way gets
    nothing. Give it the same buckets and options as `orch aws policy`; create it as the managed policy `orch-boundary`
    (an existing one: `aws iam create-policy-version --set-as-default`, see docs/aws.md).

    \b
    Example:
      orch aws boundary --bucket my-bucket --data-bucket my-datasets > orch-boundary.json
      aws iam create-policy --policy-name orch-boundary --policy-document file://orch-boundary.json
    """

    _bucket_names(bucket, *data_buckets)
    doc = boundary_policy(bucket, data_buckets, (), regions, owners or DEFAULT_IMAGE_OWNERS, vpcs)
    click.echo(_printed(doc, "boundary"))
