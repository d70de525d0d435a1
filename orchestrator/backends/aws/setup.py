"""The sweep's AWS resources, found or created once per controller (bootstrap), and what a launch would ask for
(plan, for `orch launch --dry-run`): subnets, image, security group, instance profile, launch template, the
(type, AZ) choices and, when runs share instances, the best homes for them (packing.rank).
"""

from __future__ import annotations

import logging

from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.backends.aws.cloud import fleet, groups, iam
from orchestrator.backends.aws.cloud import images as orch_images
from orchestrator.backends.aws.cloud.images import resolve_image
from orchestrator.backends.aws.cloud.pricing import on_demand_quote, transfer_rate
from orchestrator.backends.aws.regions import check_regions, check_types_offered, data_bytes, home_region, settings
from orchestrator.backends.aws.state import ProvisioningState
from orchestrator.errors import OrchError
from orchestrator.store.s3url import is_s3, parse_s3
from orchestrator.sweep.load import located
from orchestrator.sweep.packing import describe as describe_packing
from orchestrator.sweep.packing import packed_gpus, packs, rank
from orchestrator.sweep.spec import Sweep

log = logging.getLogger("orch.aws")


def bootstrap(state: ProvisioningState, region: str | None = None) -> dict:
    """Subnets, image, security group and launch template of `region` (default: the sweep's first), each region's
    found or made once per controller (under that region's own lock: regions are prepared side by side); the first
    region's decides packing."""
    part = state.part(region or state.cfg.regions[0])
    with part.lock:
        if part.setup is None:
            part.setup = _resources(state, part.region, part.ec2)
            if part.region == state.cfg.regions[0]:
                state.setup = part.setup
        return part.setup


def check_first_region(state: ProvisioningState) -> None:
    """The first listed region's subnets, every listed region's instance types and image (not a recipe's: copied at
    launch), looked up before anything is made: a launch whose first region lacked them made the other regions'
    parts and then failed, and a later region without them failed the run (or the controller) that a failover sent
    there. Refused with file:line, the regions and the fix (exit 2)."""
    from botocore.exceptions import BotoCoreError, ClientError

    cfg, sweep = state.cfg, state.sweep
    first, listed = cfg.regions[0], ("aws", "regions" if len(cfg.regions) > 1 else "region")
    try:
        api.resolve_subnets(state.part(first).ec2, cfg.subnet_ids, first)
    except OrchError as exc:
        where = located(sweep.path, ("aws", "subnet_ids") if cfg.subnet_ids else listed)
        raise OrchError(f"{where}: {exc} (in {first}, the first region listed). Nothing was launched.", 2) from None
    check_types_offered(sweep, lambda region: state.part(region).ec2)
    if cfg.image.startswith("recipe:"):
        return _check_recipe_built(state)
    missing = []
    for region in cfg.regions:
        try:
            resolve_image(state.part(region).ec2, cfg.image, cfg.image_owner, region)
        except (ClientError, BotoCoreError) as exc:
            raise api.explain(exc, f"looking up the AMI in {region}") from None
        except OrchError:
            missing.append(region)
    if missing:
        fix = (
            "an AMI id belongs to one region: with several, give a name pattern that finds each region's own AMI"
            if cfg.image.startswith("ami-")
            else f"remove {', '.join(missing)} from `{'.'.join(listed)}`, or give an image each listed region has"
        )
        raise OrchError(
            f"{located(sweep.path, ('aws', 'image'))}: no image {cfg.image!r} (owner {cfg.image_owner}) in "
            f"{', '.join(missing)}{' (the first region listed)' if first in missing else ''}: {fix}. Nothing was "
            "launched.",
            exit_code=2,
        ) from None


def _check_recipe_built(state: ProvisioningState) -> None:
    """`image: recipe:NAME`: an `available` image of NAME in one listed region at least (a launch copies it into the
    others); else refused with file:line and the build command (exit 2) before anything is made."""
    from botocore.exceptions import BotoCoreError, ClientError

    cfg = state.cfg
    name = cfg.image[len("recipe:") :]
    for region in cfg.regions:
        try:
            if any(i.get("State") == "available" for i in orch_images.images(state.part(region).ec2, name)):
                return
        except (ClientError, BotoCoreError) as exc:
            raise api.explain(exc, f"looking up the images of recipe {name!r} in {region}") from None
    raise OrchError(
        f"{located(state.sweep.path, ('aws', 'image'))}: no image built from recipe {name!r} in "
        f"{', '.join(cfg.regions)}. Build it: `orch ami build ami/{name}.yaml --region {cfg.regions[0]}` (the "
        "recipe file as you named it), or name a recipe you built. Nothing was launched.",
        exit_code=2,
    )


def prepare_regions(state: ProvisioningState):
    """Every listed region after the first is prepared at once, each in a thread of its own (docs/guides/regions.md,
    "What is made where"), so that a failover finds its parts made instead of making them while a run waits: once
    per controller. A region that cannot be prepared yet (its image still being copied, an API error) is logged and
    prepared again when it is first asked. Returns at once: the threads' executor (`.shutdown(wait=True)` waits for
    them), or None when there is nothing (more) to prepare."""
    from concurrent.futures import ThreadPoolExecutor

    others = state.cfg.regions[1:]
    with state.setup_lock:
        if state.prepared or not others:
            return None
        state.prepared = True
    pool = ThreadPoolExecutor(max_workers=len(others), thread_name_prefix="orch-region")
    for region in others:
        pool.submit(_prepare_quietly, state, region)
    pool.shutdown(wait=False)
    return pool


def _prepare_quietly(state: ProvisioningState, region: str) -> None:
    try:
        bootstrap(state, region)
    except Exception as exc:  # asked again, and raised then, when the region is first used
        log.info("%s not prepared ahead (it is when first asked): %s", region, exc)


def shared_parts(state: ProvisioningState) -> tuple[str, str]:
    """(instance profile, the SSH rule's CIDR): what every region's parts share, found once per controller (IAM is
    global: one profile serves every region; the caller's address is asked once)."""
    cfg = state.cfg
    with state.setup_lock:
        if state.shared is None:
            cidr = "" if cfg.security_group else (cfg.ssh_cidr or api.caller_cidr())
            profile = cfg.instance_profile
            if profile == "create":
                store = parse_s3(state.sweep.store_url)
                sources = [e.source for e in state.sweep.spec.data or []]
                buckets = [store.bucket] + [parse_s3(u).bucket for u in sources if is_s3(u)]
                profile = iam.ensure_instance_profile(
                    api.client("iam", cfg.region),
                    state.name,
                    store.bucket,
                    store.prefix,
                    sources,
                    iam.bucket_kms_keys(api.client("s3", cfg.region), buckets),
                    regions_of(cfg),
                )
            state.shared = (profile, cidr)
        return state.shared


def _resources(state: ProvisioningState, region: str, ec2) -> dict:
    from botocore.exceptions import BotoCoreError, ClientError

    cfg, sweep = state.cfg, state.name
    try:
        subnets = api.resolve_subnets(ec2, cfg.subnet_ids, region)
        if state.recipe_sha:  # a copy of the sweep's recipe image on its way here: this region waits for it
            orch_images.recipe_image_here(ec2, cfg.image[len("recipe:") :], state.recipe_sha, region)
        image = resolve_image(ec2, cfg.image, cfg.image_owner, region)
        profile, cidr = shared_parts(state)
        sg = cfg.security_group or groups.ensure_security_group(ec2, sweep, subnets[0]["VpcId"], cidr)
        public_ip = cfg.ssh.address == "public_ip" and not all(s["MapPublicIpOnLaunch"] for s in subnets)
        data = api.launch_template_data(image, sg, cfg.volume_gb, profile, public_ip)
        template = api.ensure_launch_template(ec2, sweep, data)
    except (ClientError, BotoCoreError) as exc:
        raise api.explain(exc, "preparing the sweep's AWS resources") from None
    choices = fleet.offered_choices(ec2, cfg.instance_types, subnets, region)
    order = _plan_packing(state, region, ec2, sorted({s["AvailabilityZone"] for s in subnets}))
    # Each instance gets a template version of its own from exactly this data (today's image, group, volume,
    # profile) plus its user data: a template made by an earlier launch never pins an older (or deleted)
    # image after `orch ami build --force` / `orch ami rm`, and no DescribeLaunchTemplateVersions answer
    # (response fields such as MetadataOptions.State) is ever posted back as a request.
    return {"template": template, "base": data, "choices": choices, "image": image, "sg": sg, "pack_order": order}


def recipe_source(state: ProvisioningState) -> tuple[str, dict] | None:
    """(region, image): the newest `available` image built from the sweep's recipe (`image: recipe:NAME`) in any of
    its regions; None for another kind of image, one region, or a recipe built nowhere yet."""
    cfg = state.cfg
    if not cfg.image.startswith("recipe:") or len(cfg.regions) < 2:
        return None
    name = cfg.image[len("recipe:") :]
    ready = [
        (i.get("CreationDate", ""), r, i)
        for r in cfg.regions
        for i in orch_images.images(state.part(r).ec2, name)
        if i.get("State") == "available"
    ]
    if not ready:
        return None
    _, region, image = max(ready, key=lambda x: x[0])
    return region, image


def copy_recipe_image(state: ProvisioningState) -> list[str]:
    """`image: recipe:NAME` over several regions (docs/guides/regions.md): the newest image built from NAME in any of
    them is copied, at launch, into each listed region that has no image of its recipe hash (none there, being
    copied, or failed), tagged as the original; a region's hosts launch only from that hash, once its copy is
    available (recipe_image_here). Copied at launch, not when a region is first asked: a copy takes minutes to an
    hour, and a region is asked exactly when the sweep needs its capacity at once. Says what it started."""
    from botocore.exceptions import BotoCoreError, ClientError

    found = recipe_source(state)
    if found is None:
        return []
    source_region, source = found
    name, sha = state.cfg.image[len("recipe:") :], orch_images.tags_of(source).get(orch_images.SHA_TAG, "")
    state.recipe_sha = sha
    said = []
    for region in state.cfg.regions:
        ec2 = state.part(region).ec2
        try:
            if region == source_region or orch_images.images(ec2, name, sha):
                continue
            copied = orch_images.copy_into(ec2, source, source_region)
        except (ClientError, BotoCoreError) as exc:
            raise api.explain(exc, f"copying image {source['ImageId']} into {region}") from None
        said.append(f"{region}: copying image {source['ImageId']} (recipe {name}) from {source_region}: {copied}")
        log.info("%s", said[-1])
    return said


def regions_of(cfg) -> tuple[str, ...]:
    """The regions a sweep may use (`aws.regions`, which holds `aws.region` in the one-region form): its roles' EC2
    calls are refused anywhere else."""
    return tuple(cfg.regions or [cfg.region])


def _plan_packing(state: ProvisioningState, region: str, ec2, azs: list[str]) -> list:
    """The region's homes for new shared instances, best first, from its own spot prices (a type cheapest in one
    region need not be in another); [] when the sweep does not pack. The first region's GPU counts decide whether
    it packs (and give GPU-hours); another region asks only when its runs could pack."""
    cfg, resources = state.cfg, state.sweep.spec.resources
    first = region == cfg.regions[0]
    if not first and not (resources and resources.nodes == 1 and resources.gpus):
        return []
    gpus = api.gpu_counts(ec2, cfg.instance_types)
    if first:
        with state.setup_lock:  # gpus_of reads it from provisioning threads
            state.gpus.update(gpus)
        state.packing = packs(resources, {t: state.gpus.get(t, 0) for t in cfg.instance_types})
    if not packs(resources, {t: gpus.get(t, 0) for t in cfg.instance_types}):
        return []
    order = pack_order(state.sweep, gpus, api.spot_prices(ec2, cfg.instance_types, azs))
    log.info("packing in %s: %s", region, ", ".join(f"{c.instance_type} ({c.slots} per instance)" for c in order))
    return order


def _parallel(sweep: Sweep) -> int:
    return min(sweep.spec.max_parallel, len(sweep.runs))


def pack_order(sweep: Sweep, gpus: dict[str, int], prices: dict[tuple, float]) -> list:
    """Homes for packed runs, best first, from GPU counts and spot prices per (type, AZ) (its cheapest AZ)."""
    types = settings(sweep).instance_types
    by_type = {t: min((p for (tt, _), p in prices.items() if tt == t), default=None) for t in types}
    return rank(types, gpus, by_type, packed_gpus(sweep.spec.resources), _parallel(sweep))


def _hour(market: str, instance_type: str, spot: float | None, region: str) -> tuple[float | None, str]:
    """What an hour of a choice costs at most in `market` (spot-then-on-demand: the dearer of the two), and how the
    on-demand part was priced (pricing.on_demand_quote; "" for spot)."""
    if market == "spot":
        return spot, ""
    demand, how = on_demand_quote(instance_type, spot, region)
    if market == "on-demand" or demand is None or spot is None:
        return demand, how
    return max(spot, demand), how


def bought(state: ProvisioningState) -> str:
    """The markets a launch may buy: `aws.market`'s, and on-demand too with a `deadline:` (control/schedule.py)."""
    return "spot-then-on-demand" if state.sweep.spec.deadline and state.cfg.market == "spot" else state.cfg.market


def _region_rows(state: ProvisioningState, region: str) -> list[dict]:
    """The (type, AZ) choices of one region with its own spot prices and on-demand prices."""
    cfg = state.cfg
    ec2 = state.part(region).ec2
    subnets = api.resolve_subnets(ec2, cfg.subnet_ids if region == cfg.region else [], region)
    azs = sorted({s["AvailabilityZone"] for s in subnets})
    prices = api.spot_prices(ec2, cfg.instance_types, azs)
    gpus = api.gpu_counts(ec2, cfg.instance_types)
    rows = []
    for t in cfg.instance_types:
        for az in azs:
            hour, how = _hour(bought(state), t, prices.get((t, az)), region)
            rows.append(
                {"type": t, "az": az, "region": region, "spot_usd_per_h": prices.get((t, az)), "gpus": gpus.get(t)}
                | {"usd_per_h": hour, "on_demand_priced": how}
            )
    return rows


def plan(state: ProvisioningState) -> dict:
    """What a launch would ask for: (type, AZ) choices per region with their prices, a cost bound over every allowed
    region (the dearest hour of any choice: the fleet may take any), and what moving data across regions costs."""
    from botocore.exceptions import BotoCoreError, ClientError

    cfg, sweep = state.cfg, state.sweep
    home = home_region(sweep)
    check_regions(sweep, home)
    images = []
    check_first_region(state)  # the subnets, and a name pattern's or id's image in every region: refused here too
    try:
        rows = [row for region in cfg.regions for row in _region_rows(state, region)]
        source = recipe_source(state)
        for k, region in enumerate(cfg.regions):  # each region's own image (a name pattern finds each region's AMI)
            try:
                image = resolve_image(state.part(region).ec2, cfg.image, cfg.image_owner, region)
            except OrchError as exc:
                copied = f"{source[1]['ImageId']} from {source[0]}" if source else ""
                if k == 0 and copied:
                    raise OrchError(
                        f"{exc}\n`orch launch` copies {copied} there, and launches once the copy is available "
                        "(minutes to an hour); or list a region that has it first.",
                        exit_code=2,
                    ) from None
                if k == 0:
                    raise
                # a launch asks a later region only when the first has no capacity: said here, refused only then
                images.append(
                    f"none in {region} yet: a launch copies {copied} there" if copied else f"none in {region} ({exc})"
                )
                continue
            images.append(f"{image['ImageId']} ({image['Name']})" + (f" in {region}" if len(cfg.regions) > 1 else ""))
    except (ClientError, BotoCoreError) as exc:
        raise api.explain(exc, "reading spot prices and instance types") from None
    gpus = {r["type"]: r["gpus"] for r in rows if r["gpus"] is not None}
    known = [r["usd_per_h"] for r in rows if r["usd_per_h"] is not None]
    hours = (sweep.spec.timeout_minutes or cfg.max_minutes) / 60
    dearest = max(known) if known else None  # a bound over whichever choice the fleet takes, in whichever region
    spot = [r["spot_usd_per_h"] for r in rows if r["spot_usd_per_h"] is not None]
    split = spot and sweep.spec.deadline and cfg.market == "spot"  # (spot-then-on-demand buys on any refusal)
    all_spot = max(spot) * hours * len(sweep.runs) * state.nodes if split else None
    instances = len(sweep.runs) * state.nodes  # every node of a run is an instance billed (packing only lowers it)
    packing: list[str] = []
    for region in cfg.regions if packs(sweep.spec.resources, gpus) else []:  # each region by its own prices
        prices = {(r["type"], r["az"]): r["spot_usd_per_h"] for r in rows if r["region"] == region}
        order = pack_order(sweep, gpus, {k: v for k, v in prices.items() if v is not None})
        lines = describe_packing(order, packed_gpus(sweep.spec.resources), _parallel(sweep))
        if lines and len(cfg.regions) > 1:
            lines[0] = lines[0].replace("packing:", f"packing in {region}:", 1)
        packing += lines
    return {
        "regions": list(cfg.regions),
        "home_region": home,
        "choices": rows,
        "runs": len(sweep.runs),
        "hours_per_run_max": hours,
        "image": ", ".join(images),
        "image_asked": cfg.image,  # as the sweep names it (an id, a name pattern, recipe:NAME)
        "nodes_per_run": state.nodes,
        "packing": packing,
        "market": bought(state),
        # unrounded: the words round it up (money.usd at_most); rounded here it fell below the dearest choice's cost
        "estimate_usd_max": dearest * hours * instances if dearest is not None else None,
        "unpriced_choices": len(rows) - len(known),
        # `deadline:` with spot markets: the bound as if spot held throughout; the rest is the on-demand share
        "estimate_spot_usd_max": all_spot,
        "uplifted": sorted({r["region"] for r in rows if r["on_demand_priced"] == "uplift"}),
        "transfer": transfer_plan(state, home),
        "worth": worth_plan(state, rows),
    }


def worth_plan(state: ProvisioningState, rows: list[dict]) -> dict:
    """`aws.choose: work`: every pool ranked by expected $ per unit of work, from what the sweep measured so far."""
    cfg = state.cfg
    if cfg.choose != "work":
        return {"choose": cfg.choose}
    prices = {(r["type"], r["az"]): r["usd_per_h"] for r in rows}
    ranked = state.work.ranked(list(prices), lambda t, az: prices.get((t, az)))
    plan = {"choose": "work", "work_key": state.work.work_key, "pools": ranked, "scores": state.work.placement().note}
    return plan | {"earlier": list(state.work.before().sweeps), "per_run": state.work.units_per_run()}


def transfer_plan(state: ProvisioningState, home: str) -> dict:
    """Inter-region transfer a launch may pay: the home region, each other allowed region's rates per GB (up: a
    host's uploads to the store; down: its restores and `data:` staging) and the `data:` bytes a host there stages
    (None where orch cannot know them before the launch)."""
    away = [r for r in state.cfg.regions if r != home]
    return {
        "home": home,
        "rates": {r: {"up": transfer_rate(r, home), "down": transfer_rate(home, r)} for r in away},
        "data_bytes": data_bytes(state.sweep, home) if away else 0,
    }
