"""`orch launch --remote`: the sweep's controller on one on-demand instance of the sweep's home region (its store's
bucket's, docs/guides/regions.md).

The laptop's half (launch_controller): the sweep's resources as a launch makes them (security group, template, the
hosts' role, in every listed region), then the controller's role and profile (under orch's boundary: its sweep's
prefix, EC2 on its sweep's tagged resources in its regions, PassRole of the hosts' role only), the sweep's group and
template in the home region, then ONE on-demand instance there through CreateFleet from that template (IMDSv2
required, encrypted root volume, shutdown terminates it, the sweep's security group: SSH from `ssh_cidr` only), its
host key pinned through user data as for every host; with `ssh.address: public_ip` its address is added to every
region's group. Over SSH it gets orch's code, the sweep file and its settings (remote.json) — never a credential:
the controller uses its instance role through IMDS — and starts the supervisor (control/supervisor.py) and the
watchdog (control/watchdog.py) as systemd units (remote_units.py).

The controller's half (apply_settings): the `_controller` command on the instance uses the settings on top of the
sweep file: its own SSH key (the hosts accept it and the laptop's key, `<key>.also.pub`), the SSH rule the groups
have for it and the host profile the laptop made; it finds each region's group by its name as a laptop's controller
does, and changes none (so it calls no IAM, asks no one for its public address, and makes no group).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from orchestrator.backends import bundle as code_bundle
from orchestrator.backends.aws import boot
from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.backends.aws.cloud import fleet, groups, iam
from orchestrator.backends.aws.cloud.controller_host import DEFAULT_USER, controller_tags, controllers, default_image
from orchestrator.backends.aws.cloud.images import resolve_image
from orchestrator.backends.aws.cloud.pricing import CONTROLLER_ROLE
from orchestrator.backends.aws.cloud.userdata import cloud_config
from orchestrator.backends.aws.regions import home_region
from orchestrator.backends.aws.remote_units import START_SCRIPT, start_script, units
from orchestrator.backends.aws.setup import regions_of, shared_parts
from orchestrator.errors import OrchError
from orchestrator.remote.ssh import ALSO_SUFFIX, Target, new_host_key, public_key_of
from orchestrator.store.s3url import is_s3, parse_s3
from orchestrator.sweep.load import located

log = logging.getLogger("orch.remote")

REMOTE_DIR = "orch/controller"  # under the login user's home on the controller instance
SETTINGS_FILE = "remote.json"
CONTROLLER_VOLUME_GB = 8  # orch's code, a log, a state folder (raised to the image's snapshot when larger)
# What the controller imports (pyproject's dependencies): installed with pip when the image's Python lacks them.
PACKAGES = (
    "boto3>=1.35.69",
    "paramiko>=3.4",
    "libtmux>=0.37",
    "pydantic>=2.6,<3",
    "click>=8.1",
    "rich>=13",
    "PyYAML>=6",
    "matplotlib>=3.8",
    "optuna>=5.0,<6",
    "apprise>=1.9",
    "pathspec>=0.12",
)
# (pathspec: `workdir:` is read at launch, on the laptop; a controller only imports the module that names it)
IMPORTS = "boto3, paramiko, libtmux, pydantic, click, rich, yaml, optuna, apprise"


@dataclass
class RemoteSettings:
    """remote.json on the controller instance: what its controller uses besides the sweep file."""

    sweep_file: str = ""  # the sweep file's path on the instance (relative to the home)
    code_dir: str = ""  # orch's code on the instance (PYTHONPATH)
    python: str = ""
    identity: str = ""  # the controller's own SSH key (made on the instance; the private half never leaves it)
    laptop_key: str = ""  # the public key of whoever launched it: the hosts accept it too (`orch attach`)
    # what the hosts' groups admit the controller from (the sweep's `ssh_cidr`, else its public address /32): its
    # backend finds each region's group with that rule in place, and never changes a group (its role may not)
    ssh_cidr: str = ""
    instance_profile: str = ""  # the hosts'
    instance_id: str = ""
    instance_type: str = ""
    region: str = ""  # the controller's: the sweep's home region
    deadline: float = 0.0  # epoch seconds: `max_hours` after the launch, the supervisor terminates the instance
    # `notify:` sinks given as `url_env:` — the variables' values as the laptop had them (remote.json is 0600 in a
    # 0700 folder of the controller's instance: the hosts' role cannot read it, and it never goes to the store)
    notify_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> RemoteSettings:
        raw = json.loads(Path(path).read_text())
        return cls(**{k: v for k, v in raw.items() if k in {f.name for f in fields(cls)}})


@dataclass
class RemoteController:
    instance_id: str
    instance_type: str
    region: str
    address: str


def login_user(cfg) -> str:
    """The controller image's login user: Amazon Linux's for the default image, else the hosts' (`aws.ssh.user`)."""
    return DEFAULT_USER if cfg.controller.image is None else cfg.ssh.user


def check_remote(sweep) -> None:
    """What --remote needs beyond a launch (exit 2 before anything is bought)."""
    cfg = sweep.spec.aws
    if sweep.spec.backend != "aws" or cfg is None:
        raise OrchError(
            f"{sweep.path}: --remote runs the controller on an AWS instance; it needs `backend: aws` (this sweep's "
            f"backend is {sweep.spec.backend}). Run it here with `orch launch {sweep.path}`.",
            exit_code=2,
        )
    if cfg.instance_profile != "create":
        raise OrchError(
            f"{sweep.path}: aws.instance_profile: --remote needs the profile orch creates (`create`): the controller's "
            f"role may pass only its sweep's own host role, which orch makes. Remove `instance_profile` or set it to "
            "create.",
            exit_code=2,
        )
    if not is_s3(sweep.store_url):
        raise OrchError(f"{sweep.path}: store: --remote needs an s3:// store (the controller's only channel).", 2)
    home = home_region(sweep) if cfg.security_group else ""
    if cfg.security_group and home != cfg.region:  # asked of the dry run too, before anything is made
        raise OrchError(
            f"{located(sweep.path, ('aws', 'security_group'))}: {cfg.security_group} is a group "
            f"of {cfg.region}, but the remote controller runs in the sweep's home region {home} (its store's "
            f"bucket's). Remove `security_group` (orch makes one per region), or keep the store in a bucket of "
            f"{cfg.region}. Nothing was launched.",
            exit_code=2,
        )


def launch_controller(state, setup: dict, say=lambda _: None) -> RemoteController:
    """Make the controller's role and instance in the sweep's home region (the store's bucket's), install orch on it
    and start its supervisor (`state`: the aws backend's ProvisioningState; `setup`: what its bootstrap made in the
    first region). An instance bought here is terminated again on any failure before the supervisor runs."""
    sweep, cfg, home = state.sweep, state.cfg, home_region(state.sweep)
    ctl, ec2 = cfg.controller, state.part(home).ec2
    parts = _home_parts(state, home, setup["image"])
    host_private, host_public = new_host_key()
    deadline = time.time() + ctl.max_hours * 3600  # the supervisor's; the per-boot shutdown is the second net
    user_data = cloud_config(
        host_private, host_public, public_key_of(cfg.ssh.identity), max(5, math.ceil(ctl.max_hours * 60))
    )
    got = fleet.acquire(
        ec2,
        parts["template"],
        parts["data"],
        user_data,
        parts["choices"],
        ["on-demand"],
        controller_tags(sweep.spec.name, host_public),
        fleet.Blocklist(),
    )
    state.ledger.acquired(got.instance_id, got.instance_type, got.az, "on-demand", role=CONTROLLER_ROLE)
    say(f"controller instance {got.instance_id} ({got.instance_type}, on demand) in {got.az}; installing orch")
    try:
        address = boot.running_address(ec2, got.instance_id, cfg.ssh.address, cfg.boot_timeout_s)
        if cfg.ssh.address == "public_ip" and not cfg.security_group:  # hosts are dialled from its public address
            admit_controller(state, home, parts["sg"], f"{address}/32", got.instance_id)
        target = Target(address, cfg.ssh.port, login_user(cfg), cfg.ssh.identity, host_public)
        conn = boot.ssh_to(ec2, got.instance_id, target, cfg.boot_timeout_s)
        try:
            _install(conn, sweep, got, home, cfg.ssh_cidr or f"{address}/32", deadline)
        finally:
            conn.close()
    except BaseException:
        api.terminate(ec2, [got.instance_id])
        raise
    return RemoteController(got.instance_id, got.instance_type, home, address)


def _home_parts(state, home: str, image: dict) -> dict:
    """The controller's parts in the home region: its subnets (`aws.subnet_ids` where they are, else the region's
    default VPC), the sweep's security group and launch template there (made when the home is no listed region),
    its role, its image and the (type, AZ) choices for its instance type."""
    from botocore.exceptions import BotoCoreError, ClientError

    sweep, cfg = state.sweep, state.cfg
    ctl, name, ec2 = cfg.controller, sweep.spec.name, state.part(home).ec2
    try:
        if cfg.market != "on-demand":  # EC2 would make it with the controller's rights, which lack IAM writes
            iam.ensure_spot_service_role(api.client("iam", home))
        subnets = api.resolve_subnets(ec2, cfg.subnet_ids if home == cfg.region else [], home)
        profile = _controller_profile(state, home, image)
        sg = cfg.security_group or groups.ensure_security_group(ec2, name, subnets[0]["VpcId"], shared_parts(state)[1])
        own = resolve_image(ec2, ctl.image or default_image(ec2, ctl.instance_type), ctl.image_owner, home)
        public_ip = cfg.ssh.address == "public_ip" and not all(s["MapPublicIpOnLaunch"] for s in subnets)
        data = api.launch_template_data(own, sg, CONTROLLER_VOLUME_GB, profile, public_ip)
        template = api.ensure_launch_template(ec2, name, data)
        choices = fleet.offered_choices(ec2, [ctl.instance_type], subnets, home)
    except (ClientError, BotoCoreError) as exc:
        raise api.explain(exc, f"preparing the controller's instance in {home}") from None
    return {"sg": sg, "data": data, "template": template, "choices": choices}


def admit_controller(state, home: str, home_sg: str, cidr: str, instance_id: str) -> None:
    """SSH from the controller's public address into the sweep's group of its home and of every listed region the
    launch prepared (its hosts may be launched in any of them; its role may not change a group)."""
    where = {home: home_sg} | {
        r: part.setup["sg"] for r in state.cfg.regions if (part := state.part(r)).setup is not None
    }
    live = [c["instance_id"] for c in live_controllers(state.part(home).ec2, state.sweep)]
    for region, sg in where.items():
        groups.allow_ssh_from(state.part(region).ec2, sg, cidr, instance_id, live)


def _controller_profile(state, home: str, image: dict) -> str:
    """The controller's role launches only what its sweep would: its instance types, the sweep's image's owner (and
    the account's own images: `orch ami build` may replace a recipe's image mid-sweep), the VPCs of its regions'
    subnets, its regions; and in its home region, when that is no listed region, only what it does to itself."""
    sweep, cfg = state.sweep, state.cfg
    store = parse_s3(sweep.store_url)
    client = api.client("iam", home)
    keys = iam.bucket_kms_keys(api.client("s3", home), [store.bucket])
    vpcs = {s["VpcId"] for r in cfg.regions for s in api.resolve_subnets(state.part(r).ec2, cfg.subnet_ids, r)}
    scope = iam.LaunchScope(
        instance_types=tuple(cfg.instance_types),
        owners=tuple(dict.fromkeys([*image.get("Owners", []), cfg.image_owner])),
        vpcs=tuple(sorted(vpcs)),
        regions=regions_of(cfg),
        home=home,
    )
    return iam.ensure_controller_profile(
        client, sweep.spec.name, store.bucket, store.prefix, iam.iam_name(sweep.spec.name), keys, scope
    )


def _install(conn, sweep, got, region: str, ssh_cidr: str, deadline: float) -> None:
    """orch's code, the sweep file and remote.json on the instance, the interpreter checked (and its packages
    installed when missing), then the supervisor started in the background."""
    cfg = sweep.spec.aws
    b = code_bundle.build(parts=code_bundle.CONTROLLER_SHIPPED)
    conn.check(code_bundle.install_command(b), stdin=b.data, timeout=300)
    py = cfg.controller.python
    _ensure_python(conn, py)
    home = conn.check('printf %s "$HOME"').strip()
    base = f"{home}/{REMOTE_DIR}"
    conn.check(f"mkdir -p {shlex.quote(base)} && chmod 700 {shlex.quote(base)}")
    sweep_file = f"{base}/{Path(sweep.path).name}"
    conn.put_bytes(Path(sweep.path).read_bytes(), sweep_file)
    settings = RemoteSettings(
        sweep_file=sweep_file,
        code_dir=b.remote_dir.replace("~/", f"{home}/"),
        python=py,
        identity=f"{base}/id_ed25519",
        laptop_key=public_key_of(cfg.ssh.identity),
        ssh_cidr=ssh_cidr,
        instance_profile=iam.iam_name(sweep.spec.name),
        instance_id=got.instance_id,
        instance_type=got.instance_type,
        region=region,
        deadline=deadline,
        notify_env={s.url_env: os.environ[s.url_env] for s in sweep.spec.notify or [] if s.url_env},
    )
    path = f"{base}/{SETTINGS_FILE}"
    conn.put_bytes(json.dumps(asdict(settings), indent=2).encode(), path)
    env = {"PYTHONPATH": settings.code_dir, "ORCH_HOME": f"{base}/home", "AWS_DEFAULT_REGION": region}
    user = conn.check("id -un").strip()
    for name, text in units(user, base, py_path(conn, py), path, env).items():
        conn.put_bytes(text.encode(), f"{base}/{name}", mode=0o644)
    conn.put_bytes(start_script(base, py, path, env).encode(), f"{base}/{START_SCRIPT}", mode=0o755)
    how = conn.check(shlex.quote(f"{base}/{START_SCRIPT}"), timeout=120).strip()  # the channel closes at once
    log.info("the controller's supervisor and watchdog run under %s", how)


def py_path(conn, py: str) -> str:
    """The interpreter's absolute path (systemd's ExecStart= takes no search of PATH of the login shell)."""
    return conn.check(f"command -v {shlex.quote(py)}").strip() or py


def _ensure_python(conn, py: str) -> None:
    """The controller's interpreter: 3.10 or newer with orch's packages; pip installs them (Amazon Linux: dnf
    installs that Python first) when the image lacks them."""
    probe = f"{shlex.quote(py)} -c {shlex.quote('import sys; assert sys.version_info >= (3, 10); import ' + IMPORTS)}"
    if conn.run(probe, timeout=300).code == 0:
        return
    pkgs = " ".join(shlex.quote(p) for p in PACKAGES)
    install = (
        f"(command -v {shlex.quote(py)} >/dev/null || ! command -v dnf >/dev/null || "
        f"sudo dnf install -y -q {shlex.quote(py)} {shlex.quote(py + '-pip')}) && "
        f"{shlex.quote(py)} -m pip install --user -q {pkgs}"
    )
    r = conn.run(install, timeout=900)
    if r.code != 0 or conn.run(probe, timeout=300).code != 0:
        raise OrchError(
            f"the controller's interpreter `{py}` cannot run orch (Python 3.10+ with {IMPORTS}); installing them "
            f"failed: {(r.err or r.out).strip()[-400:]}. Set `aws.controller.python` (Amazon Linux 2023: "
            "python3.11), or `aws.controller.image` to an image that has them.",
            exit_code=2,
        )


def remote_view(sweep, settings: RemoteSettings):
    """On the controller instance: the sweep as its backend sees it — its own key, the SSH rule its hosts' groups have
    for it and the profile the laptop made (see the module doc). The sweep itself (what is recorded and compared)
    stays as the file says. Each region's group is the sweep's own there, found by its name as a laptop's controller
    finds it (the sweep's `security_group`, of its one region, when it names one)."""
    import dataclasses

    cfg = sweep.spec.aws
    ssh = cfg.ssh.model_copy(update={"identity": settings.identity})
    update = {"ssh": ssh, "instance_profile": settings.instance_profile}
    if settings.ssh_cidr:
        update["ssh_cidr"] = settings.ssh_cidr
    aws = cfg.model_copy(update=update)
    return dataclasses.replace(sweep, spec=sweep.spec.model_copy(update={"aws": aws}))


def ensure_own_key(settings: RemoteSettings) -> None:
    """The controller's SSH key, made on its instance at its first start (0600), and the laptop's public key
    beside it: the hosts it launches accept both."""
    from orchestrator.remote.ssh import new_host_key as new_key

    key = Path(settings.identity)
    if not key.is_file():
        private, public = new_key()
        key.touch(mode=0o600)
        key.write_text(private)
        key.with_name(key.name + ".pub").write_text(public + " orch-controller\n")
    key.with_name(key.name + ALSO_SUFFIX).write_text(settings.laptop_key.strip() + "\n")


def live_controllers(ec2, sweep) -> list:
    return controllers(ec2, sweep.spec.name, ["pending", "running"])
