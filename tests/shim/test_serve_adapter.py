"""End to end: an adapter written like the upstream one (serve_adapter_client.mjs, Node)
drives sandbox-shim serve against the real broker and a real PostgreSQL target.

Starts PostgreSQL (tests/integration/pgfix.py: its own cluster, or a fresh database on
SB_TEST_PG_URL), the broker with a target "app" (posts and the document store), the
net-mint credential and loopback egress, a loopback upstream for fetch, and serve; then
runs the client and checks what it did from the outside: the rows in PostgreSQL, the
broker's net-mint mints and revocations, serve's log lines.
Needs Deno and Node; SKIP (77) without them.
"""
import sys
sys.dont_write_bytecode = True  # noqa: E402
import json
import os
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import pgfix  # noqa: E402
import sbtest  # noqa: E402
from common import SHIM, Tap, check, find_deno  # noqa: E402

DENO = find_deno()
NODE = shutil.which("node")
if DENO is None or NODE is None:
    print("1..0 # SKIP needs deno (SB_DENO or SB_NODE_PREFIX) and node", flush=True)
    sys.exit(77)

SECRET = "adapter-host-admission-secret-0123456789abcdef"
NETMINT = "adapter-net-mint-secret-0123456789abcdefgh"
tap = Tap()


class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen = []

    def log_message(self, *a):
        pass

    def do_GET(self):
        Upstream.seen.append((self.path, self.headers.get("x-probe")))
        body = b"hello from upstream"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main():
    pg = pgfix.PgServer().start()
    up = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    broker = serve = None
    try:
        pg.sql("CREATE TABLE posts (id bigserial PRIMARY KEY, tenant_id text NOT NULL, title text, views int)")
        pg.sql_file(os.path.join(sbtest.SOURCE_DIR, "deploy", "sql", "document_store.sql"))
        config = {
            "database_url": pg.url,
            "targets": {"app": {
                "collections": {"posts": {"table": "posts", "key": "id", "scope": {"tenant_id": "tenantId"}}},
                "document_store": {"table": "document_store", "scope": {"tenant_id": "tenantId"}}}},
            "egress": {"allow_cidrs": ["127.0.0.1/32"], "deny_local_interfaces": False},
        }
        broker = sbtest.Broker(config=config, env={"SANDBOX_BROKER_ADMIN_NET_MINT_SECRET": NETMINT,
                                                   "SANDBOX_BROKER_LOG_CALLS": "true"}).start()
        sbtest.poll(lambda: broker.public("GET", "/readyz").status == 200, 15)
        rpc_url = "http://127.0.0.1:%d/api/sandbox/rpc" % broker.port
        admin_url = "http://127.0.0.1:%d" % broker.admin_port

        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
        env.update({"SANDBOX_HOST_ADMISSION_SECRET": SECRET, "SANDBOX_BROKER_URL": rpc_url,
                    "SANDBOX_BROKER_ADMIN_URL": admin_url, "SANDBOX_NET_MINT_SECRET": NETMINT, "DENO_BIN": DENO,
                    "PORT": "0"})
        serve = subprocess.Popen([SHIM, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        lines = []
        first = json.loads(serve.stderr.readline())
        check(first["event"] == "listening", "serve listening", first)
        port = first["port"]
        threading.Thread(target=lambda: [lines.append(x.decode()) for x in serve.stderr], daemon=True).start()

        def t_adapter():
            cenv = dict(os.environ, SANDBOX_URL="http://127.0.0.1:%d" % port, SANDBOX_HOST_ADMISSION_SECRET=SECRET,
                        SB_BROKER_RPC_URL=rpc_url, SB_BROKER_ADMIN_URL=admin_url, SB_BROKER_ADMIN_SECRET=broker.secret,
                        SB_UPSTREAM_URL="http://127.0.0.1:%d" % up.server_address[1])
            p = subprocess.run([NODE, os.path.join(HERE, "serve_adapter_client.mjs")], env=cenv, capture_output=True,
                               text=True, timeout=240)
            check(p.returncode == 0, "the adapter's scenarios", p.stdout, p.stderr)

        def t_database():
            rows = pg.sql("SELECT tenant_id, title, views FROM posts ORDER BY id")
            check(rows == [["adapter-t1", "written by a guest", "7"]], "the guest's write, in its tenant only", rows)
            notes = pg.sql("SELECT tenant_id, store, key, data::text FROM document_store ORDER BY id")
            check(notes == [["adapter-t1", "notes", "k1", '{"v": 3}']], "the store sugar's writes, in its tenant", notes)

        def t_net_tokens():
            evs = broker.events()
            minted = [e for e in evs if e.get("event") == "token.minted" and e.get("credential") == "net-mint"]
            revoked = [e for e in evs if e.get("event") == "token.revoked" and e.get("credential") == "net-mint"]
            check(len(minted) == 2 and all(e["runId"].startswith("net-mint:") for e in minted), "a token per net run", minted)
            check(sorted(e["token"] for e in revoked) == sorted(e["token"] for e in minted), "each revoked after its run",
                  minted, revoked)
            check(Upstream.seen == [("/hello?x=1", "yes")], "the upstream saw the one fetch, headers relayed", Upstream.seen)

        def t_serve_log():
            time.sleep(0.2)
            runs = [json.loads(x) for x in lines if '"event":"run"' in x]
            outcomes = [r["outcome"] for r in runs]
            check(outcomes.count("ok") >= 3 and "timeout" in outcomes, "runs logged", outcomes)
            check(all(r.get("revoke") == "ok" for r in runs if r.get("revoke") is not None), "revocations ok", runs)
            check(sum(1 for r in runs if r.get("revoke") == "ok") == 2, "two revocations", runs)
            details = [r.get("detail", "") for r in runs if r["outcome"] == "call_denied"]
            check(any(d.startswith("binding call collections.posts.create failed: forbidden: ") for d in details)
                  and any(d.startswith("binding call collections.posts.find failed: unauthorized: ") for d in details),
                  "the denials' method, code and reason are in serve's log lines", details)
            blob = "".join(lines)
            check(SECRET not in blob and NETMINT not in blob and "written by a guest" not in blob, "nothing private")

        tap.case("an upstream-style adapter drives serve: bindings, denial, revocation, compute, net, timeout", t_adapter)
        tap.case("PostgreSQL holds the guest's writes, clamped to its tenant", t_database)
        tap.case("net runs: a net-mint token each, revoked after the run", t_net_tokens)
        tap.case("serve's log lines", t_serve_log)
    finally:
        if serve is not None:
            serve.terminate()
            try:
                serve.wait(30)
            except subprocess.TimeoutExpired:
                serve.kill()
        if broker is not None:
            broker.stop()
        up.shutdown()
        pg.close()


main()
tap.done()
