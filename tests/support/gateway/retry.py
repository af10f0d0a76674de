#!/usr/bin/env python3
"""elasticsearch-py's `helpers.streaming_bulk` through the zkguard gate, retrying what it may.

    python3 retry.py elasticsearch --url GATE_URL --index INDEX

Sends three partial updates of document `d` (`doc_as_upsert`, fields `a`, `b`, `c`) with
`helpers.streaming_bulk(max_retries=5, initial_backoff=0.2)`, which retries the items answered
429 (and only those), and records every `_bulk` answer the helper got. Prints one JSON line:

    {"answers": [{"retry_after": header or null, "items": [[status, error type or null], ...]}, ...],
     "results": [[ok, status, error type or null], ...]}

The helper raises nothing (`raise_on_error=False`): the test reads the results.
"""

import argparse
import json

from elasticsearch import Elasticsearch, helpers


class Recording(Elasticsearch):
    """A client that records each `_bulk` answer (the helper works on `options()` copies of
    it, which are of this class too)."""

    answers = []

    def bulk(self, *args, **kwargs):
        r = super().bulk(*args, **kwargs)
        items = []
        for item in r["items"]:
            ((_, inner),) = item.items()
            items.append([inner.get("status"), (inner.get("error") or {}).get("type")])
        Recording.answers.append({"retry_after": r.meta.headers.get("retry-after"), "items": items})
        return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("client", choices=["elasticsearch"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--index", required=True)
    args = ap.parse_args()
    es = Recording(args.url, request_timeout=60)
    actions = [
        {"_op_type": "update", "_index": args.index, "_id": "d", "doc": {k: i}, "doc_as_upsert": True}
        for i, k in enumerate(["a", "b", "c"])
    ]
    results = []
    for ok, item in helpers.streaming_bulk(
        es, actions, max_retries=5, initial_backoff=0.2, max_backoff=1, raise_on_error=False
    ):
        ((_, inner),) = item.items()
        results.append([ok, inner.get("status"), (inner.get("error") or {}).get("type")])
    print(json.dumps({"answers": Recording.answers, "results": results}))


if __name__ == "__main__":
    main()
