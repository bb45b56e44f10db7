#!/usr/bin/python3
"""globals.<name>.get on a real PostgreSQL (issue 5, PROTOCOL.md section 6b "Globals", docs/config.md).

A global is a static value or one row of a table. One PostgreSQL per module
(pgfix.PgServer), a few settings tables, and one broker (2 workers) whose
target "app" declares only globals: the PostgreSQL pool exists for table
globals alone.

Covered: static values as before; a jsonb value column (nested values, both
encodings); the whole row with every mapped type and a mixed-case column;
a missing row is null; the scope clamp (tenant t1 never sees t2's row, a
token without the scope value is forbidden, an injection attempt through a
scope value reads nothing); a row selected by the scope alone; key and scope
parameters typed as their columns (uuid; a varchar(2) column cannot truncate
a longer scope value into a match); an ambiguous configuration and an
oversized value are execution_error; values are read on every call (no
cache); undeclared globals and set stay not_implemented; --check-config and
start-up validation (structure and schema, each naming its path); reload
rejects a table global with a missing column and applies a valid one;
PostgreSQL stopped (unavailable, static globals unaffected, recovery after a
restart) and down when the broker starts.
"""

import base64
import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pgfix  # noqa: E402
import sbtest  # noqa: E402
from sbtest import poll  # noqa: E402

ENCODINGS = ("json", "msgpack")

DDL = """
CREATE TABLE site_settings (
    tenant_id     text NOT NULL,
    name          text NOT NULL,
    settings      jsonb,
    title         varchar(64),
    enabled       boolean,
    quota         int,
    ratio         float8,
    price         numeric,
    updated       timestamptz,
    logo          bytea,
    "displayName" text,
    PRIMARY KEY (tenant_id, name)
);
CREATE TABLE tenant_profile (tenant_id text PRIMARY KEY, plan text, limits jsonb);
CREATE TABLE by_uuid (id uuid NOT NULL, org uuid NOT NULL, label text);
CREATE TABLE short_scope (tenant varchar(2) NOT NULL, name text NOT NULL, v text);
CREATE TABLE shared (name text NOT NULL, v text);
CREATE SCHEMA cfg;
CREATE TABLE cfg.flags (name text PRIMARY KEY, on_off boolean);
"""

ROW_FIELDS = ["tenant_id", "name", "settings", "title", "enabled", "quota", "ratio", "price", "updated", "logo", "displayName"]
UUID_ROW = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
ORG = "6f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f"

MSG_EXEC = "sandbox binding operation failed"
MSG_DB_DOWN = "the database is unavailable"
ISO_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z$")

GLOBALS = {
    "static": {"value": {"name": "Demo", "n": [1, 2.5, None, True]}},
    "site": {"table": "site_settings", "key": "name", "row": "site", "column": "settings", "scope": {"tenant_id": "tenantId"}},
    "siteRow": {"table": "site_settings", "key": "name", "row": "site", "scope": {"tenant_id": "tenantId"}},
    "title": {"table": "site_settings", "key": "name", "row": "site", "column": "title", "scope": {"tenant_id": "tenantId"}},
    "quirky": {"table": "site_settings", "key": "name", "row": "it's \"odd\"; DROP TABLE site_settings; --", "column": "title",
               "scope": {"tenant_id": "tenantId"}},
    "plan": {"table": "tenant_profile", "column": "plan", "scope": {"tenant_id": "tenantId"}},
    "limits": {"table": "tenant_profile", "column": "limits", "scope": {"tenant_id": "tenantId"}},
    "label": {"table": "by_uuid", "key": "id", "row": UUID_ROW, "column": "label", "scope": {"org": "orgId"}},
    "short": {"table": "short_scope", "key": "name", "row": "x", "column": "v", "scope": {"tenant": "tenantId"}},
    "shared": {"table": "shared", "key": "name", "row": "dup", "column": "v"},
    "flag": {"table": "cfg.flags", "key": "name", "row": "beta", "column": "on_off"},
}
CAPS = {"data": {"globals": {n: ["read", "write"] for n in list(GLOBALS) + ["nope"]}}, "services": ["svc"]}

PG = None
BROKER = None
CONFIG = None


def app_config(url, extra_globals=None):
    g = json.loads(json.dumps(GLOBALS))
    g.update(extra_globals or {})
    return {"database_url": url, "targets": {"app": {"globals": g}, "bare": {"files": {"root": "/tmp"}}}}


def ready(broker):
    return broker.public("GET", "/readyz").status == 200


SANITIZER = re.compile(r"AddressSanitizer|LeakSanitizer|runtime error:")


def no_sanitizer_report(text):
    """Under an ASan/UBSan build (SB_BIN_DIR=build-asan/bin) a report fails the test that produced it."""
    m = SANITIZER.search(text)
    if m:
        raise AssertionError("sanitizer report:\n" + text[max(0, m.start() - 200):m.start() + 4000])


def shutdown(b):
    """SIGTERM and wait; a sanitizer report in the broker's output, or an unclean exit, is a failure
    (tests/run.sh sets LSAN_OPTIONS with tests/lsan.supp for h2o's own per-thread pools)."""
    rc = b.stop(timeout=15)
    no_sanitizer_report(b.log())
    if rc != 0:
        raise AssertionError("broker exited with %s:\n%s" % (rc, b.log()[-3000:]))


def start_broker(config, threads=2):
    """A broker whose every worker has introspected the schema."""
    b = sbtest.Broker(config=config, env={"SANDBOX_BROKER_THREADS": str(threads)}).start()
    if not poll(lambda: sum(1 for ev in b.events() if ev.get("event") == "pg.ready") >= threads and ready(b), 15):
        shutdown(b)
        raise AssertionError("broker not ready:\n" + b.log()[-3000:])
    return b


@contextlib.contextmanager
def running_broker(config, threads=2):
    b = start_broker(config, threads)
    try:
        yield b
    finally:
        shutdown(b)


def q(s):
    return "'" + s.replace("'", "''") + "'"


def setUpModule():
    global PG, BROKER, CONFIG
    PG = pgfix.PgServer().start()
    try:
        PG.sql(DDL)
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


def mint(scope, broker=None, target="app", caps=CAPS):
    b = broker or BROKER
    return b.mint_ok("run-" + uuid.uuid4().hex[:16], caps, target=target, scope=scope)


def put_site(tenant, pg=None, **cols):
    """Inserts (or replaces) the tenant's "site" row of site_settings (in the module's database unless `pg`)."""
    cols = dict(cols)
    name = cols.pop("name", "site")
    names = ["tenant_id", "name"] + ['"%s"' % k if k != k.lower() else k for k in cols]
    vals = [q(tenant), q(name)] + [v for v in cols.values()]
    (pg or PG).sql("DELETE FROM site_settings WHERE tenant_id = %s AND name = %s; INSERT INTO site_settings (%s) VALUES (%s)"
                   % (q(tenant), q(name), ", ".join(names), ", ".join(vals)))


class Base(sbtest.BrokerTestCase):
    broker = None

    def b(self):
        return self.broker or BROKER

    def call(self, tok, method, args=None, enc="json"):
        return self.b().rpc(tok, method, args if args is not None else {}, enc=enc, timeout=30)

    def get(self, tok, name, enc="json"):
        r = self.call(tok, "globals.%s.get" % name, {}, enc)
        self.assertEqual(r.status, 200, "%r\n%s" % (r, self.b().log()[-2000:]))
        self.assertIs(r.body.get("ok"), True, r)
        self.assertEqual(set(r.body.keys()), {"ok", "value"}, r)
        return r.body["value"]

    def assertExec(self, r, enc=None):
        self.assertError(r, 500, "execution_error", MSG_EXEC, enc=enc)
        self.assertTrue(re.match(r"^[0-9a-f-]{36}$", r.body["error"].get("correlationId", "")), r)


# ---------------------------------------------------------------------------------------------------------------------
class Values(Base):
    """Static values as before; a table global answers its column (types mapped as for collections) or the row."""

    def test_static_value(self):
        tok = mint({"tenantId": new_tenant()})
        for enc in ENCODINGS:
            self.assertEqual(self.get(tok, "static", enc), {"name": "Demo", "n": [1, 2.5, None, True]})

    def test_jsonb_value_is_nested(self):
        tenant = new_tenant()
        settings = {"theme": {"colors": ["#fff", "#000"], "dark": True}, "n": 1.5, "empty": {}, "none": None, "s": "it's"}
        put_site(tenant, settings=q(json.dumps(settings)) + "::jsonb")
        tok = mint({"tenantId": tenant})
        for enc in ENCODINGS:
            self.assertEqual(self.get(tok, "site", enc), settings)
        # a scalar jsonb is a scalar value
        PG.sql("UPDATE site_settings SET settings = '\"plain\"' WHERE tenant_id = %s" % q(tenant))
        self.assertEqual(self.get(tok, "site"), "plain")
        PG.sql("UPDATE site_settings SET settings = NULL WHERE tenant_id = %s" % q(tenant))
        self.assertIsNone(self.get(tok, "site"))

    def test_whole_row(self):
        tenant = new_tenant()
        raw = bytes(range(256))
        put_site(tenant, settings="'{\"a\": [1, {\"b\": null}]}'", title=q("Hello — ünïcödé 😀"), enabled="true", quota="42",
                 ratio="0.25", price="'123456789012345678901234567890.5'", updated="'2024-01-02 03:04:05.5+00'",
                 logo="'\\x%s'::bytea" % raw.hex(), displayName=q("Mixed"))
        tok = mint({"tenantId": tenant})
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                row = self.get(tok, "siteRow", enc)
                self.assertEqual(sorted(row.keys()), sorted(ROW_FIELDS))
                self.assertEqual(row["tenant_id"], tenant)
                self.assertEqual(row["name"], "site")
                self.assertEqual(row["settings"], {"a": [1, {"b": None}]})
                self.assertEqual(row["title"], "Hello — ünïcödé 😀")
                self.assertIs(row["enabled"], True)
                self.assertEqual(row["quota"], 42)
                self.assertIsInstance(row["quota"], int)
                self.assertEqual(row["ratio"], 0.25)
                self.assertEqual(row["price"], "123456789012345678901234567890.5")
                self.assertEqual(row["updated"], "2024-01-02T03:04:05.5Z")
                self.assertTrue(ISO_Z.match(row["updated"]))
                self.assertEqual(row["displayName"], "Mixed")
                if enc == "msgpack":
                    self.assertEqual(row["logo"], raw)
                else:
                    self.assertEqual(base64.b64decode(row["logo"], validate=True), raw)
                # a single column answers just that value
                self.assertEqual(self.get(tok, "title", enc), "Hello — ünïcödé 😀")

    def test_missing_row_is_null(self):
        tok = mint({"tenantId": new_tenant("none")})
        for enc in ENCODINGS:
            for name in ("site", "siteRow", "title", "plan", "quirky"):
                self.assertIsNone(self.get(tok, name, enc), name)

    def test_row_selected_by_scope_alone(self):
        t1, t2 = new_tenant(), new_tenant()
        PG.sql("INSERT INTO tenant_profile VALUES (%s, 'pro', '{\"seats\": 5}'), (%s, 'free', NULL)" % (q(t1), q(t2)))
        tok1, tok2 = mint({"tenantId": t1}), mint({"tenantId": t2})
        for enc in ENCODINGS:
            self.assertEqual(self.get(tok1, "plan", enc), "pro")
            self.assertEqual(self.get(tok1, "limits", enc), {"seats": 5})
            self.assertEqual(self.get(tok2, "plan", enc), "free")
            self.assertIsNone(self.get(tok2, "limits", enc))

    def test_values_are_read_on_every_call(self):
        tenant = new_tenant()
        put_site(tenant, title=q("one"))
        tok = mint({"tenantId": tenant})
        self.assertEqual(self.get(tok, "title"), "one")
        PG.sql("UPDATE site_settings SET title = 'two' WHERE tenant_id = %s" % q(tenant))
        self.assertEqual(self.get(tok, "title"), "two")
        PG.sql("DELETE FROM site_settings WHERE tenant_id = %s" % q(tenant))
        self.assertIsNone(self.get(tok, "title"))

    def test_row_name_is_a_parameter(self):
        """The configured row name is a literal, whatever it contains."""
        tenant = new_tenant()
        put_site(tenant, name=GLOBALS["quirky"]["row"], title=q("quirky"))
        tok = mint({"tenantId": tenant})
        self.assertEqual(self.get(tok, "quirky"), "quirky")
        self.assertEqual(PG.scalar("SELECT count(*) FROM site_settings WHERE tenant_id = %s" % q(tenant)), "1")

    def test_schema_qualified_table(self):
        PG.sql("INSERT INTO cfg.flags VALUES ('beta', true) ON CONFLICT (name) DO UPDATE SET on_off = true")
        tok = mint({"tenantId": new_tenant()})
        for enc in ENCODINGS:
            self.assertIs(self.get(tok, "flag", enc), True)

    def test_parameters_take_the_column_types(self):
        """A uuid key and scope column compare as uuids (any case); a varchar(2) scope column is not truncated into a match."""
        PG.sql("DELETE FROM by_uuid; INSERT INTO by_uuid VALUES (%s, %s, 'org label')" % (q(UUID_ROW), q(ORG)))
        for enc in ENCODINGS:
            self.assertEqual(self.get(mint({"orgId": ORG}), "label", enc), "org label")
            self.assertEqual(self.get(mint({"orgId": ORG.upper()}), "label", enc), "org label")
            self.assertIsNone(self.get(mint({"orgId": str(uuid.uuid4())}), "label", enc))
            # a scope value the column type refuses is the host's problem: execution_error, not the guest's bad_args
            self.assertExec(self.call(mint({"orgId": "not-a-uuid"}), "globals.label.get", {}, enc), enc=enc)
        PG.sql("DELETE FROM short_scope; INSERT INTO short_scope VALUES ('t1', 'x', 'for t1')")
        self.assertEqual(self.get(mint({"tenantId": "t1"}), "short"), "for t1")
        for longer in ("t1x", "t1 ", "t10"):
            self.assertIsNone(self.get(mint({"tenantId": longer}), "short"), longer)

    def test_ambiguous_row_is_execution_error(self):
        PG.sql("DELETE FROM shared; INSERT INTO shared VALUES ('dup', 'a')")
        tok = mint({"tenantId": new_tenant()})
        self.assertEqual(self.get(tok, "shared"), "a")
        PG.sql("INSERT INTO shared VALUES ('dup', 'b')")
        try:
            for enc in ENCODINGS:
                self.assertExec(self.call(tok, "globals.shared.get", {}, enc), enc=enc)
            self.assertTrue(poll(lambda: "globals.shared: more than one row of shared matches" in self.b().log(), 5),
                            self.b().log()[-3000:])
        finally:
            PG.sql("DELETE FROM shared WHERE v = 'b'")
        self.assertEqual(self.get(tok, "shared"), "a")

    def test_value_above_the_cap(self):
        tenant = new_tenant()
        put_site(tenant, title="NULL", settings="jsonb_build_object('big', repeat('x', 800000))")
        tok = mint({"tenantId": tenant})
        for enc in ENCODINGS:
            self.assertExec(self.call(tok, "globals.site.get", {}, enc), enc=enc)
            self.assertExec(self.call(tok, "globals.siteRow.get", {}, enc), enc=enc)
        # just under the cap passes
        PG.sql("UPDATE site_settings SET settings = jsonb_build_object('big', repeat('x', 700000)) WHERE tenant_id = %s"
               % q(tenant))
        self.assertEqual(len(self.get(tok, "site", "msgpack")["big"]), 700000)


# ---------------------------------------------------------------------------------------------------------------------
class Scope(Base):
    """Tenant t1 never sees t2's row, whatever the token binds."""

    def test_tenants_see_their_own_rows(self):
        t1, t2 = new_tenant("a"), new_tenant("b")
        put_site(t1, settings="'{\"who\": \"t1\"}'", title=q("t1"))
        put_site(t2, settings="'{\"who\": \"t2\"}'", title=q("t2"))
        tok1, tok2 = mint({"tenantId": t1}), mint({"tenantId": t2})
        for enc in ENCODINGS:
            self.assertEqual(self.get(tok1, "site", enc), {"who": "t1"})
            self.assertEqual(self.get(tok2, "site", enc), {"who": "t2"})
            self.assertEqual(self.get(tok1, "siteRow", enc)["tenant_id"], t1)
            self.assertEqual(self.get(tok2, "siteRow", enc)["tenant_id"], t2)
        # t2's row gone: t2 reads null, never t1's row
        PG.sql("DELETE FROM site_settings WHERE tenant_id = %s" % q(t2))
        for enc in ENCODINGS:
            self.assertIsNone(self.get(tok2, "site", enc))
            self.assertIsNone(self.get(tok2, "siteRow", enc))
            self.assertEqual(self.get(tok1, "title", enc), "t1")

    def test_injection_through_a_scope_value(self):
        t1 = new_tenant("a")
        put_site(t1, title=q("secret"))
        for evil in ("%s' OR '1'='1" % t1, "' OR tenant_id IS NOT NULL --", t1 + "%", "%", t1.upper(), t1 + " "):
            with self.subTest(evil=evil):
                tok = mint({"tenantId": evil})
                for enc in ENCODINGS:
                    self.assertIsNone(self.get(tok, "title", enc))
                    self.assertIsNone(self.get(tok, "siteRow", enc))
        self.assertEqual(PG.scalar("SELECT title FROM site_settings WHERE tenant_id = %s" % q(t1)), "secret")

    def test_token_without_the_scope_value(self):
        for scope in ({}, {"orgId": ORG}, None):
            with self.subTest(scope=scope):
                b = self.b()
                if scope is None:
                    tok = b.mint_ok("run-" + uuid.uuid4().hex[:16], CAPS, target="app")
                else:
                    tok = mint(scope)
                for enc in ENCODINGS:
                    r = self.call(tok, "globals.site.get", {}, enc)
                    self.assertError(r, 403, "forbidden", 'the token binds no "tenantId" scope value', enc=enc)
                    # globals that bind no scope still answer, and so do static values
                    self.assertEqual(self.get(tok, "static", enc)["name"], "Demo")
                    self.get(tok, "flag", enc)


# ---------------------------------------------------------------------------------------------------------------------
class Wiring(Base):
    """What the target does not declare stays not_implemented; set is refused; grants still apply."""

    def test_undeclared_global(self):
        tok = mint({"tenantId": new_tenant()})
        for enc in ENCODINGS:
            r = self.call(tok, "globals.nope.get", {}, enc)
            self.assertError(r, 501, "not_implemented", "globals.nope.get has no host handler", enc=enc)

    def test_set_stays_not_implemented(self):
        tenant = new_tenant()
        put_site(tenant, title=q("keep"))
        tok = mint({"tenantId": tenant})
        for enc in ENCODINGS:
            for name in ("static", "site", "siteRow", "title", "nope"):
                r = self.call(tok, "globals.%s.set" % name, {"value": {"x": 1}}, enc)
                self.assertError(r, 501, "not_implemented",
                                 "globals.%s.set guest write is denied: a global is a singleton owned by the host" % name,
                                 enc=enc)
        self.assertEqual(PG.scalar("SELECT title FROM site_settings WHERE tenant_id = %s" % q(tenant)), "keep")

    def test_other_targets_and_no_target(self):
        tok = mint({"tenantId": new_tenant()}, target="bare")
        r = self.call(tok, "globals.site.get")
        self.assertError(r, 501, "not_implemented", "globals.site.get has no host handler")
        tok = BROKER.mint_ok("run-" + uuid.uuid4().hex[:16], CAPS)
        r = self.call(tok, "globals.site.get")
        self.assertError(r, 501, "not_implemented", "globals.site.get has no host handler")

    def test_grant_is_checked_first(self):
        tok = mint({"tenantId": new_tenant()}, caps={"data": {"globals": {"static": ["read"]}}})
        r = self.call(tok, "globals.site.get")
        self.assertEqual(r.status, 403, r)
        self.assertEqual(r.body["error"]["code"], "forbidden", r)

    def test_readyz_reports_the_database(self):
        r = BROKER.public("GET", "/readyz")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.body.get("database"), "up", r)


# ---------------------------------------------------------------------------------------------------------------------
def check_config(cfg):
    fd, path = tempfile.mkstemp(suffix=".json", prefix="sbtest-cfg-")
    with os.fdopen(fd, "w") as f:
        json.dump(cfg, f)
    try:
        rc, out, err = sbtest.run_broker_once(["--config", path, "--check-config"], sbtest.base_env())
    finally:
        os.unlink(path)
    no_sanitizer_report(err)
    return rc, out, err


class CheckConfig(Base):
    """Table globals are validated at start-up, on --check-config and on reload, each error naming its path."""

    def test_valid(self):
        rc, out, err = check_config(CONFIG)
        self.assertEqual(rc, 0, err)
        self.assertIn("configuration OK", out)

    def test_schema_mismatches(self):
        p = "targets.app.globals.g"
        base = {"table": "site_settings", "key": "name", "row": "site", "column": "settings", "scope": {"tenant_id": "tenantId"}}
        cases = [
            ({"table": "nope"}, '%s.table: no table "nope" in the database' % p),
            ({"table": "cfg.nope"}, '%s.table: no table "cfg.nope" in the database' % p),
            ({"key": "nokey"}, '%s.key: no column "nokey" in site_settings' % p),
            ({"column": "nocol"}, '%s.column: no column "nocol" in site_settings' % p),
            ({"scope": {"org_id": "tenantId"}}, '%s.scope: no column "org_id" in site_settings' % p),
        ]
        for change, msg in cases:
            g = dict(base)
            g.update(change)
            with self.subTest(msg=msg):
                rc, out, err = check_config(app_config(PG.url, {"g": g}))
                self.assertEqual(rc, 1, out + err)
                self.assertIn(msg, err)
        # the broker itself refuses to start with such a configuration
        g = dict(base, column="nocol")
        fd, path = tempfile.mkstemp(suffix=".json", prefix="sbtest-cfg-")
        with os.fdopen(fd, "w") as f:
            json.dump(app_config(PG.url, {"g": g}), f)
        try:
            rc, out, err = sbtest.run_broker_once(["--config", path], sbtest.base_env())
        finally:
            os.unlink(path)
        self.assertEqual(rc, 1, out + err)
        self.assertIn('%s.column: no column "nocol" in site_settings' % p, err)

    def test_structure(self):
        p = "targets.app.globals.g"
        cases = [
            ({"value": 1, "table": "site_settings"}, "%s: a static value or a table, not both" % p),
            ({"value": 1, "column": "x"}, "%s.column: only a table global takes it" % p),
            ({"value": 1, "scope": {"tenant_id": "tenantId"}}, "%s.scope: only a table global takes it" % p),
            ({}, '%s: expected a static "value" or a "table"' % p),
            ({"column": "settings"}, '%s: expected a static "value" or a "table"' % p),
            ({"table": "site_settings"}, "%s: a table global needs key and row, or a scope, to select its row" % p),
            ({"table": "Site"}, "%s.table: expected a lowercase SQL table name" % p),
            ({"table": "site_settings", "key": "name"}, "%s.row: key and row go together" % p),
            ({"table": "site_settings", "row": "x"}, "%s.key: key and row go together" % p),
            ({"table": "site_settings", "key": "name", "row": ""}, "%s.row: expected the key column's value" % p),
            ({"table": "site_settings", "key": "name", "row": 5}, "%s.row: expected the key column's value" % p),
            ({"table": "site_settings", "key": "name", "row": "x" * 1025}, "%s.row: expected the key column's value" % p),
            # the configuration parser refuses NUL before the targets see it
            ({"table": "site_settings", "key": "name", "row": "a\u0000b"}, "is not allowed without JSON_ALLOW_NUL"),
            ({"table": "site_settings", "key": "na me", "row": "x"}, "%s.key: expected a lowercase SQL column name" % p),
            ({"table": "site_settings", "key": "name", "row": "x", "column": "a;b"},
             "%s.column: expected a lowercase SQL column name" % p),
            ({"table": "site_settings", "scope": {"tenant_id": "bad key!"}}, "%s.scope.tenant_id: expected a scope key" % p),
            ({"table": "site_settings", "key": "name", "row": "x", "colum": "x"}, "%s.colum: unknown key" % p),
        ]
        for g, msg in cases:
            with self.subTest(msg=msg):
                rc, out, err = check_config(app_config(PG.url, {"g": g}))
                self.assertEqual(rc, 1, out + err)
                self.assertIn(msg, err)

    def test_no_database_url(self):
        cfg = app_config(PG.url)
        del cfg["database_url"]
        rc, out, err = check_config(cfg)
        self.assertEqual(rc, 1, out + err)
        self.assertIn("database_url: targets declare collections, a document store or table globals, but no database is "
                      "configured", err)
        # static globals alone need no database
        cfg = {"targets": {"app": {"globals": {"static": GLOBALS["static"]}}}}
        rc, out, err = check_config(cfg)
        self.assertEqual(rc, 0, out + err)

    def test_unreachable_database(self):
        rc, out, err = check_config(app_config("postgresql://postgres@127.0.0.1:%d/x?connect_timeout=2" % sbtest.free_port()))
        # valid, but the database is down now: 3, not the 1 of a configuration error
        self.assertEqual(rc, 3, out + err)
        self.assertIn("database_url: cannot connect", err)


class Reload(Base):
    """SIGHUP validates table globals against the database like start-up."""

    def rewrite(self, b, cfg):
        path = os.path.join(b._tmpdir, "config.json")
        with open(path + ".new", "w") as f:
            json.dump(cfg, f)
        os.replace(path + ".new", path)

    def hup_and_wait(self, b, event):
        before = b.log().count('"event":"%s"' % event)
        b.proc.send_signal(signal.SIGHUP)
        self.assertTrue(poll(lambda: b.log().count('"event":"%s"' % event) > before, 10), b.log()[-3000:])

    def test_reload(self):
        tenant = new_tenant()
        put_site(tenant, title=q("site title"))
        put_site(tenant, name="other", title=q("other title"))
        with running_broker(CONFIG) as b:
            self.broker = b
            try:
                tok = mint({"tenantId": tenant}, broker=b)
                self.assertEqual(self.get(tok, "title"), "site title")
                # a missing column: rejected whole, naming the path; the running configuration stays
                bad = app_config(PG.url, {"title": dict(GLOBALS["title"], column="nocol")})
                self.rewrite(b, bad)
                self.hup_and_wait(b, "reload.rejected")
                self.assertIn('targets.app.globals.title.column: no column \\"nocol\\" in site_settings', b.log())
                self.assertEqual(self.get(tok, "title"), "site title")
                # a valid change is applied (every worker switches at its next turn and introspects again)
                good = app_config(PG.url, {"title": dict(GLOBALS["title"], row="other")})
                self.rewrite(b, good)
                self.hup_and_wait(b, "reload.applied")
                self.assertTrue(poll(lambda: all(self.call(tok, "globals.title.get").body.get("value") == "other title"
                                                 for _ in range(6)), 10), b.log()[-3000:])
            finally:
                self.broker = None


# ---------------------------------------------------------------------------------------------------------------------
class Outage(Base):
    """PostgreSQL down: table globals answer unavailable, static ones keep answering; recovery by itself.

    These tests stop the server, so they run on a cluster of their own (pgfix.PgServer(own=True): initdb and
    pg_ctl on a free loopback port, whatever SB_TEST_PG_URL says), with the module's tables and a long-lived
    broker of their own (`home`, which lives through every outage and must be ready again after each)."""

    pg = None
    config = None
    home = None

    @classmethod
    def setUpClass(cls):
        cls.pg = pgfix.PgServer(own=True).start()
        try:
            cls.pg.sql(DDL)
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

    def test_stop_and_restart(self):
        tenant = new_tenant("out")
        put_site(tenant, pg=self.pg, title=q("up again"))
        with running_broker(self.config) as b:
            self.broker = b
            try:
                tok = mint({"tenantId": tenant}, broker=b)
                self.assertEqual(self.get(tok, "title"), "up again")
                self.pg.stop_server("fast")
                try:
                    self.assertTrue(poll(lambda: b.public("GET", "/readyz").status == 503, 5), "readyz stayed 200")
                    for enc in ENCODINGS:
                        for name in ("title", "siteRow", "plan"):
                            t0 = time.monotonic()
                            r = self.call(tok, "globals.%s.get" % name, {}, enc)
                            self.assertLess(time.monotonic() - t0, 2.0)
                            self.assertError(r, 503, "unavailable", MSG_DB_DOWN, enc=enc)
                        self.assertEqual(self.get(tok, "static", enc)["name"], "Demo")
                        r = self.call(tok, "globals.title.set", {"value": 1}, enc)
                        self.assertError(r, 501, "not_implemented", enc=enc)
                        r = self.call(tok, "services.svc.fn", {}, enc)
                        self.assertError(r, 501, "not_implemented", "services dispatch is not implemented", enc=enc)
                finally:
                    self.pg.start_server()

                def works():
                    return all(b.rpc(tok, "globals.title.get", {}).body.get("value") == "up again" for _ in range(6))

                self.assertTrue(poll(works, 10, 0.1), "globals did not recover:\n" + b.log()[-3000:])
                self.assertTrue(b.alive(), b.log()[-5000:])
            finally:
                self.broker = None
        self.assertTrue(poll(lambda: ready(self.home), 15), self.home.log()[-3000:])

    def test_start_while_database_down(self):
        tenant = new_tenant("late")
        put_site(tenant, pg=self.pg, title=q("late title"))
        self.pg.stop_server("fast")
        b = None
        try:
            b = sbtest.Broker(config=self.config, env={"SANDBOX_BROKER_THREADS": "2"}).start()
            self.broker = b
            self.assertIsNotNone(b.wait_for_event("pg.unreachable_at_start", 10), b.log()[-2000:])
            tok = mint({"tenantId": tenant}, broker=b)
            for enc in ENCODINGS:
                r = self.call(tok, "globals.title.get", {}, enc)
                self.assertError(r, 503, "unavailable", MSG_DB_DOWN, enc=enc)
                self.assertEqual(self.get(tok, "static", enc)["name"], "Demo")
            self.pg.start_server()

            def works():
                return all(b.rpc(tok, "globals.title.get", {}).body.get("value") == "late title" for _ in range(6))

            self.assertTrue(poll(works, 10, 0.1), b.log()[-3000:])
        finally:
            self.broker = None
            if not self.pg.running:
                self.pg.start_server()
            if b is not None:
                shutdown(b)
        self.assertTrue(poll(lambda: ready(self.home), 15), self.home.log()[-3000:])


if __name__ == "__main__":
    sbtest.main()
