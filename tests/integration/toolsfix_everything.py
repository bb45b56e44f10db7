"""The real MCP reference server, @modelcontextprotocol/server-everything, in Streamable HTTP mode.

The package is installed by npm into a prefix (not by the tests):

    npm install --prefix <repo>/.cache/node @modelcontextprotocol/server-everything@2025.11.25

and started here as `node <prefix>/node_modules/@modelcontextprotocol/server-everything/dist/index.js
streamableHttp` with PORT in the environment; it serves the MCP endpoint at /mcp.

Environment:
  SB_NODE_PREFIX  the npm prefix (default <repo>/.cache/node)
  SB_NODE         the node binary (default: node on PATH)

When node or the package is missing, `require()` raises unittest.SkipTest with the install command.

Tool names: releases up to 2025.11.25 (dist/everything.js) call the tools echo, add, printEnv and
longRunningOperation; later ones (dist/tools/) echo, get-sum, get-env and
trigger-long-running-operation. TOOLS maps our roles to the installed names.
"""

import os
import shutil
import socket
import subprocess
import threading
import time
import unittest

import sbtest

PACKAGE = "@modelcontextprotocol/server-everything"
PINNED = "2025.11.25"
PREFIX = os.environ.get("SB_NODE_PREFIX") or os.path.join(sbtest.SOURCE_DIR, ".cache", "node")
PKG_DIR = os.path.join(PREFIX, "node_modules", *PACKAGE.split("/"))
ENTRY = os.path.join(PKG_DIR, "dist", "index.js")
INSTALL_HINT = "npm install --prefix %s %s@%s" % (PREFIX, PACKAGE, PINNED)

OLD_NAMES = {"echo": "echo", "add": "add", "env": "printEnv", "slow": "longRunningOperation"}
NEW_NAMES = {"echo": "echo", "add": "get-sum", "env": "get-env", "slow": "trigger-long-running-operation"}


def node_binary():
    return os.environ.get("SB_NODE") or shutil.which("node")


def require():
    """Raises unittest.SkipTest unless node and the package are installed."""
    if node_binary() is None:
        raise unittest.SkipTest("node is not installed (apt-get install -y nodejs npm); then: " + INSTALL_HINT)
    if not os.path.isfile(ENTRY):
        raise unittest.SkipTest("%s is not installed under %s (set SB_NODE_PREFIX, or run: %s)" % (PACKAGE, PREFIX, INSTALL_HINT))


def tool_names():
    """Our roles -> the tool names of the installed release."""
    if os.path.isfile(os.path.join(PKG_DIR, "dist", "everything.js")):
        return dict(OLD_NAMES)
    return dict(NEW_NAMES)


def installed_version():
    import json
    try:
        with open(os.path.join(PKG_DIR, "package.json")) as f:
            return json.load(f).get("version")
    except (OSError, ValueError):
        return None


class Everything:
    """One server-everything process on a loopback port (kept across restarts)."""

    def __init__(self, port=None):
        self.port = port or sbtest.free_port()
        self.proc = None
        self.lines = []
        self._lock = threading.Lock()

    @property
    def url(self):
        return "http://127.0.0.1:%d/mcp" % self.port

    def start(self, timeout=20.0):
        require()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_BROKER_")}
        env["PORT"] = str(self.port)
        self.proc = subprocess.Popen([node_binary(), ENTRY, "streamableHttp"], env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=PREFIX)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server-everything exited with %s:\n%s" % (self.proc.returncode, self.log()))
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("server-everything did not listen on %d in time:\n%s" % (self.port, self.log()))

    def _read(self, proc):
        for line in iter(proc.stdout.readline, b""):
            with self._lock:
                self.lines.append(line.decode("utf-8", "replace"))
        proc.stdout.close()

    def log(self):
        with self._lock:
            return "".join(self.lines[-50:])

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self):
        """A new process on the same port: every session the old one held is gone."""
        self.stop()
        return self.start()
