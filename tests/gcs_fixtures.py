"""A real GCS-compatible server on loopback for the gs:// tests, and a proxy that injects storage faults.

`gcp-storage-emulator` runs in its own process (its own GIL, so Beam's in-process runner and the
server never starve each other) on a free port; `STORAGE_EMULATOR_HOST` (and array-record's
`CLOUD_STORAGE_EMULATOR_ENDPOINT`) point at it for the whole session, so the real `google-cloud-storage` client,
Beam's gcsio, array-record's reader and subprocess workers all use it.
No storage client is mocked anywhere.
"""
from __future__ import annotations

import http.client
import json
import os
import random
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from benchmarks.scale_sim import stand_in

PROJECT = "local-emulator"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/", timeout=2) as r:
                if r.read() == b"OK":
                    return
        except OSError:
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"gcp-storage-emulator exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"gcp-storage-emulator did not answer at {url}")
        time.sleep(0.1)


def reset_clients() -> None:
    """Forget cached storage clients so the next call reads STORAGE_EMULATOR_HOST again."""
    from shard_utils.storage import base as storage_base

    storage_base._client = None


# The Python clients (ours, Beam's) read the first; google-cloud-cpp, inside array-record's reader of gs:// shards,
# the second. Both clients read them whenever they make a client, so a block can point them elsewhere.
EMULATOR_VARIABLES = ("STORAGE_EMULATOR_HOST", "CLOUD_STORAGE_EMULATOR_ENDPOINT")


@contextmanager
def storage_host(url: str) -> Iterator[None]:
    """Point every storage client created inside the block (ours, Beam's, array-record's) at url."""
    old = {name: os.environ.get(name) for name in EMULATOR_VARIABLES}
    os.environ.update(dict.fromkeys(EMULATOR_VARIABLES, url))
    reset_clients()
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        reset_clients()


class Emulator:
    """A running emulator and a client talking straight to it (not through any proxy)."""

    def __init__(self, url: str, proc: subprocess.Popen):
        self.url = url
        self.proc = proc
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        self.client = storage.Client(project=PROJECT, credentials=AnonymousCredentials(),
                                     client_options={"api_endpoint": url})
        self._n = 0

    def new_bucket(self, stem: str = "b") -> str:
        """A fresh, empty bucket; returns its name."""
        self._n += 1
        name = f"{stem}-{self._n}-{os.getpid()}"
        self.client.create_bucket(name)
        return name

    def upload_tree(self, local: Path, bucket: str, prefix: str = "") -> int:
        """Copy every file under a local folder to gs://bucket/prefix/...; returns how many."""
        n = 0
        b = self.client.bucket(bucket)
        for path in sorted(p for p in Path(local).rglob("*") if p.is_file()):
            rel = path.relative_to(local).as_posix()
            b.blob(f"{prefix.rstrip('/')}/{rel}" if prefix else rel).upload_from_filename(str(path))
            n += 1
        return n

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under a prefix, name relative to the prefix -> content."""
        b = self.client.bucket(bucket)
        return {blob.name[len(prefix):]: b.blob(blob.name).download_as_bytes()
                for blob in self.client.list_blobs(bucket, prefix=prefix)}

    def names(self, bucket: str, prefix: str = "") -> list[str]:
        return sorted(blob.name[len(prefix):] for blob in self.client.list_blobs(bucket, prefix=prefix))

    def blob(self, bucket: str, name: str):
        return self.client.bucket(bucket).get_blob(name)


# Application Default Credentials for the tests: a service-account key (generated per session) whose
# token endpoint is a tiny server on loopback. Beam and the client libraries find it the way they find
# real ADC (GOOGLE_APPLICATION_CREDENTIALS); the emulator ignores the bearer token. Neither the key nor
# the access token may ever appear in any output.
ACCESS_TOKEN = "test-access-token-77e1deaf"


class TokenServer:
    """Answers OAuth token refreshes with a fixed access token; counts them."""

    def __init__(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.refreshes += 1
                body = json.dumps({"access_token": ACCESS_TOKEN, "expires_in": 3600,
                                   "token_type": "Bearer"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.refreshes = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/token"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def write_adc(self, path: Path) -> Path:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.private_key = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()).decode()
        self.key_id = os.urandom(8).hex()
        path.write_text(json.dumps({
            "type": "service_account", "project_id": PROJECT, "private_key_id": self.key_id,
            "private_key": self.private_key, "client_email": f"builder@{PROJECT}.iam.gserviceaccount.com",
            "client_id": "1234567890", "token_uri": self.url}))
        return path

    def secrets(self) -> list[str]:
        """Strings that must never be printed or logged."""
        body = self.private_key.splitlines()[1]  # a line of the key itself
        return [ACCESS_TOKEN, self.key_id, body]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


# The emulator's main, less the JSON snapshot of every object's metadata that it writes after each write. With
# --in-memory nothing reads that snapshot back, and writing it costs time in proportion to every object stored so
# far, so a session's uploads grew quadratically slower (the 400th of 1,600 one-byte uploads took 6x the first).
EMULATOR_MAIN = ("from gcp_storage_emulator import storage\n"
                 "storage.Storage._write_config_to_file = lambda self: None\n"
                 "from gcp_storage_emulator.__main__ import main\n"
                 "main()")


@contextmanager
def running_emulator(adc_folder: Path) -> Iterator[Emulator]:
    """gcp-storage-emulator on a free loopback port, with STORAGE_EMULATOR_HOST, a project and Application
    Default Credentials (a key whose token endpoint is on loopback, written in adc_folder) set inside the block."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-c", EMULATOR_MAIN, "start", "--host=127.0.0.1", f"--port={port}", "--in-memory", "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # No metadata-server probe when Application Default Credentials are looked up offline.
    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "NO_GCE_CHECK", "GOOGLE_CLOUD_PROJECT",
                                            "GOOGLE_APPLICATION_CREDENTIALS")}
    tokens = TokenServer()
    try:
        _wait_healthy(url, proc)
        os.environ["NO_GCE_CHECK"] = "True"
        os.environ["GOOGLE_CLOUD_PROJECT"] = PROJECT
        adc = tokens.write_adc(Path(adc_folder) / "application_default_credentials.json")
        os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = str(adc)
        with storage_host(url):
            em = Emulator(url, proc)
            em.tokens = tokens
            yield em
    finally:
        tokens.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reset_clients()


@pytest.fixture(scope="session")
def gcs(tmp_path_factory) -> Iterator[Emulator]:
    """gcp-storage-emulator on a free loopback port, with STORAGE_EMULATOR_HOST set for the session."""
    with running_emulator(tmp_path_factory.mktemp("adc")) as em:
        yield em


DENIED = f"builder@{PROJECT}.iam.gserviceaccount.com does not have storage.objects.create access"


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):  # a client that hung up on a reset: expected here
        pass


class FaultProxy:
    """An HTTP proxy in front of the emulator that fails a seeded fraction of requests.

    A failed request never reaches the emulator: it gets either an HTTP 503 (or 429) or a
    TCP reset with no response at all. Everything else is forwarded unchanged, except that with
    paginate=True object listings are answered as Cloud Storage pages them (maxResults entries, items and
    prefixes together, startOffset/endOffset, a nextPageToken; see benchmarks/scale_sim/stand_in.py): the
    emulator answers every object and prefix at once and ignores the offsets. deny_writes_to=<bucket> answers every
    write to that bucket with 403, like a bucket the credentials may only read. fail_paths (a regular expression)
    answers every request whose path matches with 503: an object that stays unavailable (with fail_first=N, only the
    first N of them: a request that fails, then works when tried again). latency (seconds) delays every request before
    it is forwarded, as a remote store would; requests in flight at once wait at once.

    A suffix range (`Range: bytes=-N`, the last N bytes: how array-record's C++ client reads a shard's footer)
    is answered as Cloud Storage answers it, 206 with the object's last N bytes; the emulator ignores it and
    sends the whole object. `ranges` holds the Range header (or None) of every request received, beside
    `requests`, and `connections` counts the TCP connections clients opened.
    """

    def __init__(self, upstream: str, rate: float = 0.0, seed: int = 1, deny_writes_to: str | None = None,
                 paginate: bool = False, latency: float = 0.0, fail_paths: str | None = None,
                 fail_first: int | None = None):
        self.upstream = upstream.removeprefix("http://")
        self.paginate = paginate
        self.latency = latency
        self.fail_paths = re.compile(fail_paths) if fail_paths else None
        self.fail_first = fail_first
        self.failed_paths = 0  # requests answered 503 for matching fail_paths
        self.rate = rate
        self.random = random.Random(seed)
        self.deny_writes_to = deny_writes_to
        self.lock = threading.Lock()
        self.counts = {"forwarded": 0, "503": 0, "429": 0, "reset": 0, "403": 0}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request received
        self.ranges: list[str | None] = []  # the Range header of each of them
        self.connections = 0
        self.served: list[tuple[str, str, int]] = []  # (method, path, response body bytes) of forwarded ones
        self.timeline: list[tuple[float, float, str, str]] = []  # (start, end, method, path) of forwarded ones
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def setup(self):
                super().setup()
                with proxy.lock:
                    proxy.connections += 1

            def _handle(self):
                started = time.monotonic()
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                fault = proxy._fault(self.command, self.path, self.headers.get("Range"))
                if fault == "reset":
                    # Drop the connection without a response: the client sees a reset.
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault in ("503", "429", "403"):
                    message = DENIED if fault == "403" else "injected fault"
                    payload = json.dumps({"error": {"code": int(fault), "message": message,
                                                    "errors": [{"message": message, "reason": "injected"}]}}).encode()
                    self.send_response(int(fault))
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                page = proxy._page_request(self.command, self.path)
                suffix = re.fullmatch(r"bytes=-(\d+)", self.headers.get("Range") or "")
                conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() not in ("host", "connection") and not (suffix and k.lower() == "range")}
                    conn.request(self.command, page[0] if page else self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                status, reason, resp_headers = resp.status, resp.reason, resp.getheaders()
                if page and resp.status == 200:
                    data = proxy._page_of(data, *page[1:])
                if suffix and resp.status == 200:
                    status, reason, resp_headers, data = proxy._suffix_of(data, int(suffix.group(1)), resp_headers)
                with proxy.lock:
                    proxy.served.append((self.command, self.path, len(data)))
                    proxy.timeline.append((started, time.monotonic(), self.command, self.path))
                self.send_response(status, reason)
                for k, v in resp_headers:
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _fault(self, method: str, path: str, byte_range: str | None = None) -> str | None:
        if self.latency:
            time.sleep(self.latency)
        with self.lock:
            self.requests.append((method, path))
            self.ranges.append(byte_range)
            if (self.fail_paths is not None and self.fail_paths.search(urllib.parse.unquote(path))
                    and (self.fail_first is None or self.failed_paths < self.fail_first)):
                self.failed_paths += 1
                self.counts["503"] += 1
                return "503"
            if self.deny_writes_to and method != "GET" and f"/b/{self.deny_writes_to}/" in path:
                self.counts["403"] += 1
                return "403"
            if path.rstrip("/") == "" or self.random.random() >= self.rate:
                self.counts["forwarded"] += 1
                return None
            kind = self.random.choice(("503", "429", "reset"))
            self.counts[kind] += 1
            return kind

    @staticmethod
    def _suffix_of(whole: bytes, n: int, headers: list[tuple[str, str]]):
        """(status, reason, headers, body) of Cloud Storage's answer to `Range: bytes=-n` on an object whose bytes
        are `whole`: 206 with the last n bytes (all of them when n is larger), with their Content-Range."""
        start = max(0, len(whole) - n)
        kept = [(k, v) for k, v in headers if k.lower() not in ("content-range", "x-goog-hash")]
        return 206, "Partial Content", kept + [("Content-Range", f"bytes {start}-{len(whole) - 1}/{len(whole)}")], \
            whole[start:]

    PAGING = ("maxResults", "pageToken", "delimiter", "startOffset", "endOffset")

    def _page_request(self, method: str, path: str):
        """For an object listing (the emulator answers every object and prefix at once, and ignores the
        offsets): the upstream path asking for every object under the prefix, and the paging to apply."""
        if not self.paginate or method != "GET":
            return None
        url = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(url.query)
        if not re.fullmatch(r"/storage/v1/b/[^/]+/o", url.path):
            return None
        paging = {k: query.pop(k)[0] for k in self.PAGING if k in query}
        query.pop("fields", None)  # the whole metadata of every object: the page is cut here
        return url.path + "?" + urllib.parse.urlencode(query, doseq=True), query.get("prefix", [""])[0], paging

    @staticmethod
    def _page_of(data: bytes, prefix: str, paging: dict) -> bytes:
        """The page Cloud Storage would answer (benchmarks/scale_sim/stand_in.py) cut from the full listing."""
        listing = json.loads(data)
        items = {item["name"]: item for item in listing.get("items", [])}
        found = stand_in.page(sorted(items), prefix, paging.get("delimiter"), paging.get("startOffset"),
                              paging.get("endOffset"), paging.get("pageToken"),
                              int(paging.get("maxResults", stand_in.MAX_RESULTS)))
        answer = {"kind": listing.get("kind", "storage#objects"), "items": [items[n] for n in found.items],
                  "prefixes": found.prefixes}
        if found.token is not None:
            answer["nextPageToken"] = found.token
        return json.dumps(answer).encode()

    @property
    def faults(self) -> int:
        return self.counts["503"] + self.counts["429"] + self.counts["reset"]

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class PreconditionProxy:
    """Forwards to the emulator, adding the generation checks GCS makes and the emulator ignores.

    gcp-storage-emulator accepts ifGenerationMatch and generation parameters but never checks them.
    This proxy serializes every request and, before forwarding one, compares them with the
    object's current generation as the emulator reports it: a failed ifGenerationMatch gets GCS's
    412, a request pinned to a generation that is no longer current gets 404.
    """

    def __init__(self, upstream: str):
        self.upstream = upstream.removeprefix("http://")
        self.lock = threading.Lock()
        self.counts = {"412": 0, "404": 0, "forwarded": 0}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy.lock:
                    status, headers, data = proxy._answer(self.command, self.path, dict(self.headers), body)
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _request(self, method, path, headers=None, body=None):
        conn = http.client.HTTPConnection(self.upstream, timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def _generation(self, bucket: str, name: str) -> str:
        status, _, data = self._request("GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}")
        return json.loads(data)["generation"] if status == 200 else "0"

    @staticmethod
    def _target(path: str, query: dict, body: bytes) -> tuple[str, str] | None:
        found = re.fullmatch(r"(?:/upload)?/storage/v1/b/([^/]+)/o(?:/([^/]+))?", path)
        if not found:
            return None
        name = urllib.parse.unquote(found.group(2)) if found.group(2) else query.get("name", [None])[0]
        if name is None:  # a multipart upload names the object in its JSON part
            named = re.search(rb'"name":\s*"((?:[^"\\]|\\.)*)"', body)
            name = json.loads(b'"' + named.group(1) + b'"') if named else None
        return (found.group(1), name) if name else None

    def _answer(self, method, raw_path, headers, body):
        url = urllib.parse.urlsplit(raw_path)
        query = urllib.parse.parse_qs(url.query)
        target = self._target(url.path, query, body)
        if target and ("ifGenerationMatch" in query or "generation" in query):
            current = self._generation(*target)
            if "ifGenerationMatch" in query and query["ifGenerationMatch"][0] != current:
                self.counts["412"] += 1
                return 412, [("Content-Type", "application/json")], json.dumps({"error": {
                    "code": 412, "message": "At least one of the pre-conditions you specified did not hold.",
                    "errors": [{"reason": "conditionNotMet"}]}}).encode()
            if "generation" in query and query["generation"][0] != current:
                self.counts["404"] += 1
                return 404, [("Content-Type", "application/json")], json.dumps({"error": {
                    "code": 404, "message": f"No such object: {target[0]}/{target[1]}"}}).encode()
        self.counts["forwarded"] += 1
        headers = {k: v for k, v in headers.items() if k.lower() not in ("host", "connection")}
        return self._request(method, raw_path, headers, body)

    def __enter__(self) -> PreconditionProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
