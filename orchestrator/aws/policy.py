"""The IAM policy the credentials that run `orch` need: one source, printed by `orch aws policy`, shown in
docs/aws.md (a test keeps the two equal), and enforced by the fake cloud on every controller call in the
tests, so a call this policy does not allow fails a test before it fails a user."""

from __future__ import annotations

from typing import Optional

EC2_ACTIONS = [
    # what a sweep looks up
    "ec2:DescribeImages",
    "ec2:DescribeVpcs",
    "ec2:DescribeSubnets",
    "ec2:DescribeInstances",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeInstanceTypeOfferings",
    "ec2:DescribeSpotPriceHistory",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeLaunchTemplates",
    "ec2:DescribeLaunchTemplateVersions",
    "ec2:DescribePlacementGroups",
    # what a sweep makes, uses and removes
    "ec2:CreateSecurityGroup",
    "ec2:AuthorizeSecurityGroupIngress",
    "ec2:DeleteSecurityGroup",
    "ec2:CreateLaunchTemplate",
    "ec2:CreateLaunchTemplateVersion",
    "ec2:DeleteLaunchTemplateVersions",
    "ec2:DeleteLaunchTemplate",
    "ec2:CreateFleet",
    "ec2:RunInstances",
    "ec2:CreateTags",
    "ec2:DeleteTags",
    "ec2:TerminateInstances",
    "ec2:CreatePlacementGroup",
    "ec2:DeletePlacementGroup",
    # orch ami: build (CreateImage on the running builder: no StopInstances), copy, remove
    "ec2:CreateImage",
    "ec2:CopyImage",
    "ec2:DeregisterImage",
    "ec2:DeleteSnapshot",
]
IAM_ACTIONS = [
    "iam:CreateRole",
    "iam:TagRole",
    "iam:PutRolePolicy",
    "iam:ListRolePolicies",
    "iam:DeleteRolePolicy",
    "iam:DeleteRole",
    "iam:PassRole",
    "iam:CreateInstanceProfile",
    "iam:TagInstanceProfile",
    "iam:GetInstanceProfile",
    "iam:AddRoleToInstanceProfile",
    "iam:RemoveRoleFromInstanceProfile",
    "iam:DeleteInstanceProfile",
]
S3_OBJECT_ACTIONS = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
PLACEHOLDER = "YOUR-BUCKET"


def controller_policy(bucket: Optional[str] = None) -> dict:
    """The policy document, with the store's bucket filled in (or YOUR-BUCKET)."""
    b = bucket or PLACEHOLDER
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "Ec2", "Effect": "Allow", "Resource": "*", "Action": list(EC2_ACTIONS)},
            {
                "Sid": "Iam",
                "Effect": "Allow",
                "Resource": ["arn:aws:iam::*:role/orch-*", "arn:aws:iam::*:instance-profile/orch-*"],
                "Action": list(IAM_ACTIONS),
            },
            {"Sid": "IamList", "Effect": "Allow", "Resource": "*", "Action": ["iam:ListInstanceProfiles"]},
            {
                "Sid": "SpotServiceRoles",
                "Effect": "Allow",
                "Resource": "*",
                "Action": "iam:CreateServiceLinkedRole",
                "Condition": {"StringEquals": {"iam:AWSServiceName": ["spot.amazonaws.com", "ec2fleet.amazonaws.com"]}},
            },
            {
                "Sid": "Store",
                "Effect": "Allow",
                "Action": ["s3:ListBucket", "s3:GetEncryptionConfiguration"],
                "Resource": f"arn:aws:s3:::{b}",
            },
            {
                "Sid": "StoreObjects",
                "Effect": "Allow",
                "Resource": f"arn:aws:s3:::{b}/*",
                "Action": list(S3_OBJECT_ACTIONS),
            },
        ],
    }
