"""A scripted decider for the tests (PROTOCOL.md section 5a), on loopback.

Decider(port=0).start() listens on 127.0.0.1; every POST is recorded
(path, headers, the parsed JSON body) and answered by `mode`:

  "allow"            200 {"v":1,"decision":"allow"}
  "deny"             200 {"v":1,"decision":"deny","reason": self.reason} (no reason when None)
  "slow"             as "allow", after self.delay seconds
  "never"            reads the request and never answers (until stop())
  ("raw", status, body, headers)  exactly that answer
  ("bytes", data)    those bytes instead of an HTTP response, then the close
  a callable         f(request dict) -> (status, body bytes, headers dict) or None (never answer)

stop() closes the listener and every held connection (a decider that is
down); start() again on the same port is a restart. With `ssl_context` (an
ssl.SSLContext for the server side) it speaks TLS. The test module also
uses it from tests/shim (sys.path).
"""

import json
import socket
import threading
import time


class Decider:
    def __init__(self, port=0, ssl_context=None):
        self.port = port
        self.ssl_context = ssl_context
        self.mode = "allow"
        self.reason = None
        self.delay = 0.0
        self.requests = []
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.sock = None
        self.conns = []
        self.stopping = threading.Event()
        self.thread = None

    @property
    def url(self):
        return "%s://127.0.0.1:%d/decide" % ("https" if self.ssl_context is not None else "http", self.port)

    def start(self):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.port = s.getsockname()[1]
        self.sock = s
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, args=(s, self.stopping), daemon=True)
        self.thread.start()
        return self

    def stop(self):
        self.stopping.set()
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
            self.sock = None
        with self.lock:
            conns, self.conns = self.conns, []
            self.cond.notify_all()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        if self.thread is not None:
            self.thread.join(5)

    def reset(self, mode="allow", reason=None, delay=0.0):
        with self.lock:
            self.mode, self.reason, self.delay = mode, reason, delay
            self.requests = []

    def count(self):
        with self.lock:
            return len(self.requests)

    def wait_requests(self, n, timeout=10.0):
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.requests) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            return list(self.requests)

    # ---- the server ----

    def _accept(self, s, stopping):
        while not stopping.is_set():
            try:
                c, _ = s.accept()
            except OSError:
                return
            with self.lock:
                self.conns.append(c)
            threading.Thread(target=self._serve, args=(c, stopping), daemon=True).start()

    def _read_request(self, c):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = c.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", "0"))
        while len(body) < n:
            chunk = c.recv(65536)
            if not chunk:
                return None
            body += chunk
        try:
            parsed = json.loads(body.decode("utf-8"))
        except ValueError:
            parsed = None
        return {"method": method, "path": path, "headers": headers, "raw": body, "body": parsed}

    def _serve(self, c, stopping):
        try:
            if self.ssl_context is not None:
                try:
                    c = self.ssl_context.wrap_socket(c, server_side=True)
                except (OSError, ValueError):
                    return
            req = self._read_request(c)
            if req is None:
                return
            with self.cond:
                self.requests.append(req)
                mode, reason, delay = self.mode, self.reason, self.delay
                self.cond.notify_all()
            if isinstance(mode, tuple) and mode[0] == "bytes":
                c.sendall(mode[1])
                return
            answer = self._answer(mode, reason, req)
            if mode == "slow":
                if stopping.wait(delay):
                    return
            if answer is None:
                stopping.wait(120)  # never answers; stop() closes the connection
                return
            status, body, headers = answer
            head = "HTTP/1.1 %d X\r\nContent-Length: %d\r\nConnection: close\r\n" % (status, len(body))
            for k, v in (headers or {}).items():
                head += "%s: %s\r\n" % (k, v)
            c.sendall(head.encode() + b"\r\n" + body)
        except OSError:
            pass
        finally:
            with self.lock:
                if c in self.conns:
                    self.conns.remove(c)
            try:
                c.close()
            except OSError:
                pass

    @staticmethod
    def _answer(mode, reason, req):
        ctype = {"Content-Type": "application/json"}
        if callable(mode):
            return mode(req)
        if mode in ("allow", "slow"):
            return 200, b'{"v":1,"decision":"allow"}', ctype
        if mode == "deny":
            o = {"v": 1, "decision": "deny"}
            if reason is not None:
                o["reason"] = reason
            return 200, json.dumps(o).encode(), ctype
        if mode == "never":
            return None
        if isinstance(mode, tuple) and mode[0] == "raw":
            return mode[1], mode[2], mode[3] if len(mode) > 3 else ctype
        raise ValueError("unknown mode %r" % (mode,))
