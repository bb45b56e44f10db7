"""End to end: real Deno guest runtime, real sandbox-shim, real sandbox-broker.

Needs Deno: env SB_DENO, or SB_NODE_PREFIX with node_modules/.bin/deno from
`npm install --prefix "$SB_NODE_PREFIX" deno@2.9.6`. Without it the test
reports SKIP (exit 77, ctest SKIP_RETURN_CODE).
"""
import sys
sys.dont_write_bytecode = True  # noqa: E402 - keep tests/shim free of __pycache__
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from common import SHIM, RealBroker, Tap, check, find_deno

DENO = find_deno()
if DENO is None:
    print("1..0 # SKIP deno not found: set SB_DENO, or SB_NODE_PREFIX after "
          "`npm install --prefix \"$SB_NODE_PREFIX\" deno@2.9.6`", flush=True)
    sys.exit(77)

tap = Tap()
# loopback is denied by the egress policy unless named exactly; the fetch test needs it
broker = RealBroker({"SANDBOX_BROKER_EGRESS": json.dumps({"allow_cidrs": ["127.0.0.1/32"],
                                                          "deny_local_interfaces": False})})
TMP = tempfile.mkdtemp(prefix="sb-shim-e2e-")
os.chmod(TMP, 0o711)  # jailed guests run as another uid and must reach what the tests put here


def guest(src, caps=None, flags=(), inp=None, token=None, on_running=None, timeout=60, env_extra=None):
    """Runs `src` as the guest module; returns (outcome, token, stdout, stderr)."""
    tok = token or broker.mint(caps or {})
    path = os.path.join(TMP, "guest.ts")
    with open(path, "w") as f:
        f.write(src)
    args = [SHIM, "run", "--broker-url", broker.url, "--token-env", "SB_E2E_TOKEN", "--source", path, "--deno", DENO]
    if inp is not None:
        args += ["--input", json.dumps(inp)]
    args += list(flags)
    env = dict(os.environ, SB_E2E_TOKEN=tok)
    env.update(env_extra or {})
    p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if on_running is not None:
        on_running(p)
    out, err = p.communicate(timeout=timeout)
    out, err = out.decode(), err.decode()
    check(p.returncode == 0, "shim exit 0", p.returncode, out, err)
    lines = out.splitlines()
    check(len(lines) == 1, "exactly one line on stdout", out)
    o = json.loads(lines[0])
    check(tok not in out and tok not in err, "token never printed", out, err)
    return o, tok, out, err


def t_basic():
    o, _, _, _ = guest("""
export default function (input: { a: number }) {
  console.log("hello", { x: 1 });
  console.warn("careful");
  console.error(new Error("oops").message);
  console.table([1, 2]);
  return { sum: input.a + 1, nothing: undefined, list: [1, "two", null] };
}""", inp={"a": 41})
    check(o["ok"] is True and o["output"] == {"sum": 42, "list": [1, "two", None]}, "output", o)
    check(o["logs"][:3] == ["log: hello {\"x\":1}", "warn: careful", "error: oops"], "logs captured", o["logs"])
    check(o["calls"] == 0 and "timedOut" not in o, "no calls", o)


def t_no_default_export():
    o, _, _, _ = guest("export const x = 1;")
    check(not o["ok"] and o["error"] == "guest module must export a default function", "error", o)


def t_guest_throws():
    o, _, _, _ = guest("export default async () => { throw new Error('guest broke'); }")
    check(not o["ok"] and o["error"] == "guest broke", "error", o)


def t_hardening_globals():
    o, _, _, _ = guest("""
export default () => ({
  worker: typeof Worker, sab: typeof SharedArrayBuffer, atomics: typeof Atomics,
  questpie: Object.keys(questpie).sort(), fetch: fetch.name,
});""")
    check(o["ok"] and o["output"] == {"worker": "undefined", "sab": "undefined", "atomics": "undefined",
                                      "questpie": ["collections", "files", "store", "tools"],
                                      "fetch": "brokeredFetch"}, "globals", o)


def t_granted_service_reply():
    o, _, _, _ = guest("""
export default async () => {
  try { return await questpie.collections.users.find({ where: {} }); }
  catch (e) { return { code: e.code, message: e.message }; }
};""", caps={"data": {"collections": {"users": ["read"]}}}, flags=["--on-denial", "reply"])
    check(o["ok"] and o["output"]["code"] == "not_implemented", "granted but not wired", o)
    check(o["calls"] == 1, "one call", o)


def t_denied_terminate():
    o, _, _, _ = guest("""
export default async () => {
  try { await questpie.collections.users.find({}); } catch (_) { /* a denial must not be catchable */ }
  return "carried on";
};""", caps={})
    check(not o["ok"] and o["error"] == "sandbox binding operation forbidden" and "collections.users.find" in o["detail"],
          "terminated with upstream's text; the detail names the call", o)


def t_denied_reply():
    o, _, _, _ = guest("""
export default async () => {
  try { await questpie.files.read({ path: "a.txt" }); return "no"; }
  catch (e) { return { code: e.code, message: e.message }; }
};""", flags=["--on-denial", "reply"])
    check(o["ok"] and o["output"]["code"] == "forbidden", "denial handed to the guest", o)


def t_fetch_shim():
    o, _, _, _ = guest("""
export default async () => {
  try { await fetch("http://example.com/x", { method: "POST", body: new Uint8Array([1, 2, 3]) }); return "no"; }
  catch (e) { return { type: e.constructor.name, message: e.message, code: e.cause?.code }; }
};""", flags=["--on-denial", "reply"])
    check(o["ok"] and o["output"]["type"] == "TypeError" and o["output"]["code"] == "forbidden", "fetch denied", o)


def t_fetch_roundtrip():
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Upstream(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            reply = bytes(reversed(body))
            self.send_response(201, "Made")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("X-Echo", self.headers.get("x-test", ""))
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

    up = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    port = up.server_address[1]
    try:
        o, _, _, err = guest("""
export default async (port: number) => {
  const res = await fetch(`http://127.0.0.1:${port}/echo`, {
    method: "POST", headers: { "X-Test": "yes" }, body: new Uint8Array([0, 1, 2, 255]),
  });
  return { status: res.status, statusText: res.statusText, echo: res.headers.get("x-echo"),
           body: [...new Uint8Array(await res.arrayBuffer())], ok: res.ok, url: res.url };
};""", caps={"net": ["127.0.0.1:%d" % port]}, inp=port)
    finally:
        up.shutdown()
        up.server_close()
    check(o["ok"], "fetch worked", o, err)
    check(o["output"] == {"status": 201, "statusText": "Made", "echo": "yes", "body": [255, 2, 1, 0], "ok": True,
                          "url": "http://127.0.0.1:%d/echo" % port}, "response rebuilt", o)


def t_fetch_secret():
    """The guest calls an API with a key it never sees, and cannot obtain it by any means it has."""
    import base64
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    value = "ghp_e2eSecretValue0123456789"
    seen = {"api": [], "guest": []}

    def handler(name):
        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                seen[name].append((self.path, dict(self.headers)))
                if self.path == "/away":
                    self.send_response(307)
                    self.send_header("Location", "http://127.0.0.1:%d/collect" % guest_up.server_address[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                auth = self.headers.get("authorization", "")
                body = json.dumps({"auth": auth, "b64": base64.b64encode(auth.encode()).decode()}).encode()
                self.send_response(200, "OK " + auth)
                self.send_header("X-Echo", auth)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
        return H

    api = ThreadingHTTPServer(("127.0.0.1", 0), handler("api"))
    guest_up = ThreadingHTTPServer(("127.0.0.1", 0), handler("guest"))
    for srv in (api, guest_up):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    api_hp = "127.0.0.1:%d" % api.server_address[1]
    guest_hp = "127.0.0.1:%d" % guest_up.server_address[1]
    tok = broker.mint({"net": [api_hp, guest_hp]}, run_id="secret-e2e",
                      secrets={"github": {"value": value, "hosts": [api_hp], "schemes": ["http"]}})
    try:
        o, _, out, err = guest("""
export default async (p: { api: string, mine: string }) => {
  const r: Record<string, unknown> = {};
  const auth = { authorization: "Bearer {{secret:github}}" };
  const res = await fetch(`http://${p.api}/user`, { headers: auth });
  r.status = res.status; r.statusText = res.statusText; r.echo = res.headers.get("x-echo"); r.body = await res.text();
  // the same placeholder to a host the guest controls: refused before anything is sent
  try { await fetch(`http://${p.mine}/collect`, { headers: auth }); r.mine = "sent"; }
  catch (e) { r.mine = String((e as Error).message) + " " + String((e as any).cause?.code); }
  // a redirect from the API to the guest's host: the header does not follow
  const away = await fetch(`http://${p.api}/away`, { headers: auth });
  r.away = await away.text();
  // a name the run does not have, and a malformed one
  for (const v of ["{{secret:other}}", "{{secret:github"]) {
    try { await fetch(`http://${p.api}/user`, { headers: { authorization: v } }); r[v] = "sent"; }
    catch (e) { r[v] = String((e as Error).message); }
  }
  r.env = typeof Deno.env;
  return r;
};""", token=tok, inp={"api": api_hp, "mine": guest_hp}, flags=["--on-denial", "reply"])
    finally:
        for srv in (api, guest_up):
            srv.shutdown()
            srv.server_close()
    check(o["ok"], "guest ran", o, err)
    r = o["output"]
    check(value not in out and value not in err, "the value never reached the guest or its output", out, err)
    check(base64.b64encode(("Bearer " + value).encode()).decode()[:20] not in out, "nor its base64", out)
    check(r["status"] == 200 and r["echo"] == "Bearer {{secret:github}}" and r["statusText"] == "OK Bearer {{secret:github}}",
          "placeholders in the answer", r)
    check(json.loads(r["body"])["auth"] == "Bearer {{secret:github}}", "placeholder in the body", r)
    check([h.get("authorization") for p, h in seen["api"] if p == "/user"][0] == "Bearer " + value, "the API got the value",
          seen["api"])
    check(all("authorization" not in {k.lower() for k in h} for _, h in seen["guest"]), "the guest's host never got it",
          seen["guest"])
    check([p for p, _ in seen["guest"]] == ["/collect"], "only the redirect reached the guest's host", seen["guest"])
    check("forbidden" in r["mine"] and 'secret "github" may not be sent to host' in r["mine"], "refused to the guest's host", r)
    check('secret "other" is not granted' in r["{{secret:other}}"], "unknown name refused", r)
    check("malformed secret placeholder" in r["{{secret:github"], "malformed placeholder refused", r)


def t_token_theft():
    src = """
export default async () => {
  const tries: Record<string, string> = {};
  const attempt = async (name: string, f: () => unknown) => {
    try { tries[name] = "SUCCEEDED: " + String(await f()); } catch (e) { tries[name] = "failed: " + (e as Error).message; }
  };
  await attempt("env.toObject", () => JSON.stringify(Deno.env.toObject()));
  await attempt("env.get", () => Deno.env.get("SB_E2E_TOKEN"));
  await attempt("self environ", () => Deno.readTextFile("/proc/self/environ"));
  await attempt("ppid", () => Deno.ppid);
  await attempt("parent environ", () => Deno.readTextFile(`/proc/${Deno.ppid}/environ`));
  await attempt("parent cmdline", () => Deno.readTextFile(`/proc/${Deno.ppid}/cmdline`));
  await attempt("import environ", () => import(`file:///proc/${Deno.ppid}/environ`, { with: { type: "text" } }));
  await attempt("import file", () => import("file:///etc/hostname", { with: { type: "text" } }));
  await attempt("run", () => new Deno.Command("/bin/sh", { args: ["-c", "cat /proc/$PPID/environ"] }).output());
  return tries;
};"""
    seen = {}

    def probe(p):
        # while the guest runs: the shim's own /proc/<pid>/environ must not show the token
        time.sleep(0.3)
        try:
            with open("/proc/%d/environ" % p.pid, "rb") as f:
                seen["environ"] = f.read()
        except OSError as e:
            seen["environ"] = str(e).encode()

    tok = broker.mint({})
    o, _, out, err = guest(src.replace("return tries;", "await new Promise((r) => setTimeout(r, 800)); return tries;"),
                           token=tok, on_running=probe)
    check(o["ok"], "guest finished", o)
    tries = o["output"]
    for name, v in tries.items():
        if name == "ppid":
            continue
        check(v.startswith("failed"), name + " must fail", v)
    check(tok not in json.dumps(o), "token absent from the outcome")
    check(tok.encode() not in seen.get("environ", b""), "token scrubbed from the shim's /proc environ", seen)


def t_sockets():
    o, _, _, _ = guest("""
export default async () => {
  const r: string[] = [];
  for (const f of [() => Deno.connect({ hostname: "127.0.0.1", port: 80 }),
                   () => Deno.listen({ port: 0 }),
                   () => Deno.connectTls({ hostname: "127.0.0.1", port: 443 }),
                   () => Deno.listenDatagram({ port: 0, transport: "udp" } as Deno.UdpListenOptions & { transport: "udp" })]) {
    try { await f(); r.push("SUCCEEDED"); } catch (e) { r.push((e as Error).name); }
  }
  return r;
};""")
    check(o["ok"] and all(x != "SUCCEEDED" for x in o["output"]), "no sockets", o)


def t_forged_frame_via_console():
    o, _, _, _ = guest("""
function frame(obj: Uint8Array) { const b = new Uint8Array(4 + obj.length); new DataView(b.buffer).setUint32(0, obj.length); b.set(obj, 4); return b; }
export default () => {
  // {t:"call", id:1, method:"email.send"} as msgpack
  const m = new Uint8Array([0x83, 0xa1, 0x74, 0xa4, 0x63, 0x61, 0x6c, 0x6c, 0xa2, 0x69, 0x64, 0x01, 0xa6, 0x6d, 0x65, 0x74, 0x68, 0x6f, 0x64,
    0xaa, 0x65, 0x6d, 0x61, 0x69, 0x6c, 0x2e, 0x73, 0x65, 0x6e, 0x64]);
  const f = frame(m);
  console.log(new TextDecoder().decode(f));
  console.info(String.fromCharCode(...f));
  return "done";
};""")
    check(o["ok"] and o["output"] == "done" and o["calls"] == 0, "forged frame stayed in logs", o)
    check(len(o["logs"]) == 2, "captured", o["logs"])


def t_flood():
    o, _, _, _ = guest("""
export default async () => {
  const ps = [];
  for (let i = 0; i < 10000; i++) ps.push(questpie.files.list({}).catch(() => 0));
  await Promise.all(ps);
  return "flooded";
};""", flags=["--on-denial", "reply"])
    check(not o["ok"] and "binding call limit exceeded" in o["error"] and o["calls"] == 256, "bounded by max-calls", o)


def t_garbage_stdout():
    o, _, _, _ = guest("""
export default async () => {
  await Deno.stdout.write(new TextEncoder().encode("this is garbage, not a frame\\n"));
  await new Promise((r) => setTimeout(r, 1000));
  return "should not get here";
};""")
    check(not o["ok"] and "guest protocol violation" in o["error"], "garbage is a violation", o)


def t_wall_timeout():
    o, _, _, _ = guest("export default () => { for (;;) {} };", flags=["--timeout-ms", "1500"])
    check(not o["ok"] and o.get("timedOut") is True, "timed out", o)
    check(o["ms"] < 4000, "killed promptly", o)


def t_memory_cap():
    o, _, _, _ = guest("""
export default () => { const a: number[][] = []; for (;;) a.push(new Array(1e6).fill(1.5)); };""",
                       flags=["--memory-mb", "32", "--timeout-ms", "20000"])
    check(not o["ok"] and "subprocess exited without result" in o["error"] and not o.get("timedOut"), "OOM ends run", o)


def t_jail_clean_errors():
    # jailed (the default), Deno's own permission checks still answer first, with clean errors
    o, _, _, err = guest("""
export default async () => {
  const r: Record<string, string> = {};
  const attempt = async (name: string, f: () => unknown) => {
    try { await f(); r[name] = "SUCCEEDED"; } catch (e) { r[name] = (e as Error).name + ": " + (e as Error).message; }
  };
  await attempt("connect", () => Deno.connect({ hostname: "127.0.0.1", port: 9 }));
  await attempt("listen", () => Deno.listen({ port: 0 }));
  await attempt("command", () => new Deno.Command("/bin/true").output());
  await attempt("hostname", () => Deno.hostname());
  return r;
};""")
    check("sandbox-shim: jail: on:" in err, "the run was jailed", err)
    check(o["ok"], "the guest finished", o)
    for name, v in o["output"].items():
        check(v.startswith("NotCapable: Requires ") and "run again with the --allow-" in v, name + ": a clean error", v)


def t_jail_kernel_under_deno():
    # Deno itself granted net (loopback only), read, write (the unix socket), run and sys: the
    # kernel jail is what refuses, and Deno reports each refusal as a clean error
    import socket as so
    d = tempfile.mkdtemp(prefix="jail-", dir=TMP)
    os.chmod(d, 0o777)
    tcp = so.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(4)
    tcp.setblocking(False)
    upath = os.path.join(d, "s")
    us = so.socket(so.AF_UNIX)
    us.bind(upath)
    os.chmod(upath, 0o777)
    us.listen(4)
    us.setblocking(False)
    port = tcp.getsockname()[1]
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jail_guest.js")
    env = dict(os.environ, SB_E2E_TOKEN=broker.mint({}), HOME=d, DENO_DIR=os.path.join(d, "deno"), NO_COLOR="1",
               DENO_NO_UPDATE_CHECK="1")
    args = [SHIM, "relay", "--broker-url", broker.url, "--token-env", "SB_E2E_TOKEN", "--", DENO, "run", "--no-prompt",
            "--no-config", "--no-lock", "--no-npm", "--no-remote", "--allow-net=127.0.0.1,unix:" + upath, "--allow-read",
            "--allow-write=" + upath, "--allow-run=/bin/cat,/usr/bin/id,/usr/bin/unshare", "--allow-sys=hostname", src,
            str(port), upath, str(os.getpid())]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p_pid = [proc.pid]
    out, err = proc.communicate(timeout=60)
    p = subprocess.CompletedProcess(args, proc.returncode, out, err)
    accepted = []
    for s in (tcp, us):
        try:
            s.accept()
            accepted.append(s)
        except BlockingIOError:
            pass
        s.close()
    check(p.returncode == 0, "shim ran", p.returncode, p.stdout, p.stderr)
    o = json.loads(p.stdout)
    check(o["ok"], "the guest finished", o, p.stderr)
    r = o["output"]
    eperm = "PermissionDenied: Operation not permitted (os error 1)"
    check(r["connect"].startswith(eperm) and r["listen"].startswith(eperm) and r["unix"].startswith(eperm),
          "sockets: EPERM from seccomp, reported cleanly", r)
    check(accepted == [], "neither listener saw a connection", accepted)
    # no procfs in the guest's root: a host process's files do not exist for it
    check(r["environ"] == "SUCCEEDED: exit 1: /bin/cat: /proc/%d/environ: No such file or directory (0 bytes)"
          % os.getpid(), "a host process's environ: ENOENT", r)
    check(r["shimPid"] == str(os.getpid()), "the guest aimed at a host process", r, p_pid)
    check(r["hostname"] == "SUCCEEDED: sandbox", "UTS namespace", r)
    m = re.match(r"SUCCEEDED: exit 0: (\d+) \| exit 1: unshare: unshare failed: Operation not permitted$", r["child"])
    check(m is not None and int(m.group(1)) != 0, "a subprocess inherits the jail (its uid, the filter)", r)


def t_jail_fail_closed_run():
    probe = os.environ.get("SB_JAIL_PROBE")
    check(probe is not None and os.access(probe, os.X_OK), "SB_JAIL_PROBE names the fixture", probe)
    path = os.path.join(TMP, "guest.ts")
    with open(path, "w") as f:
        f.write("export default () => 'ran';")
    args = [probe, "deny-userns", SHIM, "run", "--broker-url", broker.url, "--token-env", "SB_E2E_TOKEN", "--source",
            path, "--deno", DENO]
    env = dict(os.environ, SB_E2E_TOKEN=broker.mint({}))
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and p.stdout == "" and "jail: the kernel refused new user, mount, pid, network, ipc and uts "
          "namespaces (clone: Operation not permitted); refusing to start the guest" in p.stderr, "run refuses", p)
    p = subprocess.run(args[:4] + ["--jail=off"] + args[4:], env=env, capture_output=True, text=True, timeout=60)
    check(p.returncode == 0 and json.loads(p.stdout)["output"] == "ran" and "jail: OFF (--jail=off)" in p.stderr,
          "--jail=off runs the guest and says so", p)


def t_host_paths_masked():
    """The guest sees upstream's virtual process surface, never where Deno or the runtime live on the host."""
    o, _, _, _ = guest("""
import * as named from "node:process";
export default async () => {
  const p = (await import("node:process")).default;
  const grab = (f: () => unknown) => { try { return f(); } catch (e) { return "threw " + (e as Error).name; } };
  const stack = new Error("probe").stack ?? "";
  // an error thrown inside the runtime (its fetch shim) carries the runtime's frames
  let caught = "";
  try { await fetch("not a url"); } catch (e) { caught = (e as Error).stack ?? ""; }
  return {
    execPath: Deno.execPath(), mainModule: Deno.mainModule, cwd: Deno.cwd(),
    argv: p.argv, pExecPath: p.execPath, argv0: p.argv0, pCwd: p.cwd(), global: globalThis.process === p,
    namedArgv: named.argv, namedExecPath: named.execPath, namedArgv0: named.argv0,
    stack, caught, title: grab(() => p.title),
  };
};""")
    check(o["ok"], "guest ran", o)
    out = o["output"]
    check(out["execPath"] == "/runtime/deno" and out["pExecPath"] == "/runtime/deno" and
          out["namedExecPath"] == "/runtime/deno", "exec path masked", out)
    check(out["argv"] == ["deno", "questpie://sandbox/guest-entry.ts"] and out["namedArgv"] == out["argv"], "argv", out)
    check(out["argv0"] == "/runtime/deno" and out["namedArgv0"] == "/runtime/deno", "argv0", out)
    check(out["mainModule"] == "questpie://sandbox/guest-entry.ts", "main module", out)
    check(out["cwd"] == "/work" and out["pCwd"] == "/work" and out["global"] is True, "cwd", out)
    real = os.path.realpath(DENO)
    blob = json.dumps(o)
    for leak in (real, os.path.dirname(real), DENO, os.path.dirname(DENO), tempfile.gettempdir() + "/sb-shim-",
                 "runtime.js"):
        check(leak not in blob, "the guest must not see " + leak, out)


FEATURES = r"""
export default async () => {
  const out = {};
  // timers
  const t0 = Date.now();
  await new Promise((r) => setTimeout(r, 20));
  let ticks = 0;
  await new Promise((r) => { const id = setInterval(() => { if (++ticks === 3) { clearInterval(id); r(); } }, 1); });
  out.timers = Date.now() - t0 >= 20 && ticks === 3;
  // crypto: random, digest, an AES-GCM round trip, an ECDSA signature
  const key = await crypto.subtle.generateKey({ name: "AES-GCM", length: 256 }, true, ["encrypt", "decrypt"]);
  const iv = crypto.getRandomValues(new Uint8Array(12));
  const ct = await crypto.subtle.encrypt({ name: "AES-GCM", iv }, key, new TextEncoder().encode("secret"));
  const pt = new TextDecoder().decode(await crypto.subtle.decrypt({ name: "AES-GCM", iv }, key, ct));
  const ec = await crypto.subtle.generateKey({ name: "ECDSA", namedCurve: "P-256" }, false, ["sign", "verify"]);
  const sig = await crypto.subtle.sign({ name: "ECDSA", hash: "SHA-256" }, ec.privateKey, new Uint8Array([1, 2]));
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode("abc")));
  out.crypto = pt === "secret" && digest[0] === 0xba && sig.byteLength === 64 && crypto.randomUUID().length === 36 &&
    await crypto.subtle.verify({ name: "ECDSA", hash: "SHA-256" }, ec.publicKey, sig, new Uint8Array([1, 2]));
  // WebAssembly: (func (export "add") (param i32 i32) (result i32) local.get 0 local.get 1 i32.add)
  const wasm = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 7, 1, 96, 2, 127, 127, 1, 127, 3, 2, 1, 0, 7, 7, 1, 3,
    97, 100, 100, 0, 0, 10, 9, 1, 7, 0, 32, 0, 32, 1, 106, 11]);
  const { instance } = await WebAssembly.instantiate(wasm);
  out.wasm = instance.exports.add(2, 3);
  // Intl
  out.intl = [new Intl.NumberFormat("de-DE").format(1234.5),
    new Intl.DateTimeFormat("en-US", { timeZone: "UTC", dateStyle: "medium" }).format(new Date(0)),
    new Intl.Collator("sv").compare("z", "ä"), new Intl.PluralRules("ar").select(3)];
  // structuredClone
  const c = structuredClone({ d: new Date(1), m: new Map([[1, { x: new Uint8Array([7]) }]]), s: new Set([1]) });
  out.clone = c.d.getTime() === 1 && c.m.get(1).x[0] === 7 && c.s.has(1);
  // large allocations: 64 MiB of ArrayBuffer, touched
  const big = new Uint8Array(64 * 1024 * 1024);
  for (let i = 0; i < big.length; i += 4096) big[i] = 1;
  out.big = big.reduce((a, b) => a + b, 0) === 16384;
  // TextDecoder streams
  const stream = new ReadableStream({ start(ctl) { ctl.enqueue(new Uint8Array([0xe2, 0x82])); ctl.enqueue(new Uint8Array([0xac, 0x21])); ctl.close(); } });
  let text = "";
  for await (const chunk of stream.pipeThrough(new TextDecoderStream())) text += chunk;
  out.decoderStream = text;
  // dynamic import() of a data: module
  out.dynImport = (await import("data:application/javascript,export const v = 42;")).v;
  return out;
};
"""


def t_runtime_features():
    """What a guest uses every day keeps working inside the jail (seccomp allow-list, own root)."""
    o, _, _, err = guest(FEATURES, flags=["--memory-mb", "256"])
    check(o["ok"], "the features guest ran", o, err)
    out = o["output"]
    check(out == {"timers": True, "crypto": True, "wasm": 5, "intl": ["1.234,5", "Jan 1, 1970", -1, "few"], "clone": True,
                  "big": True, "decoderStream": "\u20ac!", "dynImport": 42}, "every feature", out)


def guest_of(ppid):
    """Pids of the Deno guests (argv[0] /runtime/deno) whose parent is `ppid`."""
    found = []
    for d in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                argv0 = f.read().split(b"\0")[0]
            with open("/proc/%s/status" % d) as f:
                parent = re.search(r"^PPid:\s+(\d+)", f.read(), re.M).group(1)
        except (OSError, AttributeError):
            continue
        if argv0 == b"/runtime/deno" and int(parent) == ppid:
            found.append(int(d))
    return found


def t_workdir_cleaned():
    # a TMPDIR of its own: other shims on the machine make and remove sb-shim-* directories in /tmp
    # at any time. Jailed, the guest's HOME/TMPDIR/DENO_DIR is the scratch tmpfs of its own root:
    # nothing is made on the host, during the run or after a killed one; --jail=off still makes one
    tmp = tempfile.mkdtemp(prefix="tmpdir-", dir=TMP)
    os.chmod(tmp, 0o711)
    seen = {}

    def probe(p):
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            seen.setdefault("dirs", set()).update(os.listdir(tmp))
            time.sleep(0.01)
    src = "export default async () => { await Deno.writeTextFile('/work/x', 'x').catch(() => {}); " \
          "await new Promise((r) => setTimeout(r, 300)); return 1; };"
    o, _, _, _ = guest(src, env_extra={"TMPDIR": tmp}, on_running=probe)
    check(o["ok"] and seen.get("dirs") == set(), "nothing under TMPDIR while it runs", seen, o)
    # a shim killed in the middle of a run leaves nothing either (it used to leave the guest's home)
    path = os.path.join(TMP, "slow.ts")
    with open(path, "w") as f:
        f.write("export default async () => { await new Promise((r) => setTimeout(r, 20000)); return 1; };")
    env = dict(os.environ, SB_E2E_TOKEN=broker.mint({}), TMPDIR=tmp)
    p = subprocess.Popen([SHIM, "run", "--broker-url", broker.url, "--token-env", "SB_E2E_TOKEN", "--source", path,
                          "--deno", DENO], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20  # until the guest runs: Deno, a child of the shim
    while time.monotonic() < deadline and not guest_of(p.pid):
        time.sleep(0.02)
    check(guest_of(p.pid), "the guest started")
    p.kill()
    p.wait()
    check(os.listdir(tmp) == [], "a killed run leaves no directory", os.listdir(tmp))
    seen.clear()
    o, _, _, _ = guest("export default async () => { await new Promise((r) => setTimeout(r, 300)); return 1; };",
                       flags=["--jail=off"], env_extra={"TMPDIR": tmp}, on_running=probe)
    check(o["ok"] and len(seen.get("dirs", ())) == 1 and list(seen["dirs"])[0].startswith("sb-shim-"),
          "--jail=off: a private directory under TMPDIR", seen, o)
    check(os.listdir(tmp) == [], "and it is removed", os.listdir(tmp))
    os.rmdir(tmp)


# a module that declares and exports a shared memory: (module (memory (export "m") 1 1 shared))
SHARED_MEMORY_WASM = "0,97,115,109,1,0,0,0,5,4,1,3,1,1,7,5,1,1,109,2,0"
# the same with a plain memory, which must keep working
PLAIN_MEMORY_WASM = "0,97,115,109,1,0,0,0,5,4,1,1,1,1,7,5,1,1,109,2,0"


def t_hardening_shared_memory():
    o, _, _, _ = guest("""
const attempt = async (f) => { try { const v = await f(); return "open: " + String(v); } catch (e) { return e.message; } };
export default async () => ({
  ctor: await attempt(() => new WebAssembly.Memory({ initial: 1, maximum: 1, shared: true }).buffer.constructor.name),
  getter: await attempt(() => {
    let n = 0;
    return new WebAssembly.Memory({ initial: 1, maximum: 1, get shared() { return n++ > 0; } }).buffer.constructor.name
      + " after " + n + " read";
  }),
  exported: await attempt(async () => {
    const { instance } = await WebAssembly.instantiate(new Uint8Array([%s]));
    return instance.exports.m.buffer.constructor.name;
  }),
  resizable: await attempt(async () => {
    const { instance } = await WebAssembly.instantiate(new Uint8Array([%s]));
    return typeof instance.exports.m.toResizableBuffer === "function" ? instance.exports.m.toResizableBuffer().constructor.name : "refused: absent";
  }),
  plain: await attempt(async () => {
    const { instance } = await WebAssembly.instantiate(new Uint8Array([%s]));
    const m = instance.exports.m;
    return [m instanceof WebAssembly.Memory, m.buffer.byteLength, new WebAssembly.Memory({ initial: 2 }).buffer.byteLength].join();
  }),
  reach: await attempt(() => Object.getOwnPropertyDescriptor(WebAssembly.Memory.prototype, "buffer").configurable),
});""" % (SHARED_MEMORY_WASM, SHARED_MEMORY_WASM, PLAIN_MEMORY_WASM))
    check(o["ok"], "run completed", o)
    out = o["output"]
    refused = "shared WebAssembly memory is not available in the sandbox"
    check(out["ctor"] == refused, "new WebAssembly.Memory({shared: true}) refused", out)
    check(out["getter"] == "open: ArrayBuffer after 1 read", "a getter answering false first, true second, is read once", out)
    check(out["exported"] == refused, "a module's exported shared memory hands out no SharedArrayBuffer", out)
    check(out["resizable"] in (refused, "open: refused: absent"), "toResizableBuffer refuses a shared memory", out)
    check(out["plain"] == "open: true,65536,131072", "plain WebAssembly memory still works", out)
    check(out["reach"] == "open: false", "the guarded getter cannot be redefined", out)
    # what guest code can replace after the guard is up must not open it (the guard took its own copies)
    o, _, _, _ = guest("""
const attempt = async (f) => { try { const v = await f(); return "open: " + String(v); } catch (e) { return e.message; } };
export default async () => {
  const { instance } = await WebAssembly.instantiate(new Uint8Array([%s]));
  const m = instance.exports.m;
  const out = {};
  let leaked = null;
  const realCall = Function.prototype.call;
  Function.prototype.call = function (self, ...args) {
    if (leaked === null && typeof this === "function") leaked = this;
    if (this.name === "get byteLength") throw new Error("not shared, honest");
    return Reflect.apply(this, self, args);
  };
  out.call = await attempt(() => m.buffer.constructor.name);
  out.leak = await attempt(() => leaked === null ? "nothing" : Reflect.apply(leaked, m, []).constructor.name);
  Function.prototype.call = realCall;
  const realConstruct = Reflect.construct;
  let got = null;
  Reflect.construct = (C, a, t) => { got = C; return realConstruct(C, a, t); };
  out.construct = await attempt(() => { new WebAssembly.Memory({ initial: 1 });
    return got === null ? "nothing" : new got({ initial: 1, maximum: 1, shared: true }).buffer.constructor.name; });
  Reflect.construct = realConstruct;
  Object.defineProperty(Object.prototype, "shared", { get() { return true; }, configurable: true });
  out.proto = await attempt(() => new WebAssembly.Memory(Object.create(null, { initial: { value: 1 }, maximum: { value: 1 } }))
    .buffer.constructor.name);
  delete Object.prototype.shared;
  // a replaced Object.create handing the guard a Proxy that answers shared: false to the check, true after
  const realCreate = Object.create;
  Object.create = (p) => { let n = 0; return new Proxy(realCreate(p), { get(t, k) { return k === "shared" ? (n++ === 0 ? false : true) : t[k]; },
    set(t, k, v) { t[k] = v; return true; } }); };
  // (a module that imports a shared memory links only with one: no need to read its buffer to tell)
  out.create = await attempt(async () => { const mem = new WebAssembly.Memory({ initial: 1, maximum: 1, shared: true });
    await WebAssembly.instantiate(new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 2, 11, 1, 1, 109, 3, 109, 101, 109, 2, 3, 1, 1]),
      { m: { mem } });
    return "a shared memory was made"; });
  Object.create = realCreate;
  return out;
};""" % SHARED_MEMORY_WASM)
    check(o["ok"], "run completed", o)
    out = o["output"]
    check(out["call"] == refused and out["leak"] in ("open: nothing", refused), "a replaced Function.prototype.call", out)
    check(out["construct"] == "open: nothing", "a replaced Reflect.construct never sees the real constructor", out)
    check(out["proto"] == "open: ArrayBuffer", "a shared getter on Object.prototype is not read", out)
    check(out["create"] == refused, "a replaced Object.create does not make the guard's copy", out)


def t_hardening_vm_context():
    o, _, _, _ = guest("""
import vm from "node:vm";
export default () => ({
  main: typeof SharedArrayBuffer,
  context: vm.runInNewContext("typeof SharedArrayBuffer"),
  process: process.getBuiltinModule("node:vm").runInNewContext("typeof SharedArrayBuffer"),
});""")
    check(o["ok"] and o["output"] == {"main": "undefined", "context": "undefined", "process": "undefined"},
          "no SharedArrayBuffer constructor in a node:vm context either (the engine's flag)", o)


def t_hardening_storage_and_internals():
    o, _, _, _ = guest("""
export default async () => ({
  caches: typeof caches, local: typeof localStorage, session: typeof sessionStorage,
  internal: typeof Deno[Deno.internal], ops: (() => { try { return typeof Deno[Deno.internal].core.ops; } catch (e) { return e.constructor.name; } })(),
});""")
    check(o["ok"] and o["output"] == {"caches": "undefined", "local": "undefined", "session": "undefined",
                                      "internal": "undefined", "ops": "TypeError"}, "storage and internals gone", o)


tap.case("basic run: input, output, console captured", t_basic)
tap.case("module without a default export", t_no_default_export)
tap.case("guest throws", t_guest_throws)
tap.case("Worker, SharedArrayBuffer, Atomics gone; questpie and fetch present", t_hardening_globals)
tap.case("shared WebAssembly memory hands out no SharedArrayBuffer", t_hardening_shared_memory)
tap.case("no SharedArrayBuffer in a node:vm context", t_hardening_vm_context)
tap.case("no Cache API or web storage; no Deno internals (core ops)", t_hardening_storage_and_internals)
tap.case("granted call under --on-denial reply sees not_implemented", t_granted_service_reply)
tap.case("denied call under terminate ends the run", t_denied_terminate)
tap.case("denied call under reply is a catchable error", t_denied_reply)
tap.case("fetch goes through http.fetch", t_fetch_shim)
tap.case("fetch round trip through the broker (binary bodies)", t_fetch_roundtrip)
tap.case("fetch with a secret the guest never sees", t_fetch_secret)
tap.case("attack: reading the token (env, /proc, import, subprocess)", t_token_theft)
tap.case("attack: sockets", t_sockets)
tap.case("attack: forged frame via console", t_forged_frame_via_console)
tap.case("attack: 10,000 calls", t_flood)
tap.case("attack: garbage on stdout", t_garbage_stdout)
tap.case("wall-clock timeout", t_wall_timeout)
tap.case("memory cap", t_memory_cap)
tap.case("timers, crypto, WebAssembly, Intl, structuredClone, big buffers, TextDecoderStream, import()",
         t_runtime_features)
tap.case("no work directory on the host, not even after a killed run", t_workdir_cleaned)
tap.case("jail: Deno.connect/listen/Command/hostname without permissions give clean errors", t_jail_clean_errors)
tap.case("jail: Deno granted net/read/run meets the kernel's refusals, reported cleanly", t_jail_kernel_under_deno)
tap.case("jail: run fails closed on a kernel refusing user namespaces; --jail=off runs", t_jail_fail_closed_run)
tap.case("host paths are masked (Deno.execPath, process.execPath/argv, stacks)", t_host_paths_masked)
broker.close()
shutil.rmtree(TMP, ignore_errors=True)
tap.done()
