/*
 * sandbox-shim serve: the launcher and its pool (see launcher.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "sb/mem.h"
#include "serve/launcher.h"

#define MSG_MAGIC 0x53424c31u /* "SBL1" */
/* the longest the service waits for the launcher's answer to one run: it forks or hands over, nothing slower */
#define SUBMIT_TIMEOUT_MS 5000
/* a class whose guests fail to start waits before the next attempt, doubling up to the cap */
#define BACKOFF_MIN_MS 200
#define BACKOFF_MAX_MS 30000
/* exit statuses of a pooled run process that never got a run */
#define POOLED_SPAWN_FAILED 3
#define POOLED_GUEST_DIED 4

/* the service -> launcher message; the descriptors travel with it (memfd, report, and the client's if any) */
typedef struct st_submit_t {
    uint32_t magic;
    uint32_t memory_mb;
    uint32_t has_cancel;
    uint32_t cold; /* the run has imports: a pooled guest has no module path, so it starts cold */
} submit_t;

/* the launcher -> service answer; a pidfd of the run process travels with it when there is one */
typedef struct st_reply_t {
    uint32_t magic;
    int32_t pid; /* 0: no run process (err says why) */
    uint32_t pooled;
    char err[200];
} reply_t;

/* ---- descriptors over unix sockets ---- */

static ssize_t send_fds(int sock, const void *p, size_t n, const int *fds, size_t nfds)
{
    struct iovec iov = {(void *)p, n};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int) * 4)];
    } u;
    struct msghdr m;
    ssize_t w;

    memset(&m, 0, sizeof(m));
    memset(&u, 0, sizeof(u));
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (nfds > 0) {
        struct cmsghdr *c;
        m.msg_control = u.buf;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    do
        w = sendmsg(sock, &m, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    return w;
}

/* receives one message and at most `maxfds` descriptors (close-on-exec); any more are closed */
static ssize_t recv_fds(int sock, void *p, size_t n, int *fds, size_t maxfds, size_t *nfds)
{
    struct iovec iov = {p, n};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int) * 8)];
    } u;
    struct msghdr m;
    ssize_t r;

    *nfds = 0;
    memset(&m, 0, sizeof(m));
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = u.buf;
    m.msg_controllen = sizeof(u.buf);
    do
        r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return r;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c != NULL; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int got[8];
        if (k > 8)
            k = 8;
        memcpy(got, CMSG_DATA(c), k * sizeof(int));
        for (size_t i = 0; i < k; ++i) {
            if (*nfds < maxfds)
                fds[(*nfds)++] = got[i];
            else
                close(got[i]);
        }
    }
    if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
        for (size_t i = 0; i < *nfds; ++i)
            close(fds[i]);
        *nfds = 0;
        errno = EMSGSIZE;
        return -1;
    }
    return r;
}

static int pidfd_of(pid_t pid)
{
#ifdef SYS_pidfd_open
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd >= 0)
        (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
#else
    (void)pid;
    return -1;
#endif
}

static void bump(uint64_t *counter, int64_t by)
{
    __atomic_add_fetch(counter, (uint64_t)by, __ATOMIC_RELAXED);
}

/* closes every descriptor from `from` up, but those in keep[] */
static void close_from(int from, const int *keep, size_t nkeep)
{
    int top = (int)sysconf(_SC_OPEN_MAX);
    if (top <= 0 || top > 65536)
        top = 65536;
    for (int fd = from; fd < top; ++fd) {
        size_t i;
        for (i = 0; i < nkeep && keep[i] != fd; ++i)
            ;
        if (i == nkeep)
            (void)close(fd);
    }
}

/* ---- the run processes ---- */

static volatile sig_atomic_t idle_stop;

static void on_idle_stop(int sig)
{
    (void)sig;
    idle_stop = 1;
}

/* a process forked by the launcher: dies with it, default signals, nothing blocked */
static void child_common(pid_t launcher)
{
    sigset_t none;

    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher)
        _exit(1);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGUSR1, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* moves the run's descriptors to their fixed numbers (serve_int.h); `fds`: report, cancel or -1 */
static int arrange_run_fds(int report, int cancel)
{
    if (dup2(report, SB_SERVE_REPORT_FD) != SB_SERVE_REPORT_FD)
        return -1;
    if (cancel >= 0) {
        if (dup2(cancel, SB_SERVE_CANCEL_FD) != SB_SERVE_CANCEL_FD)
            return -1;
        (void)fcntl(SB_SERVE_CANCEL_FD, F_SETFD, FD_CLOEXEC);
        close(cancel);
    } else {
        (void)close(SB_SERVE_CANCEL_FD);
    }
    (void)fcntl(SB_SERVE_REPORT_FD, F_SETFD, FD_CLOEXEC);
    close(report);
    return 0;
}

static __attribute__((noreturn)) void run_job(const sb_serve_conf_t *conf, int memfd, sb_shim_guest_t *pre)
{
    static sb_serve_job_t job;

    if (sb_serve_job_read(memfd, conf, &job) != SB_OK) {
        if (pre != NULL)
            sb_shim_deno_discard(pre);
        _exit(1); /* the service answers "the run ended without an outcome" */
    }
    close(memfd);
    sb_serve_run_main(&job, pre);
}

/* a run that found no pooled guest: its process starts the guest after the run arrived */
static __attribute__((noreturn)) void cold_main(const sb_serve_conf_t *conf, pid_t launcher, int memfd, int report, int cancel)
{
    int keep[3];

    child_common(launcher);
    /* above every fixed number first, so that arranging them overwrites none of them */
    if ((memfd = fcntl(memfd, F_DUPFD_CLOEXEC, 16)) < 0 || (report = fcntl(report, F_DUPFD_CLOEXEC, 16)) < 0 ||
        (cancel >= 0 && (cancel = fcntl(cancel, F_DUPFD_CLOEXEC, 16)) < 0))
        _exit(1);
    keep[0] = memfd;
    keep[1] = report;
    keep[2] = cancel;
    close_from(SB_SERVE_JAIL_FD + 1, keep, 3);
    (void)close(SB_SERVE_REPORT_FD);
    (void)close(SB_SERVE_CANCEL_FD);
    if (arrange_run_fds(report, cancel) != 0)
        _exit(1);
    run_job(conf, memfd, NULL);
}

/*
 * A pooled run process: starts its guest now and waits for a run. Idle it holds no token and no
 * run data (it was forked from the launcher); it ends without a run when the launcher stops it
 * (SIGTERM, or its pair closing), and when its guest dies while waiting.
 */
static __attribute__((noreturn)) void pooled_main(const sb_serve_conf_t *conf, pid_t launcher, int sock, unsigned memory_mb)
{
    static sb_shim_guest_t g;
    sb_shim_deno_t d = conf->deno;
    char err[512], ready = 'R';
    struct sigaction sa;
    sigset_t term, waiting;
    int keep[1] = {SB_SERVE_CONTROL_FD}, nul;

    child_common(launcher);
    if (dup2(sock, SB_SERVE_CONTROL_FD) != SB_SERVE_CONTROL_FD)
        _exit(1);
    close_from(SB_SERVE_JAIL_FD + 1, keep, 1);
    /* 3 and 4 are held until the run's descriptors take them, so that the guest's pipes land above */
    if ((nul = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0 || dup2(nul, SB_SERVE_REPORT_FD) != SB_SERVE_REPORT_FD ||
        dup2(nul, SB_SERVE_CANCEL_FD) != SB_SERVE_CANCEL_FD)
        _exit(1);
    if (nul != SB_SERVE_REPORT_FD && nul != SB_SERVE_CANCEL_FD)
        close(nul);
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_idle_stop;
    sigemptyset(&sa.sa_mask);
    /* SIGTERM is blocked but while it waits (ppoll below), so that one arriving between the check
     * and the wait is not lost */
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigprocmask(SIG_BLOCK, &term, &waiting) != 0)
        _exit(1);
    sigdelset(&waiting, SIGTERM);

    d.memory_mb = memory_mb;
    d.timeout_ms = SB_SERVE_MAX_TIMEOUT_MS; /* its run is not known yet: the longest; lowered at the hand-over */
    if (sb_shim_deno_start(&d, NULL, 0, &g, err, sizeof(err)) != SB_OK)
        _exit(POOLED_SPAWN_FAILED); /* counted by the launcher; the service logs the count rising */
    if (write(SB_SERVE_CONTROL_FD, &ready, 1) != 1) {
        sb_shim_deno_discard(&g);
        _exit(0);
    }
    for (;;) {
        struct pollfd p[2] = {{SB_SERVE_CONTROL_FD, POLLIN, 0}, {g.child.pidfd >= 0 ? g.child.pidfd : g.child.out_fd, POLLIN, 0}};
        int n = ppoll(p, 2, NULL, &waiting);
        if (idle_stop) {
            sb_shim_deno_discard(&g);
            _exit(0);
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            sb_shim_deno_discard(&g);
            _exit(1);
        }
        /*
         * A run that arrived is taken before the guest's death is looked at: the launcher has told the
         * service this process has it, so it must be answered (serve_run.c starts it cold when the
         * guest is gone).
         */
        if (p[0].revents == 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
            /*
             * The guest died (or wrote before its init frame, which it never does): it is replaced. The
             * launcher may be sending a run at this moment: reading is shut first, so that a send from
             * now on fails and the launcher takes another guest or starts cold; a run already queued
             * is read below (and started cold), else the read ends at once and so does this process.
             */
            (void)shutdown(SB_SERVE_CONTROL_FD, SHUT_RD);
            p[0].revents = POLLIN;
        }
        if (p[0].revents != 0) {
            int fds[3];
            size_t nfds;
            char kind;
            ssize_t r = recv_fds(SB_SERVE_CONTROL_FD, &kind, 1, fds, 3, &nfds);
            if (r == 1 && kind == 'J' && (nfds == 2 || nfds == 3)) {
                /* the run: from here on this process is the run's; SIGTERM cancels it (serve_run.c) */
                signal(SIGTERM, SIG_DFL);
                (void)sigprocmask(SIG_UNBLOCK, &term, NULL);
                close(SB_SERVE_CONTROL_FD);
                if (arrange_run_fds(fds[1], nfds == 3 ? fds[2] : -1) != 0) {
                    sb_shim_deno_discard(&g);
                    _exit(1);
                }
                run_job(conf, fds[0], &g);
            }
            for (size_t i = 0; i < nfds; ++i)
                close(fds[i]);
            sb_shim_deno_discard(&g);
            _exit(0);
        }
    }
}

/* ---- the launcher ---- */

typedef struct st_pooled_t {
    pid_t pid;
    int pidfd;
    int sock; /* our end of its pair */
    unsigned cls;
    int ready;
} pooled_t;

typedef struct st_launcher_t {
    const sb_serve_conf_t *conf;
    sb_serve_pool_conf_t pc;
    sb_serve_pool_stats_t *stats;
    pooled_t pool[SB_SERVE_POOL_MAX_CLASSES * SB_SERVE_POOL_MAX_SIZE];
    size_t npool;
    int64_t backoff_until[SB_SERVE_POOL_MAX_CLASSES];
    int64_t backoff_ms[SB_SERVE_POOL_MAX_CLASSES];
    pid_t self;
    int sigfd;
    int stopping;
} launcher_t;

static void set_gauges(launcher_t *L)
{
    uint64_t idle = 0, starting = 0;
    for (size_t i = 0; i < L->npool; ++i) {
        if (L->pool[i].ready)
            ++idle;
        else
            ++starting;
    }
    __atomic_store_n(&L->stats->idle, idle, __ATOMIC_RELAXED);
    __atomic_store_n(&L->stats->starting, starting, __ATOMIC_RELAXED);
}

/*
 * Signals a pooled process through its pidfd: the launcher reaps its children as they end, so by
 * the time one is seen gone its pid may already be another process's. Without a pidfd (the kernel
 * had none at its start) it is left to its own end, or to PR_SET_PDEATHSIG.
 */
static void pool_signal(const pooled_t *p, int sig)
{
#ifdef SYS_pidfd_send_signal
    if (p->pidfd >= 0)
        (void)syscall(SYS_pidfd_send_signal, p->pidfd, sig, NULL, 0);
#else
    (void)p;
    (void)sig;
#endif
}

/* a class whose pooled guests fail to start, or die while they wait, waits before the next one */
static void pool_backoff(launcher_t *L, unsigned cls, int64_t now)
{
    int64_t b = L->backoff_ms[cls] == 0 ? BACKOFF_MIN_MS : L->backoff_ms[cls] * 2;
    if (b > BACKOFF_MAX_MS)
        b = BACKOFF_MAX_MS;
    L->backoff_ms[cls] = b;
    L->backoff_until[cls] = now + b;
}

static void pool_remove(launcher_t *L, size_t i)
{
    if (L->pool[i].pidfd >= 0)
        close(L->pool[i].pidfd);
    if (L->pool[i].sock >= 0)
        close(L->pool[i].sock);
    L->pool[i] = L->pool[--L->npool];
    set_gauges(L);
}

static void pool_spawn(launcher_t *L, unsigned cls)
{
    int sv[2];
    pid_t pid;
    pooled_t *p;

    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        bump(&L->stats->refill_failures, 1);
        return;
    }
    if ((pid = fork()) < 0) {
        close(sv[0]);
        close(sv[1]);
        bump(&L->stats->refill_failures, 1);
        return;
    }
    if (pid == 0) {
        close(sv[0]);
        pooled_main(L->conf, L->self, sv[1], L->pc.class_mb[cls]);
    }
    close(sv[1]);
    bump(&L->stats->processes, 1);
    p = &L->pool[L->npool++];
    p->pid = pid;
    p->pidfd = pidfd_of(pid);
    p->sock = sv[0];
    p->cls = cls;
    p->ready = 0;
    set_gauges(L);
}

static void refill(launcher_t *L, int64_t now)
{
    if (L->stopping)
        return;
    for (unsigned c = 0; c < L->pc.nclasses; ++c) {
        unsigned have = 0;
        if (now < L->backoff_until[c])
            continue;
        for (size_t i = 0; i < L->npool; ++i)
            if (L->pool[i].cls == c)
                ++have;
        while (have < L->pc.size && L->npool < sizeof(L->pool) / sizeof(L->pool[0])) {
            pool_spawn(L, c);
            ++have;
        }
    }
}

/* a pooled process's pair spoke or closed */
static void pool_event(launcher_t *L, size_t i, int64_t now)
{
    pooled_t *p = &L->pool[i];
    char b;
    ssize_t r = recv(p->sock, &b, 1, MSG_DONTWAIT);

    if (r == 1 && b == 'R' && !p->ready) {
        /* started: its runtime prepares itself now; the backoff ends only when one takes a run */
        p->ready = 1;
        bump(&L->stats->refills, 1);
        set_gauges(L);
        return;
    }
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    /*
     * It ended without a run: its guest died while idle, or never started. Either way its class
     * waits before the next start, doubling, so a guest that dies every time (a runtime that no
     * longer prepares itself on this Deno, say) cannot keep the CPUs busy with restarts.
     */
    bump(p->ready ? &L->stats->died : &L->stats->refill_failures, 1);
    pool_backoff(L, p->cls, now);
    pool_signal(p, SIGKILL);
    pool_remove(L, i);
}

static void reply(int ctl, pid_t pid, int pidfd, int pooled, const char *err)
{
    reply_t m;

    memset(&m, 0, sizeof(m));
    m.magic = MSG_MAGIC;
    m.pid = (int32_t)pid;
    m.pooled = (uint32_t)pooled;
    if (err != NULL)
        snprintf(m.err, sizeof(m.err), "%s", err);
    (void)send_fds(ctl, &m, sizeof(m), &pidfd, pidfd >= 0 ? 1 : 0);
}

static void handle_submit(launcher_t *L, int ctl, const submit_t *s, int *fds, size_t nfds)
{
    int want_cancel = s->has_cancel != 0;
    int cls = -1;
    pid_t pid;

    if (s->magic != MSG_MAGIC || nfds != (size_t)(want_cancel ? 3 : 2)) {
        reply(ctl, 0, -1, 0, "the launcher got a malformed run");
        goto Close;
    }
    for (unsigned c = 0; c < L->pc.nclasses && !s->cold; ++c)
        if (L->pc.class_mb[c] == s->memory_mb)
            cls = (int)c;
    if (cls >= 0) {
        for (size_t i = 0; i < L->npool; ++i) {
            pooled_t *p = &L->pool[i];
            char j = 'J';
            if (p->cls != (unsigned)cls || !p->ready)
                continue;
            if (send_fds(p->sock, &j, 1, fds, nfds) != 1) {
                /* it died just now, or cannot take descriptors: it goes, and the next one is tried, or a cold start */
                bump(&L->stats->died, 1);
                pool_signal(p, SIGKILL);
                pool_remove(L, i);
                --i;
                continue;
            }
            bump(&L->stats->hits, 1);
            L->backoff_ms[cls] = 0; /* a pooled guest took its run: the class is healthy */
            reply(ctl, p->pid, p->pidfd, 1, NULL);
            pool_remove(L, i);
            goto Close;
        }
        bump(&L->stats->misses, 1);
    }
    bump(&L->stats->cold, 1);
    if ((pid = fork()) < 0) {
        char e[160];
        snprintf(e, sizeof(e), "fork: %s", strerror(errno));
        reply(ctl, 0, -1, 0, e);
        goto Close;
    }
    if (pid == 0)
        cold_main(L->conf, L->self, fds[0], fds[1], want_cancel ? fds[2] : -1);
    bump(&L->stats->processes, 1);
    {
        int pfd = pidfd_of(pid);
        reply(ctl, pid, pfd, 0, NULL);
        if (pfd >= 0)
            close(pfd);
    }
Close:
    for (size_t i = 0; i < nfds; ++i)
        close(fds[i]);
}

/* reaps every run process that ended; one killed before it cleaned up leaves cgroups, swept first */
static void reap(launcher_t *L)
{
    for (;;) {
        siginfo_t si;
        memset(&si, 0, sizeof(si));
        if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == 0)
            return;
        if (si.si_code != CLD_EXITED)
            (void)sb_shim_jail_sweep(L->conf->deno.jail, si.si_pid);
        while (waitpid(si.si_pid, NULL, 0) < 0 && errno == EINTR)
            ;
        bump(&L->stats->processes, -1);
    }
}

static int64_t now_ms(void)
{
    return sb_serve_now_ms();
}

static __attribute__((noreturn)) void launcher_main(const sb_serve_conf_t *conf, const sb_serve_pool_conf_t *pc,
                                                    sb_serve_pool_stats_t *stats, int ctl, pid_t service)
{
    static launcher_t L;
    sigset_t chld;
    int keep[2] = {SB_SERVE_JAIL_FD, SB_SERVE_CONTROL_FD};
    int64_t stop_deadline = 0;

    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != service)
        _exit(1);
    /* the service decides when the launcher stops (its pair closes); signals meant for the unit are not for it */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGUSR1, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    /* the service's descriptors (listener, connections) are not the launcher's: only the pair and the jail's */
    if ((ctl = fcntl(ctl, F_DUPFD_CLOEXEC, 16)) < 0 || sb_shim_jail_move_fd(conf->deno.jail, SB_SERVE_JAIL_FD) < 0 ||
        dup2(ctl, SB_SERVE_CONTROL_FD) != SB_SERVE_CONTROL_FD)
        _exit(1);
    (void)fcntl(SB_SERVE_CONTROL_FD, F_SETFD, FD_CLOEXEC);
    close_from(3, keep, 2);
    /* 3 and 4 stay taken, so that descriptors received from the service land above the fixed numbers */
    {
        int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (nul < 0 || dup2(nul, SB_SERVE_REPORT_FD) < 0 || dup2(nul, SB_SERVE_CANCEL_FD) < 0)
            _exit(1);
        if (nul != SB_SERVE_REPORT_FD && nul != SB_SERVE_CANCEL_FD)
            close(nul);
    }
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &chld, NULL) != 0 || (L.sigfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK)) < 0)
        _exit(1);
    /* the net-mint credential travels with each net run's job (the service's current one): none here */
    explicit_bzero((char *)conf->netmint.secret, sizeof(conf->netmint.secret));
    L.conf = conf;
    L.pc = *pc;
    L.stats = stats;
    L.self = getpid();

    for (;;) {
        struct pollfd p[2 + sizeof(L.pool) / sizeof(L.pool[0])];
        size_t np = 0, npool;
        int64_t now = now_ms();
        int n;

        refill(&L, now);
        /* stopping, the pair is closed and would report a hang-up on every turn: left out */
        p[np++] = (struct pollfd){L.stopping ? -1 : SB_SERVE_CONTROL_FD, POLLIN, 0};
        p[np++] = (struct pollfd){L.sigfd, POLLIN, 0};
        npool = L.npool;
        for (size_t i = 0; i < npool; ++i)
            p[np++] = (struct pollfd){L.pool[i].sock, POLLIN, 0};
        n = poll(p, np, 100);
        if (n < 0 && errno != EINTR)
            _exit(1);
        now = now_ms();
        if ((p[1].revents & POLLIN) != 0) {
            struct signalfd_siginfo si;
            while (read(L.sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
                ;
        }
        reap(&L);
        /* the pool's events, last first, so that removing one leaves the earlier indices alone */
        for (size_t i = npool; i-- > 0;)
            if (p[2 + i].revents != 0 && i < L.npool)
                pool_event(&L, i, now);
        if (!L.stopping && p[0].revents != 0) {
            submit_t s;
            int fds[3];
            size_t nfds;
            ssize_t r = recv_fds(SB_SERVE_CONTROL_FD, &s, sizeof(s), fds, 3, &nfds);
            if (r == (ssize_t)sizeof(s)) {
                handle_submit(&L, SB_SERVE_CONTROL_FD, &s, fds, nfds);
            } else if (r == 0 || (r < 0 && errno != EAGAIN)) {
                /* the service stopped: pooled guests go now, the runs in flight end by themselves */
                for (size_t i = 0; i < nfds; ++i)
                    close(fds[i]);
                L.stopping = 1;
                stop_deadline = now + 60000;
                for (size_t i = 0; i < L.npool; ++i)
                    pool_signal(&L.pool[i], SIGTERM);
            } else {
                for (size_t i = 0; i < nfds; ++i)
                    close(fds[i]);
            }
        }
        if (L.stopping) {
            siginfo_t si;
            memset(&si, 0, sizeof(si));
            /* no child left at all: done */
            if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0 && errno == ECHILD)
                _exit(0);
            if (now >= stop_deadline)
                _exit(0); /* what is left dies with the launcher (PR_SET_PDEATHSIG) */
        }
    }
}

/* ---- the service's side ---- */

int sb_serve_pool_parse_classes(const char *s, sb_serve_pool_conf_t *pc, const char **why)
{
    const char *p = s;

    pc->nclasses = 0;
    if (*p == '\0') {
        *why = "--pool-memory-mb wants a list of memoryMb values (e.g. 128,256)";
        return -1;
    }
    while (*p != '\0') {
        unsigned long v = 0;
        const char *start = p;
        while (*p >= '0' && *p <= '9' && p - start < 5)
            v = v * 10 + (unsigned long)(*p++ - '0');
        if (p == start || (*p != ',' && *p != '\0') || v < SB_SERVE_MIN_MEMORY_MB || v > SB_SERVE_MAX_MEMORY_MB) {
            *why = "--pool-memory-mb wants memoryMb values from 16 to 1024, separated by commas";
            return -1;
        }
        for (unsigned i = 0; i < pc->nclasses; ++i)
            if (pc->class_mb[i] == v) {
                *why = "--pool-memory-mb names a class twice";
                return -1;
            }
        if (pc->nclasses == SB_SERVE_POOL_MAX_CLASSES) {
            *why = "--pool-memory-mb takes at most 8 classes";
            return -1;
        }
        pc->class_mb[pc->nclasses++] = (unsigned)v;
        if (*p == ',')
            ++p;
        if (*p == '\0' && p[-1] == ',') {
            *why = "--pool-memory-mb wants memoryMb values from 16 to 1024, separated by commas";
            return -1;
        }
    }
    return 0;
}

sb_status_t sb_serve_launcher_start(sb_serve_launcher_t *l, const sb_serve_conf_t *conf, const sb_serve_pool_conf_t *pc, char *err,
                                    size_t errsz)
{
    int sv[2];
    pid_t pid, self = getpid();

    memset(l, 0, sizeof(*l));
    l->fd = -1;
    l->pidfd = -1;
    l->stats = mmap(NULL, sizeof(*l->stats), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (l->stats == MAP_FAILED) {
        l->stats = NULL;
        snprintf(err, errsz, "the launcher's counters: mmap: %s", strerror(errno));
        return SB_E_EXECUTION;
    }
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        snprintf(err, errsz, "the launcher's pair: %s", strerror(errno));
        return SB_E_EXECUTION;
    }
    fflush(stderr);
    if ((pid = fork()) < 0) {
        snprintf(err, errsz, "the launcher: fork: %s", strerror(errno));
        close(sv[0]);
        close(sv[1]);
        return SB_E_EXECUTION;
    }
    if (pid == 0) {
        close(sv[0]);
        launcher_main(conf, pc, l->stats, sv[1], self);
    }
    close(sv[1]);
    l->pid = pid;
    l->pidfd = pidfd_of(pid);
    l->fd = sv[0];
    if (l->pidfd < 0) {
        /* runs are signalled through pidfds only (serve.c, signal_run): without them, no runs */
        snprintf(err, errsz, "the kernel has no pidfd_open (Linux 5.3 or later is needed): %s", strerror(errno));
        sb_serve_launcher_stop(l, 1000);
        return SB_E_EXECUTION;
    }
    return SB_OK;
}

sb_status_t sb_serve_launcher_submit(sb_serve_launcher_t *l, const sb_serve_job_t *job, int report_fd, int cancel_fd, pid_t *pid,
                                     int *pidfd, int *pooled, char *err, size_t errsz)
{
    submit_t s;
    reply_t m;
    int fds[3], got[1];
    size_t nfds = 0, ngot = 0;
    int memfd;
    struct pollfd p;
    ssize_t r;

    *pid = 0;
    *pidfd = -1;
    *pooled = 0;
    if (l->fd < 0) {
        snprintf(err, errsz, "the launcher is stopped");
        return SB_E_EXECUTION;
    }
    /* the job goes in a sealed memfd: only this run's process reads it, and nobody changes it on the way */
    if ((memfd = (int)syscall(SYS_memfd_create, "sb-run", MFD_CLOEXEC | MFD_ALLOW_SEALING)) < 0) {
        snprintf(err, errsz, "memfd_create: %s", strerror(errno));
        return SB_E_EXECUTION;
    }
    if (sb_serve_job_write(memfd, job) != SB_OK ||
        fcntl(memfd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
        snprintf(err, errsz, "the run's job could not be written");
        close(memfd);
        return SB_E_EXECUTION;
    }
    memset(&s, 0, sizeof(s));
    s.magic = MSG_MAGIC;
    s.memory_mb = job->memory_mb;
    s.has_cancel = cancel_fd >= 0;
    s.cold = job->imports != NULL;
    fds[nfds++] = memfd;
    fds[nfds++] = report_fd;
    if (cancel_fd >= 0)
        fds[nfds++] = cancel_fd;
    r = send_fds(l->fd, &s, sizeof(s), fds, nfds);
    close(memfd);
    if (r != (ssize_t)sizeof(s)) {
        snprintf(err, errsz, "the launcher did not take the run: %s", r < 0 ? strerror(errno) : "short write");
        return SB_E_EXECUTION;
    }
    p.fd = l->fd;
    p.events = POLLIN;
    do
        r = poll(&p, 1, SUBMIT_TIMEOUT_MS);
    while (r < 0 && errno == EINTR);
    if (r <= 0) {
        /* no answer: the launcher is stuck or gone; it is not used again */
        snprintf(err, errsz, "the launcher did not answer");
        close(l->fd);
        l->fd = -1;
        return SB_E_EXECUTION;
    }
    r = recv_fds(l->fd, &m, sizeof(m), got, 1, &ngot);
    if (r != (ssize_t)sizeof(m) || m.magic != MSG_MAGIC) {
        for (size_t i = 0; i < ngot; ++i)
            close(got[i]);
        snprintf(err, errsz, "the launcher's answer was malformed");
        close(l->fd);
        l->fd = -1;
        return SB_E_EXECUTION;
    }
    if (m.pid <= 0) {
        for (size_t i = 0; i < ngot; ++i)
            close(got[i]);
        m.err[sizeof(m.err) - 1] = '\0';
        snprintf(err, errsz, "%s", m.err);
        return SB_E_EXECUTION;
    }
    *pid = (pid_t)m.pid;
    *pidfd = ngot == 1 ? got[0] : -1;
    *pooled = m.pooled != 0;
    return SB_OK;
}

void sb_serve_launcher_stats(const sb_serve_launcher_t *l, sb_serve_pool_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    if (l->stats == NULL)
        return;
    out->hits = __atomic_load_n(&l->stats->hits, __ATOMIC_RELAXED);
    out->misses = __atomic_load_n(&l->stats->misses, __ATOMIC_RELAXED);
    out->cold = __atomic_load_n(&l->stats->cold, __ATOMIC_RELAXED);
    out->refills = __atomic_load_n(&l->stats->refills, __ATOMIC_RELAXED);
    out->refill_failures = __atomic_load_n(&l->stats->refill_failures, __ATOMIC_RELAXED);
    out->died = __atomic_load_n(&l->stats->died, __ATOMIC_RELAXED);
    out->idle = __atomic_load_n(&l->stats->idle, __ATOMIC_RELAXED);
    out->starting = __atomic_load_n(&l->stats->starting, __ATOMIC_RELAXED);
    out->processes = __atomic_load_n(&l->stats->processes, __ATOMIC_RELAXED);
}

int sb_serve_launcher_alive(const sb_serve_launcher_t *l)
{
    siginfo_t si;

    if (l->pid <= 0 || l->fd < 0)
        return 0;
    memset(&si, 0, sizeof(si));
    if (waitid(P_PID, (id_t)l->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0)
        return 0;
    return si.si_pid == 0;
}

void sb_serve_launcher_stop(sb_serve_launcher_t *l, int wait_ms)
{
    int64_t until = sb_serve_now_ms() + wait_ms;

    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
    if (l->pid > 0) {
        for (;;) {
            pid_t w = waitpid(l->pid, NULL, WNOHANG);
            if (w == l->pid || (w < 0 && errno != EINTR))
                break;
            if (sb_serve_now_ms() >= until) {
                (void)kill(l->pid, SIGKILL); /* not reaped: the pid is still the launcher's */
                (void)waitpid(l->pid, NULL, 0);
                break;
            }
            usleep(10000);
        }
        l->pid = 0;
    }
    if (l->pidfd >= 0)
        close(l->pidfd);
    l->pidfd = -1;
    if (l->stats != NULL)
        munmap(l->stats, sizeof(*l->stats));
    l->stats = NULL;
}
