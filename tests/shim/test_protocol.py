"""Protocol violations by a fake guest: each must kill the guest and end the run with a clear error."""
import sys
sys.dont_write_bytecode = True  # noqa: E402 - keep tests/shim free of __pycache__
import time

import msgpack

from common import FakeBroker, Tap, check, frame, raw_frame, relay_args, run_shim

tap = Tap()
fb = FakeBroker()


def violation(scenario, needle, *flags):
    t0 = time.monotonic()
    rc, o, out, err = run_shim(relay_args(fb.url, scenario, *flags))
    check(rc == 0, "a run with a violation still completes", rc, err)
    check(not o["ok"] and "guest protocol violation" in o["error"] and needle in o["error"], "error names it", o)
    check(time.monotonic() - t0 < 10, "ended promptly")
    return o


def t_4gib_prefix():
    violation({"raw_hex": "ffffffff"}, "frame length above the frame cap")


def t_garbage():
    violation({"raw_hex": b"hello, this is not a frame\n".hex()}, "frame length above the frame cap")


def t_zero_length():
    violation({"raw_hex": "00000000"}, "zero-length frame")


def t_bad_msgpack():
    violation({"raw_hex": raw_frame(b"\xc1").hex()}, "bad msgpack")
    violation({"raw_hex": raw_frame(b"\xdf\x29\xa6\x7a\x7e").hex()}, "bad msgpack")
    violation({"raw_hex": raw_frame(msgpack.packb({"t": "call"}) + b"\x00").hex()}, "bad msgpack")


def t_not_a_map():
    violation({"raw_hex": raw_frame(msgpack.packb([1, 2])).hex()}, "not a map")


def t_unknown_kind():
    violation({"raw_hex": frame({"t": "init", "source": "x"}).hex()}, "unknown frame kind")
    violation({"raw_hex": frame({"t": "zzz"}).hex()}, "unknown frame kind")


def t_malformed_call():
    violation({"raw_hex": frame({"t": "call", "id": -1, "method": "services.echo.x"}).hex()}, "malformed call")
    violation({"raw_hex": frame({"t": "call", "id": 1, "method": "services.echo.x", "x": 1}).hex()}, "malformed call")


def t_duplicate_id():
    violation({"calls": [[5, "services.slow.300"], [5, "services.echo.x"]]}, "duplicate in-flight call id")


def t_call_after_result():
    after = frame({"t": "call", "id": 9, "method": "services.echo.x"}).hex()
    o = violation({"calls": [], "after_hex": after}, "call after result")
    check(o["calls"] == 0, "the late call was not relayed", o)


def t_oversize_call():
    big = "x" * 70000
    violation({"raw_hex": frame({"t": "call", "id": 1, "method": "services.echo.x", "args": big}).hex()},
              "above the method's request cap")


def t_truncated_frame():
    violation({"raw_hex": frame({"t": "call", "id": 1, "method": "services.echo.x"})[:7].hex(),
               "then_exit": True},
              "stdout closed in the middle of a frame")


def t_sigkill_escalation():
    t0 = time.monotonic()
    o = violation({"raw_hex": "ffffffff", "ignore_term": True}, "frame length above the frame cap")
    check(time.monotonic() - t0 < 3, "SIGKILL followed SIGTERM", time.monotonic() - t0)


def t_no_result():
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [], "no_result": True}))
    check(rc == 0 and not o["ok"] and "subprocess exited without result (exit code 0)" in o["error"], "no result", o)


def t_invalid_result():
    bad = [
        ({"t": "result", "ok": True}, "logs"),
        ({"t": "result", "ok": "yes", "logs": []}, "want"),
        ({"t": "result", "ok": False, "logs": []}, "string error"),
        ({"t": "result", "ok": True, "logs": ["x" * 4001]}, "4000 bytes"),
        ({"t": "result", "ok": True, "logs": ["x"] * 1001}, "1000"),
        ({"t": "result", "ok": True, "logs": [], "output": "y" * (1024 * 1024 + 1)}, "1 MiB"),
        ({"t": "result", "ok": True, "logs": [], "extra": 1}, "want"),
    ]
    for res, needle in bad:
        rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [], "result": res}))
        check(rc == 0 and not o["ok"] and "invalid result" in o["error"] and needle in o["error"], needle, o)


def t_guest_error_result():
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [], "result": {"t": "result", "ok": False,
                                                                            "error": "boom", "logs": ["error: x"]}}))
    check(rc == 0 and o == {"ok": False, "error": "boom", "logs": ["error: x"], "ms": o["ms"], "calls": 0}, "shape", o)


def t_bin_output():
    rc, o, out, err = run_shim(relay_args(fb.url, {"calls": [], "result": {"t": "result", "ok": True, "logs": [],
                                                                            "output": {"b": "AAE="}}}))
    check(rc == 0 and o["ok"] and o["output"] == {"b": "AAE="}, "output passes through", o)


tap.case("4 GiB length prefix", t_4gib_prefix)
tap.case("garbage on stdout", t_garbage)
tap.case("zero-length frame", t_zero_length)
tap.case("bad msgpack (0xc1, 32 GiB map header, trailing bytes)", t_bad_msgpack)
tap.case("frame that is not a map", t_not_a_map)
tap.case("unknown or wrong-direction kinds", t_unknown_kind)
tap.case("malformed call frames", t_malformed_call)
tap.case("duplicate in-flight id", t_duplicate_id)
tap.case("call after result", t_call_after_result)
tap.case("call frame above the method's cap", t_oversize_call)
tap.case("stdout closed mid-frame", t_truncated_frame)
tap.case("SIGTERM ignored: SIGKILL after 250 ms", t_sigkill_escalation)
tap.case("exit without result", t_no_result)
tap.case("invalid result frames", t_invalid_result)
tap.case("guest error result", t_guest_error_result)
tap.case("output converted to JSON", t_bin_output)
fb.close()
tap.done()
