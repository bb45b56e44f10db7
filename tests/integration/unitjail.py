#!/usr/bin/python3
"""Runs a command under the seccomp sandbox a systemd unit file asks for.

    unitjail.py UNIT_FILE -- COMMAND [ARG]...

systemd is not PID 1 on the machines the tests run on, so the unit cannot be
started for real. This helper reads the unit's [Service] section and loads the
seccomp filters systemd would load for these directives (systemd.exec(5)),
then execs the command:

  SystemCallFilter=        the allow or deny list, every assignment merged in
                           order as systemd merges them; an allow list also
                           gets @default, as systemd adds it; groups are
                           expanded with `systemd-analyze syscall-filter`, so
                           they are exactly the groups of the installed systemd
  SystemCallErrorNumber=   the action for a filtered call (default: kill the
                           process with SIGSYS, as systemd does)
  SystemCallArchitectures= "native": only the native ABI (libseccomp's default
                           for a filter with no extra architecture)
  RestrictAddressFamilies= socket() with another family fails EAFNOSUPPORT
  MemoryDenyWriteExecute=  writable+executable mappings fail EPERM
  RestrictNamespaces=      clone/unshare with a namespace flag the list does not
                           name, and setns, fail EPERM; clone3 fails ENOSYS (as
                           systemd does: its flags are out of a filter's reach)
  CapabilityBoundingSet=   every capability not named leaves the bounding set,
                           so a root command keeps only the named ones
  NoNewPrivileges=         no_new_privs
  ProtectHostname=         its seccomp half: sethostname and setdomainname fail
                           EPERM (the UTS namespace systemd also makes is not)
  ProtectSystem=strict     in a mount namespace of its own, every mount but
                           /dev, /proc and /sys read-only, except
  ReadWritePaths=          these paths ("-" prefix: skipped when missing),
  LogsDirectory=,          and /var/log/NAME, /var/lib/NAME, /var/cache/NAME,
  StateDirectory=, ...     /run/NAME, which systemd creates for the unit: here
                           each is made on a fresh tmpfs over its parent
                           (/var/log...), visible to this process only, so the
                           host is never touched. Another process reaches the
                           files through /proc/PID/root.

/tmp stays the host's /tmp, writable (PrivateTmp= would give a private one;
the tests keep their files there). The other directives systemd implements
with namespaces (ProtectHome=, PrivateDevices=, ProtectProc=, ...) and the
remaining seccomp-based ones (LockPersonality=, RestrictRealtime=,
RestrictSUIDSGID=) are not emulated; they are listed on stderr so nobody
mistakes this for the whole sandbox. The service's User= is not taken
either: the command runs as the caller.

Only the standard library, python3-seccomp and systemd-analyze are used.
"""

import ctypes
import errno
import os
import socket
import subprocess
import sys

import seccomp

NOT_EMULATED = {"LockPersonality", "RestrictRealtime", "RestrictSUIDSGID", "ProtectHome", "PrivateTmp", "PrivateDevices",
                "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups",
                "ProtectClock", "ProtectProc", "AmbientCapabilities", "UMask", "User", "Group"}
# RestrictNamespaces= names and their clone(2) flags (systemd.exec(5))
NAMESPACES = {"cgroup": 0x02000000, "ipc": 0x08000000, "net": 0x40000000, "mnt": 0x00020000, "pid": 0x20000000,
              "user": 0x10000000, "uts": 0x04000000}
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
MANAGED_DIRS = {"LogsDirectory": "/var/log", "StateDirectory": "/var/lib", "CacheDirectory": "/var/cache",
                "RuntimeDirectory": "/run"}
API_FS = ("/dev", "/proc", "/sys")

PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000


def service_section(path):
    """[(key, value)] of the [Service] section, in order, continuation lines joined."""
    out, section, pending = [], None, ""
    with open(path) as f:
        for raw in f:
            line = pending + raw.rstrip("\n")
            pending = ""
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                continue
            if section == "Service" and "=" in line:
                k, v = line.split("=", 1)
                out.append((k.strip(), v.strip()))
    return out


_groups = {}


def expand(name):
    """A syscall name or @group, as the set of syscall names it stands for (groups recursively)."""
    if not name.startswith("@"):
        return {name}
    if name not in _groups:
        p = subprocess.run(["systemd-analyze", "--no-pager", "syscall-filter", name], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            raise SystemExit("unitjail: systemd-analyze syscall-filter %s failed: %s" % (name, p.stderr.strip()))
        members = set()
        for line in p.stdout.splitlines()[1:]:
            item = line.strip()
            if not item or item.startswith("#"):
                continue
            if item.startswith("@"):
                members |= expand(item)
            else:
                members.add(item)
        _groups[name] = members
    return _groups[name]


def syscall_sets(assignments):
    """Merges SystemCallFilter= assignments the way systemd does: the first non-empty one decides
    allow-list or deny-list; later ones add to or take from that list; an empty one resets."""
    allow_list, names = None, set()
    for value in assignments:
        if value == "":
            allow_list, names = None, set()
            continue
        invert = value.startswith("~")
        items = set()
        for word in value.lstrip("~").split():
            items |= expand(word.split(":", 1)[0])  # "name:errno" carries its own errno; the name is what matters
        if allow_list is None:
            allow_list = not invert
            names = (expand("@default") | items) if allow_list else items
        elif allow_list:
            names = names - items if invert else names | items
        else:
            names = names | items if invert else names - items
    return allow_list, names


def errno_action(value):
    if value in ("", None):
        return seccomp.KILL_PROCESS
    if value.lower() == "kill":
        return seccomp.KILL_PROCESS
    n = getattr(errno, value, None) if not value.isdigit() else int(value)
    if n is None:
        raise SystemExit("unitjail: SystemCallErrorNumber=%s is not an errno name" % value)
    return seccomp.ERRNO(n)


def add(f, action, name, *args):
    """Adds a rule; names this libseccomp does not know on this architecture are skipped, as systemd skips them."""
    try:
        nr = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
    except (ValueError, RuntimeError):
        return
    if nr < 0:  # a pseudo number: the call does not exist on this architecture (socketcall on x86_64)
        return
    f.add_rule(action, nr, *args)


_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18


def _mount(src, target, fstype, flags, data=None):
    enc = lambda v: v.encode() if v is not None else None
    if _libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        e = ctypes.get_errno()
        raise SystemExit("unitjail: mount %s on %s: %s" % (src or fstype, target, os.strerror(e)))


def under(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def protect_system(directives):
    """ProtectSystem=strict with its writable exceptions, in a mount namespace of this process's own."""
    modes = [v for k, v in directives if k == "ProtectSystem"]
    if not modes or modes[-1] in ("no", "false", ""):
        return
    if modes[-1] != "strict":
        raise SystemExit("unitjail: ProtectSystem=%s is not emulated (only strict)" % modes[-1])
    writable = ["/tmp"]
    for k, v in directives:
        if k == "ReadWritePaths":
            for p in v.split():
                optional = p.startswith("-")
                p = p.lstrip("-+")
                if os.path.exists(p):
                    writable.append(p)
                elif not optional:
                    raise SystemExit("unitjail: ReadWritePaths=%s does not exist" % p)
    managed = [(MANAGED_DIRS[k], name) for k, v in directives if k in MANAGED_DIRS for name in v.split()]
    if _libc.unshare(CLONE_NEWNS) != 0:
        raise SystemExit("unitjail: unshare(CLONE_NEWNS): %s" % os.strerror(ctypes.get_errno()))
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    for parent in sorted({p for p, _ in managed}):
        _mount("tmpfs", parent, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
        writable.append(parent)
    for parent, name in managed:
        os.makedirs(os.path.join(parent, name), mode=0o755, exist_ok=True)
    for p in writable:
        _mount(p, p, None, MS_BIND | MS_REC)  # its own mount, so the read-only remounts below leave it alone
    with open("/proc/self/mountinfo") as f:
        mounts = []
        for line in f:
            fields = line.split()
            mounts.append((fields[4].replace("\\040", " "), fields[5].split(",")))
    for point, opts in mounts:
        if under(point, API_FS) or under(point, writable) or "ro" in opts:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        flags |= (MS_NOSUID if "nosuid" in opts else 0) | (MS_NODEV if "nodev" in opts else 0)
        flags |= MS_NOEXEC if "noexec" in opts else 0
        _mount(None, point, None, flags)


def yes(value):
    return value.lower() in ("yes", "true", "1", "on")


def restrict_namespaces(directives):
    """The filter of RestrictNamespaces=: a list of the allowed types ("~" inverts it), yes (none) or no."""
    values = [v for k, v in directives if k == "RestrictNamespaces"]
    if not values or values[-1].lower() in ("no", "false", "0", "off", ""):
        return None
    value = values[-1]
    if yes(value):
        allowed = set()
    else:
        names = set(value.lstrip("~").split())
        unknown = names - set(NAMESPACES)
        if unknown:
            raise SystemExit("unitjail: RestrictNamespaces=%s: unknown %s" % (value, " ".join(sorted(unknown))))
        allowed = set(NAMESPACES) - names if value.startswith("~") else names
    f = seccomp.SyscallFilter(seccomp.ALLOW)
    for name, flag in NAMESPACES.items():
        if name in allowed:
            continue
        add(f, seccomp.ERRNO(errno.EPERM), "unshare", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        add(f, seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        add(f, seccomp.ERRNO(errno.EPERM), "setns", seccomp.Arg(1, seccomp.MASKED_EQ, flag, flag))
    if allowed != set(NAMESPACES):
        add(f, seccomp.ERRNO(errno.EPERM), "setns", seccomp.Arg(1, seccomp.EQ, 0))  # "any type": refused
        add(f, seccomp.ERRNO(errno.ENOSYS), "clone3")
    return f


def bound_capabilities(directives):
    """CapabilityBoundingSet=: drops every capability the unit does not name (an empty value: all of them)."""
    values = [v for k, v in directives if k == "CapabilityBoundingSet"]
    if not values:
        return
    keep, drop = None, False
    for value in values:
        if value == "":
            keep, drop = set(), False
            continue
        invert = value.startswith("~")
        names = {w.upper() for w in value.lstrip("~").split()}
        if keep is None:
            keep, drop = names, invert
        elif drop == invert:
            keep |= names
        else:
            keep -= names
    last = 0
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    numbers = {name: n for n, name in enumerate(CAPABILITIES)}
    for name in keep:
        if name not in numbers:
            raise SystemExit("unitjail: CapabilityBoundingSet: unknown capability %s" % name)
    kept = {numbers[name] for name in keep}
    for cap in range(last + 1):
        if (cap in kept) == drop and _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            e = ctypes.get_errno()
            if e == errno.EPERM and os.geteuid() != 0:
                return  # not root: no capabilities to lose, and no CAP_SETPCAP to drop them with
            if e != errno.EINVAL:
                raise SystemExit("unitjail: PR_CAPBSET_DROP %d: %s" % (cap, os.strerror(e)))


# capability numbers, linux/capability.h
CAPABILITIES = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
                "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
                "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
                "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
                "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
                "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN",
                "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
                "CAP_CHECKPOINT_RESTORE"]


def main(argv):
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write(__doc__)
        return 2
    unit, cmd = argv[1], argv[3:]
    directives = service_section(unit)
    keys = {k for k, _ in directives}
    skipped = sorted(keys & NOT_EMULATED)
    if skipped:
        sys.stderr.write("unitjail: not emulated: %s\n" % " ".join(skipped))
    protect_system(directives)
    bound_capabilities(directives)
    if any(k == "NoNewPrivileges" and yes(v) for k, v in directives):
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise SystemExit("unitjail: PR_SET_NO_NEW_PRIVS: %s" % os.strerror(ctypes.get_errno()))
    filters = []
    ns = restrict_namespaces(directives)
    if ns is not None:
        filters.append(ns)
    if any(k == "ProtectHostname" and yes(v) for k, v in directives):
        f = seccomp.SyscallFilter(seccomp.ALLOW)
        add(f, seccomp.ERRNO(errno.EPERM), "sethostname")
        add(f, seccomp.ERRNO(errno.EPERM), "setdomainname")
        filters.append(f)

    families = [v for k, v in directives if k == "RestrictAddressFamilies"]
    if families:
        allow, fams = None, set()
        for value in families:
            if value == "":
                allow, fams = None, set()
                continue
            if value == "none":
                allow, fams = True, set()
                continue
            invert = value.startswith("~")
            names = {getattr(socket, w) for w in value.lstrip("~").split()}
            if allow is None:
                allow, fams = not invert, names
            elif allow:
                fams = fams - names if invert else fams | names
            else:
                fams = fams | names if invert else fams - names
        if allow is not None:
            f = seccomp.SyscallFilter(seccomp.ALLOW)
            af_max = 46  # AF_MAX on Linux 5.x/6.x; families beyond it do not exist yet
            for fam in range(af_max):
                if (fam in fams) != allow:
                    f.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.EQ, fam))
            if allow:
                f.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.GE, af_max))
            filters.append(f)

    if any(k == "MemoryDenyWriteExecute" and yes(v) for k, v in directives):
        f = seccomp.SyscallFilter(seccomp.ALLOW)
        wx = PROT_WRITE | PROT_EXEC
        add(f, seccomp.ERRNO(errno.EPERM), "mmap", seccomp.Arg(2, seccomp.MASKED_EQ, wx, wx))
        add(f, seccomp.ERRNO(errno.EPERM), "mprotect", seccomp.Arg(2, seccomp.MASKED_EQ, PROT_EXEC, PROT_EXEC))
        add(f, seccomp.ERRNO(errno.EPERM), "pkey_mprotect", seccomp.Arg(2, seccomp.MASKED_EQ, PROT_EXEC, PROT_EXEC))
        add(f, seccomp.ERRNO(errno.EPERM), "shmat", seccomp.Arg(2, seccomp.MASKED_EQ, SHM_EXEC, SHM_EXEC))
        filters.append(f)

    arches = [v for k, v in directives if k == "SystemCallArchitectures"]
    if arches and arches[-1] not in ("native", ""):
        raise SystemExit("unitjail: SystemCallArchitectures=%s is not emulated (only native)" % arches[-1])

    allow_list, names = syscall_sets([v for k, v in directives if k == "SystemCallFilter"])
    errnos = [v for k, v in directives if k == "SystemCallErrorNumber"]
    action = errno_action(errnos[-1] if errnos else None)
    if allow_list is not None:
        # loaded last: loading a filter is itself a system call the allow list need not contain
        f = seccomp.SyscallFilter(action if allow_list else seccomp.ALLOW)
        for name in sorted(names):
            add(f, seccomp.ALLOW if allow_list else action, name)
        filters.append(f)

    for f in filters:
        f.load()
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
