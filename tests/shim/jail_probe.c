/*
 * Test fixture for tests/shim/test_jail.py: a guest that bypasses Deno entirely and asks the
 * kernel directly for what the jail must refuse. Two modes:
 *
 *   jail_probe probe [--dir D] [--tcp-port P] [--unix-path S] [--only a,b,...] [--hold-ms N]
 *                    [--target-pid P]  (a host process to aim ptrace, kill and /proc reads at)
 *                    [--host-file host:F] (a host file to try to open; given with a prefix, because
 *                                      relay binds the absolute paths named in a command's arguments)
 *                    [--marker M]      (names what the probe creates, and finds it on the host)
 *                    [--term-comm]     (catch SIGTERM: rename the process "sb-term" and wait)
 *       Runs behind `sandbox-shim relay`: reads the init frame, tries every probe (or those named
 *       by --only), and sends one result frame whose output maps each probe to
 *       {ret, errno, detail}: `ret` is the system call's return value, `errno` its symbolic errno
 *       ("" on success), `detail` what was seen. Never asserts anything itself: the test does.
 *
 *   jail_probe deny-userns|deny-seccomp|deny-seccomp-load CMD ARGS...
 *       Execs CMD under a seccomp filter that makes this kernel look like one that refuses user
 *       namespaces (clone/unshare with CLONE_NEWUSER: EPERM, clone3: ENOSYS), seccomp itself
 *       (seccomp(2) and prctl(PR_SET_SECCOMP): EINVAL), or only the loading of a filter (the
 *       refusal then comes from inside the starting guest), for the fail-closed tests.
 *
 *   started by `sandbox-shim run --deno jail_probe` (argv[0] reads /runtime/deno): runs the probes
 *       of a Deno guest's filter (fork_once, thread, mmap_shared, mmap_private, fs_view) and answers.
 *
 * Built without sanitizers: it runs under the jail's filter, which refuses the ptrace that
 * LeakSanitizer needs at exit.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sys/fsuid.h>
#include <sys/resource.h>
#include <linux/if.h>
#include <linux/seccomp.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#include <msgpack.h>
#include <seccomp.h>

#define MAX_RESULTS 64

typedef struct st_result_t {
    const char *name;
    long ret;
    int err;
    char detail[1024];
} result_t;

static result_t results[MAX_RESULTS];

/* --term-comm: a guest that catches SIGTERM says so in its process name (which the host sees in
 * /proc/<pid>/comm: the jailed guest can write nowhere the host reads), then waits to be killed */
static void on_term(int sig)
{
    (void)sig;
    (void)prctl(PR_SET_NAME, "sb-term", 0, 0, 0);
    for (;;)
        pause();
}
static size_t nresults;
static const char *only;

static int wanted(const char *name)
{
    size_t n = strlen(name);
    if (only == NULL)
        return 1;
    for (const char *p = only; (p = strstr(p, name)) != NULL; p += n)
        if ((p == only || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
            return 1;
    return 0;
}

static result_t *add(const char *name, long ret, int err)
{
    result_t *r = &results[nresults < MAX_RESULTS ? nresults++ : MAX_RESULTS - 1];
    r->name = name;
    r->ret = ret;
    r->err = ret < 0 ? err : 0;
    r->detail[0] = '\0';
    return r;
}

/* the call is made before errno is read (argument evaluation order is unspecified) */
#define TRY(name, expr)                                                                                                            \
    ({                                                                                                                             \
        long r_ = (long)(expr);                                                                                                    \
        add((name), r_, errno);                                                                                                    \
    })

static ssize_t read_file(const char *path, char *buf, size_t bufsz)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n, got = 0;
    if (fd < 0)
        return -1;
    while ((size_t)got < bufsz - 1 && (n = read(fd, buf + got, bufsz - 1 - (size_t)got)) > 0)
        got += n;
    close(fd);
    buf[got] = '\0';
    return got;
}

/* the value of "Key:" in a /proc status file, whitespace trimmed */
static void status_field(const char *status, const char *key, char *out, size_t outsz)
{
    size_t kl = strlen(key);
    const char *p = status;
    out[0] = '\0';
    while (p != NULL && *p != '\0') {
        if (strncmp(p, key, kl) == 0 && p[kl] == ':') {
            const char *v = p + kl + 1, *e;
            while (*v == ' ' || *v == '\t')
                ++v;
            e = strchr(v, '\n');
            if (e == NULL)
                e = v + strlen(v);
            snprintf(out, outsz, "%.*s", (int)(e - v), v);
            return;
        }
        p = strchr(p, '\n');
        if (p != NULL)
            ++p;
    }
}

/* the shim: our parent, by its pid in the host's PID namespace (the one /proc is mounted for) */
/* the parent's pid as /proc shows it (0 in a PID namespace of its own), or -1 without a procfs */
static long shim_pid(void)
{
    char st[4096], v[32];
    if (read_file("/proc/self/status", st, sizeof(st)) < 0)
        return -1;
    status_field(st, "PPid", v, sizeof(v));
    return strtol(v, NULL, 10);
}

/* the credential part of /proc/self/status, from system calls (a jailed guest has no procfs) */
static void creds(char *out, size_t outsz)
{
    uid_t ru, eu, su;
    gid_t rg, eg, sgid, groups[64];
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    unsigned long long eff = 0, bnd = 0;
    int ng = getgroups(64, groups);
    size_t off;

    (void)getresuid(&ru, &eu, &su);
    (void)getresgid(&rg, &eg, &sgid);
    memset(data, 0, sizeof(data));
    if (syscall(SYS_capget, &hdr, data) == 0)
        eff = (unsigned long long)data[1].effective << 32 | data[0].effective;
    for (int c = 0; c < 64; ++c)
        if (prctl(PR_CAPBSET_READ, c, 0, 0, 0) == 1)
            bnd |= 1ull << c;
    /* setfsuid(-1) answers the fs uid without changing it, where the filter lets it through ("-" if not) */
    {
        char fsu[16], fsg[16];
        int fu = setfsuid((uid_t)-1), fg = setfsgid((gid_t)-1);
        snprintf(fsu, sizeof(fsu), fu < 0 ? "-" : "%u", (unsigned)fu);
        snprintf(fsg, sizeof(fsg), fg < 0 ? "-" : "%u", (unsigned)fg);
        off = (size_t)snprintf(out, outsz, "NoNewPrivs=%d Seccomp=%d Uid=%u\t%u\t%u\t%s Gid=%u\t%u\t%u\t%s Groups=",
                               prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0), prctl(PR_GET_SECCOMP, 0, 0, 0, 0), ru, eu, su, fsu, rg, eg,
                               sgid, fsg);
    }
    for (int i = 0; i < ng && off < outsz; ++i)
        off += (size_t)snprintf(out + off, outsz - off, "%u ", groups[i]);
    if (off < outsz)
        snprintf(out + off, outsz - off, " CapEff=%016llx CapBnd=%016llx", eff, bnd);
}

/* runs fn in a child and reports how the child ended */
static void in_child(const char *name, void (*fn)(void))
{
    int status = 0;
    pid_t pid = fork();
    result_t *r;
    if (pid == 0) {
        fn();
        _exit(0);
    }
    if (pid < 0) {
        add(name, -1, errno);
        return;
    }
    (void)waitpid(pid, &status, 0);
    r = add(name, 0, 0);
    if (WIFSIGNALED(status))
        snprintf(r->detail, sizeof(r->detail), "signal %d", WTERMSIG(status));
    else
        snprintf(r->detail, sizeof(r->detail), "exit %d", WEXITSTATUS(status));
}

/* child bodies: exit status 0 = the call returned an error, 1 = it succeeded */
static void x32_socket(void)
{
#ifdef __x86_64__
    long r = syscall(0x40000000L | SYS_socket, AF_INET, SOCK_STREAM, 0);
    _exit(r >= 0 ? 1 : 0);
#endif
}

static void i386_socket(void)
{
#ifdef __x86_64__
    long r;
    /* i386 socket(2) is number 359 */
    __asm__ volatile("int $0x80" : "=a"(r) : "a"(359L), "b"((long)AF_INET), "c"((long)SOCK_STREAM), "d"(0L) : "memory");
    _exit(r >= 0 ? 1 : 0);
#endif
}

static void traceme(void)
{
    _exit(ptrace(PTRACE_TRACEME, 0, NULL, NULL) == 0 ? 1 : (errno == EPERM ? 2 : 3));
}

static void probe_network(int tcp_port, const char *unix_path)
{
    int fd;
    result_t *r;

    if (wanted("socket_inet")) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        r = add("socket_inet", fd, errno);
        if (fd >= 0 && tcp_port > 0) {
            struct sockaddr_in sa;
            int c;
            memset(&sa, 0, sizeof(sa));
            sa.sin_family = AF_INET;
            sa.sin_port = htons((uint16_t)tcp_port);
            sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            c = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
            snprintf(r->detail, sizeof(r->detail), "connect: %s", c == 0 ? "connected" : strerrorname_np(errno));
        }
        if (fd >= 0)
            close(fd);
    }
    if (wanted("socket_inet6")) {
        fd = socket(AF_INET6, SOCK_DGRAM, 0);
        add("socket_inet6", fd, errno);
        if (fd >= 0)
            close(fd);
    }
    if (wanted("socket_netlink")) {
        fd = socket(AF_NETLINK, SOCK_RAW, 0 /* NETLINK_ROUTE */);
        add("socket_netlink", fd, errno);
        if (fd >= 0)
            close(fd);
    }
    if (wanted("socket_packet")) {
        fd = socket(AF_PACKET, SOCK_RAW, 0);
        add("socket_packet", fd, errno);
        if (fd >= 0)
            close(fd);
    }
    if (wanted("socket_unix")) {
        fd = socket(AF_UNIX, SOCK_STREAM, 0);
        r = add("socket_unix", fd, errno);
        if (fd >= 0 && unix_path != NULL) {
            struct sockaddr_un su;
            int c;
            memset(&su, 0, sizeof(su));
            su.sun_family = AF_UNIX;
            snprintf(su.sun_path, sizeof(su.sun_path), "%s", unix_path);
            c = connect(fd, (struct sockaddr *)&su, sizeof(su));
            snprintf(r->detail, sizeof(r->detail), "connect: %s", c == 0 ? "connected" : strerrorname_np(errno));
        }
        if (fd >= 0)
            close(fd);
    }
    if (wanted("socketpair_unix")) {
        int sv[2];
        int rc = socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
        add("socketpair_unix", rc, errno);
        if (rc == 0) {
            close(sv[0]);
            close(sv[1]);
        }
    }
    if (wanted("interfaces")) {
        /* every interface of the reader's network namespace by index (a jailed guest has no procfs),
         * names and flags through an AF_UNIX socket: the one family the filter allows */
        int s = socket(AF_UNIX, SOCK_DGRAM, 0);
        size_t off = 0;
        r = add("interfaces", s, errno);
        for (int idx = 1; s >= 0 && idx < 4096 && off < sizeof(r->detail); ++idx) {
            struct ifreq ifr;
            memset(&ifr, 0, sizeof(ifr));
            ifr.ifr_ifindex = idx;
            if (ioctl(s, SIOCGIFNAME, &ifr) != 0)
                continue;
            if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0)
                off += (size_t)snprintf(r->detail + off, sizeof(r->detail) - off, "%s%s:%s", off ? " " : "", ifr.ifr_name,
                                        (ifr.ifr_flags & IFF_UP) ? "up" : "down");
            else
                off += (size_t)snprintf(r->detail + off, sizeof(r->detail) - off, "%s%s:?", off ? " " : "", ifr.ifr_name);
        }
        if (s >= 0) {
            r->ret = 0;
            close(s);
        }
    }
}

static void probe_processes(long shim, unsigned bomb_cap)
{
    result_t *r;
    char buf[8192];

    if (wanted("ptrace_attach")) {
        long rc = ptrace(PTRACE_ATTACH, (pid_t)shim, NULL, NULL);
        r = add("ptrace_attach", rc, errno);
        snprintf(r->detail, sizeof(r->detail), "target %ld", shim);
        if (rc == 0)
            (void)ptrace(PTRACE_DETACH, (pid_t)shim, NULL, NULL);
    }
    if (wanted("ptrace_traceme"))
        in_child("ptrace_traceme", traceme);
    if (wanted("process_vm_readv")) {
        char dst[16];
        struct iovec l = {dst, sizeof(dst)}, rv = {(void *)0x400000, sizeof(dst)};
        TRY("process_vm_readv", (long)process_vm_readv((pid_t)shim, &l, 1, &rv, 1, 0));
    }
    if (wanted("kill_shim")) {
        /* pid numbers outside our PID namespace name nothing in it */
        r = TRY("kill_shim", kill((pid_t)shim, 0));
        snprintf(r->detail, sizeof(r->detail), "target %ld", shim);
    }
    if (wanted("shim_environ")) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%ld/environ", shim);
        r = TRY("shim_environ", (long)read_file(path, buf, sizeof(buf)));
        snprintf(r->detail, sizeof(r->detail), "%s", path);
    }
    if (wanted("fork_bomb")) {
        /* fork until the kernel says no; every child just waits to be killed */
        unsigned forked = 0;
        int e = 0;
        for (;;) {
            pid_t p = fork();
            if (p == 0) {
                for (;;)
                    pause();
            }
            if (p < 0) {
                e = errno;
                break;
            }
            if (++forked >= bomb_cap) {
                e = 0;
                break;
            }
        }
        r = add("fork_bomb", e != 0 ? -1 : 0, e);
        snprintf(r->detail, sizeof(r->detail), "%u", forked);
        /* the children stay until the end (main), so that concurrent runs overlap */
    }
}

static void probe_files(const char *dir)
{
    char path[512];
    static char chunk[1 << 20];
    result_t *r;

    if (wanted("write_1g") && dir != NULL) {
        int fd;
        unsigned long long written = 0;
        int e = 0;
        /* RLIMIT_FSIZE raises SIGXFSZ; ignored, the write fails with EFBIG instead */
        signal(SIGXFSZ, SIG_IGN);
        snprintf(path, sizeof(path), "%s/big.bin", dir);
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) {
            add("write_1g", -1, errno);
        } else {
            memset(chunk, 'x', sizeof(chunk));
            while (written < (1ull << 30)) {
                ssize_t n = write(fd, chunk, sizeof(chunk));
                if (n < 0) {
                    e = errno;
                    break;
                }
                written += (unsigned long long)n;
            }
            close(fd);
            (void)unlink(path);
            r = add("write_1g", e != 0 ? -1 : 0, e);
            snprintf(r->detail, sizeof(r->detail), "%llu", written);
        }
    }
    if (wanted("mount")) {
        snprintf(path, sizeof(path), "%s", dir != NULL ? dir : "/tmp");
        TRY("mount", mount("none", path, "tmpfs", 0, NULL));
    }
}

/* what a guest past its runtime sees of the filesystem, and where it can leave something */
static void probe_view(const char *host_file, const char *marker)
{
    static const char *const dirs[] = {"/", "/tmp", "/proc", "/dev", "/etc", "/home", "/var", "/work"};
    static const char *const targets[] = {"/",     "/tmp", "/var/tmp", "/dev/shm", "/dev", "/work",
                                          "/proc", "/etc", "/home",    "/root",    "/usr", "/run"};
    char buf[4096];
    result_t *r;

    if (wanted("fs_view")) {
        size_t off = 0;
        r = add("fs_view", 0, 0);
        for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); ++i) {
            DIR *d = opendir(dirs[i]);
            struct dirent *de;
            off += (size_t)snprintf(r->detail + off, sizeof(r->detail) - off, "%s%s=", i ? ";" : "", dirs[i]);
            if (d == NULL) {
                off += (size_t)snprintf(r->detail + off, sizeof(r->detail) - off, "!%s", strerrorname_np(errno));
                continue;
            }
            while ((de = readdir(d)) != NULL && off < sizeof(r->detail))
                if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
                    off += (size_t)snprintf(r->detail + off, sizeof(r->detail) - off, "%s,", de->d_name);
            closedir(d);
        }
    }
    if (wanted("host_file") && host_file != NULL) {
        const char *path = strncmp(host_file, "host:", 5) == 0 ? host_file + 5 : host_file;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        r = add("host_file", fd, errno);
        if (fd >= 0) {
            ssize_t n = read(fd, r->detail, sizeof(r->detail) - 1);
            r->detail[n > 0 ? n : 0] = '\0';
            close(fd);
        }
    }
    if (wanted("proc1_cmdline")) {
        ssize_t n = read_file("/proc/1/cmdline", buf, sizeof(buf));
        r = add("proc1_cmdline", n, errno);
        for (ssize_t i = 0; i < n; ++i)
            if (buf[i] == '\0')
                buf[i] = ' ';
        snprintf(r->detail, sizeof(r->detail), "%.1000s", n > 0 ? buf : "");
    }
    if (wanted("write_out") && marker != NULL) {
        size_t off = 0;
        long made = 0;
        r = add("write_out", 0, 0);
        for (size_t i = 0; i < sizeof(targets) / sizeof(targets[0]); ++i) {
            char path[256];
            int fd;
            snprintf(path, sizeof(path), "%s/sb-probe-%s", strcmp(targets[i], "/") == 0 ? "" : targets[i], marker);
            fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
            if (fd >= 0) {
                (void)!write(fd, "x", 1);
                close(fd);
                ++made;
                off += (size_t)snprintf(r->detail + off, sizeof(r->detail) - off, "%s ", targets[i]);
            }
        }
        r->ret = made;
    }
    if (wanted("mqueue") && marker != NULL) {
        char name[128];
        snprintf(name, sizeof(name), "sb-probe-%s", marker);
        r = TRY("mqueue", syscall(SYS_mq_open, name, O_CREAT | O_RDWR, 0600, NULL));
    }
    if (wanted("ptmx"))
        TRY("ptmx", open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (wanted("memfd"))
        TRY("memfd", syscall(SYS_memfd_create, "probe", 0));
    if (wanted("shmget"))
        TRY("shmget", syscall(SYS_shmget, 0 /* IPC_PRIVATE */, 4096, 01600 /* IPC_CREAT | 0600 */));
}

static void *thread_body(void *arg)
{
    return arg;
}

/* what the seccomp filter lets a guest start and map */
static void probe_spawn(void)
{
    if (wanted("fork_once")) {
        pid_t p = fork();
        if (p == 0)
            _exit(0);
        add("fork_once", p, errno);
        if (p > 0)
            (void)waitpid(p, NULL, 0);
    }
    if (wanted("thread")) {
        pthread_t t;
        int rc = pthread_create(&t, NULL, thread_body, NULL);
        add("thread", rc == 0 ? 0 : -1, rc);
        if (rc == 0)
            (void)pthread_join(t, NULL);
    }
    if (wanted("mmap_shared")) {
        void *m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        add("mmap_shared", m == MAP_FAILED ? -1 : 0, errno);
    }
    if (wanted("mmap_devzero")) {
        /* a shared writable mapping of /dev/zero is shared anonymous memory, outside RLIMIT_DATA */
        int fd = open("/dev/zero", O_RDWR | O_CLOEXEC);
        void *m = fd < 0 ? MAP_FAILED : mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        add("mmap_devzero", m == MAP_FAILED ? -1 : 0, errno);
        if (fd >= 0)
            close(fd);
    }
    if (wanted("mmap_private")) {
        void *m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        add("mmap_private", m == MAP_FAILED ? -1 : 0, errno);
    }
}

static void probe_kernel(void)
{
    char v[256];
    result_t *r;

    if (wanted("status")) {
        r = add("status", 0, 0);
        creds(r->detail, sizeof(r->detail));
    }
    if (wanted("pdeathsig")) {
        int sig = -1;
        r = TRY("pdeathsig", prctl(PR_GET_PDEATHSIG, &sig, 0, 0, 0));
        snprintf(r->detail, sizeof(r->detail), "%d", sig);
    }
    /* what would undo the jail from inside: refused; naming a thread: allowed (Deno does it) */
    if (wanted("prctl")) {
        TRY("prctl_pdeathsig_0", prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0));
        TRY("prctl_dumpable", prctl(PR_SET_DUMPABLE, 1, 0, 0, 0));
        TRY("prctl_subreaper", prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0));
        TRY("prctl_ptracer", prctl(0x59616d61 /* PR_SET_PTRACER */, -1L, 0, 0, 0));
        TRY("prctl_set_name", prctl(PR_SET_NAME, "probe-named", 0, 0, 0));
        TRY("prctl_pdeathsig_kill", prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0));
    }
    if (wanted("rlimit_cpu")) {
        struct rlimit rl;
        r = TRY("rlimit_cpu", getrlimit(RLIMIT_CPU, &rl));
        if (rl.rlim_cur == RLIM_INFINITY)
            snprintf(r->detail, sizeof(r->detail), "unlimited");
        else
            snprintf(r->detail, sizeof(r->detail), "%llu %llu", (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max);
    }
    if (wanted("uid_map")) {
        r = TRY("uid_map", read_file("/proc/self/uid_map", v, sizeof(v)) < 0 ? -1 : 0);
        snprintf(r->detail, sizeof(r->detail), "%s", v);
        r = TRY("gid_map", read_file("/proc/self/gid_map", v, sizeof(v)) < 0 ? -1 : 0);
        snprintf(r->detail, sizeof(r->detail), "%s", v);
    }
    if (wanted("namespaces")) {
        static const char *const ns[] = {"user", "pid", "net", "ipc", "uts", "cgroup", "mnt"};
        size_t off = 0;
        r = add("namespaces", 0, 0);
        for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]) && off < sizeof(r->detail); ++i) {
            char path[64], link[128];
            ssize_t n;
            snprintf(path, sizeof(path), "/proc/self/ns/%s", ns[i]);
            n = readlink(path, link, sizeof(link) - 1);
            link[n > 0 ? n : 0] = '\0';
            off += (size_t)snprintf(r->detail + off, sizeof(r->detail) - off, "%s%s", off ? " " : "", link);
        }
    }
    if (wanted("hostname")) {
        struct utsname u;
        r = TRY("hostname", uname(&u));
        snprintf(r->detail, sizeof(r->detail), "%s", r->ret == 0 ? u.nodename : "");
    }
    if (wanted("unshare"))
        TRY("unshare", unshare(CLONE_NEWNET));
    if (wanted("clone_newuser")) {
        long p = syscall(SYS_clone, (unsigned long)(CLONE_NEWUSER | SIGCHLD), NULL, NULL, NULL, NULL);
        int e = errno;
        if (p == 0)
            _exit(0);
        if (p > 0)
            (void)waitpid((pid_t)p, NULL, 0);
        add("clone_newuser", p, e);
    }
    if (wanted("clone3")) {
        struct clone_args ca;
        long p;
        int e;
        memset(&ca, 0, sizeof(ca));
        ca.exit_signal = SIGCHLD;
        p = syscall(SYS_clone3, &ca, sizeof(ca));
        e = errno;
        if (p == 0)
            _exit(0);
        if (p > 0)
            (void)waitpid((pid_t)p, NULL, 0);
        add("clone3", p, e);
    }
    if (wanted("setsid"))
        TRY("setsid", (long)setsid());
    if (wanted("bpf"))
        TRY("bpf", syscall(SYS_bpf, 0 /* BPF_MAP_CREATE */, NULL, 0));
    if (wanted("perf_event_open"))
        TRY("perf_event_open", syscall(SYS_perf_event_open, NULL, 0, -1, -1, 0));
    if (wanted("keyctl"))
        TRY("keyctl", syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -3 /* session */, 0));
    if (wanted("userfaultfd"))
        TRY("userfaultfd", syscall(SYS_userfaultfd, 0));
    if (wanted("io_uring_setup"))
        TRY("io_uring_setup", syscall(SYS_io_uring_setup, 1, NULL));
    if (wanted("unreviewed_syscall"))
        TRY("unreviewed_syscall", syscall(470));
    if (wanted("x32_abi"))
        in_child("x32_abi", x32_socket);
    if (wanted("i386_abi"))
        in_child("i386_abi", i386_socket);
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    (void)msgpack_pack_str_with_body(pk, s, strlen(s));
}

static int write_full(int fd, const void *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p = (const char *)p + w;
        n -= (size_t)w;
    }
    return 0;
}

static int send_result(void)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    uint8_t *p;
    size_t n;
    int rc;

    msgpack_sbuffer_init(&sb);
    (void)msgpack_sbuffer_write(&sb, "\0\0\0\0", 4);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    (void)msgpack_pack_map(&pk, 4);
    pack_str(&pk, "t");
    pack_str(&pk, "result");
    pack_str(&pk, "ok");
    (void)msgpack_pack_true(&pk);
    pack_str(&pk, "logs");
    (void)msgpack_pack_array(&pk, 0);
    pack_str(&pk, "output");
    (void)msgpack_pack_map(&pk, nresults);
    for (size_t i = 0; i < nresults; ++i) {
        pack_str(&pk, results[i].name);
        (void)msgpack_pack_map(&pk, 3);
        pack_str(&pk, "ret");
        (void)msgpack_pack_int64(&pk, results[i].ret);
        pack_str(&pk, "errno");
        pack_str(&pk, results[i].err != 0 ? strerrorname_np(results[i].err) : "");
        pack_str(&pk, "detail");
        pack_str(&pk, results[i].detail);
    }
    n = sb.size - 4;
    p = (uint8_t *)sb.data;
    p[0] = (uint8_t)(n >> 24);
    p[1] = (uint8_t)(n >> 16);
    p[2] = (uint8_t)(n >> 8);
    p[3] = (uint8_t)n;
    rc = write_full(1, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

/* reads and drops the init frame */
static int skip_init(void)
{
    uint8_t h[4], buf[4096];
    size_t n, got = 0;
    ssize_t r;
    while (got < 4 && (r = read(0, h + got, 4 - got)) > 0)
        got += (size_t)r;
    if (got < 4)
        return -1;
    n = (size_t)h[0] << 24 | (size_t)h[1] << 16 | (size_t)h[2] << 8 | h[3];
    while (n > 0 && (r = read(0, buf, n < sizeof(buf) ? n : sizeof(buf))) > 0)
        n -= (size_t)r;
    return n == 0 ? 0 : -1;
}

static int deny(const char *mode, char **cmd)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    int rc = 0;

    if (ctx == NULL)
        return 1;
    if (strcmp(mode, "deny-userns") == 0) {
        rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                               SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
        rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 1,
                               SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
        rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    } else if (strcmp(mode, "deny-seccomp") == 0) {
        rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EINVAL), SCMP_SYS(seccomp), 0);
        rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EINVAL), SCMP_SYS(prctl), 1, SCMP_A0(SCMP_CMP_EQ, PR_SET_SECCOMP));
    } else if (strcmp(mode, "deny-seccomp-load") == 0) {
        /* only the load itself (no flags, as the jail loads it): every feature probe still works */
        rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EINVAL), SCMP_SYS(seccomp), 2, SCMP_A0(SCMP_CMP_EQ, SECCOMP_SET_MODE_FILTER),
                               SCMP_A1(SCMP_CMP_EQ, 0));
        rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EINVAL), SCMP_SYS(prctl), 1, SCMP_A0(SCMP_CMP_EQ, PR_SET_SECCOMP));
    } else {
        fprintf(stderr, "jail_probe: unknown mode %s\n", mode);
        return 2;
    }
    if (rc != 0 || seccomp_load(ctx) != 0) {
        fprintf(stderr, "jail_probe: cannot load the %s filter\n", mode);
        return 1;
    }
    seccomp_release(ctx);
    execvp(cmd[0], cmd);
    fprintf(stderr, "jail_probe: cannot execute %s: %s\n", cmd[0], strerror(errno));
    return 127;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *unix_path = NULL, *host_file = NULL, *marker = NULL;
    int term_comm = 0;
    long target = -2;
    int tcp_port = 0;
    unsigned bomb_cap = 4096, hold_ms = 0;
    long shim;

    if (argc >= 3 && strncmp(argv[1], "deny-", 5) == 0)
        return deny(argv[1], argv + 2);
    if (strcmp(argv[0], "/runtime/deno") == 0) {
        only = "fork_once,thread,mmap_shared,mmap_devzero,mmap_private,prctl,fs_view";
        if (skip_init() != 0)
            return 3;
        probe_spawn();
        probe_kernel();
        probe_view(NULL, NULL);
        return send_result() == 0 ? 0 : 4;
    }
    if (argc < 2 || strcmp(argv[1], "probe") != 0) {
        fprintf(stderr, "usage: jail_probe probe [--dir D] [--tcp-port P] [--unix-path S] [--only a,b] [--hold-ms N] | "
                        "jail_probe deny-userns|deny-seccomp CMD ARGS...\n");
        return 2;
    }
    for (int i = 2; i < argc; i += 2) {
        if (strcmp(argv[i], "--term-comm") == 0) {
            term_comm = 1;
            --i;
            continue;
        }
        if (i + 1 >= argc)
            break;
        if (strcmp(argv[i], "--dir") == 0)
            dir = argv[i + 1];
        else if (strcmp(argv[i], "--tcp-port") == 0)
            tcp_port = (int)strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--unix-path") == 0)
            unix_path = argv[i + 1];
        else if (strcmp(argv[i], "--only") == 0)
            only = argv[i + 1];
        else if (strcmp(argv[i], "--bomb-cap") == 0)
            bomb_cap = (unsigned)strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--hold-ms") == 0)
            hold_ms = (unsigned)strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--target-pid") == 0)
            target = strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--host-file") == 0)
            host_file = argv[i + 1];
        else if (strcmp(argv[i], "--marker") == 0)
            marker = argv[i + 1];
    }
    if (term_comm)
        signal(SIGTERM, on_term);
    if (skip_init() != 0)
        return 3;
    shim = target != -2 ? target : shim_pid();
    probe_kernel();
    probe_view(host_file, marker);
    probe_spawn();
    probe_network(tcp_port, unix_path);
    probe_files(dir);
    probe_processes(shim, bomb_cap);
    if (hold_ms > 0)
        usleep((useconds_t)hold_ms * 1000u);
    /* as pid 1 of our namespace, kill(-1) reaches every other process in it (the fork bomb) */
    if (getpid() == 1) {
        (void)kill(-1, SIGKILL);
        while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
            ;
    }
    return send_result() == 0 ? 0 : 4;
}
