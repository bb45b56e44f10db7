"""sandbox-shim against an https broker: a Python TLS fake broker and a test PKI made with the openssl CLI.

The token rides in a request header, so it must never leave the shim before OpenSSL has verified the
broker's chain and name. Every refusal case therefore also checks that the fake broker, which did see
the TLS attempt, recorded no request at all.
"""
import sys
sys.dont_write_bytecode = True  # noqa: E402 - keep tests/shim free of __pycache__
import atexit
import os
import shutil
import socket
import ssl
import subprocess
import tempfile

from common import FakeBroker, TOKEN, Tap, check, relay_args, run_shim

if shutil.which("openssl") is None:
    print("1..0 # SKIP the openssl command is needed to make the test PKI")
    sys.exit(77)

tap = Tap()
PKI = tempfile.mkdtemp(prefix="sb-shim-pki-")
atexit.register(shutil.rmtree, PKI, True)


def openssl(*args):
    subprocess.run(["openssl"] + list(args), check=True, capture_output=True, cwd=PKI)


def make_ca(name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-keyout", name + ".key", "-out", name + ".crt", "-subj", "/CN=sandbox-shim test " + name,
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return os.path.join(PKI, name + ".crt")


def make_leaf(name, ca, san, cn="sandbox-shim test leaf"):
    with open(os.path.join(PKI, name + ".ext"), "w") as f:
        f.write("subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
                "keyUsage=critical,digitalSignature\n" % san)
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn)
    openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key", "-set_serial",
            str(int.from_bytes(os.urandom(8), "big")), "-days", "2", "-out", name + ".crt", "-extfile", name + ".ext")
    return os.path.join(PKI, name + ".crt"), os.path.join(PKI, name + ".key")


CA = make_ca("ca")
OTHER_CA = make_ca("other-ca")
GOOD = make_leaf("good", "ca", "DNS:localhost,IP:127.0.0.1")
WRONG_NAME = make_leaf("wrong-name", "ca", "DNS:broker.example.test,IP:192.0.2.7", cn="localhost")
UNTRUSTED = make_leaf("untrusted", "other-ca", "DNS:localhost,IP:127.0.0.1")

# the shim connects to the first address "localhost" resolves to; listen there
LOCALHOST_ADDR = socket.getaddrinfo("localhost", None, type=socket.SOCK_STREAM)[0][4][0]


def server_ctx(cert, lo=None, hi=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*cert)
    if lo is not None:
        ctx.minimum_version = lo
    if hi is not None:
        ctx.maximum_version = hi
    return ctx


def broker(cert, lo=None, hi=None, name="localhost"):
    """A TLS fake broker; its URL names `name` (a DNS name or 127.0.0.1)."""
    fb = FakeBroker(tls=server_ctx(cert, lo, hi), host=LOCALHOST_ADDR if name == "localhost" else name)
    fb.url = "https://%s:%d/api/sandbox/rpc" % (name, fb.port)
    return fb


V12, V13 = ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3


def refused(fb, needle, *flags):
    """A call that must not reach the broker: the run error names `needle`, the broker saw TLS but no request."""
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [[1, "services.echo.x", {"a": 1}]]}, *flags))
    check(rc == 0 and not o["ok"], "the run fails", rc, o, err)
    check(o["error"] == "sandbox broker request failed" and needle in o["detail"], "detail names the TLS problem",
          needle, o)
    check(fb.requests == [], "the broker recorded no request (the token was never sent)", fb.requests)
    # the fake broker records the failed handshake on its own thread: give it a moment to land
    import time
    deadline = time.monotonic() + 3
    while not fb.handshakes and time.monotonic() < deadline:
        time.sleep(0.02)
    check(len(fb.handshakes) >= 1 and not any(h["ok"] for h in fb.handshakes),
          "the broker saw a TLS attempt that failed", fb.handshakes)
    check(TOKEN not in out and TOKEN not in err, "token not printed")
    return o


def t_good_dns_name_tls13():
    fb = broker(GOOD, lo=V13)
    try:
        calls = [[1, "services.echo.x", {"a": [1, 2, "three"]}], [2, "services.echo.y", "x" * 60000],
                 [3, "services.echo.z"]]
        rc, o, out, err = run_shim(relay_args(fb.url, {"calls": calls}, "--ca-file", CA, "--max-inflight", "1"))
        check(rc == 0 and o["ok"], "run ok", o, err)
        rep = o["output"]["replies"]
        check(rep["1"]["value"] == {"a": [1, 2, "three"]} and rep["2"]["value"] == "x" * 60000 and
              rep["3"]["value"] is None, "replies over TLS (one of 60 KB: several records each way)", sorted(rep))
        check(len(fb.requests) == 3, "three requests", len(fb.requests))
        h = {k.lower(): v for k, v in fb.requests[0]["headers"].items()}
        check(h["x-questpie-sandbox-token"] == TOKEN, "token header sent after verification", h)
        check(h["host"] == "localhost:%d" % fb.port, "Host header", h)
        check(len(fb.handshakes) == 1 and fb.handshakes[0]["ok"], "one TLS connection, kept alive and reused",
              fb.handshakes)
        check(fb.handshakes[0]["version"] == "TLSv1.3", "TLS 1.3 negotiated", fb.handshakes)
        check(fb.handshakes[0]["sni"] == "localhost", "SNI is the URL host", fb.handshakes)
    finally:
        fb.close()


def t_good_tls12_concurrent():
    fb = broker(GOOD, hi=V12)
    try:
        calls = [[1, "services.slow.400"], [2, "services.slow.50"], [3, "services.echo.x", 3]]
        rc, o, out, err = run_shim(relay_args(fb.url, {"calls": calls}, "--ca-file", CA))
        check(rc == 0 and o["ok"], "run ok", o, err)
        order = o["output"]["order"]
        check(sorted(order) == [1, 2, 3] and order[-1] == 1, "completion order over concurrent TLS connections", order)
        check(all(h["ok"] and h["version"] == "TLSv1.2" for h in fb.handshakes) and len(fb.handshakes) >= 2,
              "TLS 1.2 negotiated on each connection", fb.handshakes)
    finally:
        fb.close()


def t_good_ip_literal():
    for lo, hi, version in ((V13, None, "TLSv1.3"), (None, V12, "TLSv1.2")):
        fb = broker(GOOD, lo=lo, hi=hi, name="127.0.0.1")
        try:
            rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [[1, "services.echo.x", 1]]}, "--ca-file", CA))
            check(rc == 0 and o["ok"] and o["output"]["replies"]["1"]["value"] == 1, "run ok", version, o, err)
            check(fb.handshakes[0]["sni"] is None, "no SNI for an IP literal (RFC 6066 section 3)", fb.handshakes)
            check(fb.handshakes[0]["version"] == version, "version", version, fb.handshakes)
        finally:
            fb.close()


def t_close_delimited():
    fb = broker(GOOD, lo=V13)
    try:
        rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [[1, "services.closedelim.notify"]]}, "--ca-file", CA))
        check(rc == 0 and o["ok"] and o["output"]["replies"]["1"]["value"] == "cd",
              "a close-delimited body ended by close_notify is complete", o, err)
        rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [[1, "services.closedelim.bare"]]}, "--ca-file", CA))
        check(rc == 0 and not o["ok"] and o["error"] == "sandbox broker request failed" and "TLS read failed" in o["detail"],
              "a bare TCP EOF under TLS may be a truncation: refused", o, err)
    finally:
        fb.close()


def t_untrusted_ca():
    for flags in (["--ca-file", CA], []):  # our test CA, then the system store
        fb = broker(UNTRUSTED)
        try:
            refused(fb, "TLS certificate verification failed: unable to get local issuer certificate", *flags)
        finally:
            fb.close()


def t_wrong_host_name():
    for lo, hi in ((None, V12), (V13, None)):
        fb = broker(WRONG_NAME, lo=lo, hi=hi)
        try:
            refused(fb, "TLS certificate verification failed: hostname mismatch", "--ca-file", CA)
            check(fb.handshakes[0]["sni"] == "localhost", "SNI was the URL host", fb.handshakes)
        finally:
            fb.close()


def t_wrong_ip():
    for lo, hi in ((None, V12), (V13, None)):
        fb = broker(WRONG_NAME, lo=lo, hi=hi, name="127.0.0.1")
        try:
            refused(fb, "TLS certificate verification failed: IP address mismatch", "--ca-file", CA)
        finally:
            fb.close()


def t_refusal_in_reply_mode():
    fb = broker(WRONG_NAME, lo=V13)
    try:
        rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [[1, "services.echo.x"], [2, "services.echo.y"]]},
                                              "--ca-file", CA, "--on-denial", "reply"))
        check(rc == 0 and o["ok"], "reply mode: the guest finishes", o, err)
        for i in ("1", "2"):
            check(o["output"]["replies"][i]["error"] == {"code": "execution_error",
                                                         "message": "sandbox broker request failed"},
                  "the guest sees the stable error, not TLS details", o["output"]["replies"])
        check(fb.requests == [], "nothing reached the broker", fb.requests)
    finally:
        fb.close()


def t_plain_http_server():
    fb = FakeBroker()
    try:
        url = "https://127.0.0.1:%d/api/sandbox/rpc" % fb.port
        rc, o, out, err = run_shim(relay_args(url, {"calls": [[1, "services.echo.x"]]}, "--ca-file", CA))
        check(rc == 0 and not o["ok"] and o["error"] == "sandbox broker request failed" and "TLS handshake failed" in o["detail"], "handshake with a non-TLS server fails",
              o, err)
        check(fb.requests == [], "no request recorded", fb.requests)
    finally:
        fb.close()


def t_usage():
    bad = [
        (["--ca-file", os.path.join(PKI, "nope.crt")], "https://127.0.0.1:1/x", "cannot load CA certificates"),
        (["--ca-file", os.path.join(PKI, "good.ext")], "https://127.0.0.1:1/x", "cannot load CA certificates"),
        (["--ca-file", CA], "http://127.0.0.1:1/x", "--ca-file needs an https:// broker URL"),
    ]
    for flags, url, needle in bad:
        args = ["relay", "--broker-url", url, "--token-env", "SB_TEST_TOKEN"] + flags + ["--", "true"]
        rc, o, out, err = run_shim(args, expect_json=False)
        check(rc == 2 and needle in err and out == "", "usage error: " + needle, rc, out, err)


tap.case("good certificate, DNS name, TLS 1.3: calls, token, SNI, keep-alive", t_good_dns_name_tls13)
tap.case("good certificate, TLS 1.2, concurrent connections", t_good_tls12_concurrent)
tap.case("good certificate, IP-literal URL (TLS 1.2 and 1.3)", t_good_ip_literal)
tap.case("close-delimited bodies need close_notify under TLS", t_close_delimited)
tap.case("untrusted CA is refused before the token is sent", t_untrusted_ca)
tap.case("wrong host name is refused under TLS 1.2 and 1.3", t_wrong_host_name)
tap.case("wrong IP address is refused under TLS 1.2 and 1.3", t_wrong_ip)
tap.case("refusal under --on-denial reply", t_refusal_in_reply_mode)
tap.case("https URL against a plain HTTP server", t_plain_http_server)
tap.case("--ca-file usage errors", t_usage)
tap.done()
