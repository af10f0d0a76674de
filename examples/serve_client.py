#!/usr/bin/env python3
"""A small client of `zkguard serve`, with the Python standard library only.

It saves one article in the foreground (lock, fenced write, release: the answer says it is
written, with its fencing token), submits a bulk job of background updates (answered 202 once
journaled), and waits for each operation until it is applied, rejected or parked
(`GET /v1/operations/{id}?wait=...`: the service answers as soon as the operation's outcome is
known, so the client does not poll).

    python3 examples/serve_client.py --url http://127.0.0.1:7717 [--token TOKEN] [--cafile CA.pem]
        [--index articles] [--article 42] [--jobs 5] [--wait 60]
        [--http-timeout 60] [--retries 5]

It prints one JSON object per step, and a summary line last:
{"summary": {"saved": ..., "token": ..., "operations": {id: status, ...}}}
Exit status: 0 when every background operation was applied, 1 when one was not, 2 when the
service refused a request (the message says why) or did not answer.

Timeouts. The service bounds every request itself: a foreground save waits for the document's
lock for at most `zookeeper.foreground.task.timeout` (2 s by default, or the request's
`timeout`), and no request takes longer than `server.request.timeout` (30 s by default), after
which the service answers 503 `request_timeout`. The client's own socket timeout
(--http-timeout, 60 s by default) must be longer than that, so that the client never gives up
before the service has answered: an answer tells whether the write was done, a client-side
timeout leaves it unknown. Raise --http-timeout if the service runs with a longer
`server.request.timeout`.

Retries. 423 `lock_timeout` (the lock was not free in time; nothing was written) and 503
(`queue_full`, `journal_unavailable`, `overloaded`, `lock_unavailable`, `request_timeout`, ...:
nothing accepted, or the request may be sent again) are retried up to --retries times, after the
delay of the answer's `Retry-After` header (seconds), or after a short exponential backoff when it
has none. Each retry prints {"retry": N, "status": S, "error": KIND, "after_s": SECONDS, "request":
"METHOD PATH"}. Every write carries an `op_id` of its own, the same in each retry, so that a write
the service may already have applied (503 `request_timeout`) is applied once. Other errors are
not retried.
"""

import argparse
import email.utils
import json
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

# Statuses worth sending the same request again for, after Retry-After.
RETRYABLE = (423, 503)


class ServiceError(Exception):
    """The service answered with an error: {error, message}."""

    def __init__(self, status, body, retry_after=None):
        self.status = status
        self.body = body
        self.retry_after = retry_after
        super().__init__(f"HTTP {status}: {body.get('error')}: {body.get('message')}")


def retry_after_seconds(value):
    """The delay of a `Retry-After` header (seconds, or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class Client:
    """Sends JSON requests to the service, with an optional bearer token and CA file, and retries
    the answers that say "later" (423, 503) a bounded number of times."""

    def __init__(self, url, token=None, cafile=None, timeout=60.0, retries=5):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.context = ssl.create_default_context(cafile=cafile) if cafile else None

    def call(self, method, path, body=None, content_type="application/json"):
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
        attempt = 0
        while True:
            try:
                return self.send(method, path, data, content_type)
            except ServiceError as e:
                if e.status not in RETRYABLE or attempt >= self.retries:
                    raise
                attempt += 1
                delay = e.retry_after
                if delay is None:
                    delay = min(0.25 * 2 ** (attempt - 1), 8.0)
                print(
                    json.dumps(
                        {
                            "retry": attempt,
                            "status": e.status,
                            "error": e.body.get("error"),
                            "after_s": delay,
                            "request": f"{method} {path}",
                        }
                    ),
                    flush=True,
                )
                time.sleep(delay)

    def send(self, method, path, data, content_type):
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", content_type)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            try:
                payload = json.loads(e.read() or b"{}")
            except ValueError:
                payload = {"error": "http", "message": e.reason}
            if not isinstance(payload, dict):
                payload = {"error": "http", "message": str(payload)}
            retry_after = retry_after_seconds(e.headers.get("Retry-After"))
            raise ServiceError(e.code, payload, retry_after) from None

    def save_article(self, index, article_id, doc, op_id):
        """Foreground save: answered once the write is done (or refused)."""
        path = f"/v1/indices/{urllib.parse.quote(index)}/docs/{urllib.parse.quote(article_id)}"
        return self.call("PUT", f"{path}?op_id={op_id}", doc)[1]

    def submit_bulk(self, operations):
        """Background bulk job: NDJSON, journaled as one batch, answered 202."""
        body = "".join(json.dumps(op) + "\n" for op in operations).encode()
        return self.call("POST", "/v1/bulk", body, "application/x-ndjson")[1]

    def operation(self, operation_id, wait=None):
        """The operation's state; with `wait` (seconds), answered once it is no longer queued or
        when the wait ends."""
        query = f"?wait={max(1, int(wait * 1000))}ms" if wait else ""
        return self.call("GET", f"/v1/operations/{operation_id}{query}")[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the service, e.g. http://127.0.0.1:7717")
    parser.add_argument("--token", help="bearer token, when the service requires one")
    parser.add_argument("--cafile", help="CA certificate (PEM) to trust, for https")
    parser.add_argument("--index", default="articles")
    parser.add_argument("--article", default="42", help="id of the article saved")
    parser.add_argument("--jobs", type=int, default=5, help="background updates in the bulk job")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for them")
    parser.add_argument(
        "--http-timeout",
        type=float,
        default=60.0,
        help="socket timeout in seconds; keep it above the service's server.request.timeout "
        "(30 s by default), which bounds every request, foreground lock wait included",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=5,
        help="times a request answered 423 or 503 is sent again, after its Retry-After delay",
    )
    args = parser.parse_args()
    client = Client(args.url, args.token, args.cafile, args.http_timeout, args.retries)

    try:
        saved = client.save_article(
            args.index,
            args.article,
            {"title": "Hello", "body": "Saved in the foreground"},
            uuid.uuid4(),
        )
        print(json.dumps({"saved": saved}), flush=True)

        jobs = [
            {
                "action": "index",
                "index": args.index,
                "id": f"{args.article}-related-{n}",
                "doc": {"title": f"Related {n}", "source": args.article},
                "op_id": str(uuid.uuid4()),
            }
            for n in range(args.jobs)
        ]
        accepted = client.submit_bulk(jobs)
        print(json.dumps({"accepted": accepted}), flush=True)

        ids = [op["operation_id"] for op in accepted["operations"]]
        statuses = {}
        deadline = time.monotonic() + args.wait
        for op_id in ids:
            while op_id not in statuses and time.monotonic() < deadline:
                # Each wait stays well within server.request.timeout (30 s by default).
                wait = min(20.0, max(0.001, deadline - time.monotonic()))
                state = client.operation(op_id, wait=wait)
                if state["status"] != "queued":
                    statuses[op_id] = state["status"]
                    print(json.dumps({"operation": state}), flush=True)
    except ServiceError as e:
        print(f"serve_client: {e}", file=sys.stderr)
        return 2
    except (socket.timeout, TimeoutError) as e:
        print(
            f"serve_client: no answer from {args.url} within --http-timeout "
            f"{args.http_timeout}s ({e}); the request's outcome is unknown",
            file=sys.stderr,
        )
        return 2
    except (urllib.error.URLError, OSError) as e:
        if isinstance(getattr(e, "reason", None), socket.timeout):
            print(f"serve_client: no answer from {args.url} within --http-timeout "
                  f"{args.http_timeout}s ({e.reason})", file=sys.stderr)
            return 2
        print(f"serve_client: cannot reach {args.url}: {e}", file=sys.stderr)
        return 2

    for op_id in ids:
        statuses.setdefault(op_id, "queued")
    print(
        json.dumps(
            {"summary": {"saved": saved["result"], "token": saved["token"], "operations": statuses}}
        ),
        flush=True,
    )
    return 0 if all(s == "applied" for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
