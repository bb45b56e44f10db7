// A Deno guest for tests/shim/test_deno_e2e.py that speaks the stdio frames itself (behind
// `sandbox-shim relay`), started with Deno permissions scoped to what the test owns, so that what
// stops it is the kernel jail, not Deno. Args: TCP_PORT UNIX_PATH HOST_PID (a host process to aim
// at: the jailed guest has no procfs to learn its shim's pid from). Output: {probe: "what happened"}.

function packStr(s, out) {
  const b = new TextEncoder().encode(s);
  if (b.length < 32) out.push(0xa0 | b.length);
  else if (b.length < 256) out.push(0xd9, b.length);
  else out.push(0xda, b.length >> 8, b.length & 0xff);
  for (const x of b) out.push(x);
}

function packMap(obj, out) {
  const keys = Object.keys(obj);
  out.push(0x80 | keys.length); // fewer than 16 keys
  for (const k of keys) {
    packStr(k, out);
    const v = obj[k];
    if (typeof v === "boolean") out.push(v ? 0xc3 : 0xc2);
    else if (Array.isArray(v)) out.push(0x90); // only the empty logs array
    else if (typeof v === "object") packMap(v, out);
    else packStr(String(v), out);
  }
}

async function readExact(n) {
  const buf = new Uint8Array(n);
  let got = 0;
  while (got < n) {
    const k = await Deno.stdin.read(buf.subarray(got));
    if (k === null) throw new Error("stdin closed");
    got += k;
  }
  return buf;
}

const describe = (e) => `${e.constructor.name}: ${e.message}`;
const attempt = async (f) => {
  try {
    return "SUCCEEDED: " + String(await f());
  } catch (e) {
    return describe(e);
  }
};

const [port, unixPath, shimPid] = Deno.args;
const head = await readExact(4);
await readExact(new DataView(head.buffer).getUint32(0)); // the init frame, unused

const run = async (cmd, args) => {
  const r = await new Deno.Command(cmd, { args }).output();
  const text = (b) => new TextDecoder().decode(b).trim();
  return `exit ${r.code}: ${text(r.stdout)}${text(r.stderr)}`;
};
const out = {
  connect: await attempt(async () => (await Deno.connect({ hostname: "127.0.0.1", port: Number(port) })).close()),
  listen: await attempt(() => Deno.listen({ hostname: "127.0.0.1", port: 0 }).close()),
  unix: await attempt(async () => (await Deno.connect({ transport: "unix", path: unixPath })).close()),
  // Deno itself refuses /proc/<pid>/environ without --allow-all; a subprocess asks the kernel
  environ: await attempt(async () => {
    const r = await new Deno.Command("/bin/cat", { args: [`/proc/${shimPid}/environ`] }).output();
    return `exit ${r.code}: ${new TextDecoder().decode(r.stderr).trim()} (${r.stdout.length} bytes)`;
  }),
  hostname: await attempt(() => Deno.hostname()),
  shimPid,
  // a subprocess runs as the guest's uid and under its filter (unshare: EPERM)
  child: await attempt(async () => `${await run("/usr/bin/id", ["-u"])} | ${await run("/usr/bin/unshare", ["-n", "true"])}`),
};
const bytes = [];
packMap({ t: "result", ok: true, logs: [], output: out }, bytes);
const frame = new Uint8Array(4 + bytes.length);
new DataView(frame.buffer).setUint32(0, bytes.length);
frame.set(bytes, 4);
for (let off = 0; off < frame.length;) off += await Deno.stdout.write(frame.subarray(off));
