"""orch ami build: a builder instance launched like a run's host, provisioned over SSH from a recipe, imaged.

A build launches a builder from the recipe's base image the way a sweep launches a host (spot
with on-demand fallback, the host key pinned through user data), uploads orch's code and the
recipe's `files`, runs its `steps` over SSH, then its `smoke` command, takes the image (tagged
`orch:recipe`, `orch:recipe-sha`, `orch:base`, snapshots too), terminates the builder and removes
what it made — on every way out, so a failed build leaves nothing running. Builders are tagged
`orch:sweep=ami-<recipe>`: `orch gc` and `orch down --all` see them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.backends import bundle as code_bundle
from orchestrator.backends.aws import boot
from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.backends.aws.cloud import fleet, groups
from orchestrator.backends.aws.cloud.images import (
    BASE_TAG,
    RECIPE_TAG,
    SHA_TAG,
    builder_name,
    images,
    resolve_image,
    wait_available,
)
from orchestrator.backends.aws.recipe import Recipe
from orchestrator.errors import OrchError

log = logging.getLogger("orch.ami")


STEP_TIMEOUT_S = 3600.0


def build(
    recipe: Recipe, sha: str, recipe_dir: Path, regions: list[str], force: bool, say: Callable[[str], None]
) -> dict[str, str]:
    """Build (or find) the image; returns {region: image id}."""
    cfg = recipe.aws
    ec2 = api.client("ec2", cfg.region)
    have = [i for i in images(ec2, recipe.name, sha) if i.get("State") == "available"]
    if have and not force:
        say(
            f"recipe {recipe.name} (sha {sha[:12]}) is already built in {cfg.region}: {have[0]['ImageId']} (--force "
            "builds it again)"
        )
        image_id = have[0]["ImageId"]
    else:
        image_id = _build_once(ec2, recipe, sha, recipe_dir, say)
    out = {cfg.region: image_id}
    for region in regions:
        if region != cfg.region:
            out[region] = _copy(image_id, cfg.region, region, recipe, sha, say)
    return out


def _build_once(ec2, recipe: Recipe, sha: str, recipe_dir: Path, say: Callable[[str], None]) -> str:
    """A builder instance, provisioned over SSH, snapshotted; the builder and its set-up removed whatever happens."""
    from orchestrator.backends.aws.cloud.teardown import teardown
    from orchestrator.remote.ssh import Target

    cfg = recipe.aws
    name = builder_name(recipe)
    launched: list[str] = []  # the builder, as soon as it exists: terminated on every way out
    try:
        base, got, host_public = _launch_builder(ec2, recipe, name, launched)
        say(
            f"builder {got.instance_id} ({got.instance_type} in {got.az}, {got.market}) from {base['ImageId']} "
            f"({base['Name']})"
        )
        address = boot.running_address(ec2, got.instance_id, cfg.ssh.address, cfg.boot_timeout_s)
        target = Target(address, cfg.ssh.port, cfg.ssh.user, cfg.ssh.identity, host_public)
        conn = boot.ssh_to(ec2, got.instance_id, target, cfg.boot_timeout_s)
        try:
            _provision(conn, recipe, recipe_dir, say)
            _forget_keys(conn, _builder_keys(recipe), say)
            conn.check("sync")
        finally:
            conn.close()
        return _snapshot(ec2, recipe, sha, base, got.instance_id, say)
    except OrchError:
        raise
    except Exception as exc:
        raise OrchError(f"building {recipe.name} failed: {type(exc).__name__}: {exc}") from None
    finally:
        if launched:
            api.terminate(ec2, launched)
        teardown(ec2, api.client("iam", cfg.region), name)


def _launch_builder(ec2, recipe: Recipe, name: str, launched: list[str]):
    """(base image, the acquired builder, its pinned host key); the builder's id goes into `launched` at once."""
    from orchestrator.backends.aws.cloud.userdata import cloud_config
    from orchestrator.remote.ssh import new_host_key

    cfg = recipe.aws
    subnets = api.resolve_subnets(ec2, cfg.subnet_ids, cfg.region)
    base = resolve_image(ec2, cfg.image, cfg.image_owner, cfg.region)
    sg = cfg.security_group or groups.ensure_security_group(
        ec2, name, subnets[0]["VpcId"], cfg.ssh_cidr or api.caller_cidr()
    )
    public_ip = cfg.ssh.address == "public_ip" and not all(s["MapPublicIpOnLaunch"] for s in subnets)
    data = api.launch_template_data(base, sg, cfg.volume_gb, None, public_ip)
    template = api.ensure_launch_template(ec2, name, data)
    host_private, host_public = new_host_key()
    user_data = cloud_config(host_private, host_public, _builder_keys(recipe), cfg.max_minutes)
    tags = api.sweep_tags(name, run="builder", attempt="1", hostkey=host_public) + [
        {"Key": "Name", "Value": f"orch builder {recipe.name}"}
    ]
    got = fleet.acquire(
        ec2,
        template,
        data,
        user_data,
        fleet.offered_choices(ec2, cfg.instance_types, subnets, cfg.region),
        fleet.markets(cfg.market),
        tags,
        fleet.Blocklist(),
    )
    launched.append(got.instance_id)
    return base, got, host_public


def _builder_keys(recipe: Recipe) -> list[str]:
    """The public keys the builder's user data authorizes (cloud-init writes them to ~/.ssh/authorized_keys)."""
    from orchestrator.remote.ssh import public_key_of

    return [public_key_of(recipe.aws.ssh.identity)]


FORGET_KEYS = """f="$HOME/.ssh/authorized_keys"
[ -f "$f" ] || exit 0
grep -vF {patterns} "$f" > "$f.orch-new"; [ $? -le 1 ] || exit 2
cat "$f.orch-new" > "$f" && rm -f "$f.orch-new" || exit 2
grep -qF {patterns} "$f"; [ $? -eq 1 ] || {{ echo "$f still holds orch's key" >&2; exit 1; }}
"""


def _forget_keys(conn, keys: list[str], say: Callable[[str], None]) -> None:
    """Remove from the builder's ~/.ssh/authorized_keys the keys orch's user data put there, before CreateImage: an
    image (and every instance launched from it, by anyone) must not let the holder of the laptop's key in. Lines the
    base image or the recipe's steps put there stay. The session already open is not affected."""
    import shlex

    patterns = " ".join(f"-e {shlex.quote(k.split()[1])}" for k in keys if len(k.split()) > 1)
    r = conn.run(FORGET_KEYS.format(patterns=patterns))
    if r.code != 0:
        raise OrchError(
            f"could not remove orch's SSH key from the builder's ~/.ssh/authorized_keys (exit {r.code}): "
            f"{(r.err or r.out).strip()[-300:]}. No image was made: it would let that key in."
        )
    say("removed orch's SSH key from the builder's ~/.ssh/authorized_keys: the image keeps no way in for it")


def _snapshot(ec2, recipe: Recipe, sha: str, base: dict, instance_id: str, say: Callable[[str], None]) -> str:
    # No StopInstances: a builder launched by a fleet as spot is a one-time Spot request, which EC2
    # refuses to stop (UnsupportedOperation; EC2 user guide, Spot Instance request limitations).
    # CreateImage on the running builder lets EC2 reboot it (NoReboot=False, the default) so the
    # file system is consistent, whatever the builder's market.
    image_tags = [
        {"Key": RECIPE_TAG, "Value": recipe.name},
        {"Key": SHA_TAG, "Value": sha},
        {"Key": BASE_TAG, "Value": base["ImageId"]},
    ]
    # tagged at creation, image and snapshots ("The tags to apply to the AMI and snapshots on creation"):
    # never an untagged image that `orch ami list` and `orch gc` cannot see, whatever happens next
    image_id = ec2.create_image(
        InstanceId=instance_id,
        Name=f"orch-{recipe.name}-{sha[:12]}-{time.strftime('%Y%m%d-%H%M%S')}",
        Description=f"orch recipe {recipe.name} ({sha[:12]}) from {base['ImageId']}",
        TagSpecifications=_on_creation(image_tags),
    )["ImageId"]
    say(f"image {image_id} is pending: EC2 reboots the builder and snapshots its volume (minutes; more when large)")
    wait_available(ec2, image_id, say)
    say(f"image {image_id} in {recipe.aws.region}")
    return image_id


def _provision(conn, recipe: Recipe, recipe_dir: Path, say: Callable[[str], None]) -> None:
    b = code_bundle.build()  # orch's code (the trainer included), as runs get it; steps and smoke see it on PYTHONPATH
    conn.check(code_bundle.install_command(b), stdin=b.data)
    for local, remote in recipe.files.items():
        data = (recipe_dir / local).expanduser().read_bytes()
        conn.put_bytes(data, remote, mode=0o755 if local.endswith(".sh") else 0o644)
    env = f'export PYTHONPATH="{b.remote_dir.replace("~/", "$HOME/")}${{PYTHONPATH:+:$PYTHONPATH}}"; cd "$HOME"; '
    steps: list[str] = [*recipe.steps, *([recipe.smoke] if recipe.smoke else [])]
    for i, step in enumerate(steps, start=1):
        what = "smoke" if recipe.smoke and i == len(recipe.steps) + 1 else f"step {i}/{len(recipe.steps)}"
        say(f"{what}: {step}")
        t0 = time.time()
        r = conn.stream(env + step, lambda line: say(f"    {line}"), timeout=STEP_TIMEOUT_S)  # live, line by line
        if r.code != 0:
            tail = "\n".join(r.out.strip().splitlines()[-20:])
            raise OrchError(
                f"{what} failed (exit {r.code}) on the builder: {step}\n{tail}\nNothing is left running: the builder "
                "was terminated."
            )
        say(f"  ok in {time.time() - t0:.0f} s")


def _copy(image_id: str, source: str, region: str, recipe: Recipe, sha: str, say: Callable[[str], None]) -> str:
    ec2 = api.client("ec2", region)
    have = [i for i in images(ec2, recipe.name, sha) if i.get("State") == "available"]
    if have:
        say(f"{region}: already there: {have[0]['ImageId']}")
        return have[0]["ImageId"]
    say(f"{region}: copying {image_id} (minutes to an hour, by volume size)")
    tags = [
        {"Key": RECIPE_TAG, "Value": recipe.name},
        {"Key": SHA_TAG, "Value": sha},
        {"Key": BASE_TAG, "Value": image_id},
    ]
    copied = ec2.copy_image(
        SourceImageId=image_id,
        SourceRegion=source,
        Name=f"orch-{recipe.name}-{sha[:12]}",
        TagSpecifications=_on_creation(tags),
    )["ImageId"]
    wait_available(ec2, copied, say)
    say(f"{region}: {copied}")
    return copied


def _on_creation(tags: list) -> list:
    return [{"ResourceType": "image", "Tags": tags}, {"ResourceType": "snapshot", "Tags": tags}]
