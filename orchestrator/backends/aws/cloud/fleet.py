"""Acquiring instances with EC2 CreateFleet, and what each of its answers means.

Every error code CreateFleet can give is put in one of four named classes, and nothing else:

- capacity: that (market, type, AZ) pool has nothing now; block it for a while, try the next;
- IAM propagation: a brand-new instance profile is not visible to EC2 yet; wait and ask again;
- quota / permission: no retry can help; stop the sweep with the quota to raise or the right to grant;
- anything else: the run's attempt fails with AWS's own words (never "no capacity" forever).
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.backends.aws.cloud.ec2 import (
    QUOTA_ERRORS,
    AwsFatal,
    error_code,
    error_message,
    explain,
    is_permission,
)
from orchestrator.backends.aws.cloud.pools import BLOCK_S, NEVER_S, QUOTA_BLOCK_S, Blocklist, Choice  # noqa: F401 (re-exported)
from orchestrator.errors import OrchError

log = logging.getLogger("orch.fleet")

# "Not here, not now": block that (market, type, subnet) for a while and try the next.
CAPACITY_ERRORS = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "UnfulfillableCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "SpotMaxPriceTooLow",
        "InsufficientFreeAddressesInSubnet",
    }
)
# "The requested configuration is not supported" for that pool (EC2 API reference, Error codes: Unsupported): no wait
# changes it, so the pool is not asked again for the sweep; when no pool is left, the run's attempt fails with AWS's
# words (a capacity verdict would ask again every few minutes, forever).
CONFIG_ERRORS = frozenset({"Unsupported"})
PROPAGATION_S = 120.0  # how long a new instance profile may stay invisible to EC2 before orch gives up


class CapacityUnavailable(OrchError):
    """No pool could give an instance right now; the run stays queued and is tried again later."""


class QuotaReached(AwsFatal):
    """Every market asked answered with an instance quota (vCPUs, spot instances). Fatal for a sweep only when
    none of its instances is alive (nothing of its own will free capacity); else its runs wait (the backend decides)."""


# Things orch made a moment ago that CreateFleet may not see yet (eventual consistency): asked again, never
# fatal at once, never a capacity verdict. Placement and security groups: EC2 API reference, "Eventual consistency".
NOT_YET_CODES = frozenset({"InvalidPlacementGroup.Unknown", "InvalidGroup.NotFound"})


def is_unoffered(code: str, message: str) -> bool:
    """The AZ does not offer that type at all (CreateFleet: InvalidFleetConfiguration; RunInstances: Unsupported):
    "Your requested instance type (c5.large) is not supported in your requested Availability Zone (us-east-1e)"."""
    return code in ("InvalidFleetConfiguration", "Unsupported") and "not supported in your requested Availability" in (
        message
    )


def is_propagation(code: str, message: str) -> bool:
    """EC2 does not see a freshly created instance profile, placement group or security group yet."""
    if code in NOT_YET_CODES:
        return True
    return code == "InvalidParameterValue" and (
        "iamInstanceProfile" in message or "Invalid IAM Instance Profile" in message
    )


def choices(instance_types: list[str], subnets: list[dict]) -> list[Choice]:
    """Every (type, subnet) pair, the types in the order given (first choice first)."""
    return [Choice(t, s["SubnetId"], s["AvailabilityZone"]) for t in instance_types for s in subnets]


def offered(choices: list[Choice], pools: set | None) -> list[Choice]:
    """The choices whose (type, AZ) EC2 offers (`pools` from ec2.offered_pools; None: all of them)."""
    return list(choices) if pools is None else [c for c in choices if (c.instance_type, c.az) in pools]


def offered_choices(ec2, instance_types: list[str], subnets: list[dict], region: str) -> list[Choice]:
    """Every (type, subnet) pair whose AZ offers the type (one DescribeInstanceTypeOfferings); none is fatal."""
    from orchestrator.backends.aws.cloud.ec2 import offered_pools

    azs = sorted({s["AvailabilityZone"] for s in subnets})
    kept = offered(choices(instance_types, subnets), offered_pools(ec2, instance_types, azs))
    if not kept:
        raise AwsFatal(
            f"none of `aws.instance_types` ({', '.join(instance_types)}) is offered in the subnets' Availability "
            f"Zones ({', '.join(azs)}) of {region} (DescribeInstanceTypeOfferings). Add types, or subnets of other "
            "AZs (`aws ec2 describe-instance-type-offerings --location-type availability-zone`)."
        )
    return kept


def markets(market: str) -> list[str]:
    """The markets `aws.market` tries, in order."""
    return {"spot": ["spot"], "on-demand": ["on-demand"], "spot-then-on-demand": ["spot", "on-demand"]}[market]


@dataclass
class Acquired:
    instance_id: str
    instance_type: str
    subnet_id: str
    az: str
    market: str  # spot | on-demand


def _fleet(
    ec2,
    template_id: str,
    version: str,
    choices: list[Choice],
    market: str,
    tags: list[dict],
    count: int = 1,
    group: str = "",
) -> dict:
    placement = {"Placement": {"GroupName": group}} if group else {}
    # several nodes: all or nothing, of one type in one AZ (EC2 launches none when it cannot give them all);
    # only in the market asked for: the other market's options say nothing about this request
    together = (
        {"MinTargetCapacity": count, "SingleInstanceType": True, "SingleAvailabilityZone": True} if count > 1 else {}
    )
    # "An EC2 Fleet request can't span different subnets from the same Availability Zone" (EC2 Fleet quotas):
    # per AZ, the first subnet the choices name (the user's order); the others are asked once it is blocked
    subnet_of: dict[str, str] = {}
    choices = [c for c in choices if subnet_of.setdefault(c.az, c.subnet_id) == c.subnet_id]
    return ec2.create_fleet(
        Type="instant",
        ClientToken=str(uuid.uuid4()),
        TargetCapacitySpecification={"TotalTargetCapacity": count, "DefaultTargetCapacityType": market},
        SpotOptions={"AllocationStrategy": "price-capacity-optimized", **(together if market == "spot" else {})},
        OnDemandOptions={"AllocationStrategy": "lowest-price", **(together if market == "on-demand" else {})},
        LaunchTemplateConfigs=[
            {
                "LaunchTemplateSpecification": {"LaunchTemplateId": template_id, "Version": version},
                "Overrides": [{**_override(c, count), **placement} for c in choices],
            }
        ],
        # what the fleet creates carries the sweep's tags from the request: the policy allows a launch only so
        # (docs/aws.md); the network interfaces and spot requests get them from the template version (launched_tags)
        TagSpecifications=[{"ResourceType": kind, "Tags": tags} for kind in ("instance", "volume", "fleet")],
    )


def _override(c: Choice, count: int) -> dict:
    """One choice as an override; weighted only for one instance (a weight counts units, not the nodes of a run)."""
    weighted = {"WeightedCapacity": c.weight} if c.weight is not None and count == 1 else {}
    return {"InstanceType": c.instance_type, "SubnetId": c.subnet_id, **weighted}


def launched_tags(tags: list[dict], market: str) -> list[dict]:
    """The template's tags for what a launch in `market` makes that CreateFleet's TagSpecifications cannot name. Spot
    requests only for spot: "If the instance does not include the resource type that you specify, the instance launch
    fails" (EC2 API reference, LaunchTemplateTagSpecificationRequest; InvalidParameterValue: karpenter issue 5850)."""
    kinds = ("network-interface", "spot-instances-request") if market == "spot" else ("network-interface",)
    return [{"ResourceType": kind, "Tags": tags} for kind in kinds]


def _quota(blocklist: Blocklist, choices: list[Choice], market: str, error: OrchError) -> OrchError:
    """A quota covers the whole market: none of its pools is asked again for a while."""
    log.info("%s: %s", market, error)
    for c in choices:
        blocklist.block(market, c.instance_type, c.subnet_id, QUOTA_BLOCK_S)
    blocklist.quota[market] = (time.time() + QUOTA_BLOCK_S, str(error))
    return error


def _refused(code: str, message: str, market: str, instance_type: str, where: str = "") -> OrchError:
    """A CreateFleet error that is neither capacity nor propagation, in AWS's words."""
    if code in QUOTA_ERRORS or is_permission(code):
        return explain(_as_client_error(code, message), "CreateFleet", market=market, instance_type=instance_type)
    return OrchError(
        f"CreateFleet refused {market} {instance_type}{where}: {code}: {message.rstrip('.')}. "
        "Check the sweep's `aws:` settings against that message."
    )


def acquire(
    ec2,
    template_id: str,
    base: dict,
    user_data: str,
    choices: list[Choice],
    markets: list[str],
    tags: list[dict],
    blocklist: Blocklist,
    sleep: Callable[[float], None] = time.sleep,
    propagation_s: float = PROPAGATION_S,
) -> Acquired:
    """One instance from the first market and pool that has capacity.

    The user data (it holds this instance's host key) lives in template versions (one per market
    asked) that are deleted as soon as the fleet answered. Once CreateFleet returned an instance, nothing here
    can lose it: a failing clean-up is logged, never raised.
    """
    return _acquire(ec2, template_id, base, user_data, choices, markets, tags, blocklist, sleep, propagation_s)[0]


def acquire_nodes(
    ec2,
    template_id: str,
    base: dict,
    user_data: str,
    choices: list[Choice],
    markets: list[str],
    tags: list[dict],
    blocklist: Blocklist,
    count: int,
    group_of: Callable[[str], str],
    release: Callable[[list[str]], None],
    sleep: Callable[[float], None] = time.sleep,
    propagation_s: float = PROPAGATION_S,
) -> list[Acquired]:
    """`count` instances of one type in one AZ, in that AZ's placement group (`group_of(az)`), or none:
    one CreateFleet per pool; a pool that gives fewer has what it gave released (`release`) and is
    blocked like a capacity error, and the next pool is asked."""
    return _acquire(
        ec2,
        template_id,
        base,
        user_data,
        choices,
        markets,
        tags,
        blocklist,
        sleep,
        propagation_s,
        count,
        group_of,
        release,
    )


def _acquire(
    ec2,
    template_id: str,
    base: dict,
    user_data: str,
    choices: list[Choice],
    markets: list[str],
    tags: list[dict],
    blocklist: Blocklist,
    sleep: Callable[[float], None],
    propagation_s: float,
    count: int = 1,
    group_of: Callable[[str], str] | None = None,
    release: Callable[[list[str]], None] | None = None,
) -> list[Acquired]:
    from botocore.exceptions import ClientError

    if not any(blocklist.allowed(choices, m) for m in markets):  # everything just refused: wait without calling the API
        quota = [blocklist.quota[m][1] for m in markets if blocklist.quota.get(m, (0, ""))[0] > time.time()]
        if quota:  # what AWS said a moment ago: the run waits; only a fresh answer can end the sweep
            raise CapacityUnavailable(f"waiting for quota to free: {quota[0]}")
        raise CapacityUnavailable(
            f"no capacity for {', '.join(sorted({c.instance_type for c in choices}))} right now (all choices cooling "
            "down); will retry"
        )
    versions: dict[str, str] = {}  # market -> its template version, made when that market is first asked

    def version_of(market: str) -> str:
        if market not in versions:
            data = {**base, "UserData": base64.b64encode(user_data.encode()).decode()}
            data["TagSpecifications"] = launched_tags(tags, market)
            try:
                made = ec2.create_launch_template_version(LaunchTemplateId=template_id, LaunchTemplateData=data)
            except ClientError as exc:
                raise explain(exc, "creating a launch template version") from None
            versions[market] = str(made["LaunchTemplateVersion"]["VersionNumber"])
        return versions[market]

    ask = _Ask(ec2, template_id, version_of, choices, tags, blocklist, sleep, propagation_s, count, group_of, release)
    try:
        return ask.every_market(markets)
    finally:
        if versions:
            try:
                ec2.delete_launch_template_versions(LaunchTemplateId=template_id, Versions=list(versions.values()))
            except Exception as exc:  # never fatal, never loses an instance: the versions die with the template at down
                log.warning("could not delete launch template versions %s: %s", ", ".join(versions.values()), exc)


_NEXT, _MARKET_DONE = "next", "market done"  # what one answer leaves: ask again in this market, or go to the next


class _Ask:
    """One acquisition: CreateFleet asked market by market, pool by pool, until instances come or none is left.

    Each answer — an exception, a 200 with instances, a 200 with only Errors — blocks what it refused
    (a capacity error for a while, an unoffered pool for the sweep), waits out what EC2 does not see
    yet (a new instance profile), or ends the attempt (quota, permission, a malformed request)."""

    def __init__(
        self, ec2, template_id, version_of, choices, tags, blocklist, sleep, propagation_s, count, group_of, release
    ):
        self.ec2, self.template_id, self.version, self.choices, self.tags = ec2, template_id, version_of, choices, tags
        self.blocklist, self.sleep, self.propagation_s, self.count = blocklist, sleep, propagation_s, count
        self.group_of, self.release = group_of, release
        self.waited = 0.0  # seconds spent waiting for what orch made to become visible to EC2
        self.quota: OrchError | None = None  # a market refused for its quota: the next market is still asked

    def every_market(self, markets: list[str]) -> list[Acquired]:
        for market in markets:
            while True:
                allowed = self.blocklist.allowed(self.choices, market)
                if not allowed:
                    break
                if self.count > 1:  # all nodes from one pool: one type, one AZ, one placement group
                    allowed = allowed[:1]
                outcome = self._once(market, allowed)
                if outcome == _MARKET_DONE:
                    break
                if outcome != _NEXT:
                    return outcome
        if self.quota is not None:
            raise QuotaReached(str(self.quota))
        unsupported = self.blocklist.all_unsupported(self.choices)
        if unsupported:
            raise OrchError(
                f"CreateFleet refused every (type, AZ) of this run as unsupported ({unsupported}). Check the sweep's "
                "`aws:` settings (instance types, image, volume) against that message."
            )
        raise CapacityUnavailable(
            f"no capacity for {', '.join(sorted({c.instance_type for c in self.choices}))} in "
            f"{', '.join(sorted({c.az for c in self.choices}))} ({' or '.join(markets)}) right now; will retry"
        )

    def _once(self, market: str, allowed: list[Choice]):
        from botocore.exceptions import ClientError

        try:
            version, group = self.version(market), (self.group_of(allowed[0].az) if self.group_of else "")
            answer = _fleet(self.ec2, self.template_id, version, allowed, market, self.tags, self.count, group)
        except ClientError as exc:
            return self._refusal(exc, market, allowed)
        got = _instances(answer, allowed, market)
        if len(got) >= self.count:
            return got
        if got:  # fewer than the run's nodes (MinTargetCapacity should prevent it): none is any use alone
            log.info(
                "%s %s in %s gave %d of %d instances; releasing them and trying the next choice",
                market,
                allowed[0].instance_type,
                allowed[0].az,
                len(got),
                self.count,
            )
            _release_quietly(self.release, [g.instance_id for g in got])
            self.blocklist.block(market, allowed[0].instance_type, allowed[0].subnet_id)
            return _NEXT
        errors = answer.get("Errors", [])
        if not errors:
            raise CapacityUnavailable("CreateFleet answered with neither instances nor errors; will retry")
        return self._errors(errors, market, allowed)

    def _refusal(self, exc, market: str, allowed: list[Choice]):
        """The whole request was refused (an exception, not a 200 with Errors)."""
        code, message = error_code(exc), error_message(exc)
        first = allowed[0]
        if is_unoffered(code, message):
            log.info("%s: %s; not asked again", first.instance_type, message)
            self.blocklist.never(first.instance_type, first.subnet_id)
            return _NEXT
        if code in CONFIG_ERRORS:
            log.info("%s in %s: %s: %s; not asked again", first.instance_type, first.az, code, message)
            self.blocklist.refuse(first.instance_type, first.subnet_id, f"{code}: {message}")
            return _NEXT
        if code in CAPACITY_ERRORS:  # block the first pool it offered
            log.info("capacity error %s for %s (%s); trying the next choice", code, first.instance_type, market)
            self.blocklist.block(market, first.instance_type, first.subnet_id)
            return _NEXT
        if is_propagation(code, message) and self.waited < self.propagation_s:
            self.waited += _backoff(self.waited, self.sleep)
            return _NEXT
        if code in QUOTA_ERRORS:
            self.quota = _quota(
                self.blocklist, self.choices, market, _refused(code, message, market, first.instance_type)
            )
            return _MARKET_DONE
        raise _refused(code, message, market, first.instance_type) from None

    def _errors(self, errors: list[dict], market: str, allowed: list[Choice]):
        """A 200 answer with Errors and no instances."""
        # A new instance profile not yet visible to EC2 comes with a capacity error beside it
        # (karpenter-provider-aws issue 3051: InvalidParameterValue + UnfulfillableCapacity): that
        # capacity error is the profile's, not the pool's, so the answer blocks nothing.
        propagating = [e for e in errors if is_propagation(e.get("ErrorCode", ""), e.get("ErrorMessage", ""))]
        quota_err = next((e for e in errors if e.get("ErrorCode") in QUOTA_ERRORS), None)
        if quota_err is not None and not propagating:
            refused = _refused(
                quota_err["ErrorCode"], quota_err.get("ErrorMessage", ""), market, allowed[0].instance_type
            )
            self.quota = _quota(self.blocklist, self.choices, market, refused)
            return _MARKET_DONE
        if propagating:
            return self._propagating(propagating[0])
        for err in errors:
            code, message = err.get("ErrorCode", ""), err.get("ErrorMessage", "")
            o = err.get("LaunchTemplateAndOverrides", {}).get("Overrides", {})
            hit = [c for c in allowed if c.instance_type == o.get("InstanceType") and c.subnet_id == o.get("SubnetId")]
            if is_unoffered(code, message):  # that pool does not exist: the others are asked
                for c in hit or allowed[:1]:
                    self.blocklist.never(c.instance_type, c.subnet_id)
            elif code in CONFIG_ERRORS:
                for c in hit or allowed[:1]:
                    self.blocklist.refuse(c.instance_type, c.subnet_id, f"{code}: {message}")
            elif code in CAPACITY_ERRORS:
                for c in hit or allowed:
                    self.blocklist.block(market, c.instance_type, c.subnet_id)
            else:
                raise _refused(code, message, market, o.get("InstanceType", "?"), f" in {o.get('SubnetId', '?')}")
        log.info(
            "CreateFleet gave no %s instance (%s); trying the next choices",
            market,
            ", ".join(e.get("ErrorCode", "?") for e in errors),
        )
        return _NEXT

    def _propagating(self, first: dict):
        if self.waited >= self.propagation_s:
            raise AwsFatal(
                f"EC2 still does not see what orch made for this sweep after {self.waited:.0f} s "
                f"({first.get('ErrorCode')}: {first.get('ErrorMessage')}). For an instance profile: check that its "
                "role trusts ec2.amazonaws.com, or name an existing profile in `aws.instance_profile`; "
                "otherwise run the launch again."
            )
        log.info("what orch just made is not visible to EC2 yet; asking again")
        self.waited += _backoff(self.waited, self.sleep)
        return _NEXT


def _release_quietly(release: Callable[[list[str]], None] | None, ids: list[str]) -> None:
    try:
        if release is not None:
            release(ids)
    except Exception as exc:  # they carry the sweep's tags: `orch down` finds them
        log.error("could not release %s: %s", ", ".join(ids), exc)


def _instances(answer: dict, allowed: list[Choice], market: str) -> list[Acquired]:
    out = []
    for inst in answer.get("Instances", []):
        o = inst.get("LaunchTemplateAndOverrides", {}).get("Overrides", {})
        chosen = next(
            (c for c in allowed if c.instance_type == o.get("InstanceType") and c.subnet_id == o.get("SubnetId")),
            allowed[0],
        )
        for iid in inst.get("InstanceIds") or []:
            out.append(
                Acquired(
                    iid,
                    o.get("InstanceType", chosen.instance_type),
                    chosen.subnet_id,
                    chosen.az,
                    inst.get("Lifecycle", market),
                )
            )
    return out


def _backoff(waited: float, sleep: Callable[[float], None]) -> float:
    """2, 2, 4, 8, 16, 20, 20 ... seconds: doubling what was already waited, at most 20."""
    delay = min(20.0, max(2.0, waited))
    sleep(delay)
    return delay


def _as_client_error(code: str, message: str):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": message}}, "CreateFleet")
