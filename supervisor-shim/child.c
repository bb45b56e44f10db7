/*
 * Guest process spawning (see child.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "child.h"

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Runs in the forked child; never returns. Only async-signal-safe calls. */
static void child_exec(const sb_shim_spawn_t *sp, int in_r, int out_w, int err_w, int errpipe, pid_t parent)
{
    struct rlimit rl;
    sigset_t all;
    int e;

    if (setpgid(0, 0) != 0)
        goto Fail;
    /* the guest must not outlive the shim: it would keep running unsupervised */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        goto Fail;
    if (dup2(in_r, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)
        goto Fail;
        /* everything else we hold (broker sockets, the token fd, ...) must not leak into the guest */
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */) != 0)
#endif
    {
        for (int fd = 3; fd < 65536; ++fd)
            if (fd != errpipe)
                (void)close(fd);
    }
    /* an ignored SIGPIPE survives exec; the guest gets the default dispositions and an empty mask */
    for (int s = 1; s < 32; ++s)
        if (s != SIGKILL && s != SIGSTOP)
            (void)signal(s, SIG_DFL);
    sigemptyset(&all);
    (void)sigprocmask(SIG_SETMASK, &all, NULL);
    rl.rlim_cur = rl.rlim_max = 0;
    if (setrlimit(RLIMIT_CORE, &rl) != 0)
        goto Fail;
    if (sp->nofile != 0) {
        rl.rlim_cur = rl.rlim_max = sp->nofile;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            goto Fail;
    }
    if (sp->cwd != NULL && chdir(sp->cwd) != 0)
        goto Fail;
    execve(sp->path, sp->argv, sp->envp);
Fail:
    e = errno;
    (void)!write(errpipe, &e, sizeof(e));
    _exit(127);
}

sb_status_t sb_shim_child_spawn(const sb_shim_spawn_t *sp, sb_shim_child_t *out, char *err, size_t errsz)
{
    int in_p[2] = {-1, -1}, out_p[2] = {-1, -1}, err_p[2] = {-1, -1}, ep[2] = {-1, -1};
    pid_t parent = getpid(), pid;
    sb_status_t st = SB_E_EXECUTION;
    ssize_t n;
    int e = 0;

    memset(out, 0, sizeof(*out));
    out->pid = -1;
    out->pidfd = out->in_fd = out->out_fd = out->err_fd = -1;
    if (pipe2(in_p, O_CLOEXEC) != 0 || pipe2(out_p, O_CLOEXEC) != 0 || pipe2(err_p, O_CLOEXEC) != 0 || pipe2(ep, O_CLOEXEC) != 0) {
        snprintf(err, errsz, "pipe: %s", strerror(errno));
        goto Exit;
    }
    if ((pid = fork()) < 0) {
        snprintf(err, errsz, "fork: %s", strerror(errno));
        goto Exit;
    }
    if (pid == 0)
        child_exec(sp, in_p[0], out_p[1], err_p[1], ep[1], parent);

    (void)setpgid(pid, pid); /* both sides set it, so the group exists before we ever signal it */
    close(ep[1]);
    ep[1] = -1;
    do
        n = read(ep[0], &e, sizeof(e));
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof(e)) {
        snprintf(err, errsz, "cannot execute %s: %s", sp->path, strerror(e));
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
        sb_shim_child_close(out);
        out->pid = -1;
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
    return st;
}

void sb_shim_child_signal(const sb_shim_child_t *c, int sig)
{
    if (c->pid > 0)
        (void)kill(-c->pid, sig);
}

void sb_shim_child_close(sb_shim_child_t *c)
{
    int *fds[] = {&c->pidfd, &c->in_fd, &c->out_fd, &c->err_fd};

    for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); ++i) {
        if (*fds[i] >= 0)
            close(*fds[i]);
        *fds[i] = -1;
    }
}
