"""The fake cloud: a moto server whose EC2 instances become real hosts on loopback.

- moto's ThreadedMotoServer serves EC2, S3 and IAM; boto3 (ours, the CLI's, the agents') reaches
  it through the standard AWS_ENDPOINT_URL.
- A VPC 127.0.0.0/16 with one subnet per AZ (127.0.1.0/24, 127.0.2.0/24, ...) gives every
  instance a loopback private IP.
- A watcher turns each running instance into a host: an sshd bound to its IP, configured from its
  cloud-config (HostKey from ssh_keys, AuthorizedKeysFile from ssh_authorized_keys), its own HOME
  and tmux socket folder, and a fake IMDSv2 (token PUT included) that serves its instance id and,
  on demand, a spot interruption notice. runcmd is recorded, never executed (it holds `shutdown`).
- When an instance stops being running, its sshd and every process started on the host (found by
  the ORCH_FAKE_HOST variable sshd puts in their environment) are killed.

Use it as a context manager (`with FakeCloud(tmp) as cloud:`), through the pytest fixtures in
tests/conftest.py, or stand-alone: `python -m tests.fakecloud` prints the environment to export.
"""

from __future__ import annotations

import base64
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
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional

import yaml

REGION = "us-east-1"
AZS = ("us-east-1a", "us-east-1b")
SSH_PORT = 2222  # not 22: a real sshd on 0.0.0.0:22 must not collide with the fake hosts
BUCKET = "orch-fake"
IMAGE_NAME = "orch-fake-ubuntu-gpu"  # registered by the account itself: `image_owner: self`
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


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
        return ActionResult({"SuccessfullyDeletedLaunchTemplateVersions": done, "UnsuccessfullyDeletedLaunchTemplateVersions": []})

    LaunchTemplates.delete_launch_template_versions = delete_launch_template_versions


# --- one host -------------------------------------------------------------------------------------


class _Imds(BaseHTTPRequestHandler):
    host: "FakeHost"

    def log_message(self, *args):  # quiet
        pass

    def do_PUT(self):
        if self.path == "/latest/api/token":
            self._send(200, self.host.token)
        else:
            self._send(404, "")

    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != self.host.token:
            return self._send(401, "")
        path = self.path.removeprefix("/latest/meta-data/")
        value = {
            "instance-id": self.host.instance_id, "placement/region": REGION,
            "placement/availability-zone": self.host.az, "local-ipv4": self.host.ip,
            "spot/instance-action": self.host.spot_notice,
        }.get(path)
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
    spot_notice: Optional[str] = None  # JSON served at spot/instance-action once set
    runcmd: List = field(default_factory=list)
    user_data: str = ""
    secret: str = "testing"  # the credentials hosts get from sshd (never from user data)
    wrong_key: bool = False  # fault injection: present a host key other than the pinned one
    sshd: Optional[subprocess.Popen] = None
    imds: Optional[ThreadingHTTPServer] = None

    @property
    def home(self) -> Path:
        return self.root / "home"

    def start(self, user_data: str) -> None:
        self.user_data = user_data
        cfg = yaml.safe_load(user_data.split("\n", 1)[1]) if user_data.startswith("#cloud-config") else {}
        keys = cfg.get("ssh_keys", {})
        self.runcmd = cfg.get("runcmd", [])
        self.home.mkdir(parents=True, exist_ok=True)
        self.tmux_dir = Path(tempfile.mkdtemp(prefix="ofh-"))  # short: unix socket paths max out at 108 bytes
        host_key = self.root / "ssh_host_ed25519_key"
        if self.wrong_key:
            from orchestrator.ssh import new_host_key

            host_key.write_text(new_host_key()[0])
        else:
            host_key.write_text(keys.get("ed25519_private", ""))
        host_key.chmod(0o600)
        (self.root / "authorized_keys").write_text("\n".join(cfg.get("ssh_authorized_keys", [])) + "\n")
        handler = type("Imds", (_Imds,), {"host": self})
        self.imds = ThreadingHTTPServer((self.ip, 0), handler)
        threading.Thread(target=self.imds.serve_forever, daemon=True).start()
        imds_url = f"http://{self.ip}:{self.imds.server_address[1]}"
        env = {
            "HOME": str(self.home), "AWS_ENDPOINT_URL": self.endpoint, "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds_url,
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_DEFAULT_REGION": REGION,
            "ORCH_FAKE_HOST": self.instance_id, "TMUX_TMPDIR": str(self.tmux_dir),
            # the "image" has orch's Python: the interpreter running the fake cloud comes first on PATH
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        }
        config = "\n".join([
            f"ListenAddress {self.ip}", f"Port {SSH_PORT}", f"HostKey {host_key}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}", f"PidFile {self.root / 'sshd.pid'}",
            "UsePAM no", "StrictModes no", "PermitRootLogin prohibit-password", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", f"Subsystem sftp internal-sftp -d {self.home}",
            "SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()), "",
        ])
        (self.root / "sshd_config").write_text(config)
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory
        self.sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")],
                                     stdout=open(self.root / "sshd.log", "ab"), stderr=subprocess.STDOUT)

    def stop(self) -> None:
        """The instance is gone: its sshd, its IMDS and everything that ran on it stop."""
        if self.sshd and self.sshd.poll() is None:
            self.sshd.kill()
            self.sshd.wait(5)
        for pid in processes_of(self.instance_id):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.imds:
            self.imds.shutdown()
            self.imds.server_close()
            self.imds = None
        shutil.rmtree(getattr(self, "tmux_dir", ""), ignore_errors=True)


def processes_of(instance_id: str) -> List[int]:
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


class FakeCloud:
    def __init__(self, root: Path, poll_s: float = 0.2):
        self.root = Path(root)
        self.poll_s = poll_s
        self.hosts: Dict[str, FakeHost] = {}
        self.gone: Dict[str, FakeHost] = {}
        self.subnets: List[str] = []
        self.wrong_host_keys = False  # set by a test: new hosts answer with a different host key
        self.no_sshd = False  # set by a test: new hosts never bring sshd up
        self.secret = f"fake-secret-{uuid.uuid4().hex}"  # distinctive, so tests can look for leaks
        self._stop = threading.Event()
        self._saved_env: Dict[str, Optional[str]] = {}

    # lifecycle

    def __enter__(self) -> "FakeCloud":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        import logging

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        _extend_moto()
        port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{port}"
        self._reset()  # moto keeps its state per process: every fake cloud starts empty
        for k, v in self.env().items():
            self._saved_env[k] = os.environ.get(k)
            os.environ[k] = v
        ec2 = self.client("ec2")
        # The default VPC gets loopback subnets instead of its own, so sweeps need no subnet ids.
        vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
        for sub in ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]:
            ec2.delete_subnet(SubnetId=sub["SubnetId"])
        ec2.associate_vpc_cidr_block(VpcId=vpc, CidrBlock="127.0.0.0/16")
        self.vpc = vpc
        for i, az in enumerate(AZS, start=1):
            self.subnets.append(ec2.create_subnet(VpcId=vpc, CidrBlock=f"127.0.{i}.0/24", AvailabilityZone=az)["Subnet"]["SubnetId"])
        self.image = ec2.register_image(Name=IMAGE_NAME, Description="fake DL AMI")["ImageId"]
        self.client("s3").create_bucket(Bucket=BUCKET)
        self._watcher = threading.Thread(target=self._watch, name="fakecloud-watcher", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        self._stop.set()
        self._watcher.join(10)
        for host in list(self.hosts.values()):
            host.stop()
        self._reset()
        self.server.stop()
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def _reset(self) -> None:
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=10).read()

    def env(self) -> Dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": self.secret,
                "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self, service: str):
        import boto3

        return boto3.client(service, region_name=REGION, endpoint_url=self.endpoint,
                            aws_access_key_id="testing", aws_secret_access_key=self.secret)

    # the watcher

    def _watch(self) -> None:
        ec2 = self.client("ec2")
        while not self._stop.wait(self.poll_s):
            try:
                self.reconcile(ec2)
            except Exception as exc:  # keep watching; a test will notice missing hosts
                print(f"fakecloud watcher: {type(exc).__name__}: {exc}", file=sys.stderr)

    def reconcile(self, ec2) -> None:
        running = {}
        for res in ec2.describe_instances()["Reservations"]:
            for i in res["Instances"]:
                if i["State"]["Name"] == "running":
                    running[i["InstanceId"]] = i
        for iid, inst in running.items():
            if iid not in self.hosts and iid not in self.gone:
                ud = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData").get("UserData", {}).get("Value", "")
                host = FakeHost(iid, inst["PrivateIpAddress"], inst["Placement"]["AvailabilityZone"], self.root / "hosts" / iid,
                                self.endpoint, secret=self.secret, wrong_key=self.wrong_host_keys)
                if self.no_sshd:
                    self.hosts[iid] = FakeHost(iid, inst["PrivateIpAddress"], "", self.root / "hosts" / iid, self.endpoint)
                    continue
                host.start(base64.b64decode(ud).decode() if ud else "")
                self.hosts[iid] = host
        for iid in [i for i in self.hosts if i not in running]:
            host = self.hosts.pop(iid)
            host.stop()
            self.gone[iid] = host

    # fault injection (spot reliability tests use these)

    def spot_notice(self, instance_id: str, action: str = "terminate") -> None:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
        self.hosts[instance_id].spot_notice = json.dumps({"action": action, "time": when})

    def reclaim(self, instance_id: str) -> None:
        """The spot market takes the instance back."""
        self.client("ec2").terminate_instances(InstanceIds=[instance_id])

    # inspection

    def instances(self, sweep: Optional[str] = None, states=("pending", "running")) -> List[dict]:
        out = []
        for res in self.client("ec2").describe_instances()["Reservations"]:
            for i in res["Instances"]:
                tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                if i["State"]["Name"] in states and (sweep is None or tags.get("orch:sweep") == sweep):
                    out.append({"id": i["InstanceId"], "state": i["State"]["Name"], "tags": tags, "ip": i.get("PrivateIpAddress")})
        return out

    def leftovers(self, sweep: str) -> Dict[str, list]:
        """What of the sweep still exists: anything here after `orch down` is a leak."""
        ec2, iam = self.client("ec2"), self.client("iam")
        name = f"orch-{sweep}"
        return {
            "instances": [i["id"] for i in self.instances(sweep, states=("pending", "running", "stopping", "stopped"))],
            "security_groups": [g["GroupId"] for g in ec2.describe_security_groups(Filters=[{"Name": "tag:orch:sweep", "Values": [sweep]}])["SecurityGroups"]],
            "launch_templates": [t["LaunchTemplateId"] for t in ec2.describe_launch_templates()["LaunchTemplates"] if t["LaunchTemplateName"] == name],
            "instance_profiles": [p["InstanceProfileName"] for p in iam.list_instance_profiles()["InstanceProfiles"] if p["InstanceProfileName"] == name],
        }

    def all_leftovers(self) -> Dict[str, list]:
        from orchestrator.ec2 import orch_resources

        return orch_resources(self.client("ec2"), self.client("iam"))

    def sweep_yaml(self, name: str, identity: Path, command: str, extra: str = "", **aws: str) -> str:
        """A sweep for this cloud (what experiments/fakecloud-smoke.yaml holds, with this cloud's ids)."""
        fields = {"region": REGION, "instance_types": "[g5.xlarge, g6.xlarge]", "image": IMAGE_NAME, "image_owner": "self",
                  "ssh_cidr": "127.0.0.1/32", "max_minutes": "60", **aws}
        lines = "\n".join(f"  {k}: {v}" for k, v in fields.items())
        user = os.environ.get("USER") or "root"
        return (f"name: {name}\nbackend: aws\ncommand: \"{command}\"\nstore: s3://{BUCKET}/sweeps\n{extra}\naws:\n{lines}\n"
                f"  ssh:\n    user: {user}\n    port: {SSH_PORT}\n    address: private_ip\n    identity: {identity}\n")


def main() -> int:
    """Run a fake cloud until Ctrl-C, printing what to export in another terminal."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="orch-fakecloud-"))
    with FakeCloud(root) as cloud:
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


if __name__ == "__main__":
    sys.exit(main())
