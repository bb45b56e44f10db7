/*
 * Guest process spawning (see child.h).
 */
#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "jail/child.h"

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* the descriptors and state the child needs; set up by the parent before fork/clone */
typedef struct st_child_args_t {
    const sb_shim_spawn_t *sp;
    const sb_shim_jail_run_t *run; /* NULL: no jail */
    int in_r, out_w, err_w;
    int errpipe;     /* child -> parent: an sb_shim_jail_fail_t on failure; EOF on exec */
    int sync;        /* jailed: socket to the parent; "r" when ready, then waits for "g"; its hang-up means the parent died */
    const char *exe; /* what to execve: sp->path, or its path inside the jailed guest's root */
    pid_t parent;
} child_args_t;

static void child_fail(const child_args_t *a, int stage, int err)
{
    sb_shim_jail_fail_t f;
    f.stage = stage;
    f.err = err;
    (void)!write(a->errpipe, &f, sizeof(f));
    _exit(127);
}

/* room for the module path's listeners in one SCM_RIGHTS message */
typedef union {
    char buf[CMSG_SPACE(sizeof(int) * SB_SHIM_MAX_LISTEN)];
    struct cmsghdr align;
} listen_cmsg_t;

/*
 * In the jailed child, still privileged in its own user namespace: brings up the loopback of its new
 * network namespace, listens on 127.0.0.1 at each of sp->listen_ports, and sends the listeners to the
 * parent (one SCM_RIGHTS message on the handshake socket), keeping none. Async-signal-safe.
 * @return 0, or -1 with errno
 */
static int open_listeners(const child_args_t *a)
{
    const sb_shim_spawn_t *sp = a->sp;
    int fds[SB_SHIM_MAX_LISTEN], s, rc = -1, saved;
    unsigned n = 0;
    struct ifreq ifr;
    listen_cmsg_t u;
    struct msghdr msg;
    struct iovec iov;
    struct cmsghdr *cm;
    char tag = 'l';

    if (sp->nlisten > SB_SHIM_MAX_LISTEN) {
        errno = EINVAL;
        return -1;
    }
    if ((s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0)
        return -1;
    memset(&ifr, 0, sizeof(ifr));
    memcpy(ifr.ifr_name, "lo", 3);
    if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
        ifr.ifr_flags |= IFF_UP;
        rc = ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    saved = errno;
    close(s);
    if (rc != 0) {
        errno = saved;
        return -1;
    }
    rc = -1;
    for (; n < sp->nlisten; ++n) {
        struct sockaddr_in sin;
        memset(&sin, 0, sizeof(sin));
        sin.sin_family = AF_INET;
        sin.sin_port = htons(sp->listen_ports[n]);
        sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if ((fds[n] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) < 0)
            goto Exit;
        if (bind(fds[n], (const struct sockaddr *)&sin, sizeof(sin)) != 0 || listen(fds[n], 16) != 0) {
            ++n;
            goto Exit;
        }
    }
    memset(&msg, 0, sizeof(msg));
    memset(&u, 0, sizeof(u));
    iov.iov_base = &tag;
    iov.iov_len = 1;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = u.buf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * n);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * n);
    if (sendmsg(a->sync, &msg, MSG_NOSIGNAL) == 1)
        rc = 0;
Exit:
    saved = errno;
    for (unsigned i = 0; i < n; ++i)
        close(fds[i]);
    errno = saved;
    return rc;
}

/* the listeners open_listeners sent: exactly `n` of them, or none kept; 0 or -1 */
static int receive_listeners(int fd, sb_shim_child_t *out, unsigned n)
{
    listen_cmsg_t u;
    struct msghdr msg;
    struct iovec iov;
    struct cmsghdr *cm;
    char tag = 0;
    ssize_t got;
    unsigned k = 0;

    memset(&msg, 0, sizeof(msg));
    iov.iov_base = &tag;
    iov.iov_len = 1;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = u.buf;
    msg.msg_controllen = sizeof(u.buf);
    do
        got = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    while (got < 0 && errno == EINTR);
    for (cm = got == 1 ? CMSG_FIRSTHDR(&msg) : NULL; cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t m = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < m; ++i) {
            int f;
            memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
            if (k < n && tag == 'l' && !(msg.msg_flags & MSG_CTRUNC))
                out->listen_fds[k++] = f;
            else
                close(f);
        }
    }
    if (k != n || tag != 'l' || (msg.msg_flags & MSG_CTRUNC)) {
        for (unsigned i = 0; i < k; ++i)
            close(out->listen_fds[i]);
        return -1;
    }
    out->nlisten = n;
    return 0;
}

/* Runs in the forked (or cloned) child; never returns. Only async-signal-safe calls. */
static void child_exec(const child_args_t *a)
{
    const sb_shim_spawn_t *sp = a->sp;
    struct rlimit rl;
    sigset_t all;
    char c;

    /* our copy of the shim's memory holds secrets until exec replaces it */
    if (sp->scrub != NULL)
        explicit_bzero(sp->scrub, sp->scrub_len);
    if (a->run != NULL) {
        /*
         * A session of its own: no controlling terminal to open as /dev/tty, and the process group
         * the shim kills is this session's (seccomp then refuses setsid and setpgid). As pid 1 of its
         * PID namespace, getppid() reads 0, so the parent check is the handshake: a parent that died
         * before PR_SET_PDEATHSIG was set never sends "g" and the read sees EOF.
         */
        if (setsid() < 0 || prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
            child_fail(a, SB_SHIM_JAIL_STAGE_HANDSHAKE, errno);
        /* an unprivileged shim can write our id maps only while /proc/<us> is ours, i.e. while we
         * are dumpable (the shim is not); the token was wiped above, and it ends with the maps */
        if (!sb_shim_jail_privileged(sp->jail) && prctl(PR_SET_DUMPABLE, 1) != 0)
            child_fail(a, SB_SHIM_JAIL_STAGE_HANDSHAKE, errno);
        if (write(a->sync, "r", 1) != 1)
            _exit(127);
        if (read(a->sync, &c, 1) != 1 || c != 'g')
            _exit(127); /* the parent failed (and says why) or died */
        /* the module path: while the child may still bring up its loopback and bind there */
        if (sp->nlisten != 0 && open_listeners(a) != 0)
            child_fail(a, SB_SHIM_JAIL_STAGE_LOOPBACK, errno);
        /* a->sync stays open (close-on-exec): sb_shim_jail_enter checks its peer after the uid change */
        if (prctl(PR_SET_DUMPABLE, 0) != 0)
            child_fail(a, SB_SHIM_JAIL_STAGE_HANDSHAKE, errno);
    } else {
        if (setpgid(0, 0) != 0)
            child_fail(a, SB_SHIM_JAIL_STAGE_SETUP, errno);
        /* the guest must not outlive the shim: it would keep running unsupervised */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != a->parent)
            child_fail(a, SB_SHIM_JAIL_STAGE_SETUP, errno);
    }
    if (dup2(a->in_r, 0) < 0 || dup2(a->out_w, 1) < 0 || dup2(a->err_w, 2) < 0)
        child_fail(a, SB_SHIM_JAIL_STAGE_SETUP, errno);
        /* everything else we hold (broker sockets, the token fd, ...) must not leak into the guest */
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */) != 0)
#endif
    {
        for (int fd = 3; fd < 65536; ++fd)
            if (fd != a->errpipe && fd != a->sync)
                (void)close(fd);
    }
    /* an ignored SIGPIPE survives exec; the guest gets the default dispositions and an empty mask */
    for (int s = 1; s < 32; ++s)
        if (s != SIGKILL && s != SIGSTOP)
            (void)signal(s, SIG_DFL);
    sigemptyset(&all);
    (void)sigprocmask(SIG_SETMASK, &all, NULL);
    if (a->run != NULL) {
        sb_shim_jail_fail_t f;
        /* the cwd is taken inside the guest's own root, once it is there */
        if (sb_shim_jail_enter(sp->jail, a->run, sp->nofile, &f) != 0)
            child_fail(a, f.stage, f.err);
        if (chdir(sp->cwd != NULL ? sp->cwd : "/work") != 0)
            child_fail(a, SB_SHIM_JAIL_STAGE_CWD, errno);
    } else {
        if (sp->cwd != NULL && chdir(sp->cwd) != 0)
            child_fail(a, SB_SHIM_JAIL_STAGE_SETUP, errno);
        rl.rlim_cur = rl.rlim_max = 0;
        if (setrlimit(RLIMIT_CORE, &rl) != 0)
            child_fail(a, SB_SHIM_JAIL_STAGE_SETUP, errno);
        if (sp->nofile != 0) {
            rl.rlim_cur = rl.rlim_max = sp->nofile;
            if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
                child_fail(a, SB_SHIM_JAIL_STAGE_SETUP, errno);
        }
    }
    if (a->exe == NULL)
        _exit(0); /* sb_shim_jail_probe: everything is in place */
    execve(a->exe, sp->argv, sp->envp);
    child_fail(a, 0, errno);
}

/* reads the child's report: 0 when it exec'd (EOF), else fills `f` */
static int read_fail(int fd, sb_shim_jail_fail_t *f)
{
    ssize_t n;
    do
        n = read(fd, f, sizeof(*f));
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof(*f) ? -1 : 0;
}

/*
 * The jailed start: clone(2) straight into the new namespaces (so the guest is pid 1 of its PID
 * namespace), then, once the child has said it is ready, write its id maps and cgroup from here,
 * where we hold the privilege, and let it go on.
 */
static pid_t clone_jailed(child_args_t *a, sb_shim_child_t *out, int *keep, char *err, size_t errsz)
{
    int sv[2] = {-1, -1};
    pid_t pid;
    char c;
    ssize_t n;

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        snprintf(err, errsz, "socketpair: %s", strerror(errno));
        return -1;
    }
    a->sync = sv[1];
    out->jail_run.parent_fd = sv[1]; /* the child's copy of the run names it */
    pid = (pid_t)syscall(SYS_clone, sb_shim_jail_clone_flags() | SIGCHLD, NULL, NULL, NULL, NULL);
    if (pid == 0)
        child_exec(a);
    out->jail_run.parent_fd = -1;
    close(sv[1]);
    if (pid < 0) {
        snprintf(err, errsz,
                 "jail: the kernel refused new user, mount, pid, network, ipc and uts namespaces (clone: %s); refusing to "
                 "start the guest (--jail=off runs it without the jail)",
                 strerror(errno));
        close(sv[0]);
        return -1;
    }
    do
        n = read(sv[0], &c, 1);
    while (n < 0 && errno == EINTR);
    if (n != 1 || c != 'r') {
        snprintf(err, errsz, "jail: the guest died while starting");
        goto Kill;
    }
    if (sb_shim_jail_attach(out->jail, &out->jail_run, pid, err, errsz) != SB_OK)
        goto Kill;
    if (write(sv[0], "g", 1) != 1) {
        snprintf(err, errsz, "jail: the guest died while starting");
        goto Kill;
    }
    *keep = sv[0]; /* open until the guest has exec'd: it checks we are alive after its uid change */
    return pid;
Kill:
    close(sv[0]);
    (void)kill(pid, SIGKILL);
    (void)waitpid(pid, NULL, 0);
    return -1;
}

sb_status_t sb_shim_child_spawn(const sb_shim_spawn_t *sp, sb_shim_child_t *out, char *err, size_t errsz)
{
    int in_p[2] = {-1, -1}, out_p[2] = {-1, -1}, err_p[2] = {-1, -1}, ep[2] = {-1, -1}, keep = -1;
    int jailed = sb_shim_jail_enabled(sp->jail), failed;
    child_args_t a;
    sb_shim_jail_fail_t f;
    sb_status_t st = SB_E_EXECUTION;
    pid_t pid;

    memset(out, 0, sizeof(*out));
    out->pid = -1;
    out->pidfd = out->in_fd = out->out_fd = out->err_fd = -1;
    out->jail_run.lock_fd = out->jail_run.cgroup_fd = -1;
    if (sp->nlisten > SB_SHIM_MAX_LISTEN || (sp->nlisten != 0 && (!jailed || sp->path == NULL))) {
        snprintf(err, errsz, "the module path's listeners need the jail's network namespace");
        goto Exit;
    }
    if (jailed) {
        out->jail = sp->jail;
        sb_shim_jail_fs_spec_t fsp;
        if (sb_shim_jail_prepare(sp->jail, sp->threads_only, err, errsz) != 0)
            goto Exit;
        if (sb_shim_jail_begin(sp->jail, sp->memory_mb, sp->home, &out->jail_run, err, errsz) != SB_OK)
            goto Exit;
        memset(&fsp, 0, sizeof(fsp));
        /* the probe (no path) binds /bin/sh and its libraries as a guest's executable would be, so
         * that every step of a real guest's root is tried at start-up (a system binary: the shim's
         * own may sit where no guest uid reaches); it exits before it would exec */
        fsp.exe = sp->path != NULL ? sp->path : access("/bin/sh", X_OK) == 0 ? "/bin/sh" : NULL;
        fsp.exe_in_root = sp->root_exe;
        fsp.argv = sp->argv;
        fsp.system = sp->root_system;
        fsp.scratch_bytes = sb_shim_jail_scratch_bytes(sp->jail);
        fsp.scratch_inodes = SB_SHIM_JAIL_SCRATCH_INODES;
        if ((out->jail_run.fs = sb_shim_jail_plan_fs(&fsp, err, errsz)) == NULL) {
            if (strncmp(err, "jail: ", 6) == 0)
                sb_shim_jail_count_failure();
            goto Exit;
        }
        out->jail_run.cpu_limit = sb_shim_jail_cpu_limit(sp->timeout_ms);
        out->jail_run.threads_only = sp->threads_only;
    }
    if (pipe2(in_p, O_CLOEXEC) != 0 || pipe2(out_p, O_CLOEXEC) != 0 || pipe2(err_p, O_CLOEXEC) != 0 || pipe2(ep, O_CLOEXEC) != 0) {
        snprintf(err, errsz, "pipe: %s", strerror(errno));
        goto Exit;
    }
    memset(&a, 0, sizeof(a));
    a.sp = sp;
    a.run = jailed ? &out->jail_run : NULL;
    a.in_r = in_p[0];
    a.out_w = out_p[1];
    a.err_w = err_p[1];
    a.errpipe = ep[1];
    a.sync = -1;
    a.parent = getpid();
    a.exe = jailed && sp->path != NULL ? sb_shim_jail_fs_exe(out->jail_run.fs) : sp->path;
    if (jailed) {
        if ((pid = clone_jailed(&a, out, &keep, err, errsz)) < 0) {
            sb_shim_jail_count_failure();
            goto Exit;
        }
    } else {
        if ((pid = fork()) < 0) {
            snprintf(err, errsz, "fork: %s", strerror(errno));
            goto Exit;
        }
        if (pid == 0)
            child_exec(&a);
        (void)setpgid(pid, pid); /* both sides set it, so the group exists before we ever signal it */
    }
    close(ep[1]);
    ep[1] = -1;
    failed = read_fail(ep[0], &f) != 0;
    /* the listeners were sent before the exec that ended the report */
    if (!failed && sp->nlisten != 0 && receive_listeners(keep, out, sp->nlisten) != 0) {
        snprintf(err, errsz, "jail: the module path's listeners did not arrive from the guest");
        sb_shim_jail_count_failure();
        (void)kill(pid, SIGKILL); /* pid 1 of its PID namespace, but a SIGKILL from outside it always lands */
        (void)waitpid(pid, NULL, 0);
        goto Exit;
    }
    if (keep >= 0)
        close(keep);
    keep = -1;
    if (failed) {
        if (f.stage == 0) {
            snprintf(err, errsz, "cannot execute %s: %s", sp->path != NULL ? sp->path : "/bin/sh", strerror(f.err));
        } else if (jailed && f.stage != SB_SHIM_JAIL_STAGE_SETUP) {
            snprintf(err, errsz,
                     "jail: the kernel refused %s (%s); refusing to start the guest (--jail=off runs it without "
                     "the jail)",
                     sb_shim_jail_stage_name(f.stage), strerror(f.err));
            sb_shim_jail_count_failure();
        } else {
            snprintf(err, errsz, "cannot start the guest (%s: %s)", sb_shim_jail_stage_name(f.stage), strerror(f.err));
        }
        (void)waitpid(pid, NULL, 0);
        goto Exit;
    }
    out->pid = pid;
#ifdef SYS_pidfd_open
    out->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (out->pidfd >= 0)
        (void)fcntl(out->pidfd, F_SETFD, FD_CLOEXEC);
#endif
    out->in_fd = in_p[1];
    out->out_fd = out_p[0];
    out->err_fd = err_p[0];
    in_p[1] = out_p[0] = err_p[0] = -1;
    if (set_nonblock(out->in_fd) != 0 || set_nonblock(out->out_fd) != 0 || set_nonblock(out->err_fd) != 0) {
        snprintf(err, errsz, "fcntl: %s", strerror(errno));
        sb_shim_child_signal(out, SIGKILL);
        (void)waitpid(pid, NULL, 0);
        out->pid = -1;
        sb_shim_child_close(out);
        goto Exit;
    }
    st = SB_OK;
Exit:
    for (int i = 0; i < 2; ++i) {
        if (in_p[i] >= 0)
            close(in_p[i]);
        if (out_p[i] >= 0)
            close(out_p[i]);
        if (err_p[i] >= 0)
            close(err_p[i]);
        if (ep[i] >= 0)
            close(ep[i]);
    }
    if (keep >= 0)
        close(keep);
    if (st != SB_OK && out->jail_run.active)
        sb_shim_jail_end(out->jail, &out->jail_run);
    return st;
}

ssize_t sb_shim_read_small_file(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n;

    if (fd < 0 || size == 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    do
        n = read(fd, buf, size - 1);
    while (n < 0 && errno == EINTR);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    return n;
}

int sb_shim_child_gone(const sb_shim_child_t *c)
{
    struct pollfd p = {c->pidfd >= 0 ? c->pidfd : c->out_fd, POLLIN, 0};
    char path[64], buf[512];
    const char *close_paren;

    if (p.fd >= 0 && poll(&p, 1, 0) != 0)
        return 1;
    if (c->pid <= 0)
        return 0;
    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)c->pid);
    if (sb_shim_read_small_file(path, buf, sizeof(buf)) < 0)
        return 0;
    /* "pid (comm) S ...": the state follows the last ')' (the guest names comm, which may hold one) */
    if ((close_paren = strrchr(buf, ')')) == NULL || close_paren[1] != ' ')
        return 0;
    return close_paren[2] == 'Z' || close_paren[2] == 'X';
}

/*
 * 1 when the process catches `sig` (the SigCgt mask of /proc/<pid>/status); 0 when not or unknown.
 * The guest controls only the Name: line of that file, which the kernel prints with newlines
 * escaped, so it cannot forge a SigCgt line.
 */
static int catches(pid_t pid, int sig)
{
    char path[64], buf[4096];
    const char *p;
    unsigned long long mask = 0;

    snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
    if (sb_shim_read_small_file(path, buf, sizeof(buf)) < 0)
        return 0;
    if ((p = strstr(buf, "\nSigCgt:")) == NULL)
        return 0;
    for (p += 8; *p == '\t' || *p == ' '; ++p)
        ;
    for (; (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'); ++p)
        mask = mask << 4 | (unsigned long long)(*p <= '9' ? *p - '0' : *p - 'a' + 10);
    return (mask >> (sig - 1)) & 1;
}

void sb_shim_child_signal(const sb_shim_child_t *c, int sig)
{
    if (c->pid <= 0)
        return;
    /*
     * A jailed guest is pid 1 of its PID namespace, and the kernel drops signals an init does not
     * catch, even from outside: a SIGTERM it has no handler for would do nothing. It gets what a
     * default SIGTERM does to any other process, SIGKILL (the rest of the group still sees SIGTERM).
     */
    if (c->jail_run.active && sig == SIGTERM && !catches(c->pid, SIGTERM))
        (void)kill(c->pid, SIGKILL);
    (void)kill(-c->pid, sig);
}

/*
 * A jailed child still running (or a zombie) when its run is closed: kill and reap it through the
 * pidfd, which names exactly that process even if its pid number was reaped and handed out again.
 */
static void reap_jailed(sb_shim_child_t *c)
{
    siginfo_t si;

    if (c->pid <= 0 || c->pidfd < 0)
        return;
    memset(&si, 0, sizeof(si));
    if (waitid(P_PIDFD, (id_t)c->pidfd, &si, WEXITED | WNOHANG | WNOWAIT) != 0)
        return; /* ECHILD: already reaped */
    if (si.si_pid == 0)
        (void)syscall(SYS_pidfd_send_signal, c->pidfd, SIGKILL, NULL, 0);
    while (waitid(P_PIDFD, (id_t)c->pidfd, &si, WEXITED) != 0 && errno == EINTR)
        ;
}

void sb_shim_child_close(sb_shim_child_t *c)
{
    int *fds[] = {&c->pidfd, &c->in_fd, &c->out_fd, &c->err_fd};

    for (unsigned i = 0; i < c->nlisten && i < SB_SHIM_MAX_LISTEN; ++i)
        close(c->listen_fds[i]);
    c->nlisten = 0;

    if (c->jail_run.active) {
        reap_jailed(c);
        sb_shim_jail_end(c->jail, &c->jail_run);
    }
    for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); ++i) {
        if (*fds[i] >= 0)
            close(*fds[i]);
        *fds[i] = -1;
    }
}
