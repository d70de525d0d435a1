"""The backend registry (backends/registry.py): the one place a backend's name is looked up. An unknown `backend:`
is refused where the sweep is validated, with file:line and the known backends; each backend's section is validated
by the model it declares, its checks run only for a sweep on it, and the layers below name no backend."""

from __future__ import annotations

import re
import tokenize
from pathlib import Path

import pytest

from orchestrator.backends import registry
from orchestrator.errors import OrchError, SpecError
from orchestrator.sweep import load
from orchestrator.sweep.sections import BackendSchema
from orchestrator.sweep.spec_types import Strict

ROOT = Path(__file__).resolve().parents[3] / "orchestrator"
SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}


def test_an_unknown_backend_is_refused_by_orch_launch_with_file_line_and_the_known_ones(orch):
    path = orch.sweep("name: x\ncommand: echo hi\nbackend: gcp\n")
    result = orch("launch", str(path))
    assert result.code != 0 and "Traceback" not in result.err
    assert f"{path.name}:3: backend: unknown backend 'gcp'; known backends: local, aws" in result.err
    assert not orch.store("x").exists()  # nothing launched


def test_the_backend_factory_turns_no_unknown_name_into_a_backend():
    with pytest.raises(OrchError, match="unknown backend 'gcp'; known backends: local, aws"):
        registry.entry("gcp")


def test_a_backend_section_is_validated_by_its_own_model_with_its_line(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: x\nbackend: aws\nstore: s3://bkt/p\naws:\n  image: ami-1\n  ssh:\n    usr: me\n")
    with pytest.raises(SpecError) as err:
        registry.load_sweep(path)
    assert f"{path}:7: aws.ssh.usr: Extra inputs are not permitted. Fix: did you mean `user`?" in str(err.value)


def test_a_sweep_validated_without_backends_knows_none(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: x\nbackend: local\nlocal: {}\n")
    with pytest.raises(SpecError) as err:
        load.load_sweep(path, {})
    assert "unknown backend 'local'; known backends: (none given)" in str(err.value)
    assert f"{path}:3: local: Extra inputs are not permitted" in str(err.value)


class _Section(Strict):
    zone: str = "a"


def test_a_backend_added_to_the_registry_brings_its_section_and_checks(tmp_path):
    """What docs/backends.md promises: a new backend's name, section and checks reach the loader with no change to
    sweep/ (the schema is all the sweep layer sees)."""

    def checks(spec, base):
        return [(("fake", "zone"), "zone b is closed")] if spec.section("fake").zone == "b" else []

    known = {**registry.schemas(), "fake": BackendSchema("fake", _Section, checks)}
    path = tmp_path / "s.yaml"
    path.write_text("name: x\ncommand: echo hi\nbackend: fake\nfake:\n  zone: c\n")
    sweep = load.load_sweep(path, known)
    assert sweep.spec.section("fake").zone == "c" and sweep.resolved()["fake"] == {"zone": "c"}
    path.write_text("name: x\ncommand: echo hi\nbackend: fake\nfake:\n  zone: b\n")
    with pytest.raises(SpecError, match=re.escape(f"{path}:5: fake.zone: zone b is closed")):
        load.load_sweep(path, known)


def test_a_record_written_before_the_registry_reads_back_the_same(tmp_path):
    """sweep.json keeps a section per backend (`aws: null` on a local sweep), as before the sections moved."""
    path = tmp_path / "s.yaml"
    path.write_text("name: x\ncommand: echo {a}\ngrid: {a: [1, 2]}\n")
    sweep = registry.load_sweep(path)
    resolved = sweep.resolved()
    assert resolved["aws"] is None and resolved["local"] == {"workdir": None, "threads_per_run": None}
    again = registry.sweep_from_record({"spec": resolved}, str(path))
    assert again.resolved() == resolved


# sweep/, control/, contract.py and the CLI's generic commands. The AWS backend's own commands are its own:
# cli/aws.py (`orch aws policy|boundary`), cli/ami.py (images) and cli/remote.py (`orch launch --remote` and the
# supervisor's command on its instance). Nothing else is exempt: the dry run's plan in words and `orch down --all` /
# `orch gc`'s leftovers come from the registry (`plan_lines`, `leftovers`).
GENERIC = ["sweep", "control", "contract.py", "cli"]
BACKENDS_OWN = {"cli/aws.py", "cli/ami.py", "cli/remote.py"}
BACKEND_WORD = re.compile(r"(?i)(?:^|_)(aws|boto3?|botocore|ec2|imds)(?:$|_)")


def _generic_files():
    for part in GENERIC:
        for f in sorted((ROOT / part).rglob("*.py")) if (ROOT / part).is_dir() else [ROOT / part]:
            if str(f.relative_to(ROOT)) not in BACKENDS_OWN:
                yield f


def test_the_generic_layers_import_no_backend():
    """sweep/, control/, contract.py and the CLI's generic commands import no backend's parts (each backend's are
    reached through the registry); comments and messages aside."""
    named = []
    for f in _generic_files():
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if re.search(r"^\s*(import|from)\s+\S*\b(aws|boto3?|botocore|ec2|imds)\b", line):
                named.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not named, "\n".join(named)


def test_the_generic_layers_name_no_backend_in_their_code():
    """Beyond imports: no name in their code says aws, boto, ec2 or imds (`spec.aws`, `aws_client`...), and no
    comparison picks the aws backend by name (`backend == "aws"`); comments, docstrings and messages aside. A new
    one belongs in the backend's package, reached through orchestrator/backends/registry.py (docs/backends.md)."""
    named: dict[str, None] = {}  # each line once, however many names it has
    for f in _generic_files():
        with f.open("rb") as source:
            tokens = [t for t in tokenize.tokenize(source.readline) if t.type not in SKIPPED]
        for before, tok in zip([None, *tokens], tokens, strict=False):
            by_name = tok.type == tokenize.NAME and BACKEND_WORD.search(tok.string)
            compared = (
                tok.type == tokenize.STRING
                and tok.string.strip("\"'").lower() == "aws"
                and before is not None
                and before.string in ("==", "!=", "in")
            )
            if by_name or compared:
                named[f"{f.relative_to(ROOT)}:{tok.start[0]}: {tok.line.strip()}"] = None
    assert not named, "\n".join(named)


def test_a_local_sweep_staging_twice_to_one_folder_through_its_home_is_refused_by_orch_launch(orch, tmp_path):
    """`~` is this machine's home to the local backend (its entry's `host_path`), so `~/d` and HOME/d are one folder."""
    (tmp_path / "src").mkdir()
    same = f"{Path('~').expanduser()}/orch-test-data-d"
    path = orch.sweep(
        f"name: x\ncommand: echo hi\ndata:\n  - {{from: {tmp_path / 'src'}, to: ~/orch-test-data-d}}\n"
        f"  - {{from: {tmp_path / 'src'}, to: {same}}}\n"
    )
    result = orch("launch", str(path), "--dry-run")
    assert result.code != 0 and "Traceback" not in result.err
    said = f"sweep.yaml:5: data[1].to: {same!r} is the folder data[0] stages to ('~/orch-test-data-d'); give each"
    assert said in result.err


def test_on_aws_tilde_in_a_data_folder_is_the_hosts_home_not_this_machines(tmp_path):
    same = f"{Path('~').expanduser()}/d"
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: x\ncommand: echo hi\nbackend: aws\nstore: s3://bkt/p\naws:\n  image: ami-1\n"
        f"data:\n  - {{from: s3://bkt/d/, to: ~/d}}\n  - {{from: s3://bkt/d/, to: {same}}}\n"
    )
    assert [d.to for d in registry.load_sweep(path).spec.data or []] == ["~/d", same]
