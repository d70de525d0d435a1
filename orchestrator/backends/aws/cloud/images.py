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
from collections.abc import Callable
from typing import Any

from orchestrator.backends.aws.cloud.ec2 import NOT_FOUND_S, error_code, explain
from orchestrator.backends.aws.cloud.fleet import CapacityUnavailable
from orchestrator.errors import OrchError
from orchestrator.wait import Timeout, retry_until

log = logging.getLogger("orch.ami")

RECIPE_TAG, SHA_TAG, BASE_TAG = "orch:recipe", "orch:recipe-sha", "orch:base"


def builder_name(recipe: Any) -> str:  # a backends.aws.recipe.Recipe (a layer above)
    return f"ami-{recipe.name}"


def images(ec2, recipe: str | None = None, sha: str | None = None) -> list[dict]:
    """orch's images in a region, newest first (owned by this account, tagged with a recipe)."""
    filters = [{"Name": "tag-key", "Values": [RECIPE_TAG]}]
    if recipe:
        filters.append({"Name": f"tag:{RECIPE_TAG}", "Values": [recipe]})
    if sha:
        filters.append({"Name": f"tag:{SHA_TAG}", "Values": [sha]})
    found = ec2.describe_images(Owners=["self"], Filters=filters)["Images"]
    found = [i for i in found if i.get("State") != "deregistered"]  # listed for a short while after removal
    return sorted(found, key=lambda i: i.get("CreationDate", ""), reverse=True)


def tags_of(image: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in image.get("Tags", [])}


IMAGE_WAIT_S = 3 * 3600.0  # EC2 gives no bound; large volumes and cross-region copies take an hour and more
# Every ImageState of the EC2 service model: still on its way, done, or ended badly (no wait can help).
WAITING_STATES = frozenset({"pending", "transient"})
BAD_STATES = frozenset({"invalid", "deregistered", "failed", "error", "disabled"})
GONE_CODES = ("InvalidAMIID.NotFound", "InvalidAMIID.Unavailable")


def wait_available(
    ec2, image_id: str, say: Callable[[str], None] = lambda _: None, timeout_s: float = IMAGE_WAIT_S
) -> None:
    """Until the image is `available`; a bad terminal state is an error at once with EC2's reason. A new id that
    EC2 does not know yet (eventual consistency) is "not yet" for NOT_FOUND_S. Says how long it has waited every
    minute. Giving up leaves the image (tagged at creation) for `orch ami list` / `orch ami rm`."""
    start, told = time.time(), [time.time()]

    def state() -> bool:
        found = _describe(ec2, image_id)
        if not found and time.time() - start > NOT_FOUND_S:
            raise OrchError(
                f"image {image_id} is not listed by EC2 {NOT_FOUND_S:.0f} s after it was made; build again."
            )
        current = found["State"] if found else "not listed yet"
        if current in BAD_STATES:
            reason = (found or {}).get("StateReason") or {}
            raise OrchError(
                f"image {image_id} is {current}: {reason.get('Code', '')} {reason.get('Message', 'no reason given')}"
                f". `orch ami rm {image_id}` removes it; build again."
            )
        if time.time() - told[0] >= 60:
            told[0] = time.time()
            say(f"  image {image_id} still {current} after {(time.time() - start) / 60:.0f} min")
        return current == "available"

    try:
        retry_until(state, timeout_s, 5.0, f"image {image_id} to be available")
    except Timeout:
        raise OrchError(
            f"image {image_id} is still not available after {timeout_s / 60:.0f} min; it is kept (tagged): "
            f"`orch ami list` shows it, `orch ami rm {image_id}` removes it."
        ) from None


def _describe(ec2, image_id: str) -> dict | None:
    """The image, or None where EC2 does not (or no longer) know the id."""
    from botocore.exceptions import ClientError

    try:
        found = ec2.describe_images(ImageIds=[image_id])["Images"]
    except ClientError as exc:
        if error_code(exc) in GONE_CODES:
            return None
        raise
    return found[0] if found else None


def remove(ec2, image_id: str) -> list[str]:
    """Deregister an image of orch's and delete its snapshots; refuses one that live instances run. An image
    deregistered a moment ago (DescribeImages lists those "for a short interval") is already gone: []."""
    found = _describe(ec2, image_id)
    if found is None:
        raise OrchError(
            f"{image_id} does not exist in this region (already removed?); `orch ami list` shows orch's images."
        )
    if found.get("State") == "deregistered":
        return []
    if RECIPE_TAG not in tags_of(found):
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
        b["Ebs"]["SnapshotId"] for b in found.get("BlockDeviceMappings", []) if b.get("Ebs", {}).get("SnapshotId")
    ]
    return [image_id, *snapshots] if _deregister(ec2, image_id, snapshots) else []


def _deregister(ec2, image_id: str, snapshots: list[str]) -> bool:
    """DeregisterImage, with its snapshots in the same call where the service model has DeleteAssociatedSnapshots
    (else one DeleteSnapshot each); False when someone removed it first."""
    from botocore.exceptions import ClientError

    together = (
        "DeleteAssociatedSnapshots" in ec2.meta.service_model.operation_model("DeregisterImage").input_shape.members
    )
    try:
        ec2.deregister_image(ImageId=image_id, **({"DeleteAssociatedSnapshots": True} if together else {}))
    except ClientError as exc:
        if error_code(exc) in GONE_CODES:
            return False
        raise
    for snap in [] if together else snapshots:
        ec2.delete_snapshot(SnapshotId=snap)
    return True


def copy_into(ec2, source: dict, source_region: str) -> str:
    """CopyImage of `source` (an image orch built, as DescribeImages lists it) into the region of `ec2`, tagged as the
    original (its orch:* tags, on the image and its snapshots at creation): `orch ami list` / `rm`, `orch gc` and the
    next launch find the copy. Answers at once; the copy is `pending` for minutes (wait_available)."""
    tags = [{"Key": k, "Value": v} for k, v in sorted(tags_of(source).items()) if k.startswith("orch:")]
    return ec2.copy_image(
        SourceImageId=source["ImageId"],
        SourceRegion=source_region,
        Name=source.get("Name") or f"orch-{tags_of(source).get(RECIPE_TAG, 'image')}",
        Description=f"orch: a copy of {source['ImageId']} from {source_region}",
        TagSpecifications=[{"ResourceType": "image", "Tags": tags}, {"ResourceType": "snapshot", "Tags": tags}],
    )["ImageId"]


class ImageNotReady(CapacityUnavailable):
    """The sweep's image is not usable in a region yet (its copy is on its way, or ended badly): the region is passed
    over as one without capacity, and asked again at the next pass."""


def recipe_image_here(ec2, name: str, sha: str, region: str) -> None:
    """Raise ImageNotReady when this region's image of recipe `name` at `sha` (a copy) is still pending or ended
    badly and no image of that sha is available here; return when one is, or when none of that sha exists."""
    mine = images(ec2, name, sha)
    if not mine or any(i.get("State") == "available" for i in mine):
        return
    image = mine[0]
    if image.get("State") in WAITING_STATES:
        raise ImageNotReady(
            f"{region}: image {image['ImageId']} (recipe {name}) is still being copied there; the region is asked "
            "again at the next pass"
        )
    raise ImageNotReady(
        f"{region}: the copy {image['ImageId']} of recipe {name} is {image.get('State')} "
        f"({(image.get('StateReason') or {}).get('Message', 'no reason given')}); `orch ami rm {image['ImageId']} "
        f"--region {region}` removes it, and the next `orch launch` copies the image there again"
    )


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
            from orchestrator.backends.aws.cloud.images import resolve_recipe_image

            image = resolve_recipe_image(ec2, image, region)
        if image.startswith("ami-"):
            found = ec2.describe_images(ImageIds=[image])["Images"]
        else:
            found = ec2.describe_images(Owners=[owner], Filters=[{"Name": "name", "Values": [image]}])["Images"]
    except ClientError as exc:
        if error_code(exc).startswith("InvalidAMIID"):
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
        # ec2:Owner in a policy: Amazon's own images by their alias, the others by account id
        "Owners": [o for o in (newest.get("ImageOwnerAlias"), newest.get("OwnerId")) if o],
    }
