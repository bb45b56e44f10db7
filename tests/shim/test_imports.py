"""capabilities.import end to end: Deno guests posted to `sandbox-shim serve` load remote modules, every
byte through the real broker's import.fetch (PROTOCOL.md sections 2 and 6c; supervisor-shim/README.md,
"The module path").

Everything is on loopback or in namespaces the jail makes: dnsmasq (tests/integration/fetchfix_dns.py) is
the broker's resolver and maps tls.test and other.test to 127.0.0.1; the module servers are recording
HTTPS servers with a throw-away CA (fetchfix_upstream.TestPki) whose leaves name tls.test and other.test.
The guest has no socket that leaves its jail: its module requests reach listeners the jail made on the
loopback of its own network namespace, and the shim fetches each module through the broker. Each refusal
is checked twice: the run's answer, and that the server holding the refused module saw nothing.

Needs root (the jail's network namespace) and Deno (SB_DENO, or SB_NODE_PREFIX/node_modules/.bin/deno).
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

from common import SHIM, SOURCE_DIR, Tap, check, find_deno, needs_root

DENO = find_deno()
if DENO is None:
    print("1..0 # SKIP deno not found: set SB_DENO, or SB_NODE_PREFIX after "
          "`npm install --prefix \"$SB_NODE_PREFIX\" deno@2.9.6`", flush=True)
    sys.exit(77)

sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "integration"))
import sbtest  # noqa: E402
from fetchfix_dns import Dnsmasq  # noqa: E402
from fetchfix_upstream import TestPki, Upstream  # noqa: E402

ADMISSION = "x-questpie-sandbox-host-admission"
ADMISSION_SECRET = "questpie-sandbox-host-service-key-32-bytes-minimum"
NETMINT_SECRET = "net-mint-secret-for-the-import-tests-0123456789"
CAPS = {"net": [], "import": [], "timeoutMs": 10000, "memoryMb": 128}

tap = Tap()
TMP = tempfile.mkdtemp(prefix="sb-imports-")
os.chmod(TMP, 0o711)  # jailed guests run as other uids
PKI = DNS = B = S = None
UP = {}


def mod_routes(h, rec):
    path = rec.target.split("?")[0]
    other = "https://other.test:%d" % UP["other"].port
    js, ts = [("Content-Type", "application/javascript; charset=utf-8")], [("Content-Type", "application/typescript")]
    if path == "/lib/a.js":
        h.reply(200, b'export { b } from "./b.ts";\nexport const a = 1;\n', js)
    elif path == "/lib/b.ts":
        h.reply(200, b'export const b: number = 2;\n', ts)
    elif path == "/moved.js":
        h.reply(302, b"", [("Location", "/v2/real.js")])
    elif path == "/v2/real.js":
        # a path-absolute import and a relative one, resolved against the final URL
        h.reply(200, b'export * from "/lib/a.js";\nexport { c } from "./c.js";\nexport const real = "r";\n', js)
    elif path == "/v2/c.js":
        h.reply(200, b'export const c = "c";\n', js)
    elif path == "/cross.js":
        h.reply(200, ('export { o } from "%s/o.js";\n' % other).encode(), js)
    elif path == "/away.js":
        h.reply(302, b"", [("Location", other + "/o.js")])
    elif path == "/o.js":
        h.reply(200, b'export const o = "other";\n', js)
    elif path == "/slow.js":
        time.sleep(4)
        h.reply(200, b'export const slow = 1;\n', js)
    elif path == "/slower.js":
        time.sleep(6)  # within the broker's egress deadline (8 s, setup)
        h.reply(200, b'export const slower = 2;\n', js)
    elif path == "/missing.js":
        h.reply(404, b"not found", [("Content-Type", "text/plain")])
    else:
        h.reply(500, b"unexpected path")


def origin(name):
    return "https://%s.test:%d" % (name, UP[name].port)


def entry(name):
    return "%s.test:%d" % (name, UP[name].port)


class Serve:
    def __init__(self):
        e = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
        e.update({"SANDBOX_HOST_ADMISSION_SECRET": ADMISSION_SECRET, "SANDBOX_NET_MINT_SECRET": NETMINT_SECRET,
                  "SANDBOX_BROKER_URL": "http://127.0.0.1:%d%s" % (B.port, sbtest.RPC_PATH),
                  "SANDBOX_BROKER_ADMIN_URL": "http://127.0.0.1:%d" % B.admin_port})
        self.proc = subprocess.Popen([SHIM, "serve", "--listen", "127.0.0.1:0", "--deno", DENO, "--pool-size", "1"], env=e,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines, self.port = [], None
        got = threading.Event()

        def read():
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace")
                self.lines.append(line)
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("event") == "listening":
                    self.port = ev["port"]
                    got.set()
            got.set()

        threading.Thread(target=read, daemon=True).start()
        got.wait(60)
        if self.port is None:
            raise RuntimeError("serve did not start:\n" + "".join(self.lines))

    def run(self, fields, timeout=60):
        body = {"mode": "host", "capabilities": dict(CAPS)}
        body.update(fields)
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("POST", "/run", body=json.dumps(body), headers={ADMISSION: ADMISSION_SECRET,
                                                                      "Content-Type": "application/json"})
            r = c.getresponse()
            raw = r.read()
            check(r.status == 200, "HTTP 200", r.status, raw)
            return json.loads(raw)
        finally:
            c.close()

    def runs(self):
        time.sleep(0.1)
        out = []
        for line in self.lines:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "run":
                out.append(ev)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def caps(imports, net=()):
    return dict(CAPS, **{"import": list(imports), "net": list(net)})


def bound(run_id, imports, net=()):
    """bindings for a run: a token minted with that import (and net) list"""
    tok = B.mint_ok(run_id, {"import": list(imports), "net": list(net)})
    return {"url": "http://127.0.0.1:%d%s" % (B.port, sbtest.RPC_PATH), "token": tok}


def paths(name):
    return [r.target.split("?")[0] for r in UP[name].snapshot()]


def reset():
    for u in UP.values():
        u.reset()


# ---- what works ----

STATIC = """import { a, b } from "%(o)s/lib/a.js";
export default async () => {
  const m = await import("%(o)s/moved.js");
  return { a, b, real: m.real, a2: m.a, c: m.c, url: import.meta.url.startsWith("data:") };
};"""


def t_static_dynamic_relative_redirect():
    """static and dynamic imports, a relative TypeScript import, a redirect whose module imports path-absolute and
    relative URLs (resolved against the final URL), with bindings"""
    reset()
    o = S.run({"source": STATIC % {"o": origin("tls")}, "capabilities": caps([entry("tls")]),
               "bindings": bound("imp-static", [entry("tls")])})
    check(o["ok"] is True and o["output"] == {"a": 1, "b": 2, "real": "r", "a2": 1, "c": "c", "url": True}, "the modules", o)
    got = paths("tls")
    check(sorted(got) == sorted(["/lib/a.js", "/lib/b.ts", "/moved.js", "/v2/real.js", "/v2/c.js"]),
          "each module fetched once, the redirect's target once (by the broker)", got)
    recs = UP["tls"].snapshot()
    check(all(r.sni == "tls.test" and r.header("host") == entry("tls") for r in recs), "SNI and Host name the import host",
          [(r.sni, r.header("host")) for r in recs])
    check(all(r.method == "GET" and not {"x-questpie-sandbox-token", "authorization", "cookie"} & set(n.lower() for n in r.names())
              for r in recs), "GET, no token, no credential", [r.names() for r in recs])
    ev = S.runs()[-1]
    check(ev["outcome"] == "ok" and ev["modules"] == 4 and ev["calls"] == 0 and ev["pooled"] is False and
          "127.0.0.1:41" not in json.dumps(ev), "serve's log line: four import.fetch calls (one brought the redirect's target), "
          "started cold", ev)
    check("modules" not in o and "calls" not in o, "the answer is upstream's", o)


def t_without_bindings():
    """a run without bindings gets its modules under a token minted with the net-mint credential"""
    reset()
    src = 'import { a } from "%s/lib/a.js";\nexport default () => a + 41;' % origin("tls")
    o = S.run({"source": src, "capabilities": caps([entry("tls")])})
    check(o["ok"] is True and o["output"] == 42, "the module", o)
    check(sorted(paths("tls")) == ["/lib/a.js", "/lib/b.ts"], "fetched through the broker", paths("tls"))


def t_two_origins():
    """a module of one import origin imports a module of another, absolute"""
    reset()
    src = 'import { o } from "%s/cross.js";\nexport default () => o;' % origin("tls")
    o = S.run({"source": src, "capabilities": caps([entry("tls"), entry("other")]),
               "bindings": bound("imp-two", [entry("tls"), entry("other")])})
    check(o["ok"] is True and o["output"] == "other", "both origins", o)
    check(paths("tls") == ["/cross.js"] and paths("other") == ["/o.js"], "each server its module", paths("tls"), paths("other"))


# ---- what is refused ----

def t_host_outside_import():
    """a module of a host outside the import list: refused by Deno, the host named, the server never asked"""
    reset()
    src = 'export default async () => (await import("%s/o.js")).o;' % origin("other")
    o = S.run({"source": src, "capabilities": caps([entry("tls")]), "bindings": bound("imp-out", [entry("tls")])})
    check(o["ok"] is False and "other.test:%d" % UP["other"].port in o["error"] and "import" in o["error"],
          "refused, naming the host", o)
    check(paths("other") == [], "never fetched", paths("other"))


def t_static_import_of_unlisted_host():
    """the same for a static import in a module of a listed host: its whole graph is refused"""
    reset()
    src = 'import { o } from "%s/cross.js";\nexport default () => o;' % origin("tls")
    o = S.run({"source": src, "capabilities": caps([entry("tls")]), "bindings": bound("imp-static-out", [entry("tls")])})
    check(o["ok"] is False and o["error"].startswith("guest module failed to load: ") and
          "other.test:%d" % UP["other"].port in o["error"], "refused, naming the host", o)
    check(paths("other") == [], "never fetched", paths("other"))


def t_redirect_outside_import():
    """a redirect hop to a host outside the import list: the broker refuses it; the error names the module's URL"""
    reset()
    src = 'export default async () => (await import("%s/away.js")).o;' % origin("tls")
    o = S.run({"source": src, "capabilities": caps([entry("tls")]), "bindings": bound("imp-away", [entry("tls")])})
    check(o["ok"] is False and origin("tls") + "/away.js" in o["error"] and "127.0.0.1" not in o["error"],
          "refused, the module named by its own URL", o)
    check(paths("tls") == ["/away.js"] and paths("other") == [], "the hop never followed", paths("tls"), paths("other"))
    ev = S.runs()[-1]
    check("module %s/away.js" % origin("tls") in ev.get("detail", ""), "serve's log line says which module", ev)


def t_missing_module():
    reset()
    src = 'import { x } from "%s/missing.js";\nexport default () => x;' % origin("tls")
    o = S.run({"source": src, "capabilities": caps([entry("tls")]), "bindings": bound("imp-404", [entry("tls")])})
    check(o["ok"] is False and origin("tls") + "/missing.js" in o["error"] and "127.0.0.1" not in o["error"],
          "a 404 names the module", o)
    check(paths("tls") == ["/missing.js"], "asked once", paths("tls"))
    ev = S.runs()[-1]
    check("module %s/missing.js: its server answered HTTP 404" % origin("tls") in ev.get("detail", ""), "serve's log line", ev)


def t_import_grant_is_no_fetch_grant():
    """an import grant never lets the guest fetch that host; a net grant never lets it import"""
    reset()
    src = 'export default async () => (await fetch("%s/lib/a.js")).status;' % origin("tls")
    o = S.run({"source": src, "capabilities": caps([entry("tls")]), "bindings": bound("imp-fetch", [entry("tls")])})
    check(o["ok"] is False and o["error"] == "sandbox binding operation forbidden", "fetch of an import host", o)
    src = 'import { a } from "%s/lib/a.js";\nexport default () => a;' % origin("tls")
    o = S.run({"source": src, "capabilities": caps([], net=[entry("tls")]), "bindings": bound("imp-net", [], net=[entry("tls")])})
    check(o["ok"] is False and o["error"].startswith("guest module failed to load: "), "import of a net host", o)
    check(paths("tls") == [], "neither reached the server", paths("tls"))


def t_token_without_import():
    """the serve request lists an import host the run's token does not: the broker refuses the module"""
    reset()
    src = 'import { a } from "%s/lib/a.js";\nexport default () => a;' % origin("tls")
    o = S.run({"source": src, "capabilities": caps([entry("tls")]), "bindings": bound("imp-notok", [])})
    check(o["ok"] is False and origin("tls") + "/lib/a.js" in o["error"], "refused by the broker", o)
    check(paths("tls") == [], "never fetched", paths("tls"))
    ev = S.runs()[-1]
    check("forbidden" in ev.get("detail", ""), "the broker's code in serve's log line", ev)


def t_timeout_covers_modules():
    """the run's timeout counts while its modules load"""
    reset()
    src = 'import { slow } from "%s/slow.js";\nexport default () => slow;' % origin("tls")
    o = S.run({"source": src, "capabilities": dict(caps([entry("tls")]), timeoutMs=1500),
               "bindings": bound("imp-slow", [entry("tls")])})
    # the module arrives 4 s after it is asked for: a run that saw it would have answered ok
    check(o["ok"] is False and o.get("timedOut") is True, "timed out while the module loaded", o)


def deno_guests():
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[0] == b"/runtime/deno":
            out.append(int(d))
    return out


def listeners(pid):
    """the listening TCP sockets of the process's network namespace, as (address hex, port)"""
    out = []
    for name in ("tcp", "tcp6"):
        with open("/proc/%d/net/%s" % (pid, name)) as f:
            for line in f.read().splitlines()[1:]:
                parts = line.split()
                if parts[3] == "0A":  # LISTEN
                    addr, port = parts[1].split(":")
                    out.append((name, addr, int(port, 16)))
    return out


def t_guest_namespace():
    """seen from outside while the guest waits for a module: its network namespace holds its loopback and the
    module path's listeners (one per origin, on 127.0.0.1 from port 41000) and nothing else"""
    reset()
    src = 'import { slower } from "%s/slower.js";\nexport default () => slower;' % origin("tls")
    res = {}
    before = set(deno_guests())
    th = threading.Thread(target=lambda: res.update(o=S.run({"source": src, "capabilities": dict(caps([entry("tls"), entry("other")]),
                                                                                               timeoutMs=25000),
                                                             "bindings": bound("imp-ns", [entry("tls"), entry("other")])})))
    th.start()
    seen = None
    deadline = time.monotonic() + 5  # the guest waits 6 s for its module
    while time.monotonic() < deadline and seen is None:
        for pid in set(deno_guests()) - before:
            try:
                if listeners(pid):
                    seen = pid
            except OSError:
                continue
        time.sleep(0.05)
    check(seen is not None, "the import run's guest")
    ls = sorted(listeners(seen))
    with open("/proc/%d/net/dev" % seen) as f:
        ifaces = sorted(line.split(":")[0].strip() for line in f.read().splitlines()[2:])
    with open("/proc/%d/status" % seen) as f:
        status = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
    th.join(30)
    check(ls == [("tcp", "0100007F", 41000), ("tcp", "0100007F", 41001)], "two listeners on 127.0.0.1, nothing else", ls)
    check(ifaces == ["lo"], "only a loopback", ifaces)
    check(status["Seccomp"].strip() == "2" and status["CapEff"].strip() == "0000000000000000", "filtered, no capabilities", status)
    check(res["o"]["ok"] is True and res["o"]["output"] == 2, "and the run went on", res)


def t_run_cli():
    """`sandbox-shim run --import`: the same module path for a single run"""
    reset()
    src = os.path.join(TMP, "guest.js")
    with open(src, "w") as f:
        f.write(STATIC % {"o": origin("tls")})
    os.chmod(src, 0o644)
    tok = B.mint_ok("imp-run-cli", {"import": [entry("tls")]})
    e = {"PATH": "/usr/bin:/bin", "T": tok, "TMPDIR": TMP}
    argv = [SHIM, "run", "--broker-url", "http://127.0.0.1:%d%s" % (B.port, sbtest.RPC_PATH), "--token-env", "T", "--source", src,
            "--deno", DENO, "--import", entry("tls")]
    p = subprocess.run(argv, env=e, capture_output=True, text=True, timeout=60)
    o = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {}
    check(p.returncode == 0 and o.get("ok") is True and o["output"]["c"] == "c" and o["output"]["b"] == 2, "the modules", p.returncode,
          p.stdout, p.stderr[-2000:])
    check(tok not in p.stdout + p.stderr, "the token in no output")
    check(o["modules"] == 4 and o["calls"] == 0, "run's outcome counts the import.fetch calls (the redirect's target came with it)", o)
    # a bad entry is a usage error, nothing run; --jail=off cannot hold the module path
    p = subprocess.run(argv[:-1] + ["tls.test:0"], env=e, capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "--import: an import entry must be a host name" in p.stderr and p.stdout == "", "bad entry", p.stderr)
    p = subprocess.run(argv + ["--jail=off"], env=e, capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "remote module imports need the jail" in p.stderr, "--jail=off", p.returncode, p.stderr)
    check(sorted(paths("tls")) == sorted(["/lib/a.js", "/lib/b.ts", "/moved.js", "/v2/real.js", "/v2/c.js"]), "fetched once each",
          paths("tls"))


def t_clean_exit():
    """serve drains and exits 0 (under ASan: nothing leaked), and so does the broker"""
    global S
    rc, log = S.stop(), "".join(S.lines)
    S = None
    check(rc == 0, "serve exited 0", rc, log[-3000:])
    check(NETMINT_SECRET not in log and ADMISSION_SECRET not in log, "no secret in serve's log")


def setup():
    global PKI, DNS, B, S
    PKI = TestPki().make()
    DNS = Dnsmasq(["tls.test,127.0.0.1", "other.test,127.0.0.1"]).start()
    UP["tls"] = Upstream({"*": mod_routes}, tls=PKI.server_context(PKI.tls_leaf)).start()
    UP["other"] = Upstream({"*": mod_routes}, tls=PKI.server_context(PKI.other_leaf)).start()
    config = {"egress": {"dns_servers": [DNS.server], "allow_cidrs": ["127.0.0.1/32"], "deny_local_interfaces": False,
                         "ca_file": PKI.ca_file, "deadline_ms": 8000, "connect_timeout_ms": 1000}}
    B = sbtest.Broker(config=config, env={"SANDBOX_BROKER_ADMIN_NET_MINT_SECRET": NETMINT_SECRET}).start()
    S = Serve()


def teardown():
    if S is not None:
        S.stop()
    if B is not None:
        B.stop()
    for u in UP.values():
        u.stop()
    if DNS is not None:
        DNS.stop()
    shutil.rmtree(TMP, ignore_errors=True)


if not needs_root("the jail's network namespace holds the module path"):
    sys.exit(77)  # reported as skipped, never as passed (under SB_TEST_NO_SKIP=1 needs_root fails instead)
setup()
try:
    tap.case("static and dynamic imports, relative TypeScript, a redirect: through the broker", t_static_dynamic_relative_redirect)
    tap.case("a run without bindings: modules under a net-mint token", t_without_bindings)
    tap.case("a module imports one of another import origin", t_two_origins)
    tap.case("a dynamic import of a host outside the import list: refused, never fetched", t_host_outside_import)
    tap.case("a static import of a host outside the import list: refused, never fetched", t_static_import_of_unlisted_host)
    tap.case("a redirect to a host outside the import list: refused, never followed", t_redirect_outside_import)
    tap.case("a missing module: its URL in the error", t_missing_module)
    tap.case("an import grant is no fetch grant; a net grant is no import grant", t_import_grant_is_no_fetch_grant)
    tap.case("a token minted without the import host: the broker refuses its modules", t_token_without_import)
    tap.case("the run's timeout covers module loading", t_timeout_covers_modules)
    tap.case("sandbox-shim run --import", t_run_cli)
    tap.case("the guest's network namespace: a loopback and the module path's listeners only", t_guest_namespace)
    tap.case("serve exits cleanly", t_clean_exit)
finally:
    teardown()
sys.exit(tap.done())
