"""The store as a host of `backend: ssh` reaches it: through the SSH connection the controller holds to the host.

The host never dials the controller's machine (a laptop behind NAT is fine): the controller asks the host's sshd to
forward a port on the host's loopback to its store server (backends/ssh/server.py), and writes the port and a token
to a file on the host (0600), rewritten by every controller that takes the sweep over. This client reads that file
again whenever the port stops answering or the token is refused, so a relaunched controller finds its agents
talking again. Standard library only: it ships to hosts with the agent.

URL: `tunnel:<file on the host>` (`~/` allowed). A sync sends only what changed since the server's copy (by SHA-256)
and verifies what it receives; what this module raises on a store that does not answer is an OSError, as a folder
store's would be.
"""

from __future__ import annotations

import builtins
import hashlib
import http.client
import json
import os
import threading
from pathlib import Path
from urllib.parse import quote

from orchestrator.store.base import HashCache, Select, SyncResult, atomic_write, files_under, sha256_file
from orchestrator.store.layout import MANIFEST_FILE

SCHEME = "tunnel:"
TIMEOUT_S = 120.0  # a checkpoint's upload over a slow link may take a while; a dead link fails at connect


class TunnelRefused(OSError):
    """The store server answered, but not with what was asked (a bad token, a key outside the sweep)."""


def is_tunnel(url: str) -> bool:
    return url.startswith(SCHEME)


class TunnelStore:
    metered = False  # every request crosses one SSH connection: no per-request bill

    def __init__(self, url: str):
        self.url = url
        self.where = Path(os.path.expanduser(url[len(SCHEME) :]))
        self.hashes = HashCache()
        self._local = threading.local()
        self._sent: dict[str, dict[str, str]] = {}  # prefix -> {rel: sha256} the server has (this process's view)
        self._lock = threading.Lock()

    # --- transport ----------------------------------------------------------------------------------------------

    def _endpoint(self) -> tuple[int, str]:
        try:
            d = json.loads(self.where.read_text())
            return int(d["port"]), str(d["token"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConnectionError(f"no controller serves this sweep's store yet ({self.where}: {exc})") from None

    def _request(self, method: str, path: str, body=None, headers: dict | None = None) -> tuple[int, dict, bytes]:
        """One request; on a refused or dropped connection the endpoint file is read again and it is tried once more
        (a new controller, a new port)."""
        for retry in (False, True):
            conn = getattr(self._local, "conn", None)
            port, token = self._endpoint()
            if conn is None or conn.port != port:
                conn = self._local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
            try:
                conn.request(method, path, body=body, headers={"Authorization": f"Bearer {token}", **(headers or {})})
                r = conn.getresponse()
                data = r.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if retry:
                    raise
                continue
            if r.status == 401 and not retry:
                continue
            if r.status >= 500 or r.status in (400, 401, 403):
                raise TunnelRefused(f"the store server answered {r.status} to {method} {path}: {data[:300]!r}")
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        raise ConnectionError("unreachable")  # pragma: no cover - the loop returns or raises

    @staticmethod
    def _q(key: str) -> str:
        return quote(key, safe="/")

    # --- the Store protocol -------------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        self._request("PUT", f"/o/{self._q(key)}", data)

    def get_bytes(self, key: str) -> bytes | None:
        return self.get_versioned(key)[0]

    def exists(self, key: str) -> bool:
        return self._request("HEAD", f"/o/{self._q(key)}")[0] == 200

    def get_versioned(self, key: str) -> tuple[bytes | None, str | None]:
        status, headers, data = self._request("GET", f"/o/{self._q(key)}")
        return (None, None) if status == 404 else (data, headers.get("x-version"))

    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        cond = {"If-None-Match": "*"} if version is None else {"If-Match": version}
        status, headers, _ = self._request("PUT", f"/o/{self._q(key)}", data, cond)
        return None if status == 412 else headers.get("x-version")

    def list(self, prefix: str) -> builtins.list[str]:
        return json.loads(self._request("GET", f"/l/{self._q(prefix)}")[2])

    def delete_prefix(self, prefix: str) -> int:
        return int(json.loads(self._request("DELETE", f"/l/{self._q(prefix)}")[2]))

    def _index(self, prefix: str, fresh: bool) -> dict[str, str]:
        """{rel: sha256} of what the server holds under prefix (fresh: brought up to date from the store first)."""
        status, _, data = self._request("GET", f"/i/{self._q(prefix)}" + ("?fresh=1" if fresh else ""))
        return {rel: meta[1] for rel, meta in json.loads(data).items()} if status == 200 else {}

    def sync_up(
        self, local_dir: Path, prefix: str, prune: Select | None = None, indexed: bool = True, **_
    ) -> SyncResult:
        local_dir = Path(local_dir)
        with self._lock:
            known = self._sent.get(prefix)
        if known is None:
            known = self._index(prefix, fresh=False)
        result, have = SyncResult(), dict(known)
        local: set[str] = set()
        # a checkpoint's manifest after its files: a manifest in the store names files that are there
        for path in sorted(files_under(local_dir), key=lambda p: (p.name == MANIFEST_FILE, str(p))):
            rel = str(path.relative_to(local_dir))
            try:
                digest = self.hashes.digest(path)
                local.add(rel)
                if known.get(rel) == digest:
                    result.skipped += 1
                    continue
                data = path.read_bytes()  # as it is now: a file still being appended to is sent as read, and its
                digest = hashlib.sha256(data).hexdigest()  # digest is of those bytes
                if known.get(rel) == digest:
                    result.skipped += 1
                    continue
                self._request("PUT", f"/f/{self._q(prefix)}/{self._q(rel)}", data, {"X-Sha256": digest})
            except FileNotFoundError:  # the writer replaced or removed it meanwhile; the next sync catches up
                continue
            have[rel] = digest
            result.copied += 1
            result.bytes += len(data)
        gone = sorted(rel for rel in known if prune is not None and prune(rel) and rel not in local)
        commit = {"delete": gone, "indexed": indexed, "changed": result.copied}
        self._request("POST", f"/c/{self._q(prefix)}", json.dumps(commit).encode())
        for rel in gone:
            have.pop(rel, None)
        result.deleted = len(gone)
        with self._lock:
            self._sent[prefix] = have
        return result

    def sync_down(
        self, prefix: str, local_dir: Path, only: Select | None = None, stale_ok: Select | None = None
    ) -> SyncResult:
        local_dir, result = Path(local_dir), SyncResult()
        for rel, digest in sorted(self._index(prefix, fresh=True).items()):
            if only is not None and not only(rel):
                continue
            dst = local_dir / rel
            if dst.is_file() and self.hashes.digest(dst) == digest:
                result.skipped += 1
                continue
            status, _, data = self._request("GET", f"/f/{self._q(prefix)}/{self._q(rel)}")
            if status != 200:
                continue  # removed meanwhile
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.sync.tmp")
            atomic_write(tmp, data)
            if sha256_file(tmp) != digest:
                if stale_ok is None or not stale_ok(rel):
                    tmp.unlink(missing_ok=True)
                    raise OSError(f"{prefix}/{rel}: what came through the tunnel does not match its SHA-256; not kept")
                result.stale.append(rel)
            os.replace(tmp, dst)
            result.copied += 1
            result.bytes += len(data)
        return result
