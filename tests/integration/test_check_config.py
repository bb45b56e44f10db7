"""--check-config: one exit status per kind of problem, each problem on a line of its own, the unit's
environment file read as the unit reads it, a fresh machine's missing log directory explained; a
--allow-down (the unit's ExecStartPre) that lets an outage pass and nothing else; and the lines a
SIGHUP logs.

Exit statuses (docs/config.md, "Checking a configuration"): 0 valid, 1 invalid, 2 usage, 3 a backend
down now, 4 a backend refused the credentials (the database's or Redis's, the same status), 5 the
database role lacks privileges.
"""
import json
import os
import shutil
import signal
import tempfile
import unittest

import pgfix
import redisfix
import sbtest

PG = pgfix.PgServer(own=True)  # its own cluster: pg_hba.conf is changed to ask for passwords
ROLE, ROLE_PW = "sbcheck", "right-db-password-0123"
REDIS_PW = "right-redis-password-0123"
TARGETS = json.dumps({"app": {"document_store": {"table": "document_store"}}})


def setUpModule():
    PG.start()
    with open(os.path.join(sbtest.SOURCE_DIR, "deploy", "sql", "document_store.sql")) as f:
        PG.sql(f.read())
    PG.sql("CREATE ROLE %s LOGIN PASSWORD '%s'; GRANT SELECT, INSERT, UPDATE, DELETE ON document_store TO %s; "
           "GRANT USAGE ON SEQUENCE document_store_id_seq TO %s" % (ROLE, ROLE_PW, ROLE, ROLE))
    hba = os.path.join(PG.tmp, "data", "pg_hba.conf")
    with open(hba) as f:
        rest = f.read()
    with open(hba, "w") as f:
        f.write("host all %s 127.0.0.1/32 scram-sha-256\n" % ROLE + rest)
    PG.sql("SELECT pg_reload_conf()")


def tearDownModule():
    PG.close()


def db_url(password):
    return "postgresql://%s:%s@127.0.0.1:%d/%s" % (ROLE, password, PG.port, PG.dbname)


class Statuses(sbtest.BrokerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.redis = redisfix.Node(password=REDIS_PW).start()

    @classmethod
    def tearDownClass(cls):
        cls.redis.cleanup()

    def check(self, db_pw=ROLE_PW, redis_pw=REDIS_PW, args=(), **extra):
        env = {"SANDBOX_BROKER_DATABASE_URL": db_url(db_pw), "SANDBOX_BROKER_TARGETS": TARGETS,
               "SANDBOX_BROKER_TOKEN_STORE": self.redis.url, "SANDBOX_BROKER_REDIS_PASSWORD": redis_pw}
        env.update(extra)
        return sbtest.run_broker_once(["--check-config", "--env-file", ""] + list(args), sbtest.base_env(env))

    def test_valid(self):
        rc, out, err = self.check()
        self.assertEqual((rc, out), (0, "configuration OK\n"), err)

    def test_a_wrong_password_is_the_same_status_for_the_database_and_redis(self):
        rc, out, err = self.check(db_pw="wrong-db-password")
        self.assertEqual(rc, 4, err)
        self.assertIn('sandbox-broker: credentials refused: database_url: cannot connect: ', err)
        self.assertIn('password authentication failed for user "%s"' % ROLE, err)
        rc2, out, err2 = self.check(redis_pw="wrong-redis-password")
        self.assertEqual(rc2, 4, err2)
        self.assertIn("sandbox-broker: credentials refused: token store: 127.0.0.1:%d: AUTH refused: WRONGPASS"
                      % self.redis.port, err2)
        for text in (err, err2, out):
            self.assertNotIn("wrong-db-password", text)
            self.assertNotIn("wrong-redis-password", text)
            self.assertNotIn(ROLE_PW, text)
            self.assertNotIn("configuration OK", text)

    def test_every_problem_on_its_own_line_and_the_first_kind_wins(self):
        audit = os.path.join(tempfile.gettempdir(), "sb-no-such-dir-%d" % os.getpid(), "audit.log")
        rc, out, err = self.check(db_pw="wrong", redis_pw="wrong", SANDBOX_BROKER_AUDIT=audit)
        lines = err.splitlines()
        self.assertEqual(len(lines), 3, err)
        self.assertTrue(lines[0].startswith("sandbox-broker: credentials refused: database_url: "), lines)
        self.assertTrue(lines[1].startswith("sandbox-broker: credentials refused: token store: "), lines)
        self.assertTrue(lines[2].startswith("sandbox-broker: invalid configuration: audit: cannot open %s: No such file "
                                            "or directory (the directory %s does not exist; make it: install -d -m 0750 -o "
                                            "sandbox-broker -g sandbox-broker %s)"
                                            % (audit, os.path.dirname(audit), os.path.dirname(audit))), lines)
        self.assertEqual(rc, 1, "an invalid configuration comes first")
        # down and refused: refused wins over an outage
        rc, out, err = self.check(redis_pw="wrong", SANDBOX_BROKER_DATABASE_URL="postgresql://%s@127.0.0.1:%d/x"
                                  % (ROLE, sbtest.closed_port()))
        self.assertEqual(rc, 4, err)
        self.assertIn("sandbox-broker: a backend is unreachable now: database_url: cannot connect", err)

    def test_down_is_3_and_offline_contacts_nothing(self):
        rc, out, err = self.check(SANDBOX_BROKER_TOKEN_STORE="redis://127.0.0.1:%d" % sbtest.closed_port())
        self.assertEqual(rc, 3, err)
        self.assertIn("sandbox-broker: a backend is unreachable now: token store: ", err)
        rc, out, err = self.check(db_pw="wrong", redis_pw="wrong", args=["--offline"])
        self.assertEqual((rc, out), (0, "configuration OK (offline: no backend contacted)\n"), err)

    def test_missing_privileges_is_5(self):
        PG.sql("REVOKE DELETE ON document_store FROM %s" % ROLE)
        try:
            rc, out, err = self.check()
            self.assertEqual(rc, 5, err)
            self.assertIn('sandbox-broker: missing privileges: database_url: the role "%s" lacks privileges' % ROLE, err)
        finally:
            PG.sql("GRANT DELETE ON document_store TO %s" % ROLE)

    def test_allow_down_accepts_an_outage_and_nothing_else(self):
        """The unit's ExecStartPre: a restart during an outage goes on, a refused password stops it."""
        rc, out, err = self.check(args=["--allow-down"], SANDBOX_BROKER_DATABASE_URL="postgresql://%s@127.0.0.1:%d/x"
                                  % (ROLE, sbtest.closed_port()))
        self.assertEqual((rc, out), (0, "configuration OK\n"), err)
        self.assertIn("sandbox-broker: a backend is unreachable now: database_url: cannot connect", err)
        self.assertIn("(--allow-down: not an error)", err)
        for kw in ({"db_pw": "wrong"}, {"redis_pw": "wrong"}):
            rc, out, err = self.check(args=["--allow-down"], **kw)
            self.assertEqual((rc, out), (4, ""), err)
        # a server that answers and refuses for another reason (here: a database that does not exist) is not an
        # outage: the check fails as the configuration's, --allow-down or not
        rc, out, err = self.check(args=["--allow-down"], SANDBOX_BROKER_DATABASE_URL="postgresql://%s:%s@127.0.0.1:%d/%s"
                                  % (ROLE, ROLE_PW, PG.port, "no_such_database_here"))
        self.assertEqual((rc, out), (1, ""), err)
        self.assertIn("sandbox-broker: invalid configuration: database_url: cannot connect", err)
        self.assertIn("no_such_database_here", err)
        rc, out, err = sbtest.run_broker_once(["--allow-down"], sbtest.base_env())
        self.assertEqual(rc, 2, err)
        self.assertIn("--allow-down goes with --check-config", err)


class EnvironmentFile(sbtest.BrokerTestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="sb-envfile-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write(self, text):
        path = os.path.join(self.tmp, "environment")
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_the_file_is_read_as_the_unit_reads_it(self):
        path = self.write("# comment\n; another\n\n  SANDBOX_BROKER_THREADS = 3 \nSANDBOX_BROKER_LOG_LEVEL=\"warn\"\n"
                          "SANDBOX_BROKER_QUOTA_CALLS='9'\n")
        rc, out, err = sbtest.run_broker_once(["--check-config", "--offline", "--env-file", path], sbtest.base_env())
        self.assertEqual((rc, out), (0, "configuration OK (offline: no backend contacted)\n"), err)
        self.assertIn("sandbox-broker: read 3 variable(s) from %s, as the unit does" % path, err)
        # what it sets is checked: a bad value there fails the check, naming the variable
        path = self.write("SANDBOX_BROKER_THREADS=100\n")
        rc, out, err = sbtest.run_broker_once(["--check-config", "--offline", "--env-file", path], sbtest.base_env())
        self.assertEqual(rc, 1, err)
        self.assertIn("SANDBOX_BROKER_THREADS", err)
        # a variable already in the environment wins (under the unit systemd has read the file, its way)
        path = self.write("SANDBOX_BROKER_THREADS=100\n")
        env = dict(sbtest.base_env(), SANDBOX_BROKER_THREADS="3")
        rc, out, err = sbtest.run_broker_once(["--check-config", "--offline", "--env-file", path], env)
        self.assertEqual((rc, out), (0, "configuration OK (offline: no backend contacted)\n"), err)
        # a misspelt name in it is refused like one in the environment
        path = self.write("SANDBOX_BROKER_THREAD=2\n")
        rc, out, err = sbtest.run_broker_once(["--check-config", "--offline", "--env-file", path], sbtest.base_env())
        self.assertEqual(rc, 1, err)
        self.assertIn("did you mean SANDBOX_BROKER_THREADS?", err)

    def test_malformed_and_missing_files(self):
        # a line it cannot read is named by number, never shown: it may be the continuation of a secret
        for text, needle, secret in (("# c\nSANDBOX_BROKER_ADMIN_SECRET=\\\nq8V+3kZr/5tYw 1eJ0nP2sQ==\n",
                                      "line 3: what stands before '=' is not a variable name", "q8V+3kZr"),
                                     ("X=1\nq8V+3kZr/5tYw 1eJ0nP2sQ\n", "line 2 has no '='", "q8V+3kZr")):
            path = self.write(text)
            rc, out, err = sbtest.run_broker_once(["--check-config", "--offline", "--env-file", path], sbtest.base_env())
            self.assertEqual(rc, 1, err)
            self.assertIn(needle, err)
            self.assertNotIn(secret, err + out)
        missing = os.path.join(self.tmp, "none")
        rc, out, err = sbtest.run_broker_once(["--check-config", "--env-file", missing], sbtest.base_env())
        self.assertEqual(rc, 1, err)
        self.assertIn("--env-file %s: No such file or directory" % missing, err)
        # it goes with --check-config only: the unit itself reads the file for a start
        rc, out, err = sbtest.run_broker_once(["--env-file", missing], sbtest.base_env())
        self.assertEqual(rc, 2, err)
        self.assertIn("--env-file goes with --check-config", err)


class ReloadLines(sbtest.BrokerTestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="sb-reload-lines-")
        self.path = os.path.join(self.tmp, "broker.json")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write(self, cfg):
        with open(self.path + ".new", "w") as f:
            f.write(cfg if isinstance(cfg, str) else json.dumps(cfg))
        os.replace(self.path + ".new", self.path)

    def hup(self, b, n):
        """one SIGHUP; returns the events it logged (after the first n lines), once its outcome line is there"""
        b.proc.send_signal(signal.SIGHUP)
        outcome = ("reload.applied", "reload.rejected")
        self.assertTrue(sbtest.poll(lambda: sum(1 for e in b.events() if e.get("event") in outcome) > n, 10), b.log())
        return [e for e in b.events() if e.get("event") in outcome + ("reload.restart_needed", "config.sources",
                                                                         "reopened")]

    def test_reload_lines(self):
        self.write({"log_level": "info", "threads": 2})
        with sbtest.Broker(args=["--config", self.path], env={"SANDBOX_BROKER_AUDIT": "off"}) as b:
            # the level goes to warn: the outcome line is still there
            self.write({"log_level": "warn", "threads": 2})
            evs = self.hup(b, 0)
            applied = [e for e in evs if e["event"] == "reload.applied"]
            self.assertEqual(len(applied), 1, b.log())
            self.assertEqual(applied[0]["logLevel"], "warn")
            # only the restart-only keys that changed, and no line twice per SIGHUP
            self.write({"log_level": "warn", "threads": 3, "quota_calls": 5, "timeline_max_events": 7})
            before = len(b.events())
            self.hup(b, 1)
            new = b.events()[before:]
            names = [e["event"] for e in new]
            self.assertEqual(len(names), len(set(names)), new)
            restart = [e for e in new if e["event"] == "reload.restart_needed"]
            self.assertEqual(len(restart), 1, new)
            self.assertEqual(restart[0]["keys"], "threads, timeline_max_events")
            # a file with two mistakes: one line, the reasons separated
            self.write({"log_level": "loud", "threads": "x"})
            before = len(b.events())
            self.hup(b, 2)
            rejected = [e for e in b.events()[before:] if e["event"] == "reload.rejected"]
            self.assertEqual(len(rejected), 1, b.log())
            self.assertIn("threads: expected an integer from 1 to 64; log_level: expected debug, info, warn or error",
                          rejected[0]["reason"])
            self.assertFalse(rejected[0]["reason"].endswith(" "), rejected[0])
            # nothing restart-only changed: no restart_needed line
            self.write({"log_level": "info", "threads": 2})
            before = len(b.events())
            self.hup(b, 3)
            self.assertNotIn("reload.restart_needed", [e["event"] for e in b.events()[before:]])
            self.assertEqual(b.stop(), 0)


if __name__ == "__main__":
    sbtest.main()
