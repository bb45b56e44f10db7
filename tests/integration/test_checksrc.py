"""scripts/checksrc's allocator rule, run on a scratch repository it has to judge.

Outside proto/mem.c no file calls malloc, calloc, realloc, free, strdup or strndup (STYLE rule 8:
memory comes from sb/mem.h); a library's block goes back through sb_mem_free_foreign. Every folder
is judged now (the script's list of folders still being converted is empty). The scratch tree
holds one file of each kind, and the lint must name exactly the ones that break the rule.
"""

import os
import shutil
import subprocess
import tempfile
import unittest

import sbtest

ROOT = sbtest.SOURCE_DIR

FILES = {
    # refused: one line each
    "broker/obs/raw.c": "void *f(void)\n{\n    return malloc(4);\n}\n",
    "broker/svc/files/rawfree.c": "void g(void *p)\n{\n    free (p);\n}\n",
    "supervisor-shim/dup.c": "char *h(const char *s)\n{\n    return strdup(s);\n}\n",
    "include/sb/x.h": "#define GROW(p, n) realloc((p), (n))\n",
    "proto/json2.c": "char *k(const char *s)\n{\n    return strndup(s, 3);\n}\n",
    "broker/http/calloc.c": "int *m(void) { return calloc(1, 4); } /* a trailing comment does not excuse it */\n",
    "broker/svc/pg/raw.c": "void *q(void)\n{\n    return malloc(1);\n}\n",
    "broker/store/raw.c": "void r(void *p)\n{\n    free(p);\n}\n",
    "broker/fetch/raw.c": "void *s(void)\n{\n    return calloc(1, 1);\n}\n",
    "broker/svc/fetch/raw.c": "char *t(const char *x)\n{\n    return strdup(x);\n}\n",
    # accepted
    "proto/mem.c": "void *sb_mem_try_alloc(size_t n)\n{\n    return malloc(n);\n}\nvoid sb_mem_free(void *p)\n{\n    free(p);\n}\n",
    "broker/obs/ok.c": ("/*\n * free() and malloc() may be named in a comment\n */\n"
                        "void n(void *p, char *t)\n{\n    sb_mem_free(p);\n    sb_mem_free_foreign(t);\n"
                        "    EVP_MD_CTX_free(p);\n    msgpack_sbuffer_free(p);\n}\n"),
    # not C: not judged
    "broker/notes.txt": "malloc(1)\n",
}

REFUSED = {"broker/obs/raw.c:3", "broker/svc/files/rawfree.c:3", "supervisor-shim/dup.c:3", "include/sb/x.h:1",
           "proto/json2.c:3", "broker/http/calloc.c:1", "broker/store/raw.c:3", "broker/fetch/raw.c:3",
            "broker/svc/pg/raw.c:3", "broker/svc/fetch/raw.c:3"}


class CheckSrc(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="sb-checksrc-")
        os.makedirs(os.path.join(self.dir, "scripts"))
        for name in ("checksrc", "checkdeps"):
            shutil.copy(os.path.join(ROOT, "scripts", name), os.path.join(self.dir, "scripts", name))
        for path, text in FILES.items():
            full = os.path.join(self.dir, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        subprocess.run(["git", "init", "-q"], cwd=self.dir, check=True)
        subprocess.run(["git", "add", "."], cwd=self.dir, check=True)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def run_lint(self):
        p = subprocess.run([os.path.join(self.dir, "scripts", "checksrc")], cwd=self.dir, capture_output=True, text=True)
        lines = p.stdout.splitlines()
        start = lines.index("checksrc: raw allocator calls (use sb/mem.h):") if \
            "checksrc: raw allocator calls (use sb/mem.h):" in lines else None
        hits = set()
        if start is not None:
            for line in lines[start + 1:]:
                if line.startswith("checksrc:") or line.startswith("checkdeps:"):
                    break
                file, num = line.split(":")[:2]
                hits.add("%s:%s" % (file, num))
        return p.returncode, hits, p.stdout

    def test_names_exactly_the_raw_calls(self):
        rc, hits, out = self.run_lint()
        self.assertEqual(hits, REFUSED, out)
        self.assertEqual(rc, 1, out)

    def test_clean_tree_passes(self):
        for path in sorted(REFUSED):
            file = path.split(":")[0]
            os.unlink(os.path.join(self.dir, file))
            subprocess.run(["git", "rm", "-q", "--cached", file], cwd=self.dir, check=True)
        rc, hits, out = self.run_lint()
        self.assertEqual(hits, set(), out)
        self.assertEqual(rc, 0, out)
        self.assertIn("checksrc: OK", out)


class CheckDeps(unittest.TestCase):
    """scripts/checkdeps: an include cycle between two folders of one component fails the lint and is
    named; a one-way dependency passes. The shim's rooms (jail/, relay/, guest/, serve/) are judged
    as the broker's folders are."""

    def lint(self, files):
        d = tempfile.mkdtemp(prefix="sb-checkdeps-")
        try:
            os.makedirs(os.path.join(d, "scripts"))
            shutil.copy(os.path.join(ROOT, "scripts", "checkdeps"), os.path.join(d, "scripts", "checkdeps"))
            for path, text in files.items():
                full = os.path.join(d, path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "w") as f:
                    f.write(text)
            subprocess.run(["git", "init", "-q"], cwd=d, check=True)
            subprocess.run(["git", "add", "."], cwd=d, check=True)
            p = subprocess.run([os.path.join(d, "scripts", "checkdeps")], cwd=d, capture_output=True, text=True)
            return p.returncode, p.stdout
        finally:
            shutil.rmtree(d)

    def test_shim_cycle_is_refused(self):
        rc, out = self.lint({
            "broker/call/a.h": "#define A 1\n",
            "supervisor-shim/relay/relay.h": '#include "jail/child.h"\n',
            "supervisor-shim/jail/child.h": '#include "relay/relay.h"\n',
        })
        self.assertEqual(rc, 1, out)
        self.assertIn("checkdeps: include cycles between supervisor-shim folders:", out)
        self.assertIn("jail <-> relay", out)
        self.assertIn("jail -> relay  (supervisor-shim/jail/child.h)", out)

    def test_one_way_passes(self):
        rc, out = self.lint({
            "broker/call/a.h": "#define A 1\n",
            "supervisor-shim/relay/relay.h": '#include "jail/child.h"\n',
            "supervisor-shim/jail/child.h": "#define C 1\n",
            "supervisor-shim/shim.c": '#include "relay/relay.h"\n',
        })
        self.assertEqual(rc, 0, out)
        self.assertIn("checkdeps: supervisor-shim OK (2 folders, 1 folder dependencies, no cycle)", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
