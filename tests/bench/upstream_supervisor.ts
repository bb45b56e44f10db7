// A small Deno supervisor that does per run what the upstream QuestPie supervisor does, as the
// baseline of tests/bench/serve_pool.sh (written for the benchmark, not upstream's code):
// Deno.serve on loopback; per POST /run one `deno run` with --v8-flags=--max-old-space-size, an
// empty environment, cwd "/", the guest as a data: module under a harness that nulls Worker and
// deletes SharedArrayBuffer and Atomics, its result read from stdout.
//
// Usage: deno run --allow-net=127.0.0.1 --allow-run=DENO upstream_supervisor.ts DENO
// It prints "listening PORT" once it listens.
const [deno] = Deno.args;

const harness = (source: string, input: unknown, memoryMb: number) => {
  const guest = "data:application/typescript;base64," + btoa(unescape(encodeURIComponent(source)));
  const js = `
Object.defineProperty(globalThis, "Worker", { value: undefined });
delete globalThis.SharedArrayBuffer;
delete globalThis.Atomics;
const logs = [];
for (const k of ["log", "info", "warn", "error", "debug"]) console[k] = (...a) => logs.push(a.join(" "));
const enc = new TextEncoder();
try {
  const mod = await import(${JSON.stringify(guest)});
  const output = await mod.default(${JSON.stringify(input)});
  Deno.stdout.writeSync(enc.encode(JSON.stringify({ ok: true, output, logs })));
} catch (e) {
  Deno.stdout.writeSync(enc.encode(JSON.stringify({ ok: false, error: String(e?.message ?? e), logs })));
}`;
  return [`--v8-flags=--max-old-space-size=${memoryMb}`, "--no-prompt", "data:application/javascript;base64," + btoa(js)];
};

const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: ({ port }) => console.log("listening " + port) }, async (req) => {
  if (req.method !== "POST" || new URL(req.url).pathname !== "/run") return new Response("not found", { status: 404 });
  const started = performance.now();
  const body = await req.json();
  const caps = body.capabilities ?? {};
  const cmd = new Deno.Command(deno, {
    args: ["run", ...harness(body.source, body.input ?? null, caps.memoryMb ?? 128)],
    env: {}, clearEnv: true, cwd: "/", stdin: "null", stdout: "piped", stderr: "piped",
  });
  const child = cmd.spawn();
  const timer = setTimeout(() => { try { child.kill("SIGKILL"); } catch (_) { /* gone */ } }, caps.timeoutMs ?? 5000);
  const out = await child.output();
  clearTimeout(timer);
  let result;
  try {
    result = JSON.parse(new TextDecoder().decode(out.stdout));
  } catch (_) {
    result = { ok: false, error: "sandbox process failed", logs: [] };
  }
  result.ms = Math.round(performance.now() - started);
  return Response.json(result);
});
await server.finished;
