"""A scripted guest that speaks the frame protocol (proto/PROTOCOL.md section 2) for the shim tests.

argv[1] names a JSON file holding the scenario:
  raw_hex       bytes written to stdout right after init (then the guest waits for stdin EOF)
  then_exit     after raw_hex, exit at once
  calls         [[id, method, args?], ...] sent at once; replies are collected
  result        the result frame to send after the replies (default: ok with what was seen)
  after_hex     bytes written after the result
  no_result     exit(0) without a result
  ignore_term   ignore SIGTERM and sleep (to test the SIGKILL escalation)
  sleep_ms      sleep before anything
The default output is {init, order: [reply ids in arrival order], replies: {id: reply}, env, argv}.
"""
import json
import os
import signal
import struct
import sys
import time

import msgpack

with open(sys.argv[1]) as f:
    scenario = json.load(f)
inp = sys.stdin.buffer
out = sys.stdout.buffer


def read_exact(n):
    data = b""
    while len(data) < n:
        chunk = inp.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def read_frame():
    h = read_exact(4)
    if h is None:
        return None
    (n,) = struct.unpack(">I", h)
    return msgpack.unpackb(read_exact(n), raw=False)


def send(obj):
    payload = msgpack.packb(obj, use_bin_type=True)
    out.write(struct.pack(">I", len(payload)) + payload)
    out.flush()


if scenario.get("ignore_term"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if scenario.get("sleep_ms"):
    time.sleep(scenario["sleep_ms"] / 1000.0)

init = read_frame()
if scenario.get("raw_hex") is not None:
    out.write(bytes.fromhex(scenario["raw_hex"]))
    out.flush()
    if scenario.get("ignore_term"):
        time.sleep(30)
    if scenario.get("then_exit"):
        sys.exit(0)
    while inp.read(65536):
        pass
    sys.exit(0)

order, replies = [], {}
for c in scenario.get("calls", []):
    f = {"t": "call", "id": c[0], "method": c[1]}
    if len(c) > 2:
        f["args"] = c[2]
    send(f)
while len(order) < len(scenario.get("calls", [])):
    f = read_frame()
    if f is None:
        break
    order.append(f["id"])
    replies[str(f["id"])] = f

if scenario.get("no_result"):
    sys.exit(0)
result = scenario.get("result") or {"t": "result", "ok": True, "logs": ["log: fake guest"], "output": {
    "init": init, "order": order, "replies": replies, "env": dict(os.environ), "argv": sys.argv}}
send(result)
if scenario.get("after_hex"):
    out.write(bytes.fromhex(scenario["after_hex"]))
    out.flush()
if scenario.get("ignore_term"):
    time.sleep(30)
