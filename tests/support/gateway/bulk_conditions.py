#!/usr/bin/env python3
"""Write conditions in `_bulk` action lines, through the zkguard gate, with opensearch-py.

    python3 bulk_conditions.py opensearch --url GATE_URL --index INDEX

Writes document `d` twice (its first `_seq_no` is then stale), then sends with the client's
own `bulk` API, once as a plain `_bulk` and once as an atomic one (`X-Zkguard-Atomic: true`):

- `if_seq_no`/`if_primary_term` as JSON strings naming the stale write,
- `if_seq_no` without `if_primary_term`,
- `op_type: create` inside an `index` action.

Prints one JSON line: {"plain": [answer, ...], "atomic": [...], "final": source of d}, each
answer {"status": HTTP status, "type": error.type} for a request refused whole, or
{"status": 200, "items": [[action, status, error.type or null], ...]}.
"""

import argparse
import json
import sys

ATOMIC = {"X-Zkguard-Atomic": "true"}


def answer(client, lines, headers):
    import opensearchpy

    try:
        r = client.bulk(body=lines, headers=headers)
    except opensearchpy.exceptions.TransportError as e:
        info = e.info if isinstance(e.info, dict) else {}
        return {"status": e.status_code, "type": (info.get("error") or {}).get("type")}
    items = []
    for item in r["items"]:
        (action, inner), = item.items()
        items.append([action, inner.get("status"), (inner.get("error") or {}).get("type")])
    return {"status": 200, "items": items}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("client", choices=["opensearch"])
    p.add_argument("--url", required=True)
    p.add_argument("--index", required=True)
    a = p.parse_args()
    import opensearchpy

    c = opensearchpy.OpenSearch([a.url], timeout=60, max_retries=0)
    first = c.index(index=a.index, id="d", body={"v": 1})
    c.index(index=a.index, id="d", body={"v": 2})
    stale_seq, term = str(first["_seq_no"]), str(first["_primary_term"])
    out = {}
    for mode, headers in (("plain", {}), ("atomic", ATOMIC)):
        out[mode] = [
            answer(c, [{"index": {"_index": a.index, "_id": "d", "if_seq_no": stale_seq,
                                  "if_primary_term": term}}, {"v": 10 + len(mode)}], headers),
            answer(c, [{"index": {"_index": a.index, "_id": "d", "if_seq_no": int(stale_seq)}},
                       {"v": 20 + len(mode)}], headers),
            answer(c, [{"index": {"_index": a.index, "_id": "d", "op_type": "create"}},
                       {"v": 30 + len(mode)}], headers),
        ]
    out["final"] = c.get(index=a.index, id="d")["_source"]
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
