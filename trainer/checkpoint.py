"""Atomic checkpoints: <out>/ckpt/<step>/state.pt, then MANIFEST.json (files, sizes, sha256) written last.

A checkpoint without a manifest, or whose files disagree with it, does not exist: resume takes the
newest one that verifies and skips the rest.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("trainer.checkpoint")
MANIFEST = "MANIFEST.json"


def _fsync_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save(out_dir: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write state for `step`; return its folder. Older checkpoints beyond `keep` are removed."""
    root = Path(out_dir) / "ckpt"
    final = root / str(step)
    staging = root / f".staging-{step}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    buf = io.BytesIO()
    torch.save(state, buf)
    _fsync_write(staging / "state.pt", buf.getvalue())
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    files = {
        p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(final.iterdir()) if p.name != MANIFEST
    }
    manifest = {"step": step, "files": files, "created_at": time.time()}
    _fsync_write(final / MANIFEST, json.dumps(manifest, indent=2).encode())
    _fsync_dir(root)
    for old in candidates(out_dir)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def candidates(out_dir: Path) -> list[Path]:
    """Checkpoint folders, newest step first."""
    root = Path(out_dir) / "ckpt"
    if not root.is_dir():
        return []
    return sorted(
        (p for p in root.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name), reverse=True
    )


def verify(folder: Path) -> tuple[bool, str]:
    """(ok, why not): the manifest exists and every file has its size and sha256."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return False, "no manifest (incomplete)"
    except ValueError:
        return False, "unreadable manifest"
    for name, meta in manifest.get("files", {}).items():
        path = folder / name
        if not path.is_file():
            return False, f"{name} missing"
        if path.stat().st_size != meta["size"]:
            return False, f"{name} has {path.stat().st_size} bytes, manifest says {meta['size']}"
        if _sha256(path) != meta["sha256"]:
            return False, f"{name} checksum mismatch"
    return True, ""


def latest(out_dir: Path) -> Path | None:
    """The newest checkpoint that verifies; broken ones are logged and skipped."""
    for folder in candidates(out_dir):
        ok, why = verify(folder)
        if ok:
            return folder
        log.warning("skipping checkpoint %s: %s", folder, why)
    return None


def load(folder: Path, map_location: Any = "cpu") -> dict[str, Any]:
    return torch.load(Path(folder) / "state.pt", map_location=map_location, weights_only=False)


def to_resume(setting: str, out_dir: Path) -> Path | None:
    """The checkpoint `--resume` names: `never` none, `auto` the newest that verifies in out_dir, else that folder."""
    return None if setting == "never" else (latest(out_dir) if setting == "auto" else Path(setting))
