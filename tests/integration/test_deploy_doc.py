"""deploy/README.md, "One machine, step by step", followed as written.

The ```sh blocks of that section are read from the document and run in order, in one bash, as
root, so the document cannot drift from what works. They run in private mount, network and PID
namespaces: /etc, /var/log, /var/lib/{postgresql,redis,nginx}, /usr/local/bin, /run and /tmp are
copies or empty file systems private to the run, the network is a loopback of its own (the
document's fixed ports collide with nothing), and every process the steps start ends with the
namespace. Nothing on the machine is changed.

What the document does that a test cannot do is replaced, and only that, each by one exact line
(SUBSTITUTE below, every one asserted present in the document): installing packages (checked
installed instead), building (the binaries of this build are used), downloading Deno (the one the
tests use is mounted at /usr/local/bin/deno). `sudo` is the root shell itself. systemd is not PID
1 here: `systemctl` starts each service as its unit would (SERVICES), the broker's and serve's from
the unit files the document installed (User=, EnvironmentFile=, LoadCredential=, RuntimeDirectory=,
LogsDirectory=, ExecStartPre=, ExecStart=).

Needs root, unshare, Debian 12's redis-server, postgresql and nginx, and Deno; SKIP otherwise (a
failure with SB_TEST_NO_SKIP=1).
"""
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("SB_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
BIN_DIR = os.environ.get("SB_BIN_DIR") or os.path.join(SOURCE_DIR, "build", "bin")
DOC = os.path.join(SOURCE_DIR, "deploy", "README.md")
SECTION = "## One machine, step by step"
PG_VERSION = "15"

# a line of the document -> what runs instead (None: the line as written)
SUBSTITUTE = {
    "sudo apt-get install -y redis-server postgresql nginx curl unzip libh2o-evloop0.13 libmsgpackc2 libc-ares2 "
    "libssl3 libpq5 libhiredis0.14 libjansson4 libidn2-0 libseccomp2":
        "for p in redis-server postgresql nginx curl; do dpkg -s $p >/dev/null; done",
    "cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSB_TESTS=OFF": "true  # built already",
    'cmake --build build -j"$(nproc)" --target sandbox-broker sandbox-shim': "true  # built already",
    "curl -fsSLo /tmp/deno.zip https://github.com/denoland/deno/releases/download/v2.9.6/"
    "deno-x86_64-unknown-linux-gnu.zip": "true  # no download here",
    "sudo unzip -o -d /usr/local/bin /tmp/deno.zip deno && sudo chmod 0755 /usr/local/bin/deno":
        'touch /usr/local/bin/deno && mount --bind "$SB_TEST_DENO" /usr/local/bin/deno',
}

PRELUDE = r'''
set -euo pipefail
# the root shell: sudo is the command itself, sudo -u runs it as that user
sudo() { if [ "$1" = "-u" ]; then local u="$2"; shift 2; runuser -u "$u" -- "$@"; else "$@"; fi; }
systemctl() { "$SB_TEST_PYTHON" "$SB_TEST_SELF" --systemctl "$@"; }
'''


def skip(why):
    if os.environ.get("SB_TEST_NO_SKIP") == "1":
        print("Bail out! %s (SB_TEST_NO_SKIP=1)" % why, flush=True)
        sys.exit(1)
    print("1..0 # SKIP %s" % why, flush=True)
    sys.exit(77)


def blocks():
    text = open(DOC).read()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end >= 0 else len(text)]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def script():
    out, seen = [PRELUDE], set()
    for i, b in enumerate(blocks(), 1):
        out.append('echo "### block %d" >&2' % i)
        for line in b.splitlines():
            if line in SUBSTITUTE:
                seen.add(line)
                line = SUBSTITUTE[line]
            out.append(line)
    missing = set(SUBSTITUTE) - seen
    if missing:
        raise AssertionError("the document no longer has these lines the test replaces: %r" % sorted(missing))
    return "\n".join(out) + "\n"


# ---- by-hand services (the systemctl of this run) ----

def wait_port(port, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("nothing listens on %d" % port)


def pid_alive(pidfile):
    try:
        pid = int(open(pidfile).read().split()[0])
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError, IndexError):
        return None


def stop_pidfile(pidfile):
    pid = pid_alive(pidfile)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        for _ in range(300):
            if pid_alive(pidfile) is None:
                break
            time.sleep(0.05)


def unit(name):
    """the [Service] settings of /etc/systemd/system/NAME.service, continuation lines joined"""
    text = open("/etc/systemd/system/%s.service" % name).read().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")) and "=" in line:
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def unit_env(u):
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    for f in u.get("EnvironmentFile", []):
        optional = f.startswith("-")
        f = f.lstrip("-")
        if not os.path.exists(f) and optional:
            continue
        for line in open(f).read().splitlines():
            line = line.strip()
            if line and not line.startswith(("#", ";")):
                k, v = line.split("=", 1)
                env[k.strip()] = v.strip()
    return env


def expand(cmd, env):
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), cmd)


def start_unit(name):
    u = unit(name)
    env = unit_env(u)
    user = u.get("User", ["root"])[0]
    for d in u.get("RuntimeDirectory", []):
        mode = int(u.get("RuntimeDirectoryMode", ["0755"])[0], 8)
        os.makedirs("/run/" + d, exist_ok=True)
        os.chmod("/run/" + d, mode)
        shutil.chown("/run/" + d, user, None)
    for d in u.get("LogsDirectory", []):
        mode = int(u.get("LogsDirectoryMode", ["0755"])[0], 8)
        os.makedirs("/var/log/" + d, exist_ok=True)
        os.chmod("/var/log/" + d, mode)
        shutil.chown("/var/log/" + d, user, user)
    creds = u.get("LoadCredential", [])
    if creds:
        cdir = "/run/credentials/%s.service" % name
        os.makedirs(cdir, exist_ok=True)
        for c in creds:
            cname, path = c.split(":", 1)
            shutil.copyfile(path, os.path.join(cdir, cname))
            os.chmod(os.path.join(cdir, cname), 0o400)
            shutil.chown(os.path.join(cdir, cname), user, None)
        env["CREDENTIALS_DIRECTORY"] = cdir
    pre = ["runuser", "-u", user, "--"] if user != "root" else []
    for cmd in u.get("ExecStartPre", []):
        argv = shlex.split(expand(cmd.lstrip("-"), env))
        p = subprocess.run(pre + argv, env=env, capture_output=True, text=True, timeout=120)
        sys.stderr.write(p.stdout + p.stderr)
        if p.returncode != 0 and not cmd.startswith("-"):
            raise RuntimeError("%s: ExecStartPre exited %d" % (name, p.returncode))
    argv = shlex.split(expand(u["ExecStart"][0], env))
    log = open("/var/log/%s.journal" % name, "ab")
    proc = subprocess.Popen(pre + argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True)
    with open("/run/%s.by-hand.pid" % name, "w") as f:
        f.write(str(proc.pid))
    time.sleep(0.5)
    if proc.poll() is not None:
        raise RuntimeError("%s exited at once (%d):\n%s" % (name, proc.returncode,
                                                             open("/var/log/%s.journal" % name).read()))


def redis_start():
    os.makedirs("/run/redis", exist_ok=True)
    shutil.chown("/run/redis", "redis", "redis")
    subprocess.run(["runuser", "-u", "redis", "--", "redis-server", "/etc/redis/redis.conf"], check=True)
    wait_port(6379)


SERVICES = {
    "redis-server": {"start": redis_start, "stop": lambda: stop_pidfile("/run/redis/redis-server.pid")},
    "postgresql": {"start": lambda: (subprocess.run(["pg_ctlcluster", PG_VERSION, "main", "start"], check=True),
                                     wait_port(5432)),
                   "stop": lambda: subprocess.run(["pg_ctlcluster", PG_VERSION, "main", "stop"], check=False)},
    "nginx": {"start": lambda: (subprocess.run(["nginx"], check=True), wait_port(8443)),
              "stop": lambda: subprocess.run(["nginx", "-s", "quit"], check=False),
              "reload": lambda: subprocess.run(["nginx", "-s", "reload"], check=True),
              "running": lambda: pid_alive("/run/nginx.pid") is not None},
}


def systemctl(args):
    args = [a for a in args if a not in ("--now", "-q", "--quiet")]
    if args == ["daemon-reload"]:
        return
    verb, names = args[0], args[1:]
    for name in names:
        name = name[:-len(".service")] if name.endswith(".service") else name
        svc = SERVICES.get(name)
        if svc is None:
            svc = {"start": lambda n=name: start_unit(n),
                   "stop": lambda n=name: stop_pidfile("/run/%s.by-hand.pid" % n),
                   "running": lambda n=name: pid_alive("/run/%s.by-hand.pid" % n) is not None}
        running = svc.get("running", lambda: False)()
        if verb in ("enable", "start"):
            if not running:
                svc["start"]()
        elif verb == "restart":
            svc["stop"]()
            svc["start"]()
        elif verb == "reload":
            svc["reload"]() if "reload" in svc else None
        else:
            raise SystemExit("systemctl %s: not something this document should need" % verb)


# ---- the private machine ----

def inside(deno):
    """in the new namespaces (PID 1 here): private copies of what the steps write, then the steps"""
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    # the checkout, the build and Deno may live under /tmp (a clone made by mktemp -d): held by
    # descriptors before /tmp is replaced, then bound back at their paths on the new one
    keep = {}
    for path in sorted({os.path.realpath(p) for p in (SOURCE_DIR, BIN_DIR, os.path.dirname(deno))}):
        if path.startswith("/tmp/") and not any(path.startswith(k + "/") for k in keep):
            keep[path] = os.open(path, os.O_PATH | os.O_DIRECTORY)
    for d in ("/etc", "/var/log", "/var/lib/postgresql", "/var/lib/redis", "/var/lib/nginx"):
        copy = tempfile.mkdtemp(prefix="sb-deploy-copy-")
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", copy], check=True)
        subprocess.run(["cp", "-a", d + "/.", copy], check=True)
        subprocess.run(["mount", "--bind", copy, d], check=True)
    for d, mode in (("/run", "0755"), ("/tmp", "1777"), ("/usr/local/bin", "0755")):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=" + mode, "tmpfs", d], check=True)
    for path, fd in keep.items():
        os.makedirs(path, mode=0o755, exist_ok=True)
        for parent in range(2, path.count("/") + 1):  # the users the steps switch to must reach it
            os.chmod("/".join(path.split("/")[:parent]), 0o755)
        # --no-canonicalize: the magic link must not be resolved back to the (now hidden) path it names
        subprocess.run(["mount", "--no-canonicalize", "--bind", "/proc/%d/fd/%d" % (os.getpid(), fd), path], check=True)
        os.close(fd)
    os.makedirs("/run/postgresql", mode=0o2775)
    shutil.chown("/run/postgresql", "postgres", "postgres")
    if not os.path.isdir("/etc/postgresql/%s/main" % PG_VERSION):
        # what the postgresql package's installation does when it makes its first cluster
        subprocess.run(["pg_createcluster", PG_VERSION, "main"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    work = tempfile.mkdtemp(prefix="sb-deploy-")
    os.chmod(work, 0o755)  # the checkout: readable by the users the steps switch to
    os.symlink(os.path.join(SOURCE_DIR, "deploy"), os.path.join(work, "deploy"))
    os.makedirs(os.path.join(work, "build"))
    os.symlink(BIN_DIR, os.path.join(work, "build", "bin"))
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
           "SB_TEST_DENO": deno, "SB_TEST_PYTHON": sys.executable, "SB_TEST_SELF": os.path.abspath(__file__),
           "SB_SOURCE_DIR": SOURCE_DIR, "SB_BIN_DIR": BIN_DIR}
    p = subprocess.run(["bash", "-c", script()], cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    print(p.stdout, flush=True)
    for name in ("sandbox-broker", "sandbox-shim-serve"):
        path = "/var/log/%s.journal" % name
        if p.returncode != 0 and os.path.exists(path):
            print("---- %s ----\n%s" % (path, open(path).read()[-6000:]), flush=True)
    return p.returncode, p.stdout


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--systemctl":
        systemctl(sys.argv[2:])
        return
    if len(sys.argv) >= 3 and sys.argv[1] == "--inside":
        rc, out = inside(sys.argv[2])
        sys.exit(rc)
    if os.geteuid() != 0:
        skip("needs root (CI runs as root)")
    for exe in ("unshare", "redis-server", "nginx", "pg_ctlcluster", "runuser", "curl"):
        if shutil.which(exe) is None:
            skip("%s is not installed (scripts/install-deps.sh --test)" % exe)
    deno = os.environ.get("SB_DENO") or os.path.join(os.environ.get("SB_NODE_PREFIX", "/nonexistent"), "node_modules",
                                                        ".bin", "deno")
    if not os.access(deno, os.X_OK):
        skip("deno not found: set SB_DENO or SB_NODE_PREFIX")
    script()  # the substitutions still match the document, before anything runs
    p = subprocess.run(["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc", "--", sys.executable,
                        os.path.abspath(__file__), "--inside", os.path.realpath(deno)],
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=900)
    print("\n".join("# " + line for line in p.stdout.splitlines()), flush=True)
    ok = p.returncode == 0 and re.search(r'^\{"ok":true,"output":1,', p.stdout, re.M) is not None
    print("%s 1 - deploy/README.md, \"One machine, step by step\", as written: a guest run through nginx, the broker "
          "and serve" % ("ok" if ok else "not ok"), flush=True)
    print("1..1", flush=True)
    sys.exit(0 if ok else 1)


main()
