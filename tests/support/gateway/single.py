#!/usr/bin/env python3
"""Drive the gate's single-document routes with an official client, unmodified.

    python3 single.py {opensearch|elasticsearch} --url GATEWAY_URL --index INDEX

Checks that `_update`, index, create and delete through the gate take the
body fields and URL parameters Elasticsearch takes, with the same effect and
answer shape, and refuse what Elasticsearch refuses with its status and
error type. Every check runs; the failures are listed together. On success
prints one JSON line: {"checks": N}.
"""

import argparse
import json
import sys

FAILURES = []
CHECKS = [0]
CLIENT = ["opensearch"]


def show(obj):
    return json.dumps(obj, sort_keys=True, default=str)[:2000]


def check(what, ok, got):
    CHECKS[0] += 1
    if not ok:
        FAILURES.append("%s: got %s" % (what, show(got)))


def call(fn, *args, **kwargs):
    """(status, body) of a client call: the answer, or the HTTP error's."""
    if CLIENT[0] == "elasticsearch":
        import elasticsearch

        try:
            return 200, fn(*args, **kwargs).body
        except elasticsearch.ApiError as e:
            return e.meta.status, e.body
    import opensearchpy

    try:
        return 200, fn(*args, **kwargs)
    except opensearchpy.exceptions.TransportError as e:
        if not isinstance(e.status_code, int):
            raise
        return e.status_code, e.info if isinstance(e.info, dict) else {"error": e.error}


def ans(fn, *args, **kwargs):
    """The body of a client call's answer, or of its HTTP error."""
    return call(fn, *args, **kwargs)[1]


def error_is(what, answer, status, kind, says=None):
    st, body = answer
    err = body.get("error") if isinstance(body, dict) else None
    reason = err.get("reason", "") if isinstance(err, dict) else ""
    ok = st == status and isinstance(err, dict) and err.get("type") == kind
    check(what, ok and (says is None or says in reason), answer)


def scenario(es, index):
    alias = index + "-alias"
    es.indices.create(index=index, body={"aliases": {alias: {"is_write_index": True}}})
    es.index(index=index, id="d", body={"a": 1, "b": {"c": 2, "d": 3}, "e": 4}, refresh=True)

    # A: an unknown top-level field of an _update body is refused as Elasticsearch's
    # UpdateRequest parser refuses it, and nothing is written.
    error_is(
        "update with an unknown body field",
        call(es.update, index=index, id="u1", body={"dac": {"n": 1}, "upsert": {"n": 0}}),
        400, "x_content_parse_exception", "unknown field [dac]",
    )
    check("nothing upserted by a refused update", not es.exists(index=index, id="u1"), "exists")
    error_is(
        "update with an upsert and no doc",
        call(es.update, index=index, id="u2", body={"upsert": {"n": 0}}),
        400, "action_request_validation_exception", "script or doc is missing",
    )
    check("nothing upserted without doc", not es.exists(index=index, id="u2"), "exists")

    # B: the URL parameters of _update, with Elasticsearch's effect and answer shape.
    r = ans(es.update, index=index, id="d", body={"doc": {"a": 2}}, refresh="true")
    check("update refresh=true answers forced_refresh", r.get("forced_refresh") is True, r)
    r = ans(es.update, index=index, id="d", body={"doc": {"a": 3}}, params={"_source": "a,b.c"})
    check("update _source=a,b.c", r.get("get", {}).get("_source") == {"a": 3, "b": {"c": 2}}, r)
    r = ans(es.update, 
        index=index, id="d", body={"doc": {"a": 4}},
        params={"_source_includes": "b", "_source_excludes": "b.d"},
    )
    check("update _source_includes/_source_excludes", r.get("get", {}).get("_source") == {"b": {"c": 2}}, r)
    r = ans(es.update, index=index, id="d", body={"doc": {"a": 5}, "_source": ["e"]})
    check("update body _source", r.get("get", {}).get("_source") == {"e": 4}, r)
    r = ans(es.update, index=index, id="d", body={"doc": {"a": 5}}, params={"_source": "a"})
    check("noop update _source=a", r.get("result") == "noop" and r.get("get", {}).get("_source") == {"a": 5}, r)
    r = ans(es.update, index=index, id="d", body={"doc": {"a": 6}}, params={"_source": "false"})
    check("update _source=false has no get", "get" not in r and r.get("result") == "updated", r)
    r = ans(es.update, index=index, id="d", body={"doc": {"a": 7}}, params={"filter_path": "result,_version"})
    check("update filter_path", sorted(r) == ["_version", "result"], r)
    error_is(
        "update with a parameter Elasticsearch does not know",
        call(es.update, index=index, id="d", body={"doc": {"a": 8}}, params={"foo": "1"}),
        400, "illegal_argument_exception", "unrecognized parameter: [foo]",
    )
    error_is(
        "update with pipeline (an index parameter)",
        call(es.update, index=index, id="d", body={"doc": {"a": 8}}, params={"pipeline": "p"}),
        400, "illegal_argument_exception", "unrecognized parameter: [pipeline]",
    )
    check("refused updates wrote nothing", es.get(index=index, id="d")["_source"]["a"] == 7, "a changed")

    # require_alias, as Elasticsearch: through the alias it writes, on the index it is 404.
    r = ans(es.update, index=alias, id="d", body={"doc": {"r": 1}}, require_alias=True)
    check("update require_alias through the alias", r.get("result") == "updated", r)
    st, r = call(es.index, index=alias, id="n", body={"r": 1}, require_alias=True)
    check("index require_alias through the alias", st == 200 and r.get("result") == "created", r)
    error_is(
        "update require_alias on the index",
        call(es.update, index=index, id="d", body={"doc": {"r": 2}}, require_alias=True),
        404, "index_not_found_exception", "[require_alias] request flag is [true]",
    )
    error_is(
        "index require_alias on the index",
        call(es.index, index=index, id="d", body={"r": 2}, require_alias=True),
        404, "index_not_found_exception", "is not an alias",
    )

    error_is(
        "index require_data_stream on an index",
        call(es.index, index=index, id="d", body={"r": 2}, params={"require_data_stream": "true"}),
        404, "resource_not_found_exception", "is not a data stream",
    )

    # Index and delete answers honour filter_path and refresh.
    r = ans(es.index, index=index, id="f", body={"x": 1}, refresh="true", params={"filter_path": "result,forced_refresh"})
    check("index filter_path and refresh", r == {"result": "created", "forced_refresh": True}, r)
    r = ans(es.delete, index=index, id="f", params={"filter_path": "result"})
    check("delete filter_path", r == {"result": "deleted"}, r)

    # C: the errors of Elasticsearch.
    error_is(
        "update if_seq_no on a missing document",
        call(es.update, index=index, id="missing", body={"doc": {"a": 1}}, if_seq_no=5, if_primary_term=1),
        404, "document_missing_exception",
    )
    error_is(
        "create with if_seq_no",
        call(es.create, index=index, id="c1", body={"a": 1}, params={"if_seq_no": "5", "if_primary_term": "1"}),
        400, "action_request_validation_exception", "create operations do not support compare and set",
    )
    check("nothing created by a refused create", not es.exists(index=index, id="c1"), "exists")


def scenario_elasticsearch(es, index):
    """The same through elasticsearch-py 8, with its own keyword arguments."""
    alias = index + "-alias"
    es.indices.create(index=index, aliases={alias: {"is_write_index": True}})
    es.index(index=index, id="d", document={"a": 1, "b": {"c": 2, "d": 3}, "e": 4}, refresh=True)
    error_is(
        "update with an unknown body field",
        call(es.update, index=index, id="u1", body={"dac": {"n": 1}, "upsert": {"n": 0}}),
        400, "x_content_parse_exception", "unknown field [dac]",
    )
    check("nothing upserted by a refused update", not es.exists(index=index, id="u1"), "exists")
    _, r = call(es.update, index=index, id="d", doc={"a": 2}, refresh=True)
    check("update refresh=true answers forced_refresh", r.get("forced_refresh") is True, r)
    _, r = call(es.update, index=index, id="d", doc={"a": 3}, source_includes=["b"], source_excludes=["b.d"])
    check("update source_includes/source_excludes", r.get("get", {}).get("_source") == {"b": {"c": 2}}, r)
    _, r = call(es.update, index=index, id="d", doc={"a": 4}, source=["a", "e"])
    check("update source (the body's _source)", r.get("get", {}).get("_source") == {"a": 4, "e": 4}, r)
    _, r = call(es.update, index=alias, id="d", doc={"r": 1}, require_alias=True)
    check("update require_alias through the alias", r.get("result") == "updated", r)
    error_is(
        "update require_alias on the index",
        call(es.update, index=index, id="d", doc={"r": 2}, require_alias=True),
        404, "index_not_found_exception", "is not an alias",
    )
    _, r = call(es.index, index=index, id="f", document={"x": 1}, filter_path="result")
    check("index filter_path", r == {"result": "created"}, r)
    error_is(
        "update if_seq_no on a missing document",
        call(es.update, index=index, id="missing", doc={"a": 1}, if_seq_no=5, if_primary_term=1),
        404, "document_missing_exception",
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("client", choices=["opensearch", "elasticsearch"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--index", required=True)
    args = ap.parse_args()
    CLIENT[0] = args.client
    if args.client == "elasticsearch":
        import elasticsearch

        es = elasticsearch.Elasticsearch(args.url, request_timeout=60, max_retries=0)
        scenario_elasticsearch(es, args.index)
    else:
        import opensearchpy

        es = opensearchpy.OpenSearch([args.url], timeout=60, max_retries=0)
        scenario(es, args.index)
    if FAILURES:
        print("single.py: %d of %d checks failed:" % (len(FAILURES), CHECKS[0]))
        for f in FAILURES:
            print("  - " + f)
        sys.exit(1)
    print(json.dumps({"checks": CHECKS[0]}))


if __name__ == "__main__":
    main()
