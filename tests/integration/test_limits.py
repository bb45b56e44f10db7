"""Connection limit: past max_connections a new connection is closed at once and counted; the admin
listener keeps a spare so the host can still revoke."""

import socket
import time

import sbtest


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def closed_by_peer(s, timeout=3.0):
    """True when the broker closed the connection (FIN or reset) without a byte; False on a timeout."""
    s.settimeout(timeout)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def healthz_ok(port):
    try:
        return sbtest.http_request(port, "GET", "/healthz", timeout=2).status == 200
    except OSError:
        return False  # still at the limit: the broker closed it


class Limits(sbtest.BrokerTestCase):
    def test_max_connections(self):
        with sbtest.Broker(env={"SANDBOX_BROKER_MAX_CONNECTIONS": "2", "SANDBOX_BROKER_THREADS": "1"}) as b:
            held = [connect(b.port), connect(b.port)]
            time.sleep(0.2)
            extra = connect(b.port)
            self.assertTrue(closed_by_peer(extra), "the third connection must be closed by the broker")
            extra.close()
            # the admin listener keeps one spare: the host can still revoke and read metrics
            r = b.admin("GET", "/metrics")
            self.assertEqual(r.status, 200)
            self.assertIn("sb_connections_refused_total 1\n", r.raw.decode())
            # a held connection still works, and once one closes a new one is served
            held[0].sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertIn(b"200 OK", held[0].recv(4096))
            held[1].close()
            ok = sbtest.poll(lambda: healthz_ok(b.port), 5)
            self.assertTrue(ok)
            held[0].close()

    def test_config_range(self):
        rc, out, err = sbtest.run_broker_once(["--check-config"], sbtest.base_env({"SANDBOX_BROKER_MAX_CONNECTIONS": "0"}))
        self.assertEqual(rc, 1)
        self.assertIn("max_connections: expected an integer from 1 to 1000000", err)


if __name__ == "__main__":
    sbtest.main()
