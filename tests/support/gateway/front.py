#!/usr/bin/env python3
"""HTTP/1.1 front used by the gateway integration tests.

Forwards every request (any method, path and query, headers and raw body
bytes unchanged) to ``--backend URL`` and answers with the backend's status,
headers and body unchanged, except that ``X-Elastic-Product: Elasticsearch``
is added to every response, as a real Elasticsearch does (elasticsearch-py 8
refuses servers that do not send it; osmem-server does not).

Control routes for fault tests (answered by the front itself, never forwarded):
``POST /_front/hold`` makes every later write whose query carries ``version_type``
(a fenced write), and every ``_bulk`` whose body does, wait at the front, ``POST /_front/release`` lets the waiting ones
and the later ones through, ``POST /_front/held`` answers ``{"held": N}``, the
number of writes waiting. ``POST /_front/hold-reads``, ``/_front/release-reads`` and
``/_front/held-reads`` do the same for ``_mget`` requests and realtime ``GET``s of a
document (the reads a guarded write makes under its lock).

Prints exactly one JSON line ``{"url": "http://127.0.0.1:PORT"}`` once ready
and exits as soon as its standard input closes.
"""

import argparse
import http.client
import json
import os
import re
import socket
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Hop-by-hop headers (RFC 7230 section 6.1) plus the ones this front recomputes.
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
}
# Request headers not forwarded: Expect is answered here (100 Continue is
# sent by http.server), Content-Length is recomputed from the bytes read.
DROP_REQUEST = HOP_BY_HOP | {"expect", "content-length"}
DROP_RESPONSE = HOP_BY_HOP | {"content-length", "x-elastic-product"}

BACKEND_TIMEOUT = 300.0

# Only with --plain-media-types (off by default): request Content-Type/Accept
# "application/vnd.elasticsearch+json; compatible-with=8" become
# "application/json" (likewise +x-ndjson), for backends such as osmem-server
# that answer 406 to the vendor media types elasticsearch-py 8 sends.
VENDOR_MEDIA_TYPE = re.compile(
    r"application/vnd\.elasticsearch\+([A-Za-z0-9.+-]+)(\s*;\s*compatible-with\s*=\s*\d+)?",
    re.IGNORECASE,
)
MEDIA_TYPE_HEADERS = {"content-type", "accept"}


class Hold:
    """Fenced writes held at the front until the test releases them."""

    def __init__(self):
        self.cond = threading.Condition()
        self.holding = False
        self.waiting = 0

    def set(self, holding):
        with self.cond:
            self.holding = holding
            self.cond.notify_all()

    def wait_if_held(self):
        with self.cond:
            if not self.holding:
                return
            self.waiting += 1
            self.cond.notify_all()
            self.cond.wait_for(lambda: not self.holding)
            self.waiting -= 1


HOLD = Hold()
READS = Hold()


class Backend:
    def __init__(self, url):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https"):
            raise SystemExit("--backend must be an http(s) URL: %r" % url)
        self.https = parsed.scheme == "https"
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or (443 if self.https else 80)
        # A path prefix in the backend URL is prepended to every request path.
        self.prefix = parsed.path.rstrip("/")

    def connect(self):
        if self.https:
            import ssl

            ctx = ssl._create_unverified_context()
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=BACKEND_TIMEOUT, context=ctx
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=BACKEND_TIMEOUT)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "zkguard-test-front"
    sys_version = ""
    # Unbuffered writes; every response is written with a single sendall.
    wbufsize = 0

    backend = None  # set by main()
    plain_media_types = False  # set by main()

    # --- plumbing -----------------------------------------------------------

    def setup(self):
        super().setup()
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        # One persistent backend connection per client connection (thread).
        self._conn = None

    def finish(self):
        try:
            super().finish()
        finally:
            self._close_backend()

    def _close_backend(self):
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def log_message(self, format, *args):  # quiet
        pass

    # --- request body ---------------------------------------------------------

    def _read_exact(self, n):
        chunks = []
        while n > 0:
            data = self.rfile.read(n)
            if not data:
                raise ConnectionError("client closed the connection mid-body")
            chunks.append(data)
            n -= len(data)
        return b"".join(chunks)

    def _read_chunked(self):
        body = []
        while True:
            line = self.rfile.readline(65537)
            if not line:
                raise ConnectionError("client closed the connection mid-chunk")
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                # Trailer section, terminated by an empty line.
                while True:
                    trailer = self.rfile.readline(65537)
                    if not trailer or trailer in (b"\r\n", b"\n"):
                        break
                break
            body.append(self._read_exact(size))
            self._read_exact(2)  # CRLF after the chunk data
        return b"".join(body)

    def _read_body(self):
        te = self.headers.get("Transfer-Encoding", "")
        if "chunked" in te.lower():
            return self._read_chunked()
        length = self.headers.get("Content-Length")
        if length is None:
            return None
        length = int(length.strip())
        return self._read_exact(length) if length > 0 else b""

    # --- forwarding -----------------------------------------------------------

    def _send_backend(self, body):
        conn = self._conn
        if conn is None:
            conn = self._conn = self.backend.connect()
        path = self.path
        if self.backend.prefix:
            path = self.backend.prefix + (path if path.startswith("/") else "/" + path)
        try:
            conn.putrequest(self.command, path, skip_host=True, skip_accept_encoding=True)
            has_host = False
            for name, value in self.headers.items():
                lname = name.lower()
                if lname in DROP_REQUEST:
                    continue
                if lname == "host":
                    has_host = True
                if self.plain_media_types and lname in MEDIA_TYPE_HEADERS:
                    value = VENDOR_MEDIA_TYPE.sub(r"application/\1", value)
                conn.putheader(name, value)
            if not has_host:
                conn.putheader("Host", "%s:%d" % (self.backend.host, self.backend.port))
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            # Headers and body go out in one send (bytes body).
            conn.endheaders(body if body else None)
            resp = conn.getresponse()
            data = resp.read()  # whole body, de-chunked if needed
            return resp, data
        except BaseException:
            self._close_backend()
            raise

    def _control(self, what):
        hold = READS if what.endswith("-reads") else HOLD
        if what.startswith("hold"):
            hold.set(True)
        elif what.startswith("release"):
            hold.set(False)
        with hold.cond:
            payload = json.dumps({"held": hold.waiting, "holding": hold.holding}).encode()
        self.wfile.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % len(payload) + payload
        )

    def _forward(self):
        try:
            body = self._read_body()
        except (ValueError, ConnectionError, OSError):
            self.close_connection = True
            return
        path, _, query = self.path.partition("?")
        if path.startswith("/_front/"):
            self._control(path[len("/_front/"):])
            return
        fenced = "version_type=" in query or (
            path.endswith("/_bulk") and body is not None and b'"version_type"' in body
        )
        if fenced and self.command in ("PUT", "POST", "DELETE"):
            HOLD.wait_if_held()
        if path.endswith("/_mget") or (
            self.command == "GET" and "/_doc/" in path and "realtime=true" in query
        ):
            READS.wait_if_held()
        try:
            reused = self._conn is not None
            try:
                resp, data = self._send_backend(body)
            except (http.client.RemoteDisconnected, ConnectionResetError,
                    BrokenPipeError, http.client.BadStatusLine):
                # A kept-alive backend connection may have been closed by the
                # backend while idle: retry once on a fresh connection.
                if not reused:
                    raise
                resp, data = self._send_backend(body)
        except Exception as e:
            self._reply_bad_gateway(e)
            return

        if resp.will_close:
            self._close_backend()

        lines = ["HTTP/1.1 %d %s\r\n" % (resp.status, resp.reason or "")]
        backend_length = None
        for name, value in resp.getheaders():
            lname = name.lower()
            if lname == "content-length":
                backend_length = value
            if lname in DROP_RESPONSE:
                continue
            lines.append("%s: %s\r\n" % (name, value))
        lines.append("X-Elastic-Product: Elasticsearch\r\n")
        no_body_status = resp.status < 200 or resp.status in (204, 304)
        if self.command == "HEAD":
            # No body follows; advertise the size a GET would have had.
            lines.append("Content-Length: %s\r\n" % (backend_length if backend_length is not None else len(data)))
            data = b""
        elif no_body_status:
            data = b""
        else:
            lines.append("Content-Length: %d\r\n" % len(data))
        if self.close_connection:
            lines.append("Connection: close\r\n")
        lines.append("\r\n")
        head = "".join(lines).encode("latin-1")
        try:
            self.wfile.write(head + data)
        except OSError:
            self.close_connection = True

    def _reply_bad_gateway(self, err):
        payload = json.dumps({
            "error": {
                "type": "front_backend_error",
                "reason": "front could not reach the backend: %s: %s" % (type(err).__name__, err),
            },
            "status": 502,
        }).encode()
        head = (
            "HTTP/1.1 502 Bad Gateway\r\n"
            "Content-Type: application/json; charset=UTF-8\r\n"
            "X-Elastic-Product: Elasticsearch\r\n"
            "Content-Length: %d\r\n"
            "\r\n" % (0 if self.command == "HEAD" else len(payload))
        ).encode("latin-1")
        try:
            self.wfile.write(head + (b"" if self.command == "HEAD" else payload))
        except OSError:
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _forward


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def handle_error(self, request, client_address):  # quiet
        pass


def watch_stdin():
    try:
        while sys.stdin.buffer.read(65536):
            pass
    except Exception:
        pass
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", required=True, help="backend base URL, e.g. http://127.0.0.1:9200")
    ap.add_argument("--port", type=int, default=0, help="listen port on 127.0.0.1 (0 = any free port)")
    ap.add_argument(
        "--plain-media-types",
        action="store_true",
        help="rewrite request Content-Type/Accept vendor media types "
        "(application/vnd.elasticsearch+json; compatible-with=8) to plain "
        "application/json / application/x-ndjson before forwarding (off by default)",
    )
    args = ap.parse_args()

    Handler.backend = Backend(args.backend)
    Handler.plain_media_types = args.plain_media_types
    server = Server(("127.0.0.1", args.port), Handler)
    threading.Thread(target=watch_stdin, name="stdin-watch", daemon=True).start()
    sys.stdout.write(json.dumps({"url": "http://127.0.0.1:%d" % server.server_address[1]}) + "\n")
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    os._exit(0)


if __name__ == "__main__":
    main()
