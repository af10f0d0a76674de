#!/usr/bin/env python3
"""Drive the zkguard Elasticsearch gateway with an official, unmodified client.

    python3 clients.py {opensearch|elasticsearch} --url GATEWAY_URL --index INDEX
        [--bulk N] [--expect-gateway | --no-expect-gateway]

Runs one scenario (document writes, partial updates, upserts, optimistic
concurrency, bulk helpers, refusals) through opensearch-py or
elasticsearch-py 8 and asserts every answer. On success prints one JSON line:

    {"client": NAME, "versions": {id: stored _version},
     "responses": {id: _version of the last successful write response}}

With --expect-gateway (the default) the zkguard-specific assertions are made
too: every write answers a fencing token (_version >= 2**52) and scripted
updates, client versioning and _update_by_query are refused with 400.
--no-expect-gateway runs the rest against a plain backend (osmem-server);
the refusal calls then go to a scratch index and their answers are only
reported on stderr.
"""

import argparse
import json
import sys

TOKEN_MIN = 2 ** 52
MGET_CHUNK = 500
BULK_CHUNK = 500
DELETED_BULK_IDS = 10


def log(msg):
    sys.stderr.write("clients.py: %s\n" % msg)
    sys.stderr.flush()


def show(obj):
    try:
        return json.dumps(obj, sort_keys=True, default=str)[:4000]
    except Exception:
        return repr(obj)[:4000]


class ApiErr(Exception):
    """A client library's HTTP error, normalized across both libraries."""

    def __init__(self, kind, status, body, orig):
        self.kind = kind  # "conflict" | "notfound" | "badrequest" | "other"
        self.status = status
        self.body = body
        self.orig = orig
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            self.type = err.get("type")
            self.reason = err.get("reason")
        else:
            self.type = None
            self.reason = err if isinstance(err, str) else None
        super().__init__(
            "%s (%s) status=%s type=%s body=%s"
            % (type(orig).__name__, kind, status, self.type, show(body))
        )


# ----------------------------------------------------------------------------
# Adapters: the scenario below is written once against this small interface.
# Every method returns plain dicts and raises ApiErr on HTTP errors.
# ----------------------------------------------------------------------------


class OpenSearchApi:
    name = "opensearch"

    def __init__(self, url, index):
        import opensearchpy
        from opensearchpy import helpers

        self.lib = opensearchpy
        self.helpers = helpers
        self.index_name = index
        self.client = opensearchpy.OpenSearch(
            [url],
            timeout=60,
            sniff_on_start=False,
            sniff_on_connection_fail=False,
            max_retries=3,
        )

    def _call(self, fn, *args, **kwargs):
        exc = self.lib.exceptions
        try:
            return fn(*args, **kwargs)
        except exc.ConnectionError:
            raise
        except exc.TransportError as e:
            if isinstance(e, exc.ConflictError):
                kind = "conflict"
            elif isinstance(e, exc.NotFoundError):
                kind = "notfound"
            elif isinstance(e, exc.RequestError):
                kind = "badrequest"
            else:
                kind = "other"
            body = e.info if isinstance(e.info, (dict, str)) else {"error": e.error}
            raise ApiErr(kind, e.status_code, body, e) from e

    # Indices ----------------------------------------------------------------
    def create_index(self, index, mappings):
        return self._call(self.client.indices.create, index=index, body={"mappings": mappings})

    def index_exists(self, index):
        return bool(self._call(self.client.indices.exists, index=index))

    def refresh(self, index):
        return self._call(self.client.indices.refresh, index=index)

    # Documents ----------------------------------------------------------------
    def index(self, index, id, doc, **params):
        return self._call(self.client.index, index=index, id=id, body=doc, **params), None

    def create(self, index, id, doc):
        return self._call(self.client.create, index=index, id=id, body=doc), None

    def update(self, index, id, doc=None, doc_as_upsert=None, upsert=None, script=None, **params):
        body = {}
        if doc is not None:
            body["doc"] = doc
        if doc_as_upsert is not None:
            body["doc_as_upsert"] = doc_as_upsert
        if upsert is not None:
            body["upsert"] = upsert
        if script is not None:
            body["script"] = script
        return self._call(self.client.update, index=index, id=id, body=body, **params), None

    def delete(self, index, id):
        return self._call(self.client.delete, index=index, id=id), None

    def get(self, index, id):
        return self._call(self.client.get, index=index, id=id)

    def mget(self, index, ids):
        return self._call(self.client.mget, index=index, body={"ids": list(ids)})["docs"]

    def search(self, index, query, size=0, version=False):
        body = {"query": query, "size": size, "track_total_hits": True}
        if version:
            body["version"] = True
        return self._call(self.client.search, index=index, body=body)

    def update_by_query(self, index, query):
        return self._call(self.client.update_by_query, index=index, body={"query": query})

    # Helpers ------------------------------------------------------------------
    def bulk(self, actions, **kw):
        return self._call(self.helpers.bulk, self.client, actions, **kw)

    def streaming_bulk(self, actions, **kw):
        return self._call(lambda: list(self.helpers.streaming_bulk(self.client, actions, **kw)))


class ElasticsearchApi:
    name = "elasticsearch"

    def __init__(self, url, index):
        import elasticsearch
        from elasticsearch import helpers

        self.lib = elasticsearch
        self.helpers = helpers
        self.index_name = index
        self.client = elasticsearch.Elasticsearch(
            url,
            request_timeout=60,
            max_retries=3,
            sniff_on_start=False,
            sniff_before_requests=False,
            sniff_on_node_failure=False,
        )

    def _call(self, fn, *args, **kwargs):
        es = self.lib
        try:
            return fn(*args, **kwargs)
        except es.ApiError as e:
            if isinstance(e, es.ConflictError):
                kind = "conflict"
            elif isinstance(e, es.NotFoundError):
                kind = "notfound"
            elif isinstance(e, es.BadRequestError):
                kind = "badrequest"
            else:
                kind = "other"
            raise ApiErr(kind, e.meta.status, e.body, e) from e

    @staticmethod
    def _plain(resp):
        return resp.body if hasattr(resp, "body") else resp

    # Indices ----------------------------------------------------------------
    def create_index(self, index, mappings):
        return self._plain(self._call(self.client.indices.create, index=index, mappings=mappings))

    def index_exists(self, index):
        return bool(self._call(self.client.indices.exists, index=index))

    def refresh(self, index):
        return self._plain(self._call(self.client.indices.refresh, index=index))

    # Documents ----------------------------------------------------------------
    def index(self, index, id, doc, **params):
        r = self._call(self.client.index, index=index, id=id, document=doc, **params)
        return self._plain(r), r.meta.status

    def create(self, index, id, doc):
        r = self._call(self.client.create, index=index, id=id, document=doc)
        return self._plain(r), r.meta.status

    def update(self, index, id, doc=None, doc_as_upsert=None, upsert=None, script=None, **params):
        kw = dict(params)
        if doc is not None:
            kw["doc"] = doc
        if doc_as_upsert is not None:
            kw["doc_as_upsert"] = doc_as_upsert
        if upsert is not None:
            kw["upsert"] = upsert
        if script is not None:
            kw["script"] = script
        r = self._call(self.client.update, index=index, id=id, **kw)
        return self._plain(r), r.meta.status

    def delete(self, index, id):
        r = self._call(self.client.delete, index=index, id=id)
        return self._plain(r), r.meta.status

    def get(self, index, id):
        return self._plain(self._call(self.client.get, index=index, id=id))

    def mget(self, index, ids):
        return self._plain(self._call(self.client.mget, index=index, ids=list(ids)))["docs"]

    def search(self, index, query, size=0, version=False):
        kw = {"query": query, "size": size, "track_total_hits": True}
        if version:
            kw["version"] = True
        return self._plain(self._call(self.client.search, index=index, **kw))

    def update_by_query(self, index, query):
        return self._plain(self._call(self.client.update_by_query, index=index, query=query))

    # Helpers ------------------------------------------------------------------
    def bulk(self, actions, **kw):
        return self._call(self.helpers.bulk, self.client, actions, **kw)

    def streaming_bulk(self, actions, **kw):
        return self._call(lambda: list(self.helpers.streaming_bulk(self.client, actions, **kw)))


# ----------------------------------------------------------------------------
# Scenario
# ----------------------------------------------------------------------------


def expect_error(kind, status, fn, *args, **kwargs):
    try:
        resp = fn(*args, **kwargs)
    except ApiErr as e:
        assert e.kind == kind and e.status == status, "expected %s/%d, got %s" % (kind, status, e)
        return e
    raise AssertionError("expected %s/%d, the call succeeded: %s" % (kind, status, show(resp)))


class Scenario:
    def __init__(self, api, index, bulk_n, expect_gateway):
        self.api = api
        self.idx = index
        self.n = bulk_n
        self.gw = expect_gateway
        self.responses = {}  # id -> _version of the last successful write response

    # bookkeeping --------------------------------------------------------------
    def wrote(self, id, resp, result, status=None, http_status=None):
        assert resp.get("_id") == id, "write of %r answered another id: %s" % (id, show(resp))
        assert resp.get("result") == result, "write of %r: expected result %r: %s" % (id, result, show(resp))
        if http_status is not None and status is not None:
            assert status == http_status, "write of %r: expected HTTP %d, got %s: %s" % (id, http_status, status, show(resp))
        v = resp.get("_version")
        assert isinstance(v, int), "write of %r: no integer _version: %s" % (id, show(resp))
        if self.gw:
            assert v >= TOKEN_MIN, "write of %r: _version %d is not a zkguard token (>= 2**52): %s" % (id, v, show(resp))
        if result == "deleted":
            self.responses.pop(id, None)
        else:
            self.responses[id] = v
        return v

    def get_doc(self, id):
        doc = self.api.get(self.idx, id)
        assert doc.get("found") is True, "get %r: %s" % (id, show(doc))
        if self.gw:
            assert doc["_version"] >= TOKEN_MIN, "get %r: stored _version is not a token: %s" % (id, show(doc))
        return doc

    def assert_unchanged(self, id, before, what):
        after = self.get_doc(id)
        assert after["_version"] == before["_version"] and after["_source"] == before["_source"], (
            "%s changed %r: before %s after %s" % (what, id, show(before), show(after))
        )

    # steps --------------------------------------------------------------------
    def run(self):
        api, idx = self.api, self.idx
        mappings = {
            "properties": {
                "title": {"type": "keyword"},
                "n": {"type": "long"},
                "m": {"type": "long"},
                "tags": {"type": "keyword"},
                "nested": {"type": "object", "properties": {"a": {"type": "long"}, "b": {"type": "long"}}},
            }
        }
        r = api.create_index(idx, mappings)
        assert r.get("acknowledged") is True, "create index: %s" % show(r)
        assert api.index_exists(idx), "HEAD /%s: index does not exist after creation" % idx
        log("index %s created" % idx)

        # index: created, then updated with a strictly greater version.
        r, st = api.index(idx, "a", {"title": "first", "n": 1, "tags": ["x"], "nested": {"a": 1, "b": 2}})
        v1 = self.wrote("a", r, "created", st, 201)
        r, st = api.index(idx, "a", {"title": "first", "n": 2, "tags": ["x"], "nested": {"a": 1, "b": 2}})
        v2 = self.wrote("a", r, "updated", st, 200)
        assert v2 > v1, "re-index of a: _version %d not greater than %d" % (v2, v1)

        # create: 201, then 409 version_conflict_engine_exception.
        r, st = api.create(idx, "c", {"title": "c", "n": 100})
        self.wrote("c", r, "created", st, 201)
        before_c = self.get_doc("c")
        e = expect_error("conflict", 409, api.create, idx, "c", {"title": "c2", "n": 101})
        assert e.type == "version_conflict_engine_exception", "create of an existing id: %s" % e
        self.assert_unchanged("c", before_c, "refused create")

        # partial update with a recursive object merge.
        r, st = api.update(idx, "a", doc={"n": 3, "nested": {"a": 5}})
        v3 = self.wrote("a", r, "updated", st, 200)
        assert v3 > v2, "partial update of a: _version %d not greater than %d" % (v3, v2)
        doc = self.get_doc("a")
        src = doc["_source"]
        assert src.get("n") == 3, "partial update not applied: %s" % show(doc)
        assert src.get("nested") == {"a": 5, "b": 2}, "partial doc not merged recursively: %s" % show(doc)
        assert src.get("title") == "first" and src.get("tags") == ["x"], "partial update lost fields: %s" % show(doc)
        assert doc["_version"] == v3, "stored _version %s != update response %d" % (doc["_version"], v3)

        # the same partial update is a noop (detect_noop defaults to true).
        r, st = api.update(idx, "a", doc={"n": 3, "nested": {"a": 5}})
        v = self.wrote("a", r, "noop", st, 200)
        assert v == v3, "noop update changed _version %d -> %d: %s" % (v3, v, show(r))
        assert self.get_doc("a")["_version"] == v3, "noop update changed the stored _version"

        # doc_as_upsert on a new id.
        r, st = api.update(idx, "u", doc={"n": 7}, doc_as_upsert=True)
        self.wrote("u", r, "created", st, 201)
        doc = self.get_doc("u")
        assert doc["_source"] == {"n": 7}, "doc_as_upsert: %s" % show(doc)

        # upsert on a new id: the upsert document is indexed, not the doc.
        r, st = api.update(idx, "v", doc={"n": 1, "title": "from-doc"}, upsert={"n": 9})
        self.wrote("v", r, "created", st, 201)
        doc = self.get_doc("v")
        assert doc["_source"] == {"n": 9}, "upsert: %s" % show(doc)

        # partial update of a missing document: 404 document_missing_exception.
        e = expect_error("notfound", 404, api.update, idx, "missing", doc={"n": 1})
        assert e.type == "document_missing_exception", "update of a missing id: %s" % e
        expect_error("notfound", 404, api.get, idx, "missing")

        # update with if_seq_no/if_primary_term: current -> ok, stale -> 409.
        doc = self.get_doc("a")
        seq, term = doc["_seq_no"], doc["_primary_term"]
        r, st = api.update(idx, "a", doc={"n": 4}, if_seq_no=seq, if_primary_term=term)
        v4 = self.wrote("a", r, "updated", st, 200)
        assert v4 > v3, "conditional update: _version %d not greater than %d" % (v4, v3)
        before = self.get_doc("a")
        assert before["_source"]["n"] == 4, "conditional update not applied: %s" % show(before)
        e = expect_error("conflict", 409, api.update, idx, "a", doc={"n": 4}, if_seq_no=seq, if_primary_term=term)
        assert e.type == "version_conflict_engine_exception", "stale conditional update: %s" % e
        self.assert_unchanged("a", before, "stale conditional update")

        # index with if_seq_no/if_primary_term: current -> ok, stale -> 409.
        seq, term = before["_seq_no"], before["_primary_term"]
        full = {"title": "first", "n": 5, "tags": ["x", "y"], "nested": {"a": 5, "b": 2}}
        r, st = api.index(idx, "a", full, if_seq_no=seq, if_primary_term=term)
        v5 = self.wrote("a", r, "updated", st, 200)
        assert v5 > v4, "conditional index: _version %d not greater than %d" % (v5, v4)
        before = self.get_doc("a")
        assert before["_source"] == full, "conditional index not applied: %s" % show(before)
        e = expect_error("conflict", 409, api.index, idx, "a", dict(full, n=6), if_seq_no=seq, if_primary_term=term)
        assert e.type == "version_conflict_engine_exception", "stale conditional index: %s" % e
        self.assert_unchanged("a", before, "stale conditional index")

        # delete.
        r, st = api.delete(idx, "c")
        self.wrote("c", r, "deleted", st, 200)
        expect_error("notfound", 404, api.get, idx, "c")
        log("single-document steps passed")

        self.bulk_steps()

        # search passes through.
        api.refresh(idx)
        res = api.search(idx, {"range": {"m": {"gte": DELETED_BULK_IDS}}})
        total = res["hits"]["total"]
        total = total["value"] if isinstance(total, dict) else total
        assert total == self.n - DELETED_BULK_IDS, "search m >= %d: expected %d hits: %s" % (
            DELETED_BULK_IDS, self.n - DELETED_BULK_IDS, show(res))
        res = api.search(idx, {"range": {"n": {"gte": 0, "lt": self.n}}}, size=0)
        total = res["hits"]["total"]
        total = total["value"] if isinstance(total, dict) else total
        # bulk docs b10.. (n = 10..N-1) plus a (n=5), u (n=7), v (n=9).
        expected = self.n - DELETED_BULK_IDS + sum(1 for k in (5, 7, 9) if k < self.n)
        assert total == expected, "search 0 <= n < %d: expected %d hits: %s" % (self.n, expected, show(res))
        res = api.search(idx, {"ids": {"values": ["a"]}}, size=1, version=True)
        hits = res["hits"]["hits"]
        assert len(hits) == 1 and hits[0].get("_version") == self.responses["a"], "search version=true for a: %s" % show(res)
        log("search passed")

        self.refusals()

        versions = self.read_back()
        assert set(versions) == set(self.responses), "ids read back differ from ids written: %s" % (
            sorted(set(versions) ^ set(self.responses))[:50])
        diff = {k: (versions[k], self.responses[k]) for k in versions if versions[k] != self.responses[k]}
        assert not diff, "stored _version differs from the last write response (stored, response): %s" % show(
            dict(list(diff.items())[:50]))
        return {"client": self.api.name, "versions": versions, "responses": self.responses}

    def bulk_steps(self):
        api, idx, n = self.api, self.idx, self.n
        ids = ["b%d" % i for i in range(n)]
        index_actions = (
            {"_op_type": "index", "_index": idx, "_id": ids[i], "_source": {"n": i}} for i in range(n)
        )
        res = api.bulk(index_actions, chunk_size=BULK_CHUNK)
        assert tuple(res) == (n, []), "helpers.bulk of %d index actions: %s" % (n, show(res))

        def update_then_delete():
            for i in range(n):
                yield {"_op_type": "update", "_index": idx, "_id": ids[i], "doc": {"m": i}}
            for i in range(min(DELETED_BULK_IDS, n)):
                yield {"_op_type": "delete", "_index": idx, "_id": ids[i]}

        items = api.streaming_bulk(update_then_delete(), chunk_size=BULK_CHUNK, raise_on_error=False)
        assert len(items) == n + min(DELETED_BULK_IDS, n), "streaming_bulk yielded %d items" % len(items)
        failed = [item for ok, item in items if not ok]
        assert not failed, "streaming_bulk: %d items failed, first: %s" % (len(failed), show(failed[:3]))
        updated, deleted = {}, {}
        for ok, item in items:
            (op, info), = item.items()
            v = info.get("_version")
            assert isinstance(v, int), "bulk item without _version: %s" % show(item)
            if self.gw:
                assert v >= TOKEN_MIN, "bulk item _version is not a token: %s" % show(item)
            if op == "update":
                assert info.get("result") == "updated", "bulk update item: %s" % show(item)
                updated[info["_id"]] = v
            elif op == "delete":
                assert info.get("result") == "deleted", "bulk delete item: %s" % show(item)
                deleted[info["_id"]] = v
            else:
                raise AssertionError("unexpected bulk item: %s" % show(item))
        assert sorted(updated) == sorted(ids), "bulk update items do not cover every id"
        assert sorted(deleted) == sorted(ids[:DELETED_BULK_IDS]), "bulk delete items: %s" % sorted(deleted)
        for id_, v in deleted.items():
            assert v > updated[id_], "bulk delete of %s: _version %d not greater than its update %d" % (id_, v, updated[id_])
        for id_, v in updated.items():
            if id_ not in deleted:
                self.responses[id_] = v
        # The deleted ids are gone, the others hold both fields.
        for id_ in ids[:DELETED_BULK_IDS]:
            expect_error("notfound", 404, api.get, idx, id_)
        for i in (DELETED_BULK_IDS, n // 2, n - 1):
            if i < DELETED_BULK_IDS or i >= n:
                continue
            doc = self.get_doc(ids[i])
            assert doc["_source"] == {"n": i, "m": i}, "bulk doc %s: %s" % (ids[i], show(doc))
        log("bulk passed (%d index, %d update, %d delete)" % (n, n, len(deleted)))

    def refusals(self):
        api = self.api
        if self.gw:
            target_idx, target_id = self.idx, "a"
        else:
            # Plain backend: nothing is refused there, so probe a scratch index
            # and keep the main index's versions intact.
            target_idx, target_id = self.idx + "-probe", "p"
            api.index(target_idx, target_id, {"n": 1})
        before = api.get(target_idx, target_id)

        probes = [
            ("scripted update", "script",
             lambda: api.update(target_idx, target_id,
                                script={"source": "ctx._source.n += 1", "lang": "painless"})),
            ("update_by_query", None,
             lambda: api.update_by_query(target_idx, {"match_all": {}})),
            ("client-supplied version", None,
             lambda: api.index(target_idx, target_id, {"n": 42}, version=5, version_type="external")),
        ]
        for what, reason_word, call in probes:
            try:
                resp = call()
            except ApiErr as e:
                outcome = e
            else:
                outcome = None
                if isinstance(resp, tuple):
                    resp = resp[0]
            if self.gw:
                assert outcome is not None, "%s was not refused: %s" % (what, show(resp))
                e = outcome
                assert e.kind == "badrequest" and e.status == 400, "%s: expected 400, got %s" % (what, e)
                assert (isinstance(e.body, dict) and e.body.get("status") == 400
                        and isinstance(e.type, str) and isinstance(e.reason, str)), (
                    "%s: refusal is not Elasticsearch-shaped: %s" % (what, e))
                if reason_word:
                    assert reason_word in (e.reason or "").lower(), "%s: reason does not mention %r: %s" % (
                        what, reason_word, e)
                self.assert_unchanged(target_id, before, what)
            else:
                if outcome is None:
                    log("plain backend accepted %s: %s" % (what, show(resp)[:300]))
                else:
                    log("plain backend answered %s with %s" % (what, str(outcome)[:300]))
        if self.gw:
            log("refusals passed")

    def read_back(self):
        api = self.api
        want = sorted(self.responses)
        versions = {}
        for start in range(0, len(want), MGET_CHUNK):
            chunk = want[start:start + MGET_CHUNK]
            docs = api.mget(self.idx, chunk)
            assert len(docs) == len(chunk), "mget of %d ids answered %d docs" % (len(chunk), len(docs))
            for d in docs:
                assert d.get("found") is True, "mget: %s not found: %s" % (d.get("_id"), show(d))
                versions[d["_id"]] = d["_version"]
        # Deleted ids stay deleted.
        gone = ["c"] + ["b%d" % i for i in range(min(DELETED_BULK_IDS, self.n))]
        for d in api.mget(self.idx, gone):
            assert d.get("found") is False, "mget: deleted id %s found: %s" % (d.get("_id"), show(d))
        return versions


def main():
    ap = argparse.ArgumentParser(description="zkguard gateway scenario with an official client")
    ap.add_argument("client", choices=["opensearch", "elasticsearch"])
    ap.add_argument("--url", required=True, help="gateway URL")
    ap.add_argument("--index", required=True, help="index to create and write (must not exist)")
    ap.add_argument("--bulk", type=int, default=3000, help="number of bulk documents (default 3000)")
    ap.add_argument("--expect-gateway", action=argparse.BooleanOptionalAction, default=True,
                    help="make the zkguard-specific assertions (default on)")
    args = ap.parse_args()
    if args.bulk < DELETED_BULK_IDS + 1:
        ap.error("--bulk must be at least %d" % (DELETED_BULK_IDS + 1))

    api_class = OpenSearchApi if args.client == "opensearch" else ElasticsearchApi
    api = api_class(args.url, args.index)
    result = Scenario(api, args.index, args.bulk, args.expect_gateway).run()
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
