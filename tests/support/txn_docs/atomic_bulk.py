#!/usr/bin/env python3
"""An atomic _bulk through the zkguard gate with an official, unmodified client.

    python3 atomic_bulk.py {opensearch|elasticsearch} --url GATE_URL --index INDEX

Sends, with the header X-Zkguard-Atomic: true, one _bulk that commits (index,
create, update, delete) and one that must roll back (a create of a document
that exists, beside an index of a new one), and asserts the answers and the
documents read back through the client. Prints one JSON line on success:
{"client": NAME, "committed": [...items], "rolled_back": [...items]}.
"""

import argparse
import json
import sys

TOKEN_MIN = 2 ** 52
ATOMIC = {"X-Zkguard-Atomic": "true"}


def fail(msg):
    sys.stderr.write("atomic_bulk.py: %s\n" % msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def strip(source):
    """The source without zkguard's stamp (the `zkguard` object)."""
    source.pop("zkguard", None)
    return source


def main():
    p = argparse.ArgumentParser()
    p.add_argument("client", choices=["opensearch", "elasticsearch"])
    p.add_argument("--url", required=True)
    p.add_argument("--index", required=True)
    a = p.parse_args()
    ix = a.index
    if a.client == "opensearch":
        import opensearchpy

        c = opensearchpy.OpenSearch(a.url, timeout=30)

        def bulk(lines):
            return c.bulk(body=lines, headers=ATOMIC)

        def get(doc_id):
            try:
                return strip(c.get(index=ix, id=doc_id)["_source"])
            except opensearchpy.NotFoundError:
                return None

        def put(doc_id, source):
            c.index(index=ix, id=doc_id, body=source)
    else:
        import elasticsearch

        c = elasticsearch.Elasticsearch(a.url, request_timeout=30)

        def bulk(lines):
            return c.options(headers=ATOMIC).bulk(operations=lines).body

        def get(doc_id):
            try:
                return strip(c.get(index=ix, id=doc_id)["_source"])
            except elasticsearch.NotFoundError:
                return None

        def put(doc_id, source):
            c.index(index=ix, id=doc_id, document=source)

    put("keep", {"v": 1, "o": {"a": 1}})
    put("gone", {"v": 1})
    committed = bulk([
        {"index": {"_index": ix, "_id": "a"}}, {"v": 10},
        {"create": {"_index": ix, "_id": "b"}}, {"v": 20},
        {"update": {"_index": ix, "_id": "keep"}}, {"doc": {"o": {"b": 2}}},
        {"delete": {"_index": ix, "_id": "gone"}},
    ])
    check(committed["errors"] is False, "committed bulk has errors: %s" % committed)
    results = [list(i.values())[0] for i in committed["items"]]
    check([r["result"] for r in results] == ["created", "created", "updated", "deleted"],
          "results: %s" % results)
    for r in results[:3]:
        check(r["_version"] >= TOKEN_MIN, "a transaction's write carries its token: %s" % r)
    check(get("a") == {"v": 10} and get("b") == {"v": 20}, "a, b: %s %s" % (get("a"), get("b")))
    check(get("keep") == {"v": 1, "o": {"a": 1, "b": 2}}, "keep: %s" % get("keep"))
    check(get("gone") is None, "gone: %s" % get("gone"))

    rolled = bulk([
        {"index": {"_index": ix, "_id": "c"}}, {"v": 30},
        {"create": {"_index": ix, "_id": "a"}}, {"v": 40},
        {"update": {"_index": ix, "_id": "keep"}}, {"doc": {"v": 2}},
    ])
    check(rolled["errors"] is True, "rolled-back bulk says no errors: %s" % rolled)
    items = [list(i.values())[0] for i in rolled["items"]]
    check(all("error" in i for i in items), "every item fails with the transaction: %s" % items)
    check(items[1]["status"] == 409 and items[1]["error"]["type"] == "version_conflict_engine_exception",
          "the create that failed is a conflict: %s" % items[1])
    check(all("rolled back" in i["error"]["reason"] for i in items), "reasons: %s" % items)
    check(get("c") is None, "c was written: %s" % get("c"))
    check(get("a") == {"v": 10}, "a changed: %s" % get("a"))
    check(get("keep") == {"v": 1, "o": {"a": 1, "b": 2}}, "keep changed: %s" % get("keep"))
    print(json.dumps({"client": a.client, "committed": results, "rolled_back": items}))


if __name__ == "__main__":
    main()
