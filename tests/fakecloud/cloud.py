"""The fake cloud: a moto server whose EC2 instances become real hosts on loopback — as strict as EC2.

- moto's server serves EC2, S3 and IAM behind a gate (tests/fakecloud/gate.py) that adds what moto
  leaves out and real sweeps trip over: eventual consistency of new instances, security groups and
  instance profiles; `pending` and `shutting-down`; DependencyViolation; IAM evaluated for the
  hosts' role credentials, with S3's 403-for-a-missing-key rule; CreateFleet errors injected per
  (market, type, AZ). boto3 (ours, the CLI's, the agents') reaches it through AWS_ENDPOINT_URL.
- A VPC 127.N.0.0/16 with one subnet per AZ (127.N.1.0/24, 127.N.2.0/24, ...) gives every
  instance a loopback private IP; N is a loopback /16 no other fake cloud on the machine holds
  (an flock per N), so clouds in parallel (pytest-xdist workers, two suites) never share a host
  address. The subnets do not map public IPs on launch (like a custom
  VPC's); `default_vpc=False` gives an account without a default VPC.
- A watcher turns each running instance into a host once `boot_s` passed (real: 30-120 s): an
  sshd bound to its IP, configured from its cloud-config (HostKey from ssh_keys; ssh_authorized_keys
  merged into the login user's ~/.ssh/authorized_keys, as cloud-init does: the keys already there
  stay), its own HOME and tmux socket folder, and a fake
  IMDSv2 (token PUT included) that serves its instance id, placement, its instance profile's role
  credentials (the only credentials a host has, as on EC2), and on demand a spot interruption
  notice or a rebalance recommendation. write_files and runcmd are recorded, never executed (the safety net
  holds `shutdown`; tests/unit/backends/aws/cloud/test_userdata.py runs it in a sandbox).
- The image is shaped like the AWS Deep Learning AMI (OSS PyTorch, Ubuntu): plain `python3` cannot
  import torch; `/opt/pytorch/bin/python` can. DescribeImages gives root device `/dev/sda1` and a
  75 GB snapshot. The first interpreter start on a host takes `cold_s` longer (a cold EBS volume).
- CreateImage snapshots the instance's file system — here its HOME, ~/.ssh included — and CopyImage copies that
  snapshot: an instance launched from the image starts with that home, as one launched from an EC2 image starts
  with the builder's volume (what the builder left in ~/.ssh/authorized_keys included).
- When an instance stops being running, its sshd and every process started on the host (found by
  the ORCH_FAKE_HOST variable sshd puts in their environment) are killed.

Not imitated: real capacity and prices, real boot and network speeds, KMS, CloudTrail, the
rebalance/notice timing of the real spot market (tests decide when), NetworkInterfaces of launch
templates (moto ignores them, so public IPs are checked on the template only).

Use it as a context manager (`with FakeCloud(tmp) as cloud:`), through the pytest fixtures in
tests/conftest.py, or stand-alone: `python -m tests.fakecloud` prints the environment to export.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from orchestrator.wait import retry_until
from tests.fakecloud.gate import CONTROLLER_KEY, Gate, Strictness, boundaries_from_moto, policies_from_moto

REGION = "us-east-1"
AZS = ("us-east-1a", "us-east-1b")
SSH_PORT = 2222  # not 22: a real sshd on 0.0.0.0:22 must not collide with the fake hosts
BUCKET = "orch-fake"
DATA_BUCKETS = ("orch-kms",)  # other buckets tests stage `data:` from (named to `orch aws policy`)
IMAGE_NAME = "orch-fake-ubuntu-gpu"  # registered by the account itself: `image_owner: self`
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
FRAMEWORK_PYTHON = Path("/opt/pytorch/bin/python")  # where the DLAMI keeps PyTorch's interpreter
IMAGE_SNAPSHOT_GB = 75
PYTHON_WRAPPER = """#!/bin/bash
# orch fake cloud: an interpreter of the fake Deep Learning AMI (see tests/fakecloud/cloud.py)
[ -n "$ORCH_FAKE_PYTHON" ] || {{ echo "$0: not on a fake-cloud host" >&2; exit 127; }}
if [ -n "$ORCH_FAKE_COLD_S" ] && mkdir "$ORCH_FAKE_HOST_ROOT/.warm" 2>/dev/null; then sleep "$ORCH_FAKE_COLD_S"; fi
{block}exec "$ORCH_FAKE_PYTHON" "$@"
"""


NETS = Path(tempfile.gettempdir()) / "orch-fakecloud-nets"


def claim_net():
    """(N, lock file): the loopback network 127.N.0.0/16 for one fake cloud's hosts, held (flock) until the file is
    closed or the process ends; another cloud on this machine, in any process, gets another N."""
    NETS.mkdir(exist_ok=True)
    for n in range(255):
        f = open(NETS / f"{n}.lock", "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        if n in _nets_with_sshd():  # a host of a cloud whose process was killed still listens there: not free
            f.close()
            continue
        return n, f
    raise RuntimeError(f"all 255 loopback /16s are held by other fake clouds ({NETS})")


def _nets_with_sshd() -> set:
    """The N of every 127.N.x.x on which something listens on SSH_PORT (from /proc/net/tcp: LISTEN is state 0A)."""
    found = set()
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return found
    for line in lines:
        local, state = line.split()[1], line.split()[3]
        ip_hex, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == SSH_PORT and ip_hex.endswith("7F"):  # little-endian: 127 last
            found.add(int(ip_hex[4:6], 16))
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _extend_moto() -> None:
    """moto lacks DeleteLaunchTemplateVersions; the fake cloud supplies it (the version's data is dropped)."""
    from moto.core.responses import ActionResult
    from moto.ec2.responses.launch_templates import LaunchTemplates

    if hasattr(LaunchTemplates, "delete_launch_template_versions"):
        return

    def delete_launch_template_versions(self):
        template = self.ec2_backend.get_launch_template(self._get_param("LaunchTemplateId"))
        done = []
        for v in self._get_param("Versions", []):
            version = template.get_version(v)
            version.data = {k: val for k, val in version.data.items() if k != "UserData"}
            done.append({"LaunchTemplateId": template.id, "LaunchTemplateName": template.name, "VersionNumber": int(v)})
        return ActionResult(
            {"SuccessfullyDeletedLaunchTemplateVersions": done, "UnsuccessfullyDeletedLaunchTemplateVersions": []}
        )

    LaunchTemplates.delete_launch_template_versions = delete_launch_template_versions


# --- one host -------------------------------------------------------------------------------------


class _Imds(BaseHTTPRequestHandler):
    host: FakeHost

    def log_message(self, *args):  # quiet
        pass

    def do_PUT(self):
        if self.path == "/latest/api/token":
            if self.host.imds_late_s and not self.host.imds_answered:  # fault injection: a busy host's first answer
                self.host.imds_answered = True
                time.sleep(self.host.imds_late_s)
            with contextlib.suppress(BrokenPipeError):  # the SDK stopped waiting for this answer
                self._send(200, self.host.token)
        else:
            self._send(404, "")

    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != self.host.token:
            return self._send(401, "")
        path = self.path.removeprefix("/latest/meta-data/")
        host = self.host
        value = {
            "instance-id": host.instance_id,
            "instance-type": host.instance_type,
            "placement/region": host.az[:-1] if host.az else REGION,
            "placement/availability-zone": host.az,
            "local-ipv4": host.ip,
            "spot/instance-action": host.spot_notice,
            "events/recommendations/rebalance": host.rebalance,
        }.get(path)
        if path.startswith("iam/security-credentials/") and host.credentials is not None:
            role, creds = host.credentials()
            if role is None:
                value = None  # no instance profile: no credentials, as on EC2
            elif path == "iam/security-credentials/":
                value = role
            elif path == f"iam/security-credentials/{role}":
                value = json.dumps(creds)
        self._send(200, value) if value is not None else self._send(404, "")

    def _send(self, code: int, body: str):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@dataclass
class FakeHost:
    instance_id: str
    ip: str
    az: str
    root: Path
    endpoint: str  # moto
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    spot_notice: str | None = None  # JSON served at spot/instance-action once set
    rebalance: str | None = None  # JSON served at events/recommendations/rebalance once set
    runcmd: list = field(default_factory=list)
    user_data: str = ""
    credentials: Callable[[], tuple] | None = None  # () -> (role or None, IMDS credentials document)
    image: Path | None = None  # the fake AMI's bin folder (plain python3 without torch)
    image_home: Path | None = None  # the home its image was made from (CreateImage of a builder), None for a base image
    cold_s: float = 0.0  # extra seconds of the first interpreter start (a cold EBS volume)
    wrong_key: bool = False  # fault injection: present a host key other than the pinned one
    imds_late_s: float = 0.0  # fault injection: the first IMDS token request is answered this many seconds late
    imds_answered: bool = False
    instance_type: str = ""  # served at instance-type, as EC2's metadata service does
    sshd: subprocess.Popen | None = None
    imds: ThreadingHTTPServer | None = None

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def authorized_keys(self) -> Path:
        """The login user's ~/.ssh/authorized_keys, where cloud-init writes ssh_authorized_keys."""
        return self.home / ".ssh" / "authorized_keys"

    def _authorize(self, keys: list[str]) -> None:
        """cloud-init's ssh module: the user data's keys merged into ~/.ssh/authorized_keys (0700/0600); the lines
        already there (from the image) stay, a key already present is not added twice."""
        ssh_dir = self.authorized_keys.parent
        ssh_dir.mkdir(parents=True, exist_ok=True)
        ssh_dir.chmod(0o700)
        lines = self.authorized_keys.read_text().splitlines() if self.authorized_keys.exists() else []
        have = {line.split()[1] for line in lines if len(line.split()) > 1}
        lines += [k for k in keys if len(k.split()) > 1 and k.split()[1] not in have]
        self.authorized_keys.write_text("".join(f"{line}\n" for line in lines))
        self.authorized_keys.chmod(0o600)

    def start(self, user_data: str) -> None:
        self.user_data = user_data
        cfg = yaml.safe_load(user_data.split("\n", 1)[1]) if user_data.startswith("#cloud-config") else {}
        keys = cfg.get("ssh_keys", {})
        self.runcmd = cfg.get("runcmd", [])
        if self.image_home is not None and not self.home.exists():  # the image's volume: the builder's home
            shutil.copytree(self.image_home, self.home, symlinks=True)
        self.home.mkdir(parents=True, exist_ok=True)
        self.tmux_dir = Path(tempfile.mkdtemp(prefix="ofh-"))  # short: unix socket paths max out at 108 bytes
        host_key = self.root / "ssh_host_ed25519_key"
        if self.wrong_key:
            from orchestrator.remote.ssh import new_host_key

            host_key.write_text(new_host_key()[0])
        else:
            host_key.write_text(keys.get("ed25519_private", ""))
        host_key.chmod(0o600)
        self._authorize(cfg.get("ssh_authorized_keys", []))
        handler = type("Imds", (_Imds,), {"host": self})
        self.imds = ThreadingHTTPServer((self.ip, 0), handler)
        threading.Thread(target=self.imds.serve_forever, daemon=True).start()
        imds_url = f"http://{self.ip}:{self.imds.server_address[1]}"
        # No AWS keys: like an EC2 instance, a host has only what its instance profile gives (IMDS).
        env = {
            "HOME": str(self.home),
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds_url,
            "AWS_DEFAULT_REGION": REGION,
            "ORCH_FAKE_HOST": self.instance_id,
            "TMUX_TMPDIR": str(self.tmux_dir),
            "ORCH_FAKE_HOST_ROOT": str(self.root),
            "ORCH_FAKE_PYTHON": sys.executable,
            "ORCH_FAKE_COLD_S": str(self.cold_s or ""),
            # Every fake host shares this machine's few cores: torch's default of one OpenMP thread per core in
            # each host's trainer oversubscribes them, and busy-waiting threads then make a run ten times slower.
            "OMP_NUM_THREADS": "1",
            "PATH": f"{self.image or Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        }
        config = "\n".join(
            [
                f"ListenAddress {self.ip}",
                f"Port {SSH_PORT}",
                f"HostKey {host_key}",
                f"AuthorizedKeysFile {self.authorized_keys}",
                f"PidFile {self.root / 'sshd.pid'}",
                "UsePAM no",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                f"Subsystem sftp internal-sftp -d {self.home}",
                "SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()),
                "",
            ]
        )
        (self.root / "sshd_config").write_text(config)
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory
        self.sshd = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")],
            stdout=open(self.root / "sshd.log", "ab"),
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        """The instance is gone: its sshd with every connection it serves, its IMDS and everything that ran on it
        stop (a connection's own sshd process is not in the host's marked environment: it goes as sshd's child, so a
        client mid-command sees its connection drop, as when an instance ends)."""
        power_off(self.sshd, self.instance_id)
        if self.imds:
            self.imds.shutdown()
            self.imds.server_close()
            self.imds = None
        shutil.rmtree(getattr(self, "tmux_dir", ""), ignore_errors=True)


def _not_files(folder: str, names: list[str]) -> list[str]:
    """What a snapshot of a home leaves out: sockets and other special files (a volume snapshot holds no live ones)."""
    return [n for n in names if not (os.path.isdir(os.path.join(folder, n)) or os.path.isfile(os.path.join(folder, n)))]


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def power_off(sshd: subprocess.Popen | None, marker: str) -> None:
    """A host ends at once: its sshd with every connection it serves (their sshd processes, its children) and every
    process marked ORCH_FAKE_HOST=marker."""
    doomed = set(processes_of(marker))
    if sshd and sshd.poll() is None:
        doomed |= descendants(sshd.pid)
        sshd.kill()
        sshd.wait(5)
    for pid in doomed | set(processes_of(marker)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def processes_of(instance_id: str) -> list[int]:
    marker = f"ORCH_FAKE_HOST={instance_id}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if marker in (d / "environ").read_bytes().split(b"\0"):
                found.append(int(d.name))
        except (OSError, PermissionError):
            continue
    return found


# --- the cloud ------------------------------------------------------------------------------------


class _GatedMotoServer:
    """moto's ThreadedMotoServer, with the strict gate in front of its app."""

    def __init__(self, port: int, gate_args: dict):
        self.port, self.gate_args = port, gate_args
        self.ready = threading.Event()

    def start(self) -> Gate:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        class Dispatcher(DomainDispatcherApplication):
            """moto's dispatcher, its answer for a host remembered: moto finds it by listing its own package folder
            (~150 stat calls) for every request, 7% of a worker's CPU in the AWS tests (py-spy)."""

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.known: dict = {}

            def get_backend_for_host(self, host):
                if host not in self.known:
                    self.known[host] = super().get_backend_for_host(host)
                return self.known[host]

        self.gate = Gate(Dispatcher(create_backend_app), **self.gate_args)
        self.server = make_server("127.0.0.1", self.port, self.gate, True, request_handler=MotoRequestHandler)
        self.port = self.server.socket.getsockname()[1]  # port 0: the kernel's pick, no other process can take it first
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="fakecloud-moto")
        self.thread.start()
        return self.gate

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(10)


HARNESS_KEY = "fakecloud-harness"  # not CONTROLLER_KEY: the gate checks the controller's calls against orch's policy


class FakeCloud:
    def __init__(
        self,
        root: Path,
        poll_s: float = 1.0,  # the watcher's DescribeInstances: about 30 ms of moto's CPU each (6% of a core at 0.5)
        boot_s: float = 0.0,
        cold_s: float = 0.0,
        strict: Strictness | None = None,
        default_vpc: bool = True,
        regions: tuple[str, ...] = (REGION,),
        bucket_region: str = REGION,
    ):
        self.root = Path(root)
        self.regions = regions  # each with its default VPC's loopback subnets and its own copy of the image
        self.bucket_region = bucket_region  # the store's bucket's (GetBucketLocation): a sweep's home region
        self.poll_s = poll_s
        self.boot_s = boot_s  # seconds from `running` until sshd answers (real: 30-120)
        self.cold_s = cold_s  # extra seconds of a host's first interpreter start (real: 10-30 on a cold volume)
        self.strict = strict or Strictness()
        self.default_vpc = default_vpc
        self.hosts: dict[str, FakeHost] = {}
        self.gone: dict[str, FakeHost] = {}
        self.seen: dict[str, float] = {}  # instance id -> when the watcher first saw it running
        self.subnets: list[str] = []
        self.vpcs: dict[str, str] = {}  # region -> its default VPC
        self._own_clients: dict[tuple[str, str], Any] = {}  # (service, region) -> the harness's own client
        self.wrong_host_keys = False  # set by a test: new hosts answer with a different host key
        self.no_sshd = False  # set by a test: new hosts never bring sshd up
        self.imds_late_s = 0.0  # set by a test: each new host answers its first IMDS token request this late
        self.secret = f"fake-secret-{uuid.uuid4().hex}"  # distinctive, so tests can look for leaks
        self._stop = threading.Event()
        self._saved_env: dict[str, str | None] = {}
        self._creds: dict[str, tuple] = {}

    # lifecycle

    def __enter__(self) -> FakeCloud:
        self._ignored_by_workdirs()
        self.start()
        return self

    def _ignored_by_workdirs(self) -> None:
        """A test's folder is its sweeps' `workdir:` (the default: the sweep file's folder); the fake cloud's own files
        (hosts' homes, moto's state) are no project's code: its folder goes in the `.orchignore` beside it."""
        ignore = self.root.parent / ".orchignore"
        line = f"{self.root.name}/"
        have = ignore.read_text().splitlines() if ignore.exists() else []
        if line not in have:
            ignore.write_text("".join(f"{x}\n" for x in [*have, line]))

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        import logging

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        _extend_moto()
        # port 0, bound at once: a port found free and bound later was taken in between once (Errno 98, a
        # fresh-clone suite), and every fake-cloud test of that worker failed after it
        self.server = _GatedMotoServer(0, {"strict": self.strict})
        self.gate = self.server.start()
        port = self.server.port
        self.endpoint = f"http://127.0.0.1:{port}"
        self.gate.policy_source = policies_from_moto()
        self.gate.boundary_source = boundaries_from_moto()
        from orchestrator.backends.aws.cloud.policy import BOUNDARY_NAME, boundary_policy, controller_policy

        # orch's own calls: exactly what docs/aws.md asks users to grant
        self.gate.controller_policy = controller_policy(BUCKET, DATA_BUCKETS)
        self._reset()  # moto keeps its state per process: every fake cloud starts empty
        self._own("iam").create_policy(  # what the admin does once (docs/aws.md): the roles' boundary
            PolicyName=BOUNDARY_NAME, PolicyDocument=json.dumps(boundary_policy(BUCKET, DATA_BUCKETS))
        )
        for k, v in self.env().items():
            self._saved_env[k] = os.environ.get(k)
            os.environ[k] = v
        self.net, self._net_lock = claim_net()
        for k, region in enumerate(self.regions):
            self._network(region, k)
        self.vpc = self.vpcs[REGION] if REGION in self.vpcs else self.vpcs[self.regions[0]]
        self.image = self.register_image(IMAGE_NAME, region=self.regions[0])
        self.images = {self.regions[0]: self.image} | {
            r: self.register_image(IMAGE_NAME, region=r) for r in self.regions[1:]
        }
        self.image_bin = self._install_image()
        self.image_homes: dict[str, Path] = {}  # image id -> the home CreateImage took from its builder
        self.gate.images.snapshot = self._snapshot
        where = {} if self.bucket_region == REGION else {"LocationConstraint": self.bucket_region}
        self._own("s3").create_bucket(Bucket=BUCKET, **({"CreateBucketConfiguration": where} if where else {}))
        self._watcher = threading.Thread(target=self._watch, name="fakecloud-watcher", daemon=True)
        self._watcher.start()

    def _network(self, region: str, k: int) -> None:
        """The region's default VPC gets loopback subnets instead of its own, so sweeps need no subnet ids: region k's
        AZs are 127.N.(10k+1).0/24, 127.N.(10k+2).0/24 (one /16 for the cloud, a /24 per AZ of each region)."""
        ec2 = self._own("ec2", region)
        vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
        for sub in ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]:
            ec2.delete_subnet(SubnetId=sub["SubnetId"])
        ec2.associate_vpc_cidr_block(VpcId=vpc, CidrBlock=f"127.{self.net}.0.0/16")
        self.vpcs[region] = vpc
        azs = AZS if region == REGION else (f"{region}a", f"{region}b")
        for i, az in enumerate(azs, start=1 + 10 * k):
            self.subnets.append(
                ec2.create_subnet(VpcId=vpc, CidrBlock=f"127.{self.net}.{i}.0/24", AvailabilityZone=az)["Subnet"][
                    "SubnetId"
                ]
            )
            ec2.modify_subnet_attribute(
                SubnetId=self.subnets[-1], MapPublicIpOnLaunch={"Value": False}
            )  # moto maps them; custom VPCs do not
        if not self.default_vpc:  # an account whose default VPC was deleted: sweeps must name subnets
            from tests.fakecloud.gate import _ec2_backend

            _ec2_backend(region).get_vpc(vpc).is_default = False

    def register_image(
        self,
        name: str,
        root_device: str = "/dev/sda1",
        snapshot_gb: int = IMAGE_SNAPSHOT_GB,
        orch_tagged: bool = True,
        region: str = REGION,
    ) -> str:
        """An image shaped like the DLAMI in DescribeImages: its root device name and snapshot size. The account
        registered it, so its snapshot is the account's: `orch_tagged` tags that snapshot `orch:recipe`, as docs/aws.md
        asks of an image of one's own that `orch ami` did not build (the policy launches no other of the account's
        snapshots)."""
        from tests.fakecloud.gate import MOTO, _ec2_backend

        image_id = self._own("ec2", region).register_image(
            Name=name, Description="fake Deep Learning AMI (OSS PyTorch, Ubuntu)"
        )["ImageId"]
        ami = _ec2_backend(region).amis[image_id]
        ami.root_device_name = root_device

        class _Dlami(type(ami)):  # moto gives every registered image a 15 GB standard volume
            @property
            def block_device_mappings(self):
                return [
                    {
                        "DeviceName": self.root_device_name,
                        "Ebs": {
                            "SnapshotId": self.ebs_snapshot.id,
                            "VolumeSize": snapshot_gb,
                            "DeleteOnTermination": True,
                            "VolumeType": "gp3",
                        },
                    }
                ]

        ami.__class__ = _Dlami
        if orch_tagged:
            with MOTO:
                _ec2_backend(region).create_tags([ami.ebs_snapshot.id], {"orch:recipe": "registered-by-hand"})
        return image_id

    def _install_image(self) -> Path:
        """The fake AMI's interpreters: plain python3 without torch, /opt/pytorch/bin/python with it."""
        bin_dir = self.root / "image" / "bin"
        notorch = self.root / "image" / "notorch" / "torch"
        notorch.mkdir(parents=True, exist_ok=True)
        (notorch / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'torch\'", name="torch")\n')
        bin_dir.mkdir(parents=True, exist_ok=True)
        plain = bin_dir / "python3"
        plain.write_text(
            PYTHON_WRAPPER.format(block=f'export PYTHONPATH="{notorch.parent}${{PYTHONPATH:+:$PYTHONPATH}}"\n')
        )
        plain.chmod(0o755)
        for name, text in self._image_tools().items():
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        (bin_dir / "python").symlink_to("python3")
        framework = PYTHON_WRAPPER.format(block="")
        marker = FRAMEWORK_PYTHON.parents[1] / ".orch-fakecloud"
        if not FRAMEWORK_PYTHON.parents[1].exists() or marker.exists():  # never touch a real /opt/pytorch
            try:
                FRAMEWORK_PYTHON.parent.mkdir(parents=True, exist_ok=True)
                marker.touch()
                if not FRAMEWORK_PYTHON.exists() or FRAMEWORK_PYTHON.read_text() != framework:
                    tmp = FRAMEWORK_PYTHON.with_name(f".python.{os.getpid()}")
                    tmp.write_text(framework)
                    tmp.chmod(0o755)
                    os.replace(tmp, FRAMEWORK_PYTHON)
            except OSError as exc:
                print(f"fakecloud: cannot provide {FRAMEWORK_PYTHON} ({exc}); hosts have only python3", file=sys.stderr)
        return bin_dir

    @staticmethod
    def _image_tools() -> dict[str, str]:
        """The image's sudo (passwordless, as the login users of Amazon Linux and Ubuntu have it), systemctl (the
        fake systemd, tests/fakecloud/systemd.py) and shutdown: first on a host's PATH, so that nothing run on a fake
        host reaches the test machine's own. shutdown only leaves a mark: the watcher then terminates the instance,
        as EC2 does for an instance whose shutdown behaviour is `terminate`."""
        systemd = Path(__file__).with_name("systemd.py")
        return {
            "sudo": '#!/bin/sh\n[ "$1" = "-n" ] && shift\nexec "$@"\n',
            "systemctl": f'#!/bin/sh\nexec "$ORCH_FAKE_PYTHON" {systemd} "$@"\n',
            "shutdown": '#!/bin/sh\necho "$*" >> "$ORCH_FAKE_HOST_ROOT/shutdown"\n',
            "poweroff": '#!/bin/sh\necho "$*" >> "$ORCH_FAKE_HOST_ROOT/shutdown"\n',
            "reboot": '#!/bin/sh\necho "fake cloud: no reboot" >&2; exit 1\n',
        }

    def _snapshot(self, image_id: str, source: str) -> None:
        """CreateImage of an instance (its home, as it is now) or CopyImage of an image (the source's snapshot)."""
        if source in self.image_homes:
            self.image_homes[image_id] = self.image_homes[source]
            return
        host = self.hosts.get(source)
        if host is None or not host.home.exists():
            return
        folder = self.root / "images" / image_id / "home"
        shutil.copytree(host.home, folder, symlinks=True, ignore=_not_files)
        self.image_homes[image_id] = folder

    def host_credentials(self, instance_id: str) -> tuple:
        """(role, IMDS credentials document) of an instance's profile, minted through STS; (None, None) without one."""
        if instance_id in self._creds:
            return self._creds[instance_id]
        name = self.gate.profile_of.get(instance_id)
        if not name:
            return None, None
        roles = self._own("iam").get_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Roles"]
        if not roles:
            return None, None
        role = roles[0]
        c = self._own("sts").assume_role(RoleArn=role["Arn"], RoleSessionName=instance_id)["Credentials"]
        self.gate.delivered(c["AccessKeyId"], role["RoleName"], instance_id)
        doc = {
            "Code": "Success",
            "Type": "AWS-HMAC",
            "AccessKeyId": c["AccessKeyId"],
            "SecretAccessKey": c["SecretAccessKey"],
            "Token": c["SessionToken"],
            "Expiration": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 6 * 3600)),
            "LastUpdated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        self._creds[instance_id] = (role["RoleName"], doc)
        return self._creds[instance_id]

    def stop(self) -> None:
        self._stop.set()
        self._watcher.join(10)
        for host in list(self.hosts.values()):
            host.stop()
        self._reset()
        self.server.stop()
        if getattr(self, "_net_lock", None) is not None:
            self._net_lock.close()  # the /16 is free for the next cloud
            self._net_lock = None
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def _reset(self) -> None:
        import urllib.request

        urllib.request.urlopen(
            urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=10
        ).read()

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": CONTROLLER_KEY,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, service: str, region: str = REGION):
        import boto3

        # the harness's own key: setting up the cloud (VPCs, images, buckets) and inspecting it is not orch's doing
        return boto3.client(
            service,
            region_name=region,
            endpoint_url=self.endpoint,
            aws_access_key_id=HARNESS_KEY,
            aws_secret_access_key=self.secret,
        )

    def _own(self, service: str, region: str = REGION):
        """The harness's own client (the watcher, instances(), leftovers(), reclaim(), minting a host's credentials):
        made once, as a boto3 client costs about as much CPU to make as a dozen calls. Never one a test got from
        client(), which may carry the test's own event handlers."""
        key = (service, region)
        if key not in self._own_clients:
            self._own_clients[key] = self.client(service, region)
        return self._own_clients[key]

    # the watcher

    def _watch(self) -> None:
        ec2 = self._own("ec2")
        while not self._stop.wait(self.poll_s):
            try:
                self.reconcile(ec2)
            except Exception as exc:  # keep watching; a test will notice missing hosts
                print(f"fakecloud watcher: {type(exc).__name__}: {exc}", file=sys.stderr)

    def _regional(self, ec2, az: str):
        """The harness's EC2 client of the AZ's region (`ec2`, us-east-1's, there)."""
        region = az[:-1]
        return self._own("ec2", region) if region in self.regions else ec2

    def reconcile(self, ec2) -> None:
        from tests.fakecloud.gate import os_shutdown, running_instances

        # The hypervisor's view, read from moto's own records: a DescribeInstances through the server each second
        # (moto renders every instance it ever had, then filters) was ~30 ms of CPU, 3% of a core per fake cloud.
        running = running_instances()
        now = time.time()
        for iid, inst in running.items():
            self.seen.setdefault(iid, now)
            if iid not in self.hosts and iid not in self.gone and now - self.seen[iid] >= self.boot_s:
                ud = (
                    self._regional(ec2, inst["AvailabilityZone"])
                    .describe_instance_attribute(InstanceId=iid, Attribute="userData")
                    .get("UserData", {})
                    .get("Value", "")
                )
                host = FakeHost(
                    iid,
                    inst["PrivateIpAddress"],
                    inst["AvailabilityZone"],
                    self.root / "hosts" / iid,
                    self.endpoint,
                    wrong_key=self.wrong_host_keys,
                    image=self.image_bin,
                    cold_s=self.cold_s,
                    imds_late_s=self.imds_late_s,
                    credentials=lambda iid=iid: self.host_credentials(iid),
                    image_home=self.image_homes.get(inst["ImageId"]),
                    instance_type=inst.get("InstanceType", ""),
                )
                if self.no_sshd:
                    self.hosts[iid] = FakeHost(
                        iid, inst["PrivateIpAddress"], "", self.root / "hosts" / iid, self.endpoint
                    )
                    continue
                self.host_credentials(iid)  # minted at boot: IMDS answers at once, as EC2's does (botocore waits 1 s)
                host.start(base64.b64decode(ud).decode() if ud else "")
                self.hosts[iid] = host
        for iid, host in list(self.hosts.items()):
            if (host.root / "shutdown").exists() and iid in running:  # the OS shut down: EC2 terminates it
                os_shutdown(iid)
                running.pop(iid)
        for iid in [i for i in self.hosts if i not in running]:
            host = self.hosts[iid]
            host.stop()
            self.gone[iid] = host  # in one of the two at every moment: a test reads hosts, then gone
            del self.hosts[iid]

    def gone_host(self, instance_id: str, timeout: float = 60.0) -> FakeHost:
        """The host of an instance EC2 already calls terminated: the hypervisor lets it go at its next look."""
        return retry_until(lambda: self.gone.get(instance_id), timeout, 0.1, f"the hypervisor to let {instance_id} go")

    # fault injection (spot reliability tests use these)

    def step_on_hosts(self, sweep: str, run: str) -> int:
        """The run's newest step, read on its hosts' own disks: at once, where `orch status` (a process a call, spaced
        apart) once saw step 60 only after the runs had ended, on a machine loaded beyond its two cores."""
        steps = [0]
        for metrics in (self.root / "hosts").glob(f"*/home/orch/runs/{sweep}/{run}/run/metrics.jsonl"):
            try:
                steps.append(int(json.loads(metrics.read_text().splitlines()[-1]).get("step", 0)))
            except (OSError, ValueError, IndexError):  # not there yet, or a line being written
                continue
        return max(steps)

    def spot_notice(self, instance_id: str, action: str = "terminate") -> None:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
        self.hosts[instance_id].spot_notice = json.dumps({"action": action, "time": when})

    def rebalance_recommendation(self, instance_id: str) -> None:
        """EC2's earlier, softer signal that this spot instance is at elevated risk."""
        self.hosts[instance_id].rebalance = json.dumps(
            {"noticeTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        )

    def reclaim(self, instance_id: str) -> None:
        """The spot market takes the instance back (in whichever of this cloud's regions it runs)."""
        (region,) = {i["region"] for i in self.instances() if i["id"] == instance_id} or {REGION}
        self._own("ec2", region).terminate_instances(InstanceIds=[instance_id])

    # inspection

    def instances(
        self, sweep: str | None = None, states=("pending", "running"), region: str | None = None
    ) -> list[dict]:
        """The instances of every region of this cloud (or of `region`), each with its region."""
        out = []
        for where in [region] if region else self.regions:
            out += self._instances(sweep, states, where)
        return out

    def _instances(self, sweep: str | None, states, region: str) -> list[dict]:
        out = []
        for res in self._own("ec2", region).describe_instances()["Reservations"]:
            for i in res["Instances"]:
                tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                if i["State"]["Name"] in states and (sweep is None or tags.get("orch:sweep") == sweep):
                    out.append(
                        {
                            "id": i["InstanceId"],
                            "state": i["State"]["Name"],
                            "tags": tags,
                            "ip": i.get("PrivateIpAddress"),
                            "region": region,
                            "az": i.get("Placement", {}).get("AvailabilityZone", ""),
                        }
                    )
        return out

    def leftovers(self, sweep: str, region: str = REGION) -> dict[str, list]:
        """What of the sweep still exists in `region` (and IAM): anything here after `orch down` is a leak."""
        ec2, iam = self._own("ec2", region), self._own("iam")
        name = f"orch-{sweep}"
        return {
            "instances": [
                i["id"] for i in self.instances(sweep, ("pending", "running", "stopping", "stopped"), region)
            ],
            "security_groups": [
                g["GroupId"]
                for g in ec2.describe_security_groups(Filters=[{"Name": "tag:orch:sweep", "Values": [sweep]}])[
                    "SecurityGroups"
                ]
            ],
            "launch_templates": [
                t["LaunchTemplateId"]
                for t in ec2.describe_launch_templates()["LaunchTemplates"]
                if t["LaunchTemplateName"] == name
            ],
            "instance_profiles": [
                p["InstanceProfileName"]
                for p in iam.list_instance_profiles()["InstanceProfiles"]
                if p["InstanceProfileName"] == name
            ],
        }

    def all_leftovers(self) -> dict[str, list]:
        """Whatever orch made and left, in every region of this cloud."""
        from orchestrator.backends.aws.cloud.teardown import orch_profiles, orch_resources

        out: dict[str, list] = {}
        for found in [orch_resources(self._own("ec2", r)) for r in self.regions] + [orch_profiles(self._own("iam"))]:
            for sweep, things in found.items():
                out.setdefault(sweep, []).extend(things)
        return out

    def sweep_yaml(self, name: str, identity: Path, command: str, extra: str = "", **aws: str) -> str:
        """A sweep for this cloud (what experiments/fakecloud-smoke.yaml holds, with this cloud's ids)."""
        fields = {
            "region": REGION,
            "instance_types": "[g5.xlarge, g6.xlarge]",
            "image": IMAGE_NAME,
            "image_owner": "self",
            "ssh_cidr": "127.0.0.1/32",
            "max_minutes": "60",
            **aws,
        }
        lines = "\n".join(f"  {k}: {v}" for k, v in fields.items())
        user = os.environ.get("USER") or "root"
        return (
            f'name: {name}\nbackend: aws\ncommand: "{command}"\nstore: s3://{BUCKET}/sweeps\n{extra}\naws:\n{lines}\n'
            f"  ssh:\n    user: {user}\n    port: {SSH_PORT}\n    address: private_ip\n    identity: {identity}\n"
        )


def main() -> int:
    """Run a fake cloud until Ctrl-C, printing what to export in another terminal."""
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(prog="python -m tests.fakecloud", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--boot-s", type=float, default=0.0, help="seconds from `running` until a host's sshd answers (EC2: 30-120)"
    )
    ap.add_argument(
        "--cold-s", type=float, default=0.0, help="extra seconds of a host's first interpreter start (a cold volume)"
    )
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="orch-fakecloud-"))
    with FakeCloud(root, boot_s=args.boot_s, cold_s=args.cold_s) as cloud:
        sys.stdout.write("fake cloud up. In another terminal:\n")
        for k, v in cloud.env().items():
            sys.stdout.write(f"  export {k}={v}\n")
        sys.stdout.write(f"  subnets: {', '.join(cloud.subnets)}   image: {cloud.image}   bucket: {BUCKET}\n")
        sys.stdout.flush()
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0
