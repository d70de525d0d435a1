"""orch ami: images built from a recipe (ami/recipe.yaml), found again by its hash.

A build launches a builder from the recipe's base image the way a sweep launches a host (spot
with on-demand fallback, the host key pinned through user data), uploads orch's code and the
recipe's `files`, runs its `steps` over SSH, then its `smoke` command, stops the builder, takes
the image (tagged `orch:recipe`, `orch:recipe-sha`, `orch:base`, snapshots too), terminates the
builder and removes what it made — on every way out, so a failed build leaves nothing running.
Builders are tagged `orch:sweep=ami-<recipe>`: `orch gc` and `orch down --all` see them.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Dict, List, Optional

from orchestrator.aws.ec2 import _code, explain
from orchestrator.errors import OrchError
from orchestrator.sweep.recipe import Recipe
from orchestrator.wait import Timeout, retry_until

log = logging.getLogger("orch.ami")

RECIPE_TAG, SHA_TAG, BASE_TAG = "orch:recipe", "orch:recipe-sha", "orch:base"


def builder_name(recipe: Recipe) -> str:
    return f"ami-{recipe.name}"


def images(ec2, recipe: Optional[str] = None, sha: Optional[str] = None) -> List[dict]:
    """orch's images in a region, newest first (owned by this account, tagged with a recipe)."""
    filters = [{"Name": "tag-key", "Values": [RECIPE_TAG]}]
    if recipe:
        filters.append({"Name": f"tag:{RECIPE_TAG}", "Values": [recipe]})
    if sha:
        filters.append({"Name": f"tag:{SHA_TAG}", "Values": [sha]})
    found = ec2.describe_images(Owners=["self"], Filters=filters)["Images"]
    return sorted(found, key=lambda i: i.get("CreationDate", ""), reverse=True)


def tags_of(image: dict) -> Dict[str, str]:
    return {t["Key"]: t["Value"] for t in image.get("Tags", [])}


IMAGE_WAIT_S = 3 * 3600.0  # EC2 gives no bound; large volumes and cross-region copies take an hour and more


def _wait_available(
    ec2, image_id: str, say: Callable[[str], None] = lambda _: None, timeout_s: float = IMAGE_WAIT_S
) -> None:
    """Until the image is `available`; a `failed` one is an error with EC2's reason. Says how long it has
    waited every minute. Giving up leaves the image (tagged) for `orch ami list` / `orch ami rm`."""
    start, told = time.time(), [time.time()]

    def state():
        found = ec2.describe_images(ImageIds=[image_id])["Images"]
        if found and found[0]["State"] == "failed":
            raise OrchError(
                f"image {image_id} failed: {found[0].get('StateReason', {}).get('Message', 'no reason given')}. "
                f"`orch ami rm {image_id}` removes it; build again."
            )
        if time.time() - told[0] >= 60:
            told[0] = time.time()
            say(
                f"  image {image_id} still {found[0]['State'] if found else 'not listed'} after "
                f"{(time.time() - start) / 60:.0f} min"
            )
        return found and found[0]["State"] == "available"

    try:
        retry_until(state, timeout_s, 5.0, f"image {image_id} to be available")
    except Timeout:
        raise OrchError(
            f"image {image_id} is still not available after {timeout_s / 60:.0f} min; it is kept (tagged): "
            f"`orch ami list` shows it, `orch ami rm {image_id}` removes it."
        ) from None


def remove(ec2, image_id: str) -> List[str]:
    """Deregister an image of orch's and delete its snapshots; refuses one that live instances run."""
    from botocore.exceptions import ClientError

    try:
        found = ec2.describe_images(ImageIds=[image_id])["Images"]
    except ClientError as exc:
        if _code(exc) in ("InvalidAMIID.NotFound", "InvalidAMIID.Unavailable"):
            found = []
        else:
            raise
    if not found:
        raise OrchError(
            f"{image_id} does not exist in this region (already removed?); `orch ami list` shows orch's images."
        )
    if RECIPE_TAG not in tags_of(found[0]):
        raise OrchError(f"{image_id} is not an image orch built (no {RECIPE_TAG} tag); `orch ami list` shows those.")
    users = [
        i["InstanceId"]
        for r in ec2.describe_instances(
            Filters=[
                {"Name": "image-id", "Values": [image_id]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ]
        )["Reservations"]
        for i in r["Instances"]
    ]
    if users:
        raise OrchError(f"{image_id} is in use by {', '.join(users)}; stop that sweep first (`orch down SWEEP`).")
    snapshots = [
        b["Ebs"]["SnapshotId"] for b in found[0].get("BlockDeviceMappings", []) if b.get("Ebs", {}).get("SnapshotId")
    ]
    ec2.deregister_image(ImageId=image_id)
    for snap in snapshots:
        ec2.delete_snapshot(SnapshotId=snap)
    return [image_id, *snapshots]


def resolve_recipe_image(ec2, image: str, region: str) -> str:
    """`recipe:NAME` -> the newest image built from recipe NAME in this region."""
    name = image[len("recipe:") :]
    found = [i for i in images(ec2, name) if i.get("State") == "available"]  # never a pending or failed one
    if not found:
        raise OrchError(
            f"no image built from recipe {name!r} in {region}. Build it: `orch ami build ami/{name}.yaml` "
            f"(or `orch ami build` for the default recipe), with `--region {region}` when it builds elsewhere."
        )
    return found[0]["ImageId"]


def resolve_image(ec2, image: str, owner: str, region: str) -> dict:
    """{ImageId, RootDeviceName, SnapshotGb} of an AMI id or of the newest image matching a name pattern."""
    from botocore.exceptions import ClientError

    try:
        if image.startswith("recipe:"):  # the newest image orch built from that recipe here
            from orchestrator.aws.images import resolve_recipe_image

            image = resolve_recipe_image(ec2, image, region)
        if image.startswith("ami-"):
            found = ec2.describe_images(ImageIds=[image])["Images"]
        else:
            found = ec2.describe_images(Owners=[owner], Filters=[{"Name": "name", "Values": [image]}])["Images"]
    except ClientError as exc:
        if _code(exc).startswith("InvalidAMIID"):
            found = []
        else:
            raise explain(exc, "looking up the AMI") from None
    if not found:
        raise OrchError(
            f"AMI {image!r} not found in {region} (owner {owner}). Check `aws.image` and `aws.region`; AMI ids differ "
            "per region."
        )
    newest = sorted(found, key=lambda i: i.get("CreationDate", ""))[-1]
    root = newest.get("RootDeviceName") or "/dev/sda1"
    sizes = [
        b["Ebs"].get("VolumeSize", 0)
        for b in newest.get("BlockDeviceMappings", [])
        if b.get("DeviceName") == root and "Ebs" in b
    ]
    return {
        "ImageId": newest["ImageId"],
        "RootDeviceName": root,
        "SnapshotGb": max(sizes or [0]),
        "Name": newest.get("Name", ""),
    }
