#!/usr/bin/env python3
"""A small client of `zkguard serve`, with the Python standard library only.

It saves one article in the foreground (lock, fenced write, release: the answer says it is
written, with its fencing token), submits a bulk job of background updates (answered 202 once
journaled), and polls each operation until it is applied, rejected or parked.

    python3 examples/serve_client.py --url http://127.0.0.1:7717 [--token TOKEN] [--cafile CA.pem]
        [--index articles] [--article 42] [--jobs 5] [--wait 60]

It prints one JSON object per step, and a summary line last:
{"summary": {"saved": ..., "token": ..., "operations": {id: status, ...}}}
Exit status: 0 when every background operation was applied, 1 when one was not, 2 when the
service refused a request (the message says why).
"""

import argparse
import json
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


class ServiceError(Exception):
    """The service answered with an error: {error, message}."""

    def __init__(self, status, body):
        self.status = status
        self.body = body
        super().__init__(f"HTTP {status}: {body.get('error')}: {body.get('message')}")


class Client:
    """Sends JSON requests to the service, with an optional bearer token and CA file."""

    def __init__(self, url, token=None, cafile=None, timeout=30.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=cafile) if cafile else None

    def call(self, method, path, body=None, content_type="application/json"):
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
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
            raise ServiceError(e.code, payload) from None

    def save_article(self, index, article_id, doc):
        """Foreground save: answered once the write is done (or refused)."""
        path = f"/v1/indices/{urllib.parse.quote(index)}/docs/{urllib.parse.quote(article_id)}"
        return self.call("PUT", path, doc)[1]

    def submit_bulk(self, operations):
        """Background bulk job: NDJSON, journaled as one batch, answered 202."""
        body = "".join(json.dumps(op) + "\n" for op in operations).encode()
        return self.call("POST", "/v1/bulk", body, "application/x-ndjson")[1]

    def operation(self, operation_id):
        return self.call("GET", f"/v1/operations/{operation_id}")[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the service, e.g. http://127.0.0.1:7717")
    parser.add_argument("--token", help="bearer token, when the service requires one")
    parser.add_argument("--cafile", help="CA certificate (PEM) to trust, for https")
    parser.add_argument("--index", default="articles")
    parser.add_argument("--article", default="42", help="id of the article saved")
    parser.add_argument("--jobs", type=int, default=5, help="background updates in the bulk job")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for them")
    args = parser.parse_args()
    client = Client(args.url, args.token, args.cafile)

    try:
        saved = client.save_article(
            args.index, args.article, {"title": "Hello", "body": "Saved in the foreground"}
        )
        print(json.dumps({"saved": saved}), flush=True)

        jobs = [
            {
                "action": "index",
                "index": args.index,
                "id": f"{args.article}-related-{n}",
                "doc": {"title": f"Related {n}", "source": args.article},
            }
            for n in range(args.jobs)
        ]
        accepted = client.submit_bulk(jobs)
        print(json.dumps({"accepted": accepted}), flush=True)

        ids = [op["operation_id"] for op in accepted["operations"]]
        statuses = {}
        deadline = time.monotonic() + args.wait
        while len(statuses) < len(ids) and time.monotonic() < deadline:
            for op_id in ids:
                if op_id not in statuses:
                    state = client.operation(op_id)
                    if state["status"] != "queued":
                        statuses[op_id] = state["status"]
                        print(json.dumps({"operation": state}), flush=True)
            if len(statuses) < len(ids):
                time.sleep(0.1)
    except ServiceError as e:
        print(f"serve_client: {e}", file=sys.stderr)
        return 2
    except (urllib.error.URLError, OSError) as e:
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
