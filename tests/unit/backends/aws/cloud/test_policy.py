"""The policy orch documents, held by someone hostile: what it must refuse (the fake's IAM gate evaluates it for
the controller's credentials as IAM does), and its grammar (what IAM's policy validation accepts)."""

from __future__ import annotations

import fnmatch
import functools
import json
import re

import pytest

from tests.fakecloud import BUCKET

ADMIN = "arn:aws:iam::aws:policy/AdministratorAccess"
TRUST = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
    }
)
EVERYTHING = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})


def _refused(call, code: str = ""):
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as got:
        call()
    err = got.value.response["Error"]["Code"]
    assert err in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation"), got.value
    assert not code or err == code, got.value


def _as_role(cloud, role: str, service: str, instance: str = "", region: str = "us-east-1"):
    """A client with credentials of `role`: delivered by EC2 to `instance` (as the IMDS hands them out), or, without
    one, assumed through STS by whoever the role's trust policy names."""
    import boto3

    c = cloud.client("sts").assume_role(RoleArn=f"arn:aws:iam::123456789012:role/{role}", RoleSessionName="hostile")
    c = c["Credentials"]
    if instance:
        cloud.gate.delivered(c["AccessKeyId"], role, instance)
    else:
        cloud.gate.roles[c["AccessKeyId"]] = role
    return boto3.client(
        service,
        region_name=region,
        endpoint_url=cloud.endpoint,
        aws_access_key_id=c["AccessKeyId"],
        aws_secret_access_key=c["SecretAccessKey"],
        aws_session_token=c["SessionToken"],
    )


def test_a_hostile_holder_of_the_documented_policy_cannot_escalate_or_touch_what_orch_did_not_make(cloud):
    """Every way the old policy made its holder an administrator, or let it destroy or open up someone else's
    resources, is refused; what orch itself does (a role under the boundary, tagging at creation, terminating its
    own instance) is allowed."""
    from orchestrator.backends.aws.cloud import ec2 as api
    from orchestrator.backends.aws.cloud.iam import account_boundary
    from orchestrator.backends.aws.cloud.policy import boundary_arn

    iam, ec2 = api.client("iam", "us-east-1"), api.client("ec2", "us-east-1")  # the controller's credentials
    admin_iam, admin_ec2 = cloud.client("iam"), cloud.client("ec2")  # someone else in the account
    boundary = account_boundary(iam)
    assert boundary == boundary_arn("123456789012")

    # roles: only with orch's boundary, and only roles that carry it can be changed
    _refused(lambda: iam.create_role(RoleName="orch-evil", AssumeRolePolicyDocument=TRUST))
    _refused(lambda: iam.create_role(RoleName="orch-evil", AssumeRolePolicyDocument=TRUST, PermissionsBoundary=ADMIN))
    iam.create_role(RoleName="orch-capped", AssumeRolePolicyDocument=TRUST, PermissionsBoundary=boundary)
    iam.put_role_policy(RoleName="orch-capped", PolicyName="all", PolicyDocument=EVERYTHING)  # capped, see below
    _refused(lambda: iam.attach_role_policy(RoleName="orch-capped", PolicyArn=ADMIN))
    _refused(lambda: iam.delete_role_permissions_boundary(RoleName="orch-capped"))
    _refused(lambda: iam.put_role_permissions_boundary(RoleName="orch-capped", PermissionsBoundary=ADMIN))
    admin_iam.create_role(RoleName="orch-legacy", AssumeRolePolicyDocument=TRUST)  # named orch-*, no boundary
    _refused(lambda: iam.put_role_policy(RoleName="orch-legacy", PolicyName="all", PolicyDocument=EVERYTHING))
    _refused(lambda: iam.delete_role(RoleName="orch-legacy"))
    _refused(lambda: iam.create_policy(PolicyName="orch-boundary-2", PolicyDocument=EVERYTHING))

    # the `*` inline policy gives the role no more than the boundary: another bucket stays closed to it
    admin_s3 = cloud.client("s3")
    admin_s3.create_bucket(Bucket="someone-elses")
    foreign = admin_ec2.run_instances(ImageId=cloud.image, MinCount=1, MaxCount=1, SubnetId=cloud.subnets[0])
    foreign = foreign["Instances"][0]
    on_an_instance = _as_role(cloud, "orch-capped", "s3", instance=foreign["InstanceId"])
    on_an_instance.put_object(Bucket=BUCKET, Key="pre/x", Body=b"1")  # within the boundary
    _refused(lambda: on_an_instance.put_object(Bucket="someone-elses", Key="x", Body=b"1"))
    # the same role assumed any other way than through an instance profile gets nothing, even inside the boundary
    _refused(lambda: _as_role(cloud, "orch-capped", "s3").put_object(Bucket=BUCKET, Key="pre/x", Body=b"1"))

    # passing roles: orch's, to EC2 only
    admin_iam.create_role(RoleName="admin-role", AssumeRolePolicyDocument=TRUST)
    iam.create_instance_profile(InstanceProfileName="orch-p")
    _refused(lambda: iam.add_role_to_instance_profile(InstanceProfileName="orch-p", RoleName="admin-role"))
    iam.add_role_to_instance_profile(InstanceProfileName="orch-p", RoleName="orch-capped")
    from tests.fakecloud.gate import CONTROLLER

    role = "arn:aws:iam::123456789012:role/orch-capped"
    assert cloud.gate._allowed(CONTROLLER, "iam:PassRole", role, {"iam:PassedToService": "ec2.amazonaws.com"})
    for other in ("lambda.amazonaws.com", "ecs-tasks.amazonaws.com", "cloudformation.amazonaws.com"):
        assert not cloud.gate._allowed(CONTROLLER, "iam:PassRole", role, {"iam:PassedToService": other})
    lam = api.client("lambda", "us-east-1")
    _refused(
        lambda: lam.create_function(
            FunctionName="f", Role=role, Runtime="python3.12", Handler="h.h", Code={"ZipFile": b"x"}
        )
    )

    # EC2: only what carries orch's tags; tags only at creation or onto what carries them
    fid = foreign["InstanceId"]
    _refused(lambda: ec2.terminate_instances(InstanceIds=[fid]), "UnauthorizedOperation")
    _refused(lambda: ec2.create_tags(Resources=[fid], Tags=[{"Key": "orch:sweep", "Value": "x"}]))
    _refused(lambda: ec2.create_image(InstanceId=fid, Name="stolen"))
    sg = admin_ec2.create_security_group(GroupName="theirs", Description="x", VpcId=cloud.vpc)["GroupId"]
    open22 = [{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]
    _refused(lambda: ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=open22))
    _refused(lambda: ec2.delete_security_group(GroupId=sg))
    image = cloud.register_image("someone's image")  # no orch:recipe tag
    _refused(lambda: ec2.deregister_image(ImageId=image))
    theirs = admin_ec2.create_launch_template(LaunchTemplateName="theirs", LaunchTemplateData={"ImageId": image})
    _refused(lambda: ec2.delete_launch_template(LaunchTemplateId=theirs["LaunchTemplate"]["LaunchTemplateId"]))

    group, tags = _orch_group(ec2, cloud, "mine"), _launch_tags("mine")
    mine = ec2.run_instances(
        ImageId=cloud.image,
        MinCount=1,
        MaxCount=1,
        SubnetId=cloud.subnets[0],
        SecurityGroupIds=[group],
        TagSpecifications=tags,
    )["Instances"][0]["InstanceId"]
    ec2.create_tags(Resources=[mine], Tags=[{"Key": "orch:slot:0", "Value": "r"}])  # it carries orch:sweep already
    api.terminate(ec2, [mine])

    assert {"iam:CreateRole", "ec2:TerminateInstances", "ec2:CreateTags", "iam:PassRole"} <= set(cloud.gate.denied)
    cloud.gate.denied.clear()
    admin_ec2.terminate_instances(InstanceIds=[fid])
    _delete_group_when_free(cloud, group)
    admin_ec2.delete_launch_template(LaunchTemplateName="theirs")
    admin_iam.remove_role_from_instance_profile(InstanceProfileName="orch-p", RoleName="orch-capped")
    admin_iam.delete_instance_profile(InstanceProfileName="orch-p")
    for r in ("orch-capped", "orch-legacy", "admin-role"):
        for p in admin_iam.list_role_policies(RoleName=r)["PolicyNames"]:
            admin_iam.delete_role_policy(RoleName=r, PolicyName=p)
        admin_iam.delete_role(RoleName=r)


def _launch_tags(sweep: str, **extra: str) -> list[dict]:
    tags = [{"Key": k, "Value": v} for k, v in {"orch:sweep": sweep, **extra}.items()]
    return [{"ResourceType": kind, "Tags": tags} for kind in ("instance", "volume", "network-interface")]


def _orch_group(ec2, cloud, sweep: str) -> str:
    spec = [{"ResourceType": "security-group", "Tags": [{"Key": "orch:sweep", "Value": sweep}]}]
    return ec2.create_security_group(
        GroupName=f"orch-{sweep}", Description="x", VpcId=cloud.vpc, TagSpecifications=spec
    )["GroupId"]


def _delete_group_when_free(cloud, group: str) -> None:
    """A group is deleted once no instance uses it (EC2's DependencyViolation until its instances are terminated)."""
    from botocore.exceptions import ClientError

    from orchestrator.wait import retry_until

    def gone() -> bool:
        try:
            cloud.client("ec2").delete_security_group(GroupId=group)
            return True
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in ("DependencyViolation", "InvalidGroup.NotFound"):
                raise
            return False

    retry_until(gone, 30, 0.2, f"security group {group} to be free")


def _instance(cloud, **tags) -> str:
    spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}] if tags else []
    return cloud.client("ec2").run_instances(
        ImageId=cloud.image, MinCount=1, MaxCount=1, SubnetId=cloud.subnets[0], TagSpecifications=spec
    )["Instances"][0]["InstanceId"]


def _capped_role(name: str, trust: str = TRUST) -> None:
    """A role the holder of the documented policy makes: orch's boundary (the only kind it may make), a `*` policy."""
    from orchestrator.backends.aws.cloud import ec2 as api
    from orchestrator.backends.aws.cloud.iam import account_boundary

    iam = api.client("iam", "us-east-1")
    iam.create_role(
        RoleName=name,
        AssumeRolePolicyDocument=trust,
        PermissionsBoundary=account_boundary(iam),
        Tags=[{"Key": "orch:sweep", "Value": "hostile"}],
    )
    iam.put_role_policy(RoleName=name, PolicyName="all", PolicyDocument=EVERYTHING)


def _remove_role(cloud, name: str) -> None:
    admin_iam = cloud.client("iam")
    for p in admin_iam.list_role_policies(RoleName=name)["PolicyNames"]:
        admin_iam.delete_role_policy(RoleName=name, PolicyName=p)
    admin_iam.delete_role(RoleName=name)


def test_a_role_the_holder_makes_that_trusts_another_account_gets_nothing(cloud):
    """The boundary holds only for credentials EC2 delivers to an instance (ec2:SourceInstanceARN): a role whose trust
    policy names an outside account, assumed from there, can do nothing, though its own policy says `*`."""
    outside = {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::999999999999:root"}, "Action": "sts:AssumeRole"}
    _capped_role("orch-outside", json.dumps({"Version": "2012-10-17", "Statement": [outside]}))
    ours = _instance(cloud, **{"orch:sweep": "mine"})
    _refused(lambda: _as_role(cloud, "orch-outside", "s3").put_object(Bucket=BUCKET, Key="pre/x", Body=b"1"))
    _refused(lambda: _as_role(cloud, "orch-outside", "s3").get_object(Bucket=BUCKET, Key="pre/x"))
    _refused(lambda: _as_role(cloud, "orch-outside", "ec2").describe_instances())
    _refused(lambda: _as_role(cloud, "orch-outside", "ec2").terminate_instances(InstanceIds=[ours]))
    cloud.client("ec2").terminate_instances(InstanceIds=[ours])
    _remove_role(cloud, "orch-outside")


def test_a_role_under_the_boundary_terminates_and_untags_only_instances_orch_tagged(cloud):
    """The boundary's own cap on terminating and untagging (not only the role's policy): a `*` role under it, on an
    instance, cannot end or untag an instance without `orch:sweep`; with the tag it can (a remote controller's need)."""
    _capped_role("orch-capped")
    theirs, ours = _instance(cloud), _instance(cloud, **{"orch:sweep": "mine", "orch:slot:0": "r"})
    ec2 = _as_role(cloud, "orch-capped", "ec2", instance=ours)
    _refused(lambda: ec2.terminate_instances(InstanceIds=[theirs]), "UnauthorizedOperation")
    _refused(lambda: ec2.delete_tags(Resources=[theirs], Tags=[{"Key": "Name"}]), "UnauthorizedOperation")
    ec2.delete_tags(Resources=[ours], Tags=[{"Key": "orch:slot:0"}])
    ec2.terminate_instances(InstanceIds=[ours])
    cloud.client("ec2").terminate_instances(InstanceIds=[theirs])
    _remove_role(cloud, "orch-capped")


def test_a_hosts_role_terminates_and_untags_only_its_own_instance(cloud):
    """Code on a run's host (it holds the host role's credentials) may end its own instance, never another run's host
    of the sweep nor the sweep's remote controller, which carry the same `orch:sweep` tag."""
    from orchestrator.backends.aws.cloud import ec2 as api
    from orchestrator.backends.aws.cloud.iam import ensure_instance_profile
    from orchestrator.backends.aws.cloud.teardown import teardown

    iam = api.client("iam", "us-east-1")
    ensure_instance_profile(iam, "mine", BUCKET, "sweeps")
    me = _instance(cloud, **{"orch:sweep": "mine", "orch:run": "a", "orch:slot:0": "a"})
    other = _instance(cloud, **{"orch:sweep": "mine", "orch:run": "b", "orch:slot:0": "b"})
    controller = _instance(cloud, **{"orch:sweep": "mine", "orch:role": "controller"})
    ec2 = _as_role(cloud, "orch-mine", "ec2", instance=me)
    for victim in (other, controller):
        _refused(lambda: ec2.terminate_instances(InstanceIds=[victim]), "UnauthorizedOperation")
    _refused(lambda: ec2.delete_tags(Resources=[other], Tags=[{"Key": "orch:slot:0"}]), "UnauthorizedOperation")
    ec2.delete_tags(Resources=[me], Tags=[{"Key": "orch:slot:0"}])
    ec2.terminate_instances(InstanceIds=[me])
    cloud.client("ec2").terminate_instances(InstanceIds=[other, controller])
    teardown(api.client("ec2", "us-east-1"), iam, "mine")


def test_the_boundary_stays_as_the_admin_made_it_even_for_a_holder_with_more_iam_rights(cloud):
    """AWS's delegation example: explicit Denies, so a holder who also has `*` (another policy of theirs) still
    cannot change or delete the boundary policy, nor remove or swap a role's boundary."""
    from orchestrator.backends.aws.cloud import ec2 as api
    from orchestrator.backends.aws.cloud.iam import account_boundary

    documented = cloud.gate.controller_policy
    cloud.gate.controller_policy = {
        **documented,
        "Statement": documented["Statement"] + json.loads(EVERYTHING)["Statement"],
    }
    try:
        iam = api.client("iam", "us-east-1")
        boundary = account_boundary(iam)
        _refused(lambda: iam.create_policy_version(PolicyArn=boundary, PolicyDocument=EVERYTHING, SetAsDefault=True))
        _refused(lambda: iam.set_default_policy_version(PolicyArn=boundary, VersionId="v1"))
        _refused(lambda: iam.delete_policy_version(PolicyArn=boundary, VersionId="v1"))
        _refused(lambda: iam.delete_policy(PolicyArn=boundary))
        _capped_role("orch-guarded")
        _refused(lambda: iam.delete_role_permissions_boundary(RoleName="orch-guarded"))
        _refused(lambda: iam.put_role_permissions_boundary(RoleName="orch-guarded", PermissionsBoundary=ADMIN))
        iam.put_role_permissions_boundary(RoleName="orch-guarded", PermissionsBoundary=boundary)  # the same one
        other = iam.create_policy(PolicyName="not-the-boundary", PolicyDocument=EVERYTHING)["Policy"]["Arn"]
        iam.delete_policy(PolicyArn=other)  # the `*` is in force: only the Denies hold
    finally:
        cloud.gate.controller_policy = documented
        cloud.gate.denied.clear()
    _remove_role(cloud, "orch-guarded")


# --- the grammar IAM accepts ------------------------------------------------------------------------
# IAM user guide, "Grammar of the IAM JSON policy language" and "IAM JSON policy elements: Condition operators";
# the condition keys each action takes: Service Authorization Reference (EC2, IAM, S3, KMS pages).

OPERATORS = {
    "StringEquals",
    "StringNotEquals",
    "StringEqualsIgnoreCase",
    "StringNotEqualsIgnoreCase",
    "StringLike",
    "StringNotLike",
    "ArnEquals",
    "ArnLike",
    "ArnNotEquals",
    "ArnNotLike",
    "Null",
    "Bool",
}
KEYS = {  # key -> (type, the actions of orch's policy that take it)
    "ec2:CreateAction": ("String", {"ec2:CreateTags"}),
    "iam:PermissionsBoundary": (
        "ARN",
        {
            "iam:CreateRole",
            "iam:PutRolePolicy",
            "iam:DeleteRolePolicy",
            "iam:DeleteRolePermissionsBoundary",
            "iam:PutRolePermissionsBoundary",
        },
    ),
    "ec2:SourceInstanceARN": ("ARN", None),  # a global key: any action, when credentials came from an instance
    "iam:PassedToService": ("String", {"iam:PassRole"}),
    "iam:AWSServiceName": ("String", {"iam:CreateServiceLinkedRole"}),
    "kms:ViaService": ("String", {"kms:Decrypt", "kms:GenerateDataKey"}),
    "aws:ResourceTag/": ("String", None),  # every EC2 action of the policy that has a tagged resource
    "aws:TagKeys": ("String", {"ec2:CreateTags", "ec2:DeleteTags", "ec2:RunInstances", "ec2:CreateFleet"}),
    # instance, volume, fleet, … of a launch; the image and snapshots of CreateImage and CopyImage (the Service
    # Authorization Reference, as parliament's iam_definition.json has it)
    "aws:RequestTag/": ("String", {"ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateImage", "ec2:CopyImage"}),
    "ec2:Owner": ("String", {"ec2:RunInstances", "ec2:CreateFleet"}),  # an image's, a snapshot's
    "ec2:InstanceType": ("String", {"ec2:RunInstances", "ec2:CreateFleet"}),
    "ec2:Vpc": ("ARN", {"ec2:RunInstances", "ec2:CreateFleet"}),  # a subnet's
    "aws:RequestedRegion": ("String", None),  # a global key: every request
    "s3:prefix": ("String", {"s3:ListBucket"}),
}
VARIABLES = {"aws:PrincipalAccount", "ec2:InstanceID"}  # keys usable as policy variables
SERVICE_ARN = {
    "ec2": r"arn:aws:ec2:[a-z0-9*-]*:[0-9*]*:[a-z-]+/.+",
    "iam": r"arn:aws:iam::[0-9*]+:(role|instance-profile|policy)/.+",
    "s3": r"arn:aws:s3:::[a-z0-9.-]+(/.*)?",
    "kms": r"arn:aws:kms:[a-z0-9*-]*:[0-9*]*:key/.+",
}
PERMISSION_ONLY = {"iam:PassRole", "s3:ListBucket", "s3:GetEncryptionConfiguration"}


def _as_list(v):
    return v if isinstance(v, list) else [v]


@functools.cache  # a service model is megabytes of JSON: load each once, not once per action
def _operations(service: str) -> frozenset:
    import botocore.session

    return frozenset(botocore.session.get_session().get_service_model(service).operation_names)


def check_grammar(doc: dict) -> None:
    assert doc["Version"] == "2012-10-17" and set(doc) == {"Version", "Statement"}
    sids = [st["Sid"] for st in doc["Statement"] if "Sid" in st]
    assert len(sids) == len(set(sids)) and all(re.fullmatch(r"[A-Za-z0-9]+", s) for s in sids), sids
    for st in doc["Statement"]:
        assert set(st) <= {"Sid", "Effect", "Action", "Resource", "Condition"} and st["Effect"] in ("Allow", "Deny")
        actions = _as_list(st["Action"])
        for a in actions:
            service, _, name = a.partition(":")
            if name == "*":  # a whole service: only ever denied (the regions' guardrail), never allowed
                assert st["Effect"] == "Deny", st
                continue
            ops = _operations({"s3": "s3", "kms": "kms"}.get(service, service))
            if name.endswith("*"):  # a few reads named together (the policy's size): each match a real Describe
                named = fnmatch.filter(ops, name)
                assert named and all(o.startswith("Describe") for o in named), (a, named)
                continue
            assert a in PERMISSION_ONLY or name in ops, a
        for r in _as_list(st["Resource"]):
            # IAM fills in a variable in a Resource only after the ARN's fifth colon, never in its account (IAM user
            # guide, "IAM policy elements: Variables and tags", "Where you can use policy variables")
            head = re.sub(r"\$\{[^}]*\}", "\x00", r).split(":")[:5]
            assert "\x00" not in "".join(head), (st.get("Sid"), r)
            r = r.replace("${aws:PrincipalAccount}", "123456789012").replace("YOUR-BUCKET", "your-bucket")
            assert r == "*" or any(re.fullmatch(SERVICE_ARN[a.partition(":")[0]], r) for a in actions), (st, r)
            assert "alias/" not in r, r  # KMS: an alias is no policy resource
        for op, pairs in (st.get("Condition") or {}).items():
            qualifier, _, op = op.rpartition(":")
            assert qualifier in ("", "ForAllValues", "ForAnyValue"), qualifier
            assert not qualifier or set(pairs) == {"aws:TagKeys"}, pairs  # a set operator needs a multivalued key
            base = op.removesuffix("IfExists")
            assert base in OPERATORS, op
            for key, values in pairs.items():
                entry = KEYS.get(key) or KEYS.get(key.split("/")[0] + "/")
                assert entry, key
                kind, takes = entry
                assert takes is None or set(actions) <= takes, (key, actions)
                if base == "Null":
                    assert all(v in ("true", "false") for v in _as_list(values)), values
                else:
                    assert base.startswith("String") or (kind == "ARN" and base.startswith("Arn")), (op, key)
                for v in _as_list(values):
                    for var in re.findall(r"\$\{([^}]+)\}", v):
                        assert var in VARIABLES, var
    size = len(re.sub(r"\s", "", json.dumps(doc)))
    assert size <= 6144, size  # a managed policy's limit, white space not counted (IAM and STS quotas)


def test_the_documented_policy_and_boundary_are_valid_iam_grammar():
    from orchestrator.backends.aws.cloud.iam import instance_profile_policy
    from orchestrator.backends.aws.cloud.policy import boundary_policy, controller_policy

    for doc in (
        controller_policy(),
        controller_policy("my-bucket", ["my-data", "more-data"]),
        boundary_policy("my-bucket", ["my-data"]),
        instance_profile_policy("my-bucket", "sweeps", "mine", ["s3://my-data/x"], ["alias/k"]),
    ):
        check_grammar(doc)
    with pytest.raises(AssertionError):  # the check can fail: an alias ARN as a resource
        check_grammar(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Action": "kms:Decrypt", "Resource": "arn:aws:kms:us-east-1:1:alias/a"}
                ],
            }
        )
    with pytest.raises(AssertionError):  # an operator IAM does not have
        check_grammar(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Action": "iam:PassRole", "Resource": "*", "Condition": {"Equals": {"a": "b"}}}
                ],
            }
        )


def test_a_policy_variable_fills_only_the_resource_part_of_an_arn_so_the_boundarys_deny_names_no_variable():
    """IAM user guide, "IAM policy elements: Variables and tags": in a Resource, "You can't use a variable to replace
    parts of the ARN before the fifth colon, such as the service or account". DenyChangingTheBoundary named
    `arn:aws:iam::${aws:PrincipalAccount}:policy/orch-boundary`, which no policy matches: its Deny denied nothing to
    a holder an admin also gave `iam:*` (the gate filled the account in, kinder than IAM, so no test saw it)."""
    from orchestrator.backends.aws.cloud.policy import BOUNDARY_POLICY_CHANGES, controller_policy
    from tests.fakecloud.gate import evaluate

    ctx = {"aws:PrincipalAccount": "123456789012"}
    also_admin = [controller_policy(), json.loads(EVERYTHING)]
    boundary = "arn:aws:iam::123456789012:policy/orch-boundary"
    for action in BOUNDARY_POLICY_CHANGES:
        assert not evaluate(also_admin, action, boundary, ctx), action
    assert evaluate(also_admin, "iam:CreatePolicyVersion", "arn:aws:iam::123456789012:policy/theirs", ctx)
    check_grammar(controller_policy())
    # the gate fills in variables as IAM does: in the resource part, not in the account
    before = {
        "Effect": "Allow",
        "Action": "iam:DeletePolicy",
        "Resource": "arn:aws:iam::${aws:PrincipalAccount}:policy/p",
    }
    after = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/${aws:PrincipalAccount}/*"}
    assert not evaluate([{"Statement": [before]}], "iam:DeletePolicy", "arn:aws:iam::123456789012:policy/p", ctx)
    assert evaluate([{"Statement": [after]}], "s3:GetObject", "arn:aws:s3:::b/123456789012/x", ctx)
    with pytest.raises(AssertionError):  # the grammar check refuses a variable in the account
        check_grammar({"Version": "2012-10-17", "Statement": [before]})
    check_grammar({"Version": "2012-10-17", "Statement": [{**before, "Resource": "arn:aws:iam::*:policy/p"}]})


def test_a_remote_controllers_role_reaches_only_its_own_sweep(cloud):
    """The role `orch launch --remote` gives a sweep's controller, evaluated with orch's boundary as IAM would:
    its sweep's prefix and tagged resources, passing only its sweep's host role, no IAM write."""
    from orchestrator.backends.aws.cloud import ec2 as api
    from orchestrator.backends.aws.cloud.iam import (
        controller_iam_name,
        ensure_controller_profile,
        ensure_instance_profile,
    )

    iam = api.client("iam", "us-east-1")  # the laptop's credentials make both roles, under the boundary
    ensure_instance_profile(iam, "mine", BUCKET, "sweeps")
    ensure_controller_profile(iam, "mine", BUCKET, "sweeps", "orch-mine")
    from tests.fakecloud.gate import on_instance

    role, acct = on_instance(controller_iam_name("mine"), "i-c"), "arn:aws:iam::123456789012"
    allowed = cloud.gate._allowed

    def instance(tags):
        return "arn:aws:ec2:us-east-1:123456789012:instance/i-1", {f"aws:ResourceTag/{k}": v for k, v in tags.items()}

    ec2_service = {"iam:PassedToService": "ec2.amazonaws.com"}
    assert allowed(role, "s3:PutObject", f"arn:aws:s3:::{BUCKET}/sweeps/mine/x", {})
    assert not allowed(role, "s3:PutObject", f"arn:aws:s3:::{BUCKET}/sweeps/other/x", {})
    assert not allowed(role, "s3:GetObject", f"arn:aws:s3:::{BUCKET}/sweeps/other/status.json", {})
    assert allowed(role, "ec2:TerminateInstances", *instance({"orch:sweep": "mine"}))
    assert not allowed(role, "ec2:TerminateInstances", *instance({"orch:sweep": "other"}))
    assert not allowed(role, "ec2:TerminateInstances", *instance({}))
    # launches: only its sweep's, scoped per resource type (what each refuses: the launch tests below)
    fleet = "arn:aws:ec2:us-east-1:123456789012:fleet/new"
    assert allowed(role, "ec2:CreateFleet", fleet, {"aws:RequestTag/orch:sweep": "mine", "aws:TagKeys": ["orch:sweep"]})
    assert not allowed(role, "ec2:CreateFleet", fleet, {"aws:RequestTag/orch:sweep": "other"})
    assert not allowed(role, "ec2:CreateFleet", "*", {})
    assert not allowed(role, "ec2:CreateTags", *instance({}))  # tags only at creation or on its sweep's
    assert allowed(role, "iam:PassRole", f"{acct}:role/orch-mine", ec2_service)
    assert not allowed(role, "iam:PassRole", f"{acct}:role/orch-other", ec2_service)
    assert not allowed(role, "iam:PassRole", f"{acct}:role/orch-mine", {"iam:PassedToService": "lambda.amazonaws.com"})
    for action in ("iam:CreateRole", "iam:PutRolePolicy", "iam:AttachRolePolicy", "iam:DeleteRole"):
        assert not allowed(role, action, f"{acct}:role/orch-mine", {})
    for action in ("ec2:AuthorizeSecurityGroupIngress", "ec2:CreateSecurityGroup", "ec2:DeleteSecurityGroup"):
        assert not allowed(role, action, "*", {"aws:ResourceTag/orch:sweep": "mine"})
    from orchestrator.backends.aws.cloud.teardown import teardown

    teardown(api.client("ec2", "us-east-1"), iam, "mine")


def test_a_hosts_role_removes_only_the_slot_and_rung_tags_of_its_sweeps_instances(cloud):
    """What code on a host (the user's command has its role's credentials) may untag: its sweep's instances' slot
    and rung tags, named. Not `orch:sweep` or `orch:run` (the instance would vanish from the controller's listing
    and bill until its safety net), not a DeleteTags without tags (which removes every tag), not another sweep's."""
    from orchestrator.backends.aws.cloud import ec2 as api
    from orchestrator.backends.aws.cloud.iam import ensure_instance_profile
    from tests.fakecloud.gate import on_instance

    iam = api.client("iam", "us-east-1")
    ensure_instance_profile(iam, "mine", BUCKET, "sweeps")
    allowed, ARN = cloud.gate._allowed, "arn:aws:ec2:us-east-1:123456789012:instance"

    def untag(keys, sweep="mine", target="i-1"):
        ctx = {"aws:ResourceTag/orch:sweep": sweep, "ec2:InstanceID": target, **({"aws:TagKeys": keys} if keys else {})}
        return allowed(on_instance("orch-mine", "i-1"), "ec2:DeleteTags", f"{ARN}/{target}", ctx)

    assert untag(["orch:rung:2"]) and untag(["orch:slot:0"]) and untag(["orch:rung:1", "orch:rung:0.5"])
    assert not untag(["orch:sweep"]) and not untag(["orch:run"]) and not untag(["orch:rung:1", "orch:sweep"])
    assert not untag([])  # no Tag.N: every tag would go
    assert not untag(["orch:rung:2"], sweep="other")
    assert not untag(["orch:slot:0"], target="i-2")  # another instance of the sweep: only its own host gives it back
    from orchestrator.backends.aws.cloud.teardown import teardown

    teardown(api.client("ec2", "us-east-1"), iam, "mine")


def test_the_policy_and_boundary_help_say_how_to_create_them_as_they_are_now(orch):
    """The printed policy is longer than a user's inline policies may be (2,048 characters): the help says to create
    a managed policy and attach it, as README and docs/aws.md do; the boundary's help covers the remote controller."""
    from orchestrator.backends.aws.cloud.policy import controller_policy

    assert len(re.sub(r"\s", "", json.dumps(controller_policy()))) > 2048
    policy = orch("aws", "policy", "--help")
    assert policy.code == 0 and "put-user-policy" not in policy.out, policy.out
    assert "aws iam create-policy" in policy.out and "attach-user-policy" in policy.out, policy.out
    boundary = orch("aws", "boundary", "--help")
    assert boundary.code == 0 and "--remote" in boundary.out and "ec2:SourceInstanceARN" in boundary.out, boundary.out


# --- an IAM linter no one here wrote -----------------------------------------------------------------
# parliament (duo-labs, pinned in the dev extra) checks actions, resources and condition keys against AWS's Service
# Authorization Reference. Every finding it has on what orch prints is explained in docs/aws.md ("What parliament
# says"), in a row that names the finding and each action it names; a new finding fails here.


def _parliament(doc: dict) -> list:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # parliament imports pkg_resources, which warns of its own removal
        from parliament import analyze_policy_string

    return analyze_policy_string(json.dumps(doc)).findings


def _named(finding) -> list:
    """The actions (and condition keys) a finding names, each to be named in its explanation."""
    detail = finding.detail
    if isinstance(detail, list):
        return [d["action"] if isinstance(d, dict) else d for d in detail]
    return re.findall(r"(?:condition|action) ([\w:/-]+)", str(detail))


def _unexplained(doc: dict, page: str) -> list:
    section = page.split("### What parliament says", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [
        (f.issue, f.detail)
        for f in _parliament(doc)
        if not any(f"`{f.issue}`" in row and all(f"`{n}`" in row for n in _named(f)) for row in rows)
    ]


def test_parliament_finds_nothing_in_the_policy_and_boundary_that_docs_aws_md_does_not_explain():
    from pathlib import Path

    from orchestrator.backends.aws.cloud.policy import boundary_policy, controller_policy

    page = (Path(__file__).resolve().parents[5] / "docs" / "aws.md").read_text()
    for doc in (controller_policy(), controller_policy("my-bucket", ["my-data"]), boundary_policy("my-bucket")):
        assert not _unexplained(doc, page)
    wild = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}]}
    assert _unexplained(wild, page)  # the check can fail: a finding no row explains


# --- launches, scoped per resource type (RunInstances, CreateFleet) --------------------------------------------------


def _az(cloud, subnet: str) -> str:
    return cloud.client("ec2").describe_subnets(SubnetIds=[subnet])["Subnets"][0]["AvailabilityZone"]


def test_a_holder_launches_only_tagged_instances_with_orchs_groups_images_and_snapshots(cloud):
    """What a holder of the documented policy may launch: everything it creates tagged orch:sweep (and only orch's
    tag keys), with a security group and launch template orch tagged, from an image of an allowed owner whose
    snapshots are not the account's untagged data. Each other way is refused, through RunInstances and CreateFleet."""
    from orchestrator.backends.aws.cloud import ec2 as api

    ec2, admin = api.client("ec2", "us-east-1"), cloud.client("ec2")
    group = _orch_group(ec2, cloud, "mine")
    theirs = admin.create_security_group(GroupName="db-clients", Description="x", VpcId=cloud.vpc)["GroupId"]
    volume = admin.create_volume(AvailabilityZone=_az(cloud, cloud.subnets[0]), Size=1)["VolumeId"]
    backup = admin.create_snapshot(VolumeId=volume)["SnapshotId"]  # the account's data, e.g. a database's backup
    by_hand = cloud.register_image("a server's image", orch_tagged=False)  # the account's, its snapshot untagged

    def launch(**changes):
        args = {
            "ImageId": cloud.image,
            "MinCount": 1,
            "MaxCount": 1,
            "SubnetId": cloud.subnets[0],
            "SecurityGroupIds": [group],
            "TagSpecifications": _launch_tags("mine"),
            **changes,
        }
        return ec2.run_instances(**{k: v for k, v in args.items() if v is not None})["Instances"][0]["InstanceId"]

    no = "UnauthorizedOperation"
    _refused(lambda: launch(SecurityGroupIds=[theirs]), no)  # a group someone else's database trusts
    _refused(lambda: launch(SecurityGroupIds=None), no)  # none named: the VPC's default group
    _refused(lambda: launch(TagSpecifications=None), no)  # an untagged launch
    _refused(lambda: launch(TagSpecifications=_launch_tags("mine")[:1]), no)  # its volume untagged
    _refused(lambda: launch(TagSpecifications=_launch_tags("mine", team="payments")), no)  # a tag key not orch's
    attach = [{"DeviceName": "/dev/sdf", "Ebs": {"SnapshotId": backup}}]
    _refused(lambda: launch(BlockDeviceMappings=attach), no)  # read the account's snapshot on a new volume
    _refused(lambda: launch(ImageId=by_hand), no)  # an image whose snapshot is the account's untagged data

    # CreateFleet through a template of the holder's own (tagged at creation) that names their group
    spec = [{"ResourceType": "launch-template", "Tags": [{"Key": "orch:sweep", "Value": "mine"}]}]
    template = ec2.create_launch_template(
        LaunchTemplateName="orch-mine",
        LaunchTemplateData={"ImageId": cloud.image, "SecurityGroupIds": [theirs]},
        TagSpecifications=spec,
    )["LaunchTemplate"]["LaunchTemplateId"]
    fleet = {
        "Type": "instant",
        "TargetCapacitySpecification": {"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "on-demand"},
        "LaunchTemplateConfigs": [
            {
                "LaunchTemplateSpecification": {"LaunchTemplateId": template, "Version": "1"},
                "Overrides": [{"InstanceType": "g5.xlarge", "SubnetId": cloud.subnets[0]}],
            }
        ],
        "TagSpecifications": [
            {"ResourceType": kind, "Tags": [{"Key": "orch:sweep", "Value": "mine"}]}
            for kind in ("instance", "volume", "fleet")
        ],
    }
    _refused(lambda: ec2.create_fleet(**fleet), no)  # its instant fleet's RunInstances may not use that group
    assert set(cloud.gate.denied) == {"ec2:RunInstances"}, cloud.gate.denied

    mine = launch()  # what orch does: all of it tagged, its own group, an allowed image
    api.terminate(ec2, [mine])
    cloud.gate.denied.clear()
    admin.delete_launch_template(LaunchTemplateId=template)
    for g in (group, theirs):
        _delete_group_when_free(cloud, g)
    admin.delete_snapshot(SnapshotId=backup)
    admin.delete_volume(VolumeId=volume)


def test_a_remote_controllers_role_launches_only_its_sweeps_types_with_its_tag_in_its_vpc(cloud):
    """The role `--remote` gives a sweep's controller, on its instance, evaluated with orch's boundary: a launch of
    another instance type, for another sweep, or into a subnet of another VPC is refused; its own is not."""
    from orchestrator.backends.aws.cloud import ec2 as api
    from orchestrator.backends.aws.cloud.iam import (
        LaunchScope,
        controller_iam_name,
        ensure_controller_profile,
        ensure_instance_profile,
    )
    from orchestrator.backends.aws.cloud.teardown import teardown

    iam, admin = api.client("iam", "us-east-1"), cloud.client("ec2")
    ensure_instance_profile(iam, "mine", BUCKET, "sweeps")
    scope = LaunchScope(instance_types=("g5.xlarge",), owners=("self",), vpcs=(cloud.vpc,), regions=("us-east-1",))
    ensure_controller_profile(iam, "mine", BUCKET, "sweeps", "orch-mine", scope=scope)
    group = _orch_group(admin, cloud, "mine")
    other_vpc = admin.create_vpc(CidrBlock="10.99.0.0/16")["Vpc"]["VpcId"]
    elsewhere = admin.create_subnet(VpcId=other_vpc, CidrBlock="10.99.1.0/24")["Subnet"]["SubnetId"]
    spec = [{"ResourceType": "security-group", "Tags": [{"Key": "orch:sweep", "Value": "mine"}]}]
    group_elsewhere = admin.create_security_group(
        GroupName="orch-mine-2", Description="x", VpcId=other_vpc, TagSpecifications=spec
    )["GroupId"]
    ctl = _instance(cloud, **{"orch:sweep": "mine", "orch:role": "controller"})
    ec2 = _as_role(cloud, controller_iam_name("mine"), "ec2", instance=ctl)

    def launch(instance_type="g5.xlarge", sweep="mine", subnet=cloud.subnets[0], sg=group):
        return ec2.run_instances(
            ImageId=cloud.image,
            MinCount=1,
            MaxCount=1,
            InstanceType=instance_type,
            SubnetId=subnet,
            SecurityGroupIds=[sg],
            TagSpecifications=_launch_tags(sweep),
        )["Instances"][0]["InstanceId"]

    no = "UnauthorizedOperation"
    _refused(lambda: launch(instance_type="p5.48xlarge"), no)  # a type outside the sweep's
    _refused(lambda: launch(sweep="other"), no)  # another sweep's
    _refused(lambda: launch(subnet=elsewhere, sg=group_elsewhere), no)  # a subnet of another VPC
    assert ("orch-mine.controller", "ec2:RunInstances") in cloud.gate.role_denied
    host = launch()
    admin.terminate_instances(InstanceIds=[host, ctl])
    for g in (group, group_elsewhere):
        _delete_group_when_free(cloud, g)
    admin.delete_subnet(SubnetId=elsewhere)
    admin.delete_vpc(VpcId=other_vpc)
    teardown(api.client("ec2", "us-east-1"), iam, "mine")


def test_ec2_outside_the_regions_given_is_refused_to_the_holder_and_to_every_role_orch_makes(cloud, orch):
    """`orch aws policy --region` / `orch aws boundary --region`, and the roles orch makes for a sweep (its region):
    EC2 in a region not listed is refused (aws:RequestedRegion); the listed ones and IAM (global) still answer."""
    from orchestrator.backends.aws.cloud import ec2 as api
    from orchestrator.backends.aws.cloud.iam import (
        LaunchScope,
        controller_iam_name,
        ensure_controller_profile,
        ensure_instance_profile,
    )
    from orchestrator.backends.aws.cloud.policy import boundary_policy, controller_policy
    from tests.fakecloud.cloud import DATA_BUCKETS
    from tests.fakecloud.gate import evaluate

    printed = orch("aws", "policy", "--bucket", BUCKET, "--region", "us-east-1", "--region", "eu-west-1")
    assert printed.code == 0 and json.loads(printed.out) == controller_policy(BUCKET, (), ["us-east-1", "eu-west-1"])
    boundary = orch("aws", "boundary", "--bucket", BUCKET, "--region", "us-east-1")
    assert boundary.code == 0 and json.loads(boundary.out) == boundary_policy(BUCKET, regions=["us-east-1"])
    documented = cloud.gate.controller_policy
    cloud.gate.controller_policy = controller_policy(BUCKET, DATA_BUCKETS, ["us-east-1", "eu-west-1"])
    try:
        api.client("ec2", "us-east-1").describe_instances()
        api.client("ec2", "eu-west-1").describe_instances()
        _refused(lambda: api.client("ec2", "us-west-2").describe_instances(), "UnauthorizedOperation")
        api.client("iam", "us-east-1").list_instance_profiles()
    finally:
        cloud.gate.controller_policy = documented
        cloud.gate.denied.clear()

    ctx = {"ec2:SourceInstanceARN": "arn:aws:ec2:us-east-1:123456789012:instance/i-1"}
    capped = boundary_policy(BUCKET, regions=["us-east-1"])
    for region, allowed in (("us-east-1", True), ("us-west-2", False)):
        assert evaluate([capped], "ec2:DescribeInstances", "*", {**ctx, "aws:RequestedRegion": region}) is allowed

    iam = api.client("iam", "us-east-1")
    ensure_instance_profile(iam, "mine", BUCKET, "sweeps", regions=("us-east-1",))
    ensure_controller_profile(iam, "mine", BUCKET, "sweeps", "orch-mine", scope=LaunchScope(regions=("us-east-1",)))
    host = _instance(cloud, **{"orch:sweep": "mine"})
    ctl = _instance(cloud, **{"orch:sweep": "mine", "orch:role": "controller"})
    controller = _as_role(cloud, controller_iam_name("mine"), "ec2", instance=ctl, region="us-west-2")
    _refused(lambda: controller.describe_instances(), "UnauthorizedOperation")
    _as_role(cloud, controller_iam_name("mine"), "ec2", instance=ctl).describe_instances()
    on_host = _as_role(cloud, "orch-mine", "ec2", instance=host, region="us-west-2")
    _refused(lambda: on_host.terminate_instances(InstanceIds=[host]), "UnauthorizedOperation")
    _as_role(cloud, "orch-mine", "ec2", instance=host).terminate_instances(InstanceIds=[host])
    cloud.client("ec2").terminate_instances(InstanceIds=[ctl])
    from orchestrator.backends.aws.cloud.teardown import teardown

    teardown(api.client("ec2", "us-east-1"), iam, "mine")


def test_the_printed_policy_fits_a_managed_policy_and_a_longer_one_is_refused_with_the_fix(orch):
    """IAM refuses a managed policy over 6,144 characters (white space not counted): a policy with a bucket and a data
    bucket of 63 characters, three regions, two image owners and a VPC fits; one that would not is an error."""
    bucket, data = "b" * 63, "d" * 63
    regions = ["--region", "us-east-1", "--region", "us-west-2", "--region", "eu-west-1"]
    scope = ["--image-owner", "amazon", "--image-owner", "099720109477", "--vpc", "vpc-0123456789abcdef0"]
    for command in ("policy", "boundary"):
        r = orch("aws", command, "--bucket", bucket, "--data-bucket", data, *regions, *scope)
        assert r.code == 0, r.out + r.err
        assert len(re.sub(r"\s", "", r.out)) <= 6144
    many = [x for region in ("ap-south-1", "ca-central-1", "sa-east-1", "eu-north-1") for x in ("--region", region)]
    more = ["--data-bucket", "e" * 63, "--data-bucket", "f" * 63]
    r = orch("aws", "policy", "--bucket", bucket, "--data-bucket", data, *regions, *many, *more, *scope)
    assert r.code == 2 and "6,144" in r.err and "--region" in r.err and "Traceback" not in r.err, r.out + r.err


@pytest.mark.parametrize(
    "given, says",
    [
        ("US-EAST-1", "write --region us-east-1"),
        (" us-west-2", "write --region us-west-2"),
        ("us-east-1,us-west-2", "one region per --region"),
        ("*", "one region per --region"),
        ("", "one region per --region"),
    ],
)
def test_a_region_name_that_is_no_regions_is_refused_by_policy_and_boundary(orch, given, says):
    """The documents Deny EC2 outside the regions named: a misspelt name printed into them would shut orch out of
    every region (a hostile newcomer's find: exit 0 and `"aws:RequestedRegion": ["US-EAST-1"]`)."""
    for command in ("policy", "boundary"):
        r = orch("aws", command, "--bucket", "my-bucket", "--region", "us-east-1", "--region", given)
        assert r.code == 2 and says in r.err and r.out == "" and "Traceback" not in r.err, (command, r.out, r.err)


def test_a_region_given_twice_is_named_once(orch):
    r = orch(
        "aws",
        "policy",
        "--bucket",
        "my-bucket",
        "--region",
        "us-west-2",
        "--region",
        "us-east-1",
        "--region",
        "us-west-2",
    )
    assert r.code == 0, r.err
    named = [
        s["Condition"]["StringNotEquals"]["aws:RequestedRegion"]
        for s in json.loads(r.out)["Statement"]
        if "aws:RequestedRegion" in s.get("Condition", {}).get("StringNotEquals", {})
    ]
    assert named and all(n == ["us-west-2", "us-east-1"] for n in named), named


def test_a_remote_controllers_role_in_a_home_region_outside_its_list_may_only_end_itself_there():
    """`--remote` runs the controller in the sweep's home region (its bucket's), which the sweep need not list: there
    its role may read EC2 and end its own instance (what the supervisor and watchdog do), and launch nothing; in the
    listed regions it launches as before; elsewhere nothing."""
    from orchestrator.backends.aws.cloud.iam import LaunchScope, controller_role_policy
    from tests.fakecloud.gate import evaluate

    scope = LaunchScope(regions=("us-east-1", "us-west-2"), home="eu-west-1")
    doc = controller_role_policy(BUCKET, "sweeps", "mine", "arn:aws:iam::123456789012:role/orch-mine", scope=scope)
    tagged = {"aws:ResourceTag/orch:sweep": "mine"}
    instance = "arn:aws:ec2:REGION:123456789012:instance/i-1"
    template = "arn:aws:ec2:REGION:123456789012:launch-template/lt-1"

    def allowed(action: str, resource: str, region: str) -> bool:
        return evaluate([doc], action, resource.replace("REGION", region), {**tagged, "aws:RequestedRegion": region})

    for region, ends, launches in (("eu-west-1", True, False), ("us-west-2", True, True), ("ap-south-1", False, False)):
        assert allowed("ec2:DescribeInstances", "*", region) is ends, region
        assert allowed("ec2:TerminateInstances", instance, region) is ends, region
        assert allowed("ec2:CreateLaunchTemplateVersion", template, region) is launches, region
        assert allowed("ec2:CreateFleet", template, region) is launches, region
    listed = LaunchScope(regions=("us-east-1", "us-west-2"), home="us-west-2")  # a listed home: no Deny of its own
    assert "NoLaunchInHome" not in json.dumps(
        controller_role_policy(BUCKET, "sweeps", "mine", "arn:aws:iam::1:role/orch-mine", scope=listed)
    )
