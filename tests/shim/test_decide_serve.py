"""End to end: a Deno guest through `sandbox-shim serve`, the real broker, PostgreSQL and a decider.

The run's manifest holds collections.posts.delete for the decider (PROTOCOL.md
section 5a). A decider on loopback (tests/integration/decidefix.py) holds the
delete of post 2 for a moment, checks in PostgreSQL that the row is still there
(nothing ran before its answer), then allows it; it denies the delete of post 3
with a reason. The first run returns what the delete returned and post 2 is
gone; the second run ends with upstream's text for forbidden, the decider's
reason in serve's log line, and post 3 is still there. A third guest, through `sandbox-shim run
--on-denial reply`, catches the refusal and sees the reason itself.

Needs Deno (SB_DENO, or SB_NODE_PREFIX/node_modules/.bin/deno) and PostgreSQL
(tests/integration/pgfix.py: SB_TEST_PG_URL, or a cluster of its own).
"""
import sys
sys.dont_write_bytecode = True  # noqa: E402 - keep tests/shim free of __pycache__
import http.client
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

from common import BROKER, SHIM, SOURCE_DIR, Tap, check, find_deno

DENO = find_deno()
if DENO is None:
    print("1..0 # SKIP deno not found: set SB_DENO, or SB_NODE_PREFIX after "
          "`npm install --prefix \"$SB_NODE_PREFIX\" deno@2.9.6`", flush=True)
    sys.exit(77)

sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "integration"))
import decidefix  # noqa: E402
import pgfix  # noqa: E402

ADMIN = "decide-e2e-admin-secret-0123456789"
ADMISSION_SECRET = "questpie-sandbox-host-service-key-32-bytes-minimum"
TENANT = "t-decide"
TMP = tempfile.mkdtemp(prefix="sb-decide-e2e-")
os.chmod(TMP, 0o711)  # jailed guests run as other uids

tap = Tap()


def req(port, method, path, body=None, headers=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


class Proc:
    """A process whose JSON log lines on stderr are kept; `ports` from its "listening" events."""

    def __init__(self, argv, env):
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines = []
        self.ports = {}
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace")
            self.lines.append(line)
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "listening":
                self.ports[ev.get("listener", "serve")] = ev["port"]
                self.ready.set()
        self.ready.set()

    def wait_ports(self, names, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(n in self.ports for n in names):
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        check(all(n in self.ports for n in names), "listening", "".join(self.lines)[-3000:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# ---- PostgreSQL: the posts of one tenant ----

pg = pgfix.PgServer().start()
pg.sql("CREATE TABLE posts (id bigint PRIMARY KEY, tenant_id text NOT NULL, title text);"
       "INSERT INTO posts VALUES (1, '%s', 'keep'), (2, '%s', 'held then allowed'), (3, '%s', 'protected');"
       % (TENANT, TENANT, TENANT))


def post_exists(pid):
    return pg.scalar("SELECT count(*) FROM posts WHERE id = %d" % pid) == "1"


# ---- the decider: holds post 2, then allows it; denies post 3 ----

seen_before_answer = {}


def judge(req):
    where = (req["body"] or {}).get("args", {}).get("where")
    if where == {"id": 2}:
        time.sleep(0.5)
        seen_before_answer[2] = post_exists(2)
        return 200, b'{"v":1,"decision":"allow"}', {"Content-Type": "application/json"}
    if where == {"id": 3}:
        seen_before_answer[3] = post_exists(3)
        return 200, b'{"v":1,"decision":"deny","reason":"post 3 is protected"}', {"Content-Type": "application/json"}
    return 200, b'{"v":1,"decision":"deny","reason":"unexpected call"}', {"Content-Type": "application/json"}


decider = decidefix.Decider().start()
decider.reset(judge)

# ---- the broker ----

benv = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
benv.update({
    "SANDBOX_BROKER_ADMIN_SECRET": ADMIN,
    "SANDBOX_BROKER_LISTEN": "127.0.0.1:0",
    "SANDBOX_BROKER_ADMIN_LISTEN": "127.0.0.1:0",
    "SANDBOX_BROKER_THREADS": "1",
    "SANDBOX_BROKER_DATABASE_URL": pg.url,
    "SANDBOX_BROKER_TARGETS": json.dumps({"app": {"collections": {"posts": {
        "table": "posts", "key": "id", "scope": {"tenant_id": "tenantId"}}}}}),
    "SANDBOX_BROKER_DECIDER": json.dumps({"url": decider.url, "timeout_ms": 5000}),
})
broker = Proc([BROKER], benv)
broker.wait_ports(["public", "admin"])
deadline = time.monotonic() + 20
while time.monotonic() < deadline and req(broker.ports["public"], "GET", "/readyz")[0] != 200:
    time.sleep(0.1)
BROKER_URL = "http://127.0.0.1:%d/api/sandbox/rpc" % broker.ports["public"]

CAPS = {"data": {"collections": {"posts": ["read", "delete"]}}, "decide": {"methods": ["collections.posts.delete"]},
        "timeoutMs": 20000}


def mint(run_id):
    body = json.dumps({"runId": run_id, "capabilities": CAPS, "target": "app", "scope": {"tenantId": TENANT}})
    st, raw = req(broker.ports["admin"], "POST", "/admin/v1/tokens", body,
                   {"Authorization": "Bearer " + ADMIN, "Content-Type": "application/json"})
    check(st == 201, "mint", st, raw)
    return json.loads(raw)["token"]


# ---- sandbox-shim serve ----

senv = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_") and k not in ("PORT", "DENO_BIN")}
senv.update({"SANDBOX_HOST_ADMISSION_SECRET": ADMISSION_SECRET, "SANDBOX_BROKER_URL": BROKER_URL})
serve = Proc([SHIM, "serve", "--listen", "127.0.0.1:0", "--deno", DENO], senv)
serve.wait_ports(["serve"])


def run(source, token):
    body = json.dumps({"mode": "host", "source": source, "capabilities": {"net": [], "import": [], "timeoutMs": 20000,
                                                                          "memoryMb": 128},
                       "bindings": {"url": BROKER_URL, "token": token}})
    st, raw = req(serve.ports["serve"], "POST", "/run", body,
                   {"content-type": "application/json", "x-questpie-sandbox-host-admission": ADMISSION_SECRET})
    check(st == 200, "POST /run", st, raw)
    return json.loads(raw)


def t_held_then_allowed():
    tok = mint("run-decide-allow")
    t0 = time.monotonic()
    o = run("export default async () => await questpie.collections.posts.delete({ where: { id: 2 } });", tok)
    took = time.monotonic() - t0
    check(o.get("ok") is True, "the run succeeded", o, "".join(broker.lines)[-2000:])
    check(isinstance(o.get("output"), dict), "the delete's result came back", o)
    check(seen_before_answer.get(2) is True, "post 2 still existed while the decision was held", seen_before_answer)
    check(not post_exists(2), "post 2 deleted after the allow")
    check(post_exists(1), "post 1 untouched")
    check(took >= 0.5, "the call was held for the decision", took)
    q = [r for r in decider.requests if (r["body"] or {}).get("args", {}).get("where") == {"id": 2}]
    check(len(q) == 1, "one decision asked", decider.requests)
    b = q[0]["body"]
    check(b["method"] == "collections.posts.delete" and b["runId"] == "run-decide-allow" and b["target"] == "app" and
          b["args"] == {"collection": "posts", "where": {"id": 2}}, "the description", b)
    check(tok.encode() not in q[0]["raw"], "the token is never sent to the decider")


def t_denied():
    tok = mint("run-decide-deny")
    o = run("export default async () => await questpie.collections.posts.delete({ where: { id: 3 } });", tok)
    check(o.get("ok") is False, "the run ends", o)
    # the host sees upstream's text for the code; the decider's reason is in serve's log line
    check(o.get("error") == "sandbox binding operation forbidden", "the run ends with upstream's text", o)
    deadline = time.monotonic() + 10
    detail = ""
    while time.monotonic() < deadline and "post 3 is protected" not in detail:
        for line in list(serve.lines):
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "run" and "detail" in ev:
                detail = ev["detail"]
        time.sleep(0.05)
    check("the decider denied collections.posts.delete: post 3 is protected" in detail, "the reason reaches the run's log line",
          detail)
    check(seen_before_answer.get(3) is True and post_exists(3), "post 3 never deleted")


def t_guest_sees_reason():
    tok = mint("run-decide-reply")
    path = os.path.join(TMP, "guest.ts")
    with open(path, "w") as f:
        f.write("""
export default async () => {
  try { await questpie.collections.posts.delete({ where: { id: 3 } }); return "deleted"; }
  catch (e) { return { code: e.code, message: e.message }; }
};""")
    env = dict(os.environ, SB_DECIDE_TOKEN=tok)
    p = subprocess.run([SHIM, "run", "--broker-url", BROKER_URL, "--token-env", "SB_DECIDE_TOKEN", "--source", path,
                        "--deno", DENO, "--on-denial", "reply"], env=env, capture_output=True, timeout=60)
    check(p.returncode == 0, "shim exit 0", p.returncode, p.stderr[-2000:])
    o = json.loads(p.stdout.decode().splitlines()[0])
    check(o["ok"] and o["output"] == {"code": "forbidden",
                                      "message": "the decider denied collections.posts.delete: post 3 is protected"},
          "the guest caught the refusal with the decider's reason", o)
    check(post_exists(3), "post 3 still there")


def t_clean_exit():
    check(serve.stop() == 0, "serve exits 0", "".join(serve.lines)[-2000:])
    check(broker.stop() == 0, "the broker drains and exits 0 (no sanitizer report)", "".join(broker.lines)[-3000:])


try:
    tap.case("serve: a delete held for the decider, then allowed", t_held_then_allowed)
    tap.case("serve: a delete the decider denies ends the run; its reason in the run's log line", t_denied)
    tap.case("run --on-denial reply: the guest sees the deny reason", t_guest_sees_reason)
    tap.case("serve and the broker exit cleanly", t_clean_exit)
finally:
    serve.stop()
    broker.stop()
    decider.stop()
    pg.close()
    shutil.rmtree(TMP, ignore_errors=True)
tap.done()
