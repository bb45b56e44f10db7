"""The guest jail on the real kernel: a C guest (jail_probe.c) that bypasses any runtime and asks
the kernel directly for what the jail must refuse, run through `sandbox-shim relay`.

Each refusal is checked with its errno; the same probes under --jail=off succeed, which shows
every check here can fail. The fail-closed cases run the shim under a seccomp filter that makes
this kernel look like one refusing user namespaces or seccomp (jail_probe deny-*).
"""
import sys
sys.dont_write_bytecode = True  # noqa: E402 - keep tests/shim free of __pycache__
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time

from common import SHIM, TOKEN, Tap, check, closed_port, needs_root

PROBE = os.environ.get("SB_JAIL_PROBE") or os.path.join(os.path.dirname(SHIM), "..", "tests", "jail_probe")
URL = "http://127.0.0.1:%d/rpc" % closed_port()  # the probe makes no broker call
UID_BASE, SLOTS = 1879048192, 1024  # the shim's defaults (jail.h)
X86_64 = platform.machine() == "x86_64"

tap = Tap()
TMP = tempfile.mkdtemp(prefix="sb-jail-test-")
os.chmod(TMP, 0o755)
HOST_FILE = os.path.join(TMP, "world-readable")  # what a guest past its runtime must not read
with open(HOST_FILE, "w") as _f:
    _f.write("host data")
os.chmod(HOST_FILE, 0o644)


def shim_relay(flags=(), probe_args=(), wrap=(), user=None, timeout=60):
    """Runs the probe behind the shim; returns (rc, outcome-or-None, stdout, stderr, shim pid)."""
    env = dict(os.environ, SB_TEST_TOKEN=TOKEN)
    cmd = list(wrap) + [SHIM, "relay", "--broker-url", URL, "--token-env", "SB_TEST_TOKEN"] + list(flags) + [
        "--", PROBE, "probe"] + list(probe_args)
    if user is not None:
        cmd = ["setpriv", "--reuid=%d" % user, "--regid=%d" % user, "--clear-groups", "--"] + cmd
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=timeout)
    out, err = out.decode(), err.decode()
    o = None
    if p.returncode == 0:
        lines = out.splitlines()
        check(len(lines) == 1, "one outcome line", out, err)
        o = json.loads(lines[0])
    check(TOKEN not in out and TOKEN not in err, "token never printed", out, err)
    return p.returncode, o, out, err, p.pid


def probe(flags=(), probe_args=(), **kw):
    rc, o, out, err, pid = shim_relay(flags, probe_args, **kw)
    check(rc == 0 and o is not None and o["ok"], "probe ran", rc, out, err)
    return o["output"], err, pid


def refused(res, name, errno_name):
    r = res[name]
    check(r["ret"] == -1 and r["errno"] == errno_name, "%s refused with %s" % (name, errno_name), r)


class Listener:
    """A loopback TCP listener and a unix socket listener (in a world-writable directory) that
    count what connects."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="sock-", dir=TMP)
        os.chmod(self.dir, 0o777)
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(8)
        self.tcp.setblocking(False)
        self.port = self.tcp.getsockname()[1]
        self.path = os.path.join(self.dir, "s")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.path)
        os.chmod(self.path, 0o777)
        self.unix.listen(8)
        self.unix.setblocking(False)

    @staticmethod
    def _accepted(s):
        n = 0
        while True:
            try:
                c, _ = s.accept()
                c.close()
                n += 1
            except BlockingIOError:
                return n

    def counts(self):
        return self._accepted(self.tcp), self._accepted(self.unix)

    def close(self):
        self.tcp.close()
        self.unix.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def writable_dir():
    d = tempfile.mkdtemp(prefix="w-", dir=TMP)
    os.chmod(d, 0o777)
    return d


def guest_uid(res):
    """The guest's uid as it sees it (every one of real, effective, saved, fs); processes_of() finds
    the same number outside, so the map is the identity."""
    # (the fs uid reads "-" where the filter refuses setfsuid, the one call that tells it)
    m = re.search(r"Uid=(\d+)\t(\d+)\t(\d+)\t(\d+|-) ", res["status"]["detail"])
    check(m is not None and len(set(m.groups()) - {"-"}) == 1, "one uid", res["status"])
    return int(m.group(1))


def cmdline_of(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def pids_with(marker):
    """Host pids of processes whose command line holds `marker` as an argument."""
    m = marker.encode()
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and m in cmdline_of(int(d))]


def own_view(d):
    """What a relay guest may list in directory `d` of its root besides the root's own entries: the
    way down to the probe binary, which relay binds at its own path (a checkout under /tmp shows
    there)."""
    parts = os.path.realpath(PROBE).strip("/").split("/")
    dparts = [x for x in d.strip("/").split("/") if x]
    return {parts[len(dparts)]} if parts[:len(dparts)] == dparts and len(parts) > len(dparts) else set()


def listed(view, d):
    """The entries of `d` in a fs_view detail, or "!ERRNO"."""
    v = dict(part.split("=", 1) for part in view.split(";"))[d]
    return v if v.startswith("!") else set(x for x in v.split(",") if x)


def guest_pids(marker):
    """The probe guests (not the shim) started with `marker`."""
    return [p for p in pids_with(marker) if (cmdline_of(p) or [b""])[0].endswith(b"jail_probe")]


def wait_for(fn, what, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.02)
    check(False, "waited for " + what)


def processes_of(uid):
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/status" % d) as f:
                st = f.read()
        except OSError:
            continue
        m = re.search(r"^Uid:\s+(\d+)", st, re.M)
        if m and int(m.group(1)) == uid:
            found.append(int(d))
    return found


def t_refusals():
    ls = Listener()
    d = writable_dir()
    try:
        res, err, shim_pid = probe(["--jail-nproc", "32", "--jail-fsize-mb", "1"],
                                   ["--dir", "/work", "--tcp-port", str(ls.port), "--unix-path", ls.path,
                                    "--target-pid", str(os.getpid())])
        shim_pid = os.getpid()  # a host process: the guest cannot even learn the shim's pid
        tcp, unix = ls.counts()
    finally:
        ls.close()
    check("sandbox-shim: jail: on:" in err, "start-up line says the jail is on", err)
    # the network: no socket but AF_UNIX, and no unix socket bound to a path either
    for name in ("socket_inet", "socket_inet6", "socket_netlink", "socket_packet"):
        refused(res, name, "EPERM")
    check(res["socket_inet"]["detail"] == "" and tcp == 0, "no TCP connection reached the listener", res, tcp)
    check(res["socket_unix"]["ret"] >= 0 and res["socket_unix"]["detail"] == "connect: EPERM" and unix == 0,
          "AF_UNIX sockets exist, connect() to a path is refused", res["socket_unix"], unix)
    check(res["socketpair_unix"]["ret"] == 0, "socketpair(AF_UNIX) still works", res["socketpair_unix"])
    check(res["interfaces"]["detail"] == "lo:down", "only lo, down", res["interfaces"])
    # other processes
    refused(res, "ptrace_attach", "EPERM")
    check(res["ptrace_attach"]["detail"] == "target %d" % shim_pid, "the probe aimed at the shim", res, shim_pid)
    check(res["ptrace_traceme"]["detail"] == "exit 2", "PTRACE_TRACEME refused with EPERM (seccomp)", res["ptrace_traceme"])
    refused(res, "process_vm_readv", "EPERM")
    refused(res, "kill_shim", "ESRCH")  # outside its PID namespace
    refused(res, "shim_environ", "ENOENT")  # no procfs at all in the guest's root
    check(res["shim_environ"]["detail"] == "/proc/%d/environ" % shim_pid, "the shim's environ", res["shim_environ"])
    # resources: the fork bomb stops at RLIMIT_NPROC (32 tasks, the probe included), the write at RLIMIT_FSIZE
    refused(res, "fork_bomb", "EAGAIN")
    check(res["fork_bomb"]["detail"] == "31", "31 children + the probe = RLIMIT_NPROC 32", res["fork_bomb"])
    # in its scratch (/work, a tmpfs of --jail-fsize-mb): RLIMIT_FSIZE or the scratch's size stops it
    check(res["write_1g"]["ret"] == -1 and res["write_1g"]["errno"] in ("EFBIG", "ENOSPC")
          and int(res["write_1g"]["detail"]) <= 1024 * 1024, "at most 1 MiB written, then EFBIG/ENOSPC", res["write_1g"])
    check(os.listdir(d) == [], "nothing reached the host", os.listdir(d))
    # the kernel surface
    for name in ("mount", "unshare", "clone_newuser", "setsid", "bpf", "perf_event_open", "keyctl", "userfaultfd",
                 "io_uring_setup"):
        refused(res, name, "EPERM")
    refused(res, "clone3", "ENOSYS")
    refused(res, "unreviewed_syscall", "ENOSYS")
    if X86_64:
        check(res["x32_abi"]["detail"] == "signal 31" and res["i386_abi"]["detail"] == "signal 31",
              "foreign system call ABIs are killed (SIGSYS)", res["x32_abi"], res["i386_abi"])
    # credentials
    st = res["status"]["detail"]
    check("NoNewPrivs=1 " in st and "Seccomp=2 " in st, "no_new_privs and a seccomp filter", st)
    check("CapEff=0000000000000000" in st and "CapBnd=0000000000000000" in st and "Groups= " in st,
          "no capabilities, no groups", st)
    uid = guest_uid(res)
    check(UID_BASE <= uid < UID_BASE + SLOTS and uid != 0, "an unprivileged uid from the guest range", uid)
    check(("Uid=%d\t%d\t%d\t- " % (uid, uid, uid)) in st, "every uid is the guest's (setfsuid refused)", st)
    check(("Gid=%d\t%d\t%d\t- " % (uid, uid, uid)) in st, "gid = uid", st)
    refused(res, "uid_map", "ENOENT")  # no procfs
    check(res["hostname"]["detail"] == "sandbox", "UTS namespace", res["hostname"])
    check(processes_of(uid) == [], "nothing of the run (the fork bomb) outlives it", processes_of(uid))


def t_namespaces():
    # seen from the host while the guest holds: every namespace is its own, the mount namespace too
    marker = "ns-%d" % os.getpid()
    out = {}

    def run():
        out["r"] = probe(probe_args=["--only", "status", "--hold-ms", "3000", "--marker", marker])
    t = threading.Thread(target=run)
    t.start()
    pid = wait_for(lambda: guest_pids(marker), "the guest")[0]
    theirs = {n: os.readlink("/proc/%d/ns/%s" % (pid, n)) for n in ("user", "pid", "net", "ipc", "uts", "cgroup", "mnt")}
    with open("/proc/%d/uid_map" % pid) as f:
        umap = f.read().split()
    t.join()
    ours = {n: os.readlink("/proc/self/ns/" + n) for n in theirs}
    for n in theirs:
        check(theirs[n] != ours[n], "a %s namespace of its own" % n, theirs, ours)
    uid = guest_uid(out["r"][0])
    check(umap == [str(uid), str(uid), "1"], "a one-id identity uid map", umap, uid)


def t_off_contrast():
    ls = Listener()
    try:
        only = "socket_inet,socket_unix,status,shim_environ,interfaces,ptrace_traceme,namespaces,fs_view,host_file"
        host = os.path.join(TMP, "host-file")
        with open(host, "w") as f:
            f.write("host data")
        os.chmod(host, 0o644)
        res, err, shim_pid = probe(["--jail=off"], ["--tcp-port", str(ls.port), "--unix-path", ls.path, "--only", only,
                                                    "--target-pid", str(os.getpid()), "--host-file", "host:" + host])
        tcp, unix = ls.counts()
    finally:
        ls.close()
    check("sandbox-shim: jail: OFF (--jail=off)" in err, "the opt-out is said on stderr", err)
    check(res["socket_inet"]["detail"] == "connect: connected" and tcp == 1, "unjailed, the TCP connect lands", res, tcp)
    check(res["socket_unix"]["detail"] == "connect: connected" and unix == 1, "unjailed, the unix connect lands", res, unix)
    check("Seccomp=0" in res["status"]["detail"] and "NoNewPrivs=0" in res["status"]["detail"], "no filter",
          res["status"])
    check(res["ptrace_traceme"]["detail"] == "exit 1", "PTRACE_TRACEME works unjailed", res["ptrace_traceme"])
    check(res["interfaces"]["detail"] != "lo:down", "the host's interfaces", res["interfaces"])
    if os.geteuid() == 0:
        check(res["shim_environ"]["ret"] > 0, "a root guest reads the shim's environ", res["shim_environ"])
    check(res["namespaces"]["detail"].split()[2] == os.readlink("/proc/self/ns/net"), "the host's network",
          res["namespaces"])
    check(res["host_file"]["detail"] == "host data", "unjailed, the host file is read", res["host_file"])
    check("/tmp=" in res["fs_view"]["detail"] and "/tmp=!" not in res["fs_view"]["detail"], "and the host's /tmp listed",
          res["fs_view"])


MSG_USERNS = ("sandbox-shim: jail: the kernel refused new user, mount, pid, network, ipc and uts namespaces "
              "(clone: Operation not permitted); refusing to start the guest (--jail=off runs it without the jail)")


def t_fail_closed_userns():
    ls = Listener()
    try:
        rc, o, out, err, _ = shim_relay(probe_args=["--tcp-port", str(ls.port), "--only", "socket_inet"],
                                        wrap=[PROBE, "deny-userns"])
        tcp, _ = ls.counts()
    finally:
        ls.close()
    check(rc == 2 and out == "" and MSG_USERNS in err, "refused with the reason, nothing on stdout", rc, out, err)
    check(tcp == 0, "the guest never ran", tcp)
    rc, o, out, err, _ = shim_relay(["--jail", "off"], ["--only", "namespaces"], wrap=[PROBE, "deny-userns"])
    check(rc == 0 and o["ok"] and "jail: OFF (--jail=off)" in err, "--jail=off runs, and says so", rc, out, err)
    p = subprocess.run([PROBE, "deny-userns", SHIM, "jail-check"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 2 and MSG_USERNS in p.stderr and "ok" not in p.stdout, "jail-check refuses too", p)


def t_fail_closed_seccomp():
    rc, o, out, err, _ = shim_relay(probe_args=["--only", "status"], wrap=[PROBE, "deny-seccomp"])
    check(rc == 2 and out == "" and "sandbox-shim: jail: the kernel refuses seccomp filters (seccomp: Invalid argument); "
          "refusing to start the guest" in err, "no seccomp: refused at start-up", rc, out, err)
    rc, o, out, err, _ = shim_relay(probe_args=["--only", "status"], wrap=[PROBE, "deny-seccomp-load"])
    check(rc == 2 and out == "" and "sandbox-shim: jail: the kernel refused loading the seccomp filter (Invalid argument); "
          "refusing to start the guest" in err, "seccomp load refused inside the guest: refused", rc, out, err)


def t_distinct_uids():
    results = []

    def one():
        results.append(probe(probe_args=["--only", "status", "--hold-ms", "700"])[0])
    ts = [threading.Thread(target=one) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    uids = [guest_uid(r) for r in results]
    check(len(set(uids)) == 3, "three concurrent guests, three uids", uids)


def t_slots_exhausted():
    # a uid range and lock file of its own, so that parallel tests cannot hold its one slot
    lock = os.path.join(TMP, "uids.lock")
    flags = ["--jail-uid-base", str(UID_BASE + 60000), "--jail-slots", "1", "--jail-lock-file", lock]
    holder = threading.Thread(target=lambda: probe(flags, ["--only", "status", "--hold-ms", "1500"]))
    holder.start()
    time.sleep(0.5)
    rc, o, out, err, _ = shim_relay(flags, ["--only", "status"])
    holder.join()
    check(rc == 2 and "jail: all 1 guest uids are in use (--jail-slots)" in err, "no uid left: refused", rc, err)
    res, _, _ = probe(flags, ["--only", "status"])
    check(guest_uid(res) == UID_BASE + 60000, "the uid is handed out again once the run ended", res)


def t_nonroot_shim():
    # as an unprivileged user the shim maps only its own uid: every guest shares it, yet each run
    # still gets its own RLIMIT_NPROC count (the kernel counts per user namespace)
    nobody = 65534
    results = []

    def one():
        results.append(probe(["--jail-nproc", "8"], ["--only", "status,socket_inet,interfaces,fork_bomb,fs_view,host_file",
                                                    "--host-file", "host:" + HOST_FILE,
                                                    "--hold-ms", "800"], user=nobody))
    ts = [threading.Thread(target=one) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for res, err, _ in results:
        check("shared by every guest (not root" in err, "the start-up line says the uid is shared", err)
        check(guest_uid(res) == nobody, "the shim's own uid", res["status"])
        refused(res, "host_file", "ENOENT")
        check(listed(res["fs_view"]["detail"], "/tmp") == (own_view("/tmp") or "!ENOENT"), "a root of its own",
              res["fs_view"])
        check("Seccomp=2" in res["status"]["detail"] and "CapEff=0000000000000000" in res["status"]["detail"],
              "filter and no capabilities", res["status"])
        refused(res, "socket_inet", "EPERM")
        check(res["interfaces"]["detail"] == "lo:down", "only lo, down", res["interfaces"])
        check(res["fork_bomb"]["detail"] == "7", "each concurrent run forks its own 7", res["fork_bomb"])


def cgroup2_mount():
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if parts[2] == "cgroup2":
                return parts[1]
    return None


def t_cgroup():
    p = subprocess.run([SHIM, "jail-check"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 0 and "jail-check: ok" in p.stdout, "jail-check starts a jailed guest", p)
    check("no cgroup v2 subtree (--jail-cgroup): memory is bounded only by the V8 heap cap and RLIMIT_DATA" in p.stderr,
          "without a cgroup the start-up line says what bounds memory", p.stderr)
    p = subprocess.run([SHIM, "jail-check", "--jail-cgroup", TMP], capture_output=True, text=True, timeout=30)
    check(p.returncode == 2 and "jail: %s is not a cgroup v2 directory" % TMP in p.stderr, "not cgroup v2: refused", p)
    root = cgroup2_mount()
    if root is None:
        return
    with open(os.path.join(root, "cgroup.controllers")) as f:
        available = f.read().split()
    with open(os.path.join(root, "cgroup.subtree_control")) as f:
        enabled = f.read().split()
    if "memory" not in enabled or "pids" not in enabled:
        # this machine's cgroup v2 hierarchy does not delegate the controllers (hybrid layout)
        p = subprocess.run([SHIM, "jail-check", "--jail-cgroup", root], capture_output=True, text=True, timeout=30)
        check(p.returncode == 2 and "the memory and pids controllers are not enabled in %s/cgroup.subtree_control"
              % root in p.stderr, "no memory/pids controllers: refused", p, available)
        return
    # a full cgroup v2 machine: a delegated directory of our own, and a run inside it
    base = tempfile.mkdtemp(prefix="sb-jail-test-", dir=root)
    try:
        with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
            f.write("+memory +pids")
        seen = {}

        def watch():
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not seen:
                for d in os.listdir(base):
                    if d.startswith("sb-") and os.path.isdir(os.path.join(base, d)):
                        try:
                            with open(os.path.join(base, d, "memory.max")) as f:
                                seen["memory.max"] = f.read().strip()
                            with open(os.path.join(base, d, "pids.max")) as f:
                                seen["pids.max"] = f.read().strip()
                            with open(os.path.join(base, d, "cgroup.procs")) as f:
                                seen["procs"] = f.read().split()
                        except OSError:
                            seen.clear()
                time.sleep(0.02)
        w = threading.Thread(target=watch)
        w.start()
        res, err, _ = probe(["--jail-cgroup", base, "--memory-mb", "64", "--jail-nproc", "40"],
                            ["--only", "status", "--hold-ms", "1000"])
        w.join()
        check(seen.get("memory.max") == str((64 + 160) * 1024 * 1024) and seen.get("pids.max") == "40"
              and len(seen.get("procs", [])) == 1, "the run's cgroup: memory.max, pids.max, the guest in it", seen)
        check([d for d in os.listdir(base) if d.startswith("sb-")] == [], "the run's cgroup is removed",
              os.listdir(base))
    finally:
        os.rmdir(base)


def t_sigterm_reaches_a_catching_guest():
    # the guest is pid 1 of its namespace: the shim SIGKILLs it at once unless it catches SIGTERM,
    # in which case it gets the SIGTERM (and its grace period) like any unjailed guest
    # (the jailed guest can write nowhere the host reads: its handler renames it, which the host sees
    # in /proc/<pid>/comm while the shim waits out the grace period before SIGKILL)
    marker = "term-%d" % os.getpid()
    out = {}
    seen = []

    def run():
        out["r"] = shim_relay(["--timeout-ms", "1500"], ["--only", "status", "--hold-ms", "10000", "--term-comm",
                                                         "--marker", marker])
    t = threading.Thread(target=run)
    t.start()
    pid = wait_for(lambda: guest_pids(marker), "the guest")[0]
    while t.is_alive():
        try:
            with open("/proc/%d/comm" % pid) as f:
                if f.read().strip() == "sb-term":
                    seen.append(1)
        except OSError:
            pass
        time.sleep(0.005)
    t.join()
    rc, o, stdout, err, _ = out["r"]
    check(rc == 0 and o["timedOut"] is True, "the run timed out", rc, stdout, err)
    check(seen, "the guest's SIGTERM handler ran")


def t_usage():
    for flags, needle in ((["--jail", "maybe"], "--jail wants on or off"), (["--jail=", "x"], "--jail wants on or off"),
                          (["--jail-nproc", "0"], "--jail-nproc wants 1..65536"),
                          (["--jail-fsize-mb", "0"], "--jail-fsize-mb wants 1..1048576"),
                          (["--jail-uid-base", "0"], "--jail-uid-base wants 1..2147483647"),
                          (["--jail-cgroup", "rel"], "--jail-cgroup wants an absolute directory")):
        rc, o, out, err, _ = shim_relay(flags, ["--only", "status"])
        check(rc == 2 and needle in err and out == "", "usage error: " + needle, rc, out, err)


def t_filesystem():
    """Native code after an escape sees a root of its own: no host file, no host /tmp or /proc, and
    what it writes does not outlive the run anywhere on the host."""
    marker = "fs%d" % os.getpid()
    res, err, _ = probe(["--timeout-ms", "4000"],
                        ["--only", "fs_view,host_file,proc1_cmdline,write_out,mqueue,ptmx,pdeathsig,rlimit_cpu,memfd,shmget",
                         "--host-file", "host:" + HOST_FILE, "--marker", marker])
    check("a tmpfs root of its own" in err, "the start-up line says so", err)
    refused(res, "host_file", "ENOENT")
    view = res["fs_view"]["detail"]
    root = listed(view, "/")
    allowed = {"usr", "bin", "lib", "lib64", "sbin", "dev", "proc", "work"} | own_view("/")
    check(root <= allowed and {"usr", "dev", "proc", "work"} <= root, "/ holds /usr, /dev, /proc, /work only", root)
    for d in ("/tmp", "/etc", "/home", "/var"):
        check(listed(view, d) == (own_view(d) or "!ENOENT"), "nothing of the host's %s" % d, view)
    check(listed(view, "/dev") == {"null", "zero", "random", "urandom"}, "/dev: 4 nodes", view)
    check(listed(view, "/proc") == {"self"}, "/proc: self only (no pids)", view)
    refused(res, "proc1_cmdline", "ENOENT")
    refused(res, "ptmx", "ENOENT")
    check(res["write_out"]["detail"].split() == ["/work"], "writable: its scratch only", res["write_out"])
    # memory outside RLIMIT_DATA, and queues: not on the seccomp allow-list (their IPC namespace is
    # the guest's own anyway)
    for name in ("mqueue", "memfd", "shmget"):
        refused(res, name, "EPERM")
    check(res["pdeathsig"]["detail"] == "9", "PR_SET_PDEATHSIG SIGKILL, re-armed after the uid change", res["pdeathsig"])
    cpus = os.cpu_count()
    check(res["rlimit_cpu"]["detail"] == "%d %d" % (cpus * 4 + 5, cpus * 4 + 5), "RLIMIT_CPU = CPUs x 4 s + 5 s",
          res["rlimit_cpu"])
    left = [os.path.join(d, "sb-probe-" + marker) for d in ("/", "/tmp", "/var/tmp", "/dev/shm", "/dev", "/run", "/root",
                                                             "/home", "/etc", "/usr", "/dev/mqueue", "/work")]
    check([p for p in left if os.path.lexists(p)] == [], "nothing left on the host", left)


def t_shim_killed():
    """A killed shim takes its guest with it (PR_SET_PDEATHSIG survives the uid change)."""
    marker = "kill%d" % os.getpid()
    env = dict(os.environ, SB_TEST_TOKEN=TOKEN)
    p = subprocess.Popen([SHIM, "relay", "--broker-url", URL, "--token-env", "SB_TEST_TOKEN", "--timeout-ms", "60000",
                          "--", PROBE, "probe", "--only", "status", "--hold-ms", "60000", "--marker", marker],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        guest = wait_for(lambda: guest_pids(marker), "the guest")[0]
        p.kill()
        p.wait()
        wait_for(lambda: guest not in guest_pids(marker), "the guest to die with its shim (it holds for 60 s)")
    finally:
        for g in guest_pids(marker):
            os.kill(g, 9)
        if p.poll() is None:
            p.kill()


def t_uid_in_use():
    """A uid that a process still runs as is never handed out, lock or no lock."""
    if not needs_root("uids per guest"):
        return
    lock = os.path.join(TMP, "uids-inuse.lock")
    uid = UID_BASE + 61000
    flags = ["--jail-uid-base", str(uid), "--jail-slots", "1", "--jail-lock-file", lock]
    squatter = subprocess.Popen(["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid, "--clear-groups", "sleep", "30"])
    try:
        wait_for(lambda: processes_of(uid), "the squatter")
        rc, o, out, err, _ = shim_relay(flags, ["--only", "status"])
        check(rc == 2 and "jail: all 1 guest uids are in use (--jail-slots)" in err, "the uid of a live process: refused",
              rc, out, err)
    finally:
        squatter.kill()
        squatter.wait()
    wait_for(lambda: not processes_of(uid), "the squatter gone")
    res, _, _ = probe(flags, ["--only", "status"])
    check(guest_uid(res) == uid, "handed out once nothing runs as it", res)


def t_leftovers():
    """What a guest of an older shim left: its old work directory under TMPDIR (its home owned by a
    guest uid that runs nothing) is removed at start-up, fd-relative, and said; a uid that still owns
    a file at the top of /tmp (or TMPDIR) is never handed out."""
    if not needs_root("uids per guest"):
        return
    base = UID_BASE + 62000
    lock = os.path.join(TMP, "uids-left.lock")
    tmpdir = tempfile.mkdtemp(prefix="tmpdir-left-", dir=TMP)
    os.chmod(tmpdir, 0o755)
    flags = ["--jail-uid-base", str(base), "--jail-slots", "2", "--jail-lock-file", lock]
    # an old run's directory: 0711, its home 0700 and a deep tree, owned by slot 1's uid
    old = os.path.join(tmpdir, "sb-shim-OLD123")
    os.makedirs(os.path.join(old, "home", "deno", "a", "b"))
    with open(os.path.join(old, "home", "deno", "a", "b", "secret.txt"), "w") as f:
        f.write("a former run's data")
    for d, _, files in os.walk(os.path.join(old, "home")):
        os.chown(d, base + 1, base + 1)
        os.chmod(d, 0o700)
        for n in files:
            os.chown(os.path.join(d, n), base + 1, base + 1)
    os.chmod(old, 0o711)
    # and a file slot 0's uid left in TMPDIR itself
    stale = os.path.join(tmpdir, "left-by-slot-0")
    with open(stale, "w") as f:
        f.write("x")
    os.chown(stale, base, base)
    try:
        env = dict(os.environ, TMPDIR=tmpdir)
        p = subprocess.run([SHIM, "jail-check"] + flags, env=env, capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, "jail-check ran", p.returncode, p.stdout, p.stderr)
        check(not os.path.exists(old), "the old run's directory is gone", os.listdir(tmpdir))
        check("1 work directories older guests left under TMPDIR removed, 0 kept" in p.stdout + p.stderr,
              "and said", p.stdout, p.stderr)
        # slot 0's uid owns a file: every guest gets slot 1's uid, never slot 0's
        seen = set()
        for _ in range(4):
            rc, o, out, err, _ = shim_relay(flags, ["--only", "status"], wrap=["env", "TMPDIR=" + tmpdir])
            check(rc == 0 and o is not None and o["ok"], "probe ran", rc, out, err)
            seen.add(guest_uid(o["output"]))
        check(seen == {base + 1}, "the uid that owns a file is not handed out", seen)
        os.unlink(stale)
        rc, o, out, err, _ = shim_relay(flags, ["--only", "status"], wrap=["env", "TMPDIR=" + tmpdir])
        check(rc == 0 and o["ok"], "probe ran", rc, out, err)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def t_spawn_filters():
    """A Deno guest (run, serve) may start threads but no process, so that RLIMIT_DATA bounds the
    whole run; a relay guest may fork. Neither gets shared anonymous memory, nor a prctl that undoes the jail."""
    src = os.path.join(TMP, "any.js")
    with open(src, "w") as f:
        f.write("export default () => 1;")
    env = dict(os.environ, SB_TEST_TOKEN=TOKEN)
    p = subprocess.run([SHIM, "run", "--broker-url", URL, "--token-env", "SB_TEST_TOKEN", "--source", src, "--deno", PROBE],
                       env=env, capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, "the probe ran as a Deno guest", p)
    res = json.loads(p.stdout)["output"]
    refused(res, "fork_once", "EPERM")
    refused(res, "mmap_shared", "EPERM")
    # no /dev/zero for a Deno guest: a shared writable mapping of it is memory RLIMIT_DATA does not count
    refused(res, "mmap_devzero", "ENOENT")
    check(res["thread"]["ret"] == 0 and res["mmap_private"]["ret"] == 0, "threads and private memory", res)
    for name in ("prctl_pdeathsig_0", "prctl_dumpable", "prctl_subreaper", "prctl_ptracer"):
        refused(res, name, "EPERM")
    check(res["prctl_set_name"]["ret"] == 0 and res["prctl_pdeathsig_kill"]["ret"] == 0, "naming and a death signal", res)
    check("runtime" in res["fs_view"]["detail"].split(";")[0], "at /runtime/deno in its root", res["fs_view"])
    res, _, _ = probe(probe_args=["--only", "fork_once,thread,mmap_shared,mmap_private,prctl,pdeathsig"])
    check(res["fork_once"]["ret"] > 0 and res["thread"]["ret"] == 0, "a relay guest forks", res)
    refused(res, "mmap_shared", "EPERM")
    # the guest cannot take back its death signal, become dumpable, a subreaper, or name a tracer
    for name in ("prctl_pdeathsig_0", "prctl_dumpable", "prctl_subreaper", "prctl_ptracer"):
        refused(res, name, "EPERM")
    check(res["pdeathsig"]["detail"] == "9", "the death signal is still SIGKILL", res["pdeathsig"])


tap.case("jailed probe: every refusal with its errno, credentials and namespaces", t_refusals)
tap.case("Deno guests start threads only; no shared anonymous memory", t_spawn_filters)
tap.case("a guest's namespaces, mount included, are its own (seen from the host)", t_namespaces)
tap.case("filesystem: no host file, no host /tmp or /proc, nothing left behind", t_filesystem)
tap.case("a killed shim takes its guest with it", t_shim_killed)
tap.case("a uid a process still runs as is not handed out", t_uid_in_use)
tap.case("--jail=off: the same probes succeed (the checks can fail)", t_off_contrast)
tap.case("fail closed: a kernel refusing user namespaces", t_fail_closed_userns)
tap.case("fail closed: a kernel refusing seccomp, at start-up and in the guest", t_fail_closed_seccomp)
tap.case("concurrent guests get distinct uids", t_distinct_uids)
tap.case("all guest uids in use: refused; the uid comes back after the run", t_slots_exhausted)
tap.case("unprivileged shim: shared uid, still jailed, RLIMIT_NPROC per run", t_nonroot_shim)
tap.case("cgroup: start-up line, refusals, per-run cgroup where the machine delegates one", t_cgroup)
tap.case("SIGTERM reaches a jailed guest that catches it", t_sigterm_reaches_a_catching_guest)
tap.case("jail option usage errors", t_usage)
tap.case("leftovers of older shims: old work directories removed at start-up, a uid owning files never handed out", t_leftovers)
shutil.rmtree(TMP, ignore_errors=True)
tap.done()
