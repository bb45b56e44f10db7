"""End to end: real Deno guest runtime, real sandbox-shim, real sandbox-broker.

Needs Deno: env SB_DENO, or SB_NODE_PREFIX with node_modules/.bin/deno from
`npm install --prefix "$SB_NODE_PREFIX" deno@2.9.6`. Without it the test
reports SKIP (exit 77, ctest SKIP_RETURN_CODE).
"""
import sys
sys.dont_write_bytecode = True  # noqa: E402 - keep tests/shim free of __pycache__
import json
import os
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


def guest(src, caps=None, flags=(), inp=None, token=None, on_running=None, timeout=60):
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
    check(not o["ok"] and "forbidden" in o["error"] and "collections.users.find" in o["error"], "terminated", o)


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


def shim_private_dirs():
    # exactly the shim's mkdtemp("sb-shim-XXXXXX") names: other tests running in parallel
    # create their own sb-shim-<something> files in the same temp directory
    import re
    pat = re.compile(r"^sb-shim-[A-Za-z0-9]{6}$")
    tmp = tempfile.gettempdir()
    return set(x for x in os.listdir(tmp) if pat.match(x) and os.path.isdir(os.path.join(tmp, x)))


def t_workdir_cleaned():
    before = shim_private_dirs()
    guest("export default () => 1;")
    after = shim_private_dirs()
    check(after - before == set(), "private temp dir removed", after - before)


tap.case("basic run: input, output, console captured", t_basic)
tap.case("module without a default export", t_no_default_export)
tap.case("guest throws", t_guest_throws)
tap.case("Worker, SharedArrayBuffer, Atomics gone; questpie and fetch present", t_hardening_globals)
tap.case("granted call under --on-denial reply sees not_implemented", t_granted_service_reply)
tap.case("denied call under terminate ends the run", t_denied_terminate)
tap.case("denied call under reply is a catchable error", t_denied_reply)
tap.case("fetch goes through http.fetch", t_fetch_shim)
tap.case("fetch round trip through the broker (binary bodies)", t_fetch_roundtrip)
tap.case("attack: reading the token (env, /proc, import, subprocess)", t_token_theft)
tap.case("attack: sockets", t_sockets)
tap.case("attack: forged frame via console", t_forged_frame_via_console)
tap.case("attack: 10,000 calls", t_flood)
tap.case("attack: garbage on stdout", t_garbage_stdout)
tap.case("wall-clock timeout", t_wall_timeout)
tap.case("memory cap", t_memory_cap)
tap.case("private temp dir is removed", t_workdir_cleaned)
tap.case("host paths are masked (Deno.execPath, process.execPath/argv, stacks)", t_host_paths_masked)
broker.close()
try:
    os.rmdir(TMP) if not os.listdir(TMP) else [os.unlink(os.path.join(TMP, f)) for f in os.listdir(TMP)] and os.rmdir(TMP)
except OSError:
    pass
tap.done()
