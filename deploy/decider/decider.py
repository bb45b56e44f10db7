#!/usr/bin/python3
"""An example decider for sandbox-broker (proto/PROTOCOL.md section 5a): approves by rule, logs.

The broker POSTs the description of a call a manifest's `decide` rules hold;
this answers {"v":1,"decision":"allow"} or {"v":1,"decision":"deny","reason":...}
from a rules file, first match wins, and writes one JSON line per decision to
stdout (the journal under systemd). Python 3 standard library only.

    decider.py --listen 127.0.0.1:9400 --rules rules.json [--secret-file decider.secret]

rules.json:

    {"rules": [
       {"method": "collections.notes.delete", "decision": "allow"},
       {"method": "collections.posts.delete", "args": {"where": {"id": 7}}, "decision": "allow"},
       {"method": "http.fetch", "urlPrefix": "https://pay.example:443/v1/refunds/", "decision": "allow"}],
     "default": {"decision": "deny", "reason": "no rule allows this call"}}

A rule matches when its `method` pattern matches (segments, `*` for one whole
segment, as the manifest's decide.methods), every key of its `args` equals the
described argument of that name, and the `url` starts with its `urlPrefix`
(the broker writes the port: https://host:443/...).

Allow what you know and deny the rest: a rule that denies particular argument
values is easy to walk around (one where can be written many ways: {"id": 1},
{"id": {"equals": 1}}, {"and": [{"id": 1}]}). So an allow rule never matches a
description that left arguments out ("omitted": too large to describe, the
decider cannot see them), and a urlPrefix never matches a URL whose path an
upstream could read otherwise than this prefix does (encoded dots, slashes,
backslashes or percents, ";", dot segments).
With --secret-file, requests without `Authorization: Bearer <that secret>` are
answered 401 (which the broker treats as a refusal). SIGHUP reloads the rules.

Anything unexpected (a body that is not the version-1 description, a rules
file that does not load) is answered with a deny, never with an allow: the
broker refuses the call on any answer it cannot read as well, so fail closed
holds on both ends.
"""

import argparse
import hmac
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 16384  # the broker's request cap (PROTOCOL.md section 8)
MAX_REASON = 256  # bytes of UTF-8 the broker takes in a reason
IO_TIMEOUT = 10.0  # seconds a connection may stay silent (the broker's deadline is far shorter)

lock = threading.Lock()
state = {"rules": [], "default": {"decision": "deny", "reason": "no rule allows this call"}}


def load_rules(path):
    with open(path) as f:
        doc = json.load(f)
    rules = doc.get("rules", [])
    for r in rules:
        if r.get("decision") not in ("allow", "deny") or not isinstance(r.get("method"), str):
            raise ValueError("every rule needs a method and a decision of allow or deny: %r" % (r,))
    default = doc.get("default", state["default"])
    if default.get("decision") not in ("allow", "deny"):
        raise ValueError("default.decision must be allow or deny")
    with lock:
        state["rules"], state["default"] = rules, default


def method_matches(pattern, method):
    p, m = pattern.split("."), method.split(".")
    return len(p) == len(m) and all(a == "*" or a == b for a, b in zip(p, m))


def decide(desc):
    """(decision, reason, rule index or None) for a version-1 description."""
    with lock:
        rules, default = state["rules"], state["default"]
    args = desc.get("args") or {}
    for i, r in enumerate(rules):
        if not method_matches(r["method"], desc.get("method", "")):
            continue
        if r["decision"] == "allow" and desc.get("omitted"):
            continue  # what it cannot see it does not allow
        if any(args.get(k) != v for k, v in (r.get("args") or {}).items()):
            continue
        if "urlPrefix" in r:
            url = str(args.get("url", ""))
            if not url.startswith(r["urlPrefix"]) or ambiguous_path(url):
                continue
        return r["decision"], r.get("reason"), i
    return default["decision"], default.get("reason"), None


def ambiguous_path(url):
    """1 when an upstream might read the URL's path otherwise than a prefix match does"""
    path = url.split("?", 1)[0].split("#", 1)[0].lower()
    return (any(x in path for x in ("%2e", "%2f", "%5c", "%25", ";", "\\")) or "/./" in path or "/../" in path
            or path.endswith("/.") or path.endswith("/.."))


def log(**fields):
    fields["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    sys.stdout.write(json.dumps(fields, sort_keys=True) + "\n")
    sys.stdout.flush()


class Handler(BaseHTTPRequestHandler):
    secret = None
    protocol_version = "HTTP/1.1"
    timeout = IO_TIMEOUT  # a peer that connects and says nothing does not keep a thread for ever

    def answer(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        if self.secret is not None:
            got = self.headers.get("Authorization", "")
            if not hmac.compare_digest(got.encode(), ("Bearer " + self.secret).encode()):
                log(event="refused", why="bad or missing bearer secret", peer=self.client_address[0])
                self.answer(401, {"error": "unauthorized"})
                return
        try:
            n = int(self.headers.get("Content-Length", ""))
        except ValueError:
            n = -1
        if n < 0 or n > MAX_BODY:
            self.answer(200, {"v": 1, "decision": "deny", "reason": "the description is too large"})
            return
        try:
            desc = json.loads(self.rfile.read(n))
            if not isinstance(desc, dict) or desc.get("v") != 1:
                raise ValueError("not a version-1 description")
            decision, reason, rule = decide(desc)
        except Exception as e:  # noqa: BLE001 - anything unexpected is a deny
            log(event="decision", decision="deny", why="unreadable request: %s" % e)
            self.answer(200, {"v": 1, "decision": "deny", "reason": "the decider could not read the call"})
            return
        out = {"v": 1, "decision": decision}
        if decision == "deny" and reason:
            # the broker takes at most 256 bytes of reason (PROTOCOL.md section 5a): cut between characters
            out["reason"] = reason.encode("utf-8")[:MAX_REASON].decode("utf-8", "ignore")
        log(event="decision", id=desc.get("id"), runId=desc.get("runId"), method=desc.get("method"),
            decision=decision, reason=reason, rule=rule)
        self.answer(200, out)

    def log_message(self, *a):
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:9400")
    ap.add_argument("--rules", required=True)
    ap.add_argument("--secret-file")
    a = ap.parse_args()
    load_rules(a.rules)
    if a.secret_file:
        with open(a.secret_file) as f:
            Handler.secret = f.read().rstrip("\r\n")

    def reload(*_):
        try:
            load_rules(a.rules)
            log(event="reloaded", rules=len(state["rules"]))
        except Exception as e:  # noqa: BLE001 - keep the rules in force
            log(event="reload.rejected", why=str(e))
    signal.signal(signal.SIGHUP, reload)
    host, _, port = a.listen.rpartition(":")
    srv = ThreadingHTTPServer((host.strip("[]"), int(port)), Handler)
    srv.daemon_threads = True
    log(event="listening", host=host, port=srv.server_address[1], rules=len(state["rules"]))
    srv.serve_forever()


if __name__ == "__main__":
    main()
