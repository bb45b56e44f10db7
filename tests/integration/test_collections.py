#!/usr/bin/python3
"""Collections and the document store on a real PostgreSQL (issue 5, PROTOCOL.md section 6b).

One PostgreSQL per module (pgfix.PgServer: initdb + pg_ctl on a free loopback
port, or a fresh database on SB_TEST_PG_URL), the posts table of the issue plus
deploy/sql/document_store.sql, and one broker (2 workers) whose target "app"
declares both. Every test works under its own tenant id, so tests never see
each other's rows.

Covered: every type round-trips in JSON and msgpack; find paging and clamps;
the where operators; injection attempts through where keys and values, sort,
select, collection and store names (exact errors, literal matches, tables
intact); tenant isolation whatever the where; the document store through
store.<ns>.* and collections.document_store.* (namespace clamp and grants);
concurrent creates and updates, including compare-and-set updates of one row;
constraint and value errors; the result cap (and that a write answered as
failed changed nothing); undeclared collections, unwired targets, targets
sharing a table, column allowlists; --check-config against the database;
PostgreSQL stopped, restarted, killed under statements in flight, down when
the broker starts, and a statement stuck on a lock past the statement timeout.

Runs against build/bin (SB_BIN_DIR for another build, e.g. build-asan/bin) in
about 15 s; every test makes fewer than 1,000 calls per run id (per-run quotas).
"""

import base64
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pgfix  # noqa: E402
import sbtest  # noqa: E402
from sbtest import poll  # noqa: E402

ENCODINGS = ("json", "msgpack")

POSTS_DDL = """
CREATE TABLE posts (
    id        bigserial PRIMARY KEY,
    tenant_id text NOT NULL,
    title     text,
    views     int,
    score     float8,
    price     numeric,
    published boolean,
    meta      jsonb,
    blob      bytea,
    created   timestamptz DEFAULT now(),
    uid       uuid
);
CREATE TABLE items (id bigserial PRIMARY KEY, tenant_id text NOT NULL, name text);
"""
POST_FIELDS = ["id", "tenant_id", "title", "views", "score", "price", "published", "meta", "blob", "created", "uid"]
DOC_FIELDS = ["id", "tenant_id", "store", "key", "data", "created_at", "updated_at"]

ALL_VERBS = ["read", "create", "update", "delete"]
CAPS = {
    "data": {
        "collections": {"posts": ALL_VERBS, "comments": ALL_VERBS, "Posts": ALL_VERBS},
        "stores": {"notes": ["read", "write"], "ro": ["read"], "wo": ["write"]},
        "globals": {"site": ["read"]},
    },
    "services": ["svc"],
}

MSG_EXEC = "sandbox binding operation failed"
MSG_DB_DOWN = "the database is unavailable"
MSG_NS = "document_store namespace is missing or invalid"
ISO_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z$")

PG = None
BROKER = None
CONFIG = None


def app_config(url, posts_extra=None, ds_table="document_store"):
    posts = {"table": "posts", "key": "id", "max_limit": 50, "scope": {"tenant_id": "tenantId"}}
    posts.update(posts_extra or {})
    return {
        "database_url": url,
        "targets": {
            "app": {
                "collections": {"posts": posts},
                "document_store": {"table": ds_table, "scope": {"tenant_id": "tenantId"}},
                "globals": {"site": {"value": {"name": "Demo"}}},
            },
            # a target with collections but no document store
            "bare": {"collections": {"items": {"table": "items", "key": "id", "scope": {"tenant_id": "tenantId"}}}},
        },
    }


def ready(broker):
    return broker.public("GET", "/readyz").status == 200


@contextlib.contextmanager
def running_broker(config, threads=2):
    """start_broker() for a with block (sbtest.Broker's own __enter__ would start a second process)."""
    b = start_broker(config, threads)
    try:
        yield b
    finally:
        shutdown(b)


def shutdown(b):
    """SIGTERM and wait (sbtest's stop() also removes the config directory; kill() would leave it behind)."""
    try:
        b.stop(timeout=15)
    except AssertionError:
        pass  # stop() killed it after the timeout


def start_broker(config, threads=2):
    """A broker whose every worker has introspected the schema (/readyz answers for one worker only)."""
    b = sbtest.Broker(config=config, env={"SANDBOX_BROKER_THREADS": str(threads)}).start()
    if not poll(lambda: sum(1 for ev in b.events() if ev.get("event") == "pg.ready") >= threads and ready(b), 15):
        shutdown(b)
        raise AssertionError("broker not ready:\n" + b.log()[-3000:])
    return b


def load_schema(pg):
    pg.sql(POSTS_DDL)
    pg.sql_file(os.path.join(sbtest.SOURCE_DIR, "deploy", "sql", "document_store.sql"))


def setUpModule():
    global PG, BROKER, CONFIG
    PG = pgfix.PgServer().start()
    try:
        load_schema(PG)
        CONFIG = app_config(PG.url)
        BROKER = start_broker(CONFIG)
    except Exception:
        if BROKER is not None:
            shutdown(BROKER)
        PG.close()
        raise


def tearDownModule():
    if BROKER is not None:
        shutdown(BROKER)
    if PG is not None:
        PG.close()


def new_tenant(prefix="t"):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:10])


def mint(tenant, caps=CAPS, target="app", broker=None, scope=None):
    """A token of its own run (quotas are per run) bound to `tenant`."""
    b = broker or BROKER
    return b.mint_ok("run-" + uuid.uuid4().hex[:16], caps, target=target,
                     scope=scope if scope is not None else {"tenantId": tenant})


def rows_of(tenant, pg=None):
    return int((pg or PG).scalar("SELECT count(*) FROM posts WHERE tenant_id = '%s'" % tenant.replace("'", "''")))


class Base(sbtest.BrokerTestCase):
    broker = None

    def b(self):
        return self.broker or BROKER

    def call(self, tok, method, args, enc="json"):
        return self.b().rpc(tok, method, args, enc=enc, timeout=30)

    def ok(self, tok, method, args, enc="json"):
        r = self.call(tok, method, args, enc)
        self.assertEqual(r.status, 200, r)
        self.assertIs(r.body.get("ok"), True, r)
        self.assertEqual(set(r.body.keys()), {"ok", "value"}, r)
        return r.body["value"]

    def create(self, tok, data, enc="json", coll="posts"):
        return self.ok(tok, "collections.%s.create" % coll, {"data": data}, enc)

    def find(self, tok, args=None, enc="json", coll="posts"):
        return self.ok(tok, "collections.%s.find" % coll, args if args is not None else {}, enc)

    def assertExec(self, r, enc=None):
        self.assertError(r, 500, "execution_error", MSG_EXEC, enc=enc)
        self.assertTrue(re.match(r"^[0-9a-f-]{36}$", r.body["error"].get("correlationId", "")), r)


# ---------------------------------------------------------------------------------------------------------------------
class Types(Base):
    """Every type round-trips: create, then findOne equal, in both encodings (PROTOCOL.md 6b "Types")."""

    def full_doc(self, enc):
        doc = {
            "title": "it's \"quoted\" — ünïcödé 😀 \\ %_ ; -- /* */",
            "views": 2147483647,
            "score": 0.1,
            "price": "123456789012345678901234567890.123456789",
            "published": True,
            "meta": {"a": [1, 2.5, "x", None, True, {"b": {"c": []}}], "empty": {}, "s": "it's"},
            "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "created": "2024-01-02T03:04:05.123456Z",
        }
        raw = bytes(range(256))
        doc["blob"] = raw if enc == "msgpack" else base64.b64encode(raw).decode()
        return doc, raw

    def check_created(self, got, want, tenant, enc, raw):
        self.assertEqual(sorted(got.keys()), sorted(POST_FIELDS))
        self.assertIsInstance(got["id"], int)
        self.assertEqual(got["tenant_id"], tenant)
        for k in ("title", "views", "score", "price", "published", "meta", "uid", "created"):
            self.assertEqual(got[k], want[k], k)
        if enc == "msgpack":
            self.assertIsInstance(got["blob"], bytes)
            self.assertEqual(got["blob"], raw)
        else:
            self.assertEqual(base64.b64decode(got["blob"], validate=True), raw)

    def test_every_type_round_trips(self):
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                tenant = new_tenant()
                tok = mint(tenant)
                want, raw = self.full_doc(enc)
                created = self.create(tok, want, enc)
                self.check_created(created, want, tenant, enc, raw)
                got = self.ok(tok, "collections.posts.findOne", {"where": {"id": created["id"]}}, enc)
                self.assertEqual(got, created)
                # the other encoding reads the same row, bytea in its own form
                other = "json" if enc == "msgpack" else "msgpack"
                got2 = self.ok(tok, "collections.posts.findOne", {"where": {"id": created["id"]}}, other)
                self.check_created(got2, want, tenant, other, raw)
                # and the database holds exactly the values
                row = PG.sql("SELECT title, views, score::text, price::text, published::text, meta::text, encode(blob, 'hex'), "
                             "uid::text, created AT TIME ZONE 'UTC' FROM posts WHERE id = %d" % created["id"])[0]
                self.assertEqual(row[0], want["title"])
                self.assertEqual(row[1], "2147483647")
                self.assertEqual(float(row[2]), 0.1)
                self.assertEqual(row[3], want["price"])
                self.assertEqual(row[4], "true")
                self.assertEqual(json.loads(row[5]), want["meta"])
                self.assertEqual(row[6], raw.hex())
                self.assertEqual(row[7], want["uid"])
                self.assertEqual(row[8], "2024-01-02 03:04:05.123456")

    def test_value_edges(self):
        cases = [
            ({"views": -2147483648}, {"views": -2147483648}),
            ({"views": 0, "score": -1.5e300}, {"views": 0, "score": -1.5e300}),
            ({"score": 5}, {"score": 5.0}),
            ({"price": "0.000001"}, {"price": "0.000001"}),
            ({"price": "-12.340"}, {"price": "-12.340"}),
            ({"price": 12.5}, {"price": "12.5"}),
            ({"price": 7}, {"price": "7"}),
            ({"published": False}, {"published": False}),
            ({"title": ""}, {"title": ""}),
            ({"meta": []}, {"meta": []}),
            ({"meta": "just a string"}, {"meta": "just a string"}),
            ({"meta": 42}, {"meta": 42}),
            ({"meta": None}, {"meta": None}),
            ({"uid": "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"}, {"uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"}),
            ({"created": "2024-01-02T05:04:05+02:00"}, {"created": "2024-01-02T03:04:05Z"}),
            ({"created": "2024-06-30T23:59:59.5Z"}, {"created": "2024-06-30T23:59:59.5Z"}),
            ({"title": None, "views": None, "score": None, "price": None, "published": None, "blob": None, "uid": None,
              "created": None},
             {"title": None, "views": None, "score": None, "price": None, "published": None, "blob": None, "uid": None,
              "created": None}),
        ]
        for enc in ENCODINGS:
            tok = mint(new_tenant())
            for data, want in cases:
                with self.subTest(enc=enc, data=data):
                    doc = self.create(tok, data, enc)
                    for k, v in want.items():
                        self.assertEqual(doc[k], v, k)
                        if isinstance(v, float):
                            self.assertIsInstance(doc[k], float)
                    again = self.ok(tok, "collections.posts.findOne", {"where": {"id": doc["id"]}}, enc)
                    self.assertEqual(again, doc)

    def test_defaults_and_timestamps(self):
        for enc in ENCODINGS:
            tok = mint(new_tenant())
            doc = self.create(tok, {}, enc)
            self.assertRegex(doc["created"], ISO_Z)
            self.assertIsNone(doc["title"])
            ds = self.ok(tok, "store.notes.create", {"data": {"key": "k"}}, enc)
            self.assertRegex(ds["created_at"], ISO_Z)
            self.assertRegex(ds["updated_at"], ISO_Z)
            self.assertEqual(ds["data"], {})

    def test_bytea_in_where_and_update(self):
        tok = mint(new_tenant())
        raw = b"\x00'\\\xff;--"
        doc = self.create(tok, {"blob": raw, "title": "b"}, "msgpack")
        self.assertEqual(self.ok(tok, "collections.posts.findOne", {"where": {"blob": raw}}, "msgpack")["id"], doc["id"])
        b64 = base64.b64encode(raw).decode()
        self.assertEqual(self.ok(tok, "collections.posts.findOne", {"where": {"blob": b64}}, "json")["id"], doc["id"])
        upd = self.ok(tok, "collections.posts.update", {"where": {"id": doc["id"]}, "data": {"blob": base64.b64encode(b"new").decode()}})
        self.assertEqual(upd["docs"][0]["blob"], base64.b64encode(b"new").decode())
        upd = self.ok(tok, "collections.posts.update", {"where": {"id": doc["id"]}, "data": {"blob": b""}}, "msgpack")
        self.assertEqual(upd["docs"][0]["blob"], b"")

    def test_value_errors(self):
        tok = mint(new_tenant())
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                r = self.call(tok, "collections.posts.create", {"data": {"uid": "not-a-uuid"}}, enc)
                self.assertError(r, 400, "bad_args", "a value violates a constraint or has an invalid value (SQLSTATE 22P02)", enc=enc)
                r = self.call(tok, "collections.posts.create", {"data": {"views": "abc"}}, enc)
                self.assertError(r, 400, "bad_args", "a value violates a constraint or has an invalid value (SQLSTATE 22P02)", enc=enc)
                r = self.call(tok, "collections.posts.create", {"data": {"views": 1 << 40}}, enc)
                self.assertError(r, 400, "bad_args", "a value violates a constraint or has an invalid value (SQLSTATE 22003)", enc=enc)
                r = self.call(tok, "collections.posts.create", {"data": {"created": "yesterday-ish"}}, enc)
                self.assertError(r, 400, "bad_args", enc=enc)
                r = self.call(tok, "collections.posts.create", {"data": {"title": "a\x00b"}}, enc)
                self.assertError(r, 400, "bad_args", 'value for "title" contains NUL', enc=enc)
                r = self.call(tok, "collections.posts.find", {"where": {"views": {"gt": "x"}}}, enc)
                self.assertError(r, 400, "bad_args", "a value violates a constraint or has an invalid value (SQLSTATE 22P02)", enc=enc)
        r = self.call(tok, "collections.posts.create", {"data": {"blob": "not base64"}}, "json")
        self.assertError(r, 400, "bad_args", 'value for "blob" must be base64 text', enc="json")
        r = self.call(tok, "collections.posts.create", {"data": {"title": b"bytes"}}, "msgpack")
        self.assertError(r, 400, "bad_args", 'binary value for non-bytea column "title"', enc="msgpack")
        # a unique violation in the document store (tenant, store, key)
        self.ok(tok, "store.notes.create", {"data": {"key": "dup"}})
        r = self.call(tok, "store.notes.create", {"data": {"key": "dup"}}, "json")
        self.assertError(r, 400, "bad_args", "the write violates a constraint or has an invalid value (SQLSTATE 23505)", enc="json")

    def test_result_cap(self):
        """A page above 786,432 bytes is execution_error, never a truncated success."""
        tok = mint(new_tenant())
        big = "x" * 60000
        for _ in range(14):
            self.create(tok, {"title": big})
        page = self.find(tok, {"limit": 12, "select": ["title"]})
        self.assertEqual(len(page["docs"]), 12)
        for enc in ENCODINGS:
            r = self.call(tok, "collections.posts.find", {"limit": 14, "select": ["title"]}, enc)
            self.assertExec(r, enc=enc)

    def test_json_reply_over_the_response_cap(self):
        """A result under the handler's cap can still need more JSON than the method's response cap (each
        control character is a six-byte escape): the writer stops at the cap and the call is execution_error
        with that reason in its log line, while the same result in msgpack is answered (PROTOCOL.md section 8)."""
        tok = mint(new_tenant())
        ctl = "\x01" * 40000
        for _ in range(4):
            self.create(tok, {"title": ctl}, "msgpack")
        page = self.find(tok, {"limit": 4, "select": ["title"]}, "msgpack")
        self.assertEqual([d["title"] for d in page["docs"]], [ctl] * 4)
        r = self.call(tok, "collections.posts.find", {"limit": 4, "select": ["title"]}, "json")
        self.assertExec(r, enc="json")
        cid = r.body["error"]["correlationId"]
        lines = [e for e in self.b().events() if e.get("event") == "rpc" and e.get("cid") == cid]
        self.assertEqual([e.get("reason") for e in lines], ["result exceeds the method's response cap"])
        # one row less fits: about 720 KB of JSON
        page = self.find(tok, {"limit": 3, "select": ["title"]}, "json")
        self.assertEqual([d["title"] for d in page["docs"]], [ctl] * 3)

    def test_write_answered_as_failed_changes_nothing(self):
        """update/delete answer every row they touched; when that answer is over the cap the call is
        execution_error, and a call answered as failed must not have changed the table."""
        tenant = new_tenant()
        tok = mint(tenant)
        big = "x" * 60000
        for _ in range(14):
            self.create(tok, {"title": big})
        r = self.call(tok, "collections.posts.update", {"where": {"views": None}, "data": {"views": 1}})
        self.assertExec(r)
        self.assertEqual(PG.scalar("SELECT count(*) FROM posts WHERE tenant_id = '%s' AND views IS NOT NULL" % tenant), "0",
                         "an update answered execution_error was committed")
        r = self.call(tok, "collections.posts.delete", {})
        self.assertExec(r)
        self.assertEqual(rows_of(tenant), 14, "a delete answered execution_error was committed")


# ---------------------------------------------------------------------------------------------------------------------
class Find(Base):
    """find: {docs, limit, offset, hasMore}; default page 10, clamped to max_limit; sort and select."""

    @classmethod
    def setUpClass(cls):
        cls.tenant = new_tenant("page")
        cls.tok = mint(cls.tenant)
        vals = ",".join("('%s', 'p%02d', %d)" % (cls.tenant, i, i % 7) for i in range(60))
        PG.sql("INSERT INTO posts (tenant_id, title, views) VALUES " + vals)

    def test_default_page(self):
        for enc in ENCODINGS:
            v = self.find(self.tok, {}, enc)
            self.assertEqual(set(v.keys()), {"docs", "limit", "offset", "hasMore"})
            self.assertEqual((v["limit"], v["offset"], v["hasMore"]), (10, 0, True))
            self.assertEqual([d["title"] for d in v["docs"]], ["p%02d" % i for i in range(10)])
            self.assertEqual(sorted(v["docs"][0].keys()), sorted(POST_FIELDS))

    def test_paging(self):
        seen = []
        offset = 0
        while True:
            v = self.find(self.tok, {"limit": 25, "offset": offset})
            self.assertEqual((v["limit"], v["offset"]), (25, offset))
            seen += [d["title"] for d in v["docs"]]
            if not v["hasMore"]:
                break
            offset += 25
        self.assertEqual(seen, ["p%02d" % i for i in range(60)])
        v = self.find(self.tok, {"limit": 10, "offset": 50})
        self.assertEqual((len(v["docs"]), v["hasMore"]), (10, False))
        v = self.find(self.tok, {"limit": 10, "offset": 49})
        self.assertEqual((len(v["docs"]), v["hasMore"]), (10, True))
        v = self.find(self.tok, {"offset": 100000})
        self.assertEqual((v["docs"], v["hasMore"]), ([], False))
        v = self.find(self.tok, {"limit": 0})
        self.assertEqual((v["docs"], v["limit"], v["hasMore"]), ([], 0, True))

    def test_limit_clamp(self):
        for enc in ENCODINGS:
            v = self.find(self.tok, {"limit": 1000}, enc)
            self.assertEqual((len(v["docs"]), v["limit"], v["hasMore"]), (50, 50, True))
            v = self.find(self.tok, {"limit": 50, "offset": 10}, enc)
            self.assertEqual((len(v["docs"]), v["hasMore"]), (50, False))
        r = self.call(self.tok, "collections.posts.find", {"limit": -1}, "json")
        self.assertError(r, 400, "bad_args", "limit must be a non-negative integer")
        r = self.call(self.tok, "collections.posts.find", {"offset": 100001}, "json")
        self.assertError(r, 400, "bad_args", "offset must be an integer from 0 to 100000")

    def test_sort_select(self):
        v = self.find(self.tok, {"sort": ["-views", "title"], "limit": 9, "select": ["views"]})
        self.assertEqual([sorted(d.keys()) for d in v["docs"]], [["id", "views"]] * 9)
        self.assertEqual([d["views"] for d in v["docs"]], [6] * 8 + [5])
        v = self.find(self.tok, {"sort": "-id", "limit": 1, "select": {"title": True}})
        self.assertEqual(v["docs"][0]["title"], "p59")
        one = self.ok(self.tok, "collections.posts.findOne", {"where": {"views": 3}, "sort": "-title"})
        self.assertEqual(one["title"], "p59")  # views 3: p03, p10, ..., p59
        self.assertIsNone(self.ok(self.tok, "collections.posts.findOne", {"where": {"views": 99}}))

    def test_operators(self):
        def titles(where, **extra):
            args = {"where": where, "limit": 50}
            args.update(extra)
            return sorted(d["title"] for d in self.find(self.tok, args)["docs"])

        self.assertEqual(titles({"views": 6}), ["p06", "p13", "p20", "p27", "p34", "p41", "p48", "p55"])
        self.assertEqual(len(titles({"views": {"not_equals": 6}})), 50)  # 52 rows, clamped
        self.assertEqual(titles({"views": {"gt": 5}, "title": {"lt": "p20"}}), ["p06", "p13"])
        self.assertEqual(titles({"views": {"gte": 6}, "title": {"lte": "p13"}}), ["p06", "p13"])
        self.assertEqual(titles({"title": {"in": ["p01", "p02", "nope"]}}), ["p01", "p02"])
        self.assertEqual(titles({"title": {"in": []}}), [])
        self.assertEqual(len(titles({"title": {"not_in": []}, "views": 0})), 9)
        self.assertEqual(titles({"title": {"not_in": ["p00", "p07"]}, "views": 0}), ["p14", "p21", "p28", "p35", "p42", "p49", "p56"])
        self.assertEqual(titles({"title": {"like": "p5_"}}), ["p%d" % i for i in range(50, 60)])
        self.assertEqual(titles({"title": {"contains": "P5"}}), ["p%d" % i for i in range(50, 60)])
        self.assertEqual(titles({"title": {"exists": False}}), [])
        self.assertEqual(titles({"or": [{"title": "p01"}, {"and": [{"views": 6}, {"title": {"gt": "p50"}}]}]}), ["p01", "p55"])


# ---------------------------------------------------------------------------------------------------------------------
class Injection(Base):
    """Guest strings never become SQL: identifiers are refused naming them, values match only themselves."""

    PAYLOADS = ["title'; drop table posts; --", '"title"', "1=1) or (1=1", "x' OR '1'='1", "'; DELETE FROM posts; --",
                "$1", "\\", "%", "_", "title\" = title --"]

    def assertIntact(self):
        self.assertEqual(PG.scalar("SELECT to_regclass('posts') IS NOT NULL AND to_regclass('document_store') IS NOT NULL"), "t")
        self.assertGreater(int(PG.scalar("SELECT count(*) FROM posts")), 0)

    @classmethod
    def setUpClass(cls):
        cls.tenant = new_tenant("inj")
        cls.tok = mint(cls.tenant)

    def test_where_keys(self):
        for enc in ENCODINGS:
            for p in self.PAYLOADS:
                with self.subTest(enc=enc, key=p):
                    r = self.call(self.tok, "collections.posts.find", {"where": {p: 1}}, enc)
                    self.assertError(r, 400, "bad_args", 'unknown field "%s"' % p, enc=enc)
                    r = self.call(self.tok, "collections.posts.find", {"where": {"title": {p: 1}}}, enc)
                    self.assertError(r, 400, "bad_args", 'unknown operator "%s" on "title"' % p, enc=enc)
                    r = self.call(self.tok, "collections.posts.create", {"data": {p: 1}}, enc)
                    self.assertError(r, 400, "bad_args", 'unknown field "%s"' % p, enc=enc)
                    r = self.call(self.tok, "collections.posts.update", {"where": {"id": 1}, "data": {p: 1}}, enc)
                    self.assertError(r, 400, "bad_args", 'unknown field "%s"' % p, enc=enc)
        self.assertIntact()

    def test_where_values_are_literals(self):
        for p in self.PAYLOADS:
            self.create(self.tok, {"title": p, "meta": {"k": p}})
        self.create(self.tok, {"title": "plain"})
        for enc in ENCODINGS:
            for p in self.PAYLOADS:
                with self.subTest(enc=enc, value=p):
                    docs = self.find(self.tok, {"where": {"title": p}}, enc)["docs"]
                    self.assertEqual([d["title"] for d in docs], [p])
                    docs = self.find(self.tok, {"where": {"title": {"in": [p, "nope"]}}}, enc)["docs"]
                    self.assertEqual([d["title"] for d in docs], [p])
                    docs = self.find(self.tok, {"where": {"meta": {"equals": {"k": p}}}}, enc)["docs"]
                    self.assertEqual([d["title"] for d in docs], [p])
                    docs = self.find(self.tok, {"where": {"title": {"contains": p}}, "limit": 50}, enc)["docs"]
                    self.assertTrue(all(p.lower() in d["title"].lower() for d in docs), docs)
                    self.assertIn(p, [d["title"] for d in docs])
        # contains takes % _ \ literally; like keeps them as the SQL pattern
        docs = self.find(self.tok, {"where": {"title": {"contains": "%"}}})["docs"]
        self.assertEqual([d["title"] for d in docs], ["%"])
        docs = self.find(self.tok, {"where": {"title": {"contains": "_"}}})["docs"]
        self.assertEqual([d["title"] for d in docs], ["_"])
        docs = self.find(self.tok, {"where": {"title": {"contains": "\\"}}})["docs"]
        self.assertEqual([d["title"] for d in docs], ["\\"])
        docs = self.find(self.tok, {"where": {"title": {"like": "%"}}, "limit": 50})["docs"]
        self.assertEqual(len(docs), len(self.PAYLOADS) + 1)
        self.assertIntact()

    def test_sort_and_select(self):
        for enc in ENCODINGS:
            for p in self.PAYLOADS + ["title desc", "title, (select 1)", "-"]:
                with self.subTest(enc=enc, name=p):
                    r = self.call(self.tok, "collections.posts.find", {"sort": p}, enc)
                    self.assertError(r, 400, "bad_args", enc=enc)
                    r = self.call(self.tok, "collections.posts.find", {"sort": ["title", p]}, enc)
                    self.assertError(r, 400, "bad_args", enc=enc)
                    r = self.call(self.tok, "collections.posts.find", {"select": ["title", p]}, enc)
                    self.assertError(r, 400, "bad_args", enc=enc)
                    r = self.call(self.tok, "collections.posts.find", {"select": {p: True}}, enc)
                    self.assertError(r, 400, "bad_args", enc=enc)
        self.assertIntact()

    def test_echoed_names_stay_utf8(self):
        """Names echoed in errors are cut on a code point boundary: the reply, the log and the audit line stay valid UTF-8."""
        tok = mint(new_tenant())
        field = "f" * 63 + "\u00e9\u00e9"          # 67 bytes: a cut at 64 would split the first e-acute
        op = "o" * 31 + "\U0001F600"                # 35 bytes: a cut at 32 would split the emoji
        key = "k" * 30 + "\U0001F600"
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                for args, want in [({"where": {field: 1}}, 'unknown field "%s"' % ("f" * 63)),
                                   ({"where": {"title": {op: 1}}}, 'unknown operator "%s" on "title"' % ("o" * 31)),
                                   ({"where": {field: {}}}, "where.%s has no operator" % ("f" * 63)),
                                   ({key: 1}, 'find takes no argument "%s"' % ("k" * 30)),
                                   ({"sort": "-" + field}, 'sort names an unknown field "%s"' % ("f" * 63))]:
                    r = self.call(tok, "collections.posts.find", args, enc)
                    # decode_body of the test client parses strictly: invalid UTF-8 would not get here
                    self.assertError(r, 400, "bad_args", want, enc=enc)
                    if enc == "json":
                        r.raw.decode("utf-8")  # raises on a split code point
        lines = [e for e in self.b().events() if e.get("event") == "rpc" and e.get("code") == "bad_args"
                 and "f" * 63 in e.get("reason", "")]
        self.assertTrue(lines, "the log lines of those calls")

    def test_sort_and_select_name_the_field(self):
        """PROTOCOL.md 6b: unknown fields are bad_args naming them (sort and select too)."""
        r = self.call(self.tok, "collections.posts.find", {"sort": "-nope"})
        self.assertError(r, 400, "bad_args")
        self.assertIn("nope", r.body["error"]["message"])
        r = self.call(self.tok, "collections.posts.find", {"select": ["title", "nope"]})
        self.assertError(r, 400, "bad_args")
        self.assertIn("nope", r.body["error"]["message"])

    def test_collection_and_store_names(self):
        for enc in ENCODINGS:
            for m in ["collections.posts;drop table posts.find", "collections.posts'.find", 'collections."posts".find',
                      "collections.posts.find;", "collections.posts .find", "store.notes'--.find", "store.no tes.find",
                      "collections.posts.find.x", "collections..find"]:
                with self.subTest(enc=enc, method=m):
                    r = self.call(self.tok, m, {}, enc)
                    self.assertError(r, 400, "bad_method", 'unrecognized method "%s"' % m, enc=enc)
            # a store namespace from the arguments is a name or nothing
            for ns in ["notes'; drop table document_store; --", "notes\"", "", "notes ", {"in": ["notes", "x"]},
                       {"equals": "notes", "not_equals": "x"}, ["notes"], 5, None]:
                with self.subTest(enc=enc, ns=ns):
                    r = self.call(self.tok, "collections.document_store.find", {"where": {"store": ns}}, enc)
                    self.assertError(r, 403, "forbidden", MSG_NS, enc=enc)
                    r = self.call(self.tok, "collections.document_store.create", {"store": ns}, enc)
                    self.assertError(r, 403, "forbidden", MSG_NS, enc=enc)
        # a name that is grammatical but not the configured one: the manifest grants "Posts", the target has no such collection
        r = self.call(self.tok, "collections.Posts.find", {})
        self.assertError(r, 501, "not_implemented", "collections.Posts.find has no host handler")
        self.assertIntact()


# ---------------------------------------------------------------------------------------------------------------------
class Tenants(Base):
    """A run never sees or touches another tenant's rows, whatever it sends."""

    @classmethod
    def setUpClass(cls):
        cls.t1, cls.t2 = new_tenant("a"), new_tenant("b")
        cls.tok1, cls.tok2 = mint(cls.t1), mint(cls.t2)

    def setUp(self):
        PG.sql("DELETE FROM posts WHERE tenant_id IN ('%s', '%s')" % (self.t1, self.t2))
        self.mine = self.create(self.tok1, {"title": "mine", "views": 1})
        self.theirs = self.create(self.tok2, {"title": "theirs", "views": 1})
        self.theirs2 = self.create(self.tok2, {"title": "mine", "views": 1})

    def evil_wheres(self):
        tid = self.theirs["id"]
        return [
            {},
            {"id": tid},
            {"tenant_id": self.t2},
            {"tenant_id": {"not_equals": self.t1}},
            {"tenant_id": {"in": [self.t1, self.t2]}},
            {"or": [{"tenant_id": self.t2}, {"id": tid}]},
            {"or": [{"id": tid}, {"id": {"not_equals": tid}}]},
            {"or": [{"tenant_id": {"exists": True}}, {"tenant_id": {"exists": False}}]},
            {"title": "theirs"},
            {"id": {"in": [tid, self.mine["id"]]}},
        ]

    def test_reads(self):
        for enc in ENCODINGS:
            for w in self.evil_wheres():
                with self.subTest(enc=enc, where=w):
                    docs = self.find(self.tok1, {"where": w, "limit": 50}, enc)["docs"]
                    self.assertTrue(all(d["tenant_id"] == self.t1 for d in docs), docs)
                    self.assertNotIn(self.theirs["id"], [d["id"] for d in docs])
                    one = self.ok(self.tok1, "collections.posts.findOne", {"where": w, "sort": "-id"}, enc)
                    self.assertTrue(one is None or one["tenant_id"] == self.t1, one)
        self.assertIsNone(self.ok(self.tok1, "collections.posts.findOne", {"where": {"id": self.theirs["id"]}}))

    def test_writes(self):
        before = PG.sql("SELECT id, title, views FROM posts WHERE tenant_id = '%s' ORDER BY id" % self.t2)
        for enc in ENCODINGS:
            for w in self.evil_wheres():
                with self.subTest(enc=enc, where=w):
                    upd = self.ok(self.tok1, "collections.posts.update", {"where": w, "data": {"views": 7}}, enc)
                    self.assertTrue(all(d["tenant_id"] == self.t1 for d in upd["docs"]), upd)
        for enc in ENCODINGS:
            for w in self.evil_wheres():
                with self.subTest(enc=enc, where=w):
                    dele = self.ok(self.tok1, "collections.posts.delete", {"where": w}, enc)
                    self.assertTrue(all(d["tenant_id"] == self.t1 for d in dele["docs"]), dele)
        self.assertEqual(PG.sql("SELECT id, title, views FROM posts WHERE tenant_id = '%s' ORDER BY id" % self.t2), before)
        mine = self.create(self.tok1, {"title": "again"})
        dele = self.ok(self.tok1, "collections.posts.delete", {"where": {"or": [{"tenant_id": self.t2}, {"id": {"gt": 0}}]}})
        self.assertEqual([(d["id"], d["tenant_id"]) for d in dele["docs"]], [(mine["id"], self.t1)])
        self.assertEqual(PG.sql("SELECT id, title, views FROM posts WHERE tenant_id = '%s' ORDER BY id" % self.t2), before)

    def test_scope_columns_are_bound(self):
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                r = self.call(self.tok1, "collections.posts.create", {"data": {"title": "x", "tenant_id": self.t2}}, enc)
                self.assertError(r, 403, "forbidden",
                                 "field \"tenant_id\" is bound to the run's scope and cannot be set to another value", enc=enc)
                r = self.call(self.tok1, "collections.posts.create", {"data": {"tenant_id": None}}, enc)
                self.assertError(r, 403, "forbidden",
                                 "field \"tenant_id\" is bound to the run's scope and cannot be set to another value", enc=enc)
                r = self.call(self.tok1, "collections.posts.update", {"where": {"id": self.mine["id"]}, "data": {"tenant_id": self.t2}}, enc)
                self.assertError(r, 403, "forbidden", "field \"tenant_id\" is bound to the run's scope and cannot be changed", enc=enc)
                r = self.call(self.tok1, "collections.posts.update", {"where": {"id": self.mine["id"]}, "data": {"tenant_id": self.t1}}, enc)
                self.assertError(r, 403, "forbidden", "field \"tenant_id\" is bound to the run's scope and cannot be changed", enc=enc)
                doc = self.create(self.tok1, {"title": "restated", "tenant_id": self.t1}, enc)
                self.assertEqual(doc["tenant_id"], self.t1)
        self.assertEqual(int(PG.scalar("SELECT count(*) FROM posts WHERE tenant_id = '%s'" % self.t2)), 2)
        # a token that binds no tenant cannot use the collection at all
        tok = mint(None, scope={})
        for m, a in [("find", {}), ("findOne", {}), ("create", {"data": {"title": "x"}}), ("update", {"data": {"title": "x"}}),
                     ("delete", {})]:
            r = self.call(tok, "collections.posts." + m, a)
            self.assertError(r, 403, "forbidden", 'the token binds no "tenantId" scope value')
        tok = mint(None, scope={"tenantId": self.t2, "other": "x"})
        self.assertEqual({d["tenant_id"] for d in self.find(tok)["docs"]}, {self.t2})


# ---------------------------------------------------------------------------------------------------------------------
class Writes(Base):
    def test_create_update_delete_shapes(self):
        for enc in ENCODINGS:
            tok = mint(new_tenant())
            a = self.create(tok, {"title": "a", "views": 1}, enc)
            b = self.create(tok, {"title": "b", "views": 2}, enc)
            upd = self.ok(tok, "collections.posts.update", {"where": {"title": "a"}, "data": {"views": 10, "meta": {"x": 1}}}, enc)
            self.assertEqual(set(upd.keys()), {"docs"})
            self.assertEqual(len(upd["docs"]), 1)
            self.assertEqual((upd["docs"][0]["id"], upd["docs"][0]["views"], upd["docs"][0]["meta"]), (a["id"], 10, {"x": 1}))
            self.assertEqual(self.ok(tok, "collections.posts.update", {"where": {"title": "zzz"}, "data": {"views": 1}}, enc), {"docs": []})
            dele = self.ok(tok, "collections.posts.delete", {"where": {"id": b["id"]}}, enc)
            self.assertEqual([d["id"] for d in dele["docs"]], [b["id"]])
            self.assertEqual(dele["docs"][0]["title"], "b")
            self.assertIsNone(self.ok(tok, "collections.posts.findOne", {"where": {"id": b["id"]}}, enc))
            self.assertEqual(self.ok(tok, "collections.posts.delete", {"where": {"id": b["id"]}}, enc), {"docs": []})

    def test_update_and_delete_touch_at_most_max_limit(self):
        tenant = new_tenant()
        tok = mint(tenant)
        PG.sql("INSERT INTO posts (tenant_id, title) SELECT '%s', 'r' || g FROM generate_series(1, 60) g" % tenant)
        counts = [len(self.ok(tok, "collections.posts.update", {"where": {"views": None}, "data": {"views": 1}})["docs"])
                  for _ in range(3)]
        self.assertEqual(counts, [50, 10, 0])
        counts = [len(self.ok(tok, "collections.posts.delete", {})["docs"]) for _ in range(3)]
        self.assertEqual(counts, [50, 10, 0])
        self.assertEqual(rows_of(tenant), 0)

    def test_argument_shapes(self):
        tok = mint(new_tenant())
        cases = [
            ("find", {"where": {"nope": 1}}, 'unknown field "nope"'),
            ("find", {"where": {"title": {"regex": "x"}}}, 'unknown operator "regex" on "title"'),
            ("find", {"bogus": 1}, 'find takes no argument "bogus"'),
            ("findOne", {"limit": 1}, 'findOne takes no argument "limit"'),
            ("create", {"data": {}, "where": {}}, 'create takes no argument "where"'),
            ("create", {}, "data must be a non-empty object"),
            ("update", {"where": {"id": 1}}, "data must be a non-empty object"),
            ("update", {"where": {"id": 1}, "data": {}}, "data must be a non-empty object"),
            ("delete", {"where": {"id": 1}, "data": {"x": 1}}, 'delete takes no argument "data"'),
            ("find", {"where": {"views": {"in": list(range(101))}}}, 'operator "in" on "views" needs an array of at most 100 values'),
            ("find", {"where": {"title": {"exists": "yes"}}}, 'operator "exists" on "title" needs true or false'),
            ("find", {"where": [1]}, "where must be an object"),
        ]
        deep = {"views": 1}
        for _ in range(9):
            deep = {"and": [deep]}
        cases.append(("find", {"where": deep}, "where is nested deeper than 8"))
        cases.append(("find", {"where": {"and": [{"views": {"gt": 0, "lt": 9}} for _ in range(33)]}}, "where has more than 64 conditions"))
        for enc in ENCODINGS:
            for op, args, msg in cases:
                with self.subTest(enc=enc, op=op, args=args):
                    r = self.call(tok, "collections.posts." + op, args, enc)
                    self.assertError(r, 400, "bad_args", msg, enc=enc)
        ok8 = {"views": 1}
        for _ in range(8):
            ok8 = {"and": [ok8]}
        self.assertEqual(self.find(tok, {"where": ok8})["docs"], [])
        self.assertEqual(self.find(tok, {"where": {"and": [{"views": {"gt": 0, "lt": 9}} for _ in range(32)]}})["docs"], [])


# ---------------------------------------------------------------------------------------------------------------------
class DocumentStore(Base):
    """store.<ns>.* and collections.document_store.*: the namespace is injected and enforced."""

    @classmethod
    def setUpClass(cls):
        cls.tenant = new_tenant("ds")
        cls.tok = mint(cls.tenant)

    def test_both_forms(self):
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                key = "k-" + enc
                a = self.ok(self.tok, "store.notes.create", {"data": {"key": key, "data": {"x": [1, {"y": None}]}}}, enc)
                self.assertEqual(sorted(a.keys()), sorted(DOC_FIELDS))
                self.assertEqual((a["store"], a["tenant_id"], a["key"], a["data"]), ("notes", self.tenant, key, {"x": [1, {"y": None}]}))
                # upstream's store sugar (PROTOCOL.md section 6b): store.<s>.create(x) is sent as create({...x, store: s})
                b = self.ok(self.tok, "collections.document_store.create", {"key": key + "2", "data": {"v": 1}, "store": "notes"}, enc)
                self.assertEqual((b["store"], b["tenant_id"], b["key"], b["data"]), ("notes", self.tenant, key + "2", {"v": 1}))
                f1 = self.ok(self.tok, "store.notes.find", {"where": {"key": {"like": "k-" + enc + "%"}}}, enc)
                f2 = self.ok(self.tok, "collections.document_store.find", {"where": {"store": "notes", "key": {"like": "k-" + enc + "%"}}}, enc)
                f3 = self.ok(self.tok, "collections.document_store.find",
                             {"where": {"store": {"equals": "notes"}, "key": {"like": "k-" + enc + "%"}}}, enc)
                self.assertEqual([d["id"] for d in f1["docs"]], [a["id"], b["id"]])
                self.assertEqual(f1, f2)
                self.assertEqual(f1, f3)
                one = self.ok(self.tok, "collections.document_store.findOne", {"where": {"store": "notes", "key": key}}, enc)
                self.assertEqual(one["id"], a["id"])
                upd = self.ok(self.tok, "store.notes.update", {"where": {"key": key}, "data": {"data": {"v": 2}}}, enc)
                self.assertEqual([(d["id"], d["data"]) for d in upd["docs"]], [(a["id"], {"v": 2})])
                upd = self.ok(self.tok, "collections.document_store.update", {"where": {"store": "notes", "key": key}, "data": {"data": [3]}}, enc)
                self.assertEqual([(d["id"], d["data"]) for d in upd["docs"]], [(a["id"], [3])])
                dele = self.ok(self.tok, "collections.document_store.delete", {"where": {"store": "notes", "key": key + "2"}}, enc)
                self.assertEqual([d["id"] for d in dele["docs"]], [b["id"]])
                dele = self.ok(self.tok, "store.notes.delete", {"where": {"key": key}}, enc)
                self.assertEqual([d["id"] for d in dele["docs"]], [a["id"]])

    def test_upstream_bodies_byte_for_byte(self):
        """The bodies upstream's guest runtime sends for questpie.store.notes.* (PROTOCOL.md section 6b), as bytes."""
        tenant = new_tenant("up")
        tok = mint(tenant)
        def post(body):
            r = self.b().rpc(tok, body=body, timeout=30)
            self.assertEqual(r.status, 200, r)
            return r.body["value"]
        created = post(b'{"method":"collections.document_store.create","args":{"key":"k1","data":{"v":1},"store":"notes"}}')
        self.assertEqual((created["store"], created["tenant_id"], created["key"], created["data"]), ("notes", tenant, "k1", {"v": 1}))
        self.assertEqual(PG.sql("SELECT store, key, data::text FROM document_store WHERE tenant_id = '%s'" % tenant),
                         [["notes", "k1", '{"v": 1}']])
        found = post(b'{"method":"collections.document_store.find","args":{"where":{"key":"k1","store":"notes"}}}')
        self.assertEqual([d["id"] for d in found["docs"]], [created["id"]])
        one = post(b'{"method":"collections.document_store.findOne","args":{"where":{"key":"k1","store":"notes"}}}')
        self.assertEqual(one["id"], created["id"])
        upd = post(b'{"method":"collections.document_store.update","args":{"where":{"key":"k1","store":"notes"},'
                   b'"data":{"data":{"v":2}}}}')
        self.assertEqual([(d["id"], d["data"]) for d in upd["docs"]], [(created["id"], {"v": 2})])
        # the sugar merges store into an empty where too: {store: s}
        found = post(b'{"method":"collections.document_store.find","args":{"where":{"store":"notes"}}}')
        self.assertEqual([d["key"] for d in found["docs"]], ["k1"])
        dele = post(b'{"method":"collections.document_store.delete","args":{"where":{"key":"k1","store":"notes"}}}')
        self.assertEqual([d["id"] for d in dele["docs"]], [created["id"]])
        self.assertEqual(PG.sql("SELECT count(*) FROM document_store WHERE tenant_id = '%s'" % tenant), [["0"]])
        # the same create in msgpack
        r = self.b().rpc(tok, body=sbtest.encode({"method": "collections.document_store.create",
                                                  "args": {"key": "k2", "data": {"v": 1}, "store": "notes"}}, "msgpack"),
                         enc="msgpack", timeout=30)
        self.assertEqual(r.status, 200, r)
        self.assertEqual((r.body["value"]["store"], r.body["value"]["key"]), ("notes", "k2"))
        # a store named by x itself is overridden by the sugar's own: only the top-level store is the namespace
        r = self.b().rpc(tok, body=b'{"method":"collections.document_store.create","args":{"key":"k3","data":{"store":"other"},'
                                   b'"store":"notes"}}', timeout=30)
        self.assertEqual(r.status, 200, r)
        self.assertEqual((r.body["value"]["store"], r.body["value"]["data"]), ("notes", {"store": "other"}))
        # an unknown document field is named, as for collections
        r = self.b().rpc(tok, body=b'{"method":"collections.document_store.create","args":{"nope":1,"store":"notes"}}', timeout=30)
        self.assertError(r, 400, "bad_args", 'unknown field "nope"')

    def test_namespace_clamp(self):
        tenant = new_tenant("ns")
        tok = mint(tenant)
        PG.sql("INSERT INTO document_store (tenant_id, store, key) VALUES ('%s', 'other', 'hidden'), ('%s', 'ro', 'readable')"
               % (tenant, tenant))
        self.ok(tok, "store.notes.create", {"data": {"key": "visible"}})
        for w in [{}, {"store": "other"}, {"or": [{"store": "other"}, {"key": "hidden"}]}, {"key": "hidden"},
                  {"store": {"in": ["other", "notes"]}}, {"store": {"not_equals": "notes"}}]:
            with self.subTest(where=w):
                docs = self.ok(tok, "store.notes.find", {"where": w, "limit": 50})["docs"]
                self.assertTrue(all(d["store"] == "notes" for d in docs), docs)
                upd = self.ok(tok, "store.notes.update", {"where": w, "data": {"data": {"touched": True}}})
                self.assertTrue(all(d["store"] == "notes" for d in upd["docs"]), upd)
        # the namespace named in where.store is the one clamped, and the one checked
        docs = self.ok(tok, "collections.document_store.find", {"where": {"store": "ro"}})["docs"]
        self.assertEqual([(d["store"], d["key"]) for d in docs], [("ro", "readable")])
        self.assertEqual(PG.sql("SELECT data::text FROM document_store WHERE tenant_id = '%s' AND store <> 'notes' ORDER BY key"
                                % tenant), [["{}"], ["{}"]])
        r = self.call(tok, "store.notes.create", {"data": {"store": "other"}})
        self.assertError(r, 403, "forbidden", "field \"store\" is bound to the run's scope and cannot be set to another value")
        r = self.call(tok, "store.notes.update", {"where": {"key": "visible"}, "data": {"store": "other"}})
        self.assertError(r, 403, "forbidden", "field \"store\" is bound to the run's scope and cannot be changed")
        r = self.call(tok, "store.notes.create", {"data": {"tenant_id": "someone-else"}})
        self.assertError(r, 403, "forbidden", "field \"tenant_id\" is bound to the run's scope and cannot be set to another value")
        # another tenant's notes are invisible
        other = mint(new_tenant())
        self.assertEqual(self.ok(other, "store.notes.find", {"where": {"key": "visible"}})["docs"], [])
        self.assertEqual(self.ok(other, "collections.document_store.find", {"where": {"store": "ro"}})["docs"], [])

    def test_grants(self):
        tok = self.tok
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                cases = [
                    ("store.other.find", {}, 'store "other" does not grant "read"'),
                    ("store.other.create", {"data": {}}, 'store "other" does not grant "write"'),
                    ("store.ro.create", {"data": {}}, 'store "ro" does not grant "write"'),
                    ("store.ro.update", {"data": {"key": "x"}}, 'store "ro" does not grant "write"'),
                    ("store.ro.delete", {}, 'store "ro" does not grant "write"'),
                    ("store.wo.find", {}, 'store "wo" does not grant "read"'),
                    ("store.wo.findOne", {}, 'store "wo" does not grant "read"'),
                    ("store.Notes.find", {}, 'store "Notes" does not grant "read"'),
                    ("collections.document_store.find", {}, MSG_NS),
                    ("collections.document_store.find", {"where": {"key": "x"}}, MSG_NS),
                    ("collections.document_store.findOne", {"where": {"store": {"equals": 5}}}, MSG_NS),
                    ("collections.document_store.create", {"data": {"key": "x"}}, MSG_NS),
                    ("collections.document_store.create", {"data": {}}, MSG_NS),
                    # data.store is a document field in upstream's shape, never the namespace
                    ("collections.document_store.create", {"data": {"store": "notes"}}, MSG_NS),
                    ("collections.document_store.create", {"key": "x", "store": {"equals": "notes"}}, MSG_NS),
                    ("collections.document_store.update", {"data": {"key": "x"}}, MSG_NS),
                    ("collections.document_store.delete", {}, MSG_NS),
                    ("collections.document_store.find", {"where": {"store": "other"}}, 'store "other" does not grant "read"'),
                    ("collections.document_store.create", {"key": "k", "data": {"v": 1}, "store": "ro"}, 'store "ro" does not grant "write"'),
                    ("collections.document_store.delete", {"where": {"store": "ro"}}, 'store "ro" does not grant "write"'),
                    ("collections.document_store.find", {"where": {"store": "wo"}}, 'store "wo" does not grant "read"'),
                ]
                for m, a, msg in cases:
                    r = self.call(tok, m, a, enc)
                    self.assertError(r, 403, "forbidden", msg, enc=enc)
                self.ok(tok, "store.ro.find", {}, enc)
                self.ok(tok, "store.wo.create", {"data": {"key": "w-" + enc}}, enc)
                self.ok(tok, "collections.document_store.create", {"store": "wo"}, enc)
        # data.collections grants nothing for the document store, and data.stores nothing for collections
        tok2 = mint(self.tenant, caps={"data": {"collections": {"document_store": ALL_VERBS}, "stores": {"posts": ["read", "write"]}}})
        r = self.call(tok2, "collections.document_store.find", {"where": {"store": "notes"}})
        self.assertError(r, 403, "forbidden", 'store "notes" does not grant "read"')
        r = self.call(tok2, "collections.posts.find", {})
        self.assertError(r, 403, "forbidden", 'collection "posts" does not grant "read"')


# ---------------------------------------------------------------------------------------------------------------------
class Wiring(Base):
    """What the target does not declare stays not_implemented (PROTOCOL.md section 3 step 9)."""

    def test_undeclared_collection(self):
        tok = mint(new_tenant())
        for enc in ENCODINGS:
            for op, args in [("find", {}), ("findOne", {}), ("create", {"data": {}}), ("update", {"data": {"x": 1}}), ("delete", {})]:
                r = self.call(tok, "collections.comments." + op, args, enc)
                self.assertError(r, 501, "not_implemented", "collections.comments.%s has no host handler" % op, enc=enc)

    def test_target_without_document_store(self):
        tok = mint(new_tenant(), target="bare", caps={"data": {"collections": {"items": ALL_VERBS}, "stores": {"notes": ["read"]}}})
        self.assertEqual(self.find(tok, coll="items")["docs"], [])
        for enc in ENCODINGS:
            r = self.call(tok, "store.notes.find", {}, enc)
            self.assertError(r, 501, "not_implemented", "store.notes.find has no host handler", enc=enc)
            r = self.call(tok, "collections.document_store.find", {"where": {"store": "notes"}}, enc)
            self.assertError(r, 501, "not_implemented", "collections.document_store.find has no host handler", enc=enc)

    def test_no_target(self):
        tok = BROKER.mint_ok("run-" + uuid.uuid4().hex, CAPS)
        r = self.call(tok, "collections.posts.find", {})
        self.assertError(r, 501, "not_implemented", "collections.posts.find has no host handler")
        r = self.call(tok, "store.notes.find", {})
        self.assertError(r, 501, "not_implemented", "store.notes.find has no host handler")

    def test_targets_sharing_a_table(self):
        """Two targets (or two collections) over the same table: each sees the table's columns once."""
        cfg = app_config(PG.url)
        cfg["targets"]["second"] = {"collections": {"posts": {"table": "posts", "key": "id", "max_limit": 5,
                                                              "scope": {"tenant_id": "tenantId"}}}}
        cfg["targets"]["app"]["collections"]["articles"] = {"table": "posts", "key": "id", "scope": {"tenant_id": "tenantId"}}
        with running_broker(cfg) as b:
            self.broker = b
            try:
                tenant = new_tenant()
                caps = {"data": {"collections": {"posts": ALL_VERBS, "articles": ALL_VERBS}}}
                for target, coll in [("app", "posts"), ("app", "articles"), ("second", "posts")]:
                    with self.subTest(target=target, coll=coll):
                        tok = mint(tenant, caps=caps, target=target, broker=b)
                        r = self.call(tok, "collections.%s.create" % coll, {"data": {"title": target + coll}})
                        self.assertEqual(r.status, 200, "%r\n%s" % (r, b.log()[-1500:]))
                        self.assertEqual(sorted(r.body["value"].keys()), sorted(POST_FIELDS))
                        r = self.call(tok, "collections.%s.find" % coll, {"where": {"title": target + coll}})
                        self.assertEqual(r.status, 200, r)
            finally:
                self.broker = None

    def test_readyz_reports_the_database(self):
        r = BROKER.public("GET", "/readyz")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.body.get("database"), "up")


# ---------------------------------------------------------------------------------------------------------------------
class Concurrency(Base):
    """Concurrent creates and updates under load lose nothing."""

    THREADS = 8

    def run_threads(self, fn):
        errors = []

        def wrap(i):
            try:
                fn(i)
            except Exception as e:  # reported below, with the thread number
                errors.append("thread %d: %r" % (i, e))

        ts = [threading.Thread(target=wrap, args=(i,)) for i in range(self.THREADS)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        self.assertEqual(errors, [])

    def test_creates_then_updates(self):
        tenant = new_tenant("load")
        per = 100
        created = [[] for _ in range(self.THREADS)]

        def creator(i):
            tok = mint(tenant)
            for k in range(per):
                enc = "msgpack" if k % 2 else "json"
                r = self.call(tok, "collections.posts.create", {"data": {"title": "c-%d-%03d" % (i, k), "views": 0}}, enc)
                if r.status != 200:
                    raise AssertionError(repr(r))
                created[i].append(r.body["value"]["id"])

        self.run_threads(creator)
        ids = [x for c in created for x in c]
        self.assertEqual(len(ids), self.THREADS * per)
        self.assertEqual(len(set(ids)), self.THREADS * per)
        self.assertEqual(rows_of(tenant), self.THREADS * per)
        titles = {r[0] for r in PG.sql("SELECT title FROM posts WHERE tenant_id = '%s'" % tenant)}
        self.assertEqual(titles, {"c-%d-%03d" % (i, k) for i in range(self.THREADS) for k in range(per)})

        # every thread increments its own 10 rows 5 times each, interleaved with the others
        def updater(i):
            tok = mint(tenant)
            mine = created[i][:10]
            for rnd in range(5):
                for rid in mine:
                    r = self.call(tok, "collections.posts.update", {"where": {"id": rid, "views": rnd}, "data": {"views": rnd + 1}})
                    if r.status != 200 or len(r.body["value"]["docs"]) != 1:
                        raise AssertionError(repr(r))

        self.run_threads(updater)
        got = PG.sql("SELECT views, count(*) FROM posts WHERE tenant_id = '%s' GROUP BY views ORDER BY views" % tenant)
        self.assertEqual(got, [["0", str(self.THREADS * (per - 10))], ["5", str(self.THREADS * 10)]])

    def test_compare_and_set_increments_on_one_row(self):
        """8 runs increment one counter with update {where: {id, views: old}, data: {views: old + 1}}: an update that
        reports the row changed must have changed it, so the final value equals the number of successful updates."""
        tenant = new_tenant("cas")
        owner = mint(tenant)
        row = self.create(owner, {"title": "counter", "views": 0})
        per = 50
        wins = [0] * self.THREADS

        def worker(i):
            tok, calls = mint(tenant), 0
            for _ in range(per):
                for _attempt in range(200):
                    if calls >= 500:  # a fresh run id long before the per-run call quota
                        tok, calls = mint(tenant), 0
                    calls += 2
                    cur = self.ok(tok, "collections.posts.findOne", {"where": {"id": row["id"]}, "select": ["views"]})["views"]
                    upd = self.ok(tok, "collections.posts.update", {"where": {"id": row["id"], "views": cur}, "data": {"views": cur + 1}})
                    if upd["docs"]:
                        if upd["docs"][0]["views"] != cur + 1:
                            raise AssertionError("update answered %r" % upd)
                        wins[i] += 1
                        break

        self.run_threads(worker)
        final = int(PG.scalar("SELECT views FROM posts WHERE id = %d" % row["id"]))
        self.assertEqual(sum(wins), self.THREADS * per)
        self.assertEqual(final, sum(wins), "lost updates: %d successful compare-and-set updates, counter at %d" % (sum(wins), final))


# ---------------------------------------------------------------------------------------------------------------------
class CheckConfig(Base):
    """--check-config introspects the database: a missing table or column is an error naming its path."""

    def check(self, cfg):
        fd, path = tempfile.mkstemp(suffix=".json", prefix="sbtest-cfg-")
        with os.fdopen(fd, "w") as f:
            json.dump(cfg, f)
        try:
            return sbtest.run_broker_once(["--config", path, "--check-config"], sbtest.base_env())
        finally:
            os.unlink(path)

    def test_valid(self):
        rc, out, err = self.check(CONFIG)
        self.assertEqual(rc, 0, err)
        self.assertIn("configuration OK", out)

    def test_missing_things(self):
        base = "targets.app.collections.posts"
        cases = [
            (app_config(PG.url, {"table": "nope"}), '%s.table: no table "nope" in the database' % base),
            (app_config(PG.url, {"table": "public.nope"}), '%s.table: no table "public.nope" in the database' % base),
            (app_config(PG.url, {"key": "nokey"}), '%s.key: no column "nokey" in posts' % base),
            (app_config(PG.url, {"scope": {"org_id": "tenantId"}}), '%s.scope: no column "org_id" in posts' % base),
            (app_config(PG.url, {"columns": ["title", "nocol"]}), '%s.columns: no column "nocol" in posts' % base),
            (app_config(PG.url, ds_table="nostore"), 'targets.app.document_store.table: no table "nostore" in the database'),
            (app_config(PG.url, ds_table="posts"),
             "targets.app.document_store.table: posts needs the columns id and store (deploy/sql/document_store.sql)"),
        ]
        for cfg, msg in cases:
            with self.subTest(msg=msg):
                rc, out, err = self.check(cfg)
                self.assertEqual(rc, 1, out + err)
                self.assertIn(msg, err)
        # the broker itself refuses to start with such a configuration (run to completion: it must exit)
        fd, path = tempfile.mkstemp(suffix=".json", prefix="sbtest-cfg-")
        with os.fdopen(fd, "w") as f:
            json.dump(cases[0][0], f)
        try:
            rc, out, err = sbtest.run_broker_once(["--config", path], sbtest.base_env())
        finally:
            os.unlink(path)
        self.assertEqual(rc, 1, out + err)
        self.assertIn(cases[0][1], err)

    def test_unreachable_database(self):
        cfg = app_config("postgresql://postgres@127.0.0.1:%d/x?connect_timeout=2" % sbtest.free_port())
        t0 = time.monotonic()
        rc, out, err = self.check(cfg)
        # valid, but the database is down now: 3, not the 1 of a configuration error
        self.assertEqual(rc, 3, out + err)
        self.assertIn("database_url: cannot connect", err)
        self.assertLess(time.monotonic() - t0, 10)

    def test_allowlisted_columns(self):
        """columns limits what the guest may name; the key and scope columns stay readable."""
        cfg = app_config(PG.url, {"columns": ["title"]})
        with running_broker(cfg) as b:
            tenant = new_tenant()
            tok = mint(tenant, broker=b)
            self.broker = b
            try:
                doc = self.create(tok, {"title": "x"})
                self.assertEqual(sorted(doc.keys()), ["id", "tenant_id", "title"])
                r = self.call(tok, "collections.posts.find", {"where": {"views": 1}})
                self.assertError(r, 400, "bad_args", 'unknown field "views"')
                r = self.call(tok, "collections.posts.create", {"data": {"views": 1}})
                self.assertError(r, 400, "bad_args", 'unknown field "views"')
            finally:
                self.broker = None


# ---------------------------------------------------------------------------------------------------------------------
class Outage(Base):
    """PostgreSQL stopped under a running broker: data calls fail fast and closed, the rest keeps answering;
    after a restart data calls succeed again by themselves.

    These tests stop the server, so they run on a cluster of their own (pgfix.PgServer(own=True): initdb and
    pg_ctl on a free loopback port, whatever SB_TEST_PG_URL says), with the module's schema and a long-lived
    broker of their own (`home`, which lives through every outage and must recover from each)."""

    pg = None
    config = None
    home = None

    @classmethod
    def setUpClass(cls):
        cls.pg = pgfix.PgServer(own=True).start()
        try:
            load_schema(cls.pg)
            cls.config = app_config(cls.pg.url)
            cls.home = start_broker(cls.config)
        except Exception:
            cls.pg.close()
            raise

    @classmethod
    def tearDownClass(cls):
        shutdown(cls.home)
        cls.pg.close()

    def b(self):
        return self.broker or self.home

    def recovered(self, tok, broker=None):
        """Eight data calls in a row succeed (each worker has its own pool and reconnects on its own)."""
        b = broker or self.b()
        return all(b.rpc(tok, "collections.posts.find", {}).status == 200 for _ in range(8))

    def test_stop_and_restart(self):
        tenant = new_tenant("out")
        with running_broker(self.config, threads=2) as b:
            self.broker = b
            try:
                tok = mint(tenant, broker=b)
                self.create(tok, {"title": "before"})
                self.pg.stop_server("fast")
                try:
                    self.assertTrue(poll(lambda: b.public("GET", "/readyz").status == 503, 5), "readyz stayed 200")
                    r = b.public("GET", "/readyz")
                    self.assertEqual(r.body.get("database"), "down", r)
                    for enc in ENCODINGS:
                        for m, a in [("collections.posts.find", {}), ("collections.posts.create", {"data": {"title": "x"}}),
                                     ("store.notes.find", {}), ("collections.document_store.findOne", {"where": {"store": "notes"}})]:
                            t0 = time.monotonic()
                            r = self.call(tok, m, a, enc)
                            self.assertLess(time.monotonic() - t0, 2.0, "%s took too long" % m)
                            if r.status == 503:
                                self.assertError(r, 503, "unavailable", MSG_DB_DOWN, enc=enc)
                            else:
                                self.assertExec(r, enc=enc)
                        # other methods are unaffected
                        r = self.call(tok, "services.svc.fn", {}, enc)
                        self.assertError(r, 501, "not_implemented", "services dispatch is not implemented", enc=enc)
                        r = self.call(tok, "globals.site.get", {}, enc)
                        self.assertEqual((r.status, r.body), (200, {"ok": True, "value": {"name": "Demo"}}))
                        r = self.call(tok, "collections.posts.find", {"where": {"nope": 1}}, enc)
                        self.assertIn(r.status, (400, 503), r)
                    self.assertEqual(b.public("GET", "/healthz").status, 200)
                finally:
                    self.pg.start_server()
                t0 = time.monotonic()

                def works():
                    r = self.call(tok, "collections.posts.find", {"where": {"title": "before"}})
                    return r.status == 200 and len(r.body["value"]["docs"]) == 1 and self.recovered(tok)

                self.assertTrue(poll(works, 10, 0.1), "data calls did not recover:\n" + b.log()[-3000:])
                self.assertLess(time.monotonic() - t0, 10)
                self.create(tok, {"title": "after"})
                self.assertEqual(rows_of(tenant, self.pg), 2)
                self.assertTrue(poll(lambda: ready(b), 10))
                self.assertTrue(b.alive(), b.log()[-5000:])
            finally:
                self.broker = None
        # the module's broker recovers too
        self.assertTrue(poll(lambda: self.recovered(mint(new_tenant(), broker=self.home), self.home), 15),
                        self.home.log()[-3000:])

    def test_start_while_database_down(self):
        """A broker started while PostgreSQL is down stays up, answers data calls unavailable, and picks the
        database up (introspection included) once it is there."""
        self.pg.stop_server("fast")
        b = None
        try:
            b = sbtest.Broker(config=self.config, env={"SANDBOX_BROKER_THREADS": "2"}).start()
            self.broker = b
            self.assertIsNotNone(b.wait_for_event("pg.unreachable_at_start", 10), b.log()[-2000:])
            time.sleep(0.5)  # a few reconnect attempts
            self.assertTrue(b.alive(), b.log()[-5000:])
            tenant = new_tenant("late")
            tok = mint(tenant, broker=b)
            for enc in ENCODINGS:
                r = self.call(tok, "collections.posts.find", {}, enc)
                self.assertError(r, 503, "unavailable", MSG_DB_DOWN, enc=enc)
                r = self.call(tok, "globals.site.get", {}, enc)
                self.assertEqual(r.status, 200, r)
            self.assertEqual(b.public("GET", "/readyz").status, 503)
            self.pg.start_server()
            self.assertTrue(poll(lambda: self.recovered(tok), 10, 0.1), b.log()[-3000:])
            self.assertEqual(self.create(tok, {"title": "late"})["tenant_id"], tenant)
            self.assertTrue(b.alive(), b.log()[-5000:])
        finally:
            self.broker = None
            if not self.pg.running:
                self.pg.start_server()
            if b is not None:
                shutdown(b)
        self.assertTrue(poll(lambda: self.recovered(mint(new_tenant(), broker=self.home), self.home), 15),
                        self.home.log()[-3000:])

    def hold_lock(self, seconds):
        """A psql session that holds an exclusive lock on posts for `seconds`: the broker's statements wait on it."""
        url = self.pg.url + ("&" if "?" in self.pg.url else "?") + "application_name=sbtest-locker"
        p = subprocess.Popen(["psql", url, "-X", "-q", "-c",
                              "BEGIN; LOCK TABLE posts IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(%d); COMMIT;" % seconds],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.assertTrue(poll(lambda: self.pg.scalar("SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                                               "WHERE c.relname = 'posts' AND l.mode = 'AccessExclusiveLock' AND l.granted") == "1",
                             10), "the lock was not taken")
        return p

    def release_lock(self, p):
        """Ends the locking session on the server too (a killed psql leaves its backend in pg_sleep)."""
        p.kill()
        p.wait()
        if self.pg.running:
            self.pg.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'sbtest-locker'")

    def blocked_calls(self, tok, n):
        results = []

        def one(i):
            t0 = time.monotonic()
            try:
                r = self.call(tok, "collections.posts.find", {"where": {"title": "w%d" % i}}, ENCODINGS[i % 2])
            except Exception as e:  # the broker went away: reported by the caller with its log
                r = e
            results.append((r, time.monotonic() - t0))

        ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        return ts, results

    def test_statement_stuck_on_a_lock(self):
        """A statement that waits longer than the statement timeout (5 s) fails as execution_error; meanwhile other
        methods answer at once (the worker loop is not blocked)."""
        with running_broker(self.config, threads=1) as b:
            self.broker = b
            try:
                tok = mint(new_tenant(), broker=b)
                locker = self.hold_lock(20)
                try:
                    ts, results = self.blocked_calls(tok, 2)
                    time.sleep(0.5)
                    for enc in ENCODINGS:
                        t0 = time.monotonic()
                        r = self.call(tok, "globals.site.get", {}, enc)
                        self.assertEqual(r.status, 200, r)
                        self.assertLess(time.monotonic() - t0, 0.5)
                    for t in ts:
                        t.join(15)
                    self.assertEqual(len(results), 2)
                    self.assertTrue(b.alive(), b.log()[-5000:])
                    for r, dt in results:
                        self.assertNotIsInstance(r, Exception, b.log()[-5000:])
                        self.assertExec(r)
                        self.assertLess(dt, 9.0)
                        self.assertGreater(dt, 4.0)
                finally:
                    self.release_lock(locker)
                self.assertTrue(poll(lambda: self.recovered(tok), 10, 0.1), b.log()[-3000:])
            finally:
                self.broker = None

    def test_pg_dies_mid_statement(self):
        """Statements in flight when the server goes away answer unavailable or execution_error at once."""
        with running_broker(self.config, threads=1) as b:
            self.broker = b
            try:
                tok = mint(new_tenant(), broker=b)
                locker = self.hold_lock(30)
                try:
                    ts, results = self.blocked_calls(tok, 4)
                    time.sleep(0.5)
                    t0 = time.monotonic()
                    self.pg.stop_server("immediate")
                    for t in ts:
                        t.join(15)
                    self.assertEqual(len(results), 4)
                    self.assertLess(time.monotonic() - t0, 2.0)
                    self.assertTrue(b.alive(), b.log()[-5000:])
                    for r, _dt in results:
                        self.assertNotIsInstance(r, Exception, b.log()[-5000:])
                        if r.status == 503:
                            self.assertError(r, 503, "unavailable")
                        else:
                            self.assertExec(r)
                finally:
                    self.release_lock(locker)
                    if not self.pg.running:
                        self.pg.start_server()
                self.assertTrue(poll(lambda: self.recovered(tok), 10, 0.1), b.log()[-3000:])
            finally:
                self.broker = None
        self.assertTrue(poll(lambda: self.recovered(mint(new_tenant(), broker=self.home), self.home), 15),
                        self.home.log()[-3000:])


# ---------------------------------------------------------------------------------------------------------------------
class DeclaredTypes(Base):
    """Values are cast to the column's type without its modifier: an over-long value is refused, never cut;
    a uuid scope column compares as a uuid."""

    @classmethod
    def setUpClass(cls):
        PG.sql("CREATE TABLE codes (id bigserial PRIMARY KEY, tenant_id uuid NOT NULL, code varchar(3))")
        cfg = json.loads(json.dumps(CONFIG))
        cfg["targets"]["app"]["collections"]["codes"] = {"table": "codes", "key": "id", "scope": {"tenant_id": "tenantId"}}
        cls.broker = start_broker(cfg)

    @classmethod
    def tearDownClass(cls):
        shutdown(cls.broker)

    def test_varchar_is_not_truncated_and_uuid_scope_works(self):
        tenant = str(uuid.uuid4())
        caps = {"data": {"collections": {"codes": ALL_VERBS}}}
        tok = self.broker.mint_ok("run-" + uuid.uuid4().hex[:16], caps, target="app", scope={"tenantId": tenant})
        doc = self.create(tok, {"code": "abc"}, coll="codes")
        self.assertEqual((doc["code"], doc["tenant_id"]), ("abc", tenant))
        # "abcd" cast to varchar(3) would become "abc" and match: it must not
        got = self.find(tok, {"where": {"code": "abcd"}}, coll="codes")
        self.assertEqual(got["docs"], [])
        r = self.call(tok, "collections.codes.create", {"data": {"code": "abcd"}})
        self.assertError(r, 400, "bad_args")
        self.assertEqual(int(PG.scalar("SELECT count(*) FROM codes")), 1)


if __name__ == "__main__":
    sbtest.main()
