#!/usr/bin/python3
"""files.read / write / list beneath a target's root (issue 5), through the real
broker in JSON and msgpack: round trips, every refusal with its exact code and
message, containment (traversal, absolute, NUL, backslash, "." segments,
symlinks, hard links, /proc links), tenants, caps, the worker pool keeping the
loop responsive, a kernel without openat2, and SIGKILL during writes."""

import base64
import hashlib
import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sbtest  # noqa: E402
from sbtest import MISSING  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ENCODINGS = ("json", "msgpack")
ALL = {"files": {"read": ["**"], "write": ["**"]}}

# reasons, byte for byte (broker/call/path.h, broker/svc/files/files_path.h, files_fs.h, broker/authz/check.c)
UNSAFE = "files path is missing or unsafe"
SEGMENT = 'files path has an empty or "." segment'
RESERVED = "files path names a reserved temporary file"
SCOPE = "files root scope value is missing or unsafe"
SYMLINK = "files path crosses a symbolic link"
ESCAPE = "files path escapes the root"
NOTREG = "files path is not a regular file"
HARDLINK = "files path is a file with more than one hard link"
NOENT = "files path does not exist"
NOTDIR = "files path has a file where a directory is expected"
NAMELONG = "files path has a name longer than the filesystem allows"
LIST_NOTDIR = "files.list path is not a directory"
NO_OPENAT2 = "files needs openat2 (Linux 5.6 or later) and this kernel has none"
NOT_READ_SCOPE = "files.read path is not in the read scope"
NOT_WRITE_SCOPE = "files.write path is not in the write scope"
NOT_LIST_SCOPE = "files.list path is not in the read scope"
BOTH_CONTENT = "files.write takes content or contentBase64, exactly one"
BAD_B64 = "files.write contentBase64 must be a base64 string"


def files_config(base, **files):
    conf = {"root": os.path.join(base, "{tenantId}")}
    conf.update(files)
    # per-run quotas well above what the crash and load tests send: they test the files pool, not the quotas
    return {"targets": {"app": {"files": conf}}, "quota_calls": 1000000, "quota_concurrent": 1024}


def content_of(resp, enc):
    """The bytes of a files.read reply, checking the key for the encoding."""
    v = resp.body["value"]
    if enc == "json":
        assert "content" not in v, v
        return base64.b64decode(v["contentBase64"], validate=True)
    assert "contentBase64" not in v, v
    assert isinstance(v["content"], bytes), v
    return v["content"]


class FilesCase(sbtest.BrokerTestCase):
    """One broker over a scratch base directory holding tenants t1 and t2."""

    files_conf = {}
    threads = "2"

    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="sbfiles-")
        cls.outside = tempfile.mkdtemp(prefix="sbfiles-outside-")
        for t in ("t1", "t2"):
            os.mkdir(os.path.join(cls.base, t))
        try:
            cls.b = sbtest.Broker(config=files_config(cls.base, **cls.files_conf),
                                  env={"SANDBOX_BROKER_THREADS": cls.threads}).start()
        except Exception:
            shutil.rmtree(cls.base, ignore_errors=True)
            shutil.rmtree(cls.outside, ignore_errors=True)
            raise
        cls.tok = cls.b.mint_ok("run-t1", ALL, target="app", scope={"tenantId": "t1"})

    @classmethod
    def tearDownClass(cls):
        rc = cls.b.stop()
        log = cls.b.log()
        shutil.rmtree(cls.base, ignore_errors=True)
        shutil.rmtree(cls.outside, ignore_errors=True)
        if rc != 0:
            raise AssertionError("broker exited with %s:\n%s" % (rc, log[-4000:]))

    def t1(self, *parts):
        return os.path.join(self.base, "t1", *parts)

    def put(self, rel, data, tenant="t1"):
        p = os.path.join(self.base, tenant, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        return p

    def disk(self, rel, tenant="t1"):
        with open(os.path.join(self.base, tenant, rel), "rb") as f:
            return f.read()

    def call(self, method, args=MISSING, enc="json", token=None):
        return self.b.rpc(token or self.tok, method, args, enc=enc)

    def ok_value(self, resp, enc=None):
        self.assertEqual(resp.status, 200, resp)
        self.assertIs(resp.body.get("ok"), True, resp)
        if enc is not None:
            self.assertEqual(resp.headers.get("content-type"), sbtest.content_type_of(enc), resp)
        return resp.body["value"]

    def write(self, path, data, enc="json", token=None):
        if enc == "json":
            args = {"path": path, "contentBase64": base64.b64encode(data).decode()}
        else:
            args = {"path": path, "content": data}
        return self.call("files.write", args, enc, token)


class RoundTrips(FilesCase):
    def test_text_json(self):
        v = self.ok_value(self.call("files.write", {"path": "notes/hello.txt", "content": "héllo\n"}), "json")
        self.assertEqual(v, {"path": "notes/hello.txt", "size": 7})
        self.assertEqual(self.disk("notes/hello.txt"), "héllo\n".encode())
        r = self.call("files.read", {"path": "notes/hello.txt"})
        v = self.ok_value(r, "json")
        self.assertEqual(set(v), {"path", "size", "mimeType", "contentBase64"})
        self.assertEqual((v["path"], v["size"], v["mimeType"]), ("notes/hello.txt", 7, "text/plain"))
        self.assertEqual(content_of(r, "json"), "héllo\n".encode())

    def test_binary_both_encodings(self):
        blob = bytes(range(256)) * 40 + b"\x00\x00end\x00"
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                path = "bin/%s.dat" % enc
                v = self.ok_value(self.write(path, blob, enc), enc)
                self.assertEqual(v, {"path": path, "size": len(blob)})
                self.assertEqual(self.disk(path), blob)
                for renc in ENCODINGS:
                    r = self.call("files.read", {"path": path}, renc)
                    v = self.ok_value(r, renc)
                    self.assertEqual(set(v), {"path", "size", "mimeType", "content" if renc == "msgpack" else "contentBase64"})
                    self.assertEqual((v["size"], v["mimeType"]), (len(blob), "application/octet-stream"))
                    self.assertEqual(content_of(r, renc), blob)

    def test_msgpack_str_content_and_json_text_with_nul(self):
        self.ok_value(self.call("files.write", {"path": "s.md", "content": "# title"}, "msgpack"))
        self.assertEqual(self.disk("s.md"), b"# title")
        r = self.call("files.read", {"path": "s.md"}, "msgpack")
        self.assertEqual(self.ok_value(r)["mimeType"], "text/markdown")
        self.ok_value(self.call("files.write", {"path": "nul.txt", "content": "a\u0000b"}))
        self.assertEqual(self.disk("nul.txt"), b"a\x00b")

    def test_empty_file(self):
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                self.assertEqual(self.ok_value(self.write("empty-%s" % enc, b"", enc))["size"], 0)
                r = self.call("files.read", {"path": "empty-%s" % enc}, enc)
                self.assertEqual(content_of(r, enc), b"")
        self.ok_value(self.call("files.write", {"path": "empty-text", "content": ""}))
        self.assertEqual(self.disk("empty-text"), b"")

    def test_overwrite_and_parents(self):
        self.ok_value(self.write("deep/er/est/f.json", b"{}"))
        self.ok_value(self.write("deep/er/est/f.json", b'{"a":1}'))
        self.assertEqual(self.disk("deep/er/est/f.json"), b'{"a":1}')
        self.assertEqual(self.ok_value(self.call("files.read", {"path": "deep/er/est/f.json"}))["mimeType"],
                         "application/json")
        # created 0640 (the broker runs with umask 022 or tighter here), never world-readable
        self.assertEqual(stat.S_IMODE(os.stat(self.t1("deep/er/est/f.json")).st_mode) & 0o707, 0o600)

    def test_default_read_cap_fits_the_response_cap(self):
        # 512 KiB, the default max_read_bytes, still fits the native response cap as base64 in JSON
        big = os.urandom(512 * 1024)
        self.put("big/at-cap.bin", big)
        self.put("big/over-cap.bin", big + b"x")
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                self.assertEqual(content_of(self.call("files.read", {"path": "big/at-cap.bin"}, enc), enc), big)
                self.assertError(self.call("files.read", {"path": "big/over-cap.bin"}, enc), 400, "bad_args",
                                 "files.read file exceeds 524288-byte cap", enc=enc)

    def test_leading_dot_slash_and_double_slash(self):
        self.ok_value(self.write("./norm//x.txt", b"n"))
        self.assertEqual(self.disk("norm/x.txt"), b"n")
        self.assertEqual(self.ok_value(self.call("files.read", {"path": "norm///x.txt"}))["path"], "norm/x.txt")

    def test_upstream_extra_args_are_ignored(self):
        # upstream's files.write takes title, mime_type and scope; a guest's scope never picks the tenant
        args = {"path": "extra.txt", "content": "mine", "title": "T", "mime_type": "text/plain", "scope": {"tenantId": "t2"}}
        self.ok_value(self.call("files.write", args))
        self.assertEqual(self.disk("extra.txt"), b"mine")
        self.assertFalse(os.path.exists(os.path.join(self.base, "t2", "extra.txt")))
        r = self.call("files.read", {"path": "extra.txt", "scope": {"tenantId": "t2"}})
        self.assertEqual(content_of(r, "json"), b"mine")

    def test_list(self):
        self.put("L/a.txt", b"aaa")
        self.put("L/b.bin", b"b")
        os.makedirs(self.t1("L/sub/inner"), exist_ok=True)
        self.put("L/.sb-tmp-0123456789abcdef", b"half a fi")
        os.symlink("a.txt", self.t1("L/link"))
        os.mkfifo(self.t1("L/fifo"))
        os.link(self.t1("L/b.bin"), self.t1("L/b-again.bin"))
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                v = self.ok_value(self.call("files.list", {"path": "L"}, enc), enc)
                # sorted; files with one link and directories only; never a temporary
                self.assertEqual(v, {"entries": [{"path": "L/a.txt", "type": "file", "size": 3},
                                                 {"path": "L/sub", "type": "dir", "size": 0}],
                                     "truncated": False})
        v = self.ok_value(self.call("files.list", {"path": "L/sub"}))
        self.assertEqual(v["entries"], [{"path": "L/sub/inner", "type": "dir", "size": 0}])
        for args in ({}, {"path": None}, MISSING):
            with self.subTest(args=args):
                v = self.ok_value(self.call("files.list", args))
                self.assertIn({"path": "L", "type": "dir", "size": 0}, v["entries"])
                self.assertTrue(all("/" not in e["path"] for e in v["entries"]), v)

    def test_list_refusals(self):
        self.put("plain.txt", b"x")
        self.assertError(self.call("files.list", {"path": "plain.txt"}), 400, "bad_args", LIST_NOTDIR)
        self.assertError(self.call("files.list", {"path": "nowhere"}), 400, "bad_args", NOENT)
        self.assertError(self.call("files.list", {"path": "nowhere/"}), 403, "forbidden", SEGMENT)
        self.assertError(self.call("files.list", {"path": "."}), 403, "forbidden", SEGMENT)
        self.assertError(self.call("files.list", {"path": 7}), 403, "forbidden", UNSAFE)
        self.assertError(self.call("files.list", ["x"]), 400, "bad_args", "files.list args must be an object")
        self.assertError(self.call("files.list", {"dir": "x"}), 400, "bad_args", "files.list args has an unknown key")


class Refusals(FilesCase):
    def test_path_shapes(self):
        cases = [
            # (method, path, status, code, message)
            ("files.read", "../x", 403, "forbidden", UNSAFE),
            ("files.read", "a/../../x", 403, "forbidden", UNSAFE),
            ("files.read", "a/..", 403, "forbidden", UNSAFE),
            ("files.read", "/etc/passwd", 403, "forbidden", UNSAFE),
            ("files.read", "a\u0000b", 403, "forbidden", UNSAFE),
            ("files.read", "a\\b", 403, "forbidden", UNSAFE),
            ("files.read", "", 403, "forbidden", UNSAFE),
            ("files.read", "a/./b", 403, "forbidden", SEGMENT),
            ("files.read", ".", 403, "forbidden", SEGMENT),
            ("files.read", "a/.", 403, "forbidden", SEGMENT),
            ("files.read", "dir/", 403, "forbidden", SEGMENT),
            ("files.read", "././a", 403, "forbidden", SEGMENT),
            ("files.read", ".sb-tmp-0123456789abcdef", 403, "forbidden", RESERVED),
            ("files.read", "x/.sb-tmp-1/y", 403, "forbidden", RESERVED),
            ("files.write", "../x", 403, "forbidden", UNSAFE),
            ("files.write", "a/../../x", 403, "forbidden", UNSAFE),
            ("files.write", "/tmp/x", 403, "forbidden", UNSAFE),
            ("files.write", "a\u0000b", 403, "forbidden", UNSAFE),
            ("files.write", "a\\b", 403, "forbidden", UNSAFE),
            ("files.write", "a/./b", 403, "forbidden", SEGMENT),
            ("files.write", "dir/", 403, "forbidden", SEGMENT),
            ("files.write", ".sb-tmp-0123456789abcdef", 403, "forbidden", RESERVED),
            ("files.list", "../", 403, "forbidden", UNSAFE),
            ("files.list", "a/./b", 403, "forbidden", SEGMENT),
        ]
        for enc in ENCODINGS:
            for method, path, status, code, message in cases:
                with self.subTest(enc=enc, method=method, path=path):
                    args = {"path": path}
                    if method == "files.write":
                        args["content"] = "x"
                    self.assertError(self.call(method, args, enc), status, code, message, enc=enc)
        # nothing was created anywhere by all of that ("../x" and "a/../../x" would land beside the tenants)
        self.assertEqual(sorted(os.listdir(self.base)), ["t1", "t2"])
        self.assertEqual([n for n in os.listdir(self.t1()) if n in ("x", "a", "dir", "b")], [])

    def test_write_args(self):
        cases = [
            ({"path": "w.txt"}, BOTH_CONTENT),
            ({"path": "w.txt", "content": None}, BOTH_CONTENT),
            ({"path": "w.txt", "content": "a", "contentBase64": "YQ=="}, BOTH_CONTENT),
            ({"path": "w.txt", "content": 5}, "files.write content must be a string or bin"),
            ({"path": "w.txt", "content": ["a"]}, "files.write content must be a string or bin"),
            ({"path": "w.txt", "contentBase64": 5}, BAD_B64),
            ({"path": "w.txt", "contentBase64": "YQ"}, BAD_B64),
            ({"path": "w.txt", "contentBase64": "Y Q=="}, BAD_B64),
            ({"path": "w.txt", "contentBase64": "YR=="}, BAD_B64),
            ({"path": "w.txt", "content": "a", "mode": 511}, "files.write args has an unknown key"),
        ]
        for enc in ENCODINGS:
            for args, message in cases:
                with self.subTest(enc=enc, args=args):
                    self.assertError(self.call("files.write", args, enc), 400, "bad_args", message, enc=enc)
        self.assertFalse(os.path.exists(self.t1("w.txt")))
        self.assertError(self.call("files.read", {"path": "w.txt", "offset": 1}), 400, "bad_args",
                         "files.read args has an unknown key")

    def test_missing_and_wrong_types(self):
        self.assertError(self.call("files.read", {"path": "nope.txt"}), 400, "bad_args", NOENT)
        os.makedirs(self.t1("adir"), exist_ok=True)
        self.assertError(self.call("files.read", {"path": "adir"}), 403, "forbidden", NOTREG)
        self.assertError(self.call("files.write", {"path": "adir", "content": "x"}), 403, "forbidden", NOTREG)
        self.put("afile", b"f")
        self.assertError(self.call("files.write", {"path": "afile/x", "content": "x"}), 400, "bad_args", NOTDIR)
        self.assertError(self.call("files.read", {"path": "afile/x"}), 400, "bad_args", NOTDIR)
        long = "n" * 300
        self.assertError(self.call("files.read", {"path": long}), 400, "bad_args", NAMELONG)
        self.assertError(self.call("files.write", {"path": long, "content": "x"}), 400, "bad_args", NAMELONG)
        self.assertError(self.call("files.write", {"path": long + "/x", "content": "x"}), 400, "bad_args", NAMELONG)
        self.assertError(self.call("files.write", {"path": "/".join(["d"] * 33) + "/f", "content": "x"}), 400, "bad_args",
                         "files.write path is deeper than 32 directories")
        self.assertFalse(os.path.exists(self.t1("d")))
        self.ok_value(self.call("files.write", {"path": "/".join(["e"] * 32) + "/f", "content": "x"}))
        os.mkfifo(self.t1("pipe"))
        t0 = time.monotonic()
        self.assertError(self.call("files.read", {"path": "pipe"}), 403, "forbidden", NOTREG)
        self.assertLess(time.monotonic() - t0, 5.0)
        self.assertEqual([n for n in os.listdir(self.t1()) if n.startswith(".sb-tmp-")], [])

    def test_symlink_to_outside(self):
        secret = os.path.join(self.outside, "secret.txt")
        with open(secret, "wb") as f:
            f.write(b"top secret")
        os.symlink(secret, self.t1("s-out"))
        os.symlink("/etc/passwd", self.t1("s-passwd"))
        self.put("inside.txt", b"in")
        os.symlink("inside.txt", self.t1("s-in"))
        for enc in ENCODINGS:
            for name in ("s-out", "s-passwd", "s-in"):
                with self.subTest(enc=enc, name=name):
                    self.assertError(self.call("files.read", {"path": name}, enc), 403, "forbidden", SYMLINK, enc=enc)
        # replacing a symlink is refused too, and the target is untouched
        self.assertError(self.call("files.write", {"path": "s-out", "content": "pwned"}), 403, "forbidden", NOTREG)
        with open(secret, "rb") as f:
            self.assertEqual(f.read(), b"top secret")
        self.assertTrue(os.path.islink(self.t1("s-out")))

    def test_symlinked_directory(self):
        os.makedirs(os.path.join(self.outside, "d"), exist_ok=True)
        with open(os.path.join(self.outside, "d", "secret.txt"), "wb") as f:
            f.write(b"secret")
        os.symlink(os.path.join(self.outside, "d"), self.t1("sd"))
        os.makedirs(self.t1("real"), exist_ok=True)
        os.symlink("real", self.t1("sd-in"))
        self.assertError(self.call("files.read", {"path": "sd/secret.txt"}), 403, "forbidden", SYMLINK)
        self.assertError(self.call("files.write", {"path": "sd/new.txt", "content": "x"}), 403, "forbidden", SYMLINK)
        self.assertError(self.call("files.write", {"path": "sd/sub/new.txt", "content": "x"}), 403, "forbidden", SYMLINK)
        self.assertError(self.call("files.write", {"path": "sd-in/new.txt", "content": "x"}), 403, "forbidden", SYMLINK)
        self.assertError(self.call("files.list", {"path": "sd"}), 403, "forbidden", SYMLINK)
        self.assertEqual(sorted(os.listdir(os.path.join(self.outside, "d"))), ["secret.txt"])
        self.assertEqual(os.listdir(self.t1("real")), [])
        names = [e["path"] for e in self.ok_value(self.call("files.list", {}))["entries"]]
        self.assertNotIn("sd", names)
        self.assertNotIn("sd-in", names)

    def test_hard_link_to_outside(self):
        secret = os.path.join(self.outside, "hard.txt")
        with open(secret, "wb") as f:
            f.write(b"hard secret")
        os.link(secret, self.t1("hl.txt"))
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                self.assertError(self.call("files.read", {"path": "hl.txt"}, enc), 403, "forbidden", HARDLINK, enc=enc)
                self.assertError(self.call("files.write", {"path": "hl.txt", "content": "x"}, enc), 403, "forbidden",
                                 HARDLINK, enc=enc)
        with open(secret, "rb") as f:
            self.assertEqual(f.read(), b"hard secret")
        self.assertEqual(os.stat(secret).st_nlink, 2)
        self.assertNotIn("hl.txt", [e["path"] for e in self.ok_value(self.call("files.list", {}))["entries"]])

    def test_proc_links(self):
        # /proc-style magic links and the links leading to them are never followed
        os.symlink("/proc/self/root", self.t1("p-root"))
        os.symlink("/proc/self/fd", self.t1("p-fd"))
        os.symlink("/proc/self/cwd", self.t1("p-cwd"))
        for path in ("p-root/etc/passwd", "p-fd/0", "p-cwd", "p-root"):
            with self.subTest(path=path):
                self.assertError(self.call("files.read", {"path": path}), 403, "forbidden", SYMLINK)
        self.assertError(self.call("files.write", {"path": "p-root/tmp/owned", "content": "x"}), 403, "forbidden", SYMLINK)
        self.assertFalse(os.path.exists("/tmp/owned"))

    def test_mounts_inside_the_root(self):
        # a procfs (or any mount) the host left inside a root is not entered (RESOLVE_NO_XDEV): without that,
        # procfs/<pid>/environ would hand out the broker's environment, admin secret included
        mnt = self.t1("procfs")
        os.makedirs(mnt, exist_ok=True)
        if subprocess.run(["mount", "-t", "proc", "proc", mnt], stderr=subprocess.DEVNULL).returncode != 0:
            self.skipTest("cannot mount procfs here")
        try:
            pid = str(self.b.proc.pid)
            for path in ("procfs/%s/environ" % pid, "procfs/%s/status" % pid, "procfs/%s/root/etc/passwd" % pid,
                         "procfs/%s/fd/0" % pid, "procfs/self/environ", "procfs/version"):
                for enc in ENCODINGS:
                    with self.subTest(path=path, enc=enc):
                        self.assertError(self.call("files.read", {"path": path}, enc), 403, "forbidden", ESCAPE, enc=enc)
            self.assertError(self.call("files.list", {"path": "procfs"}), 403, "forbidden", ESCAPE)
            self.assertError(self.call("files.write", {"path": "procfs/sys/x", "content": "x"}), 403, "forbidden", ESCAPE)
            self.assertNotIn("procfs", [e["path"] for e in self.ok_value(self.call("files.list", {}))["entries"]])
        finally:
            subprocess.run(["umount", mnt])


class Globs(FilesCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.scoped = cls.b.mint_ok("run-globs", {"files": {"read": ["docs/**", "top.txt", "a/**/b"],
                                                           "write": ["docs/*.txt", "out/**"]}},
                                   target="app", scope={"tenantId": "t1"})
        cls.writer = cls.b.mint_ok("run-writer", {"files": {"write": ["**"]}}, target="app", scope={"tenantId": "t1"})
        cls.put(cls, "docs/guide.txt", b"guide")
        cls.put(cls, "docs/sub/deep.txt", b"deep")
        cls.put(cls, "top.txt", b"top")
        cls.put(cls, "other.txt", b"other")
        cls.put(cls, "private/x.txt", b"x")
        cls.put(cls, "a/b", b"ab")
        cls.put(cls, "a/x/b", b"axb")

    def test_edges(self):
        S = self.scoped
        cases = [
            ("files.read", {"path": "docs/guide.txt"}, None),
            ("files.read", {"path": "docs/sub/deep.txt"}, None),
            ("files.read", {"path": "./docs//guide.txt"}, None),
            ("files.read", {"path": "top.txt"}, None),
            ("files.read", {"path": "a/x/b"}, None),
            ("files.read", {"path": "a/b"}, (403, "forbidden", NOT_READ_SCOPE)),  # a/**/b needs a middle segment
            ("files.read", {"path": "docs"}, (403, "forbidden", NOT_READ_SCOPE)),  # dir/** does not match dir
            ("files.read", {"path": "docsx/guide.txt"}, (403, "forbidden", NOT_READ_SCOPE)),
            ("files.read", {"path": "other.txt"}, (403, "forbidden", NOT_READ_SCOPE)),
            ("files.read", {"path": "Top.txt"}, (403, "forbidden", NOT_READ_SCOPE)),
            ("files.read", {"path": "docs/./guide.txt"}, (403, "forbidden", SEGMENT)),  # granted by docs/**, refused here
            ("files.write", {"path": "docs/new.txt", "content": "n"}, None),
            ("files.write", {"path": "docs/sub/new.txt", "content": "n"}, (403, "forbidden", NOT_WRITE_SCOPE)),
            ("files.write", {"path": "docs/new.md", "content": "n"}, (403, "forbidden", NOT_WRITE_SCOPE)),
            ("files.write", {"path": "docs/.txt", "content": "n"}, None),
            ("files.write", {"path": "out/x/y/z.bin", "content": "n"}, None),
            ("files.write", {"path": "out", "content": "n"}, (403, "forbidden", NOT_WRITE_SCOPE)),
            ("files.write", {"path": "top.txt", "content": "n"}, (403, "forbidden", NOT_WRITE_SCOPE)),
            ("files.list", {"path": "private"}, (403, "forbidden", NOT_LIST_SCOPE)),
            ("files.list", {"path": "docs"}, None),
        ]
        for enc in ENCODINGS:
            for method, args, err in cases:
                with self.subTest(enc=enc, method=method, args=args):
                    r = self.call(method, args, enc, token=S)
                    if err is None:
                        self.ok_value(r, enc)
                    else:
                        self.assertError(r, *err, enc=enc)
        self.assertError(self.call("files.read", {"path": "docs/guide.txt"}, token=self.writer), 403, "forbidden",
                         "files.read path is not in the read scope")
        self.assertError(self.call("files.list", {}, token=self.writer), 403, "forbidden",
                         "files.list requires a files.read scope")

    def test_list_is_filtered_by_read_globs(self):
        v = self.ok_value(self.call("files.list", {}, token=self.scoped))
        # docs: a glob lives under it; top.txt matches; a: "a/**/b" lives under it; nothing else
        self.assertEqual([e["path"] for e in v["entries"]], ["a", "docs", "top.txt"])
        v = self.ok_value(self.call("files.list", {"path": "docs"}, token=self.scoped))
        paths = [e["path"] for e in v["entries"]]
        self.assertIn("docs/guide.txt", paths)
        self.assertIn("docs/sub", paths)
        # a/b is not readable (a/**/b needs a middle segment). a/x is hidden too, although a/x/b is readable:
        # the manifest can only say whether a glob matches a path or starts with "<dir>/" (upstream's rule)
        v = self.ok_value(self.call("files.list", {"path": "a"}, token=self.scoped))
        self.assertEqual(v, {"entries": [], "truncated": False})


class Tenants(FilesCase):
    def test_isolation(self):
        t2 = self.b.mint_ok("run-t2", ALL, target="app", scope={"tenantId": "t2"})
        self.ok_value(self.write("shared.txt", b"from t1"))
        self.ok_value(self.write("shared.txt", b"from t2", token=t2))
        self.ok_value(self.write("t2-only.txt", b"t2", token=t2))
        self.assertEqual(content_of(self.call("files.read", {"path": "shared.txt"}), "json"), b"from t1")
        self.assertEqual(content_of(self.call("files.read", {"path": "shared.txt"}, token=t2), "json"), b"from t2")
        self.assertError(self.call("files.read", {"path": "t2-only.txt"}), 400, "bad_args", NOENT)
        names = [e["path"] for e in self.ok_value(self.call("files.list", {}))["entries"]]
        self.assertNotIn("t2-only.txt", names)
        # "../t2/..." never reaches the neighbour
        self.assertError(self.call("files.read", {"path": "../t2/t2-only.txt"}), 403, "forbidden", UNSAFE)

    def test_unsafe_scope_values(self):
        for scope in ({"tenantId": ".."}, {"tenantId": "."}, {"tenantId": "t1/../t2"}, {"tenantId": "a/b"},
                      {"other": "t1"}, None):
            with self.subTest(scope=scope):
                fields = {"target": "app"}
                if scope is not None:
                    fields["scope"] = scope
                tok = self.b.mint_ok("run-bad-scope", ALL, **fields)
                for enc in ENCODINGS:
                    self.assertError(self.call("files.write", {"path": "x.txt", "content": "x"}, enc, token=tok), 403,
                                     "forbidden", SCOPE, enc=enc)
                    self.assertError(self.call("files.read", {"path": "x.txt"}, enc, token=tok), 403, "forbidden", SCOPE,
                                     enc=enc)
                    self.assertError(self.call("files.list", {}, enc, token=tok), 403, "forbidden", SCOPE, enc=enc)
        self.assertEqual(sorted(os.listdir(self.base)), ["t1", "t2"])
        self.assertFalse(os.path.exists(os.path.join(os.path.dirname(self.base), "x.txt")))

    def test_missing_root_is_not_created(self):
        tok = self.b.mint_ok("run-t3", ALL, target="app", scope={"tenantId": "t3"})
        r = self.call("files.write", {"path": "x.txt", "content": "x"}, token=tok)
        self.assertError(r, 500, "execution_error")
        self.assertIn("correlationId", r.body["error"])
        self.assertFalse(os.path.exists(os.path.join(self.base, "t3")))
        cid = r.body["error"]["correlationId"]
        line = sbtest.poll(lambda: [e for e in self.b.events() if e.get("cid") == cid], 5)
        self.assertTrue(line and line[0]["reason"].startswith("files root cannot be opened: "), line)


class Caps(FilesCase):
    files_conf = {"max_read_bytes": 1000, "max_write_bytes": 500, "max_entries": 3}

    def test_write_cap(self):
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                self.assertEqual(self.ok_value(self.write("w500", b"w" * 500, enc))["size"], 500)
                self.assertError(self.write("w501", b"w" * 501, enc), 400, "bad_args",
                                 "files.write content exceeds 500-byte cap", enc=enc)
                self.assertError(self.call("files.write", {"path": "w501", "content": "w" * 501}, enc), 400, "bad_args",
                                 "files.write content exceeds 500-byte cap", enc=enc)
        # base64 that decodes to more than the cap is refused (it is decoded once, bounded by the 64 KiB request)
        self.assertError(self.call("files.write", {"path": "w", "contentBase64": "A" * 4000}), 400, "bad_args",
                         "files.write content exceeds 500-byte cap")
        self.assertError(self.call("files.write", {"path": "w", "contentBase64": "!" * 4000}), 400, "bad_args",
                         "files.write contentBase64 must be a base64 string")
        self.assertFalse(os.path.exists(self.t1("w501")))

    def test_read_cap(self):
        self.put("r1000", b"r" * 1000)
        self.put("r1001", b"r" * 1001)
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                self.assertEqual(content_of(self.call("files.read", {"path": "r1000"}, enc), enc), b"r" * 1000)
                self.assertError(self.call("files.read", {"path": "r1001"}, enc), 400, "bad_args",
                                 "files.read file exceeds 1000-byte cap", enc=enc)

    def test_list_cap(self):
        for i in range(3):
            self.put("three/f%d" % i, b"x")
        for i in range(5):
            self.put("five/f%d" % i, b"x")
        v = self.ok_value(self.call("files.list", {"path": "three"}))
        self.assertEqual((len(v["entries"]), v["truncated"]), (3, False))
        for enc in ENCODINGS:
            v = self.ok_value(self.call("files.list", {"path": "five"}, enc))
            self.assertEqual((len(v["entries"]), v["truncated"]), (3, True))


class Responsiveness(FilesCase):
    threads = "1"

    def test_loop_not_stalled_by_file_io(self):
        """40 writes (each fsync'ed) in flight on a single worker; a call that does no I/O still answers at once."""
        blob = os.urandom(30000)
        results = []
        start = threading.Barrier(41)

        def writer(i):
            start.wait()
            results.append(self.write("busy/f%d.bin" % i, blob, "msgpack").status)

        ts = [threading.Thread(target=writer, args=(i,)) for i in range(40)]
        for t in ts:
            t.start()
        start.wait()
        time.sleep(0.02)
        t0 = time.monotonic()
        self.assertError(self.call("files.read", {"path": "../nothing"}), 403, "forbidden", UNSAFE)
        elapsed = time.monotonic() - t0
        for t in ts:
            t.join()
        self.assertEqual(results, [200] * 40)
        self.assertLess(elapsed, 0.25, "a call without I/O waited %.0f ms behind file writes" % (elapsed * 1000))


class NoOpenat2(sbtest.BrokerTestCase):
    """On a kernel without openat2 every files call fails closed with unavailable."""

    def test_fail_closed(self):
        base = tempfile.mkdtemp(prefix="sbfiles-noo2-")
        os.mkdir(os.path.join(base, "t1"))
        with open(os.path.join(base, "t1", "a.txt"), "wb") as f:
            f.write(b"a")
        wrapper = os.path.join(base, "broker-without-openat2")
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\nexec /usr/bin/python3 %s %s \"$@\"\n" % (os.path.join(HERE, "filesfix_noopenat2.py"),
                                                                      sbtest.BROKER_BIN))
        os.chmod(wrapper, 0o755)
        saved = sbtest.BROKER_BIN
        sbtest.BROKER_BIN = wrapper
        try:
            b = sbtest.Broker(config=files_config(base)).start()
        except Exception:
            shutil.rmtree(base, ignore_errors=True)
            raise
        finally:
            sbtest.BROKER_BIN = saved
        try:
            tok = b.mint_ok("run-noo2", ALL, target="app", scope={"tenantId": "t1"})
            for enc in ENCODINGS:
                with self.subTest(enc=enc):
                    for method, args in (("files.read", {"path": "a.txt"}), ("files.write", {"path": "b.txt", "content": "b"}),
                                         ("files.list", {})):
                        self.assertError(b.rpc(tok, method, args, enc=enc), 503, "unavailable", NO_OPENAT2, enc=enc)
            self.assertEqual(sorted(os.listdir(os.path.join(base, "t1"))), ["a.txt"])
        finally:
            b.stop()
            shutil.rmtree(base, ignore_errors=True)


class CrashDuringWrites(sbtest.BrokerTestCase):
    """SIGKILL while many large files are being replaced: every final name holds one complete content."""

    NFILES = 6
    ROUNDS = 3

    @staticmethod
    def content(i, gen):
        rnd = random.Random(i * 1000003 + gen)
        n = rnd.randrange(20000, 48000)
        head = ("file %d generation %d length %d|" % (i, gen, n)).encode()
        return head + rnd.randbytes(n - len(head))

    def test_sigkill(self):
        base = tempfile.mkdtemp(prefix="sbfiles-crash-")
        os.mkdir(os.path.join(base, "t1"))
        root = os.path.join(base, "t1")
        digests = set()
        lock = threading.Lock()
        problems = []
        try:
            for rnd in range(self.ROUNDS):
                b = sbtest.Broker(config=files_config(base)).start()
                tok = b.mint_ok("run-crash", ALL, target="app", scope={"tenantId": "t1"})
                stop = threading.Event()
                counts = {"written": 0, "read": 0}

                def writer(w):
                    gen = rnd * 1000000 + w * 10000
                    while not stop.is_set():
                        gen += 1
                        i = gen % self.NFILES
                        data = self.content(i, gen)
                        with lock:
                            digests.add(hashlib.sha256(data).hexdigest())
                        try:
                            r = b.rpc(tok, "files.write", {"path": "crash/f%d.bin" % i, "content": data}, enc="msgpack",
                                      timeout=5)
                        except Exception:  # the broker is gone: connection refused, reset, short read
                            return
                        if r.status == 200:
                            counts["written"] += 1
                        elif r.status != 429:
                            problems.append("write answered %r" % (r,))

                def reader():
                    i = 0
                    while not stop.is_set():
                        i += 1
                        try:
                            r = b.rpc(tok, "files.read", {"path": "crash/f%d.bin" % (i % self.NFILES)}, enc="msgpack",
                                      timeout=5)
                        except Exception:  # the broker is gone: connection refused, reset, short read
                            return
                        if r.status == 200:
                            d = hashlib.sha256(r.body["value"]["content"]).hexdigest()
                            with lock:
                                if d not in digests:
                                    problems.append("a reader saw content that was never written whole")
                            counts["read"] += 1
                        elif not (r.status == 400 and r.body["error"]["message"] == NOENT):
                            problems.append("read answered %r" % (r,))

                ts = [threading.Thread(target=writer, args=(w,)) for w in range(4)] + \
                     [threading.Thread(target=reader) for _ in range(2)]
                for t in ts:
                    t.start()
                time.sleep(1.0 + 0.37 * rnd)
                b.proc.kill()  # SIGKILL, mid-write
                b.proc.wait()
                stop.set()
                for t in ts:
                    t.join(10)
                b.stop()  # already dead: only collects the process and its scratch config
                self.assertEqual(problems, [])
                self.assertGreater(counts["written"], 0)
                # every final name holds exactly one complete content; a leftover temporary is only ever a temporary
                finals = 0
                for dirpath, dirnames, filenames in os.walk(root):
                    for name in filenames:
                        p = os.path.join(dirpath, name)
                        if name.startswith(".sb-tmp-"):
                            self.assertRegex(name, r"^\.sb-tmp-[0-9a-f]{16}$")
                            continue
                        with open(p, "rb") as f:
                            d = hashlib.sha256(f.read()).hexdigest()
                        self.assertIn(d, digests, "%s holds a partial or unknown content" % p)
                        finals += 1
                self.assertGreater(finals, 0)
                sys.stderr.write("crash round %d: %d writes, %d reads before SIGKILL, %d files, %d temporaries left\n" % (
                    rnd, counts["written"], counts["read"], finals,
                    sum(1 for n in os.listdir(os.path.join(root, "crash")) if n.startswith(".sb-tmp-"))))
            # a broker started over the debris lists no temporary and reads every file
            b = sbtest.Broker(config=files_config(base)).start()
            try:
                tok = b.mint_ok("run-after", ALL, target="app", scope={"tenantId": "t1"})
                r = b.rpc(tok, "files.list", {"path": "crash"})
                self.assertEqual(r.status, 200, r)
                names = [e["path"] for e in r.body["value"]["entries"]]
                self.assertTrue(names and all(n.startswith("crash/f") for n in names), names)
                for n in names:
                    r = b.rpc(tok, "files.read", {"path": n}, enc="msgpack")
                    self.assertIn(hashlib.sha256(r.body["value"]["content"]).hexdigest(), digests)
            finally:
                self.assertEqual(b.stop(), 0)
        finally:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sbtest.main()
