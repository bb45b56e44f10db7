"""Relay mechanics of sandbox-shim against a scripted fake broker and a fake guest."""
import sys
sys.dont_write_bytecode = True  # noqa: E402 - keep tests/shim free of __pycache__
import json
import os
import tempfile
import time

from common import (FakeBroker, TOKEN, Tap, check, closed_port, free_port, relay_args, run_shim)

tap = Tap()
fb = FakeBroker()


def t_echo_and_headers():
    fb.reset()
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [[1, "services.echo.x", {"a": [1, 2, "three"], "b": None}]]},
                                          "--input", '{"hello":"world"}'))
    check(rc == 0 and o["ok"], "run ok", o, err)
    rep = o["output"]["replies"]["1"]
    check(rep == {"t": "reply", "id": 1, "ok": True, "value": {"a": [1, 2, "three"], "b": None}}, "echo reply", rep)
    check(o["output"]["init"] == {"t": "init", "input": {"hello": "world"}}, "init frame", o["output"]["init"])
    check(o["calls"] == 1 and o["logs"] == ["log: fake guest"], "calls and logs", o)
    req = fb.requests[0]
    h = {k.lower(): v for k, v in req["headers"].items()}
    check(req["path"] == "/api/sandbox/rpc", "path", req)
    check(h["x-questpie-sandbox-token"] == TOKEN, "token header", h)
    check(h["content-type"] == "application/msgpack", "content type", h)
    check(req["body"] == {"method": "services.echo.x", "args": {"a": [1, 2, "three"], "b": None}}, "body", req)


def t_token_not_in_child():
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": []}))
    check(rc == 0 and o["ok"], "run ok", o, err)
    env = o["output"]["env"]
    check("SB_TEST_TOKEN" not in env, "token variable removed", sorted(env))
    check(all(TOKEN not in v for v in env.values()), "no env value carries the token")
    check(TOKEN not in json.dumps(o["output"]["argv"]), "argv clean")
    check(TOKEN not in out and TOKEN not in err, "token not printed")


def t_token_fd():
    fb.reset()
    r, w = os.pipe()
    os.write(w, (TOKEN + "\n").encode())
    os.close(w)
    args = relay_args(fb.url, {"calls": [[7, "services.echo.x"]]})
    args[args.index("--token-env"):args.index("--token-env") + 2] = ["--token-fd", str(r)]
    rc, o, out, err = run_shim(args, token_env=False, pass_fds=(r,))
    os.close(r)
    check(rc == 0 and o["ok"], "run ok", o, err)
    check(fb.requests[0]["headers"].get("x-questpie-sandbox-token") == TOKEN, "token from fd used")
    check(fb.requests[0]["body"] == {"method": "services.echo.x"}, "args omitted when absent", fb.requests[0])


def t_normalised_url():
    """The broker URL is called as normalised: one trailing '/' dropped; a query is a usage error."""
    fb.reset()
    base = fb.url
    rc, o, out, err = run_shim(relay_args(base.replace("http://", "HTTP://") + "/", {"calls": [[1, "services.echo.x", 1]]}))
    check(rc == 0 and o["ok"], "run ok", o, err)
    check(fb.requests[0]["path"] == "/api/sandbox/rpc", "normalised target", fb.requests[0]["path"])
    rc, o, out, err = run_shim(relay_args(base + "?", {"calls": [[1, "services.echo.x", 1]]}))
    check(rc == 0 and o["ok"] and fb.requests[1]["path"] == "/api/sandbox/rpc", "an empty query is none", fb.requests[1:])
    # a query on the command line: exit 2, the guest never started, the broker never asked
    marker = os.path.join(tempfile.mkdtemp(prefix="sb-query-"), "started")
    for mode in ("relay", "run"):
        n = len(fb.requests)
        if mode == "relay":
            args = ["relay", "--broker-url", base + "?channel=a%2Fb", "--token-env", "SB_TEST_TOKEN", "--",
                    "/bin/sh", "-c", "touch " + marker]
        else:
            src = os.path.join(os.path.dirname(marker), "guest.ts")
            with open(src, "w") as f:
                f.write("export default () => 1\n")
            args = ["run", "--broker-url", base + "/?x=1", "--token-env", "SB_TEST_TOKEN", "--source", src]
        rc, o, out, err = run_shim(args, expect_json=False)
        check(rc == 2 and "--broker-url must not have a query" in err and out == "", mode + ": query is a usage error",
              rc, out, err)
        check(len(fb.requests) == n and not os.path.exists(marker), mode + ": nothing run, no request", fb.requests[n:])


def t_out_of_order():
    calls = [[1, "services.slow.600"], [2, "services.slow.50"], [3, "services.echo.x", 3]]
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": calls}))
    check(rc == 0 and o["ok"], "run ok", o, err)
    order = o["output"]["order"]
    check(sorted(order) == [1, 2, 3] and order[-1] == 1, "completion order", order)
    check(o["output"]["replies"]["1"]["value"] == 600, "slow value", o["output"]["replies"])


def t_keepalive_and_inflight_limit():
    fb.reset()
    calls = [[i, "services.slow.150"] for i in range(1, 7)]
    t0 = time.monotonic()
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": calls}, "--max-inflight", "2"))
    el = time.monotonic() - t0
    check(rc == 0 and o["ok"], "run ok", o, err)
    check(len(o["output"]["order"]) == 6, "all replies", o["output"]["order"])
    check(fb.max_concurrent <= 2, "at most 2 in flight", fb.max_concurrent)
    check(el >= 0.45, "backpressure serialises the calls", el)
    check(len(fb.peers) <= 2, "connections are kept alive and reused", fb.peers)


def t_broker_down():
    url = "http://127.0.0.1:%d/rpc" % closed_port()
    rc, o, out, err = run_shim(relay_args(url, {"calls": [[1, "services.echo.x"]]}))
    check(rc == 0 and not o["ok"], "run fails", o, err)
    check(o["error"] == "sandbox broker request failed" and "connect" in o["detail"], "error; detail names the failure", o)
    rc, o, out, err = run_shim(relay_args(url, {"calls": [[1, "services.echo.x"]]}, "--on-denial", "reply"))
    check(rc == 0 and o["ok"], "reply mode: guest finishes", o, err)
    rep = o["output"]["replies"]["1"]
    check(rep["ok"] is False and rep["error"] == {"code": "execution_error", "message": "sandbox broker request failed"},
          "guest sees a stable error", rep)


def t_5xx_not_msgpack():
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [[1, "services.err500.x"]]}))
    check(rc == 0 and not o["ok"] and o["error"] == "sandbox broker returned an invalid response" and "HTTP 500" in o["detail"], "5xx error", o)


def t_invalid_success():
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [[1, "services.weird.x"]]}))
    check(rc == 0 and not o["ok"] and o["error"] == "sandbox broker returned an invalid response", "{ok:true} without value is invalid", o)


def t_redirect():
    fb.reset()
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [[1, "services.redirect.x"]]}))
    check(rc == 0 and not o["ok"] and o["error"] == "sandbox broker request failed" and "redirect" in o["detail"] and "302" in o["detail"], "3xx is an error", o)
    check(len(fb.requests) == 1, "redirect not followed", fb.requests)


def t_call_timeout():
    t0 = time.monotonic()
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [[1, "services.hang.x"]]}, "--call-timeout-ms", "300"))
    check(rc == 0 and not o["ok"] and o["error"] == "sandbox broker request failed" and "timed out after 300ms" in o["detail"], "per-call timeout", o)
    check(time.monotonic() - t0 < 5, "did not wait for the broker")


def t_denial_terminate_and_reply():
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [[1, "services.deny.x"]]}))
    check(rc == 0 and not o["ok"], "terminate ends the run", o)
    check(o["error"] == "sandbox binding operation forbidden", "upstream's fixed text", o)
    check(o["detail"] == "binding call services.deny.x failed: forbidden: nope (correlationId abc-1)", "detail", o)
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [[1, "services.deny.x"], [2, "services.echo.x", 2]]},
                                          "--on-denial", "reply"))
    check(rc == 0 and o["ok"], "reply mode continues", o)
    check(o["output"]["replies"]["1"]["error"] == {"code": "forbidden", "message": "nope", "correlationId": "abc-1"},
          "error object handed over", o["output"]["replies"])
    check(o["output"]["replies"]["2"]["value"] == 2, "later call still works")


def t_max_calls():
    calls = [[i, "services.echo.x"] for i in range(1, 11)]
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": calls}, "--max-calls", "3"))
    check(rc == 0 and not o["ok"] and "call limit" in o["error"] and o["calls"] == 3, "max calls", o)


def t_wall_timeout():
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [], "sleep_ms": 5000}, "--timeout-ms", "300"))
    check(rc == 0 and not o["ok"] and o.get("timedOut") is True and "wall-time" in o["error"], "timed out", o)
    check(o["ms"] < 2000, "killed promptly", o)


def t_usage_errors():
    bad = [
        (["relay", "--broker-url", "http://u:p@127.0.0.1:1/x", "--token-env", "SB_TEST_TOKEN", "--", "true"], "userinfo"),
        (["relay", "--broker-url", "http://127.0.0.1:1/x#f", "--token-env", "SB_TEST_TOKEN", "--", "true"], "fragment"),
        (["relay", "--broker-url", "ftp://127.0.0.1/x", "--token-env", "SB_TEST_TOKEN", "--", "true"], "http:// or https://"),
        (["relay", "--broker-url", "http://127.0.0.1:1/x", "--token-env", "SB_TEST_TOKEN", "--ca-file", "/dev/null", "--", "true"], "--ca-file needs an https:// broker URL"),
        (["relay", "--broker-url", "http://127.0.0.1:99999/", "--token-env", "SB_TEST_TOKEN", "--", "true"], "port"),
        (["relay", "--broker-url", "http://127.0.0.1/", "--token-env", "SB_TEST_TOKEN"], "CMD"),
        (["relay", "--broker-url", "http://127.0.0.1/", "--token-env", "NOPE_NOT_SET", "--", "true"], "not set"),
        (["relay", "--broker-url", "http://127.0.0.1/", "--token-env", "SB_TEST_TOKEN", "--max-inflight", "0", "--", "true"], "max-inflight"),
        (["run", "--broker-url", "http://127.0.0.1/", "--token-env", "SB_TEST_TOKEN"], "--source"),
        (["bogus"], "unknown mode"),
    ]
    for args, needle in bad:
        rc, o, out, err = run_shim(args, expect_json=False)
        check(rc == 2 and needle in err and out == "", "usage error for " + needle, rc, out, err)
    rc, o, out, err = run_shim(["relay", "--broker-url", "http://127.0.0.1/", "--token-env", "SB_TEST_TOKEN", "--",
                                "true"], token_env="not-a-token", expect_json=False)
    check(rc == 2 and "64 lowercase hex" in err and "not-a-token" not in err, "bad token refused", err)


tap.case("echo call: headers, body, init frame", t_echo_and_headers)
tap.case("token is not in the guest's env or argv", t_token_not_in_child)
tap.case("token read from --token-fd", t_token_fd)
tap.case("the broker URL is called normalised; a query is a usage error", t_normalised_url)
tap.case("replies in completion order", t_out_of_order)
tap.case("--max-inflight backpressure and keep-alive reuse", t_keepalive_and_inflight_limit)
tap.case("broker down", t_broker_down)
tap.case("broker 5xx with a non-msgpack body", t_5xx_not_msgpack)
tap.case("invalid success reply", t_invalid_success)
tap.case("broker 3xx is an error, never followed", t_redirect)
tap.case("per-call timeout", t_call_timeout)
tap.case("--on-denial terminate and reply", t_denial_terminate_and_reply)
tap.case("--max-calls", t_max_calls)
tap.case("wall-clock timeout", t_wall_timeout)
tap.case("usage and configuration errors exit 2", t_usage_errors)
fb.close()
tap.done()
