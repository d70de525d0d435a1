"""`orch ami`: build, list and remove images made from recipes (backends/aws/cloud/images.py and
backends/aws/image_build.py do the work)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import click

from orchestrator.backends.aws import image_build
from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.backends.aws.cloud import images
from orchestrator.backends.aws.recipe import load_recipe
from orchestrator.cli.common import expected_errors
from orchestrator.errors import OrchError
from orchestrator.sweep.spec import orch_home

log = logging.getLogger("orch.ami")


@click.group()
def ami():
    """Images built by orch from a recipe (default ami/recipe.yaml); sweeps use them with `image: recipe:NAME`."""


@ami.command("build")
@click.argument("recipe", default="ami/recipe.yaml", type=click.Path(path_type=Path))
@click.option("--region", "regions", multiple=True, help="Also copy the image to this region (repeatable).")
@click.option("--dry-run", is_flag=True, help="Validate the recipe and say what would be built; launch nothing.")
@click.option("--force", is_flag=True, help="Build even when an image of this exact recipe (same hash) exists.")
@expected_errors
def ami_build(recipe: Path, regions: tuple[str, ...], dry_run: bool, force: bool):
    """Build an image from RECIPE: launch a builder, run the recipe's steps and smoke command over SSH,
    take the image, tag it and remove the builder (also when a step fails).

    \b
    Example:
      orch ami build ami/recipe.yaml --region eu-west-1
    """

    spec, sha = load_recipe(recipe)
    say = lambda text: click.echo(text)  # noqa: E731
    if dry_run:
        ec2 = api.client("ec2", spec.aws.region)
        base = images.resolve_image(ec2, spec.aws.image, spec.aws.image_owner, spec.aws.region)
        have = images.images(ec2, spec.name, sha)
        say(
            f"recipe {spec.name} (sha {sha[:12]}) in {spec.aws.region}: base {base['ImageId']} ({base['Name']}), "
            f"builder {' or '.join(spec.aws.instance_types)} ({spec.aws.market})"
        )
        for i, step in enumerate(spec.steps, start=1):
            say(f"  step {i}: {step}")
        if spec.smoke:
            say(f"  smoke: {spec.smoke}")
        say(
            f"already built: {have[0]['ImageId']} (a build reuses it unless --force)"
            if have
            else "not built yet in this region"
        )
        say("dry run: nothing launched.")
        return
    _remember_region(spec.aws.region)

    signalled: list = []

    def hand_off(signum, _frame):
        signalled.append(signum)
        raise KeyboardInterrupt  # SIGTERM or a closed terminal cleans up exactly as Ctrl-C does

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, hand_off)
    interrupted = OrchError(
        f"interrupted: the builder was terminated and what the build made removed (`orch gc` checks; "
        f"`orch down ami-{spec.name}` removes anything left).",
        exit_code=130,
    )
    try:
        built = image_build.build(spec, sha, recipe.parent, list(regions), force, say)
    except KeyboardInterrupt:
        raise interrupted from None
    except OrchError:
        # The signal's KeyboardInterrupt can land inside paramiko, which then fails in its own way (seen: an
        # AttributeError from a channel half torn down, reported as "building failed"); the build's cleanup ran
        # either way, and what the user did was interrupt it.
        if signalled:
            log.debug("after signal %s the build ended with: %s", signalled[0], sys.exc_info()[1])
            raise interrupted from None
        raise
    for region, image_id in built.items():
        say(f"{region}: {image_id}  (use `image: recipe:{spec.name}` in a sweep's aws section)")


@ami.command("list")
@click.option(
    "--region", "regions", multiple=True, help="Regions to look in (default: the default recipe's, else us-east-1)."
)
@click.option("--wide", is_flag=True, help="One line per image however narrow the terminal.")
@expected_errors
def ami_list(regions: tuple[str, ...], wide: bool):
    """List the images orch built: id, region, recipe, state, size, created; then name, hash and base
    (on a line of their own in a narrow terminal).

    \b
    Example:
      orch ami list --region us-east-1
    """

    width = shutil.get_terminal_size((100, 24)).columns
    rows = 0
    for region in regions or (_default_region(),):
        for im in images.images(api.client("ec2", region)):
            t = images.tags_of(im)
            size = sum(b.get("Ebs", {}).get("VolumeSize", 0) for b in im.get("BlockDeviceMappings", []))
            head = (
                f"{im['ImageId']}  {region}  recipe {t.get(images.RECIPE_TAG)}  {im.get('State', '')}  {size} GB  "
                f"{im.get('CreationDate', '')[:16]}"
            )
            more = f"    name {im.get('Name', '')}  sha {t.get(images.SHA_TAG, '')[:12]}  base {t.get(images.BASE_TAG)}"
            if wide or len(head) + len(more) <= width:
                click.echo(head + more)
            else:  # a narrow terminal: the details on a line of their own, nothing cut
                click.echo(head)
                click.echo(more)
            rows += 1
    if not rows:
        click.echo("no images built by orch in " + ", ".join(regions or (_default_region(),)))


@ami.command("rm")
@click.argument("image")
@click.option("--region", default=None, help="The image's region (default: the default recipe's, else us-east-1).")
@expected_errors
def ami_rm(image: str, region: str | None):
    """Deregister IMAGE and delete its snapshots (refused while instances run it).

    \b
    Example:
      orch ami rm ami-0123456789abcdef0
    """

    if not re.match(r"^ami-[0-9a-f]{8,17}$", image):
        raise OrchError(
            f"{image!r} is not an image id (ami- and 8 or 17 hex digits); `orch ami list` shows orch's images.",
            exit_code=2,
        )
    gone = images.remove(api.client("ec2", region or _default_region()), image)
    click.echo("removed " + ", ".join(gone) if gone else f"{image} is already removed (deregistered); nothing to do")


def _remember_region(region: str) -> None:
    """`orch gc` and `orch down --all` scan the regions of sweeps launched from here, and these."""

    path = orch_home() / "ami-regions"
    known = set(path.read_text().split()) if path.exists() else set()
    if region not in known:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(sorted(known | {region})) + "\n")


def _default_region() -> str:

    try:
        return load_recipe(Path("ami/recipe.yaml"))[0].aws.region
    except Exception:
        return os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
