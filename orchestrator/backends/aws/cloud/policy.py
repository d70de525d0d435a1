"""The IAM documents orch asks an account for, built in one place.

- `controller_policy`: what the credentials that run `orch` need (`orch aws policy`, docs/aws.md; a test keeps
  the two equal, and the fake cloud checks every controller call in the tests against it, so a call this policy
  does not allow fails a test before it fails a user).
- `boundary_policy`: the permissions boundary every role orch creates carries (`orch aws boundary`). An admin
  creates it once, as the managed policy `orch-boundary`; the controller policy lets its holder create and change
  roles only when they carry that boundary, so no role orch (or whoever holds its policy) makes can do more than
  an instance of a sweep needs: no escalation to an administrator through a role.

Destructive EC2 calls are allowed only on resources that carry orch's tags (`orch:sweep`; images and snapshots
`orch:recipe`), and tags can be written only at creation (`ec2:CreateAction`) or onto resources that already carry
them, so nobody can tag someone else's instance to make it terminable. Sources: IAM user guide, "Permissions
boundaries for IAM entities" (the delegation example); EC2 user guide, "Grant permission to tag Amazon EC2
resources during creation"; the Service Authorization Reference (which action takes which resource and key).

Other documents extend these through the functions below (instance_statements, boundary_policy's `extra`), only.
"""

from __future__ import annotations

from collections.abc import Sequence

SWEEP_TAG, RECIPE_TAG = "orch:sweep", "orch:recipe"
BOUNDARY_NAME = "orch-boundary"
# The caller's own account, as IAM resolves it when it evaluates the policy (a global condition key used as a
# policy variable): the printed policy needs no account id, and a boundary of another account never matches.
ACCOUNT_VARIABLE = "${aws:PrincipalAccount}"
PLACEHOLDER = "YOUR-BUCKET"
EC2_SERVICE = "ec2.amazonaws.com"

READ_ACTIONS = [
    "ec2:DescribeImages",
    "ec2:DescribeVpcs",
    "ec2:DescribeSubnets",
    "ec2:DescribeInstances",
    "ec2:DescribeInstanceType*",  # DescribeInstanceTypes, DescribeInstanceTypeOfferings (a managed policy's size)
    "ec2:DescribeSpotPriceHistory",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeLaunchTemplate*",  # DescribeLaunchTemplates, DescribeLaunchTemplateVersions
    "ec2:DescribePlacementGroups",
    "ec2:DescribeRegions",  # which of the sweep's regions the account may use (opt-in regions)
    "ec2:GetSpotPlacementScores",  # aws.choose: work (cloud/scores.py); no resource type: "*"
]
# New resources (a launch, a group, a template): nothing of anyone else's is touched. Images: Ec2NewImages.
CREATE_ACTIONS = [
    "ec2:CreateSecurityGroup",
    "ec2:CreateLaunchTemplate",
    "ec2:CreatePlacementGroup",
]
# The API names whose TagSpecifications orch uses: tags written by them are written at creation.
TAGGING_CREATE_ACTIONS = [
    "RunInstances",
    "CreateFleet",
    "CreateSecurityGroup",
    "CreateLaunchTemplate",
    "CreatePlacementGroup",
    "CreateImage",
    "CopyImage",
]
# Changes and removals: only on resources tagged orch:sweep (instances, groups, templates, placement groups); and a
# launch uses only groups, templates and placement groups of orch's (LAUNCH_ACTIONS, below).
ON_SWEEP_RESOURCES = [
    "ec2:RunInstances",
    "ec2:CreateFleet",
    "ec2:CreateImage",  # of an instance (the builder): its new image and snapshots are Ec2NewImages'
    "ec2:TerminateInstances",
    "ec2:AuthorizeSecurityGroupIngress",
    "ec2:RevokeSecurityGroupIngress",
    "ec2:DeleteSecurityGroup",
    "ec2:CreateLaunchTemplateVersion",
    "ec2:DeleteLaunchTemplateVersions",
    "ec2:DeleteLaunchTemplate",
    "ec2:DeletePlacementGroup",
    "ec2:CreateTags",
    "ec2:DeleteTags",
]
# orch ami's images and their snapshots carry orch:recipe instead.
ON_RECIPE_RESOURCES = ["ec2:DeregisterImage", "ec2:DeleteSnapshot", "ec2:CreateTags", "ec2:DeleteTags"]
ROLE_ACTIONS_UNDER_BOUNDARY = ["iam:CreateRole", "iam:PutRolePolicy", "iam:DeleteRolePolicy"]
ROLE_ACTIONS = ["iam:TagRole", "iam:ListRolePolicies"]
# AWS's delegation example for permissions boundaries ("Permissions boundaries for IAM entities"): the boundary policy
# itself cannot be changed or removed, nor a role's boundary removed or replaced, whatever other IAM rights the holder
# has (explicit Deny wins over any Allow).
BOUNDARY_POLICY_CHANGES = [
    "iam:CreatePolicyVersion",
    "iam:SetDefaultPolicyVersion",
    "iam:DeletePolicyVersion",
    "iam:DeletePolicy",
]
# Present only in the requests of credentials EC2 delivered to an instance through its instance profile (IAM user
# guide, "AWS global condition context keys", ec2:SourceInstanceARN): a role assumed any other way (sts:AssumeRole
# by a principal its trust policy names, another account's included) gets nothing from a boundary that asks for it.
FROM_AN_INSTANCE = {"Null": {"ec2:SourceInstanceARN": "false"}}
# The instance acted on is the one whose credentials sign the request: its ARN ends with the target's id
# (ec2:InstanceID, used as a policy variable). IAM takes no bare variable as a Resource, hence a condition.
ITSELF = {"ArnLike": {"ec2:SourceInstanceARN": "arn:aws:ec2:*:*:instance/${ec2:InstanceID}"}}
INSTANCES = "arn:aws:ec2:*:*:instance/*"
PROFILE_ACTIONS = [
    "iam:CreateInstanceProfile",
    "iam:TagInstanceProfile",
    "iam:GetInstanceProfile",
    "iam:AddRoleToInstanceProfile",
    "iam:RemoveRoleFromInstanceProfile",
    "iam:DeleteInstanceProfile",
]
S3_OBJECT_ACTIONS = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
DATA_OBJECT_ACTIONS = ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"]  # read by hosts, `orch data push`
KMS_VIA_S3 = {"StringLike": {"kms:ViaService": "s3.*.amazonaws.com"}}
KMS_KEYS = "arn:aws:kms:*:*:key/*"


# Launching (RunInstances, and CreateFleet, whose instant fleets launch with the caller's rights), per resource type
# as the Service Authorization Reference lists them for these actions, as Karpenter's controller policy scopes them:
# what the launch creates carries orch:sweep from the request (tagged at creation; only orch's tag keys); what it
# uses is orch's (the sweep's group, template, placement group: the statements on orch:sweep resources); an image of
# the allowed owners; a snapshot only as an image's own (another owner's, or one of the account's that orch tagged
# orch:recipe); subnets of the given VPCs.
LAUNCH_ACTIONS = ["ec2:RunInstances", "ec2:CreateFleet"]
LAUNCHED = ["fleet", "volume", "network-interface", "spot-instances-request"]  # and "instance", with its own keys
TAG_KEYS = ["orch:*", "Name"]  # the keys orch writes at launch (sweep_tags, and the builder's Name)
# ec2:Owner of an image: an account id, or "amazon" for Amazon's own public images (the Deep Learning AMIs).
DEFAULT_IMAGE_OWNERS = ("amazon",)


def ec2_arns(kinds: Sequence[str]) -> list[str]:
    return [f"arn:aws:ec2:*:*:{kind}/*" for kind in kinds]


def image_owners(owners: Sequence[str] = DEFAULT_IMAGE_OWNERS) -> list[str]:
    """ec2:Owner values of the images a launch may use: the account's own (`self`) and `owners`."""
    named = [ACCOUNT_VARIABLE if o == "self" else o for o in owners]
    return list(dict.fromkeys([ACCOUNT_VARIABLE, *named]))


def launch_statements(
    prefix: str,
    sweep: str = "",
    instance_types: Sequence[str] = (),
    owners: Sequence[str] = DEFAULT_IMAGE_OWNERS,
    vpcs: Sequence[str] = (),
    orch_snapshots: bool = True,
) -> list[dict]:
    """RunInstances/CreateFleet per resource type. `sweep` narrows the request's orch:sweep to one sweep's (a remote
    controller's role), `instance_types` the instances' types, `vpcs` (ids) the subnets' VPC; empty: any.
    `orch_snapshots`: a statement for the snapshots orch tagged (the user policy has Ec2OnOrchImages instead)."""
    sweep_tag = (
        {"StringEquals": {f"aws:RequestTag/{SWEEP_TAG}": sweep}}
        if sweep
        else {"Null": {f"aws:RequestTag/{SWEEP_TAG}": "false"}}
    )
    tagged_request = {**sweep_tag, "ForAllValues:StringLike": {"aws:TagKeys": TAG_KEYS}}
    instance = dict(tagged_request)
    if instance_types:
        instance["StringEquals"] = {**instance.get("StringEquals", {}), "ec2:InstanceType": list(instance_types)}
    others = [o for o in image_owners(owners) if o != ACCOUNT_VARIABLE]
    new = [
        {"Sid": f"{prefix}New", "Effect": "Allow", "Resource": ec2_arns(LAUNCHED), "Condition": tagged_request},
        {"Sid": f"{prefix}Instances", "Effect": "Allow", "Resource": INSTANCES, "Condition": instance},
    ]
    if not instance_types:  # one statement (the printed policy's size is IAM's to limit)
        new = [{**new[0], "Resource": [*ec2_arns(LAUNCHED), INSTANCES]}]
    out = [
        *new,
        {
            "Sid": f"{prefix}Images",
            "Effect": "Allow",
            "Resource": "arn:aws:ec2:*::image/*",
            "Condition": {"StringEquals": {"ec2:Owner": image_owners(owners)}},
        },
        {
            "Sid": f"{prefix}Subnets",
            "Effect": "Allow",
            "Resource": "arn:aws:ec2:*:*:subnet/*",
            **({"Condition": {"ArnLike": {"ec2:Vpc": [f"arn:aws:ec2:*:*:vpc/{v}" for v in vpcs]}}} if vpcs else {}),
        },
    ]
    # the snapshots behind another owner's images (none of them the account's own data); the account's own only
    # when orch tagged them orch:recipe (its images' snapshots): Ec2OnOrchImages, and for a role OrchImageSnapshots
    if others:
        out.insert(
            len(out) - 1,
            {
                "Sid": f"{prefix}OwnersSnapshots",
                "Effect": "Allow",
                "Resource": "arn:aws:ec2:*::snapshot/*",
                "Condition": {"StringEquals": {"ec2:Owner": others}},
            },
        )
    # CreateFleet takes no snapshot (Service Authorization Reference): its instant fleet's RunInstances does
    out += [
        {
            "Sid": f"{prefix}OrchImageSnapshots",
            "Effect": "Allow",
            "Resource": "arn:aws:ec2:*::snapshot/*",
            "Condition": _tagged(RECIPE_TAG),
        }
    ][: 1 if orch_snapshots else 0]
    return [{**st, "Action": "ec2:RunInstances" if "Snapshots" in st["Sid"] else list(LAUNCH_ACTIONS)} for st in out]


def in_regions(regions: Sequence[str]) -> list[dict]:
    """An explicit Deny of EC2 outside `regions` (aws:RequestedRegion; AWS's "Restrict access to a specific Region"
    example): none without regions. Only EC2: IAM is global (its requests name us-east-1), and the store's
    bucket lives in a region of its own."""
    if not regions:
        return []
    return [
        {
            "Sid": "OnlyTheseRegions",
            "Effect": "Deny",
            "Resource": "*",
            "Action": "ec2:*",
            "Condition": {"StringNotEquals": {"aws:RequestedRegion": list(regions)}},
        }
    ]


def boundary_arn(account: str = ACCOUNT_VARIABLE) -> str:
    """The boundary's ARN in `account` (by default the policy variable that IAM resolves to the caller's account)."""
    return f"arn:aws:iam::{account}:policy/{BOUNDARY_NAME}"


def _tagged(key: str) -> dict:
    return {"Null": {f"aws:ResourceTag/{key}": "false"}}  # the resource carries the tag (any value)


def ec2_statements(owners: Sequence[str] = DEFAULT_IMAGE_OWNERS, vpcs: Sequence[str] = ()) -> list[dict]:
    return [
        {"Sid": "Ec2Read", "Effect": "Allow", "Resource": "*", "Action": list(READ_ACTIONS)},
        {"Sid": "Ec2Create", "Effect": "Allow", "Resource": "*", "Action": list(CREATE_ACTIONS)},
        *launch_statements("Ec2Launch", owners=owners, vpcs=vpcs, orch_snapshots=False),
        {
            "Sid": "Ec2TagAtCreation",
            "Effect": "Allow",
            "Resource": "*",
            "Action": "ec2:CreateTags",
            "Condition": {"StringEquals": {"ec2:CreateAction": list(TAGGING_CREATE_ACTIONS)}},
        },
        {
            "Sid": "Ec2OnSweepResources",
            "Effect": "Allow",
            "Resource": "*",
            "Action": list(ON_SWEEP_RESOURCES),
            "Condition": _tagged(SWEEP_TAG),
        },
        {
            # a rule is a resource of its own (security-group-rule), which carries no tag; its group must (above)
            "Sid": "Ec2NewIngressRules",
            "Effect": "Allow",
            "Resource": "arn:aws:ec2:*:*:security-group-rule/*",
            "Action": ["ec2:AuthorizeSecurityGroupIngress", "ec2:RevokeSecurityGroupIngress"],
        },
        {  # a new image (CreateImage) or a copy of one in another region (CopyImage, which takes the source image too:
            # Service Authorization Reference), its snapshots with it: only tagged orch:recipe in the request, so
            # `orch ami list` / `rm` and `orch gc` see whatever these calls make
            "Sid": "Ec2NewImages",
            "Effect": "Allow",
            "Resource": ["arn:aws:ec2:*::image/*", "arn:aws:ec2:*::snapshot/*"],
            "Action": ["ec2:CreateImage", "ec2:CopyImage"],
            "Condition": {"Null": {f"aws:RequestTag/{RECIPE_TAG}": "false"}},
        },
        {  # and launch from them: the snapshots a launch reads, when they are the account's (launch_statements)
            "Sid": "Ec2OnOrchImages",
            "Effect": "Allow",
            "Resource": ["arn:aws:ec2:*::image/*", "arn:aws:ec2:*::snapshot/*"],
            "Action": [*ON_RECIPE_RESOURCES, "ec2:RunInstances"],
            "Condition": _tagged(RECIPE_TAG),
        },
    ]


def iam_statements(boundary: str) -> list[dict]:
    return [
        {
            "Sid": "IamRolesOnlyWithTheBoundary",
            "Effect": "Allow",
            "Resource": "arn:aws:iam::*:role/orch-*",
            "Action": list(ROLE_ACTIONS_UNDER_BOUNDARY),
            "Condition": {"ArnEquals": {"iam:PermissionsBoundary": boundary}},
        },
        {  # DeleteRole takes no iam:PermissionsBoundary key (Service Authorization Reference): the role's own tag
            "Sid": "IamDeleteOrchRoles",
            "Effect": "Allow",
            "Resource": "arn:aws:iam::*:role/orch-*",
            "Action": "iam:DeleteRole",
            "Condition": _tagged(SWEEP_TAG),
        },
        {"Sid": "IamRoles", "Effect": "Allow", "Resource": "arn:aws:iam::*:role/orch-*", "Action": list(ROLE_ACTIONS)},
        {
            "Sid": "IamPassRoleToEc2",
            "Effect": "Allow",
            "Resource": "arn:aws:iam::*:role/orch-*",
            "Action": "iam:PassRole",
            "Condition": {"StringEquals": {"iam:PassedToService": EC2_SERVICE}},
        },
        {
            "Sid": "IamInstanceProfiles",
            "Effect": "Allow",
            "Resource": "arn:aws:iam::*:instance-profile/orch-*",
            "Action": list(PROFILE_ACTIONS),
        },
        {"Sid": "IamList", "Effect": "Allow", "Resource": "*", "Action": ["iam:ListInstanceProfiles"]},
        {
            "Sid": "SpotServiceRoles",
            "Effect": "Allow",
            "Resource": "*",
            "Action": "iam:CreateServiceLinkedRole",
            "Condition": {"StringEquals": {"iam:AWSServiceName": ["spot.amazonaws.com", "ec2fleet.amazonaws.com"]}},
        },
    ]


def guardrail_statements(boundary: str) -> list[dict]:
    """The explicit Denies of AWS's delegation example: the boundary policy stays as the admin made it, no role loses or
    swaps orch's boundary. A Resource's account takes no policy variable (IAM user guide, "Variables and tags"): `*`."""
    return [
        {
            "Sid": "DenyChangingTheBoundary",
            "Effect": "Deny",
            "Resource": f"arn:aws:iam::*:policy/{BOUNDARY_NAME}",
            "Action": list(BOUNDARY_POLICY_CHANGES),
        },
        {
            "Sid": "DenyRemovingTheBoundary",
            "Effect": "Deny",
            "Resource": "arn:aws:iam::*:role/*",
            "Action": "iam:DeleteRolePermissionsBoundary",
            "Condition": {"ArnEquals": {"iam:PermissionsBoundary": boundary}},
        },
        {
            "Sid": "DenyReplacingTheBoundary",
            "Effect": "Deny",
            "Resource": "arn:aws:iam::*:role/*",
            "Action": "iam:PutRolePermissionsBoundary",
            "Condition": {"ArnNotEquals": {"iam:PermissionsBoundary": boundary}},
        },
    ]


def kms_statements() -> list[dict]:
    """A bucket whose default key is customer-managed: S3 calls KMS for the caller (kms:GenerateDataKey to write,
    kms:Decrypt to read and to finish a multipart upload), and only S3 may do so on its behalf; DescribeKey
    resolves an alias or key id that a bucket names to the key's ARN (an IAM policy names keys only by ARN)."""
    return [
        {
            "Sid": "KmsThroughS3",
            "Effect": "Allow",
            "Resource": KMS_KEYS,
            "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
            "Condition": KMS_VIA_S3,
        },
        {"Sid": "KmsDescribeKey", "Effect": "Allow", "Resource": KMS_KEYS, "Action": "kms:DescribeKey"},
    ]


def s3_statements(bucket: str, data_buckets: Sequence[str] = ()) -> list[dict]:
    data = [b for b in dict.fromkeys(data_buckets) if b != bucket]
    out = [
        {
            "Sid": "Store",
            "Effect": "Allow",
            "Action": ["s3:ListBucket", "s3:GetEncryptionConfiguration", "s3:GetBucketLocation"],
            "Resource": [f"arn:aws:s3:::{b}" for b in [bucket, *data]],
        },
        {
            "Sid": "StoreObjects",
            "Effect": "Allow",
            "Resource": f"arn:aws:s3:::{bucket}/*",
            "Action": list(S3_OBJECT_ACTIONS),
        },
    ]
    if data:
        out.append(
            {
                "Sid": "DataObjects",
                "Effect": "Allow",
                "Resource": [f"arn:aws:s3:::{b}/*" for b in data],
                "Action": list(DATA_OBJECT_ACTIONS),
            }
        )
    return out


def controller_policy(
    bucket: str | None = None,
    data_buckets: Sequence[str] = (),
    regions: Sequence[str] = (),
    owners: Sequence[str] = DEFAULT_IMAGE_OWNERS,
    vpcs: Sequence[str] = (),
) -> dict:
    """The policy document of the credentials that run orch, with the store's bucket (or YOUR-BUCKET) and the
    buckets `data:` entries read from (and `orch data push` writes to); EC2 only in `regions` (empty: any), images
    of `owners` (and the account's own), subnets of `vpcs` (empty: any)."""
    b = bucket or PLACEHOLDER
    return {
        "Version": "2012-10-17",
        "Statement": ec2_statements(owners, vpcs)
        + iam_statements(boundary_arn())
        + s3_statements(b, data_buckets)
        + kms_statements()
        + guardrail_statements(boundary_arn())
        + in_regions(regions),
    }


def instance_statements(bucket: str, data_buckets: Sequence[str] = ()) -> list[dict]:
    """What any instance of any sweep may need (the cap; each sweep's own role narrows it to its prefix): the
    store's objects, reading `data:` buckets, KMS through S3, and terminating or untagging instances of orch's."""
    data = [b for b in dict.fromkeys(data_buckets) if b != bucket]
    out = [
        {
            "Sid": "StoreObjects",
            "Effect": "Allow",
            "Resource": f"arn:aws:s3:::{bucket}/*",
            "Action": list(S3_OBJECT_ACTIONS),
        },
        {"Sid": "StoreList", "Effect": "Allow", "Resource": f"arn:aws:s3:::{bucket}", "Action": "s3:ListBucket"},
    ]
    if data:
        out += [
            {
                "Sid": "DataRead",
                "Effect": "Allow",
                "Resource": [f"arn:aws:s3:::{b}/*" for b in data],
                "Action": "s3:GetObject",
            },
            {
                "Sid": "DataList",
                "Effect": "Allow",
                "Resource": [f"arn:aws:s3:::{b}" for b in data],
                "Action": "s3:ListBucket",
            },
        ]
    out += [
        {
            "Sid": "OrchInstances",
            "Effect": "Allow",
            "Resource": "*",
            "Action": ["ec2:TerminateInstances", "ec2:DeleteTags"],
            "Condition": _tagged(SWEEP_TAG),
        },
        {
            "Sid": "KmsThroughS3",
            "Effect": "Allow",
            "Resource": KMS_KEYS,
            "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
            "Condition": KMS_VIA_S3,
        },
    ]
    return out


# What a remote controller (`orch launch --remote`) does on EC2 beyond a host: read, launch its sweep's hosts
# (CreateFleet through a launch template version of the sweep's template) and tag them at creation, and change or
# remove only what carries its sweep's tag. No IAM call but PassRole: the laptop made every role beforehand.
CONTROLLER_EC2_CREATE = ["ec2:CreatePlacementGroup"]
CONTROLLER_ON_SWEEP = [
    "ec2:RunInstances",
    "ec2:CreateFleet",
    "ec2:TerminateInstances",
    "ec2:CreateLaunchTemplateVersion",
    "ec2:DeleteLaunchTemplateVersions",
    "ec2:DeletePlacementGroup",
    "ec2:CreateTags",
    "ec2:DeleteTags",
]


def remote_controller_statements(
    tag_value: str = "",
    instance_types: Sequence[str] = (),
    owners: Sequence[str] = DEFAULT_IMAGE_OWNERS,
    vpcs: Sequence[str] = (),
) -> list[dict]:
    """EC2 for a sweep's remote controller, on resources tagged with its sweep (`tag_value`), or, empty, with any
    sweep (the boundary's cap: each controller role narrows it to its own sweep, its instance types and VPCs)."""
    on_sweep = {"StringEquals": {f"aws:ResourceTag/{SWEEP_TAG}": tag_value}} if tag_value else _tagged(SWEEP_TAG)
    return [
        {"Sid": "ControllerEc2Read", "Effect": "Allow", "Resource": "*", "Action": list(READ_ACTIONS)},
        {"Sid": "ControllerEc2Create", "Effect": "Allow", "Resource": "*", "Action": list(CONTROLLER_EC2_CREATE)},
        *launch_statements("ControllerLaunch", tag_value, instance_types, owners, vpcs),
        {
            "Sid": "ControllerEc2TagAtCreation",
            "Effect": "Allow",
            "Resource": "*",
            "Action": "ec2:CreateTags",
            "Condition": {
                "StringEquals": {"ec2:CreateAction": ["CreateFleet", "RunInstances", "CreatePlacementGroup"]}
            },
        },
        {
            "Sid": "ControllerEc2OnSweep",
            "Effect": "Allow",
            "Resource": "*",
            "Action": list(CONTROLLER_ON_SWEEP),
            "Condition": on_sweep,
        },
    ]


def pass_role_statement(role_arns: Sequence[str]) -> dict:
    """PassRole of exactly these roles, to EC2 only (a remote controller launching its sweep's hosts)."""
    return {
        "Sid": "PassHostRole",
        "Effect": "Allow",
        "Resource": list(role_arns),
        "Action": "iam:PassRole",
        "Condition": {"StringEquals": {"iam:PassedToService": EC2_SERVICE}},
    }


def boundary_policy(
    bucket: str | None = None,
    data_buckets: Sequence[str] = (),
    extra: Sequence[dict] = (),
    regions: Sequence[str] = (),
    owners: Sequence[str] = DEFAULT_IMAGE_OWNERS,
    vpcs: Sequence[str] = (),
) -> dict:
    """The permissions boundary `orch-boundary`: the most any role orch creates may do, whatever its own policy
    says: a host's, and a remote controller's (no more than the user policy already allows its holder, so no
    escalation; no IAM write at all), and only with credentials EC2 delivered to an instance (FROM_AN_INSTANCE).
    `extra` adds statements for roles of other kinds (each with its own Sid); `regions`, `owners` and `vpcs` as in
    controller_policy."""
    statements = (
        instance_statements(bucket or PLACEHOLDER, data_buckets)
        + remote_controller_statements(owners=owners, vpcs=vpcs)
        + [{**pass_role_statement(["arn:aws:iam::*:role/orch-*"]), "Sid": "ControllerPassRole"}]
        + list(extra)
        + in_regions(regions)
    )
    return {"Version": "2012-10-17", "Statement": [from_an_instance(st) for st in statements]}


def from_an_instance(statement: dict) -> dict:
    """An Allow that holds only for credentials EC2 delivered to an instance (its other conditions kept)."""
    if statement.get("Effect") != "Allow":
        return statement
    condition = dict(statement.get("Condition") or {})
    condition["Null"] = {**condition.get("Null", {}), **FROM_AN_INSTANCE["Null"]}
    return {**statement, "Condition": condition}
