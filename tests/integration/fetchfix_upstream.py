"""Loopback upstreams for the http.fetch tests: plain and TLS HTTP/1.1 servers that record everything.

Upstream(routes) runs a ThreadingHTTPServer (protocol_version "HTTP/1.1") on 127.0.0.1:<free port> (or
another loopback address and a given port).
It records every accepted TCP connection, every request (request line, method, target, raw header
list in wire order, body bytes) and, for TLS, the SNI name the client sent, the negotiated protocol
version and any handshake failure. A route is a function (handler, record) that answers; the
handler offers reply() for ordinary responses and raw() for hand-made bytes (chunked bodies,
missing Content-Length, oversized heads, slow drips).

TestPki makes a throwaway PKI with the openssl CLI: an EC P-256 CA, a leaf for DNS:tls.test and a
leaf for DNS:other.test signed by it, and a second, untrusted CA signing another tls.test leaf.
"""

import http.server
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import unittest


class Record:
    """One request as the upstream saw it."""

    def __init__(self, conn_id, requestline, method, target, headers, body, sni=None, tls_version=None):
        self.conn_id = conn_id
        self.requestline = requestline
        self.method = method
        self.target = target
        self.headers = headers  # [(name as sent, value), ...] in wire order
        self.body = body
        self.sni = sni
        self.tls_version = tls_version
        self.time = time.monotonic()

    def header_values(self, name):
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def header(self, name):
        vals = self.header_values(name)
        if len(vals) != 1:
            raise AssertionError("expected exactly one %s header, got %r in %r" % (name, vals, self.headers))
        return vals[0]

    def names(self):
        return [k.lower() for k, _ in self.headers]

    def __repr__(self):
        return "Record(%r, headers=%r, body=%r)" % (self.requestline, self.headers, self.body[:64])


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fetchfix"
    sys_version = ""

    def log_message(self, fmt, *args):  # quiet
        pass

    def __getattr__(self, name):
        # every method (GET, POST, PUT, PATCH, DELETE, HEAD, ...) goes to the same dispatcher
        if name.startswith("do_"):
            return self._dispatch
        raise AttributeError(name)

    def _read_body(self):
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            out = b""
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline(65537)
        n = self.headers.get("Content-Length")
        if n is None:
            return b""
        return self.rfile.read(int(n))

    def _dispatch(self):
        up = self.server.upstream
        # a path in unread_body is answered without reading its body (which the server then parses as the next request)
        body = b"" if self.path.split("?")[0] in up.unread_body else self._read_body()
        with up.lock:
            conn, sni, version = up.conn_info.get(self.connection, (None, None, None))
        rec = Record(conn, self.requestline, self.command, self.path, list(self.headers.items()), body,
                     sni=sni, tls_version=version)
        up._record(rec)
        route = up.routes.get(self.path.split("?")[0]) or up.routes.get("*") or default_route
        try:
            route(self, rec)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, socket.timeout, OSError):
            self.close_connection = True

    # --- helpers for routes ---

    def reply(self, status, body=b"", headers=(), reason=None, length=True):
        """A normal response; headers is a list of (name, value) pairs (repeat a name for several)."""
        self.send_response_only(status, reason)
        for k, v in headers:
            self.send_header(k, v)
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()

    def raw(self, data, close=True):
        """Writes bytes as they are; closes the connection afterwards unless close=False."""
        self.wfile.write(data)
        self.wfile.flush()
        if close:
            self.close_connection = True

    def stopping(self):
        return self.server.upstream.stop_event.is_set()


def default_route(h, rec):
    h.reply(200, b"hello", [("Content-Type", "text/plain")])


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def verify_request(self, request, client_address):
        # runs in the accept loop for every TCP connection, before any byte is read
        up = self.upstream
        with up.lock:
            up.connections += 1
            up.conn_info[request] = (up.connections, None, None)
        return True

    def finish_request(self, request, client_address):
        up = self.upstream
        request.settimeout(30)
        if up.tls is not None:
            with up.lock:
                conn_id = up.conn_info.pop(request, (None,))[0]
            fd = request.fileno()
            try:
                tls_sock = up.tls.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError) as e:
                with up.lock:
                    up.handshake_errors.append((up.sni_of.pop(fd, None), repr(e)))
                return
            with up.lock:
                up.conn_info[tls_sock] = (conn_id, up.sni_of.pop(fd, None), tls_sock.version())
                up.resumed.append(tls_sock.session_reused)
            request = tls_sock
        try:
            self.RequestHandlerClass(request, client_address, self)
        finally:
            with up.lock:
                up.conn_info.pop(request, None)
            if up.tls is not None:
                request.close()  # socketserver only shuts down the (detached) plain socket

    def handle_error(self, request, client_address):
        pass  # broken connections are part of the tests; never print tracebacks


class Upstream:
    """A recording HTTP(S) server on 127.0.0.1:<free port>."""

    def __init__(self, routes=None, tls=None, port=0, host="127.0.0.1"):
        self.routes = dict(routes or {})
        self.unread_body = set()  # paths whose request body the server leaves unread (a buggy upstream)
        self.want_port = port
        self.host = host
        self.tls = tls  # an ssl.SSLContext (server side) or None
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.connections = 0
        self.requests = []
        self.snis = []
        self.handshake_errors = []
        self.resumed = []  # per completed TLS handshake: whether the client resumed a session
        self.conn_info = {}  # socket -> (connection number, SNI, TLS version)
        self.sni_of = {}  # fd -> SNI, between the ClientHello and the end of the handshake
        self.server = None
        self.thread = None

    def _on_sni(self, sslobj, name, ctx):
        with self.lock:
            self.snis.append(name)
            try:
                self.sni_of[sslobj.fileno()] = name
            except (AttributeError, OSError):
                pass

    def start(self):
        if self.tls is not None:
            self.tls.sni_callback = self._on_sni
        self.server = _Server((self.host, self.want_port), _Handler)
        self.server.upstream = self
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        return self

    def stop(self):
        self.stop_event.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self.thread is not None:
            self.thread.join(5)
            self.thread = None

    def _record(self, rec):
        with self.lock:
            self.requests.append(rec)

    def reset(self):
        with self.lock:
            self.connections = 0
            self.requests = []
            self.snis = []
            self.handshake_errors = []
            self.resumed = []

    def snapshot(self):
        with self.lock:
            return list(self.requests)

    def route(self, path, fn):
        self.routes[path] = fn
        return fn


# --- TLS material --------------------------------------------------------------------------------------------------


class TestPki:
    """CA + leaves made with the openssl CLI in a temporary directory."""

    def __init__(self):
        self.dir = None

    def _run(self, *args):
        p = subprocess.run(["openssl"] + list(args), cwd=self.dir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        if p.returncode != 0:
            raise RuntimeError("openssl %s failed: %s" % (" ".join(args), p.stderr.decode("utf-8", "replace")))

    def _key(self, name):
        self._run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", name + ".key")
        return os.path.join(self.dir, name + ".key")

    def _ca(self, name, cn):
        key = self._key(name)
        self._run("req", "-x509", "-new", "-key", key, "-sha256", "-days", "2", "-subj", "/CN=" + cn,
                  "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                  "-out", name + ".pem")
        return os.path.join(self.dir, name + ".pem"), key

    def _leaf(self, name, dns, ca):
        key = self._key(name)
        ext = os.path.join(self.dir, name + ".ext")
        with open(ext, "w") as f:
            f.write("subjectAltName=DNS:%s\nbasicConstraints=critical,CA:FALSE\n"
                    "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n" % dns)
        self._run("req", "-new", "-key", key, "-subj", "/CN=" + dns, "-out", name + ".csr")
        self._run("x509", "-req", "-in", name + ".csr", "-CA", ca[0], "-CAkey", ca[1], "-set_serial",
                  str(int.from_bytes(os.urandom(8), "big")), "-days", "2", "-sha256", "-extfile", ext, "-out",
                  name + ".pem")
        return os.path.join(self.dir, name + ".pem"), key

    def make(self):
        if shutil.which("openssl") is None:
            raise unittest.SkipTest("the openssl CLI is not installed")
        self.dir = tempfile.mkdtemp(prefix="sbpki-")
        self.ca = self._ca("ca", "sandbox-broker test CA")
        self.rogue_ca = self._ca("rogue-ca", "untrusted test CA")
        self.tls_leaf = self._leaf("tls", "tls.test", self.ca)
        self.other_leaf = self._leaf("other", "other.test", self.ca)
        self.rogue_leaf = self._leaf("rogue-tls", "tls.test", self.rogue_ca)
        self.ca_file = self.ca[0]
        return self

    def server_context(self, leaf, max_version=None):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(leaf[0], leaf[1])
        if max_version is not None:
            ctx.maximum_version = max_version
        return ctx

    def cleanup(self):
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


class Tripwire:
    """A bare TCP listener that only counts connections: proof that nothing connected to (ip, port)."""

    def __init__(self, ip, port):
        self.ip, self.port = ip, port
        self.connections = 0
        self.sock = None
        self.thread = None
        self._stop = threading.Event()

    def start(self):
        fam = socket.AF_INET6 if ":" in self.ip else socket.AF_INET
        self.sock = socket.socket(fam, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((self.ip, self.port))
        self.port = self.sock.getsockname()[1]
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.connections += 1
            c.close()

    def stop(self):
        self._stop.set()
        if self.thread is not None:
            self.thread.join(5)
        if self.sock is not None:
            self.sock.close()
