/*
 * Unit tests for supervisor-shim/jail/seccomp.c: the filter of Deno guests of runs with imports
 * (SB_SHIM_JAIL_FILTER_LOOPBACK), loaded in a child of this test: TCP client sockets and connect,
 * nothing else behind a stream socket, no TCP_ULP; and the Deno filter without imports still
 * refuses them all. Each probe's errno comes back over a pipe.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include "tap.h"
#include "../../supervisor-shim/jail/seccomp.c"

#ifndef IPPROTO_MPTCP
#define IPPROTO_MPTCP 262
#endif

enum { P_TCP0, P_TCP, P_SCTP, P_MPTCP, P_UDP, P_INET6, P_CONNECT, P_NODELAY, P_ULP, P_ULP_HIGH_LEVEL, P_ULP_HIGH_NAME, P_COUNT };

/* in the child, under the filter: each probe's result (0, or the errno) */
static void probe(int out)
{
    int res[P_COUNT], s;
    struct sockaddr_in sin;
    int one = 1;

#define TRY(i, call) res[i] = (call) < 0 ? errno : 0
    TRY(P_TCP0, s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (s >= 0)
        close(s);
    TRY(P_TCP, s = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP));
    if (s >= 0)
        close(s);
    TRY(P_SCTP, s = socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP));
    if (s >= 0)
        close(s);
    TRY(P_MPTCP, s = socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP));
    if (s >= 0)
        close(s);
    TRY(P_UDP, s = socket(AF_INET, SOCK_DGRAM, 0));
    if (s >= 0)
        close(s);
    TRY(P_INET6, s = socket(AF_INET6, SOCK_STREAM, 0));
    if (s >= 0)
        close(s);
    s = socket(AF_INET, SOCK_STREAM, 0);
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons(9); /* nothing listens: refused, not forbidden */
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TRY(P_CONNECT, connect(s, (struct sockaddr *)&sin, sizeof(sin)));
    TRY(P_NODELAY, setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)));
    TRY(P_ULP, setsockopt(s, IPPROTO_TCP, TCP_ULP, "tls", 3));
    /* the same with bits above 32 in the level or the name: the kernel reads the int, the filter must too */
    TRY(P_ULP_HIGH_LEVEL, syscall(SYS_setsockopt, s, (long)IPPROTO_TCP | (1L << 32), (long)TCP_ULP, "tls", 3L));
    TRY(P_ULP_HIGH_NAME, syscall(SYS_setsockopt, s, (long)IPPROTO_TCP, (long)TCP_ULP | (1L << 32), "tls", 3L));
#undef TRY
    (void)!write(out, res, sizeof(res));
    _exit(0);
}

/* runs the probes under the filter `variant`; 0 with res filled, or -1 */
static int run_under(int variant, int res[P_COUNT])
{
    struct sock_fprog prog;
    unsigned rules = 0;
    char err[256];
    int p[2], st = 0;
    pid_t pid;

    memset(&prog, 0, sizeof(prog));
    if (sb_shim_jail_build_filter(&prog, &rules, variant, err, sizeof(err)) != 0) {
        printf("# %s\n", err);
        return -1;
    }
    if (pipe(p) != 0)
        return -1;
    if ((pid = fork()) == 0) {
        close(p[0]);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0)
            _exit(2);
        probe(p[1]);
    }
    close(p[1]);
    memset(res, 0xff, sizeof(int) * P_COUNT);
    if (read(p[0], res, sizeof(int) * P_COUNT) != (ssize_t)(sizeof(int) * P_COUNT))
        res[0] = -1;
    close(p[0]);
    (void)waitpid(pid, &st, 0);
    sb_mem_free(prog.filter);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 && res[0] != -1 ? 0 : -1;
}

int main(void)
{
    int res[P_COUNT];

    if (!ok(run_under(SB_SHIM_JAIL_FILTER_LOOPBACK, res) == 0, "the probes ran under the loopback filter"))
        return done_testing();
    is_int(res[P_TCP0], 0, "socket(AF_INET, SOCK_STREAM, 0)");
    is_int(res[P_TCP], 0, "socket(AF_INET, SOCK_STREAM, IPPROTO_TCP)");
    is_int(res[P_SCTP], EPERM, "SCTP behind a stream socket: EPERM");
    is_int(res[P_MPTCP], EPERM, "MPTCP: EPERM");
    is_int(res[P_UDP], EPERM, "a datagram socket: EPERM");
    is_int(res[P_INET6], EPERM, "AF_INET6: EPERM");
    is_int(res[P_CONNECT], ECONNREFUSED, "connect is allowed (refused by the closed port, not the filter)");
    is_int(res[P_NODELAY], 0, "TCP_NODELAY");
    is_int(res[P_ULP], EPERM, "TCP_ULP: EPERM");
    is_int(res[P_ULP_HIGH_LEVEL], EPERM, "TCP_ULP with high bits in the level: EPERM");
    is_int(res[P_ULP_HIGH_NAME], EPERM, "TCP_ULP with high bits in the name: EPERM");

    if (!ok(run_under(SB_SHIM_JAIL_FILTER_THREADS, res) == 0, "the probes ran under the Deno filter without imports"))
        return done_testing();
    is_int(res[P_TCP0], EPERM, "no AF_INET socket at all");
    is_int(res[P_TCP], EPERM, "not with IPPROTO_TCP either");
    is_int(res[P_CONNECT], EPERM, "no connect");
    return done_testing();
}
