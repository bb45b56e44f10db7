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
with namespaces (ProtectHome=, PrivateDevices=, ...) and the remaining
seccomp-based ones (RestrictNamespaces=, LockPersonality=, RestrictRealtime=,
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

NOT_EMULATED = {"RestrictNamespaces", "LockPersonality", "RestrictRealtime", "RestrictSUIDSGID", "ProtectHome",
                "PrivateTmp", "PrivateDevices", "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
                "ProtectControlGroups", "ProtectClock", "ProtectHostname", "CapabilityBoundingSet",
                "AmbientCapabilities", "NoNewPrivileges", "UMask", "User", "Group"}
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
    filters = []

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

    if any(k == "MemoryDenyWriteExecute" and v.lower() in ("yes", "true", "1", "on") for k, v in directives):
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
