"""The systemd unit, deploy/systemd/sandbox-broker.service, as the sandbox it is.

systemd is not PID 1 here, so unitjail.py applies the unit's seccomp filters
(SystemCallFilter=, RestrictAddressFamilies=, MemoryDenyWriteExecute=, ...) and
its ProtectSystem=strict file system, read from the unit file itself, and runs
the unit's own ExecStartPre= and ExecStart= command lines under them (only the
binary's and the configuration's paths are replaced). A change to the unit is
a change to what these tests run. `systemd-analyze verify` of the unit is in
the lint step (scripts/verify-unit).
"""

import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import unittest

import sbtest

UNIT = os.path.join(sbtest.SOURCE_DIR, "deploy", "systemd", "sandbox-broker.service")
JAIL = ["/usr/bin/python3", os.path.join(sbtest.HERE, "unitjail.py"), UNIT, "--"]
PY = "/usr/bin/python3"
AUDIT = "/var/log/sandbox-broker/audit.log"  # inside the unit's LogsDirectory=


def unit_command(key):
    """The unit's KEY= command line as argv, without systemd's prefixes."""
    with open(UNIT) as f:
        for line in f:
            if line.startswith(key + "="):
                return shlex.split(line.split("=", 1)[1].lstrip("-@:+!"))
    raise AssertionError("%s has no %s=" % (UNIT, key))


def jail_env(extra=None):
    env = sbtest.base_env(extra)
    # LeakSanitizer stops the world with ptrace, which @system-service does not allow (nor should it)
    env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=0"
    return env


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def run_jailed(argv, env, timeout=60):
    p = subprocess.run(JAIL + argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


class UnitSandbox(sbtest.BrokerTestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="sb-unit-")  # under /tmp: the jail keeps /tmp visible
        os.chmod(self.tmp, 0o755)
        self.config = os.path.join(self.tmp, "broker.json")
        self.write_config({"audit": AUDIT, "log_calls": False, "targets": {"app": {}}})

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write_config(self, conf):
        with open(self.config, "w") as f:
            json.dump(conf, f)

    def argv(self, key):
        argv = unit_command(key)
        self.assertEqual(argv[0], "/usr/local/bin/sandbox-broker")
        self.assertIn("/etc/sandbox-broker/broker.json", argv)
        return [sbtest.BROKER_BIN] + [self.config if a == "/etc/sandbox-broker/broker.json" else a for a in argv[1:]]

    def test_the_jail_enforces_what_the_unit_says(self):
        """The emulation is not a no-op: each restriction refuses what it should."""
        env = jail_env()
        cases = [
            # RestrictAddressFamilies=: netlink is refused, inet is not
            ("import socket,errno\ntry:\n socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)\n"
             "except OSError as e:\n print(e.errno)\nsocket.socket(socket.AF_INET6, socket.SOCK_DGRAM)",
             0, str(errno.EAFNOSUPPORT)),
            # MemoryDenyWriteExecute=
            ("import mmap\ntry:\n mmap.mmap(-1, 4096, prot=mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
             "except OSError as e:\n print(e.errno)", 0, str(errno.EPERM)),
            # ProtectSystem=strict: /etc is read-only, the unit's LogsDirectory= is writable
            ("try:\n open('/etc/sb-unit-probe', 'w')\nexcept OSError as e:\n print(e.errno)\n"
             "open('%s', 'w').write('x')" % AUDIT, 0, str(errno.EROFS)),
        ]
        for code, rc, out in cases:
            with self.subTest(code=code.splitlines()[-1]):
                got = run_jailed([PY, "-c", code], env)
                self.assertEqual((got[0], got[1].strip()), (rc, out), got)
        # SystemCallFilter=~@privileged: chroot kills the process with SIGSYS, as systemd's filter does
        got = run_jailed([PY, "-c", "import os; os.chroot('/')"], env)
        self.assertEqual(got[0], -signal.SIGSYS, got)
        self.assertFalse(os.path.exists("/etc/sb-unit-probe"))

    def test_exec_start_pre_passes_under_the_unit(self):
        rc, out, err = run_jailed(self.argv("ExecStartPre"), jail_env())
        self.assertEqual(rc, 0, err)
        self.assertIn("configuration OK", out)

    def test_the_example_configuration_passes_the_units_check(self):
        """deploy/broker.example.json, installed as the unit expects it: its audit path is writable there."""
        shutil.copy(os.path.join(sbtest.SOURCE_DIR, "deploy", "broker.example.json"), self.config)
        rc, out, err = run_jailed(self.argv("ExecStartPre"), jail_env())
        self.assertEqual(rc, 0, err)
        with open(self.config) as f:
            self.assertEqual(json.load(f)["audit"], AUDIT)

    def test_exec_start_pre_passes_while_the_database_is_down(self):
        """A restart during a database outage: the unit's check must not fail the start."""
        self.write_config({"audit": AUDIT, "database_url": "postgresql://sb@127.0.0.1:%d/app" % sbtest.closed_port(),
                           "targets": {"app": {"document_store": {"table": "document_store"}}}})
        self.assertIn("--allow-down", unit_command("ExecStartPre"))
        rc, out, err = run_jailed(self.argv("ExecStartPre"), jail_env())
        self.assertEqual(rc, 0, err)
        # and the start itself comes up, reporting the database on /readyz
        with sbtest.Broker(args=self.argv("ExecStart")[1:], wrapper=JAIL, env={"ASAN_OPTIONS": "detect_leaks=0"}) as b:
            self.assertIsNotNone(b.wait_for_event("pg.unreachable_at_start", 10), b.log())
            r = b.public("GET", "/readyz")
            self.assertEqual((r.status, r.body.get("database")), (503, "down"), r)
            self.assertEqual(b.stop(), 0, b.log())

    def test_an_audit_file_outside_the_writable_paths_fails_the_check(self):
        self.write_config({"audit": "/etc/sandbox-broker-audit.log"})
        rc, out, err = run_jailed(self.argv("ExecStartPre"), jail_env())
        self.assertEqual(rc, 1, (out, err))
        self.assertIn("audit: cannot open /etc/sandbox-broker-audit.log: Read-only file system", err)

    def test_the_broker_starts_serves_rotates_and_stops_under_the_unit(self):
        b = sbtest.Broker(args=self.argv("ExecStart")[1:], wrapper=JAIL, env={"ASAN_OPTIONS": "detect_leaks=0"})
        with b:
            self.assertIsNotNone(b.wait_for_event("started"), b.log())
            self.assertEqual(b.public("GET", "/readyz").status, 200)
            token = b.mint_ok("unit-run", {"services": ["one", "two"]})
            for _ in range(5):
                self.assertEqual(b.rpc(token, "services.one.fn").status, 501)
            # the audit file lives in the jail's own /var/log: reach it through the process's root
            audit = "/proc/%d/root%s" % (b.proc.pid, AUDIT)
            # the call records, among the chain's own (docs/audit.md)
            self.assertTrue(sbtest.poll(lambda: read(audit).count('"event":"audit"') == 5, 10), b.log())
            os.rename(audit, audit + ".1")
            b.proc.send_signal(signal.SIGUSR1)
            self.assertIsNotNone(b.wait_for_event("reopened"), b.log())
            b.proc.send_signal(signal.SIGUSR2)
            self.assertIsNotNone(b.wait_for_event("signal.ignored"), b.log())
            for _ in range(3):
                self.assertEqual(b.rpc(token, "services.two.fn").status, 501)
            self.assertTrue(sbtest.poll(lambda: read(audit).count('"event":"audit"') == 3, 10), b.log())
            self.assertIn("services.two.fn", read(audit))
            self.assertNotIn("services.two.fn", read(audit + ".1"))
            self.assertEqual(read(audit + ".1").count("services.one.fn"), 5)
            b.proc.send_signal(signal.SIGHUP)
            self.assertIsNotNone(b.wait_for_event("reload.applied"), b.log())
            self.assertEqual(b.stop(), 0, b.log())


if __name__ == "__main__":
    sbtest.main()
