// The generated TypeScript client against a live `zkguard serve` (run by tests/clients.rs, which
// puts this file beside examples/generated_client.mts and zkguard-api.d.ts, the types
// openapi-typescript generated from docs/openapi.json, and compiles them with tsc, strict).
//
//     node client_test.mjs URL INDEX
//
// Through openapi-fetch and the example's functions: parks an operation that can never apply (a
// background PATCH of a missing document, without upsert), then runs the example's four steps (a
// foreground save, a bulk job waited for, an explicit lock with keep-alive, a write under it and
// release, the dead letters) and checks every typed answer. Prints one JSON summary line last,
// which the Rust test checks against the service and Elasticsearch; a failed check exits
// non-zero with a message.
import assert from "node:assert/strict";
import { connect, expect, run, waitFor, type Schemas } from "./generated_client.mjs";

const [url, index] = process.argv.slice(2);
assert.ok(url && index, "usage: node client_test.mjs URL INDEX");
const client = connect(url);

// An operation that can never apply: the service parks it in the dead-letter sink.
const queued: Schemas["Accepted"] = expect(
  await client.PATCH("/v1/indices/{index}/docs/{id}", {
    params: { path: { index, id: "missing" }, query: { type: "background" } },
    body: { views: 1 },
  }),
  202,
) as Schemas["Accepted"];
assert.equal(queued.status, "queued", JSON.stringify(queued));
const parked = await waitFor(client, queued.operation_id, 10);
assert.equal(parked.status, "parked", JSON.stringify(parked));
assert.match(parked.reason ?? "", /does not exist/, JSON.stringify(parked));

const log: string[] = [];
const done = await run(client, { index, article: "42", jobs: 3, wait: 10, log: (line) => log.push(line) });

const { saved, accepted, operations, lock, kept, writtenUnderLock, released, deadLetters } = done;
assert.equal(saved.result, "written", JSON.stringify(saved));
assert.ok(saved.token > 0 && saved.version === saved.token, JSON.stringify(saved));

assert.equal(accepted.count, 3, JSON.stringify(accepted));
assert.ok(accepted.operations.every((op) => op.status === "queued"), JSON.stringify(accepted));
const tokens: number[] = [];
for (const op of operations) {
  assert.equal(op.status, "applied", JSON.stringify(op));
  assert.ok(typeof op.token === "number" && op.token > saved.token, JSON.stringify(op));
  assert.ok((op.attempts ?? 0) >= 1, JSON.stringify(op));
  tokens.push(op.token);
}

assert.equal(lock.monitor, `${index}:42`, JSON.stringify(lock));
assert.equal(lock.lock_type, "foreground", JSON.stringify(lock));
assert.equal(lock.ttl_ms, 30_000, JSON.stringify(lock));
assert.ok(lock.token > Math.max(...tokens), JSON.stringify(lock));
assert.deepEqual([kept.lock_id, kept.token, kept.monitor], [lock.lock_id, lock.token, lock.monitor]);
assert.ok(kept.expires >= lock.expires, `the keep-alive shortened the lease: ${JSON.stringify(kept)}`);
assert.equal(writtenUnderLock.result, "written", JSON.stringify(writtenUnderLock));
assert.equal(writtenUnderLock.token, lock.token, JSON.stringify(writtenUnderLock));
assert.equal(released.released, true, JSON.stringify(released));
assert.deepEqual([released.lock_id, released.token], [lock.lock_id, lock.token]);

const mine = deadLetters.filter((d) => d.id === queued.operation_id);
assert.equal(mine.length, 1, `${queued.operation_id} not listed: ${JSON.stringify(deadLetters)}`);
const letter = mine[0]!;
assert.equal(letter.reason, "not_retryable", JSON.stringify(letter));
assert.equal(letter.monitor, `${index}:missing`, JSON.stringify(letter));
const kind = letter.operation["kind"] as { id?: string } | undefined;
assert.equal(kind?.id, "missing", JSON.stringify(letter));

// The example logged each step as JSON.
const steps = log.map((line) => Object.keys(JSON.parse(line) as object)[0]);
assert.deepEqual(steps, [
  "saved",
  "accepted",
  "operation",
  "operation",
  "operation",
  "lock",
  "written_under_lock",
  "dead_letters",
]);

console.log(
  JSON.stringify({
    saved,
    operations,
    lock,
    kept,
    written_under_lock: writtenUnderLock,
    released,
    dead_letter: {
      id: letter.id,
      reason: letter.reason,
      error_kind: letter.error_kind,
      last_error: letter.last_error,
    },
  }),
);
