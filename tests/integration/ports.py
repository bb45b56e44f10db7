"""Loopback ports for the servers tests start.

A port is taken from 20000 up to the kernel's ephemeral range (32768 by default), where no client
socket of another test is ever given one: a port picked by binding port 0 comes from the ephemeral
range, and a connection made by any other test between that pick and the server's own bind (or a
client socket of one left in TIME_WAIT) takes it from the server. Each port is checked with a bind
without SO_REUSEADDR, which sees those sockets the way a server's bind does, and is not handed out
twice by one process.
"""
import random
import socket

_given = set()
_rng = random.SystemRandom()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return max(20001, min(int(f.read().split()[0]), 65536))
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(udp_too=False):
    """A loopback TCP port (and UDP, with udp_too) free a moment ago, below the ephemeral range."""
    hi = _ephemeral_low()
    for _ in range(500):
        port = _rng.randrange(20000, hi)
        if port in _given:
            continue
        socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM)]
        if udp_too:
            socks.append(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        try:
            for s in socks:
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        _given.add(port)
        return port
    raise RuntimeError("no loopback port free in 20000-%d" % (hi - 1))
