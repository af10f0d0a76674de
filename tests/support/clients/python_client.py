"""The generated Python client against a live `zkguard serve` (run by tests/clients.rs).

    PYTHONPATH=<generated client>:examples python3 tests/support/clients/python_client.py URL INDEX

Through the package openapi-python-client generated from docs/openapi.json, and through
examples/generated_client.py (whose functions are the ones a user copies): parks an operation
that can never apply (a background PATCH of a missing document, without upsert), then runs the
example's four steps (a foreground save, a bulk job waited for, an explicit lock with keep-alive,
a write under it and release, the dead letters) and checks every typed answer. Prints one JSON
summary line last, which the Rust test checks against the service and Elasticsearch; any failed
check exits non-zero with a message.
"""

import json
import sys

import generated_client as example
from zkguard_client.api.writes import patch_doc
from zkguard_client.models import (
    Accepted,
    BulkAccepted,
    DeadLetter,
    Lock,
    LockTypeName,
    Operation,
    OpStatus,
    PatchDocBody,
    PatchDocType,
    Released,
    WriteResult,
    Written,
)


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def main(url, index):
    with example.connect(url, timeout=30.0) as client:
        # An operation that can never apply: the service parks it in the dead-letter sink.
        answer = patch_doc.sync_detailed(
            index,
            "missing",
            client=client,
            body=PatchDocBody.from_dict({"views": 1}),
            type_=PatchDocType.BACKGROUND,
        )
        queued = example.expect(answer, 202)
        check(isinstance(queued, Accepted) and queued.status == OpStatus.QUEUED, f"{queued!r}")
        parked = example.wait_for(client, queued.operation_id, seconds=10)
        check(isinstance(parked, Operation), f"{parked!r}")
        check(parked.status == OpStatus.PARKED, f"not parked: {parked!r}")
        check("does not exist" in parked.reason, f"reason: {parked.reason!r}")

        log = []
        done = example.run(client, index=index, article="42", jobs=3, wait=10, log=log.append)

    saved = done["saved"]
    check(isinstance(saved, Written), f"{saved!r}")
    check(saved.result == WriteResult.WRITTEN, f"{saved!r}")
    check(saved.token > 0 and saved.version == saved.token, f"{saved!r}")

    accepted = done["accepted"]
    check(isinstance(accepted, BulkAccepted) and accepted.count == 3, f"{accepted!r}")
    check(all(op.status == OpStatus.QUEUED for op in accepted.operations), f"{accepted!r}")
    operations = done["operations"]
    for op in operations:
        check(isinstance(op, Operation), f"{op!r}")
        check(op.status == OpStatus.APPLIED, f"not applied: {op!r}")
        check(isinstance(op.token, int) and op.token > saved.token, f"token: {op!r}")
        check(isinstance(op.attempts, int) and op.attempts >= 1, f"attempts: {op!r}")

    lock, kept = done["lock"], done["kept"]
    check(isinstance(lock, Lock) and isinstance(kept, Lock), f"{lock!r} {kept!r}")
    check(lock.monitor == f"{index}:42", f"{lock!r}")
    check(lock.lock_type == LockTypeName.FOREGROUND and lock.ttl_ms == 30_000, f"{lock!r}")
    check(lock.token > max(op.token for op in operations), f"{lock!r}")
    check((kept.lock_id, kept.token, kept.monitor) == (lock.lock_id, lock.token, lock.monitor),
          f"{kept!r}")
    check(kept.expires >= lock.expires, f"the keep-alive shortened the lease: {kept!r}")
    written = done["written_under_lock"]
    check(written.result == WriteResult.WRITTEN and written.token == lock.token, f"{written!r}")
    released = done["released"]
    check(isinstance(released, Released) and released.released is True, f"{released!r}")
    check(released.token == lock.token and released.lock_id == lock.lock_id, f"{released!r}")

    letters = done["dead_letters"]
    check(all(isinstance(d, DeadLetter) for d in letters), f"{letters!r}")
    mine = [d for d in letters if d.id == queued.operation_id]
    check(len(mine) == 1, f"{queued.operation_id} not listed: {letters!r}")
    letter = mine[0]
    check(letter.reason == "not_retryable", f"{letter!r}")
    check(letter.monitor == f"{index}:missing", f"{letter!r}")
    check(letter.operation["kind"]["id"] == "missing", f"{letter!r}")

    # The example logged each step as JSON.
    steps = [next(iter(json.loads(line))) for line in log]
    check(steps == ["saved", "accepted", "operation", "operation", "operation", "lock",
                    "written_under_lock", "dead_letters"], f"{steps}")

    print(json.dumps({
        "saved": saved.to_dict(),
        "operations": [op.to_dict() for op in operations],
        "lock": lock.to_dict(),
        "kept": kept.to_dict(),
        "written_under_lock": written.to_dict(),
        "released": released.to_dict(),
        "dead_letter": {"id": letter.id, "reason": letter.reason, "error_kind": letter.error_kind,
                        "last_error": letter.last_error},
    }))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
