#!/usr/bin/env python3
"""A client of `zkguard serve` generated from its OpenAPI document, beside the standard-library
one (examples/serve_client.py): typed calls and typed answers instead of hand-built URLs and
dictionaries.

Generate the client (PyPI `openapi-python-client`, 0.29; `make deps` installs it) from the
committed document, or from a running service's `GET /openapi.json`:

    openapi-python-client generate --path docs/openapi.json \
        --config examples/openapi-python-client.yaml --output-path zkguard-client
    openapi-python-client generate --url http://127.0.0.1:7717/openapi.json \
        --config examples/openapi-python-client.yaml --output-path zkguard-client

then put its package on the path (or `pip install ./zkguard-client`) and run:

    PYTHONPATH=zkguard-client python3 examples/generated_client.py --url http://127.0.0.1:7717 \
        [--token TOKEN] [--index articles] [--article 42] [--jobs 5]

It saves an article in the foreground, submits a bulk job of background writes and waits for
each of them, takes the article's explicit lock (keep-alive, a write under it, release), and
lists the dead letters. It prints one JSON object per step and exits 0 when every step did what
it should, 1 when a background operation was not applied, 2 when the service refused a request.

The config file does two things: it names the package `zkguard_client`, and it has the
generator read `POST /v1/bulk`'s NDJSON body (application/x-ndjson, which it does not know) as
raw bytes, so that the route is generated: `bulk` takes a `File` whose payload is the NDJSON and
sends it with the document's Content-Type. The timeouts and retries of serve_client.py apply
here too: keep the client's timeout above `server.request.timeout` (30 s by default), and send
a write answered 423 or 503 again with the same `op_id` after `Retry-After`.
"""

import argparse
import io
import json
import sys
import time
import uuid

import httpx
from zkguard_client import AuthenticatedClient, Client
from zkguard_client.api.deadletters import list_deadletters
from zkguard_client.api.locks import keep_alive, release_lock, take_document_lock
from zkguard_client.api.writes import bulk, get_operation, put_doc
from zkguard_client.models import Error, OpStatus, PutDocBody, PutDocType
from zkguard_client.types import File, Response


class ServiceError(Exception):
    """The service answered with an error: the documented `Error` model, {error, message}."""

    def __init__(self, status, error, message):
        self.status = status
        self.error = error
        super().__init__(f"HTTP {status}: {error}: {message}")


def connect(url, token=None, timeout=60.0):
    """A client of the service: with a bearer token when the service requires one. The timeout
    stays above the service's own `server.request.timeout` (30 s by default)."""
    if token:
        return AuthenticatedClient(base_url=url, token=token, timeout=httpx.Timeout(timeout))
    return Client(base_url=url, timeout=httpx.Timeout(timeout))


def expect(response: Response, *statuses: int):
    """The parsed answer when its status is one of `statuses`; a ServiceError otherwise."""
    if response.status_code in statuses:
        return response.parsed
    if isinstance(response.parsed, Error):
        raise ServiceError(response.status_code, response.parsed.error, response.parsed.message)
    raise ServiceError(response.status_code, "unexpected", response.content.decode(errors="replace"))


def save(client, index, doc_id, doc, op_id=None, lock_id=None):
    """Foreground save (lock, fenced write, release), answered `Written` once done; with
    `lock_id`, made under that explicit lock instead, with its token."""
    kwargs = {"op_id": str(op_id or uuid.uuid4())}
    if lock_id is not None:
        kwargs["lock_id"] = lock_id
    answer = put_doc.sync_detailed(
        index, doc_id, client=client, body=PutDocBody.from_dict(doc), **kwargs
    )
    return expect(answer, 200)


def submit_bulk(client, operations):
    """Background bulk job, answered `BulkAccepted` (202) once journaled: NDJSON, one operation
    per line, sent as the bytes of a `File` (see the config file)."""
    ndjson = "".join(json.dumps(op) + "\n" for op in operations).encode()
    answer = bulk.sync_detailed(client=client, body=File(payload=io.BytesIO(ndjson)))
    return expect(answer, 202)


def wait_for(client, operation_id, seconds=30.0):
    """The operation's `Operation` once it is no longer queued (or still queued after
    `seconds`): each request waits on the service (`?wait=`), answered as soon as the outcome
    is known, so nothing polls."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        # Each wait stays well within server.request.timeout (30 s by default).
        wait = f"{max(1, int(min(left, 20.0) * 1000))}ms"
        state = expect(get_operation.sync_detailed(operation_id, client=client, wait=wait), 200)
        if state.status != OpStatus.QUEUED or time.monotonic() >= deadline:
            return state


def with_explicit_lock(client, index, doc_id, doc, ttl="30s"):
    """Takes the document's explicit lock, extends its lease once, saves `doc` under it and
    releases it: (`Lock` taken, `Lock` kept alive, `Written`, `Released`). A caller that works
    longer under the lock sends a keep-alive every third of the lease."""
    lock = expect(take_document_lock.sync_detailed(client=client, index=index, id=doc_id, ttl=ttl), 200)
    try:
        kept = expect(keep_alive.sync_detailed(lock.monitor, lock.lock_id, client=client, ttl=ttl), 200)
        written = save(client, index, doc_id, doc, lock_id=lock.lock_id)
        released = expect(release_lock.sync_detailed(lock.monitor, lock.lock_id, client=client), 200)
    except BaseException:
        # Released when a step failed too: nobody waits a whole lease for it.
        release_lock.sync_detailed(lock.monitor, lock.lock_id, client=client)
        raise
    return lock, kept, written, released


def dead_letters(client):
    """The parked operations (`DeadLetter`), oldest first."""
    return expect(list_deadletters.sync_detailed(client=client), 200)


def run(client, index="articles", article="42", jobs=5, wait=30.0, log=print):
    """The four steps; returns their typed answers by name, and logs each as JSON."""
    saved = save(client, index, article, {"title": "Hello", "body": "Saved in the foreground"})
    log(json.dumps({"saved": saved.to_dict()}))

    accepted = submit_bulk(
        client,
        [
            {
                "action": "index",
                "index": index,
                "id": f"{article}-related-{n}",
                "doc": {"title": f"Related {n}", "source": article},
                "op_id": str(uuid.uuid4()),
            }
            for n in range(jobs)
        ],
    )
    log(json.dumps({"accepted": accepted.to_dict()}))
    operations = [wait_for(client, op.operation_id, wait) for op in accepted.operations]
    for state in operations:
        log(json.dumps({"operation": state.to_dict()}))

    lock, kept, written, released = with_explicit_lock(
        client, index, article, {"title": "Hello", "body": "Edited under an explicit lock"}
    )
    log(json.dumps({"lock": lock.to_dict(), "kept": kept.to_dict()}))
    log(json.dumps({"written_under_lock": written.to_dict(), "released": released.to_dict()}))

    parked = dead_letters(client)
    log(json.dumps({"dead_letters": [{"id": d.id, "reason": d.reason, "error_kind": d.error_kind} for d in parked]}))
    return {
        "saved": saved,
        "accepted": accepted,
        "operations": operations,
        "lock": lock,
        "kept": kept,
        "written_under_lock": written,
        "released": released,
        "dead_letters": parked,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the service, e.g. http://127.0.0.1:7717")
    parser.add_argument("--token", help="bearer token, when the service requires one")
    parser.add_argument("--index", default="articles")
    parser.add_argument("--article", default="42", help="id of the article saved")
    parser.add_argument("--jobs", type=int, default=5, help="background writes in the bulk job")
    parser.add_argument("--wait", type=float, default=30.0, help="seconds to wait for each")
    args = parser.parse_args(argv)
    try:
        with connect(args.url, args.token) as client:
            done = run(client, args.index, args.article, args.jobs, args.wait,
                       log=lambda line: print(line, flush=True))
    except ServiceError as e:
        print(f"generated_client: {e}", file=sys.stderr)
        return 2
    except httpx.HTTPError as e:
        print(f"generated_client: no answer from {args.url}: {e}", file=sys.stderr)
        return 2
    statuses = {op.operation_id: str(op.status) for op in done["operations"]}
    print(json.dumps({"summary": {"saved": str(done["saved"].result), "token": done["saved"].token,
                                  "operations": statuses,
                                  "dead_letters": len(done["dead_letters"])}}), flush=True)
    return 0 if all(s == "applied" for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
