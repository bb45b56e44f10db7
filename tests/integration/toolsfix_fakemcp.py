"""A scriptable MCP Streamable HTTP server on loopback, for what the reference server never does.

server-everything answers every request as an SSE stream and an unknown session with 400; this
fake lets a test choose: JSON or SSE answers (CRLF, comments, notifications before the response),
the spec's 404 for an expired session, pagination, oversized, malformed or unexpected answers,
JSON-RPC errors, HTTP errors, a server without sessions or without the tools capability, a bad
Mcp-Session-Id. Every request is recorded (method, headers, JSON body) for assertions.

Only the standard library is used.
"""

import json
import threading
import uuid
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Behaviour:
    def __init__(self):
        self.format = "sse"            # "json" | "sse" | "sse-crlf"
        self.noise = False              # SSE: comments, a priming event and a notification before the response
        self.stateless = False          # no Mcp-Session-Id at all
        self.session_id = None          # a fixed (possibly invalid) session id to hand out
        self.capabilities = {"tools": {}}
        self.protocol_version = None    # None: echo the client's
        self.tools = []                 # what tools/list returns
        self.page_size = 0              # 0: one page
        self.endless_pages = False      # always a nextCursor
        self.call = None                # fn(name, arguments) -> ("result", obj) | ("error", code, msg) | ("raw", status, ctype, bytes)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the broker closes early on purpose (an answer over its cap, a timeout)
        super().handle_error(request, client_address)


class FakeMcp:
    def __init__(self):
        self.b = Behaviour()
        self.sessions = set()
        self.requests = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                try:
                    msg = json.loads(raw)
                except ValueError:
                    msg = None
                with fake.lock:
                    fake.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                          "body": msg})
                fake._handle(self, msg)

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self):
        return "http://127.0.0.1:%d/mcp" % self.port

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def reset(self):
        with self.lock:
            self.b = Behaviour()
            self.requests = []

    def forget_sessions(self):
        with self.lock:
            self.sessions.clear()

    def methods(self):
        with self.lock:
            return [r["body"].get("method") if isinstance(r["body"], dict) else None for r in self.requests]

    # --- answers ---

    def _send(self, h, status, ctype=None, body=b"", headers=None):
        h.send_response(status)
        if ctype is not None:
            h.send_header("Content-Type", ctype)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(body)
        h.close_connection = True

    def _reply(self, h, obj, headers=None):
        text = json.dumps(obj, separators=(",", ":"))
        fmt = self.b.format
        if fmt == "json":
            self._send(h, 200, "application/json", text.encode(), headers)
            return
        nl = "\r\n" if fmt == "sse-crlf" else "\n"
        out = ""
        if self.b.noise:
            out += ": keep-alive" + nl + "id: prime" + nl + "data:" + nl + nl
            out += "event: message" + nl + "data: " + json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                                                                  "params": {"level": "info", "data": "x"}}) + nl + nl
            out += "retry: 1000" + nl
        # the response split over two data lines (joined with LF, which JSON ignores)
        half = text.index(",") + 1
        out += "event: message" + nl + "id: e1" + nl + "data: " + text[:half] + nl + "data: " + text[half:] + nl + nl
        self._send(h, 200, "text/event-stream", out.encode(), headers)

    def _handle(self, h, msg):
        b = self.b
        if not isinstance(msg, dict):
            self._send(h, 400, "application/json", b'{"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error"}}')
            return
        method, mid = msg.get("method"), msg.get("id")
        sid = h.headers.get("Mcp-Session-Id")
        if method == "initialize":
            new_sid = b.session_id if b.session_id is not None else uuid.uuid4().hex
            if not b.stateless:
                with self.lock:
                    self.sessions.add(new_sid)
            version = b.protocol_version or msg["params"]["protocolVersion"]
            result = {"protocolVersion": version, "capabilities": b.capabilities,
                      "serverInfo": {"name": "fake", "version": "1"}}
            self._reply(h, {"jsonrpc": "2.0", "id": mid, "result": result},
                        None if b.stateless else {"Mcp-Session-Id": new_sid})
            return
        if not b.stateless:
            with self.lock:
                known = sid in self.sessions
            if not known:
                # transports, "Session Management" item 3: an ended session is 404
                self._send(h, 404 if sid else 400, "application/json",
                           b'{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"}}')
                return
        if method == "notifications/initialized":
            self._send(h, 202)
            return
        if method == "tools/list":
            cursor = int((msg.get("params") or {}).get("cursor") or 0)
            size = b.page_size or max(len(b.tools), 1)
            page = b.tools[cursor:cursor + size]
            result = {"tools": page}
            if b.endless_pages or cursor + size < len(b.tools):
                result["nextCursor"] = str(cursor + size)
            self._reply(h, {"jsonrpc": "2.0", "id": mid, "result": result})
            return
        if method == "tools/call":
            params = msg.get("params") or {}
            out = b.call(params.get("name"), params.get("arguments")) if b.call else ("error", -32601, "no tools")
            if out[0] == "result":
                self._reply(h, {"jsonrpc": "2.0", "id": mid, "result": out[1]})
            elif out[0] == "error":
                self._reply(h, {"jsonrpc": "2.0", "id": mid, "error": {"code": out[1], "message": out[2]}})
            else:
                self._send(h, out[1], out[2], out[3])
            return
        self._reply(h, {"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "Method not found"}})


def tool(name, **extra):
    t = {"name": name, "description": "the %s tool" % name, "inputSchema": {"type": "object"}}
    t.update(extra)
    return t
