"""sweep/workdir.py: which files a `workdir:` snapshot holds (git's listing, .orchignore, secrets), that the same
files give the same snapshot anywhere, and that host/workdir.py unpacks exactly them, read-only, once."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.contract import RunTask
from orchestrator.errors import SpecError
from orchestrator.host import workdir as on_host
from orchestrator.store import layout
from orchestrator.store.folder import LocalStore
from orchestrator.sweep.workdir import take


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True, capture_output=True
    )


def test_in_a_git_repository_tracked_and_untracked_files_go_and_ignored_ones_do_not(tmp_path):
    root = tree(
        tmp_path / "repo",
        {"train.py": "1", "lib/util.py": "2", ".gitignore": "data/\n*.log\n", "data/big.npy": "x", "run.log": "l"},
    )
    git(root, "init", "-q")
    git(root, "add", "train.py", ".gitignore")
    git(root, "commit", "-qm", "first")
    (root / "scratch.py").write_text("untracked, not ignored")
    (root / ".orchignore").write_text("scratch.py\n")
    snap = take(root, "sweep.yaml:1: workdir")
    assert sorted(snap.files) == [".gitignore", ".orchignore", "lib/util.py", "train.py"]
    assert len(snap.git_commit) == 40 and snap.git_dirty  # lib/util.py and .orchignore are not committed


def test_a_subfolder_of_a_repository_holds_only_its_own_files(tmp_path):
    root = tree(tmp_path / "repo", {"a.py": "1", "sub/b.py": "2"})
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-qm", "first")
    snap = take(root / "sub", "w")
    assert list(snap.files) == ["b.py"] and not snap.git_dirty


def test_the_same_files_give_the_same_snapshot_byte_for_byte_wherever_they_lie(tmp_path):
    files = {"train.py": "print(1)", "conf/a.json": "{}"}
    one, two = take(tree(tmp_path / "one", files), "w"), take(tree(tmp_path / "two", files), "w")
    assert (one.digest, one.data) == (two.digest, two.data)
    (tmp_path / "two" / "conf" / "a.json").write_text("{ }")
    assert take(tmp_path / "two", "w").digest != one.digest
    os.chmod(tmp_path / "one" / "train.py", 0o755)  # the executable bit is part of the code
    assert take(tmp_path / "one", "w").digest != one.digest


def test_secrets_are_left_out_and_named_and_an_empty_folder_is_a_snapshot(tmp_path):
    root = tree(tmp_path / "p", {".env": "K=1", "a/server.key": "k", ".aws/credentials": "c", "ok.py": "1"})
    snap = take(root, "w")
    assert list(snap.files) == ["ok.py"]
    assert snap.left_out == [".aws/credentials", ".env", "a/server.key"]
    (tmp_path / "empty").mkdir()
    empty = take(tmp_path / "empty", "w")
    assert empty.files == {} and empty.data


def test_excluded_paths_and_ignored_folders_are_never_read(tmp_path):
    root = tree(tmp_path / "p", {"ok.py": "1", "store/sweep.json": "{}", "data/x.bin": "x"})
    (root / ".orchignore").write_text("data/\n")
    os.mkfifo(root / "data" / "pipe")  # reading it would block: an ignored folder is not entered
    snap = take(root, "w", excluded=[root / "store"])
    assert sorted(snap.files) == [".orchignore", "ok.py"]


def test_links_inside_stay_links_and_links_out_are_refused(tmp_path):
    root = tree(tmp_path / "p", {"real.py": "1"})
    (root / "alias.py").symlink_to("real.py")
    snap = take(root, "w")
    assert snap.files["alias.py"] == "link:real.py"
    (root / "escape").symlink_to("../..")
    with pytest.raises(SpecError, match="escape is a link to ../.., outside the folder"):
        take(root, "sweep.yaml:4: workdir")


def test_a_folder_over_the_cap_names_its_largest_files(tmp_path):
    root = tree(tmp_path / "p", {"a.py": "1"})
    (root / "w.bin").write_bytes(b"\0" * 2_000_000)
    with pytest.raises(SpecError) as err:
        take(root, "sweep.yaml:2: workdir", max_mb=1)
    assert "sweep.yaml:2: workdir: the folder holds 2.0 MB, over the 1 MB" in str(err.value)
    assert "w.bin (2.0 MB)" in str(err.value) and ".orchignore" in str(err.value)


class Count:
    def __init__(self):
        self.down = 0

    def __call__(self, up: int = 0, down: int = 0) -> None:
        self.down += down


def task_for(snap, tmp_path: Path) -> RunTask:
    base = str(tmp_path / "host")
    return RunTask(
        sweep="s",
        run_id="r",
        attempt=1,
        command="true",
        store_url=str(tmp_path / "store"),
        run_dir=f"{base}/s/r/run",
        ctl_dir=f"{base}/s/r/ctl",
        session="x",
        code=snap.digest,
        code_sha256=snap.archive_sha256,
        code_dir=f"{base}/.code/{snap.digest}",
    )


def test_a_host_unpacks_a_snapshot_once_read_only_and_refuses_one_that_does_not_match(tmp_path):
    root = tree(tmp_path / "p", {"train.py": "print(1)", "lib/u.py": "2"})
    (root / "alias.py").symlink_to("train.py")
    snap = take(root, "w")
    store = LocalStore(str(tmp_path / "store"))
    store.put_bytes(layout.code_key("s", snap.digest), snap.data)
    task, count, log = task_for(snap, tmp_path), Count(), tmp_path / "attempt.log"
    code_dir = Path(task.code_dir)
    assert on_host.ensure_code(store, task, code_dir, log, count, lambda: False) == ""
    assert (code_dir / "lib" / "u.py").read_text() == "2" and os.readlink(code_dir / "alias.py") == "train.py"
    assert not (code_dir / "train.py").stat().st_mode & 0o222 and not code_dir.stat().st_mode & 0o222
    assert count.down == len(snap.data)
    assert on_host.ensure_code(store, task, code_dir, log, count, lambda: False) == ""
    assert count.down == len(snap.data)  # the second run on the host fetched nothing
    assert "on this host already" in log.read_text()

    store.put_bytes(layout.code_key("s", snap.digest), snap.data[:-10])  # cut off in the store
    other = task_for(snap, tmp_path / "elsewhere")
    error = on_host.ensure_code(store, other, Path(other.code_dir), log, count, lambda: False)
    assert "does not match its recorded sha256" in error
    assert not Path(other.code_dir).exists() and hashlib.sha256(snap.data).hexdigest() == snap.archive_sha256
