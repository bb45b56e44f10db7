"""A throwaway PostgreSQL for the integration tests (deps.md section 5).

PgServer() gives one database per test module:

  * by default it runs initdb once into a temporary directory and starts the
    cluster with pg_ctl on a free loopback port (unix socket in the same
    directory, fsync=off). As root, initdb and pg_ctl run through
    `runuser -u postgres` (initdb refuses to run as root);
  * when SB_TEST_PG_URL is set (e.g. postgresql://postgres@127.0.0.1:5432/postgres),
    that server is used instead: a fresh database is created for the module and
    dropped at the end. The server cannot be stopped by the tests then
    (can_restart is False);
  * PgServer(own=True) always runs a cluster of its own, whatever SB_TEST_PG_URL
    says: tests that stop and restart PostgreSQL (outages) use one, so they run
    everywhere, CI included, without disturbing anything else.

SQL runs through psql (no Python driver needed): pg.sql("...") returns the
rows as lists of strings (psql -At, fields separated by \\x1f).

Environment:
  SB_PG_BIN       directory of initdb/pg_ctl (default: /usr/lib/postgresql/<newest>/bin)
  SB_TEST_PG_URL  use this server instead of starting one (unless own=True)
"""

import glob
import os
import shutil
import subprocess
import tempfile
import time
import unittest
import uuid

import ports
from urllib.parse import urlsplit, urlunsplit

SEP = "\x1f"


def _free_port():
    return ports.free_port()


def _pg_bin():
    d = os.environ.get("SB_PG_BIN")
    if d:
        return d
    cands = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0)
    for c in reversed(cands):
        if os.path.exists(os.path.join(c, "initdb")):
            return c
    exe = shutil.which("initdb")
    return os.path.dirname(exe) if exe else None


def _replace_db(url, dbname):
    """The URL with its database (path) replaced."""
    if "://" in url:
        u = urlsplit(url)
        return urlunsplit((u.scheme, u.netloc, "/" + dbname, u.query, u.fragment))
    # a conninfo string
    parts = [p for p in url.split() if not p.startswith("dbname=")]
    return " ".join(parts + ["dbname=" + dbname])


class PgServer:
    """One PostgreSQL database for a test module. start() / close(); stop_server() / start_server() for outages."""

    def __init__(self, own=False):
        self.external = None if own else (os.environ.get("SB_TEST_PG_URL") or None)
        self.tmp = None
        self.port = None
        self.bin = None
        self.dbname = None
        self.url = None          # the test database, as the broker gets it
        self.admin_url = None    # the maintenance database (external server only)
        self.as_root = os.geteuid() == 0
        self.running = False

    @property
    def can_restart(self):
        return self.external is None

    # --- life cycle ---

    def _run(self, argv, timeout=60):
        if self.as_root:
            argv = ["runuser", "-u", "postgres", "--"] + argv
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError("%s failed (%d):\n%s%s" % (" ".join(argv), p.returncode, p.stdout.decode(errors="replace"),
                                                          p.stderr.decode(errors="replace")))
        return p

    def start(self):
        if shutil.which("psql") is None:
            raise unittest.SkipTest("psql is not installed (apt-get install -y postgresql-client)")
        if self.external:
            self.admin_url = self.external
            self.dbname = "sbtest_%d_%s" % (os.getpid(), uuid.uuid4().hex[:8])
            self.sql("CREATE DATABASE %s" % self.dbname, url=self.admin_url)
            self.url = _replace_db(self.external, self.dbname)
            self.running = True
            return self
        self.bin = _pg_bin()
        if self.bin is None:
            raise unittest.SkipTest("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
        self.tmp = tempfile.mkdtemp(prefix="sbtest-pg-")
        os.chmod(self.tmp, 0o755)
        if self.as_root:
            shutil.chown(self.tmp, "postgres", "postgres")
        self._run([os.path.join(self.bin, "initdb"), "-D", os.path.join(self.tmp, "data"), "-A", "trust", "-U", "postgres",
                   "--no-sync", "-E", "UTF8", "--locale=C.UTF-8"])
        self.port = _free_port()
        self.start_server()
        self.dbname = "sbtest"
        self.sql("CREATE DATABASE sbtest", url=self._url("postgres"))
        self.url = self._url(self.dbname)
        return self

    def _url(self, db):
        return "postgresql://postgres@127.0.0.1:%d/%s" % (self.port, db)

    def start_server(self, attempts=5):
        """pg_ctl start -w. Before the first URL is handed out, a lost race for the port is retried on another one."""
        assert self.can_restart
        for i in range(attempts):
            opts = "-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off " \
                   "-c full_page_writes=off -c max_connections=200" % (self.port, self.tmp)
            try:
                self._run([os.path.join(self.bin, "pg_ctl"), "-D", os.path.join(self.tmp, "data"), "-l",
                           os.path.join(self.tmp, "log"), "-w", "-s", "-t", "30", "-o", opts, "start"])
                self.running = True
                return
            except RuntimeError:
                if self.url is not None or i == attempts - 1:
                    raise
                self.port = _free_port()

    def stop_server(self, mode="fast"):
        assert self.can_restart
        if self.running:
            self._run([os.path.join(self.bin, "pg_ctl"), "-D", os.path.join(self.tmp, "data"), "-m", mode, "-w", "-s", "stop"])
            self.running = False

    def close(self):
        try:
            if self.external:
                if self.dbname:
                    self.sql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % self.dbname, url=self.admin_url, check=False)
            elif self.tmp is not None:
                try:
                    self.stop_server("immediate")
                except Exception:
                    pass
        finally:
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
                self.tmp = None

    def log(self):
        if self.tmp is None:
            return ""
        try:
            with open(os.path.join(self.tmp, "log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    # --- SQL ---

    def sql(self, text, url=None, check=True):
        """Runs SQL (one or more statements) with psql; returns the rows of the last result as lists of strings."""
        p = subprocess.run(["psql", url or self.url, "-X", "-q", "-At", "-F", SEP, "-v", "ON_ERROR_STOP=1", "-c", text],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        if p.returncode != 0 and check:
            raise RuntimeError("psql failed: %s\n%s" % (text[:200], p.stderr.decode(errors="replace")))
        out = p.stdout.decode("utf-8")
        return [line.split(SEP) for line in out.split("\n") if line != ""]

    def sql_file(self, path):
        p = subprocess.run(["psql", self.url, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", path], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        if p.returncode != 0:
            raise RuntimeError("psql -f %s failed:\n%s" % (path, p.stderr.decode(errors="replace")))

    def scalar(self, text):
        rows = self.sql(text)
        return rows[0][0] if rows else None

    def wait_ready(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.sql("SELECT 1", check=True) == [["1"]]:
                    return True
            except RuntimeError:
                pass
            time.sleep(0.05)
        return False
