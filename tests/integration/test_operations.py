"""Running the broker the way an operator lives with it: misspelt and overriding environment
variables, --check-config against what start-up opens, --offline for a database outage, signals an
operator (or logrotate) sends, rotation of the log and audit files with the shipped logrotate file,
listener failures, and what the binary says about itself (--help, --version, /metrics)."""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import sbtest

DEPLOY = os.path.join(sbtest.SOURCE_DIR, "deploy")
LOGROTATE = shutil.which("logrotate") or "/usr/sbin/logrotate"


def events_of(text):
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        data = f.read()
    if data:
        # every line whole: the file ends with a newline and each line parses
        assert data.endswith("\n"), repr(data[-200:])
    return [json.loads(l) for l in data.splitlines()]


def audit_calls(path):
    """The call records of an audit file, without the chain's own records (docs/audit.md)."""
    return [l for l in read_lines(path) if l["event"] == "audit"]


def audit_verify(*paths):
    p = subprocess.run([sbtest.BROKER_BIN, "audit-verify"] + list(paths), capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


class Environment(sbtest.BrokerTestCase):
    def run_broker(self, args=(), env=None):
        return sbtest.run_broker_once(list(args), sbtest.base_env(env))

    def test_misspelt_variable_is_refused_with_the_nearest_name(self):
        for bad, near in (("SANDBOX_BROKER_TOKENSTORE", "SANDBOX_BROKER_TOKEN_STORE"),
                          ("SANDBOX_BROKER_THREAD", "SANDBOX_BROKER_THREADS"),
                          ("SANDBOX_BROKER_ADMIN_SECRT", "SANDBOX_BROKER_ADMIN_SECRET"),
                          ("SANDBOX_BROKER_DATABASEURL", "SANDBOX_BROKER_DATABASE_URL"),
                          ("SANDBOX_BROKER_audit", "SANDBOX_BROKER_AUDIT")):
            for args in ((), ("--check-config",), ("--check-config", "--offline")):
                with self.subTest(var=bad, args=args):
                    rc, out, err = self.run_broker(args, {bad: "redis://:hunter2-secret@127.0.0.1:6379"})
                    self.assertEqual(rc, 1, err)
                    self.assertIn("env %s: not a configuration variable; did you mean %s?" % (bad, near), err)
                    # names only: the value never appears
                    self.assertNotIn("hunter2", out + err)

    def test_every_known_variable_is_accepted(self):
        rc, out, _ = self.run_broker(["--print-config-keys"])
        self.assertEqual(rc, 0)
        names = [line.split()[1] for line in out.splitlines()]
        self.assertIn("SANDBOX_BROKER_TOKEN_STORE", names)
        self.assertIn("SANDBOX_BROKER_ADMIN_SECRET", names)
        # the unknown-name check must not refuse the table's own names
        env = {"SANDBOX_BROKER_LOG_LEVEL": "info", "SANDBOX_BROKER_MAX_CONNECTIONS": "100",
               "SANDBOX_BROKER_ADMIN_SECRET_FILE": None}
        rc, out, err = self.run_broker(["--check-config", "--offline"], env)
        self.assertEqual(rc, 0, err)

    def test_the_start_says_which_settings_came_from_the_environment(self):
        d = tempfile.mkdtemp(prefix="sb-env-")
        try:
            path = os.path.join(d, "broker.json")
            with open(path, "w") as f:
                json.dump({"log_level": "warn", "threads": 1, "quota_calls": 7}, f)
            env = {"SANDBOX_BROKER_LOG_LEVEL": "info", "SANDBOX_BROKER_QUOTA_CALLS": "9"}
            with sbtest.Broker(env=env, args=["--config", path]) as b:
                ev = b.wait_for_event("config.sources")
                self.assertIsNotNone(ev, b.log())
                names = ev["env"].split()
                for n in ("SANDBOX_BROKER_LOG_LEVEL", "SANDBOX_BROKER_QUOTA_CALLS", "SANDBOX_BROKER_LISTEN",
                          "SANDBOX_BROKER_ADMIN_LISTEN", "SANDBOX_BROKER_ADMIN_SECRET"):
                    self.assertIn(n, names)
                self.assertNotIn("SANDBOX_BROKER_THREADS", names)
                # the file's keys the environment replaced: editing them in the file changes nothing
                self.assertEqual(ev["overridden"].split(), ["quota_calls", "log_level"])
                self.assertEqual(ev["file"], path)
                # never a value
                self.assertNotIn(sbtest.ADMIN_SECRET, b.log())
                self.assertNotIn('"9"', json.dumps(ev))
                # a reload says it again, so an operator who edited the file sees why nothing changed
                b.proc.send_signal(signal.SIGHUP)
                self.assertTrue(sbtest.poll(lambda: b.log().count('"event":"config.sources"') == 2, 10), b.log())
        finally:
            shutil.rmtree(d, ignore_errors=True)


class CheckConfig(sbtest.BrokerTestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="sb-check-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_broker(self, args=(), env=None):
        return sbtest.run_broker_once(list(args), sbtest.base_env(env))

    def test_an_audit_file_that_cannot_be_opened_fails_the_check_and_the_start_names_it(self):
        path = os.path.join(self.tmp, "missing-dir", "audit.log")
        for args in (["--check-config"], ["--check-config", "--offline"], []):
            with self.subTest(args=args):
                rc, out, err = self.run_broker(args, {"SANDBOX_BROKER_AUDIT": path})
                self.assertEqual(rc, 1, (out, err))
                self.assertIn("audit: cannot open %s: No such file or directory" % path, err)
                self.assertNotIn("configuration OK", out)
        # a directory where the file should be
        rc, out, err = self.run_broker(["--check-config", "--offline"], {"SANDBOX_BROKER_AUDIT": self.tmp})
        self.assertEqual(rc, 1, err)
        self.assertIn("audit: cannot open %s: Is a directory" % self.tmp, err)
        # the log file likewise
        rc, out, err = self.run_broker(["--check-config", "--offline"], {"SANDBOX_BROKER_LOG_FILE": path})
        self.assertEqual(rc, 1, err)
        self.assertIn("log_file: cannot open %s: No such file or directory" % path, err)
        rc, out, err = self.run_broker([], {"SANDBOX_BROKER_LOG_FILE": path})
        self.assertEqual(rc, 1, err)
        self.assertIn("log_file: cannot open %s: No such file or directory" % path, err)
        # an openable path passes both
        ok = os.path.join(self.tmp, "audit.log")
        rc, out, err = self.run_broker(["--check-config", "--offline"], {"SANDBOX_BROKER_AUDIT": ok})
        self.assertEqual(rc, 0, err)

    def database_env(self, url):
        return {"SANDBOX_BROKER_DATABASE_URL": url,
                "SANDBOX_BROKER_TARGETS": json.dumps({"app": {"document_store": {"table": "document_store"}}})}

    def test_a_database_that_is_down_is_not_a_configuration_error(self):
        port = sbtest.closed_port()
        env = self.database_env("postgresql://sandbox_broker@127.0.0.1:%d/app" % port)
        # online: valid, but a backend is down now: exit 3, said as such
        rc, out, err = self.run_broker(["--check-config"], env)
        self.assertEqual(rc, 3, (out, err))
        self.assertIn("a backend is unreachable now", err)
        self.assertIn("database_url: cannot connect", err)
        self.assertNotIn("invalid configuration", err)
        # offline (the unit's ExecStartPre): nothing contacted, exit 0
        rc, out, err = self.run_broker(["--check-config", "--offline"], env)
        self.assertEqual(rc, 0, (out, err))
        self.assertIn("configuration OK (offline: no backend contacted)", out)

    def test_offline_still_refuses_what_is_wrong(self):
        # a target that needs a database, and none configured
        env = {"SANDBOX_BROKER_TARGETS": json.dumps({"app": {"document_store": {"table": "document_store"}}})}
        rc, out, err = self.run_broker(["--check-config", "--offline"], env)
        self.assertEqual(rc, 1, err)
        self.assertIn("database_url: targets declare collections", err)
        # a connection string libpq cannot parse: a configuration error, found without connecting,
        # and libpq's message (which may repeat part of a password) is not quoted
        env = self.database_env("host=127.0.0.1 password")
        for args in (["--check-config", "--offline"], ["--check-config"], []):
            with self.subTest(args=args):
                rc, out, err = self.run_broker(args, env)
                self.assertEqual(rc, 1, err)
                self.assertIn("database_url: not a valid PostgreSQL connection string", err)
        rc, out, err = self.run_broker(["--check-config", "--offline"], {"SANDBOX_BROKER_THREADS": "0"})
        self.assertEqual(rc, 1, err)
        self.assertIn("threads: expected an integer from 1 to 64", err)

    def test_offline_needs_check_config(self):
        rc, out, err = self.run_broker(["--offline"])
        self.assertEqual(rc, 2, err)
        self.assertIn("--offline goes with --check-config", err)


class Signals(sbtest.BrokerTestCase):
    def test_operator_signals_do_not_kill_it(self):
        with sbtest.Broker() as b:
            token = b.mint_ok("sig-run", {"services": ["svc"]})
            for sig, name in ((signal.SIGUSR1, None), (signal.SIGUSR2, "SIGUSR2"), (signal.SIGALRM, "SIGALRM"),
                              (signal.SIGPIPE, None), (signal.SIGXFSZ, None), (signal.SIGUSR1, None)):
                with self.subTest(signal=sig):
                    b.proc.send_signal(sig)
                    if name is not None:
                        self.assertTrue(sbtest.poll(lambda: any(e.get("event") == "signal.ignored" and
                                                                e.get("signal") == name for e in b.events()), 5),
                                        b.log())
                    self.assertEqual(b.rpc(token, "services.svc.fn").status, 501)
                    self.assertTrue(b.alive(), b.log())
            # SIGUSR1 reopens (nothing to reopen on stderr, and it says so)
            self.assertTrue(sbtest.poll(lambda: b.log().count('"event":"reopened"') == 2, 5), b.log())
            self.assertEqual(b.stop(), 0)


class Rotation(sbtest.BrokerTestCase):
    """mv, then SIGUSR1 (or SIGHUP): new lines land in the new file, every line lands whole in one of
    the two, and none is lost."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="sb-rotate-")
        self.audit = os.path.join(self.dir, "audit.log")
        self.logf = os.path.join(self.dir, "broker.log")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, env=None):
        """A broker logging to self.logf (so its ports come from that file, not stderr)."""
        full = sbtest.base_env(dict({"SANDBOX_BROKER_AUDIT": self.audit, "SANDBOX_BROKER_LOG_FILE": self.logf,
                                     "SANDBOX_BROKER_LOG_CALLS": "false"}, **(env or {})))
        self.proc = subprocess.Popen([sbtest.BROKER_BIN], env=full, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.addCleanup(self.kill)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ports = {e["listener"]: e["port"] for e in self.log_events() if e.get("event") == "listening"}
            if "public" in ports and "admin" in ports:
                b = sbtest.Broker()
                b.port, b.admin_port = ports["public"], ports["admin"]
                return b
            self.assertIsNone(self.proc.poll(), self.proc.stderr.read().decode())
            time.sleep(0.05)
        self.fail("no listening lines in %s" % self.logf)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stderr.close()

    def log_events(self, *suffixes):
        out = []
        for s in suffixes or ("",):
            out += read_lines(self.logf + s)
        return out

    def wait_reopened(self, n):
        self.assertTrue(sbtest.poll(lambda: sum(1 for e in self.log_events("", ".1", ".2")
                                                if e.get("event") == "reopened") >= n, 10),
                        self.log_events("", ".1", ".2"))

    def wait_audit_lines(self, path, n):
        """The audit writer is a thread of its own: wait until n lines are on disk."""
        self.assertTrue(sbtest.poll(lambda: len(audit_calls(path)) >= n, 10), read_lines(path))

    def calls(self, b, token, phase, n):
        for _ in range(n):
            self.assertEqual(b.rpc(token, "services.%s.fn" % phase).status, 501)

    def rotate(self, sig):
        b = self.start()
        token = b.mint_ok("rot-run", {"services": ["one", "two", "three"]})
        self.calls(b, token, "one", 40)
        self.wait_audit_lines(self.audit, 40)
        os.rename(self.audit, self.audit + ".1")
        os.rename(self.logf, self.logf + ".1")
        self.calls(b, token, "two", 40)  # still into the renamed files: the broker holds them open
        self.proc.send_signal(sig)
        self.wait_reopened(1)
        self.calls(b, token, "three", 40)
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(30), 0)
        old, new = audit_calls(self.audit + ".1"), audit_calls(self.audit)
        # the chain goes on across the reopen (SIGUSR1: "rotate", SIGHUP: "reload")
        rc, out = audit_verify(self.audit + ".1", self.audit)
        self.assertEqual(rc, 0, out)
        self.assertEqual(read_lines(self.audit + ".1")[-1]["reason"], "rotate" if sig == signal.SIGUSR1 else "reload")
        methods = [l["method"] for l in old + new]
        # none lost, none twice
        self.assertEqual(sorted(methods), sorted(["services.one.fn"] * 40 + ["services.two.fn"] * 40 +
                                                 ["services.three.fn"] * 40))
        self.assertEqual(len({l["cid"] for l in old + new}), 120)
        # after the reopen, every line lands in the new file
        self.assertEqual([l["method"] for l in new if l["method"] == "services.three.fn"], ["services.three.fn"] * 40)
        self.assertNotIn("services.three.fn", [l["method"] for l in old])
        self.assertGreater(len(old), 0)
        # the log too: the start in the old file, the reopen and the shutdown in the new one
        self.assertIn("started", [e["event"] for e in self.log_events(".1")])
        self.assertIn("reopened", [e["event"] for e in self.log_events()])
        self.assertIn("stopped", [e["event"] for e in self.log_events()])
        self.assertEqual(os.stat(self.audit).st_mode & 0o777, 0o600)

    def test_sigusr1_reopens_the_audit_and_log_files(self):
        self.rotate(signal.SIGUSR1)

    def test_sighup_reopens_them_too(self):
        self.rotate(signal.SIGHUP)

    def test_a_reopen_that_fails_keeps_the_old_file(self):
        b = self.start()
        token = b.mint_ok("rot-fail", {"services": ["a", "b"]})
        os.rename(self.audit, self.audit + ".1")
        os.mkdir(self.audit)  # the path is now a directory: the reopen fails
        self.proc.send_signal(signal.SIGUSR1)
        self.assertTrue(sbtest.poll(lambda: any(e.get("event") == "reopen.failed" for e in self.log_events()), 10))
        ev = [e for e in self.log_events() if e.get("event") == "reopen.failed"][0]
        self.assertEqual(ev["reason"], "audit: cannot open %s: Is a directory" % self.audit)
        self.calls(b, token, "b", 5)
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(30), 0)
        self.assertEqual([l["method"] for l in audit_calls(self.audit + ".1")], ["services.b.fn"] * 5)

    @unittest.skipUnless(os.path.exists(LOGROTATE), "logrotate is not installed")
    def test_the_shipped_logrotate_file(self):
        """deploy/logrotate/sandbox-broker, run by logrotate for real, through its branch for a machine without
        systemd; only its paths, the owner of the new files and the user whose brokers get the signal are
        rewritten."""
        with open(os.path.join(DEPLOY, "logrotate", "sandbox-broker")) as f:
            conf = f.read()
        self.assertRegex(conf, r"(?m)^\s*if \[ -d /run/systemd/system \]; then\n\s*systemctl kill --kill-whom=main "
                               r"--signal=SIGUSR1 'sandbox-broker\*\.service' .*\n\s*else\n",
                         "with systemd, the postrotate command sends SIGUSR1 to the units' main processes")
        self.assertFalse(os.path.isdir("/run/systemd/system"), "this test takes the branch without systemd")
        # without systemd: to the service user's brokers; here the one this test started (as root)
        post = re.search(r"^\s*pkill -USR1 -x -u sandbox-broker sandbox-broker .*$", conf, re.M)
        self.assertIsNotNone(post, "without systemd, the postrotate command signals the service user's brokers")
        self.assertIn("/var/log/sandbox-broker/*.log {", conf)
        b = self.start()
        token = b.mint_ok("lr-run", {"services": ["before", "after"]})
        self.calls(b, token, "before", 10)
        self.wait_audit_lines(self.audit, 10)  # notifempty: an empty file would not be rotated
        conf = conf[:post.start()] + "        kill -USR1 %d" % self.proc.pid + conf[post.end():]
        conf = conf.replace("/var/log/sandbox-broker/", self.dir + "/")
        conf = conf.replace("create 0600 sandbox-broker sandbox-broker", "create 0600 root root")
        path = os.path.join(self.dir, "logrotate.conf")
        with open(path, "w") as f:
            f.write(conf)
        os.chmod(path, 0o644)
        p = subprocess.run([LOGROTATE, "--force", "--state", os.path.join(self.dir, "state"), path],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout)
        self.wait_reopened(1)
        self.calls(b, token, "after", 10)
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(30), 0)
        # delaycompress: the rotated files are .1, uncompressed; the new ones were created by logrotate
        old, new = audit_calls(self.audit + ".1"), audit_calls(self.audit)
        self.assertEqual(audit_verify(self.audit + ".1", self.audit)[0], 0)
        self.assertEqual([l["method"] for l in old], ["services.before.fn"] * 10)
        self.assertEqual([l["method"] for l in new], ["services.after.fn"] * 10)
        self.assertIn("started", [e["event"] for e in self.log_events(".1")])
        self.assertIn("stopped", [e["event"] for e in self.log_events()])


class Listeners(sbtest.BrokerTestCase):
    def test_listen_failure_names_the_address_in_one_line(self):
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            port = s.getsockname()[1]
            for key, what in (("SANDBOX_BROKER_LISTEN", "public"), ("SANDBOX_BROKER_ADMIN_LISTEN", "admin")):
                with self.subTest(listener=what):
                    rc, out, err = sbtest.run_broker_once([], sbtest.base_env({key: "127.0.0.1:%d" % port}))
                    self.assertEqual(rc, 1, err)
                    failed = [e for e in events_of(err) if e.get("event") == "listen.failed"]
                    self.assertEqual(len(failed), 1, err)
                    self.assertEqual(failed[0]["listener"], what)
                    self.assertEqual(failed[0]["address"], "127.0.0.1:%d" % port)
                    self.assertEqual(failed[0]["step"], "bind")
                    self.assertEqual(failed[0]["error"], "Address already in use")
                    # one line for the one event: nothing else claims the start failed
                    self.assertEqual([e["event"] for e in events_of(err) if e.get("level") == "error"], ["listen.failed"])
        port6 = sbtest.closed_port(socket.AF_INET6, "::1")
        rc, out, err = sbtest.run_broker_once([], sbtest.base_env({"SANDBOX_BROKER_LISTEN": "[::1]:%d" % port6}))
        self.assertEqual(rc, 1, err)
        failed = [e for e in events_of(err) if e.get("event") == "listen.failed"]
        self.assertEqual(failed[0]["address"], "[::1]:%d" % port6, err)


class Inspection(sbtest.BrokerTestCase):
    def test_help_lists_every_flag_and_subcommand(self):
        rc, out, err = sbtest.run_broker_once(["--help"], sbtest.base_env())
        self.assertEqual(rc, 0)
        # every argument main.c compares against, read from the source so a new flag cannot hide
        with open(os.path.join(sbtest.SOURCE_DIR, "broker", "main.c")) as f:
            src = f.read()
        flags = set(re.findall(r'strcmp\(argv\[i\], "(-[-a-z]+)"\)', src))
        subcommands = set(re.findall(r'strcmp\(argv\[1\], "([a-z-]+)"\)', src))
        self.assertTrue({"--config", "--check-config", "--offline", "--version", "--help", "-h",
                         "--print-config-keys"} <= flags, flags)
        self.assertEqual(subcommands, {"egress-check", "audit-verify", "audit-pubkey"})
        described = [l.strip() for l in out.splitlines() if l.startswith("  ")]
        for name in flags | subcommands:
            with self.subTest(name=name):
                # a line of its own that starts with it (or "--help, -h")
                self.assertTrue(any(re.match(r"(--help, )?%s\b" % re.escape(name), l) for l in described), out)
        rc2, out2, err2 = sbtest.run_broker_once(["-h"], sbtest.base_env())
        self.assertEqual((rc2, out2), (0, out))

    def version(self):
        rc, out, err = sbtest.run_broker_once(["--version"], sbtest.base_env())
        self.assertEqual(rc, 0)
        m = re.fullmatch(r"sandbox-broker (\d+\.\d+\.\d+) \(commit ([0-9a-f]{7,40}|unknown)\)\n", out)
        self.assertIsNotNone(m, out)
        return m.group(1), m.group(2)

    def test_version_names_the_commit(self):
        version, commit = self.version()
        with open(os.path.join(sbtest.SOURCE_DIR, "CMakeLists.txt")) as f:
            self.assertIn("project(sandbox-broker VERSION %s " % version, f.read())
        git = subprocess.run(["git", "-C", sbtest.SOURCE_DIR, "rev-parse", "HEAD"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
        if git.returncode == 0:
            # configured in this checkout: the commit it was configured at is in its history
            self.assertNotEqual(commit, "unknown")
            anc = subprocess.run(["git", "-C", sbtest.SOURCE_DIR, "merge-base", "--is-ancestor", commit, "HEAD"])
            self.assertEqual(anc.returncode, 0, commit)

    def test_metrics_build_info_reloads_and_the_started_line(self):
        version, commit = self.version()
        d = tempfile.mkdtemp(prefix="sb-metrics-")
        try:
            path = os.path.join(d, "broker.json")
            with open(path, "w") as f:
                json.dump({"threads": 1}, f)
            with sbtest.Broker(args=["--config", path]) as b:
                started = b.wait_for_event("started")
                self.assertEqual((started["version"], started["commit"]), (version, commit))
                m = b.admin("GET", "/metrics").raw.decode()
                self.assertIn('sb_build_info{version="%s",commit="%s"} 1\n' % (version, commit), m)
                self.assertIn('sb_reload_total{result="applied"} 0\n', m)
                self.assertIn('sb_reload_total{result="rejected"} 0\n', m)
                b.proc.send_signal(signal.SIGHUP)
                self.assertIsNotNone(b.wait_for_event("reload.applied"))
                with open(path, "w") as f:
                    f.write("{ not json")
                b.proc.send_signal(signal.SIGHUP)
                self.assertIsNotNone(b.wait_for_event("reload.rejected"))
                m = b.admin("GET", "/metrics").raw.decode()
                self.assertIn('sb_reload_total{result="applied"} 1\n', m)
                self.assertIn('sb_reload_total{result="rejected"} 1\n', m)
        finally:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sbtest.main()
