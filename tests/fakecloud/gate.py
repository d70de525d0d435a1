"""The strict half of the fake cloud: a WSGI gate in front of moto where moto is kinder than AWS.

What it imitates (each switchable through `Strictness`, all on by default):

- Eventual consistency. A new instance id answers `InvalidInstanceID.NotFound` to DescribeInstances
  and TerminateInstances by id for `instance_s`; a new security group is `InvalidGroup.NotFound` for
  `group_s`; an instance profile refuses CreateFleet for `profile_s` after its role was added (AWS
  puts that in the fleet's Errors: "Invalid IAM Instance Profile name").
- Instances start `pending` for `pending_s`, and terminate through `shutting-down` for
  `terminate_s`; a security group still used by an instance that is not `terminated` refuses
  DeleteSecurityGroup with `DependencyViolation`.
- IAM for hosts. Requests signed with role credentials that the fake IMDS handed out are checked
  against that role's policies (Allow/Deny, `*` wildcards, StringEquals/StringLike conditions on
  `s3:prefix`, `aws:ResourceTag/...` and, with ForAllValues/ForAnyValue, the request's `aws:TagKeys`);
  anything not allowed is 403. S3's rule for a missing key
  holds: GetObject/HeadObject of a key that does not exist answers 403, not 404, to a caller
  without `s3:ListBucket` on the bucket. Callers with other keys (the controller) are not checked.
- CreateFleet answers injected per (market, instance type, AZ): `fleet_errors[(m, t, az)] = code`
  ("*" matches anything). Refused pools come back as the fleet's Errors; when no pool is left the
  answer is a 200 with Errors and no instances, as AWS gives it.
- Placement groups (moto has none): tests/fakecloud/placement.py answers them, and CreateFleet
  overrides that name one are checked against it (unknown group, one AZ per cluster group).
- `fleet_capacity[(m, t, az)] = k`: that pool gives at most k instances per CreateFleet: a request
  for more is partly filled, as EC2 does when a pool runs short, or, with MinTargetCapacity above
  k, refused with InsufficientInstanceCapacity and nothing launched (EC2's all-or-nothing).
- `region_capacity[region] = k`: the region holds at most k live spot instances at once (all its pools together):
  a CreateFleet that would pass k is refused whole with InsufficientInstanceCapacity, as every pool of a region
  that has filled up answers (capacity frees as instances terminate).
- `spot_prices[(type, az)] = usd`: that pool's spot price in its history (every entry), instead of the example
  price below: a test sets how prices differ between regions (each region's history names only its own AZs).
- `unoffered`: (type, AZ) pools the region does not offer ("*" any type; the AZ a pattern: "us-west-2*" is a whole
  region): DescribeInstanceTypeOfferings
  leaves them out, their spot price history is empty, and CreateFleet refuses them in its Errors with
  `InvalidFleetConfiguration` "Your requested instance type (T) is not supported in your requested
  Availability Zone (AZ)" (real answers: compiler-explorer/infra issue 601, karpenter-provider-aws issue 2243).
- `garbled`: EC2 actions whose answer cannot be parsed, so the SDK raises something that is not a
  ClientError (what a dropped connection or a proxy's error page does).

- `hold`: EC2 actions whose requests wait until a test sets the action's event, and then fail as a request
  lost in transit does (`RequestExpired`): a test reaches a command while it waits on that call (`held` lists the
  actions that arrived).

`counts` tallies every refusal the gate gave, by code, so tests can assert orch waited instead of
hammering. `calls` keeps every EC2 request as an `Ec2Call` (when it came, when it was answered, its region, action
and the run and attempt its tags name): tests order them (no run asks two regions at once) and benchmarks time them.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, parse_qsl, urlencode

ACCOUNT = "123456789012"  # moto's default account
# moto is not safe against concurrent requests (nor against reading its state while one runs):
# every request into it, and every direct read of its state, holds this lock.
MOTO = threading.RLock()
REGION = "us-east-1"
CONTROLLER_KEY = (
    "testing"  # the access key the orch CLI (the controller) runs with; the harness's own clients use another
)
CONTROLLER = "(the controller)"  # its name where a role's would be
AUTH_RE = re.compile(r"Credential=([^/]+)/[^/]+/([^/]+)/([^/]+)/")
IMAGE_ACTIONS = ("CreateImage", "CopyImage", "DescribeImages", "CreateTags", "DeregisterImage")
PLACEMENT_ACTIONS = ("CreatePlacementGroup", "DescribePlacementGroups", "DeletePlacementGroup")
UNOFFERED = (
    "Your requested instance type ({t}) is not supported in your requested Availability Zone ({az}). "
    "Please retry your request by not specifying an Availability Zone or choosing another."
)
SPOT_SLR, SPOT_SERVICE = "AWSServiceRoleForEC2Spot", "spot.amazonaws.com"
SLR_REFUSED = (
    "The provided credentials do not have permission to create the service-linked role for EC2 Spot Instances."
)
PROFILE_ERROR = "Value ({name}) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name"
# a launch that tags spot requests and makes none (EC2 API reference, LaunchTemplateTagSpecificationRequest: "If the
# instance does not include the resource type that you specify, the instance launch fails"; the answer's words from
# karpenter-provider-aws issue 5850, a CreateFleet Error per on-demand override)
SPOT_TAGS_REFUSED = (
    "You cannot specify tags for Spot instances requests if there are no Spot instances requests being created by "
    "the request."
)


class Caller(str):
    """A role's name, as the gate knows a caller; `context` holds the keys IAM adds for where its credentials came
    from: ec2:SourceInstanceARN only for credentials the fake IMDS delivered to an instance (as EC2 does)."""

    context: dict[str, str] = {}


def on_instance(role: str, instance_id: str) -> Caller:
    caller = Caller(role)
    caller.context = {"ec2:SourceInstanceARN": _ec2_arn(instance_id)}
    return caller


@dataclass
class Strictness:
    """How much slower and stricter than moto the fake cloud is (seconds)."""

    # Defaults: long enough that every path meets each refusal at least once, short enough for a
    # suite of many sweeps; tests/e2e/aws/test_aws_backend.py uses EC2-like values.
    instance_s: float = 1.0  # new instance ids are NotFound by id this long
    group_s: float = 0.5  # new security groups are NotFound this long
    profile_s: float = 1.0  # a new instance profile is refused by CreateFleet this long
    pending_s: float = 0.3  # new instances are `pending` this long
    terminate_s: float = 1.0  # terminated instances stay `shutting-down` this long
    quota_linger_s: float = 5.0  # a terminated instance still counts toward `spot_quota` this long
    image_s: float = 1.0  # a new image is `pending` this long (EC2: minutes, more for large volumes)
    iam: bool = True  # evaluate role policies for hosts' requests


@dataclass(frozen=True)
class Ec2Call:
    """One EC2 request as the gate saw it (perf_counter seconds); `run`, `attempt`: its orch:run / orch:attempt tags
    (CreateFleet's TagSpecifications), "" for another request."""

    began: float
    answered: float
    region: str
    action: str
    run: str = ""
    attempt: str = ""


@dataclass
class Gate:
    """WSGI middleware around moto's app; see the module doc."""

    app: Callable
    strict: Strictness = field(default_factory=Strictness)
    fleet_errors: dict[tuple[str, str, str], str] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)  # access key id -> role name (or a Caller, from the IMDS)
    counts: Counter = field(default_factory=Counter)
    young: dict[str, float] = field(default_factory=dict)  # instance id / group id / profile name -> born at
    groups_of: dict[str, list[str]] = field(default_factory=dict)  # instance id -> security groups (from its template)
    profile_of: dict[str, str] = field(default_factory=dict)  # instance id -> instance profile (moto's fleets drop it)
    policy_source: Callable[[str], list[dict]] | None = None  # role -> policy documents
    boundary_source: Callable[[str], dict | None] | None = None  # role -> its permissions boundary, if any
    garbled: set = field(
        default_factory=set
    )  # EC2 actions answered with a body no SDK can parse (any-exception injection)
    hold: dict[str, threading.Event] = field(default_factory=dict)  # EC2 action -> its requests wait for this
    held: list[str] = field(default_factory=list)  # the held actions whose requests arrived
    fleet_capacity: dict[tuple[str, str, str], int] = field(
        default_factory=dict
    )  # most instances one CreateFleet gets from a pool
    spot_ids: set = field(
        default_factory=set
    )  # instances a fleet launched as spot (one-time requests: EC2 cannot stop them)
    kms_buckets: set = field(
        default_factory=set
    )  # buckets whose default encryption is SSE-KMS: their ETags are no MD5s
    # buckets of eu-west-1 made with the legacy constraint `EU`, which moto refuses to make: GetBucketLocation answers
    # `EU` for them (S3 API reference, GetBucketLocation: "Buckets with a LocationConstraint of EU reside in eu-west-1")
    legacy_eu: set = field(default_factory=set)
    spot_quota: int | None = (
        None  # set by a test: most live spot instances the account may run (the vCPU quota, in instances)
    )
    unoffered: set = field(default_factory=set)  # (type, AZ) pools EC2 does not offer (see the module doc)
    region_capacity: dict[str, int] = field(default_factory=dict)  # region -> most live spot instances it holds
    spot_prices: dict[tuple[str, str], float] = field(default_factory=dict)  # (type, AZ) -> its price (module doc)
    # AZ name -> its Spot placement score (GetSpotPlacementScores, which moto lacks): an AZ not named scores 5
    placement_scores: dict[str, int] = field(default_factory=dict)
    fail_images: bool = False  # set by a test: new images end `failed` instead of `available`
    controller_policy: dict | None = (
        None  # the policy orch documents (orch aws policy): every controller call is checked
    )
    denied: list[str] = field(default_factory=list)  # controller calls the documented policy refused
    role_denied: list[tuple] = field(default_factory=list)  # (role, action) of instances' calls their role refused
    # service-linked roles the account has: none, as in an account that never launched spot (EC2 makes the spot
    # one on the first spot request, with the caller's iam:CreateServiceLinkedRole; IAM's CreateServiceLinkedRole)
    service_roles: set = field(default_factory=set)
    calls: list[Ec2Call] = field(default_factory=list)  # every EC2 request, in the order they were answered

    def __post_init__(self):
        from tests.fakecloud.images import Images
        from tests.fakecloud.placement import PlacementGroups

        self.lock = threading.Lock()
        self.allocated: list[tuple] = []  # (market, type, AZ, strategy) of each CreateFleet's pool, in order
        self.fleet_lock = threading.Lock()  # CreateFleets under `region_capacity` or `spot_quota`, one at a time
        self.local = threading.local()  # the region the request being answered was signed for (aws:RequestedRegion)
        self.ended: dict[str, float] = {}  # instance id -> when TerminateInstances was asked
        self.placement = PlacementGroups(state_of=_state_of)
        self.images = Images(self)  # CreateImage ... DeregisterImage as EC2 answers them

    # --- WSGI ----------------------------------------------------------------------------------

    def __call__(self, environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        m = AUTH_RE.search(environ.get("HTTP_AUTHORIZATION", ""))
        akid, service = (m.group(1), m.group(3)) if m else ("", "")
        self.local.region = m.group(2) if m else REGION
        _HERE.region = m.group(2) if m and m.group(2) != "aws-global" else REGION  # moto serves each region apart
        role = self.roles.get(akid) if self.strict.iam else None
        if not role and akid == CONTROLLER_KEY and self.controller_policy is not None and self.strict.iam:
            role = CONTROLLER  # the controller runs under exactly the policy orch documents
        try:
            refused = self._controller_refused(service, environ, body) if role == CONTROLLER else None
            if refused:
                answer = refused
            elif service == "s3" and role:
                answer = self._s3(environ, body, role)
            elif service == "ec2":
                began = time.perf_counter()
                answer = self._ec2(environ, body, role)
                self.calls.append(Ec2Call(began, time.perf_counter(), self.local.region, *_call_of(body)))
            elif service == "iam":
                answer = self._iam_refused(body, role) or self._iam(environ, body)
            else:
                answer = self.forward(environ)
        except Exception as exc:  # a bug in the gate must be loud, not a hang
            answer = (
                "500 Internal Server Error",
                [("Content-Type", "text/plain")],
                f"fake cloud gate: {exc!r}".encode(),
            )
        status, headers, data = answer
        if service == "s3" and status.startswith("200") and _location_of(environ) in self.legacy_eu:
            data = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<LocationConstraint xmlns="{S3_NS}">EU</LocationConstraint>'
            )
            data = data.encode()
        if service == "s3" and environ.get("PATH_INFO", "").lstrip("/").split("/")[0] in self.kms_buckets:
            headers, data = _not_md5(headers, data)
        if environ["REQUEST_METHOD"] != "HEAD":  # a HEAD answer has no body but the object's length (S3 HeadObject)
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"] + [
                ("Content-Length", str(len(data)))
            ]
        start_response(status, headers)
        return [data] if environ["REQUEST_METHOD"] != "HEAD" else [b""]

    def forward(self, environ, body: bytes | None = None):
        if body is not None:
            environ["wsgi.input"] = io.BytesIO(body)
            environ["CONTENT_LENGTH"] = str(len(body))
        got = {}

        def start(status, headers, exc_info=None):
            got["status"], got["headers"] = status, headers
            return lambda data: chunks.append(data)

        chunks: list[bytes] = []
        with MOTO:
            result = self.app(environ, start)
            try:
                chunks.extend(result)
            finally:
                if hasattr(result, "close"):
                    result.close()
        return got["status"], got["headers"], b"".join(chunks)

    # --- EC2 -----------------------------------------------------------------------------------

    def _ec2(self, environ, body: bytes, role: str | None):
        form = parse_qs(body.decode(), keep_blank_values=True)
        action = form.get("Action", [""])[0]
        ids = [
            v[0]
            for k, v in form.items()
            if k.startswith("InstanceId.") or (action == "DeleteTags" and k.startswith("ResourceId."))
        ]
        if role and role != CONTROLLER:  # an instance: only what its role (under its boundary) allows, as IAM does
            for what, resource, ctx in self._ec2_checks(form):
                if not self._allowed(role, what, resource, ctx):
                    self.role_denied.append((role, what))
                    return self._ec2_error(
                        "UnauthorizedOperation", f"You are not authorized to perform this operation ({action}).", 403
                    )
        if action in ("DescribeInstances", "TerminateInstances"):
            fresh = [i for i in ids if self._is_young(i, self.strict.instance_s)]
            if fresh:
                return self._ec2_error("InvalidInstanceID.NotFound", f"The instance ID '{fresh[0]}' does not exist")
        if action in ("DescribeSecurityGroups", "AuthorizeSecurityGroupIngress", "DeleteSecurityGroup"):
            groups = [v[0] for k, v in form.items() if k.startswith("GroupId")]
            fresh = [g for g in groups if self._is_young(g, self.strict.group_s)]
            if fresh:
                return self._ec2_error("InvalidGroup.NotFound", f"The security group '{fresh[0]}' does not exist")
            if action == "DeleteSecurityGroup" and groups and self._in_use(groups[0]):
                return self._ec2_error("DependencyViolation", f"resource {groups[0]} has a dependent object")
        if action == "StopInstances":  # EC2 user guide, Stop a Spot Instance, Limitations
            spot = [i for i in ids if i in self.spot_ids]
            if spot:
                return self._ec2_error(
                    "UnsupportedOperation",
                    f"You can't stop the Spot Instance '{spot[0]}' because it is associated "
                    "with a one-time Spot Instance request. You can only stop Spot Instances associated with "
                    "persistent Spot Instance requests.",
                )
        if action in self.hold:
            self.held.append(action)
            self.hold[action].wait(300)  # (a test that forgets to set it still ends)
            return self._ec2_error("RequestExpired", f"{action}: the request was lost in transit (held by a test)")
        if action in self.garbled:
            self.counts[f"garbled:{action}"] += 1
            return "200 OK", [("Content-Type", "text/xml")], b"<garbled"
        if action == "CreateFleet":
            if self.region_capacity.get(getattr(_HERE, "region", None) or REGION) is None and self.spot_quota is None:
                return self._create_fleet(environ, form, role)
            # a region's capacity, or the account's spot quota, is counted and taken in one step, as EC2 does on its
            # side (two concurrent CreateFleets both counted one instance free, and both launched)
            with self.fleet_lock:
                return self._create_fleet(environ, form, role)
        if action == "GetSpotPlacementScores":
            return self._spot_placement_scores(form)
        if action in PLACEMENT_ACTIONS:
            answer = self.placement.answer(action, form, self._ec2_error, getattr(_HERE, "region", None) or REGION)
            if action == "CreatePlacementGroup" and answer[0].startswith("200"):
                self._born("pg:" + form.get("GroupName", [""])[0])  # CreateFleet may not know it for a moment
            return answer
        if action in IMAGE_ACTIONS:  # tests/fakecloud/images.py
            answer = self.images.answer(action, form, environ, body)
            if answer is not None:
                return answer
        answer = self.forward(environ)
        if action == "DescribeSpotPriceHistory" and answer[0].startswith("200"):
            times = [form.get(k, [""])[0] for k in ("StartTime", "EndTime")]
            answer = (answer[0], answer[1], spot_history(answer[2], self._offers, *times, price_of=self.price_of))
        if action == "DescribeInstanceTypeOfferings" and answer[0].startswith("200"):
            answer = (answer[0], answer[1], _drop_items(answer[2], self._offers, b"location"))
        if action == "CreateSecurityGroup" and answer[0].startswith("200"):
            for gid in set(re.findall(rb"sg-[0-9a-f]+", answer[2])):
                self._born(gid.decode())
        if action == "TerminateInstances" and answer[0].startswith("200"):
            for iid in ids:
                self._shut_down(iid)
        return answer

    def _create_fleet(self, environ, form, role: str | None = None):
        market = form.get("TargetCapacitySpecification.DefaultTargetCapacityType", ["on-demand"])[0]
        template_id = form.get("LaunchTemplateConfigs.1.LaunchTemplateSpecification.LaunchTemplateId", [""])[0]
        version = form.get("LaunchTemplateConfigs.1.LaunchTemplateSpecification.Version", ["1"])[0]
        data = _template_data(template_id, version)
        overrides = _overrides(form)
        if market == "spot" and not self._spot_role(role):
            self.counts["AuthFailure.ServiceLinkedRoleCreationNotPermitted"] += 1
            refusals = [(o, "AuthFailure.ServiceLinkedRoleCreationNotPermitted", SLR_REFUSED) for o in overrides]
            return self._fleet_errors(template_id, version, market, refusals)
        if market != "spot" and "spot-instances-request" in _template_tag_types(data):
            self.counts["InvalidParameterValue"] += len(overrides)
            refusals = [(o, "InvalidParameterValue", SPOT_TAGS_REFUSED) for o in overrides]
            return self._fleet_errors(template_id, version, market, refusals)
        profile = (data.get("IamInstanceProfile") or {}).get("Name", "")
        refused: list[tuple[dict, str, str]] = []
        kept: list[dict] = []
        subnet_of: dict[str, str] = {}
        for o in overrides:  # EC2 Fleet quotas: one request cannot span two subnets of one AZ
            az = _subnet_az(o.get("SubnetId", ""))
            if subnet_of.setdefault(az, o.get("SubnetId", "")) != o.get("SubnetId", ""):
                return self._ec2_error(
                    "InvalidParameterValue",
                    "An EC2 Fleet request can't span different subnets from the same "
                    f"Availability Zone ({subnet_of[az]}, {o.get('SubnetId')} in {az})",
                )
        sgs = data.get("SecurityGroupIds") or []
        # a group id of another region (or none) is not found here either: a group belongs to one region
        young_sg = [g for g in sgs if self._is_young(g, self.strict.group_s)] or _absent_groups(sgs)
        if market == "spot" and self.spot_quota is not None:
            live = sum(1 for i in self.spot_ids if _state_of(i) in ("pending", "running") or self._lingers(i))
            if live + int(form.get("TargetCapacitySpecification.TotalTargetCapacity", ["1"])[0]) > self.spot_quota:
                # EC2: "You have requested more vCPU capacity than your current vCPU limit … allows" (a fleet Error)
                self.counts["MaxSpotInstanceCountExceeded"] += 1
                return self._fleet_errors(
                    template_id,
                    version,
                    market,
                    [
                        (
                            o,
                            "MaxSpotInstanceCountExceeded",
                            f"Max spot instance count exceeded ({live} running; limit {self.spot_quota})",
                        )
                        for o in overrides[:1]
                    ],
                )
        full = self._region_full(market, int(form.get("TargetCapacitySpecification.TotalTargetCapacity", ["1"])[0]))
        if full:
            self.counts["InsufficientInstanceCapacity"] += len(overrides)
            refusals = [(o, "InsufficientInstanceCapacity", full) for o in overrides]
            return self._fleet_errors(template_id, version, market, refusals)
        for o in overrides:
            az = _subnet_az(o.get("SubnetId", ""))
            code = self._injected(market, o.get("InstanceType", ""), az)
            group = o.pop("Placement.GroupName", "")
            placed = self.placement.refusal(group, az) if group else None
            if group and self._is_young("pg:" + group, self.strict.group_s):  # eventual consistency, as for ids
                refused.append((o, "InvalidPlacementGroup.Unknown", f"The Placement Group '{group}' is unknown."))
            elif young_sg:
                refused.append((o, "InvalidGroup.NotFound", f"The security group '{young_sg[0]}' does not exist"))
            elif placed:
                refused.append((o, *placed))
            elif profile and self._is_young(profile, self.strict.profile_s):
                # as a real answer pairs them (karpenter-provider-aws issue 3051): the propagation error, and a capacity
                # error
                refused.append((o, "InvalidParameterValue", PROFILE_ERROR.format(name=profile)))
                refused.append(
                    (
                        o,
                        "UnfulfillableCapacity",
                        "Unable to fulfill capacity due to your request configuration. "
                        "Please adjust your request and try again.",
                    )
                )
            elif not self._offers(o.get("InstanceType", ""), az):
                refused.append((o, "InvalidFleetConfiguration", UNOFFERED.format(t=o.get("InstanceType"), az=az)))
            elif code:
                refused.append((o, code, f"injected by the fake cloud for ({market}, {o.get('InstanceType')}, {az})"))
            else:
                kept.append({**o, "_group": group, "_az": az})
        for _, code, _ in refused:
            self.counts[code] += 1
        wanted = int(form.get("TargetCapacitySpecification.TotalTargetCapacity", ["1"])[0])
        least = int(form.get(f"{'SpotOptions' if market == 'spot' else 'OnDemandOptions'}.MinTargetCapacity", ["0"])[0])
        for o in [
            o for o in kept if least and (self._capacity(market, o.get("InstanceType", ""), o["_az"]) or wanted) < least
        ]:
            kept.remove(o)  # MinTargetCapacity: EC2 launches nothing rather than too few
            refused.append(
                (
                    o,
                    "InsufficientInstanceCapacity",
                    f"fewer than {least} {o.get('InstanceType')} in {o['_az']} (fake cloud)",
                )
            )
            self.counts["InsufficientInstanceCapacity"] += 1
        if not kept:
            return self._fleet_errors(template_id, version, market, refused)
        kept = [self._allocated(form, market, kept)]  # EC2 takes one pool by its allocation strategy, not by order
        new_form = [
            (k, v)
            for k, v in parse_qsl(urlencode(form, doseq=True), keep_blank_values=True)
            if not k.startswith("LaunchTemplateConfigs.1.Overrides.")
        ]
        for n, o in enumerate(kept, start=1):
            new_form += [
                (f"LaunchTemplateConfigs.1.Overrides.{n}.{k}", v) for k, v in o.items() if not k.startswith("_")
            ]
        caps = [c for o in kept if (c := self._capacity(market, o.get("InstanceType", ""), o["_az"])) is not None]
        cap = min(caps) if caps else None
        if cap is not None:
            self.counts["partial"] += 1
            new_form = [
                (k, str(cap) if k == "TargetCapacitySpecification.TotalTargetCapacity" and int(v) > cap else v)
                for k, v in new_form
            ]
        with (
            MOTO
        ):  # launched and made `pending` in one step: no DescribeInstances between sees a new instance `running`
            return self._launched(self.forward(environ, urlencode(new_form).encode()), data, profile, kept, market)

    def _allocated(self, form, market: str, kept: list[dict]) -> dict:
        """The pool EC2 launches from, as its allocation strategies are documented (docs/aws.md): `lowest-price` and
        `price-capacity-optimized` the lowest price — per unit hour with weights (`WeightedCapacity`), unless every
        weight is above the target capacity (then per instance hour) — among the pools with capacity (those left
        here); `prioritized` and `capacity-optimized-prioritized` the lowest Priority. Never the order of the
        overrides: EC2 does not promise it (moto takes the first). Its weight goes: moto would count units, not
        instances."""
        options = "SpotOptions" if market == "spot" else "OnDemandOptions"
        strategy = form.get(f"{options}.AllocationStrategy", ["lowest-price"])[0]
        wanted = float(form.get("TargetCapacitySpecification.TotalTargetCapacity", ["1"])[0])
        weights = [float(o.get("WeightedCapacity") or 1) for o in kept]
        per_unit = any(w <= wanted for w in weights)

        def cost(o: dict, weight: float) -> tuple:
            if strategy.endswith("prioritized"):
                return (float(o.get("Priority") or 0),)
            itype = o.get("InstanceType", "")
            price = self.price_of(itype, o["_az"]) if market == "spot" else ON_DEMAND.get(itype, 0.10)
            return (price / weight if per_unit else price, itype, o["_az"])

        chosen = min(zip(kept, weights), key=lambda ow: cost(*ow))[0]
        self.allocated.append((market, chosen.get("InstanceType", ""), chosen["_az"], strategy))
        return {k: v for k, v in chosen.items() if k != "WeightedCapacity"}

    def _region_full(self, market: str, wanted: int) -> str | None:
        """Why the request's region cannot hold `wanted` more spot instances (`region_capacity`), or None."""
        region = getattr(_HERE, "region", None) or REGION
        room = self.region_capacity.get(region)
        if market != "spot" or room is None:
            return None
        with MOTO:
            live = sum(
                1
                for r in list(_ec2_backend(region).reservations.values())
                for i in r.instances
                if i.id in self.spot_ids and i._state.name in ("pending", "running", "shutting-down")
            )
        if live + wanted <= room:
            return None
        return f"There is no Spot capacity available in {region} ({live} of {room} taken; fake cloud)"

    def _launched(self, answer: tuple, data: dict, profile: str | None, kept: list, market: str = "on-demand") -> tuple:
        if answer[0].startswith("200"):
            groups = list(
                data.get("SecurityGroupIds")
                or [g for nic in data.get("NetworkInterfaces") or [] for g in nic.get("Groups", [])]
            )
            for iid in set(re.findall(rb"i-[0-9a-f]{8,17}", answer[2])):
                iid = iid.decode()
                self._born(iid)
                if market == "spot":
                    self.spot_ids.add(iid)
                self.groups_of[iid] = groups
                if profile:
                    self.profile_of[iid] = profile
                if kept[0]["_group"]:
                    self.placement.joined(iid, kept[0]["_group"], kept[0]["_az"])
                self._pending(iid)
        return answer

    def _spot_role(self, role: str | None) -> bool:
        """The spot service-linked role exists, or EC2 makes it now with the caller's rights (EC2 user guide,
        "Service-linked role for Spot Instance requests"); an unchecked caller (the harness) may."""
        if SPOT_SLR not in self.service_roles and (
            role is None or self._allowed(role, *_slr_check(SPOT_SERVICE, SPOT_SLR))
        ):
            self.service_roles.add(SPOT_SLR)
        return SPOT_SLR in self.service_roles

    def _injected(self, market: str, itype: str, az: str) -> str | None:
        for (m, t, a), code in self.fleet_errors.items():
            if m in ("*", market) and t in ("*", itype) and a in ("*", az):
                return code
        return None

    def _offers(self, itype: str, az: str) -> bool:
        return not any(t in ("*", itype) and fnmatch.fnmatchcase(az, a) for t, a in self.unoffered)

    def price_of(self, itype: str, az: str, age_s: float = 0.0) -> float:
        """The spot price of (type, AZ) `age_s` ago in the history given (`spot_prices`, else the example)."""
        set_here = self.spot_prices.get((itype, az))
        return spot_price(itype, az, age_s) if set_here is None else set_here

    def _capacity(self, market: str, itype: str, az: str) -> int | None:
        for (m, t, a), k in self.fleet_capacity.items():
            if m in ("*", market) and t in ("*", itype) and a in ("*", az):
                return k
        return None

    def _fleet_errors(self, template_id: str, version: str, market: str, refused) -> tuple:
        items = "".join(
            f"<item><launchTemplateAndOverrides><launchTemplateSpecification><launchTemplateId>{template_id}</launchTemplateId>"
            f"<version>{version}</version></launchTemplateSpecification><overrides>"
            f"<instanceType>{o.get('InstanceType', '')}</instanceType>"
            f"<subnetId>{o.get('SubnetId', '')}</subnetId></overrides></launchTemplateAndOverrides>"
            f"<lifecycle>{market}</lifecycle>"
            f"<errorCode>{code}</errorCode><errorMessage>{_xml(msg)}</errorMessage></item>"
            for o, code, msg in refused
        )
        xml = (
            f'<?xml version="1.0" encoding="UTF-8"?><CreateFleetResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
            f"<requestId>{uuid.uuid4()}</requestId><fleetId>fleet-{uuid.uuid4().hex[:17]}</fleetId>"
            f"<errorSet>{items}</errorSet><fleetInstanceSet/></CreateFleetResponse>"
        )
        return "200 OK", [("Content-Type", "text/xml")], xml.encode()

    def _spot_placement_scores(self, form: dict[str, list[str]]) -> tuple:
        """GetSpotPlacementScores as the EC2 User Guide describes it: at least three instance types (else an error),
        per AZ id with SingleAvailabilityZone (else per region), the top 10, best first."""
        types = {v[0] for k, v in form.items() if k.startswith("InstanceType.")}
        if len(types) < 3:
            return self._ec2_error("InvalidParameterValue", "You must specify at least three instance types.")
        regions = [v[0] for k, v in sorted(form.items()) if k.startswith("RegionName.")] or [self.local.region]
        per_az = form.get("SingleAvailabilityZone", ["false"])[0] == "true"
        items = []
        for region in regions:
            zones = _ec2_backend(region).describe_availability_zones()
            scores = [(self.placement_scores.get(z.name, 5), z.zone_id) for z in zones]
            if per_az:
                items += [(score, region, f"<availabilityZoneId>{zid}</availabilityZoneId>") for score, zid in scores]
            else:
                items.append((max(score for score, _ in scores), region, ""))
        body = "".join(
            f"<item><region>{region}</region>{az}<score>{score}</score></item>"
            for score, region, az in sorted(items, key=lambda i: -i[0])[:10]
        )
        xml = (
            f'<GetSpotPlacementScoresResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>'
            f"{uuid.uuid4()}</requestId><spotPlacementScoreSet>{body}</spotPlacementScoreSet>"
            "</GetSpotPlacementScoresResponse>"
        )
        return "200 OK", [("Content-Type", "text/xml")], xml.encode()

    def _ec2_error(self, code: str, message: str, status: int = 400) -> tuple:
        self.counts[code] += 1
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error>'
            f"<Code>{code}</Code><Message>{_xml(message)}</Message>"
            f"</Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
        )
        return (
            f"{status} {'Bad Request' if status == 400 else 'Forbidden'}",
            [("Content-Type", "text/xml")],
            xml.encode(),
        )

    # --- state changes AWS makes slowly ----------------------------------------------------------

    def _born(self, key: str) -> None:
        with self.lock:
            self.young[key] = time.monotonic()

    def _is_young(self, key: str, window: float) -> bool:
        with self.lock:
            born = self.young.get(key)
        return born is not None and time.monotonic() - born < window

    def _pending(self, iid: str) -> None:
        inst = _instance(iid)
        if inst is None or self.strict.pending_s <= 0:
            return
        with MOTO:
            inst._state.name, inst._state.code = "pending", 0

        def run():
            with MOTO:
                if inst._state.name == "pending":
                    inst._state.name, inst._state.code = "running", 16

        _later(self.strict.pending_s, run)

    def _lingers(self, iid: str) -> bool:
        """A terminated instance goes on counting toward instance quotas for a while (EC2 Developer Guide,
        "Eventual consistency", InstanceLimitExceeded)."""
        with self.lock:
            ended = self.ended.get(iid)
        return ended is not None and time.monotonic() - ended < self.strict.quota_linger_s

    def _shut_down(self, iid: str) -> None:
        with self.lock:
            self.ended.setdefault(iid, time.monotonic())
        inst = _instance(iid)
        if inst is None or self.strict.terminate_s <= 0 or inst._state.name != "terminated":
            return
        with MOTO:
            inst._state.name, inst._state.code = "shutting-down", 32

        def done():
            with MOTO:
                inst._state.name, inst._state.code = "terminated", 48

        _later(self.strict.terminate_s, done)

    def _in_use(self, group_id: str) -> bool:
        for iid, groups in list(self.groups_of.items()):
            inst = _instance(iid)
            if group_id in groups and inst is not None and inst._state.name != "terminated":
                return True
        return False

    # --- IAM -----------------------------------------------------------------------------------

    def _iam(self, environ, body: bytes):
        form = parse_qs(body.decode(), keep_blank_values=True)
        action = form.get("Action", [""])[0]
        if action == "CreateServiceLinkedRole" and form.get("AWSServiceName", [""])[0] == SPOT_SERVICE:
            return self._spot_service_role()
        answer = self.forward(environ)
        if action in ("CreateInstanceProfile", "AddRoleToInstanceProfile") and answer[0].startswith("200"):
            self._born(form.get("InstanceProfileName", [""])[0])
        return answer

    def _spot_service_role(self) -> tuple:
        """IAM's CreateServiceLinkedRole for spot: made once; again, InvalidInput "... has been taken"."""
        if SPOT_SLR in self.service_roles:
            xml = (
                '<ErrorResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/"><Error><Type>Sender</Type>'
                f"<Code>InvalidInput</Code><Message>Service role name {SPOT_SLR} has been taken in this account, "
                f"please try a different suffix.</Message></Error><RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>"
            )
            return "400 Bad Request", [("Content-Type", "text/xml")], xml.encode()
        self.service_roles.add(SPOT_SLR)
        arn = _iam_arn("role", f"aws-service-role/{SPOT_SERVICE}/{SPOT_SLR}")
        xml = (
            '<CreateServiceLinkedRoleResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/">'
            f"<CreateServiceLinkedRoleResult><Role><Path>/aws-service-role/{SPOT_SERVICE}/</Path>"
            f"<RoleName>{SPOT_SLR}</RoleName><RoleId>AROA{uuid.uuid4().hex[:16].upper()}</RoleId><Arn>{arn}</Arn>"
            "<CreateDate>2026-01-01T00:00:00Z</CreateDate><AssumeRolePolicyDocument>%7B%7D</AssumeRolePolicyDocument>"
            "</Role></CreateServiceLinkedRoleResult>"
            f"<ResponseMetadata><RequestId>{uuid.uuid4()}</RequestId></ResponseMetadata>"
            "</CreateServiceLinkedRoleResponse>"
        )
        return "200 OK", [("Content-Type", "text/xml")], xml.encode()

    def _iam_refused(self, body: bytes, role: str | None) -> tuple | None:
        """An instance's IAM call: only what its role allows (a remote controller's role allows none)."""
        if not role or role == CONTROLLER:
            return None
        for what, resource, ctx in self._iam_checks(parse_qs(body.decode(), keep_blank_values=True)):
            if not self._allowed(role, what, resource, ctx):
                self.role_denied.append((role, what))
                xml = (
                    '<ErrorResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/"><Error><Type>Sender</Type>'
                    f"<Code>AccessDenied</Code><Message>{_xml(f'{role} is not authorized to perform: {what}')}"
                    f"</Message></Error><RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>"
                )
                return "403 Forbidden", [("Content-Type", "text/xml")], xml.encode()
        return None

    def _controller_refused(self, service: str, environ, body: bytes) -> tuple | None:
        """Every call of the controller (but S3's, which _s3 checks) against the documented policy, with the
        resources and condition keys IAM evaluates for it (Service Authorization Reference): resource tags,
        ec2:CreateAction for tags written at creation, iam:PermissionsBoundary, iam:PassedToService. A service
        the gate does not model is refused: fail closed."""
        if service == "s3":
            return None
        if service == "sts":  # GetCallerIdentity needs no permission (STS API reference)
            return None
        if service == "ec2":
            checks = self._ec2_checks(parse_qs(body.decode(), keep_blank_values=True))
        elif service == "iam":
            checks = self._iam_checks(parse_qs(body.decode(), keep_blank_values=True))
        elif service == "kms":
            checks = self._kms_checks(environ, body)
        else:
            target = environ.get("HTTP_X_AMZ_TARGET", "").rpartition(".")[2]
            checks = [(f"{service}:{target or environ.get('REQUEST_METHOD', '?')}", "*", {})]
        for what, resource, ctx in checks:
            if not self._allowed(CONTROLLER, what, resource, ctx):
                self.denied.append(what)
                message = (
                    f"User: orch is not authorized to perform: {what} on resource: {resource} "
                    "(not allowed by the policy `orch aws policy` prints)"
                )
                if service == "ec2":
                    return self._ec2_error("UnauthorizedOperation", message, 403)
                self.counts["AccessDenied"] += 1
                if service == "iam":
                    xml = (
                        '<ErrorResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/"><Error><Type>Sender</Type>'
                        f"<Code>AccessDenied</Code><Message>{_xml(message)}</Message></Error>"
                        f"<RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>"
                    )
                    return "403 Forbidden", [("Content-Type", "text/xml")], xml.encode()
                doc = {"__type": "AccessDeniedException", "message": message}
                return "400 Bad Request", [("Content-Type", "application/x-amz-json-1.1")], json.dumps(doc).encode()
        return None

    def _ec2_checks(self, form: dict[str, list[str]]) -> list[tuple[str, str, dict[str, str]]]:
        action = form.get("Action", [""])[0]
        existing = [(_ec2_arn(rid), _resource_keys(rid, self.placement)) for rid in _ec2_targets(action, form)]
        keys = [v[0] for k, v in sorted(form.items()) if re.fullmatch(r"Tag\.\d+\.Key", k)]
        if action in ("CreateTags", "DeleteTags") and keys:  # the request's tag keys (absent without tags, as IAM)
            existing = [(arn, {**tags, "aws:TagKeys": keys}) for arn, tags in existing]
        checks = [(f"ec2:{action}", arn, tags) for arn, tags in existing] or [(f"ec2:{action}", "*", {})]
        if action == "CreateImage":  # the image and its snapshots are resources of the call too, with its tags
            ctx = _request_tags(form)
            checks += [("ec2:CreateImage", _ec2_arn("ami-new"), ctx), ("ec2:CreateImage", _ec2_arn("snap-new"), ctx)]
        if action in ("RunInstances", "CreateFleet"):
            return _launch_checks(action, form, self.placement)
        if action == "CopyImage":
            checks = _copy_image_checks(form)
        for kind in _tag_specification_types(form):  # tags written at creation: CreateTags, with the creating API
            checks.append(("ec2:CreateTags", _ec2_arn(f"{kind}/new"), {"ec2:CreateAction": action}))
        return checks

    def _iam_checks(self, form: dict[str, list[str]]) -> list[tuple[str, str, dict[str, str]]]:
        action = form.get("Action", [""])[0]
        role = form.get("RoleName", [""])[0]
        profile = form.get("InstanceProfileName", [""])[0]
        if profile:
            resource = _iam_arn("instance-profile", profile)
        elif role:
            resource = _iam_arn("role", role)
        elif action in (
            "CreatePolicy",
            "CreatePolicyVersion",
            "DeletePolicy",
            "DeletePolicyVersion",
            "SetDefaultPolicyVersion",
        ):
            resource = form.get("PolicyArn", [_iam_arn("policy", form.get("PolicyName", [""])[0])])[0]
        else:
            resource = "*"
        ctx: dict[str, str] = {}
        if action == "CreateServiceLinkedRole":
            service = form.get("AWSServiceName", [""])[0]
            return [_slr_check(service, SPOT_SLR if service == SPOT_SERVICE else "AWSServiceRole")]
        if action == "CreateRole":
            if form.get("PermissionsBoundary"):
                ctx["iam:PermissionsBoundary"] = form["PermissionsBoundary"][0]
        elif role and not profile:
            ctx.update(_role_tags(role))
            boundary = _role_boundary(role)  # the key is the boundary the role has now
            if boundary:
                ctx["iam:PermissionsBoundary"] = boundary
            if action == "PutRolePermissionsBoundary":
                ctx["iam:PermissionsBoundary"] = form.get("PermissionsBoundary", [""])[0]
        if form.get("PolicyArn"):
            ctx["iam:PolicyARN"] = form["PolicyArn"][0]
        checks = [(f"iam:{action}", resource, ctx)]
        if action in ("CreateRole", "CreateInstanceProfile") and any(k.startswith("Tags.member.") for k in form):
            checks.append((f"iam:Tag{'Role' if action == 'CreateRole' else 'InstanceProfile'}", resource, {}))
        if action == "AddRoleToInstanceProfile":  # its caller must be allowed to pass the role (IAM API reference)
            checks.append(("iam:PassRole", _iam_arn("role", role), {"iam:PassedToService": "ec2.amazonaws.com"}))
        return checks

    def _kms_checks(self, environ, body: bytes) -> list[tuple[str, str, dict[str, str]]]:
        action = environ.get("HTTP_X_AMZ_TARGET", "").rpartition(".")[2]
        try:
            key = json.loads(body or b"{}").get("KeyId", "")
        except ValueError:
            key = ""
        return [(f"kms:{action}", _kms_key_arn(key) if key else "*", {})]

    def delivered(self, access_key: str, role: str, instance_id: str) -> None:
        """Credentials of `role` that the fake IMDS handed to `instance_id`: IAM sees ec2:SourceInstanceARN."""
        self.roles[access_key] = on_instance(role, instance_id)

    def _allowed(self, role: str, action: str, resource: str, context: dict[str, str]) -> bool:
        """IAM's evaluation (IAM user guide, "Policy evaluation logic") for one (action, resource, context): an
        explicit Deny wins, else some Allow is needed, in the identity policies and, for a role with a
        permissions boundary, in the boundary too."""
        region = getattr(self.local, "region", None) or REGION  # a test's direct question: the fake's region
        context = {
            "aws:PrincipalAccount": ACCOUNT,
            "aws:RequestedRegion": region,
            **getattr(role, "context", {}),
            **context,
        }
        if role == CONTROLLER:
            return evaluate([self.controller_policy], action, resource, context)
        if not evaluate(self.policy_source(role) if self.policy_source else [], action, resource, context):
            return False
        boundary = self.boundary_source(role) if self.boundary_source else None
        return boundary is None or evaluate([boundary], action, resource, context)

    # --- S3 with role credentials ----------------------------------------------------------------

    def _s3(self, environ, body: bytes, role: str):
        method = environ["REQUEST_METHOD"]
        path = environ.get("PATH_INFO", "").lstrip("/")
        bucket, _, key = path.partition("/")
        if not _bucket_exists(bucket):  # S3 says NoSuchBucket (404) before it evaluates any policy
            return self.forward(environ)
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        bucket_arn = f"arn:aws:s3:::{bucket}"
        checks: list[tuple[str, str, dict[str, str]]] = []
        if not key:
            if method == "GET" and ("list-type" in query or not query or "prefix" in query):
                ctx = {"s3:prefix": query["prefix"][0]} if "prefix" in query else {}
                checks.append(("s3:ListBucket", bucket_arn, ctx))
            elif method == "HEAD":
                checks.append(("s3:ListBucket", bucket_arn, {}))
            elif method == "GET" and "encryption" in query:  # GetBucketEncryption's IAM action (S3 actions reference)
                checks.append(("s3:GetEncryptionConfiguration", bucket_arn, {}))
            elif method == "POST" and "delete" in query:
                for k in re.findall(rb"<Key>(.*?)</Key>", body):
                    checks.append(("s3:DeleteObject", f"{bucket_arn}/{k.decode()}", {}))
            else:
                checks.append(("s3:" + method.title() + "Bucket" + "".join(q.title() for q in query), bucket_arn, {}))
        else:
            obj = f"{bucket_arn}/{key}"
            if method in ("GET", "HEAD"):
                checks.append(("s3:GetObject", obj, {}))
            elif method in ("PUT", "POST"):
                checks.append(("s3:PutObject", obj, {}))
            elif method == "DELETE":
                checks.append(("s3:AbortMultipartUpload" if "uploadId" in query else "s3:DeleteObject", obj, {}))
        for action, resource, ctx in checks:
            if not self._allowed(role, action, resource, ctx):
                if role == CONTROLLER:
                    self.denied.append(action)
                return self._s3_denied()
        answer = self.forward(environ)
        if (
            key
            and method in ("GET", "HEAD")
            and answer[0].startswith("404")
            and not self._allowed(role, "s3:ListBucket", bucket_arn, {})
        ):
            return self._s3_denied()  # S3 hides whether a key exists from callers who may not list
        return answer

    def _s3_denied(self) -> tuple:
        self.counts["AccessDenied"] += 1
        xml = (
            f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message>'
            f"<RequestId>{uuid.uuid4().hex}</RequestId></Error>"
        )
        return "403 Forbidden", [("Content-Type", "application/xml")], xml.encode()


# --- moto's in-process state -----------------------------------------------------------------------


def _not_md5(headers: list, data: bytes) -> tuple:
    """ETags as S3 gives them for SSE-KMS objects: not the MD5 of the content (S3 API reference, *Common
    Response Headers*: "Objects encrypted by SSE-C or SSE-KMS have ETags that are not an MD5 digest"),
    the same for an object in a listing and on GET/HEAD."""

    def other(etag: str) -> str:
        return hashlib.sha256(etag.strip('"').encode()).hexdigest()[:32]

    headers = [(k, f'"{other(v)}"' if k.lower() == "etag" else v) for k, v in headers]
    data = re.sub(
        rb"<ETag>(&quot;|\")?([0-9a-f-]+)(&quot;|\")?</ETag>",
        lambda m: b"<ETag>&quot;" + other(m.group(2).decode()).encode() + b"&quot;</ETag>",
        data,
    )
    return headers, data


S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"


def _location_of(environ) -> str:
    """The bucket a GetBucketLocation request (GET /BUCKET?location) asks about; "" for any other request."""
    bucket, _, key = environ.get("PATH_INFO", "").lstrip("/").partition("/")
    query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    return bucket if environ.get("REQUEST_METHOD") == "GET" and not key and "location" in query else ""


def _bucket_exists(name: str) -> bool:
    from moto.s3.models import s3_backends

    with MOTO:
        return name in s3_backends[ACCOUNT]["aws"].buckets


_HERE = threading.local()  # the region of the request this thread answers (from its signature)


def _ec2_backend(region: str | None = None):
    """moto's EC2 of `region`, by default the region of the request being answered (else us-east-1)."""
    from moto.ec2.models import ec2_backends

    return ec2_backends[ACCOUNT][region or getattr(_HERE, "region", None) or REGION]


def _ec2_backends() -> list:
    """moto's EC2 of every region anything was asked of (moto makes a region's on first use)."""
    from moto.ec2.models import ec2_backends

    return list(ec2_backends[ACCOUNT].values())


def running_instances() -> dict[str, dict]:
    """{instance id: {"PrivateIpAddress", "AvailabilityZone", "ImageId", "InstanceType"}} of every running instance in
    every region, as moto holds them."""
    with MOTO:
        return {
            i.id: {
                "PrivateIpAddress": i.private_ip,
                "AvailabilityZone": i.placement.zone,
                "ImageId": i.image_id,
                "InstanceType": i.instance_type,
            }
            for backend in _ec2_backends()
            for r in list(backend.reservations.values())
            for i in r.instances
            if i._state.name == "running"
        }


def os_shutdown(iid: str) -> None:
    """The instance's OS powered off and its shutdown behaviour is `terminate`: EC2 terminates it (no API call:
    nothing the gate refuses applies)."""
    with MOTO:
        _ec2_backend().terminate_instances([iid])


def _instance(iid: str):
    """An instance by id, in whichever region holds it (timers answer outside any request)."""
    with MOTO:
        for backend in _ec2_backends():
            try:
                return backend.get_instance(iid)
            except Exception:
                continue
        return None


def _state_of(iid: str) -> str | None:
    with MOTO:
        inst = _instance(iid)
        return inst._state.name if inst is not None else None


def _instance_tags(iid: str) -> dict[str, str]:
    with MOTO:
        inst = _instance(iid)
        return {t["key"]: t["value"] for t in inst.get_tags()} if inst is not None else {}


def _template_tag_types(data: dict) -> set[str]:
    """The resource types a launch template version's TagSpecifications name."""
    return {spec.get("ResourceType", "") for spec in data.get("TagSpecifications") or []}


def _template_data(template_id: str, version: str) -> dict:
    with MOTO:
        try:
            return dict(_ec2_backend().get_launch_template(template_id).get_version(version).data)
        except Exception:
            return {}


def _absent_groups(ids: list[str]) -> list[str]:
    """The ids no security group of the request's region has (moto would launch with them)."""
    with MOTO:
        here = _ec2_backend()
        return [g for g in ids if here.get_security_group_from_id(g) is None]


def _subnet_az(subnet_id: str) -> str:
    with MOTO:
        try:
            return _ec2_backend().get_subnet(subnet_id).availability_zone
        except Exception:
            return ""


def _overrides(form: dict[str, list[str]]) -> list[dict]:
    found: dict[int, dict] = {}
    for k, v in form.items():
        m = re.match(r"LaunchTemplateConfigs\.1\.Overrides\.(\d+)\.(.+)$", k)
        if m:
            found.setdefault(int(m.group(1)), {})[m.group(2)] = v[0]
    return [found[n] for n in sorted(found)]


def _later(seconds: float, fn: Callable[[], None]) -> None:
    t = threading.Timer(seconds, fn)
    t.daemon = True
    t.start()


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _matches(patterns, value: str, fold: bool = False, context: dict[str, str] | None = None) -> bool:
    """Action patterns (`fold`: IAM's action names ignore case), or Resource ARN patterns (`context`: their policy
    variables filled in, as IAM does, only after the fifth colon)."""
    if patterns is None:
        return False
    for p in patterns if isinstance(patterns, list) else [patterns]:
        p = _resource_variables(p, context) if context is not None else p
        if fnmatch.fnmatchcase(value.lower() if fold else value, p.lower() if fold else p):
            return True
    return False


def _resource_variables(pattern: str, context: dict[str, str]) -> str:
    """A Resource ARN pattern with its policy variables filled in "only in the resource portion of the ARN. This
    portion of the ARN appears after the fifth colon (:). You can't use a variable to replace parts of the ARN before
    the fifth colon, such as the service or account." (IAM user guide, "IAM policy elements: Variables and tags"):
    one before it stays as written, and matches no ARN."""
    depth, colons = 0, 0
    for i, ch in enumerate(pattern):
        if pattern.startswith("${", i):
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
        elif ch == ":" and not depth:
            colons += 1
            if colons == 5:
                return pattern[:i] + _substitute(pattern[i:], context)
    return pattern


def _substitute(value: str, context: dict[str, str]) -> str:
    """Policy variables (`${aws:PrincipalAccount}`): replaced with the request's value of that key (IAM user
    guide, "IAM policy elements: Variables and tags")."""
    return re.sub(r"\$\{([^}]+)\}", lambda m: context.get(m.group(1), "\x00unresolved"), value)


STRING_OPS = {
    "StringEquals": lambda got, want: got == want,
    "StringLike": lambda got, want: fnmatch.fnmatchcase(got, want),
    "ArnEquals": lambda got, want: got == want,
    "ArnLike": lambda got, want: fnmatch.fnmatchcase(got, want),
}
# The negated operators hold when the key matches none of the values, and where the key is absent (IAM user
# guide, "Condition operators": a negated operator with a missing key evaluates to true).
NEGATED = {"StringNotEquals": "StringEquals", "StringNotLike": "StringLike", "ArnNotEquals": "ArnEquals"}


def _conditions_hold(condition: dict, context: dict[str, object]) -> bool:
    """Every operator and key must hold (AND); any of a key's values may match (OR). Null tests a key's presence;
    ...IfExists holds where the key is absent; a multivalued key (`aws:TagKeys`, a list) needs a set operator:
    ForAllValues holds when every request value matches (so also when the key is absent, as in IAM: pair it with
    Null), ForAnyValue when one does. An operator the gate does not know fails closed."""
    for op, pairs in condition.items():
        qualifier, _, op = op.rpartition(":") if op.startswith(("ForAllValues:", "ForAnyValue:")) else ("", "", op)
        for key, wanted in pairs.items():
            got = context.get(key)
            wanted = [_substitute(str(w), context) for w in (wanted if isinstance(wanted, list) else [wanted])]
            if op == "Null":
                if (got is None or got == []) != (wanted[0].lower() == "true"):
                    return False
                continue
            base = op[: -len("IfExists")] if op.endswith("IfExists") else op
            if base in NEGATED and not qualifier and not isinstance(got, list):
                if got is not None and any(STRING_OPS[NEGATED[base]](got, w) for w in wanted):
                    return False
                continue
            if base not in STRING_OPS:
                return False
            if qualifier or isinstance(got, list):
                items = got if isinstance(got, list) else ([] if got is None else [got])
                matched = [any(STRING_OPS[base](i, w) for w in wanted) for i in items]
                if not qualifier or not (all(matched) if qualifier == "ForAllValues" else any(matched)):
                    return False
                continue
            if got is None:
                if op.endswith("IfExists"):
                    continue
                return False
            if not any(STRING_OPS[base](got, w) for w in wanted):
                return False
    return True


def evaluate(docs: list[dict], action: str, resource: str, context: dict[str, str]) -> bool:
    """Allowed by these policy documents: some Allow matches and no Deny does."""
    allow = False
    for doc in docs:
        statements = doc.get("Statement", [])
        for st in statements if isinstance(statements, list) else [statements]:
            if not (
                _matches(st.get("Action"), action, fold=True)
                and _matches(st.get("Resource"), resource, context=context)
                and _conditions_hold(st.get("Condition") or {}, context)
            ):
                continue
            if st.get("Effect") == "Deny":
                return False
            allow = True
    return allow


# --- what IAM evaluates a controller call on ---------------------------------------------------------

EC2_KINDS = {
    "i": "instance",
    "sg": "security-group",
    "lt": "launch-template",
    "ami": "image",
    "snap": "snapshot",
    "vol": "volume",
    "fleet": "fleet",
    "subnet": "subnet",
    "vpc": "vpc",
}


def _ec2_arn(resource: str) -> str:
    """arn:aws:ec2:... of an id (`i-…`, `sg-…`, …) or of `kind/name`; images and snapshots have no account."""
    kind, _, name = resource.partition("/")
    if not name:
        kind, name = EC2_KINDS.get(resource.split("-", 1)[0], "unknown"), resource
    account = "" if kind in ("image", "snapshot") else ACCOUNT
    return f"arn:aws:ec2:{getattr(_HERE, 'region', None) or REGION}:{account}:{kind}/{name}"


def _iam_arn(kind: str, name: str) -> str:
    return f"arn:aws:iam::{ACCOUNT}:{kind}/{name}"


def _slr_check(service: str, name: str) -> tuple[str, str, dict[str, str]]:
    """What IAM evaluates for CreateServiceLinkedRole (Service Authorization Reference: the role, and the
    iam:AWSServiceName key)."""
    return (
        "iam:CreateServiceLinkedRole",
        _iam_arn("role", f"aws-service-role/{service}/{name}"),
        {"iam:AWSServiceName": service},
    )


# --- what IAM evaluates a launch on (RunInstances, CreateFleet) --------------------------------------------------
# Service Authorization Reference, "Actions, resources, and condition keys for Amazon EC2": the resource types each
# action authorizes, each with its own keys. CreateFleet authorizes its own list, and its instant fleet launches with
# the caller's rights (RunInstances on everything RunInstances takes) and passes the profile's role.
FLEET_TYPES = {"fleet", "instance", "image", "launch-template", "placement-group", "subnet", "volume"}
AMAZON_ACCOUNT = "801119661308"  # the owner of moto's Amazon images and their snapshots: ec2:Owner "amazon"


@dataclass
class Launch:
    """What one RunInstances or CreateFleet asks for, the launch template's data filled in as EC2 does."""

    template: str  # launch-template id, or ""
    data: dict  # the template version's data
    tags: dict[str, dict[str, str]]  # resource type -> tags of the request (the template's, the request's over them)
    types: list[str]
    image: str
    subnets: list[str]
    groups: list[str]
    snapshots: list[str]
    placement: list[str]
    spot: bool


def _launch(action: str, form: dict[str, list[str]]) -> Launch:
    def one(key: str, default: str = "") -> str:
        return form.get(key, [default])[0]

    def many(pattern: str) -> list[str]:
        return [v[0] for k, v in sorted(form.items()) if re.fullmatch(pattern, k) and v[0]]

    lt = "LaunchTemplateConfigs.1.LaunchTemplateSpecification." if action == "CreateFleet" else "LaunchTemplate."
    template = one(lt + "LaunchTemplateId") or (
        _template_id(one(lt + "LaunchTemplateName")) if one(lt + "LaunchTemplateName") else ""
    )
    data = _template_data(template, one(lt + "Version", "1")) if template else {}
    tags = {
        spec["ResourceType"]: {t["Key"]: t.get("Value", "") for t in spec.get("Tags", [])}
        for spec in data.get("TagSpecifications") or []
    }
    for kind, request in _tag_specifications(form).items():
        tags[kind] = {**tags.get(kind, {}), **request}
    nics = data.get("NetworkInterfaces") or []
    over = _overrides(form) if action == "CreateFleet" else []
    market = one("TargetCapacitySpecification.DefaultTargetCapacityType") or one("InstanceMarketOptions.MarketType")
    market = market or (data.get("InstanceMarketOptions") or {}).get("MarketType", "")
    image = one("ImageId") or data.get("ImageId", "")
    subnets = [o["SubnetId"] for o in over if o.get("SubnetId")] or many(r"SubnetId|NetworkInterface\.\d+\.SubnetId")
    subnets = subnets or [n["SubnetId"] for n in nics if n.get("SubnetId")] or [_default_subnet()]
    groups = many(r"SecurityGroupId\.\d+|NetworkInterface\.\d+\.SecurityGroupId\.\d+") or list(
        data.get("SecurityGroupIds") or []
    )
    groups = groups or [g for n in nics for g in n.get("Groups") or []] or [_default_group(subnets[0])]
    mapped = many(r"BlockDeviceMapping\.\d+\.Ebs\.SnapshotId") + [
        (b.get("Ebs") or {}).get("SnapshotId", "") for b in data.get("BlockDeviceMappings") or []
    ]
    placement = [o["Placement.GroupName"] for o in over if o.get("Placement.GroupName")] + many(r"Placement\.GroupName")
    placement += [data["Placement"]["GroupName"]] if (data.get("Placement") or {}).get("GroupName") else []
    return Launch(
        template=template,
        data=data,
        tags=tags,
        types=[o["InstanceType"] for o in over if o.get("InstanceType")]
        or [one("InstanceType") or data.get("InstanceType", "m1.small")],
        image=image,
        subnets=list(dict.fromkeys(subnets)),
        groups=list(dict.fromkeys(groups)),
        snapshots=list(dict.fromkeys([s for s in [*_image_snapshots(image), *mapped] if s])),
        placement=list(dict.fromkeys(placement)),
        spot=market == "spot",
    )


def _launch_checks(action: str, form: dict[str, list[str]], placement) -> list[tuple[str, str, dict]]:
    """Every (action, resource, keys) IAM evaluates for a launch: what it creates with the request's tags for that
    type (aws:RequestTag/…, aws:TagKeys), what it uses with its own keys (tags, ec2:Owner, ec2:Vpc,
    ec2:InstanceType)."""
    launch = _launch(action, form)

    def requested(kind: str, **keys: object) -> tuple[str, dict]:
        tags = launch.tags.get(kind, {})
        ctx = {f"aws:RequestTag/{k}": v for k, v in tags.items()}
        return _ec2_arn(f"{kind}/new"), {**ctx, **({"aws:TagKeys": list(tags)} if tags else {}), **keys}

    resources = [requested("instance", **{"ec2:InstanceType": t}) for t in launch.types]
    resources += [requested("volume"), requested("fleet")]
    vpc_of = {s: _subnet_vpc(s) for s in launch.subnets}
    resources += [
        requested("network-interface", **{"ec2:Subnet": _ec2_arn(s), "ec2:Vpc": vpc_of[s]}) for s in launch.subnets
    ]
    if launch.spot:
        resources.append(requested("spot-instances-request"))
    resources.append(
        (
            _ec2_arn(launch.image or "ami-none"),
            {**_resource_tags(launch.image, placement), "ec2:Owner": _owner(launch.image)},
        )
    )
    resources += [(_ec2_arn(s), {**_resource_tags(s, placement), "ec2:Vpc": vpc_of[s]}) for s in launch.subnets]
    resources += [(_ec2_arn(g), {**_resource_tags(g, placement), "ec2:Vpc": _group_vpc(g)}) for g in launch.groups]
    resources += [(_ec2_arn(s), {**_resource_tags(s, placement), "ec2:Owner": _owner(s)}) for s in launch.snapshots]
    resources += [(_ec2_arn(launch.template), _resource_tags(launch.template, placement))] if launch.template else []
    resources += [
        (_ec2_arn(f"placement-group/{g}"), _resource_tags(f"placement-group/{g}", placement)) for g in launch.placement
    ]

    def kind(arn: str) -> str:
        return arn.rsplit(":", 1)[1].split("/", 1)[0]

    checks = [("ec2:RunInstances", arn, ctx) for arn, ctx in resources if kind(arn) != "fleet"]
    if action == "CreateFleet":
        checks = [("ec2:CreateFleet", arn, ctx) for arn, ctx in resources if kind(arn) in FLEET_TYPES] + checks
        profile = (launch.data.get("IamInstanceProfile") or {}).get("Name", "")
        for role in _profile_roles(profile):
            checks.append(("iam:PassRole", _iam_arn("role", role), {"iam:PassedToService": "ec2.amazonaws.com"}))
    for k in sorted(launch.tags):  # tags written at creation: CreateTags, with the creating API
        checks.append(("ec2:CreateTags", _ec2_arn(f"{k}/new"), {"ec2:CreateAction": action}))
    return checks


def _default_subnet() -> str:
    with MOTO:
        backend = _ec2_backend()
        vpc = backend.get_default_vpc()
        subnets = [s for s in backend.describe_subnets() if vpc is not None and s.vpc_id == vpc.id]
        return sorted(subnets, key=lambda s: s.availability_zone)[0].id if subnets else "subnet-none"


def _default_group(subnet: str) -> str:
    """The VPC's default group: EC2 uses it when a launch names none."""
    with MOTO:
        try:
            vpc = _ec2_backend().get_subnet(subnet).vpc_id
            group = _ec2_backend().get_default_security_group(vpc)
            return group.id if group is not None else "sg-none"
        except Exception:
            return "sg-none"


def _subnet_vpc(subnet: str) -> str:
    with MOTO:
        try:
            return _ec2_arn(f"vpc/{_ec2_backend().get_subnet(subnet).vpc_id}")
        except Exception:
            return ""


def _group_vpc(group: str) -> str:
    with MOTO:
        found = _ec2_backend().get_security_group_from_id(group)
        return _ec2_arn(f"vpc/{found.vpc_id}") if found is not None else ""


def _image_snapshots(image: str) -> list[str]:
    """The snapshots behind an image's block devices (a launch reads them)."""
    with MOTO:
        ami = _ec2_backend().amis.get(image)
        if ami is None:
            return []
        try:
            mappings = ami.block_device_mappings or []
        except Exception:
            mappings = []
        found = [(m.get("Ebs") or {}).get("SnapshotId", "") for m in mappings if isinstance(m, dict)]
        snap = getattr(ami, "ebs_snapshot", None)
        return [s for s in found if s] or ([snap.id] if snap is not None else [])


def _owner(resource: str) -> str:
    """ec2:Owner of an image or snapshot: "amazon" for Amazon's own, else the owning account's id."""
    with MOTO:
        backend = _ec2_backend()
        try:
            found = backend.amis.get(resource) if resource.startswith("ami-") else backend.get_snapshot(resource)
        except Exception:
            found = None
        owner = getattr(found, "owner_id", "") if found is not None else ""
        amazon = {a.owner_id for a in backend.amis.values() if getattr(a, "owner_alias", None) == "amazon"}
        return "amazon" if owner in amazon | {AMAZON_ACCOUNT} and owner != ACCOUNT else owner


def _ec2_targets(action: str, form: dict[str, list[str]]) -> list[str]:
    """The existing resources an EC2 call acts on (ids, or `placement-group/NAME`), those a policy can name."""

    def values(prefix: str) -> list[str]:
        return [v[0] for k, v in sorted(form.items()) if k == prefix or k.startswith(prefix + ".")]

    if action in ("TerminateInstances", "CreateImage", "StopInstances", "RebootInstances"):
        return values("InstanceId")
    if action in ("CreateTags", "DeleteTags"):
        return values("ResourceId")
    if action in ("DeleteSecurityGroup", "AuthorizeSecurityGroupIngress", "RevokeSecurityGroupIngress"):
        return values("GroupId")
    if action in ("CreateLaunchTemplateVersion", "DeleteLaunchTemplate", "DeleteLaunchTemplateVersions"):
        return values("LaunchTemplateId") or [_template_id(n) for n in values("LaunchTemplateName")]
    if action == "DeletePlacementGroup":
        return [f"placement-group/{n}" for n in values("GroupName")]
    if action == "DeregisterImage":
        return values("ImageId")
    if action == "DeleteSnapshot":
        return values("SnapshotId")
    return []


def _resource_keys(resource: str, placement) -> dict[str, str]:
    """The keys IAM evaluates on an existing EC2 resource: its tags, and an instance's id (ec2:InstanceID)."""
    keys = _resource_tags(resource, placement)
    if resource.startswith("i-"):
        keys["ec2:InstanceID"] = resource
    return keys


def _resource_tags(resource: str, placement) -> dict[str, str]:
    """aws:ResourceTag/KEY of an EC2 resource, as IAM sees it (moto's tags; the fake's placement groups)."""
    if resource.startswith("placement-group/"):
        group = placement.groups.get((getattr(_HERE, "region", None) or REGION, resource.partition("/")[2])) or {}
        tags = group.get("tags") or {}
    else:
        with MOTO:
            tags = dict(_ec2_backend().tags.get(resource, {}))
    return {f"aws:ResourceTag/{k}": v for k, v in tags.items()}


def _request_tags(form: dict[str, list[str]]) -> dict:
    """aws:RequestTag/… and aws:TagKeys of a request that tags a new image at creation (none without tags, as IAM)."""
    tags = _tag_specifications(form).get("image", {})
    ctx: dict[str, object] = {f"aws:RequestTag/{k}": v for k, v in tags.items()}
    if tags:
        ctx["aws:TagKeys"] = sorted(tags)
    return ctx


def _copy_image_checks(form: dict[str, list[str]]) -> list[tuple[str, str, dict]]:
    """CopyImage (Service Authorization Reference; EC2 user guide, "Grant permissions to copy Amazon EC2 AMIs"): the
    source image (of the source region), the new image and its new snapshots, each with the request's tags (the image's
    TagSpecification: aws:RequestTag/…, aws:TagKeys) — the copy is allowed only tagged as the policy asks."""
    ctx = _request_tags(form)
    source = form.get("SourceImageId", [""])[0]
    source_arn = f"arn:aws:ec2:{form.get('SourceRegion', [REGION])[0]}::image/{source}"
    return [("ec2:CopyImage", arn, ctx) for arn in (source_arn, _ec2_arn("image/new"), _ec2_arn("snapshot/new"))]


def _tag_specification_types(form: dict[str, list[str]]) -> list[str]:
    return sorted({v[0] for k, v in form.items() if re.match(r"TagSpecification\.\d+\.ResourceType$", k)})


def _tag_specifications(form: dict[str, list[str]]) -> dict[str, dict[str, str]]:
    """{resource type: {key: value}} of a query request's TagSpecification.N."""
    out: dict[str, dict[str, str]] = {}
    for k, v in form.items():
        m = re.match(r"TagSpecification\.(\d+)\.ResourceType$", k)
        if m:
            n, tags = m.group(1), out.setdefault(v[0], {})
            for tk, tv in form.items():
                t = re.match(rf"TagSpecification\.{n}\.Tag\.(\d+)\.Key$", tk)
                if t:
                    tags[tv[0]] = form.get(f"TagSpecification.{n}.Tag.{t.group(1)}.Value", [""])[0]
    return out


def _template_id(name: str) -> str:
    with MOTO:
        try:
            return _ec2_backend().get_launch_template_by_name(name).id
        except Exception:
            return f"lt-unknown-{name}"


def _iam_backend():
    from moto.iam.models import iam_backends

    return iam_backends[ACCOUNT]["global"]


def _role_boundary(role: str) -> str | None:
    with MOTO:
        try:
            return _iam_backend().get_role(role).permissions_boundary_arn
        except Exception:
            return None


def _role_tags(role: str) -> dict[str, str]:
    with MOTO:
        try:
            tags = _iam_backend().get_role(role).tags
            pairs = tags.values() if isinstance(tags, dict) else tags
            return {f"aws:ResourceTag/{t['Key']}": t["Value"] for t in pairs}
        except Exception:
            return {}


def _profile_roles(profile: str) -> list[str]:
    if not profile:
        return []
    with MOTO:
        try:
            return [r.name for r in _iam_backend().get_instance_profile(profile).roles]
        except Exception:
            return [profile]


def _kms_key_arn(key: str) -> str:
    """KMS authorizes on the key, whichever id, ARN or alias names it."""
    from moto.kms.models import kms_backends

    if key.startswith("arn:") and ":key/" in key:
        return key
    with MOTO:
        try:
            return kms_backends[ACCOUNT][REGION].describe_key(key).arn
        except Exception:
            return f"arn:aws:kms:{REGION}:{ACCOUNT}:key/unknown"


def policies_from_moto() -> Callable[[str], list[dict]]:
    """Inline and attached policies of a role, read from moto's own IAM records (what GetRolePolicy and
    GetPolicyVersion answer). Through the server it was four to six requests of the harness's own for each call a
    host made, about a fifth of a worker's CPU in the AWS tests. A role that is gone has none: its credentials,
    still valid, are denied everything, as IAM denies them."""

    def source(role: str) -> list[dict]:
        with MOTO:
            found = next((r for r in _iam_backend().get_roles() if r.name == role), None)
            if found is None:
                return []
            texts = list(found.policies.values())
            texts += [_default_document(policy) for policy in found.managed_policies.values()]
        return [t if isinstance(t, dict) else json.loads(t) for t in texts]

    return source


def _default_document(policy) -> dict | str:
    """A managed policy's document in force: its default version's (its newest, for one moto made without a default)."""
    doc = policy.versions[-1].document if not policy.default_version_id else None
    for v in policy.versions:
        if v.version_id == policy.default_version_id:
            doc = v.document
    return doc


def boundaries_from_moto() -> Callable[[str], dict | None]:
    """A role's permissions boundary document (moto keeps the ARN with the role, the policy among the managed ones)."""

    def source(role: str) -> dict | None:
        arn = _role_boundary(role)
        if not arn:
            return None
        with MOTO:
            try:
                doc = _default_document(_iam_backend().get_policy(arn))
            except Exception:
                return {"Version": "2012-10-17", "Statement": []}  # a boundary that does not exist allows nothing
        return doc if isinstance(doc, dict) else json.loads(doc)

    return source


# --- spot prices ---------------------------------------------------------------------------------
# moto answers every DescribeSpotPriceHistory with $0.00001 and a timestamp of 2006. The fake answers
# with plausible prices instead: EXAMPLES, NOT QUOTES (docs/aws.md says so). Each (type, AZ) gets a
# spot price of 35-50% of the type's published us-east-1 Linux on-demand price (aws.amazon.com/ec2/
# pricing/on-demand), fixed per AZ, moving by up to ±6% between the entries of the last three days (one
# every 12 hours, newest first, as EC2 lists them). Types not listed: $0.10/h on demand.
ON_DEMAND = {
    "g4dn.xlarge": 0.526,
    "g5.xlarge": 1.006,
    "g5.2xlarge": 1.212,
    "g5.12xlarge": 5.672,
    "g5.48xlarge": 16.288,
    "g6.xlarge": 0.8048,
    "g6.12xlarge": 4.6016,
    "p3.2xlarge": 3.06,
    "p3.8xlarge": 12.24,
    "p4d.24xlarge": 32.7726,
    "p5.48xlarge": 98.32,
    "t3.micro": 0.0104,
    "t3.medium": 0.0416,
    "c5.xlarge": 0.17,
    "m5.large": 0.096,
}
HISTORY_ENTRIES, HISTORY_EVERY_S = 6, 12 * 3600


def spot_price(instance_type: str, az: str, age_s: float = 0.0) -> float:
    """The fake's spot price of a (type, AZ), `age_s` seconds ago (newest entry: 0)."""
    h = int(hashlib.sha256(f"{instance_type}/{az}".encode()).hexdigest()[:8], 16)
    share = 0.35 + 0.15 * (h % 1000) / 999
    step = int(age_s // HISTORY_EVERY_S)
    wobble = 1 + 0.06 * ((((h >> 10) + 7 * step) % 13) - 6) / 6
    return round(ON_DEMAND.get(instance_type, 0.10) * share * wobble, 4)


def _drop_items(xml: bytes, keep: Callable[[str, str], bool], az_tag: bytes) -> bytes:
    """An EC2 answer without the items of pools `keep(type, az)` refuses."""

    def one(m) -> bytes:
        itype = re.search(rb"<instanceType>(.*?)</instanceType>", m.group(0))
        az = re.search(rb"<" + az_tag + rb">(.*?)</" + az_tag + rb">", m.group(0))
        ok = not itype or not az or keep(itype.group(1).decode(), az.group(1).decode())
        return m.group(0) if ok else b""

    return re.sub(rb"<item>.*?</item>", one, xml, flags=re.S)


def _epoch(value: str) -> float | None:
    import datetime

    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _listed(times: list[float], start: float | None, end: float | None) -> list[float]:
    """The change times DescribeSpotPriceHistory lists: those in [start, end]; and, only when both times are given,
    "the last price change before the start time, which is the effective price as of the start time" (API reference).
    """
    upto = end if end is not None else time.time()
    inside = [t for t in times if (start is None or t >= start) and t <= upto]
    before = [t for t in times if start is not None and t < start]
    return inside + (before[:1] if start is not None and end is not None else [])


def spot_history(
    xml: bytes,
    keep: Callable[[str, str], bool] = lambda t, a: True,
    start: str = "",
    end: str = "",
    price_of: Callable[[str, str, float], float] = spot_price,
) -> bytes:
    xml = _drop_items(xml, keep, b"availabilityZone")
    items = re.findall(rb"<item>.*?</item>", xml, flags=re.S)
    now = time.time() // HISTORY_EVERY_S * HISTORY_EVERY_S
    changes = _listed([now - n * HISTORY_EVERY_S for n in range(HISTORY_ENTRIES)], _epoch(start), _epoch(end))
    out = []
    for item in items:
        itype = re.search(rb"<instanceType>(.*?)</instanceType>", item)
        az = re.search(rb"<availabilityZone>(.*?)</availabilityZone>", item)
        if not itype or not az:
            continue
        for at in changes:
            n = int((now - at) // HISTORY_EVERY_S)
            ts = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(at))
            price = price_of(itype.group(1).decode(), az.group(1).decode(), n * HISTORY_EVERY_S)
            entry = re.sub(rb"<spotPrice>.*?</spotPrice>", f"<spotPrice>{price:.6f}</spotPrice>".encode(), item)
            out.append(re.sub(rb"<timestamp>.*?</timestamp>", f"<timestamp>{ts}</timestamp>".encode(), entry))
    if not items:
        return xml
    start, end = xml.index(items[0]), xml.rindex(items[-1]) + len(items[-1])
    return xml[:start] + b"".join(out) + xml[end:]


def _call_of(body: bytes) -> tuple[str, str, str]:
    """(action, orch:run, orch:attempt) of an EC2 request: the tags from its TagSpecifications, if any."""
    form = parse_qs(body.decode(), keep_blank_values=True)
    tags = {
        v[0]: form.get(k[: -len("Key")] + "Value", [""])[0]
        for k, v in form.items()
        if k.startswith("TagSpecification.") and k.endswith(".Key")
    }
    return form.get("Action", [""])[0], tags.get("orch:run", ""), tags.get("orch:attempt", "")
