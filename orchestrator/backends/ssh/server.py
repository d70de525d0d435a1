"""The store as the controller serves it to its ssh hosts (their side: store/tunneled.py).

An HTTP server on this machine's loopback, reached from each host through a port its sshd forwards over the
controller's connection (link.py). It answers the Store protocol for one sweep's keys only, to the holder of a token
made for this controller (a bearer token compared in constant time; a host's other users can reach a forwarded port
on its loopback, not the token in the agent's 0600 file). Behind it is the sweep's real store, a folder or S3.

Syncs go through a mirror of each synced prefix: for a folder store the store's own folder (no copy), for S3 a
folder under ORCH_HOME that the S3 store's own sync_up/sync_down keep level with the bucket, so what the agents
write keeps the S3 store's index and checksums exactly as an AWS host's would.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from orchestrator.store.base import HashCache, Store, atomic_write, files_under
from orchestrator.store.folder import LocalStore

log = logging.getLogger("orch.ssh")


class Counter:
    """Bytes and requests through the server (the benchmark's and `--verbose`'s figures)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = self.bytes_in = self.bytes_out = 0

    def add(self, bytes_in: int, bytes_out: int) -> None:
        with self.lock:
            self.requests += 1
            self.bytes_in += bytes_in
            self.bytes_out += bytes_out


class StoreServer:
    def __init__(self, store: Store, sweep: str, mirror_root: Path):
        self.store, self.sweep = store, sweep
        self.token = secrets.token_urlsafe(32)
        self.mirror_root = mirror_root
        self.hashes = HashCache()
        self.counter = Counter()
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        handler = type("Handler", (_Handler,), {"server_": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, name="ssh-store", daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def allowed(self, key: str) -> bool:
        """Only this sweep's keys, spelled plainly (no `..`, no absolute path, no empty part)."""
        parts = key.split("/")
        return key.startswith(self.sweep + "/") and all(p not in ("", ".", "..") for p in parts) and "\0" not in key

    def lock(self, prefix: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(prefix, threading.Lock())

    def mirror(self, key: str) -> Path:
        """Where a synced prefix (or one file of it) lies here: a folder store's own folder, or the S3 mirror."""
        return (self.store.root if isinstance(self.store, LocalStore) else self.mirror_root) / key

    def index(self, prefix: str, fresh: bool) -> dict[str, list]:
        folder = self.mirror(prefix)
        with self.lock(prefix):
            if fresh and not isinstance(self.store, LocalStore):
                self.store.sync_down(prefix, folder)
            out = {}
            for path in files_under(folder) if folder.is_dir() else []:
                try:
                    out[str(path.relative_to(folder))] = [path.stat().st_size, self.hashes.digest(path)]
                except FileNotFoundError:
                    continue
            return out

    def commit(self, prefix: str, delete: list[str], indexed: bool, changed: int) -> None:
        folder = self.mirror(prefix)
        gone = {rel for rel in delete if self.allowed(f"{prefix}/{rel}")}
        with self.lock(prefix):
            for rel in gone:
                (folder / rel).unlink(missing_ok=True)
            if not isinstance(self.store, LocalStore) and (changed or gone) and folder.is_dir():
                self.store.sync_up(folder, prefix, prune=lambda rel: rel in gone, indexed=indexed)

    def forget(self) -> None:
        """The sweep is torn down: its S3 mirrors go (a folder store's mirror is the store itself)."""
        shutil.rmtree(self.mirror_root, ignore_errors=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one TCP connection (one SSH channel) per agent thread
    server_: StoreServer

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        log.debug("store server: " + format, *args)

    # --- plumbing -----------------------------------------------------------------------------------------------

    def _send(self, code: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.server_.counter.add(int(self.headers.get("Content-Length") or 0), len(body))

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _route(self) -> tuple[str, str, dict] | None:
        """(kind, key, query) of an authorized request for one of the sweep's keys; None when answered already."""
        token = self.headers.get("Authorization", "").removeprefix("Bearer ")
        if not hmac.compare_digest(token.encode(), self.server_.token.encode()):
            self._body()
            self._send(401, b"bad token")
            return None
        url = urlsplit(self.path)
        kind, _, key = url.path.lstrip("/").partition("/")
        key = unquote(key)
        if not self.server_.allowed(key.rstrip("/") + ("/x" if kind in ("l", "i", "c") else "")):
            self._body()
            self._send(403, f"not a key of sweep {self.server_.sweep}: {key[:200]}".encode())
            return None
        return kind, key, parse_qs(url.query)

    def _serve(self, handle) -> None:
        route = self._route()
        if route is None:
            return
        try:
            handle(*route)
        except Exception as exc:  # noqa: BLE001 - the agent gets a 500 with why, and retries; the controller logs it
            log.warning("store server: %s %s: %s: %s", self.command, self.path[:200], type(exc).__name__, exc)
            self._send(500, f"{type(exc).__name__}: {exc}".encode()[:1000])

    # --- verbs ----------------------------------------------------------------------------------------------------

    def do_HEAD(self):  # noqa: N802 - http.server's names
        self._serve(lambda kind, key, q: self._send(200 if self.server_.store.exists(key) else 404))

    def do_GET(self):  # noqa: N802
        self._serve(self._get)

    def do_PUT(self):  # noqa: N802
        self._serve(self._put)

    def do_DELETE(self):  # noqa: N802
        self._serve(lambda kind, key, q: self._send(200, json.dumps(self.server_.store.delete_prefix(key)).encode()))

    def do_POST(self):  # noqa: N802
        self._serve(self._commit)

    def _get(self, kind: str, key: str, q: dict) -> None:
        srv = self.server_
        if kind == "o":
            data, version = srv.store.get_versioned(key)
            self._send(404) if data is None else self._send(200, data, {"X-Version": version or ""})
        elif kind == "l":
            self._send(200, json.dumps(srv.store.list(key)).encode())
        elif kind == "i":
            self._send(200, json.dumps(srv.index(key, fresh=bool(q.get("fresh")))).encode())
        elif kind == "f":
            try:
                self._send(200, srv.mirror(key).read_bytes())
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                self._send(404)
        else:
            self._send(404)

    def _put(self, kind: str, key: str, q: dict) -> None:
        srv, data = self.server_, self._body()
        if kind == "f":
            import hashlib

            if hashlib.sha256(data).hexdigest() != self.headers.get("X-Sha256"):
                self._send(400, b"the body does not match X-Sha256")
                return
            atomic_write(srv.mirror(key), data)  # a sync's commit (POST) makes it the store's
            self._send(200)
        elif kind == "o" and ("If-Match" in self.headers or "If-None-Match" in self.headers):
            version = srv.store.put_if(key, data, self.headers.get("If-Match"))
            self._send(412) if version is None else self._send(200, b"", {"X-Version": version})
        elif kind == "o":
            srv.store.put_bytes(key, data)
            self._send(200)
        else:
            self._send(404)

    def _commit(self, kind: str, key: str, q: dict) -> None:
        body = json.loads(self._body() or b"{}")
        self.server_.commit(key, list(body.get("delete", [])), bool(body.get("indexed", True)), body.get("changed", 1))
        self._send(200)
