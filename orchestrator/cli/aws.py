"""The aws backend's own commands: `orch aws policy` and `orch aws boundary`, the IAM documents the credentials that
run orch and the roles orch makes need (docs/aws.md). A backend's commands live in a module of its own like this one
(the aws backend's others: cli/ami.py, cli/remote.py), each named by one line in cli/main.py's COMMANDS."""

from __future__ import annotations

import json
import re

import click

from orchestrator.backends.aws.cloud.policy import DEFAULT_IMAGE_OWNERS, boundary_policy, controller_policy
from orchestrator.backends.aws.cloud.worth import rates
from orchestrator.backends.aws.settings import REGION_RE
from orchestrator.cli.common import expected_errors
from orchestrator.cli.work_words import per_h
from orchestrator.contract import bucket_problem
from orchestrator.errors import OrchError


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


def _region_names(regions: tuple) -> tuple:
    """--region's values, each once, in the order given; a name that is no region's is refused (the documents Deny
    EC2 outside the regions named, so a misspelt one, `US-EAST-1` or `us-east-1,us-west-2`, would shut orch out of
    every region)."""

    for name in regions:
        if not re.fullmatch(REGION_RE, name):
            hint = name.strip().lower()
            fix = (
                f"write --region {hint}"
                if re.fullmatch(REGION_RE, hint)
                else "give one region per --region, as AWS names it (e.g. --region us-east-1 --region us-west-2)"
            )
            raise OrchError(f"--region {name!r} is not an AWS region's name: {fix}", exit_code=2)
    return tuple(dict.fromkeys(regions))


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
    doc = controller_policy(bucket, data_buckets, _region_names(regions), owners or DEFAULT_IMAGE_OWNERS, vpcs)
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
    doc = boundary_policy(bucket, data_buckets, (), _region_names(regions), owners or DEFAULT_IMAGE_OWNERS, vpcs)
    click.echo(_printed(doc, "boundary"))


@aws_group.command("rates")
@click.argument("sweep_file")
@click.option(
    "--forget",
    is_flag=True,
    help="Take this command's sweeps off the store's index: later sweeps start "
    "unmeasured (each sweep's own rates.json stays, and with it what `orch collect` reports).",
)
@expected_errors
def aws_rates(sweep_file: str, forget: bool):
    """The work rates a launch of SWEEP_FILE starts from (`aws.choose: work`): per instance type, what earlier
    sweeps of the same command in its store measured, and the sweep's own.

    "The same command" is the same `command:` text and work key (`aws.work_key`, else `prune.at`, else epoch).
    Reclaims count across every earlier sweep of the store, whatever its command. docs/guides/costs.md.

    \b
    Example:
      orch aws rates sweep.yaml            # what a launch would start from
      orch aws rates sweep.yaml --forget   # start over: later sweeps of this command measure again
    """
    from orchestrator.backends.aws import earlier
    from orchestrator.backends.aws.state import work_key
    from orchestrator.cli.common import load_sweep_arg
    from orchestrator.store import open_store

    sweep = load_sweep_arg(sweep_file)
    if sweep.spec.backend != "aws":
        raise OrchError(f"{sweep_file}: backend {sweep.spec.backend}: only aws sweeps measure work rates", exit_code=2)
    store, key = open_store(sweep.store_url), earlier.command_key(sweep.spec.command, work_key(sweep))
    if forget:
        names = earlier.forget(store, key)
        click.echo(
            f"forgot {len(names)} sweep(s) of this command ({', '.join(names) or 'none in the index'}): later sweeps "
            "of it start unmeasured; each sweep keeps its own rates.json (a relaunch of one keeps its measurements)"
        )
        return
    found = earlier.gather(store, sweep.spec.name, key)
    own = get_own_attempts(store, sweep.spec.name)
    for line in rates_words(work_key(sweep), found.sweeps, own, found.attempts):
        click.echo(line)


def get_own_attempts(store, sweep: str) -> dict:
    """The sweep's own measured attempts (its rates.json; nothing when it has none or it is not orch's)."""
    from orchestrator.store import layout
    from orchestrator.store.base import get_json

    try:
        found = get_json(store, layout.rates_key(sweep))
    except Exception:  # unreadable: the controller measures again (backends/aws/work.py)
        return {}
    attempts = found.get("attempts") if isinstance(found, dict) else None
    return attempts if isinstance(attempts, dict) else {}


def rates_words(key: str, sweeps: tuple[str, ...], own: dict, before: dict) -> list[str]:
    """`orch aws rates`: per type, the rate a launch starts from, and what it rests on."""
    where = f"earlier sweeps of this command: {', '.join(sweeps)}" if sweeps else "no earlier sweep of this command"
    measured = rates(own, before)
    out = [f"work rates ({key} per hour), from this sweep's own attempts and {where}:"]
    for t, r in sorted(measured.items()):
        out.append(f"  {t}: {per_h(r.per_s * 3600)}/h over {r.attempts} attempt(s), {r.earlier} in earlier sweeps")
    if not measured:
        out.append("  none measured: each type's first attempts measure it")
    return out
