"""The documents an operator follows, checked against the binary they describe.

Every SANDBOX_BROKER_* name and every configuration key in docs/config.md, deploy/README.md and
deploy/systemd/environment.example is compared with the binary's own table
(`sandbox-broker --print-config-keys`, generated from the table the loader uses), both ways; the
example files load; the messages, metrics and mint keys the documents quote are the ones the
broker sends, counts and accepts.
"""

import json
import os
import re
import subprocess
import tempfile

import sbtest

ROOT = sbtest.SOURCE_DIR
DOCS = {name: os.path.join(ROOT, name) for name in (
    "docs/config.md", "deploy/README.md", "deploy/systemd/environment.example", "README.md",
    "deploy/docker/compose.yaml", "deploy/docker/Dockerfile", "proto/PROTOCOL.md")}
# the documents quote this misspelling as the example of what is refused
MISSPELT_EXAMPLES = {"SANDBOX_BROKER_TOKENSTORE"}
# upstream's names that `sandbox-shim serve` reads (the broker would refuse them: never in its environment)
SHIM_VARIABLES = {"SANDBOX_BROKER_URL", "SANDBOX_BROKER_ADMIN_URL"}


def read(name):
    with open(DOCS.get(name, os.path.join(ROOT, name))) as f:
        return f.read()


def binary_keys():
    rc, out, err = sbtest.run_broker_once(["--print-config-keys"], sbtest.base_env())
    assert rc == 0, err
    pairs, env_only = {}, set()
    for line in out.splitlines():
        key, env = line.split(" ")
        if key == "-":
            env_only.add(env)
        else:
            pairs[key] = env
    return pairs, env_only


class Docs(sbtest.BrokerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.pairs, cls.env_only = binary_keys()
        cls.names = set(cls.pairs.values()) | cls.env_only

    def test_the_binary_lists_its_keys(self):
        self.assertEqual(self.pairs["token_store"], "SANDBOX_BROKER_TOKEN_STORE")
        self.assertEqual(self.pairs["max_connections"], "SANDBOX_BROKER_MAX_CONNECTIONS")
        self.assertEqual(self.env_only, {"SANDBOX_BROKER_ADMIN_SECRET", "SANDBOX_BROKER_ADMIN_NET_MINT_SECRET"})
        # the same table the loader uses: every listed key is accepted in a file
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump({"log_level": "info", "bogus": 1}, f)
            f.flush()
            rc, out, err = sbtest.run_broker_once(["--check-config", "--offline", "--config", f.name], sbtest.base_env())
        self.assertEqual(rc, 1)
        self.assertIn("bogus: unknown key", err)
        self.assertNotIn("log_level", err)

    def test_every_variable_the_documents_name_exists(self):
        for name in DOCS:
            text = read(name)
            for var in sorted(set(re.findall(r"SANDBOX_BROKER_[A-Za-z0-9_]*[A-Za-z0-9]", text))):
                with self.subTest(doc=name, var=var):
                    if var in MISSPELT_EXAMPLES:
                        self.assertNotIn(var, self.names)
                        quoted = re.search(r"(?s)misspelt[^.]*%s|%s: not a\s+configuration variable" % (var, var), text)
                        self.assertTrue(quoted, "%s names %s, but not as the refused misspelling" % (name, var))
                        continue
                    if var in SHIM_VARIABLES:
                        self.assertNotIn(var, self.names)
                        continue
                    self.assertIn(var, self.names)

    def test_config_md_table_is_the_binary_table(self):
        rows = re.findall(r"^\| `([a-z_]+)` \| [^|]* \| `(SANDBOX_BROKER_[A-Z_]+)` \|", read("docs/config.md"), re.M)
        self.assertEqual(dict(rows), self.pairs)
        self.assertIn("| (secret) | none | `SANDBOX_BROKER_ADMIN_SECRET` |", read("docs/config.md"))

    def test_deploy_readme_table_is_the_binary_table(self):
        text = read("deploy/README.md")
        section = text[text.index("## Environment variables"):text.index("## Minting and revoking tokens")]
        rows = re.findall(r"^\| `(SANDBOX_BROKER_[A-Z_]+)` \| (?:`([a-z_]+)`)?", section, re.M)
        self.assertEqual({v for v, _ in rows}, self.names)
        for var, key in rows:
            with self.subTest(var=var):
                if var in self.env_only:
                    self.assertEqual(key, "")
                else:
                    self.assertEqual(self.pairs.get(key), var)

    def test_environment_example_overrides_nothing_the_example_file_sets(self):
        example = read("deploy/systemd/environment.example")
        active = re.findall(r"^(SANDBOX_BROKER_[A-Z0-9_]+)=", example, re.M)
        commented = re.findall(r"^# (SANDBOX_BROKER_[A-Z0-9_]+)=", example, re.M)
        self.assertTrue(commented, "the examples stay, commented out")
        for var in active + commented:
            self.assertIn(var, self.names)
        with open(os.path.join(ROOT, "deploy", "broker.example.json")) as f:
            file_keys = set(json.load(f))
        # a variable set for a key the JSON file also sets makes edits to the file do nothing
        self.assertEqual([v for v in active if v in {self.pairs[k] for k in file_keys}], [])

    def test_example_configurations_use_known_keys_and_load(self):
        for name in ("deploy/broker.example.json", "deploy/docker/broker.json"):
            with self.subTest(file=name):
                with open(os.path.join(ROOT, name)) as f:
                    self.assertLessEqual(set(json.load(f)), set(self.pairs))
        # the container's file loads offline as it is (broker.example.json is loaded under the
        # systemd unit's sandbox, where its audit directory exists: test_systemd_unit.py)
        rc, out, err = sbtest.run_broker_once(
            ["--check-config", "--offline", "--config", os.path.join(ROOT, "deploy", "docker", "broker.json")],
            sbtest.base_env())
        self.assertEqual(rc, 0, err)

    def test_the_token_store_outage_message_is_the_one_the_broker_sends(self):
        port = sbtest.closed_port()
        env = {"SANDBOX_BROKER_TOKEN_STORE": "redis://127.0.0.1:%d" % port, "SANDBOX_BROKER_STORE_TIMEOUT_MS": "200"}
        with sbtest.Broker(env=env) as b:
            r = b.rpc("0" * 64, "services.a.b")
            self.assertEqual(r.status, 503, r)
            message = r.body["error"]["message"]
        text = read("deploy/README.md")
        m = re.search(r"Every RPC answers `503 unavailable` \(\"([^\"]+)\"\)", text)
        self.assertIsNotNone(m)
        self.assertEqual(m.group(1), message)

    def test_every_metric_the_documents_name_is_exported(self):
        # a memory store (sb_tokens_live) and a target on a database that is down (sb_database_up)
        env = {"SANDBOX_BROKER_DATABASE_URL": "postgresql://sb@127.0.0.1:%d/app" % sbtest.closed_port(),
               "SANDBOX_BROKER_TARGETS": json.dumps({"app": {"document_store": {"table": "document_store"}}})}
        with sbtest.Broker(env=env) as b:
            text = b.admin("GET", "/metrics").raw.decode()
        exported = set(re.findall(r"^# TYPE (sb_[a-z_]+) ", text, re.M))
        for name in ("deploy/README.md", "proto/PROTOCOL.md", "docs/config.md"):
            for metric in set(re.findall(r"\b(sb_[a-z_]+?(?:_total|_seconds|_up|_live|_info))(?:_bucket)?\b", read(name))):
                with self.subTest(doc=name, metric=metric):
                    self.assertIn(metric, exported)

    def test_the_documented_mint_keys_are_accepted(self):
        m = re.search(r"`POST /admin/v1/tokens` with `\{([^}]*)\}`", read("proto/PROTOCOL.md"))
        self.assertIsNotNone(m)
        keys = [k.strip().rstrip("?") for k in m.group(1).split(",")]
        self.assertIn("quotas", keys)
        values = {"capabilities": {"services": ["a"]}, "target": "app", "scope": {"tenantId": "t"}, "ttlMs": 60000,
                  "token": "cd" * 32, "quotas": {"calls": 5, "concurrent": 2, "fetchBytes": 1024}, "secrets": {}}
        with sbtest.Broker(env={"SANDBOX_BROKER_TARGETS": json.dumps({"app": {}})}) as b:
            for k in keys:
                if k == "runId":
                    continue
                with self.subTest(key=k):
                    r = b.mint("run-" + k, **{k: values[k]})
                    self.assertEqual(r.status, 201, r)
            # and the documents say that an unknown key is refused: it is
            self.assertEqual(b.mint("run-x", bogus=1).status, 400)

    def test_readyz_is_documented_with_the_database(self):
        text = read("proto/PROTOCOL.md")
        sentence = text[text.index("`GET /readyz`"):]
        sentence = sentence[:sentence.index("`GET /metrics`")]
        self.assertIn("database", sentence)
        self.assertIn("token store", sentence)

    def test_the_shim_variables_are_the_ones_serve_reads(self):
        p = subprocess.run([os.path.join(sbtest.BIN_DIR, "sandbox-shim"), "serve", "--help"], capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        named = set(re.findall(r"SANDBOX_BROKER_[A-Z_]*[A-Z]", p.stdout))
        self.assertEqual(named, SHIM_VARIABLES)

    def test_the_shim_is_built_and_installed_by_the_deployment_steps(self):
        text = read("deploy/README.md")
        self.assertRegex(text, r"cmake --build build [^\n]*--target sandbox-broker sandbox-shim")
        self.assertIn("sudo install -m 0755 build/bin/sandbox-shim /usr/local/bin/sandbox-shim", text)
        self.assertIn("## The shim", text)
        # the documented target is the one this build made
        self.assertTrue(os.access(os.path.join(sbtest.BIN_DIR, "sandbox-shim"), os.X_OK))


def documented_sub_keys():
    """The nested keys docs/config.md documents: rows of its targets.<name> and egress tables, as paths
    ("files.root", "collections.<n>.table", "egress.dns_tries"), and the keys of its targets example."""
    text = read("docs/config.md")
    targets = text[text.index("## `targets.<name>`"):text.index("## `egress` (http.fetch)")]
    egress = text[text.index("## `egress` (http.fetch)"):text.index("## `decider`")]
    decider = text[text.index("## `decider`"):text.index("## Reloading")]
    rows = set()
    for cell in re.findall(r"^\| (`[^|]*`) \|", targets, re.M):
        names = re.findall(r"`([^`]+)`", cell)
        rows.add(names[0])
        # "`collections.<n>.table` / `key`": a bare name is a sibling of the first
        for other in names[1:]:
            rows.add(other if "." in other else names[0].rsplit(".", 1)[0] + "." + other)
    rows |= {"egress." + k for k in re.findall(r"^\| `([a-z_]+)` \|", egress, re.M) if k != "key"}
    rows |= {"decider." + k for k in re.findall(r"^\| `([a-z_]+)` \|", decider, re.M) if k != "key"}
    rows.discard("key")
    example = json.loads("{" + re.search(r"```json\n(\"targets\".*?)\n```", targets, re.S).group(1) + "}")
    in_example = set()

    def walk(obj, path):
        for k, v in obj.items():
            # named entries (collections, globals) and values that are the operator's own (scope maps, a global's value)
            key = "<n>" if path in ("collections", "globals", "secrets") else k
            p = path + "." + key if path else key
            if isinstance(v, dict) and k not in ("scope", "value"):
                walk(v, p)
            elif "." in p:
                in_example.add(p)

    for target in example["targets"].values():
        walk(target, "")
    return rows, in_example


def loader_sub_keys():
    """The nested keys the loader's own tables accept (broker/svc/target.c, broker/fetch/conf.c)."""
    out = set()
    with open(os.path.join(ROOT, "broker", "svc", "target.c")) as f:
        src = f.read()
    tables = {name: re.findall(r'"([a-z_]+)"', body)
              for name, body in re.findall(r"static const char \*const (\w+)\[\] = \{([^}]*)\}", src)}
    for section, table in (("files", "fknown"), ("tools", "tknown"), ("document_store", "dknown")):
        out |= {section + "." + k for k in tables[table]}
    # target.c's three `known` tables, in order: a collection's, a global's, and a target's sections
    knowns = re.findall(r"static const char \*const known\[\] = \{([^}]*)\}", src)
    assert len(knowns) == 3, knowns
    out |= {"collections.<n>." + k for k in re.findall(r'"([a-z_]+)"', knowns[0])}
    out |= {"globals.<n>." + k for k in re.findall(r'"([a-z_]+)"', knowns[1])}
    # a target secret's keys: the rule keys broker/authz/secrets.c takes, less the mint's own "value"
    with open(os.path.join(ROOT, "broker", "authz", "secrets.c")) as f:
        out |= {"secrets.<n>." + k for k in re.findall(r'strcmp\(key, "([a-z_]+)"\)', f.read()) if k != "value"}
    # the sections themselves are objects: their keys are what is documented
    sections = set(re.findall(r'"([a-z_]+)"', knowns[2]))
    assert {p.split(".")[0] for p in out} == sections, (out, sections)
    with open(os.path.join(ROOT, "broker", "fetch", "conf.c")) as f:
        body = re.search(r"static const char \*known\[\] = \{([^}]*)\}", f.read()).group(1)
    out |= {"egress." + k for k in re.findall(r'"([a-z_]+)"', body)}
    with open(os.path.join(ROOT, "broker", "svc", "decide", "decide.c")) as f:
        out |= {"decider." + k for k in re.findall(r'strcmp\(key, "([a-z_]+)"\) == 0', f.read())}
    return out


class SubKeys(sbtest.BrokerTestCase):
    """Every nested key docs/config.md documents is one the binary takes, and the other way round."""

    def probe(self, path):
        """The binary's --check-config verdict on a configuration holding `path` (with 1 for its value)."""
        parts = path.split(".")
        leaf = {parts[-1]: 1}
        for part in reversed(parts[:-1]):
            leaf = {"n" if part == "<n>" else part: leaf}
        cfg = leaf if parts[0] in ("egress", "decider") else {"targets": {"t": leaf}}
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(cfg, f)
            f.flush()
            rc, out, err = sbtest.run_broker_once(["--check-config", "--offline", "--config", f.name], sbtest.base_env())
        where = ("" if parts[0] in ("egress", "decider") else "targets.t.") + path.replace("<n>", "n")
        return rc, err, where

    def test_every_documented_sub_key_is_accepted(self):
        rows, in_example = documented_sub_keys()
        self.assertIn("files.max_entries", rows)
        self.assertIn("collections.<n>.max_limit", rows)
        self.assertIn("egress.dns_tries", rows)
        self.assertIn("decider.reuse_ms", rows)
        # the example shows nothing the tables leave unexplained
        self.assertLessEqual(in_example, rows)
        for path in sorted(rows):
            with self.subTest(key=path):
                rc, err, where = self.probe(path)
                self.assertNotIn(where + ": unknown key", err)
                # the probe can tell: a misspelling of the same key is refused, named by its path
                rc, err, where = self.probe(path + "x")
                self.assertEqual(rc, 1)
                self.assertIn(where + ": unknown key", err)

    def test_every_sub_key_the_loader_takes_is_documented(self):
        rows, _ = documented_sub_keys()
        loader = loader_sub_keys()
        self.assertIn("tools.concurrency", loader)
        self.assertIn("globals.<n>.row", loader)
        self.assertEqual(sorted(loader - rows), [])


if __name__ == "__main__":
    sbtest.main()
