// A host application's HTTP adapter, written the way the upstream adapter
// talks to its supervisor, driving `sandbox-shim serve` end to end
// (test_serve_adapter.py starts PostgreSQL, the broker and serve, then runs
// this with Node 20). What it holds to, as the upstream adapter does:
//   - the sandbox URL must be a bare origin; runs go to `${origin}/run`;
//   - POST with redirect: "error", the host admission header, and a fetch
//     timeout of the guest's timeout + 10 s;
//   - the body is {mode: "host", source, input ?? null, capabilities:
//     {net, import, timeoutMs, memoryMb ?? 128}, secrets ?? {}, bindings?};
//   - a non-2xx answer is a failed run; the body is read up to 2 MiB and must
//     be exactly {ok, logs, output?, error?, timedOut?, ms?} with upstream's
//     consistency rules, or it is "an invalid response";
//   - like the executor service, it mints a scoped token on the broker's
//     admin API for a run with bindings and revokes it when the run settles.
// The guests are written for upstream (its store sugar, its error texts), and
// must get upstream's results.
// Exits 0 when every scenario held; prints what failed otherwise.

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const SANDBOX_URL = env("SANDBOX_URL");
const ADMISSION = env("SANDBOX_HOST_ADMISSION_SECRET");
const BROKER_URL = env("SB_BROKER_RPC_URL");
const ADMIN_URL = env("SB_BROKER_ADMIN_URL");
const ADMIN_SECRET = env("SB_BROKER_ADMIN_SECRET");
const UPSTREAM = env("SB_UPSTREAM_URL"); // an HTTP server on loopback the net runs fetch from
const UPSTREAM_HOST = new URL(UPSTREAM).host;
const MAX_RESPONSE = 2 * 1024 * 1024;

function origin(raw) {
  const u = new URL(raw);
  if ((u.protocol !== "http:" && u.protocol !== "https:") || u.username || u.password || u.hash || u.search ||
      u.pathname !== "/" || (raw !== u.origin && raw !== `${u.origin}/`)) {
    throw new Error("sandbox URL must be canonical HTTP(S)");
  }
  return u.origin;
}

const has = (o, k) => Object.prototype.hasOwnProperty.call(o, k);

// the result rules the upstream adapter applies to /run answers
function parseResult(v) {
  if (!v || typeof v !== "object" || Array.isArray(v)) return null;
  const keys = Object.keys(v);
  const allowed = ["ok", "logs", "output", "error", "timedOut", "ms"];
  if (!has(v, "ok") || !has(v, "logs") || keys.some((k) => !allowed.includes(k))) return null;
  if (typeof v.ok !== "boolean" || !Array.isArray(v.logs) || v.logs.length > 1000) return null;
  if (v.error !== undefined && typeof v.error !== "string") return null;
  if (v.timedOut !== undefined && typeof v.timedOut !== "boolean") return null;
  if (v.ms !== undefined && (typeof v.ms !== "number" || !Number.isFinite(v.ms) || v.ms < 0)) return null;
  if (v.ok === true && (has(v, "error") || has(v, "timedOut"))) return null;
  if (v.ok === false && (typeof v.error !== "string" || has(v, "output") || (has(v, "timedOut") && v.timedOut !== true))) {
    return null;
  }
  let total = 0;
  for (const l of v.logs) {
    if (typeof l !== "string") return null;
    const n = new TextEncoder().encode(l).length;
    total += n;
    if (n > 4000 || total > 1024 * 1024) return null;
  }
  return v;
}

async function readBounded(res) {
  const reader = res.body.getReader();
  const chunks = [];
  let total = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    total += value.length;
    if (total > MAX_RESPONSE) {
      await reader.cancel();
      throw new Error("response too large");
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks).toString("utf8");
}

async function postRun({ source, input, capabilities = {}, secrets, bindings }) {
  const timeoutMs = capabilities.timeoutMs ?? 5000;
  const body = JSON.stringify({
    mode: "host",
    source,
    input: input ?? null,
    capabilities: { net: capabilities.net ?? [], import: capabilities.import ?? [], timeoutMs,
                    memoryMb: capabilities.memoryMb ?? 128 },
    secrets: secrets ?? {},
    ...(bindings ? { bindings } : {}),
  });
  const res = await fetch(`${origin(SANDBOX_URL)}/run`, {
    method: "POST",
    redirect: "error",
    headers: { "content-type": "application/json", "x-questpie-sandbox-host-admission": ADMISSION },
    body,
    signal: AbortSignal.timeout(timeoutMs + 10_000),
  });
  if (!res.ok) {
    await res.body?.cancel();
    return { ok: false, error: `sandbox request failed (HTTP ${res.status})`, logs: [], status: res.status };
  }
  const text = await readBounded(res);
  const parsed = parseResult(JSON.parse(text));
  if (!parsed) return { ok: false, error: "sandbox returned an invalid response", logs: [], raw: text };
  return parsed;
}

async function admin(method, path, body) {
  const res = await fetch(`${ADMIN_URL}${path}`, {
    method,
    redirect: "error",
    headers: { authorization: `Bearer ${ADMIN_SECRET}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null };
}

// the executor service's part: a scoped token for the run, revoked once the run settles
async function runWithBindings(runId, capabilities, scope, run) {
  const minted = await admin("POST", "/admin/v1/tokens", { runId, target: "app", scope, capabilities });
  if (minted.status !== 201) throw new Error(`mint failed: ${JSON.stringify(minted)}`);
  try {
    return await postRun({ ...run, bindings: { url: BROKER_URL, token: minted.body.token } });
  } finally {
    const r = await admin("DELETE", `/admin/v1/runs/${encodeURIComponent(runId)}`);
    if (r.status !== 204) throw new Error(`revoke failed: ${r.status}`);
  }
}

const failures = [];
function expect(cond, what, got) {
  if (!cond) failures.push(`${what}: ${JSON.stringify(got)}`.slice(0, 2000));
}

const scenarios = {
  async collections() {
    const caps = { data: { collections: { posts: ["read", "create"] }, stores: { notes: ["read", "write"] } },
                   timeoutMs: 8000 };
    const r = await runWithBindings("adapter-run-1", caps, { tenantId: "adapter-t1" }, {
      capabilities: { timeoutMs: 8000 },
      input: { title: "written by a guest" },
      source: `export default async (input) => {
        const made = await questpie.collections.posts.create({ data: { title: input.title, views: 7 } });
        const rows = await questpie.collections.posts.find({ where: { views: { gte: 7 } } });
        // upstream's store sugar, as its documentation writes it
        await questpie.store.notes.create({ key: "k1", data: { v: 1 } });
        await questpie.store.notes.create({ key: "k2", data: { v: 2 } });
        const notes = await questpie.store.notes.find({});
        const one = await questpie.store.notes.findOne({ where: { key: "k1" } });
        await questpie.store.notes.update({ where: { key: "k1" }, data: { data: { v: 3 } } });
        await questpie.store.notes.delete({ where: { key: "k2" } });
        const left = await questpie.store.notes.find({});
        console.log("rows", rows.docs.length);
        return { created: made.title, rows: rows.docs.length, notes: notes.docs.length, one: one?.data,
                 left: left.docs.map((d) => [d.key, d.data]) };
      }`,
    });
    expect(r.ok === true, "collections run ok", r);
    expect(r.output?.created === "written by a guest" && r.output?.rows === 1 && r.output?.notes === 2,
           "rows and notes seen", r);
    expect(JSON.stringify(r.output?.one) === JSON.stringify({ v: 1 }), "store findOne by key", r);
    expect(JSON.stringify(r.output?.left) === JSON.stringify([["k1", { v: 3 }]]), "store update and delete by key", r);
    expect(r.logs?.includes("log: rows 1"), "logs", r);
  },
  async denied() {
    const r = await runWithBindings("adapter-run-2", { data: { collections: { posts: ["read"] } } }, { tenantId: "adapter-t2" }, {
      source: `export default async () => {
        try { await questpie.collections.posts.create({ data: { title: "nope" } }); } catch { /* not catchable */ }
        return "carried on";
      }`,
    });
    expect(r.ok === false && r.error === "sandbox binding operation forbidden" && !has(r, "output"),
           "a denial ends the run with upstream's text", r);
  },
  async revoked() {
    // a token revoked before the run: the broker refuses the first call
    const minted = await admin("POST", "/admin/v1/tokens", { runId: "adapter-run-3", target: "app",
      scope: { tenantId: "adapter-t3" }, capabilities: { data: { collections: { posts: ["read"] } } } });
    await admin("DELETE", "/admin/v1/runs/adapter-run-3");
    const r = await postRun({ source: "export default () => questpie.collections.posts.find({})",
                              bindings: { url: BROKER_URL, token: minted.body.token } });
    expect(r.ok === false && r.error === "sandbox binding authorization failed", "revoked token refused, upstream's text", r);
  },
  async compute() {
    const r = await postRun({ source: "export default (i) => ({ doubled: i.n * 2, q: typeof questpie })", input: { n: 21 } });
    expect(r.ok && r.output?.doubled === 42 && r.output?.q === "undefined", "compute-only run", r);
    expect(typeof r.ms === "number", "ms", r);
  },
  async net() {
    // the seeds' first example: net without bindings; the guest's fetch goes through the broker's http.fetch
    const r = await postRun({
      capabilities: { net: [UPSTREAM_HOST], import: [], timeoutMs: 5000 },
      source: `export default async () => {
        const res = await fetch("${UPSTREAM}/hello?x=1", { headers: { "x-probe": "yes" } });
        return { status: res.status, body: await res.text() };
      }`,
    });
    expect(r.ok && r.output?.status === 200 && r.output?.body === "hello from upstream", "net run fetched", r);
    const far = await postRun({
      capabilities: { net: [UPSTREAM_HOST], timeoutMs: 5000 },
      source: `export default async () => { try { await fetch("http://127.0.0.1:1/x"); return "fetched"; } catch (e) { return "refused"; } }`,
    });
    expect(far.ok === false && far.error === "sandbox binding operation forbidden", "outside net: the run ends", far);
  },
  async upstreamErrors() {
    // a method the token does not grant, and one the target does not wire: upstream's texts only
    const r = await runWithBindings("adapter-run-4", { data: { collections: { posts: ["read"] } } }, { tenantId: "adapter-t4" }, {
      source: `export default async () => questpie.collections.missing_table.find({})`,
    });
    expect(r.ok === false && r.error === "sandbox binding operation forbidden" && !/missing_table/.test(JSON.stringify(r)),
           "the broker's reason stays out of the answer", r);
    const b = await runWithBindings("adapter-run-5", { data: { collections: { posts: ["read"] } } }, { tenantId: "adapter-t5" }, {
      source: `export default async () => questpie.collections.posts.find({ where: { no_such_field: 1 } })`,
    });
    expect(b.ok === false && b.error === "invalid sandbox binding arguments", "bad_args in upstream's words", b);
  },
  async timeout() {
    const r = await postRun({ source: "export default () => { while (true) {} }", capabilities: { timeoutMs: 300 } });
    expect(r.ok === false && r.timedOut === true, "timed out", r);
  },
  async canonicalUrl() {
    let threw = false;
    try { origin(`${SANDBOX_URL}/run`); } catch { threw = true; }
    expect(threw, "a non-origin sandbox URL is refused by the adapter itself", SANDBOX_URL);
  },
};

for (const [name, fn] of Object.entries(scenarios)) {
  try {
    await fn();
  } catch (e) {
    failures.push(`${name} threw: ${e?.stack ?? e}`);
  }
}
if (failures.length) {
  console.error(failures.join("\n"));
  process.exit(1);
}
console.log(`adapter scenarios passed: ${Object.keys(scenarios).join(", ")}`);
