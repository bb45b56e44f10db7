"""The audit chain (docs/audit.md): two brokers write one audit file under load, across a SIGUSR1 rotation and a
SIGHUP reload; the clean files verify, and audit-verify names each kind of tampering in copies of them: an edited,
removed, inserted or reordered record, a rewritten stretch, a truncated file, another key. A file size limit makes
the writer lose lines: the chain says so with a gap record, and the metric counts them."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import sbtest


def verify(*args):
    p = subprocess.run([sbtest.BROKER_BIN, "audit-verify"] + list(args), capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def read_lines(path):
    with open(path, "rb") as f:
        return f.read().split(b"\n")[:-1]


def write_lines(path, lines, tail=b"\n"):
    with open(path, "wb") as f:
        f.write(b"\n".join(lines) + (tail if lines else b""))


def rec(line):
    return json.loads(line)


class Chain(sbtest.BrokerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sb-chain-")
        cls.key = os.path.join(cls.dir, "key.pem")
        cls.pub = os.path.join(cls.dir, "pub.pem")
        subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", cls.key], check=True, capture_output=True)
        with open(cls.pub, "w") as f:
            subprocess.run([sbtest.BROKER_BIN, "audit-pubkey", cls.key], check=True, stdout=f)
        cls.other_key = os.path.join(cls.dir, "other.pem")
        cls.other_pub = os.path.join(cls.dir, "other_pub.pem")
        subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", cls.other_key], check=True, capture_output=True)
        with open(cls.other_pub, "w") as f:
            subprocess.run([sbtest.BROKER_BIN, "audit-pubkey", cls.other_key], check=True, stdout=f)

        path = os.path.join(cls.dir, "audit.log")
        env = {"SANDBOX_BROKER_AUDIT": path, "SANDBOX_BROKER_AUDIT_KEY_FILE": cls.key,
               "SANDBOX_BROKER_AUDIT_CHECKPOINT_RECORDS": "7", "SANDBOX_BROKER_LOG_CALLS": "false"}
        a, b = sbtest.Broker(env=env), sbtest.Broker(env=env)
        a.start()
        b.start()
        try:
            tokens = [(br, br.mint_ok("chain-%d" % i, {"services": ["svc"]})) for i, br in enumerate((a, b))]

            def load(n):
                errors = []

                def one(br, tok):
                    for i in range(n):
                        # granted (501) and denied (403) calls, so the records differ
                        st = br.rpc(tok, "services.svc.fn" if i % 3 else "services.other.fn", {"i": i}).status
                        if st not in (501, 403):
                            errors.append(st)
                threads = [threading.Thread(target=one, args=bt) for bt in tokens for _ in range(2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                cls.load_errors = getattr(cls, "load_errors", []) + errors

            load(25)
            # logrotate's way: rename, then SIGUSR1; both instances go on in the new file
            os.rename(path, path + ".1")
            a.proc.send_signal(signal.SIGUSR1)
            b.proc.send_signal(signal.SIGUSR1)
            sbtest.poll(lambda: os.path.exists(path) and sum(1 for l in read_lines(path + ".1")
                                                              if b'"reason":"rotate"' in l) == 2, 10.0)
            load(25)
            a.proc.send_signal(signal.SIGHUP)
            sbtest.poll(lambda: any(e.get("event") == "reload.applied" for e in a.events()), 10.0)
            load(10)
        finally:
            cls.stops = (a.stop(), b.stop())
        cls.files = [path + ".1", path]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def copies(self):
        """A fresh copy of the two files, for one tampering."""
        d = tempfile.mkdtemp(prefix="t-", dir=self.dir)
        out = []
        for f in self.files:
            shutil.copy(f, d)
            out.append(os.path.join(d, os.path.basename(f)))
        return out

    def call_at(self, lines, start=0, inst=None):
        """The index of the first call record at or after start (of instance inst when given) whose next record is of
        the same instance and also a call."""
        for i in range(start, len(lines) - 1):
            r, n = rec(lines[i]), rec(lines[i + 1])
            if r["event"] == "audit" and n["event"] == "audit" and r["inst"] == n["inst"] and (inst is None or r["inst"] == inst):
                return i
        self.fail("no two consecutive calls of one instance")

    def test_clean_files_verify(self):
        self.assertEqual(self.stops, (0, 0))
        self.assertEqual(self.load_errors, [])
        rc, out = verify("--key", self.pub, *self.files)
        self.assertEqual(rc, 0, out)
        self.assertIn("audit-verify: OK:", out)
        recs = [rec(l) for f in self.files for l in read_lines(f)]
        insts = sorted({r["inst"] for r in recs})
        self.assertEqual(len(insts), 2)
        for inst in insts:
            mine = [r for r in recs if r["inst"] == inst]
            # one genesis, seq without a hole, every call audited, the checkpoints where the rules put them
            self.assertEqual(mine[0]["event"], "audit.genesis")
            self.assertEqual([r["seq"] for r in mine], list(range(len(mine))))
            self.assertIn("stream %s: seq 0..%d, %d records" % (inst, len(mine) - 1, len(mine)), out)
            reasons = [r["reason"] for r in mine if r["event"] == "audit.checkpoint"]
            self.assertEqual(reasons[-1], "shutdown")
            self.assertEqual(reasons.count("rotate"), 1)
            self.assertGreaterEqual(reasons.count("reopen"), 1)
            self.assertIn("every", reasons)
            calls = [r for r in mine if r["event"] == "audit"]
            self.assertEqual(len(calls), 2 * (25 + 25 + 10))
        self.assertEqual(sum(1 for r in recs if r.get("reason") == "reload"), 1)
        # the two streams share the files, interleaved as their writers' chunks landed
        turns = sum(1 for x, y in zip(recs, recs[1:]) if x["inst"] != y["inst"])
        self.assertGreaterEqual(turns, 3)
        # the rotation checkpoint is the last record of each stream in the old file: the chain goes on in the new one
        old = [rec(l) for l in read_lines(self.files[0])]
        for inst in insts:
            self.assertEqual([r for r in old if r["inst"] == inst][-1]["reason"], "rotate")
        self.assertIn("closed", out)
        # without --key the genesis's own key is used, and the output says the key was not pinned
        rc, out = verify(*self.files)
        self.assertEqual(rc, 0, out)
        self.assertIn("give --key to pin it", out)

    def test_edited_record_is_named(self):
        f1, f2 = self.copies()
        lines = read_lines(f1)
        i = self.call_at(lines, 5)
        lines[i] = lines[i].replace(b'"status":403', b'"status":200').replace(b'"status":501', b'"status":200')
        write_lines(f1, lines)
        rc, out = verify("--key", self.pub, f1, f2)
        self.assertEqual(rc, 1, out)
        self.assertIn("FAILED: %s:%d: record seq %d of instance %s was edited" % (f1, i + 1, rec(lines[i])["seq"],
                                                                                 rec(lines[i])["inst"]), out)

    def test_removed_record_is_named(self):
        f1, f2 = self.copies()
        lines = read_lines(f2)
        i = self.call_at(lines, 3)
        gone = rec(lines[i])
        # the next record of the same instance is where the hole shows
        j = next(k for k in range(i + 1, len(lines)) if rec(lines[k])["inst"] == gone["inst"])
        del lines[i]
        write_lines(f2, lines)
        rc, out = verify("--key", self.pub, f1, f2)
        self.assertEqual(rc, 1, out)
        self.assertIn("FAILED: %s:%d: records seq %d..%d of instance %s are missing before this one" %
                      (f2, j, gone["seq"], gone["seq"], gone["inst"]), out)
        self.assertIn("removed", out)

    def test_inserted_record_is_named(self):
        """A forged record with a well-formed prefix that chains to the one before it: the record that really
        follows then repeats its seq, and the forged one is named."""
        f1, f2 = self.copies()
        lines = read_lines(f1)
        i = self.call_at(lines, 4)
        r = rec(lines[i])
        forged = ('{"seq":%d,"inst":"%s","prev":"%s","ts":"2026-01-01T00:00:00.000Z","event":"audit","method":"x",'
                  '"decision":"allow"}' % (r["seq"] + 1, r["inst"], hashlib.sha256(lines[i]).hexdigest())).encode()
        lines.insert(i + 1, forged)
        write_lines(f1, lines)
        rc, out = verify("--key", self.pub, f1, f2)
        self.assertEqual(rc, 1, out)
        self.assertIn("FAILED: %s:%d: record seq %d of instance %s was inserted" % (f1, i + 2, r["seq"] + 1, r["inst"]), out)

    def test_inserted_garbage_is_named(self):
        f1, f2 = self.copies()
        lines = read_lines(f2)
        lines.insert(6, b'{"ts":"2026-01-01T00:00:00.000Z","event":"audit","method":"services.svc.fn","decision":"allow"}')
        write_lines(f2, lines)
        rc, out = verify("--key", self.pub, f1, f2)
        self.assertEqual(rc, 1, out)
        self.assertIn("FAILED: %s:7: not an audit chain record (inserted, or edited)" % f2, out)

    def test_reordered_records_are_named(self):
        f1, f2 = self.copies()
        lines = read_lines(f1)
        i = self.call_at(lines, 9)
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
        write_lines(f1, lines)
        rc, out = verify("--key", self.pub, f1, f2)
        self.assertEqual(rc, 1, out)
        first = rec(lines[i])
        self.assertIn("FAILED: %s:%d: record seq %d of instance %s is out of order (reordered): seq %d comes after it, at %s:%d"
                      % (f1, i + 1, first["seq"], first["inst"], first["seq"] - 1, f1, i + 2), out)

    def test_rewritten_stretch_fails_at_the_next_checkpoint(self):
        """Someone without the key edits a record and recomputes every hash after it: the chain is whole again,
        the next checkpoint's signature is not."""
        f1, f2 = self.copies()
        lines = read_lines(f1)
        i = self.call_at(lines, 2)
        inst = rec(lines[i])["inst"]
        lines[i] = lines[i].replace(b'"decision":"deny"', b'"decision":"allow"').replace(b'"code":"', b'"code":"x', 1)
        prev = hashlib.sha256(lines[i]).hexdigest()
        cp = None
        for k in range(i + 1, len(lines)):
            r = rec(lines[k])
            if r["inst"] != inst:
                continue
            lines[k] = lines[k].replace(r["prev"].encode(), prev.encode(), 1)
            prev = hashlib.sha256(lines[k]).hexdigest()
            if r["event"] == "audit.checkpoint":
                cp = (k, r["seq"])
                break
        self.assertIsNotNone(cp)
        write_lines(f1, lines)
        rc, out = verify("--key", self.pub, f1, f2)
        self.assertEqual(rc, 1, out)
        self.assertIn("FAILED: %s:%d: checkpoint seq %d of instance %s: the signature does not match: the records since the "
                      "genesis at %s:" % (f1, cp[0] + 1, cp[1], inst, f1), out)

    def test_truncated_inside_a_record(self):
        f1, f2 = self.copies()
        with open(f2, "rb") as f:
            data = f.read()
        with open(f2, "wb") as f:
            f.write(data[:-40])
        n = data[:-40].count(b"\n") + 1
        rc, out = verify("--key", self.pub, f1, f2)
        self.assertEqual(rc, 1, out)
        self.assertIn("FAILED: %s:%d: the file ends inside a record (truncated)" % (f2, n), out)

    def test_truncated_records_are_named(self):
        """Whole lines cut from the end, the shutdown checkpoints with them: each stream must end with its own."""
        f1, f2 = self.copies()
        lines = read_lines(f2)[:-6]
        write_lines(f2, lines)
        rc, out = verify("--key", self.pub, f1, f2)
        self.assertEqual(rc, 1, out)
        self.assertIn("without its shutdown checkpoint: the records after it were truncated", out)
        # the first stream whose end is gone is named at its last record left
        named = out.split("FAILED: ", 1)[1].split(":")
        self.assertEqual(named[0], f2)
        last = rec(lines[int(named[1]) - 1])
        self.assertEqual(last["inst"], out.split("the stream of instance ", 1)[1][:16])
        self.assertTrue(all(rec(l)["inst"] != last["inst"] for l in lines[int(named[1]):]))
        # --allow-open accepts it (a live broker's file), and says how much is not sealed
        rc, out = verify("--key", self.pub, "--allow-open", f1, f2)
        self.assertEqual(rc, 0, out)
        self.assertIn("not covered by a signature", out)

    def test_each_file_verifies_from_its_reopen_checkpoint(self):
        """Retention drops old files: a rotation starts the new file with a signed "reopen" checkpoint, so the newer
        file verifies on its own (and says where its streams start); without those checkpoints it does not."""
        rc, out = verify("--key", self.pub, self.files[1])
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.count("starts at checkpoint seq"), 2, out)
        f1, f2 = self.copies()
        lines = read_lines(f2)
        firsts = {}
        for i, l in enumerate(lines):
            firsts.setdefault(rec(l)["inst"], i)
        self.assertEqual(sorted(rec(lines[i])["reason"] for i in firsts.values()), ["reopen", "reopen"])
        write_lines(f2, [l for i, l in enumerate(lines) if i not in firsts.values()])
        rc, out = verify("--key", self.pub, f2)
        self.assertEqual(rc, 1, out)
        self.assertIn("FAILED: %s:1: record seq" % f2, out)
        self.assertIn("comes before any genesis or reopen checkpoint of its stream", out)

    def test_head_removed_up_to_a_checkpoint(self):
        """A stream starts at its genesis or at the reopen checkpoint that opens a file: the head of a file cut
        away up to any other checkpoint is a removal, whatever that checkpoint's signature says."""
        f1, _ = self.copies()
        lines = read_lines(f1)
        i, inst = next((i, rec(l)["inst"]) for i, l in enumerate(lines)
                       if rec(l)["event"] == "audit.checkpoint" and rec(l)["reason"] == "every")
        write_lines(f1, [l for l in lines[i:] if rec(l)["inst"] == inst])
        rc, out = verify("--key", self.pub, "--allow-open", f1)
        self.assertEqual(rc, 1, out)
        self.assertIn("FAILED: %s:1: record seq %d of instance %s comes before any genesis or reopen checkpoint of its "
                      "stream: the records before it were removed" % (f1, rec(lines[i])["seq"], inst), out)

    def test_allow_open_is_for_the_last_file_only(self):
        """--allow-open accepts a stream left open where a live broker still writes: the last file given. An
        older file cut after its last checkpoint is a truncation, whatever files follow it."""
        f1, _ = self.copies()
        lines = read_lines(f1)
        write_lines(f1, lines[:-4])
        empty = os.path.join(os.path.dirname(f1), "later.log")
        open(empty, "wb").close()
        rc, out = verify("--key", self.pub, "--allow-open", f1)
        self.assertEqual(rc, 0, out)
        rc, out = verify("--key", self.pub, "--allow-open", f1, empty)
        self.assertEqual(rc, 1, out)
        self.assertIn("FAILED: %s:" % f1, out)
        self.assertIn("without its shutdown checkpoint: the records after it were truncated", out)

    def test_unsigned_report_without_the_genesis(self):
        """Without --key and without the genesis, a stream's signatures cannot be checked: it is said so, never
        reported as unsigned."""
        rc, out = verify(self.files[1])
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.count("signed, but not checked (its genesis is not in the files given: give --key)"), 2, out)
        self.assertNotIn(", unsigned,", out)

    def test_another_key_is_refused(self):
        rc, out = verify("--key", self.other_pub, *self.files)
        self.assertEqual(rc, 1, out)
        self.assertIn("names another key than --key", out)

    def test_usage_and_bad_key(self):
        rc, out = verify()
        self.assertEqual(rc, 2, out)
        self.assertIn("usage: sandbox-broker audit-verify", out)
        rc, out = verify("--key", os.path.join(self.dir, "nope.pem"), self.files[0])
        self.assertEqual(rc, 2, out)
        self.assertIn("No such file or directory", out)


class Keys(sbtest.BrokerTestCase):
    def test_a_bad_key_file_refuses_to_start_and_fails_the_check(self):
        d = tempfile.mkdtemp(prefix="sb-keys-")
        self.addCleanup(shutil.rmtree, d, True)
        ec = os.path.join(d, "ec.pem")
        subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", ec],
                       check=True, capture_output=True)
        junk = os.path.join(d, "junk.pem")
        with open(junk, "w") as f:
            f.write("not a key\n")
        missing = os.path.join(d, "missing.pem")
        cases = [(missing, "audit_key_file: %s: No such file or directory" % missing),
                 (ec, "audit_key_file: %s: not an Ed25519 key (make one with: openssl genpkey -algorithm ed25519)" % ec),
                 (junk, "audit_key_file: %s: not a PEM private key" % junk)]
        for path, msg in cases:
            with self.subTest(key=os.path.basename(path)):
                env = sbtest.base_env({"SANDBOX_BROKER_AUDIT": os.path.join(d, "a.log"), "SANDBOX_BROKER_AUDIT_KEY_FILE": path})
                rc, out, err = sbtest.run_broker_once([], env)
                self.assertEqual(rc, 1, err)
                self.assertIn(msg, err)
                rc, out, err = sbtest.run_broker_once(["--check-config", "--offline"], env)
                self.assertEqual(rc, 1, err)
                self.assertIn(msg, err)
        # audit-pubkey names the same problems, and takes exactly one file
        p = subprocess.run([sbtest.BROKER_BIN, "audit-pubkey", ec], capture_output=True, text=True)
        self.assertEqual((p.returncode, p.stderr.strip()), (1, "audit-pubkey: " + cases[1][1][len("audit_key_file: "):]))
        p = subprocess.run([sbtest.BROKER_BIN, "audit-pubkey"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("usage: sandbox-broker audit-pubkey KEYFILE", p.stderr)


class Gap(sbtest.BrokerTestCase):
    def test_lost_lines_leave_a_gap_record(self):
        """The audit file reaches the process's file size limit: writes fail part-way, the lines are counted, and
        after a rotation the new file starts with a gap record that says how many were lost and that one was torn."""
        d = tempfile.mkdtemp(prefix="sb-gap-")
        self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, "audit.log")
        env = {"SANDBOX_BROKER_AUDIT": path, "SANDBOX_BROKER_LOG_CALLS": "false"}
        with sbtest.Broker(env=env, wrapper=["prlimit", "--fsize=3000", "--"]) as b:
            tok = b.mint_ok("gap-run", {"services": ["svc"]})
            for i in range(30):
                self.assertEqual(b.rpc(tok, "services.svc.fn", {"i": i}).status, 501)
            lost = sbtest.poll(lambda: [int(l.split()[1]) for l in b.admin("GET", "/metrics").raw.decode().splitlines()
                                        if l.startswith("sb_audit_dropped_total ") and int(l.split()[1]) > 0], 5.0)
            self.assertTrue(lost, "no line was lost at the size limit")
            # the limit counts bytes, not lines: the last record that fits is cut short
            with open(path, "rb") as f:
                self.assertFalse(f.read().endswith(b"\n"))
            os.rename(path, path + ".1")
            b.proc.send_signal(signal.SIGUSR1)
            sbtest.poll(lambda: os.path.exists(path) and os.path.getsize(path) > 0, 5.0)
            dropped = int([l for l in b.admin("GET", "/metrics").raw.decode().splitlines()
                           if l.startswith("sb_audit_dropped_total ")][0].split()[1])
            self.assertEqual(b.stop(), 0)
        with open(path, "rb") as f:
            first = f.read().split(b"\n")
        self.assertEqual(first[0], b"")  # the newline that closes the torn record
        self.assertEqual(json.loads(first[1])["reason"], "reopen")
        gap = json.loads(first[2])
        self.assertEqual((gap["event"], gap["lost"], gap["torn"]), ("audit.gap", dropped, True))
        rc, out = verify(path + ".1", path)
        self.assertEqual(rc, 0, out)
        self.assertIn("lost %d records here, one of them torn" % dropped, out)
        # without the file that explains it, the torn record is a truncation
        rc, out = verify(path + ".1")
        self.assertEqual(rc, 1, out)
        self.assertIn("the file ends inside a record (truncated)", out)
        # one torn record is explained by one gap record: lines inserted anywhere before it are not
        forged = os.path.join(d, "forged.1")
        with open(path + ".1", "rb") as f:
            older = f.read().split(b"\n")
        older.insert(3, b'{"ts":"2026-12-01T00:00:00.000Z","event":"audit","runId":"x","decision":"allow"}')
        with open(forged, "wb") as f:
            f.write(b"\n".join(older))
        rc, out = verify(forged, path)
        self.assertEqual(rc, 1, out)
        self.assertIn("FAILED: %s:4: not an audit chain record (inserted, or edited)" % forged, out)


if __name__ == "__main__":
    sbtest.main()
