"""sandbox-shim serve as a service is operated: --version, --check-config, signals, /health, outcomes.

Each case starts its own serve (tests/shim/test_serve.py covers the /run API itself):
  * `sandbox-shim --version`, `--help` and `serve --help` agree on what exists;
  * `serve --check-config` checks what start-up checks and exits 0 or 2, naming the flag or the
    environment variable a wrong value came from; a Deno the guests' uid cannot execute (under a
    0700 directory) is refused there and at start, a missing one is "not found at ...";
  * SIGUSR1 reopens --log-file (logrotate's rename + signal), SIGHUP re-reads the secret files or
    says in one line why it cannot, SIGUSR2 is logged and ignored, SIGTERM still drains;
  * /health answers 503 with the reason while a run cannot start (Deno removed, Deno unreachable by
    the guests, every guest uid taken, a jail that cannot be set up) and 200 again once it can;
  * a binding call the broker denies is the run outcome "call_denied", a failing one "failed";
  * unprivileged, the start-up line is a warning that every guest shares one uid.
Needs Deno (SB_DENO, or SB_NODE_PREFIX/node_modules/.bin/deno); SKIP (77) without it.
"""
import sys
sys.dont_write_bytecode = True  # noqa: E402 - keep tests/shim free of __pycache__
import fcntl
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgpack

from common import SHIM, Tap, check, find_deno, needs_root

DENO = find_deno()
if DENO is None:
    if os.environ.get("SB_TEST_NO_SKIP") == "1":
        print("Bail out! deno not found and SB_TEST_NO_SKIP=1", flush=True)
        sys.exit(1)
    print("1..0 # SKIP deno not found: set SB_DENO or SB_NODE_PREFIX", flush=True)
    sys.exit(77)
DENO = os.path.realpath(DENO)

SECRET = "questpie-sandbox-host-service-key-32-bytes-minimum"
SECRET2 = "a-second-host-admission-secret-of-40-bytes!"
ADMISSION = "x-questpie-sandbox-host-admission"
UID_BASE = 1879048192  # the jail's default --jail-uid-base (jail.h)
TMP = tempfile.mkdtemp(prefix="sb-serve-ops-")
os.chmod(TMP, 0o755)

tap = Tap()


def base_env(**extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_") and k not in ("PORT", "DENO_BIN")}
    e.update(extra)
    return e


class Serve:
    """serve on an ephemeral loopback port; its log is stderr, or --log-file when `log` is given."""

    def __init__(self, args=(), env=None, log=None, secret=SECRET, wrap=()):
        e = base_env()
        if secret is not None:
            e["SANDBOX_HOST_ADMISSION_SECRET"] = secret
        e.update(env or {})
        argv = list(wrap) + [SHIM, "serve", "--listen", "127.0.0.1:0"] + list(args)
        if "--deno" not in args:
            argv += ["--deno", DENO]
        if log is not None:
            argv += ["--log-file", log]
        self.log_path = log
        self.proc = subprocess.Popen(argv, env=e, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        self.lines = []
        self.lock = threading.Lock()
        self.port = None
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 30
        while self.port is None and time.monotonic() < deadline and self.proc.poll() is None:
            for ev in self.events():
                if ev.get("event") == "listening":
                    self.port = ev["port"]
            time.sleep(0.02)
        if self.port is None:
            self.stop()
            raise RuntimeError("serve did not start:\n" + self.text())

    def _read(self):
        for raw in self.proc.stderr:
            with self.lock:
                self.lines.append(raw.decode("utf-8", "replace"))

    def text(self):
        """everything logged so far: stderr, then the log file and the files it was rotated to"""
        with self.lock:
            out = "".join(self.lines)
        if self.log_path is not None:
            for p in sorted(x for x in os.listdir(os.path.dirname(self.log_path))
                            if x.startswith(os.path.basename(self.log_path))):
                with open(os.path.join(os.path.dirname(self.log_path), p)) as f:
                    out += f.read()
        return out

    def events(self, name=None, text=None):
        out = []
        for line in (self.text() if text is None else text).splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if name is None or ev.get("event") == name:
                out.append(ev)
        return out

    def wait_event(self, name, count=1, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            evs = self.events(name)
            if len(evs) >= count:
                return evs
            time.sleep(0.02)
        raise AssertionError("no %d %r line(s):\n%s" % (count, name, self.text()))

    def request(self, method, path, body=None, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def run(self, source, secret=SECRET, **fields):
        body = {"mode": "host", "source": source, "capabilities": {"net": [], "import": [], "timeoutMs": 5000}}
        body.update(fields)
        st, raw = self.request("POST", "/run", json.dumps(body), {ADMISSION: secret})
        return st, json.loads(raw)

    def health(self):
        st, raw = self.request("GET", "/health")
        return st, json.loads(raw)

    def metrics(self):
        st, raw = self.request("GET", "/metrics", headers={ADMISSION: SECRET})
        check(st == 200, "metrics", st, raw)
        return dict(line.rsplit(" ", 1) for line in raw.decode().splitlines() if line and not line.startswith("#"))

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def check_config(args=(), env=None):
    e = base_env(SANDBOX_HOST_ADMISSION_SECRET=SECRET)
    e.update(env or {})
    p = subprocess.run([SHIM, "serve", "--check-config"] + list(args), env=e, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def version():
    return subprocess.run([DENO, "--version"], capture_output=True, text=True).stdout.split()[1]


# ---- --version, --help ----

def t_version_and_help():
    p = subprocess.run([SHIM, "--version"], capture_output=True, text=True)
    check(p.returncode == 0 and re.fullmatch(r"sandbox-shim \d+\.\d+\.\d+ \(commit ([0-9a-f]+|unknown)\)\n", p.stdout),
          "--version", p.returncode, p.stdout, p.stderr)
    p = subprocess.run([SHIM, "--help"], capture_output=True, text=True)
    check(p.returncode == 0, "--help exits 0", p.returncode)
    for word in ("run", "relay", "serve", "jail-check", "--version", "--check-config"):
        check(word in p.stdout, "--help names " + word, p.stdout)
    p = subprocess.run([SHIM, "serve", "--help"], capture_output=True, text=True)
    for word in ("--check-config", "--log-file", "SIGUSR1", "SIGHUP", "SIGTERM", "DENO_BIN"):
        check(p.returncode == 0 and word in p.stdout, "serve --help names " + word, p.stdout)
    s = Serve()
    try:
        ev = s.wait_event("started")[0]
        m = re.fullmatch(r"sandbox-shim (\S+) \(commit (\S+)\)\n", subprocess.run([SHIM, "--version"], capture_output=True,
                                                                                 text=True).stdout)
        check((ev["version"], ev["commit"]) == m.groups(), "the started line says the same version and commit", ev)
    finally:
        s.stop()
    p = subprocess.run([SHIM, "nonsense"], capture_output=True, text=True)
    check(p.returncode == 2 and "--help lists them" in p.stderr, "an unknown mode points at --help", p.stderr)


# ---- --check-config and the start-up checks ----

def t_check_config_ok():
    rc, out, err = check_config(["--deno", DENO])
    check(rc == 0 and out.startswith("configuration OK: Deno %s started as a guest; jail: on" % version()), "OK",
          rc, out, err)
    check('"listening"' not in err and SECRET not in out + err, "nothing bound, no secret echoed", err)


def t_check_config_deno_sources():
    """A wrong Deno names where the value came from, and says what is wrong with it."""
    missing = os.path.join(TMP, "no-such-dir", "deno")
    cases = (
        (["--deno", missing], {}, "--deno %s: not found at %s (No such file or directory)" % (missing, missing)),
        ([], {"DENO_BIN": missing}, "DENO_BIN=%s: not found at %s (No such file or directory)" % (missing, missing)),
        ([], {"PATH": "/nonexistent-bin"}, "deno (looked up on PATH): not found at PATH=/nonexistent-bin; install Deno"),
        (["--deno", "/bin/true"], {}, "--deno /bin/true: /bin/true --version did not answer like Deno"),
    )
    for args, env, needle in cases:
        rc, out, err = check_config(args, env)
        check(rc == 2 and needle in err and err.rstrip().endswith("serve does not start") and out == "",
              "refused: " + needle, rc, out, err)
        check("did not answer like Deno" not in err or "/bin/true" in needle, "a missing Deno is not 'did not answer'",
              err)


def t_deno_unreachable_by_guests():
    """Deno under a 0700 directory: root reaches it, the guests' uid does not; refused with what to fix."""
    home = os.path.join(TMP, "home0700")
    os.mkdir(home, 0o700)
    os.chmod(home, 0o700)
    link = os.path.join(home, "deno")
    os.symlink(DENO, link)
    check(os.access(link, os.X_OK), "root itself can execute it")
    want = ("DENO_BIN=%s: a guest cannot start it (cannot execute %s: Permission denied): the guests run as uids of "
            "their own (--jail-uid-base %d and up), so the file and every directory above it must be readable and "
            "executable by them; install Deno where they can reach it (e.g. /usr/local/bin), not under a 0700 home "
            "directory; serve does not start" % (link, link, UID_BASE))
    if os.geteuid() != 0:
        want = None  # unprivileged, the guests are serve's own uid, which reaches its own 0700 directory
    rc, out, err = check_config([], {"DENO_BIN": link})
    if want is None:
        check(rc == 0, "unprivileged: serve's own uid reaches it", rc, err)
        return
    check(rc == 2 and want in err, "check-config refuses it", rc, err)
    p = subprocess.run([SHIM, "serve", "--listen", "127.0.0.1:0"], env=base_env(SANDBOX_HOST_ADMISSION_SECRET=SECRET,
                                                                                DENO_BIN=link),
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and want in p.stderr and '"listening"' not in p.stderr, "the start refuses it too",
          p.returncode, p.stderr)
    os.chmod(home, 0o755)
    rc, out, err = check_config([], {"DENO_BIN": link})
    check(rc == 0, "reachable once the directory is", rc, err)


def t_check_config_names_flag_or_env():
    for args, env, needle in (
            (["--deno", DENO, "--broker-url", "http://127.0.0.1:1/x#f"], {}, "--broker-url: "),
            (["--deno", DENO], {"SANDBOX_BROKER_URL": "http://127.0.0.1:1/x#f"}, "SANDBOX_BROKER_URL: "),
            (["--deno", DENO, "--broker-url", "http://127.0.0.1:1/rpc", "--broker-admin-url", "https://127.0.0.1:2"], {},
             "--broker-admin-url must be http://HOST:PORT"),
            (["--deno", DENO, "--broker-url", "http://127.0.0.1:1/rpc"], {"SANDBOX_BROKER_ADMIN_URL": "https://127.0.0.1:2"},
             "SANDBOX_BROKER_ADMIN_URL must be http://HOST:PORT")):
        rc, out, err = check_config(args, env)
        check(rc == 2 and err.startswith("sandbox-shim serve: " + needle), "names " + needle, rc, err)
    short = os.path.join(TMP, "short-secret")
    with open(short, "w") as f:
        f.write("x" * 31)
    rc, out, err = check_config(["--deno", DENO, "--admission-secret-file", short])
    check(rc == 2 and "--admission-secret-file %s must hold at least 32 bytes" % short in err, "names the file", err)
    # a file longer than the cap is refused whole: never cut to its first 1024 bytes and a newline
    for name, text in (("long-secret", "x" * 1024 + "\nthe rest of the file"), ("longer-secret", "y" * 1030)):
        path = os.path.join(TMP, name)
        with open(path, "w") as f:
            f.write(text)
        rc, out, err = check_config(["--deno", DENO, "--admission-secret-file", path])
        check(rc == 2 and "the file %s: the host admission secret is longer than 1024 bytes" % path in err, "refused: " + name, rc, err)


# ---- signals ----

def t_sigusr1_reopens_the_log():
    d = tempfile.mkdtemp(dir=TMP)
    log = os.path.join(d, "serve.log")
    s = Serve(log=log)
    try:
        s.wait_event("started")
        os.rename(log, log + ".1")  # what logrotate does before its postrotate
        s.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not os.path.exists(log) and time.monotonic() < deadline:
            time.sleep(0.02)
        check(os.path.exists(log), "the log was opened again at its path", os.listdir(d))
        st, o = s.run("export default () => 'after'")
        check(st == 200 and o["output"] == "after" and s.proc.poll() is None, "still serving", st, o)
        s.wait_event("run")  # the run's line follows its answer
        with open(log) as f:
            new = f.read()
        with open(log + ".1") as f:
            old = f.read()
        check([e["event"] for e in s.events(text=new)][:2] == ["reopened", "run"], "the new file starts with reopened",
              new)
        check(s.events("reopened", new)[0]["log"] == log, "names its path", new)
        check(any(e["event"] == "started" for e in s.events(text=old)) and '"run"' not in old, "the old file kept the rest",
              old)
        st = os.stat(log)
        check(st.st_mode & 0o777 == 0o600, "a new log file is 0600", oct(st.st_mode))
        s.proc.send_signal(signal.SIGUSR2)
        check(s.wait_event("signal.ignored")[0]["signal"] == "SIGUSR2" and s.proc.poll() is None, "SIGUSR2 ignored")
    finally:
        rc = s.stop()
    check(rc == 0 and s.events("stopped"), "SIGTERM still stops it cleanly", rc, s.text())


def t_sigusr1_without_log_file():
    s = Serve()
    try:
        s.proc.send_signal(signal.SIGUSR1)
        ev = s.wait_event("reopen")[0]
        check(ev["log"] == "stderr" and ev["msg"] == "no --log-file: nothing to reopen", "says so", ev)
        check(s.proc.poll() is None and s.health()[0] == 200, "alive (SIGUSR1 used to end it)")
    finally:
        check(s.stop() == 0, "clean stop")


def t_sighup_environment_secrets():
    s = Serve()
    try:
        for n in (1, 2):
            s.proc.send_signal(signal.SIGHUP)
            s.wait_event("reload.unsupported", n)
        time.sleep(0.3)
        evs = s.events("reload.unsupported")
        check(len(evs) == 2 and evs[0]["level"] == "warn", "one line per SIGHUP", evs)
        check("read once at start" in evs[0]["reason"] and "restart" in evs[0]["msg"], "says why and what to do", evs[0])
        check(not s.events("reload.applied") and s.proc.poll() is None, "nothing applied, still running")
        st, o = s.run("export default () => 1")
        check(st == 200 and o["output"] == 1, "the secret still admits", o)
    finally:
        s.stop()


def t_sighup_rereads_secret_files():
    d = tempfile.mkdtemp(dir=TMP)
    adm = os.path.join(d, "admission")
    with open(adm, "w") as f:
        f.write(SECRET + "\n")
    s = Serve(args=["--admission-secret-file", adm], secret=None)
    try:
        with open(adm, "w") as f:
            f.write(SECRET2 + "\n")
        s.proc.send_signal(signal.SIGHUP)
        ev = s.wait_event("reload.applied")[0]
        check(ev["reloaded"] == "the host admission secret" and "Deno" in ev["restartOnly"], "what was reloaded", ev)
        st, o = s.run("export default () => 2", secret=SECRET2)
        check(st == 200 and o["output"] == 2, "the new secret admits", st, o)
        st, o = s.run("export default () => 2", secret=SECRET)
        check(st == 403, "the old one no longer does", st, o)
        with open(adm, "w") as f:
            f.write("too-short")
        s.proc.send_signal(signal.SIGHUP)
        ev = s.wait_event("reload.rejected")[0]
        check(ev["level"] == "error" and ev["reason"] == "--admission-secret-file %s must hold at least 32 bytes; "
              "refusing to start without host admission" % adm, "rejected with the reason", ev)
        check("too-short" not in s.text(), "the secret is not logged")
        st, o = s.run("export default () => 3", secret=SECRET2)
        check(st == 200 and o["output"] == 3, "the running secret stays", st, o)
        check(len(s.events("reload.applied")) == 1 and len(s.events("reopen")) == 2, "one line each per SIGHUP",
              s.text())
    finally:
        s.stop()
    # with the net-mint credential from a file too: both are read again, an empty one is refused
    mint = os.path.join(d, "net-mint")
    with open(adm, "w") as f:
        f.write(SECRET + "\n")
    with open(mint, "w") as f:
        f.write("m" * 40)
    # the broker's admin listener, as far as a mint goes: it records the credential each mint carries
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    seen = []

    class Admin(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.headers.get("Authorization"))
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

    admin = ThreadingHTTPServer(("127.0.0.1", 0), Admin)
    threading.Thread(target=admin.serve_forever, daemon=True).start()
    s = Serve(args=["--admission-secret-file", adm, "--net-mint-secret-file", mint, "--broker-url",
                    "http://127.0.0.1:1/api/sandbox/rpc", "--broker-admin-url",
                    "http://127.0.0.1:%d" % admin.server_address[1]], secret=None)
    try:
        net = {"net": ["api.example.com"], "import": [], "timeoutMs": 5000}
        st, o = s.run("export default () => 1", capabilities=net)
        check(st == 200 and o["ok"] is False and seen == ["Bearer " + "m" * 40], "a net run mints with the credential",
              st, o, seen)
        open(mint, "w").close()
        s.proc.send_signal(signal.SIGHUP)
        ev = s.wait_event("reload.rejected")[0]
        check(ev["reason"] == "the net-mint secret file %s is empty" % mint, "an empty net-mint file is refused", ev)
        with open(mint, "w") as f:
            f.write("n" * 40)
        s.proc.send_signal(signal.SIGHUP)
        ev = s.wait_event("reload.applied")[0]
        check(ev["reloaded"] == "the host admission secret, the net-mint secret", "both reloaded", ev)
        # the runs get the reloaded credential (their launcher, forked at start-up, holds none)
        st, o = s.run("export default () => 1", capabilities=net)
        check(st == 200 and seen[-1] == "Bearer " + "n" * 40, "a net run after the reload mints with the new one", seen)
        check("n" * 40 not in s.text() and "m" * 40 not in s.text(), "no secret logged")
    finally:
        s.stop()
        admin.shutdown()


def t_sigterm_drains():
    s = Serve()
    res = {}
    th = threading.Thread(target=lambda: res.update(r=s.run(
        "export default async () => { await new Promise(r => setTimeout(r, 700)); return 'drained'; }")))
    th.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and s.metrics().get("sb_serve_runs_in_flight") != "1":
        time.sleep(0.02)
    rc = s.stop()
    th.join(30)
    check(rc == 0 and res["r"][1]["output"] == "drained", "drained", rc, res)


# ---- /health ----

def wait_health(s, status, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        st, o = s.health()
        if st == status or time.monotonic() > deadline:
            return st, o
        time.sleep(0.2)


def t_health_deno_gone_and_unreachable():
    d = tempfile.mkdtemp(dir=TMP)
    os.chmod(d, 0o755)
    link = os.path.join(d, "deno")
    os.symlink(DENO, link)
    # no pool: a guest started before Deno went would still take a run; this is about starting one
    s = Serve(args=["--deno", link, "--pool-size", "0"])
    try:
        st, o = s.health()
        check(st == 200 and o == {"ok": True, "runtime": "deno", "version": version()}, "healthy", st, o)
        os.unlink(link)
        st, o = wait_health(s, 503)
        check(st == 503 and o["ok"] is False and o["error"] == "spawn: cannot execute %s: No such file or directory" % link,
              "Deno removed: 503", st, o)
        st, r = s.run("export default () => 1")
        check(r["ok"] is False and "failed to spawn sandbox subprocess" in r["error"], "and indeed no run starts", r)
        os.symlink(DENO, link)
        check(wait_health(s, 200)[0] == 200, "back once it is back")
        if os.geteuid() == 0:
            os.chmod(d, 0o700)
            st, o = wait_health(s, 503)
            check(st == 503 and o["error"] == "spawn: cannot execute %s: Permission denied" % link,
                  "unreachable by the guests' uid: 503", st, o)
            os.chmod(d, 0o755)
            check(wait_health(s, 200)[0] == 200, "reachable again")
        # a Deno that hangs: /health holds the loop at most the check's 2 s, and answers 503 saying so
        hang_c = os.path.join(d, "hang.c")
        with open(hang_c, "w") as f:
            f.write("#include <unistd.h>\nint main(void) { for (;;) pause(); }\n")
        subprocess.run(["cc", "-O2", "-o", os.path.join(d, "hang"), hang_c], check=True)
        os.unlink(link)
        os.symlink(os.path.join(d, "hang"), link)
        st, o = wait_health(s, 503)
        check(st == 503 and o["error"] == "%s --version did not answer like Deno (no answer within the check's time)" % link,
              "a hanging Deno: 503", st, o)
        os.unlink(link)
        os.symlink(DENO, link)
        check(wait_health(s, 200)[0] == 200, "back once it answers")
    finally:
        s.stop()


def t_health_uid_slots_exhausted():
    if not needs_root("uid slots (unprivileged, the guests share serve's uid)"):
        return
    lock = os.path.join(TMP, "uids.lock")
    base = UID_BASE + 62000
    # no pool: its guests would hold the two slots (test_serve.py's pool cases cover pooled guests)
    s = Serve(args=["--jail-slots", "2", "--jail-uid-base", str(base), "--jail-lock-file", lock, "--pool-size", "0"])
    fd = os.open(lock, os.O_RDWR)
    try:
        check(s.health()[0] == 200, "healthy with free uids")
        for slot in (0, 1):  # another sandbox-shim on the machine holds every uid (the jail's byte locks)
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, base + slot)
        st, o = wait_health(s, 503)
        check(st == 503 and o["error"] == "spawn: jail: all 2 guest uids are in use (--jail-slots)", "503 with why", st, o)
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, base + 1)
        check(wait_health(s, 200)[0] == 200, "200 once one is free")
        # the jail cannot be set up: its uid lock file replaced by a symbolic link, which it refuses to follow
        os.rename(lock, lock + ".moved")
        os.symlink(lock + ".moved", lock)
        st, o = wait_health(s, 503)
        check(st == 503 and o["error"] == "spawn: jail: cannot open the uid lock file %s: Too many levels of symbolic "
              "links" % lock, "a jail that cannot be set up: 503 with why", st, o)
        st, r = s.run("export default () => 1")
        check(r["ok"] is False and "jail: cannot open the uid lock file" in r["error"], "and indeed no run starts", r)
        os.unlink(lock)
        os.rename(lock + ".moved", lock)
        check(wait_health(s, 200)[0] == 200, "200 once the jail can be set up again")
    finally:
        os.close(fd)
        s.stop()


# ---- outcomes ----

class DenyingBroker:
    """answers every call with an error: collections.denied.* 403 forbidden, anything else 500"""

    def __init__(self):
        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = msgpack.unpackb(self.rfile.read(int(self.headers.get("Content-Length", "0"))), raw=False)
                if body["method"].startswith("collections.denied."):
                    status, err = 403, {"code": "forbidden", "message": "not in the manifest"}
                else:
                    status, err = 500, {"code": "execution_error", "message": "boom"}
                out = msgpack.packb({"ok": False, "error": err}, use_bin_type=True)
                self.send_response(status)
                self.send_header("Content-Type", "application/msgpack")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d/api/sandbox/rpc" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def t_call_denied_outcome():
    b = DenyingBroker()
    s = Serve(env={"SANDBOX_BROKER_URL": b.url})
    try:
        bind = {"url": b.url, "token": "t"}
        st, o = s.run("export default () => questpie.collections.denied.find({})", bindings=bind)
        check(st == 200 and o["ok"] is False and o["error"] == "sandbox binding operation forbidden",
              "the run ends with the denial, in upstream's words", o)
        check("denied" not in o and "detail" not in o, "the marker and the detail stay inside serve", o)
        st, o = s.run("export default () => questpie.collections.other.find({})", bindings=bind)
        check(st == 200 and o["ok"] is False and o["error"] == "sandbox binding operation failed", "a failing call", o)
        deadline = time.monotonic() + 10
        while len(s.events("run")) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        check([e["outcome"] for e in s.events("run")] == ["call_denied", "failed"], "denied is its own outcome",
              s.events("run"))
        details = [e.get("detail", "") for e in s.events("run")]
        check(details[0].startswith("binding call collections.denied.find failed: forbidden")
              and details[1].startswith("binding call collections.other.find failed: execution_error"),
              "the run's log line has the call's method, code and reason", details)
        m = s.metrics()
        check(m['sb_serve_runs_total{outcome="call_denied"}'] == "1" and m['sb_serve_runs_total{outcome="failed"}'] == "1",
              "and its own metric", m)
        names = [k[len('sb_serve_runs_total{outcome="'):-2] for k in m if k.startswith("sb_serve_runs_total")]
        readme = open(os.path.join(os.path.dirname(SHIM), "..", "..", "supervisor-shim", "README.md")).read() \
            if not os.environ.get("SB_SOURCE_DIR") else \
            open(os.path.join(os.environ["SB_SOURCE_DIR"], "supervisor-shim", "README.md")).read()
        table = re.findall(r"^\| `([a-z_]+)` \|", readme.split("### Run outcomes", 1)[1].split("\n### ", 1)[0], re.M)
        check(table == names, "README.md's outcome table lists exactly the metric's outcomes, in order", table, names)
    finally:
        s.stop()
        b.server.shutdown()


def t_unprivileged_warns():
    """As a user other than root every guest shares that uid: the start-up line is a warning saying so."""
    if os.geteuid() != 0:
        s = Serve()
    else:
        nobody = 65534
        work = tempfile.mkdtemp(dir=TMP)
        os.chown(work, nobody, nobody)
        os.chmod(work, 0o711)
        s = Serve(wrap=["setpriv", "--reuid=%d" % nobody, "--regid=%d" % nobody, "--clear-groups"],
                  env={"TMPDIR": work, "HOME": "/nonexistent"})
    try:
        ev = s.wait_event("started")[0]
        check(ev["level"] == "warn" and ev["uidPerGuest"] is False and "every guest runs as serve's own uid" in ev["warning"],
              "a warning in the start-up line", ev)
        st, o = s.run("export default () => 'shared'")
        check(st == 200 and o.get("output") == "shared", "and it serves", o, s.text())
    finally:
        s.stop()
    if os.geteuid() == 0:
        s = Serve()
        try:
            ev = s.wait_event("started")[0]
            check(ev["level"] == "info" and ev["uidPerGuest"] is True and "warning" not in ev, "as root: no warning", ev)
        finally:
            s.stop()


try:
    tap.case("--version, --help and serve --help agree", t_version_and_help)
    tap.case("--check-config: OK, nothing bound", t_check_config_ok)
    tap.case("--check-config: a wrong Deno, named by where it came from", t_check_config_deno_sources)
    tap.case("Deno the guests' uid cannot execute: refused at check and start", t_deno_unreachable_by_guests)
    tap.case("errors name the flag or the environment variable that gave the value", t_check_config_names_flag_or_env)
    tap.case("SIGUSR1 reopens --log-file after a rename; SIGUSR2 ignored", t_sigusr1_reopens_the_log)
    tap.case("SIGUSR1 without --log-file: a line, no exit", t_sigusr1_without_log_file)
    tap.case("SIGHUP with secrets from the environment: one line saying why not", t_sighup_environment_secrets)
    tap.case("SIGHUP re-reads the admission secret file; a bad one is rejected", t_sighup_rereads_secret_files)
    tap.case("SIGTERM drains", t_sigterm_drains)
    tap.case("/health: Deno removed or unreachable by the guests -> 503, then 200", t_health_deno_gone_and_unreachable)
    tap.case("/health: every guest uid taken, a jail that cannot be set up -> 503, then 200",
             t_health_uid_slots_exhausted)
    tap.case("a denied binding call is the outcome call_denied", t_call_denied_outcome)
    tap.case("unprivileged: the start-up line warns", t_unprivileged_warns)
finally:
    for root, dirs, files in os.walk(TMP):
        for x in dirs:
            os.chmod(os.path.join(root, x), 0o755)
    shutil.rmtree(TMP, ignore_errors=True)
tap.done()
