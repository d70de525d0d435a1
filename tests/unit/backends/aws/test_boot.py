"""A bought instance's boot waits end when the instance ends first: EC2's answers from botocore's Stubber, sshd a
loopback port nothing listens on (a host still booting refuses connections)."""

from __future__ import annotations

import socket
import time

import boto3
import pytest
from botocore.stub import Stubber

from orchestrator.backends.aws import boot
from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.remote.ssh import Target, new_host_key

IID = "i-0123456789abcdef0"


def described(state: str, code: str = "", message: str = "") -> dict:
    inst = {"InstanceId": IID, "State": {"Name": state}, "PrivateIpAddress": "10.0.0.5"}
    if code:
        inst["StateReason"] = {"Code": code, "Message": message}
    return {"Reservations": [{"Instances": [inst]}]}


def ec2_answering(*answers: dict):
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    for answer in answers:
        stub.add_response("describe_instances", answer, {"InstanceIds": [IID]})
    stub.activate()
    return client, stub


def test_the_address_of_an_instance_once_it_runs():
    ec2, stub = ec2_answering(described("pending"), described("running"))
    assert boot.running_address(ec2, IID, "private_ip", 30) == "10.0.0.5"
    stub.assert_no_pending_responses()


@pytest.mark.parametrize("state", boot.ENDED)
def test_an_instance_that_ends_while_pending_ends_the_wait_with_ec2s_reason(state):
    ended = described(state, "Server.SpotInstanceTermination", "Server.SpotInstanceTermination: Spot reclaim")
    ec2, stub = ec2_answering(described("pending"), ended)
    with pytest.raises(api.InstanceEnded, match=f"{IID} is {state} \\(Server.SpotInstanceTermination: Spot"):
        boot.running_address(ec2, IID, "private_ip", 600)  # not the 600 s boot allowance
    stub.assert_no_pending_responses()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def target(identity) -> Target:
    _, public = new_host_key()
    return Target("127.0.0.1", closed_port(), "orch", str(identity), public)


def test_sshd_that_never_answers_on_an_ended_instance_ends_the_wait_at_the_first_look(identity):
    ec2, stub = ec2_answering(described("terminated", "Client.UserInitiatedShutdown", "User initiated shutdown"))
    began = time.monotonic()
    with pytest.raises(api.InstanceEnded, match="is terminated \\(User initiated shutdown\\) before it served"):
        boot.ssh_to(ec2, IID, target(identity), 600)
    assert time.monotonic() - began < boot.LOOK_S  # the first refused try looked
    stub.assert_no_pending_responses()


def test_while_the_instance_runs_a_refused_sshd_is_tried_again_until_the_allowance(identity):
    ec2, stub = ec2_answering(*[described("running")] * 3)
    with pytest.raises(Exception, match="could not reach sshd on 127.0.0.1") as got:
        boot.ssh_to(ec2, IID, target(identity), 1.5)
    assert not isinstance(got.value, api.InstanceEnded)
    assert len(stub._queue) == 2  # looked once: at most one DescribeInstances per LOOK_S
