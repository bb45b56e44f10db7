#!/usr/bin/python3
"""Ambiguous HTTP/1 request framing is refused (RFC 9112 sections 5.2, 6.1 and 6.3; broker/http/framing.c).

Raw sockets, because an HTTP client library would not send these heads. Every ambiguous form gets 400
and the connection is closed after it: a valid request pipelined behind it, in the same write, is never
answered. That holds on the RPC route, the health routes and an unknown path of the public listener,
and on the admin listener. The unambiguous forms (one Content-Length, a lone chunked on HTTP/1.1, any
case, leading whitespace, HTTP/1.0 with Content-Length) still reach the route, and their connection
stays open for the pipelined request and one more.

Some forms h2o 2.2.5 refuses itself before the route runs (a Content-Length that is not one number, a
coding other than chunked); the table says which, and both answer 400 and close.
"""

import json
import os
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sbtest  # noqa: E402

RPC = sbtest.RPC_PATH.encode()
BODY = b'{"method":"services.svc.fn","args":{}}'
PIPELINED = b"GET /healthz HTTP/1.1\r\nHost: b\r\n\r\n"
REFUSED_BODY = b"ambiguous request framing\n"
MSG_SERVICES = "services dispatch is not implemented"


def chunked(body):
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


def parse_responses(buf):
    """[(status, headers, body)] of the complete responses in buf (bodies framed by Content-Length), and the rest."""
    out = []
    while True:
        head, sep, rest = buf.partition(b"\r\n\r\n")
        if not sep:
            return out, buf
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ")[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            headers[k.strip().lower().decode()] = v.strip().decode()
        n = int(headers.get("content-length", "0"))
        if len(rest) < n:
            return out, buf
        out.append((status, headers, rest[:n]))
        buf = rest[n:]


def exchange(port, data, want, timeout=10.0):
    """Sends data in one write; reads until `want` responses have arrived or the server closes.
    Returns (responses, closed)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        buf, closed = b"", False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got, _ = parse_responses(buf)
            if len(got) >= want:
                break
            s.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = s.recv(65536)
            if not chunk:
                closed = True
                break
            buf += chunk
        got, rest = parse_responses(buf)
        if not closed and len(got) >= want:
            # still open: one more request on it must be answered too
            more = b""
            try:
                s.sendall(PIPELINED)
                while not parse_responses(more)[0]:
                    chunk = s.recv(65536)
                    if not chunk:
                        closed = True
                        break
                    more += chunk
            except ConnectionResetError:
                # the server had closed it: its FIN came after the answer we counted, and the
                # request sent into a closed connection is answered with a reset
                closed = True
            got += parse_responses(more)[0]
        return got, closed, rest
    finally:
        s.close()


def req(method, path, headers, body=b"", version=b"HTTP/1.1"):
    return method + b" " + path + b" " + version + b"\r\nHost: b\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


# (name, request, who refuses it: "broker" (framing.c) or "h2o" (before the route))
AMBIGUOUS_RPC = [
    ("two different Content-Length", req(b"POST", RPC, [b"Content-Length: 5", b"Content-Length: 50"], b"hello"), "broker"),
    ("two equal Content-Length", req(b"POST", RPC, [b"Content-Length: 5", b"Content-Length: 5"], b"hello"), "broker"),
    ("Content-Length then an invalid one", req(b"POST", RPC, [b"Content-Length: 5", b"Content-Length: +6"], b"hello"), "broker"),
    ("Content-Length list", req(b"POST", RPC, [b"Content-Length: 5, 5"], b"hello"), "h2o"),
    ("Content-Length with a sign", req(b"POST", RPC, [b"Content-Length: +5"], b"hello"), "h2o"),
    ("Content-Length with inner space", req(b"POST", RPC, [b"Content-Length: 5 5"], b"hello"), "h2o"),
    ("Content-Length with trailing space", req(b"POST", RPC, [b"Content-Length: 5 "], b"hello"), "h2o"),
    ("Content-Length empty", req(b"POST", RPC, [b"Content-Length:"], b"hello"), "h2o"),
    ("Content-Length then chunked", req(b"POST", RPC, [b"Content-Length: 5", b"Transfer-Encoding: chunked"], chunked(b"hello")),
     "broker"),
    ("chunked then Content-Length", req(b"POST", RPC, [b"Transfer-Encoding: chunked", b"Content-Length: 5"], chunked(b"hello")),
     "broker"),
    ("chunked and Content-Length 0", req(b"POST", RPC, [b"Transfer-Encoding: chunked", b"Content-Length: 0"], chunked(b"hello")),
     "broker"),
    ("gzip then chunked, two fields", req(b"POST", RPC, [b"Transfer-Encoding: gzip", b"Transfer-Encoding: chunked"],
                                          chunked(b"hello")), "broker"),
    ("chunked twice", req(b"POST", RPC, [b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked"], chunked(b"hello")),
     "broker"),
    ("a coding list", req(b"POST", RPC, [b"Transfer-Encoding: gzip, chunked"], chunked(b"hello")), "h2o"),
    ("identity", req(b"POST", RPC, [b"Transfer-Encoding: identity", b"Content-Length: 5"], b"hello"), "h2o"),
    ("chunked with trailing space", req(b"POST", RPC, [b"Transfer-Encoding: chunked "], chunked(b"hello")), "h2o"),
    ("chunked on HTTP/1.0", req(b"POST", RPC, [b"Connection: keep-alive", b"Transfer-Encoding: chunked"], chunked(b"hello"),
                                b"HTTP/1.0"), "broker"),
    ("obs-fold in a field", req(b"POST", RPC, [b"Content-Length: 5", b"X-A: a", b" folded"], b"hello"), "broker"),
    ("obs-fold after Content-Length", req(b"POST", RPC, [b"Content-Length: 5", b"\t50"], b"hello"), "broker"),
    ("obs-fold after Transfer-Encoding", req(b"POST", RPC, [b"Transfer-Encoding: chunked", b" , gzip"], chunked(b"hello")),
     "broker"),
]


class Framing(sbtest.BrokerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.b = sbtest.Broker().start()
        try:
            cls.token = cls.b.mint_ok("run-framing", {"services": ["svc"]})
        except Exception:
            cls.b.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.b.stop()

    def assertRefused(self, port, data, who, name):
        got, closed, rest = exchange(port, data + PIPELINED, 2)
        self.assertEqual([g[0] for g in got], [400], "%s: exactly one answer, 400 (%r)" % (name, got))
        self.assertTrue(closed, "%s: the connection stayed open" % name)
        self.assertEqual(rest, b"", "%s: a partial second answer" % name)
        self.assertEqual(got[0][1].get("connection"), "close", name)
        if who == "broker":
            self.assertEqual(got[0][2], REFUSED_BODY, name)
        self.assertTrue(self.b.alive(), self.b.log()[-3000:])

    def assertServed(self, port, data, status, name):
        got, closed, _ = exchange(port, data + PIPELINED, 2)
        self.assertEqual([g[0] for g in got], [status, 200, 200], "%s: answered, then the pipelined request and one more" % name)
        self.assertFalse(closed, "%s: the connection was closed" % name)
        return got[0]

    def test_rpc_route_refuses_every_ambiguous_form(self):
        for name, data, who in AMBIGUOUS_RPC:
            with self.subTest(name):
                self.assertRefused(self.b.port, data, who, name)
        # the broker says why in its log (never the bytes themselves)
        reasons = {ev.get("reason") for ev in self.b.events() if ev.get("event") == "http.framing_refused"}
        self.assertTrue({"more than one Content-Length field", "both Transfer-Encoding and Content-Length",
                         "more than one Transfer-Encoding field", "Transfer-Encoding in an HTTP/1.0 request",
                         "obs-fold line in the request head"} <= reasons, reasons)

    def test_other_public_routes(self):
        both = [b"Content-Length: 5", b"Transfer-Encoding: chunked"]
        for path in (b"/healthz", b"/readyz", b"/no-such-path"):
            with self.subTest(path=path):
                self.assertRefused(self.b.port, req(b"GET", path, both, chunked(b"hello")), "broker", path.decode())
                self.assertRefused(self.b.port, req(b"GET", path, [b"Content-Length: 0", b"Content-Length: 5"], b"hello"),
                                   "broker", path.decode())

    def test_admin_listener(self):
        auth = b"Authorization: Bearer " + self.b.secret.encode()
        mint = json.dumps({"runId": "run-framing-admin", "capabilities": {}}).encode()
        self.assertRefused(self.b.admin_port, req(b"POST", b"/admin/v1/tokens", [auth, b"Content-Length: %d" % len(mint),
                                                                                  b"Content-Length: 2"], mint), "broker", "mint")
        self.assertRefused(self.b.admin_port, req(b"POST", b"/admin/v1/tokens", [auth, b"Transfer-Encoding: chunked",
                                                                                  b"Content-Length: 2"], chunked(mint)),
                           "broker", "mint, chunked")
        self.assertRefused(self.b.admin_port, req(b"GET", b"/metrics", [auth, b"X: y", b" z"]), "broker", "metrics")
        # nothing was minted by the refused requests
        self.assertNotIn("run-framing-admin", json.dumps([ev for ev in self.b.events() if ev.get("event") == "token.minted"]))
        status, _, body = self.assertServed(self.b.admin_port, req(b"POST", b"/admin/v1/tokens",
                                                                   [auth, b"Content-Length: %d" % len(mint)], mint), 201,
                                            "admin mint")
        self.assertIn("token", json.loads(body))

    def test_unambiguous_forms_still_work(self):
        tok = sbtest.TOKEN_HEADER.encode() + b": " + self.token.encode()
        ct = b"Content-Type: application/json"
        cases = [
            ("one Content-Length", req(b"POST", RPC, [tok, ct, b"Content-Length: %d" % len(BODY)], BODY)),
            ("leading zeros", req(b"POST", RPC, [tok, ct, b"Content-Length: 000%d" % len(BODY)], BODY)),
            ("leading whitespace", req(b"POST", RPC, [tok, ct, b"Content-Length: \t %d" % len(BODY)], BODY)),
            ("chunked", req(b"POST", RPC, [tok, ct, b"Transfer-Encoding: chunked"], chunked(BODY))),
            ("Chunked in another case", req(b"POST", RPC, [tok, ct, b"Transfer-Encoding: ChUnKeD"], chunked(BODY))),
            ("chunked in pieces", req(b"POST", RPC, [tok, ct, b"Transfer-Encoding: chunked"],
                                      b"3\r\n" + BODY[:3] + b"\r\n" + chunked(BODY[3:]))),
            ("HTTP/1.0 keep-alive with Content-Length", req(b"POST", RPC, [tok, ct, b"Connection: keep-alive",
                                                                           b"Content-Length: %d" % len(BODY)], BODY, b"HTTP/1.0")),
        ]
        for name, data in cases:
            with self.subTest(name):
                status, _, body = self.assertServed(self.b.port, data, 501, name)
                self.assertEqual(json.loads(body), {"ok": False, "error": {"code": "not_implemented", "message": MSG_SERVICES}})
        # no body at all, and two plain requests pipelined
        self.assertServed(self.b.port, PIPELINED, 200, "GET")
        # HTTP/1.0 without keep-alive: answered, then closed as HTTP/1.0 wants (not refused)
        got, closed, _ = exchange(self.b.port, req(b"POST", RPC, [tok, ct, b"Content-Length: %d" % len(BODY)], BODY, b"HTTP/1.0"), 1)
        self.assertEqual([g[0] for g in got], [501])
        self.assertTrue(closed)


if __name__ == "__main__":
    sbtest.main()
