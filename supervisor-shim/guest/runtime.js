// sandbox-shim guest runtime for Deno (proto/PROTOCOL.md section 2).
//
// Embedded in the shim at build time and started by `sandbox-shim run` and
// `sandbox-shim serve` from a data: URL, with no permissions at all. It speaks
// length-prefixed msgpack frames on stdin/stdout: reads `init`, loads the guest
// module from a data: URL, relays the guest's binding calls as `call` frames,
// and ends with one `result` frame. Console output is captured into `logs`;
// nothing is ever printed to stdout, so a guest's prints cannot forge a frame.

const MAX_FRAME = 7122604;
const MAX_LOGS = 1000;
const MAX_LOG_BYTES = 4000;
const MAX_LOG_TOTAL = 1024 * 1024;
const MAX_OUTPUT = 1024 * 1024;
const MAX_DEPTH = 31;
// what the shim sends may nest deeper than what the guest sends back: the init
// frame's input may itself hold 32 levels below its root (PROTOCOL.md section 2)
const MAX_DECODE_DEPTH = 34;
// what the guest sees of the process, instead of host paths (PROTOCOL.md section 2)
const VIRTUAL_EXEC_PATH = "/runtime/deno";
const VIRTUAL_MAIN_MODULE = "questpie://sandbox/guest-entry.ts";
const VIRTUAL_CWD = "/work";

// Private references, taken before any guest code runs.
const stdin = Deno.stdin;
const stdout = Deno.stdout;
const readIn = stdin.read.bind(stdin);
const writeOut = stdout.write.bind(stdout);
const exit = Deno.exit.bind(Deno);
const enc = new TextEncoder();
const dec = new TextDecoder("utf-8", { fatal: true });
const RealRequest = globalThis.Request;
const RealResponse = globalThis.Response;
const RealHeaders = globalThis.Headers;
const nodeProcess = globalThis.process;

// ---- msgpack (https://github.com/msgpack/msgpack/blob/master/spec.md) ----

class Writer {
  constructor() {
    this.buf = new Uint8Array(256);
    this.view = new DataView(this.buf.buffer);
    this.len = 0;
  }
  ensure(n) {
    if (this.len + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.len + n) size *= 2;
    const b = new Uint8Array(size);
    b.set(this.buf.subarray(0, this.len));
    this.buf = b;
    this.view = new DataView(b.buffer);
  }
  u8(v) { this.ensure(1); this.buf[this.len++] = v; }
  u16(v) { this.ensure(2); this.view.setUint16(this.len, v); this.len += 2; }
  u32(v) { this.ensure(4); this.view.setUint32(this.len, v); this.len += 4; }
  bytes(b) { this.ensure(b.length); this.buf.set(b, this.len); this.len += b.length; }
  result() { return this.buf.subarray(0, this.len); }
}

function encodeInt(w, v) {
  if (v >= 0) {
    if (v < 128) w.u8(v);
    else if (v < 256) { w.u8(0xcc); w.u8(v); }
    else if (v < 65536) { w.u8(0xcd); w.u16(v); }
    else if (v < 4294967296) { w.u8(0xce); w.u32(v); }
    else { w.u8(0xcf); w.ensure(8); w.view.setBigUint64(w.len, BigInt(v)); w.len += 8; }
  } else {
    if (v >= -32) w.u8(v & 0xff);
    else if (v >= -128) { w.u8(0xd0); w.ensure(1); w.view.setInt8(w.len++, v); }
    else if (v >= -32768) { w.u8(0xd1); w.ensure(2); w.view.setInt16(w.len, v); w.len += 2; }
    else if (v >= -2147483648) { w.u8(0xd2); w.ensure(4); w.view.setInt32(w.len, v); w.len += 4; }
    else { w.u8(0xd3); w.ensure(8); w.view.setBigInt64(w.len, BigInt(v)); w.len += 8; }
  }
}

function encodeStr(w, s) {
  const b = enc.encode(s);
  const n = b.length;
  if (n < 32) w.u8(0xa0 | n);
  else if (n < 256) { w.u8(0xd9); w.u8(n); }
  else if (n < 65536) { w.u8(0xda); w.u16(n); }
  else { w.u8(0xdb); w.u32(n); }
  w.bytes(b);
}

function encodeBin(w, b) {
  const n = b.length;
  if (n < 256) { w.u8(0xc4); w.u8(n); }
  else if (n < 65536) { w.u8(0xc5); w.u16(n); }
  else { w.u8(0xc6); w.u32(n); }
  w.bytes(b);
}

// JSON-like semantics: undefined members and functions are dropped, undefined
// array slots and non-finite numbers become nil, toJSON is honoured; bytes
// (Uint8Array, ArrayBuffer, other views) become bin.
function encodeValue(w, v, depth) {
  if (depth > MAX_DEPTH) throw new TypeError("value nesting is too deep");
  if (v === null || v === undefined) return w.u8(0xc0);
  switch (typeof v) {
    case "boolean": return w.u8(v ? 0xc3 : 0xc2);
    case "number":
      if (!Number.isFinite(v)) return w.u8(0xc0);
      if (Number.isSafeInteger(v)) return encodeInt(w, v);
      w.u8(0xcb); w.ensure(8); w.view.setFloat64(w.len, v); w.len += 8; return;
    case "bigint":
      if (v >= -(2n ** 63n) && v < 2n ** 64n) {
        if (v >= 0n) { w.u8(0xcf); w.ensure(8); w.view.setBigUint64(w.len, v); }
        else { w.u8(0xd3); w.ensure(8); w.view.setBigInt64(w.len, v); }
        w.len += 8; return;
      }
      throw new TypeError("bigint out of 64-bit range");
    case "string": return encodeStr(w, v);
    case "function": case "symbol": return w.u8(0xc0);
  }
  if (v instanceof Uint8Array) return encodeBin(w, v);
  if (v instanceof ArrayBuffer) return encodeBin(w, new Uint8Array(v));
  if (ArrayBuffer.isView(v)) return encodeBin(w, new Uint8Array(v.buffer, v.byteOffset, v.byteLength));
  if (typeof v.toJSON === "function") return encodeValue(w, v.toJSON(), depth);
  if (Array.isArray(v)) {
    const n = v.length;
    if (n < 16) w.u8(0x90 | n);
    else if (n < 65536) { w.u8(0xdc); w.u16(n); }
    else { w.u8(0xdd); w.u32(n); }
    for (let i = 0; i < n; i++) encodeValue(w, v[i], depth + 1);
    return;
  }
  const keys = Object.keys(v).filter((k) => {
    const x = v[k];
    return x !== undefined && typeof x !== "function" && typeof x !== "symbol";
  });
  const n = keys.length;
  if (n < 16) w.u8(0x80 | n);
  else if (n < 65536) { w.u8(0xde); w.u16(n); }
  else { w.u8(0xdf); w.u32(n); }
  for (const k of keys) {
    encodeStr(w, k);
    encodeValue(w, v[k], depth + 1);
  }
}

function encode(v) {
  const w = new Writer();
  encodeValue(w, v, 0);
  return w.result();
}

class Reader {
  constructor(b) {
    this.b = b;
    this.view = new DataView(b.buffer, b.byteOffset, b.byteLength);
    this.off = 0;
  }
  need(n) { if (this.off + n > this.b.length) throw new TypeError("truncated msgpack"); }
  u8() { this.need(1); return this.b[this.off++]; }
  u16() { this.need(2); const v = this.view.getUint16(this.off); this.off += 2; return v; }
  u32() { this.need(4); const v = this.view.getUint32(this.off); this.off += 4; return v; }
  take(n) { this.need(n); const s = this.b.subarray(this.off, this.off + n); this.off += n; return s; }
}

function big(v) {
  return v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
}

function setKey(o, k, v) {
  // defineProperty, so that a key named "__proto__" is data, not a prototype change
  Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });
}

function decodeValue(r, depth) {
  if (depth > MAX_DECODE_DEPTH) throw new TypeError("msgpack nesting is too deep");
  const t = r.u8();
  if (t < 0x80) return t;
  if (t >= 0xe0) return t - 256;
  if ((t & 0xf0) === 0x80) return decodeMap(r, t & 0x0f, depth);
  if ((t & 0xf0) === 0x90) return decodeArray(r, t & 0x0f, depth);
  if ((t & 0xe0) === 0xa0) return dec.decode(r.take(t & 0x1f));
  let v;
  switch (t) {
    case 0xc0: return null;
    case 0xc2: return false;
    case 0xc3: return true;
    case 0xc4: return r.take(r.u8()).slice();
    case 0xc5: return r.take(r.u16()).slice();
    case 0xc6: return r.take(r.u32()).slice();
    case 0xca: r.need(4); v = r.view.getFloat32(r.off); r.off += 4; return v;
    case 0xcb: r.need(8); v = r.view.getFloat64(r.off); r.off += 8; return v;
    case 0xcc: return r.u8();
    case 0xcd: return r.u16();
    case 0xce: return r.u32();
    case 0xcf: r.need(8); v = r.view.getBigUint64(r.off); r.off += 8; return big(v);
    case 0xd0: r.need(1); v = r.view.getInt8(r.off); r.off += 1; return v;
    case 0xd1: r.need(2); v = r.view.getInt16(r.off); r.off += 2; return v;
    case 0xd2: r.need(4); v = r.view.getInt32(r.off); r.off += 4; return v;
    case 0xd3: r.need(8); v = r.view.getBigInt64(r.off); r.off += 8; return big(v);
    case 0xd9: return dec.decode(r.take(r.u8()));
    case 0xda: return dec.decode(r.take(r.u16()));
    case 0xdb: return dec.decode(r.take(r.u32()));
    case 0xdc: return decodeArray(r, r.u16(), depth);
    case 0xdd: return decodeArray(r, r.u32(), depth);
    case 0xde: return decodeMap(r, r.u16(), depth);
    case 0xdf: return decodeMap(r, r.u32(), depth);
  }
  throw new TypeError("unsupported msgpack type 0x" + t.toString(16));
}

function decodeArray(r, n, depth) {
  if (n > r.b.length - r.off) throw new TypeError("msgpack array larger than its frame");
  const a = new Array(n);
  for (let i = 0; i < n; i++) a[i] = decodeValue(r, depth + 1);
  return a;
}

function decodeMap(r, n, depth) {
  if (2 * n > r.b.length - r.off) throw new TypeError("msgpack map larger than its frame");
  const o = {};
  for (let i = 0; i < n; i++) {
    const k = decodeValue(r, depth + 1);
    if (typeof k !== "string") throw new TypeError("msgpack map key is not a string");
    setKey(o, k, decodeValue(r, depth + 1));
  }
  return o;
}

function decode(b) {
  const r = new Reader(b);
  const v = decodeValue(r, 0);
  if (r.off !== b.length) throw new TypeError("trailing bytes after msgpack value");
  return v;
}

// ---- frames ----

let writeChain = Promise.resolve();

async function writeAll(bytes) {
  let off = 0;
  while (off < bytes.length) {
    const n = await writeOut(bytes.subarray(off));
    if (n <= 0) throw new Error("stdout closed");
    off += n;
  }
}

// Frames are written whole and in order: each write waits for the previous one.
function sendFrame(obj) {
  const payload = encode(obj);
  if (payload.length > MAX_FRAME) return Promise.reject(new RangeError("frame too large"));
  const frame = new Uint8Array(4 + payload.length);
  new DataView(frame.buffer).setUint32(0, payload.length);
  frame.set(payload, 4);
  const p = writeChain.then(() => writeAll(frame));
  writeChain = p.catch(() => {});
  return p;
}

let inBuf = new Uint8Array(0);
let inEof = false;

async function fill() {
  const chunk = new Uint8Array(65536);
  const n = await readIn(chunk);
  if (n === null) {
    inEof = true;
    return;
  }
  const b = new Uint8Array(inBuf.length + n);
  b.set(inBuf);
  b.set(chunk.subarray(0, n), inBuf.length);
  inBuf = b;
}

async function readFrame() {
  while (inBuf.length < 4) {
    if (inEof) return null;
    await fill();
  }
  const len = new DataView(inBuf.buffer, inBuf.byteOffset, 4).getUint32(0);
  if (len === 0 || len > MAX_FRAME) throw new RangeError("bad frame length from the shim");
  while (inBuf.length < 4 + len) {
    if (inEof) return null;
    await fill();
  }
  const payload = inBuf.slice(4, 4 + len);
  inBuf = inBuf.slice(4 + len);
  return decode(payload);
}

// ---- binding calls ----

let nextId = 1;
const pending = new Map();
let channelClosed = false;

function call(method, args) {
  if (channelClosed) return Promise.reject(new Error("host channel closed"));
  const id = nextId++;
  const frame = { t: "call", id, method: String(method) };
  if (args !== undefined) frame.args = args;
  return new Promise((resolve, reject) => {
    pending.set(id, { resolve, reject });
    sendFrame(frame).catch((e) => {
      pending.delete(id);
      reject(e);
    });
  });
}

async function replyLoop() {
  try {
    for (;;) {
      const f = await readFrame();
      if (f === null) break;
      if (f.t !== "reply") continue;
      const p = pending.get(f.id);
      if (p === undefined) continue;
      pending.delete(f.id);
      if (f.ok) {
        p.resolve(f.value);
      } else {
        const e = f.error ?? {};
        const err = new Error(typeof e.message === "string" ? e.message : "binding call rejected");
        err.code = typeof e.code === "string" ? e.code : "execution_error";
        if (typeof e.correlationId === "string") err.correlationId = e.correlationId;
        p.reject(err);
      }
    }
  } catch (_) {
    // a broken channel ends like a closed one
  }
  channelClosed = true;
  for (const p of pending.values()) p.reject(new Error("host channel closed"));
  pending.clear();
}

// ---- console capture ----

const logs = [];
let logsDropped = 0;
let logBytes = 0;

function truncateUtf8(s, max) {
  const b = enc.encode(s);
  if (b.length <= max) return s;
  // keep whole code points, then the ellipsis (3 bytes), within max bytes
  let cut = max - 3;
  while (cut > 0 && (b[cut] & 0xc0) === 0x80) cut--;
  return new TextDecoder().decode(b.subarray(0, cut)) + "\u2026";
}

function show(a) {
  if (typeof a === "string") return a;
  if (a instanceof Error) return a.stack ?? String(a);
  if (typeof a === "bigint" || typeof a === "symbol" || typeof a === "function" || a === undefined) return String(a);
  try {
    const s = JSON.stringify(a);
    return s === undefined ? String(a) : s;
  } catch (_) {
    try { return String(a); } catch (_) { return "[unprintable]"; }
  }
}

function capture(level, args) {
  if (logs.length >= MAX_LOGS || logBytes >= MAX_LOG_TOTAL) {
    logsDropped++;
    return;
  }
  const line = truncateUtf8(level + ": " + args.map(show).join(" "), MAX_LOG_BYTES);
  const n = enc.encode(line).length;
  if (logBytes + n > MAX_LOG_TOTAL - 128) {
    // the rest of the byte budget is kept for the "dropped" entry finish() writes
    logBytes = MAX_LOG_TOTAL;
    logsDropped++;
    return;
  }
  logBytes += n;
  logs.push(line);
}

const counts = new Map();
const timers = new Map();
const levels = { error: "error", warn: "warn", info: "info", debug: "debug", trace: "error" };
for (const key of Object.getOwnPropertyNames(console)) {
  if (typeof console[key] !== "function") continue;
  let fn;
  if (key === "assert") fn = (cond, ...rest) => { if (!cond) capture("error", ["Assertion failed", ...rest]); };
  else if (key === "count") fn = (label = "default") => { const n = (counts.get(label) ?? 0) + 1; counts.set(label, n); capture("log", [`${label}: ${n}`]); };
  else if (key === "countReset") fn = (label = "default") => counts.delete(label);
  else if (key === "time") fn = (label = "default") => timers.set(label, Date.now());
  else if (key === "timeEnd" || key === "timeLog") fn = (label = "default", ...rest) => {
    const t = timers.get(label);
    if (key === "timeEnd") timers.delete(label);
    capture("log", [`${label}: ${t === undefined ? "no such timer" : Date.now() - t + "ms"}`, ...rest]);
  };
  else if (key === "groupEnd" || key === "clear" || key === "profile" || key === "profileEnd" || key === "timeStamp") fn = () => {};
  else fn = (...args) => capture(levels[key] ?? "log", args);
  Object.defineProperty(console, key, { value: fn, writable: true, configurable: true, enumerable: true });
}

// ---- globalThis.questpie ----

// Values as the guest sees them under upstream's supervisor, which calls the broker's JSON route
// (PROTOCOL.md section 1): bytes are base64 text there, and files.read names its bytes
// `contentBase64`. The shim speaks msgpack, where they are `bin`; they are turned into what the JSON
// route would have answered, so that a guest sees the same values under either supervisor.
function base64Bytes(b) {
  let out = "";
  for (let i = 0; i < b.length; i += 24576) out += btoa(String.fromCharCode.apply(null, b.subarray(i, i + 24576)));
  return out;
}

function asJsonValue(v) {
  if (v instanceof Uint8Array) return base64Bytes(v);
  // an integer beyond 2^53 is a number after JSON.parse, not a BigInt
  if (typeof v === "bigint") return Number(v);
  if (Array.isArray(v)) return v.map(asJsonValue);
  if (v !== null && typeof v === "object") {
    const o = {};
    for (const k of Object.keys(v)) setKey(o, k, asJsonValue(v[k]));
    return o;
  }
  return v;
}

function filesReadValue(v) {
  if (v === null || typeof v !== "object" || !(v.content instanceof Uint8Array)) return asJsonValue(v);
  const o = {};
  for (const k of Object.keys(v)) {
    if (k === "content") setKey(o, "contentBase64", base64Bytes(v.content));
    else setKey(o, k, asJsonValue(v[k]));
  }
  return o;
}

function opsFor(prefix, ops) {
  const o = {};
  for (const op of ops) {
    const method = `${prefix}.${op}`;
    const shape = method === "files.read" ? filesReadValue : asJsonValue;
    o[op] = (args) => call(method, args ?? {}).then(shape);
  }
  return Object.freeze(o);
}

// <name>.<op> proxies; "then" stays undefined so that awaiting the proxy is harmless
function nameProxy(kind, ops) {
  return new Proxy(Object.create(null), {
    get(_, name) {
      if (typeof name !== "string" || name === "then") return undefined;
      return opsFor(`${kind}.${name}`, ops);
    },
  });
}

// The store sugar, exactly upstream's: store.<s>.create(x) is
// collections.document_store.create({...x, store: s}); the other operations carry the namespace in
// `where`, merged into the given one (PROTOCOL.md section 6b, "Document store").
function storeOps(name) {
  const o = {};
  for (const op of DATA_OPS) {
    const method = `collections.document_store.${op}`;
    o[op] = (args) => {
      const a = args !== null && typeof args === "object" ? args : {};
      let sent;
      if (op === "create") sent = { ...a, store: name };
      else {
        const where = a.where !== null && typeof a.where === "object" ? a.where : {};
        sent = { ...a, where: { ...where, store: name } };
      }
      return call(method, sent).then(asJsonValue);
    };
  }
  return Object.freeze(o);
}

const DATA_OPS = ["find", "findOne", "create", "update", "delete"];
const questpie = Object.freeze({
  files: opsFor("files", ["read", "write", "list"]),
  collections: nameProxy("collections", DATA_OPS),
  store: new Proxy(Object.create(null), {
    get(_, name) {
      if (typeof name !== "string" || name === "then") return undefined;
      return storeOps(name);
    },
  }),
  tools: Object.freeze({
    list: () => call("tools.list", {}).then(asJsonValue),
    call: (name, args) => call("tools.call", args === undefined ? { name } : { name, arguments: args }).then(asJsonValue),
  }),
});

// ---- fetch over http.fetch (PROTOCOL.md section 6a) ----

async function brokeredFetch(input, init) {
  const req = new RealRequest(input, init);
  if (req.signal?.aborted) throw req.signal.reason ?? new DOMException("The operation was aborted", "AbortError");
  const headers = {};
  for (const [k, v] of req.headers) headers[k] = v;
  const args = { url: req.url, method: req.method, headers };
  if (req.body !== null) {
    const body = new Uint8Array(await req.arrayBuffer());
    // an oversize body is sent anyway, so that the broker refuses it authoritatively
    if (body.length > 0) args.body = body;
  }
  let res;
  try {
    res = await call("http.fetch", args);
  } catch (e) {
    throw new TypeError(e?.message ?? "fetch failed", { cause: e });
  }
  if (req.signal?.aborted) throw req.signal.reason ?? new DOMException("The operation was aborted", "AbortError");
  const status = res?.status;
  if (typeof status !== "number") throw new TypeError("fetch failed: invalid broker reply");
  let body = res.body instanceof Uint8Array ? res.body : null;
  if (body === null && typeof res.bodyBase64 === "string" && res.bodyBase64 !== "") {
    const bin = atob(res.bodyBase64);
    body = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) body[i] = bin.charCodeAt(i);
  }
  if (status < 200 || status === 204 || status === 205 || status === 304) body = null;
  const h = new RealHeaders();
  for (const [k, v] of Object.entries(res.headers ?? {})) {
    try { h.append(k, String(v)); } catch (_) { /* a header the Headers class refuses is dropped */ }
  }
  const response = new RealResponse(body, {
    status: status >= 200 && status <= 599 ? status : 502,
    statusText: typeof res.statusText === "string" ? res.statusText : "",
    headers: h,
  });
  Object.defineProperty(response, "url", { value: req.url });
  return response;
}

// ---- run ----

// A run with imports loads its modules from listeners on the guest's own loopback, one per
// import origin (relay/modules.h); the init frame maps each listener's URL prefix to its origin.
// Errors name the origin, as Deno names it when it fetches a module itself.
let importPrefixes = [];

function unmapImports(text) {
  for (const [loopback, origin] of importPrefixes) text = text.split(loopback).join(origin);
  return text;
}

function errorText(e) {
  if (e instanceof Error) return e.message || String(e);
  return show(e);
}

// Host paths stay out of the guest's sight: where Deno is installed, the
// runtime's own URL, the working directory. The argv array is rewritten in
// place, so that the named export of node:process (the same array) shows the
// same; execPath and argv0 are accessors whose setters Deno provides.
function maskProcess() {
  const define = (o, k, v) => Object.defineProperty(o, k, { value: v, writable: false, configurable: false, enumerable: true });
  define(Deno, "execPath", () => VIRTUAL_EXEC_PATH);
  define(Deno, "cwd", () => VIRTUAL_CWD);
  Object.defineProperty(Deno, "mainModule", { get: () => VIRTUAL_MAIN_MODULE, configurable: false, enumerable: true });
  if (nodeProcess !== undefined) {
    const argv = nodeProcess.argv;
    argv.length = 0;
    argv.push("deno", VIRTUAL_MAIN_MODULE);
    Object.freeze(argv);
    nodeProcess.execPath = VIRTUAL_EXEC_PATH;
    nodeProcess.argv0 = VIRTUAL_EXEC_PATH;
    define(nodeProcess, "cwd", () => VIRTUAL_CWD);
  }
}

// Shared memory through WebAssembly: `new WebAssembly.Memory({shared: true})`
// and a module that declares and exports a shared memory both hand out a
// SharedArrayBuffer (and with it the constructor). The shim starts V8 with
// --enable-sharedarraybuffer-per-context (guest/runner.c), which takes the
// SharedArrayBuffer global out of every context (node:vm's too), but not the
// buffers WebAssembly makes. So the Memory constructor refuses `shared`, and
// every way a Memory hands out its buffer refuses a shared one. The
// descriptor is read once, into a copy, so a getter cannot answer one thing
// to the check and another to V8.
function closeSharedWasmMemory() {
  // Everything the guard calls is taken now, into its own bindings: guest code runs later and may
  // replace Function.prototype.call, Reflect.construct, Array iteration or TypeError, and none of
  // those may reach the original getters or constructor.
  const apply = Reflect.apply;
  const construct = Reflect.construct;
  const getOwnDesc = Object.getOwnPropertyDescriptor;
  const defineProp = Object.defineProperty;
  const createObject = Object.create;
  const RealTypeError = TypeError;
  // this realm's SharedArrayBuffer.prototype, from a buffer made before the guard is up
  const sabProto = Object.getPrototypeOf(new WebAssembly.Memory({ initial: 0, maximum: 0, shared: true }).buffer);
  const sabLength = getOwnDesc(sabProto, "byteLength").get;
  const isShared = (b) => {
    try { apply(sabLength, b, []); return true; } catch (_) { return false; }
  };
  const refuse = () => new RealTypeError("shared WebAssembly memory is not available in the sandbox");
  const KEYS = ["initial", "maximum", "shared", "address", "index"];
  const RealMemory = WebAssembly.Memory;
  const proto = RealMemory.prototype;
  const Memory = function Memory(desc) {
    if (new.target === undefined) throw new RealTypeError("WebAssembly.Memory must be invoked with 'new'");
    if (desc === null || (typeof desc !== "object" && typeof desc !== "function")) return new RealMemory(desc);
    // each key read once, into an object with no prototype: V8 reads only what the check saw
    const copy = createObject(null);
    for (let i = 0; i < KEYS.length; i++) {
      const v = desc[KEYS[i]];
      if (v !== undefined) copy[KEYS[i]] = v;
    }
    if (copy.shared) throw refuse();
    return construct(RealMemory, [copy], new.target === Memory ? RealMemory : new.target);
  };
  defineProp(Memory, "prototype", { value: proto, writable: false, configurable: false, enumerable: false });
  defineProp(proto, "constructor", { value: Memory, writable: true, configurable: true, enumerable: false });
  const d = getOwnDesc(proto, "buffer");
  if (d?.get !== undefined) {
    const get = d.get;
    defineProp(proto, "buffer", {
      get() {
        const b = apply(get, this, []);
        if (isShared(b)) throw refuse();
        return b;
      },
      configurable: false,
      enumerable: d.enumerable,
    });
  }
  for (const name of ["toResizableBuffer", "toFixedLengthBuffer"]) {
    const fn = proto[name];
    if (typeof fn !== "function") continue;
    defineProp(proto, name, {
      value: function () {
        const b = apply(fn, this, []);
        if (isShared(b)) throw refuse();
        return b;
      },
      writable: false,
      configurable: false,
      enumerable: false,
    });
  }
  defineProp(WebAssembly, "Memory", { value: Memory, writable: false, configurable: false, enumerable: false });
}

// What needs no run: everything here happens before the init frame arrives
// (a pooled guest waits for its run in this state), so a run pays only for
// its own module. Each step says why it is here.
function prepare() {
  // Storage that writes into DENO_DIR, outside any byte budget of Deno's own:
  // the Cache API, localStorage, sessionStorage. Removed before they load.
  for (const k of ["caches", "localStorage", "sessionStorage"]) delete globalThis[k];
  // Deno's internals (core ops: one renames the process in the host's ps)
  delete Deno[Deno.internal];
  // Some globals (timers, for one) load lazily from Deno's own code, which uses
  // Atomics; touch every global once so that the loads happen before it goes.
  // Measured: this and the Node layer `process` pulls in are most of the start
  // (about 60 ms of a cold run); a pooled guest pays it before its run.
  for (const k of Object.getOwnPropertyNames(globalThis)) {
    try { void globalThis[k]; } catch (_) { /* a getter that throws is left alone */ }
  }
  closeSharedWasmMemory();
  // no threads or shared memory for the guest (PROTOCOL.md section 2, guest side)
  Object.defineProperty(globalThis, "Worker", { value: undefined, writable: false, configurable: false });
  delete globalThis.SharedArrayBuffer;
  delete globalThis.Atomics;
  maskProcess();
  // uncaught errors in timers and stray rejections are logged instead of killing the run
  globalThis.addEventListener("error", (ev) => {
    ev.preventDefault();
    capture("error", ["Uncaught", ev.error ?? ev.message]);
  });
  globalThis.addEventListener("unhandledrejection", (ev) => {
    ev.preventDefault();
    capture("error", ["Uncaught (in promise)", ev.reason]);
  });
}

// What the run's init frame decides.
function installRun(init) {
  // a run without bindings has no questpie; one without a broker keeps Deno's fetch, which --deny-net refuses
  if (init.bindings !== false)
    Object.defineProperty(globalThis, "questpie", { value: questpie, writable: false, configurable: false, enumerable: true });
  if (init.fetch !== false) Object.defineProperty(globalThis, "fetch", { value: brokeredFetch, writable: true, configurable: true });
  // the host's secrets, for compatibility: whatever is here, the guest's code can read and leak (README.md)
  if (init.secrets !== undefined && init.secrets !== null && typeof init.secrets === "object") {
    // a plain object, as upstream's; defineProperty, so that a secret named "__proto__" stays a secret
    const secrets = {};
    for (const k of Object.keys(init.secrets)) setKey(secrets, k, init.secrets[k]);
    Object.freeze(secrets);
    Object.defineProperty(globalThis, "__secrets", { value: secrets, writable: true, configurable: true, enumerable: false });
  }
}

function base64Utf8(s) {
  const b = enc.encode(s);
  let out = "";
  for (let i = 0; i < b.length; i += 24576) out += btoa(String.fromCharCode.apply(null, b.subarray(i, i + 24576)));
  return out;
}

let finished = false;

async function finish(ok, value) {
  if (finished) return;
  finished = true;
  // calls the guest did not await settle first: a result must not race them
  await Promise.allSettled([...pending.values()].map((p) => new Promise((res) => {
    const { resolve, reject } = p;
    p.resolve = (v) => { resolve(v); res(); };
    p.reject = (e) => { reject(e); res(); };
  })));
  if (logsDropped > 0) {
    const note = (n) => `warn: ${n} log entries dropped (max ${MAX_LOGS} entries, ${MAX_LOG_TOTAL} bytes)`;
    if (logs.length >= MAX_LOGS) logs[logs.length - 1] = note(logsDropped + 1);
    else logs.push(note(logsDropped));
  }
  let frame;
  if (ok) {
    frame = { t: "result", ok: true, logs };
    if (value !== undefined) {
      let size;
      try {
        size = encode(value).length;
      } catch (e) {
        frame = { t: "result", ok: false, error: "guest output is not serializable: " + errorText(e), logs };
      }
      if (size !== undefined && size > MAX_OUTPUT) frame = { t: "result", ok: false, error: "sandbox output limit exceeded", logs };
      else if (size !== undefined) frame.output = value;
    }
  } else {
    frame = { t: "result", ok: false, error: truncateUtf8(unmapImports(String(value)), 65536), logs };
  }
  try {
    await sendFrame(frame);
  } catch (_) {
    // stdout is gone; the shim reports the missing result
  }
  exit(0);
}

async function main() {
  prepare();
  let init;
  try {
    init = await readFrame();
  } catch (e) {
    return finish(false, "bad init frame: " + errorText(e));
  }
  if (init === null || init.t !== "init") return finish(false, "the shim sent no init frame");
  replyLoop();
  if (init.imports !== null && typeof init.imports === "object") {
    importPrefixes = Object.entries(init.imports).filter(([k, v]) => typeof v === "string" && k.startsWith("http://127.0.0.1:"));
  }
  installRun(init);
  if (typeof init.source !== "string") return finish(false, "init frame carries no guest source");
  let mod;
  try {
    mod = await import("data:application/typescript;base64," + base64Utf8(init.source));
  } catch (e) {
    return finish(false, "guest module failed to load: " + errorText(e));
  }
  if (typeof mod?.default !== "function") return finish(false, "guest module must export a default function");
  let out;
  try {
    out = await mod.default(init.input);
  } catch (e) {
    return finish(false, errorText(e));
  }
  return finish(true, out);
}

main().catch((e) => finish(false, "guest runtime failed: " + errorText(e)));
