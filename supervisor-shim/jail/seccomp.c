/*
 * The guest's seccomp filter (jail.h; README.md, "The jail"): an allow-list.
 *
 * Every system call a guest may make is named below; everything else answers EPERM (so Deno reports
 * a clean PermissionDenied), system call numbers newer than this list ENOSYS, and a foreign ABI
 * kills the process. The list is what Deno 2.9.6 and plain C and Python relay guests were measured
 * to call once their filter is loaded (strace -f over tests/shim: the Deno guest tests, a guest
 * exercising timers, crypto, WebAssembly, Intl, structuredClone, 64 MiB buffers, TextDecoderStream
 * and import() of a data: module, Deno subprocesses under --allow-run, the relay tests' Python
 * guest and jail_probe), plus the calls of the same families those programs make on other paths
 * (the vectored and *at forms of what was seen, thread exit, signal return, time): measured set in
 * the README, "The jail".
 *
 * Per architecture: the names are resolved by libseccomp for the architecture the shim was built
 * for; names an architecture does not have are skipped. On x86_64 everything below applies. On
 * aarch64 the legacy calls (open, stat, lstat, access, pipe, poll, select, dup2, mkdir, rename,
 * unlink, symlink, readlink, getdents, epoll_wait, epoll_create, arch_prctl, time) do not exist and
 * glibc uses the *at / p* forms that are listed too; nothing else changes. Other architectures are
 * refused at build time (mounts.c knows the library layout of these two only).
 *
 * What the old deny-list said, and still holds as the reason a call is not listed here:
 *  - other processes' memory or state: ptrace, process_vm_*, process_madvise/mrelease, pidfd_getfd,
 *    kcmp, move_pages, migrate_pages;
 *  - kernel attack surface no runtime needs: bpf, perf_event_open, userfaultfd, io_uring_*, the key
 *    ring (keyctl, add_key, request_key), fanotify, open_by_handle_at/name_to_handle_at (file
 *    handles walk around directory permissions);
 *  - the filesystem layout and namespaces: mount, umount2, pivot_root, chroot and the new mount API,
 *    unshare, setns (clone with namespace flags is refused by an argument filter below);
 *  - the machine: kexec_*, *_module, reboot, swap, syslog, acct, quotas, clocks, hostname, port I/O;
 *  - leaving the process group the shim kills on every exit: setsid, setpgid;
 *  - reaching services through unix sockets bound to paths (the network namespace does not cover
 *    them): connect, bind, listen, accept(4), sendmsg/sendmmsg (their address cannot be inspected);
 *    sendto only without an address (below). socketpair(AF_UNIX) stays usable. The filter of Deno
 *    guests of runs with imports (SB_SHIM_JAIL_FILTER_LOOPBACK, below) allows connect: there it
 *    rests on the guest's own root, which holds no socket, and its own network namespace, which
 *    holds no abstract name;
 *  - socketcall (i386 and others): its arguments are in memory, so no family check is possible.
 * New with the allow-list: memfd_create, shared memory (shm*, mq_*), and System V IPC are refused
 * (memory outside RLIMIT_DATA that no measured guest used), and ioctl only takes the commands seen.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/sockios.h>
#include <seccomp.h>
#include "sb/mem.h"
#include "jail/jail.h"

/* clang-format off */
static const char *const allowed[] = {
    /* the program itself */
    "execve", "execveat", "exit", "exit_group", "arch_prctl", "set_tid_address", "set_robust_list", "get_robust_list",
    "rseq", "prlimit64", "getrlimit", "uname", "sysinfo", "getrandom", "getcpu", "restart_syscall",
    /* memory (mmap: below, no shared anonymous memory) */
    "brk", "munmap", "mprotect", "mremap", "madvise", "msync", "mincore", "pkey_alloc", "pkey_free",
    "pkey_mprotect", "membarrier",
    /* threads, processes of its own PID namespace, scheduling (clone: below, without namespace flags) */
    "wait4", "waitid", "kill", "tgkill", "tkill", "pidfd_open", "pidfd_send_signal",
    "gettid", "getpid", "getppid", "getpgrp", "getpgid", "getsid", "futex", "futex_waitv", "sched_yield",
    "sched_getaffinity", "sched_getparam", "sched_getscheduler", "sched_get_priority_max", "sched_get_priority_min",
    "getpriority", "getrusage", "times",
    /* credentials (reading only) */
    "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups",
    /* signals */
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigtimedwait", "rt_sigsuspend", "rt_sigpending",
    "sigaltstack", "signalfd4",
    /* time */
    "clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday", "time", "timerfd_create",
    "timerfd_settime", "timerfd_gettime", "alarm", "setitimer", "getitimer",
    /* descriptors and events */
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2", "lseek",
    "close", "close_range", "dup", "dup2", "dup3", "fcntl", "pipe", "pipe2", "poll", "ppoll", "select", "pselect6",
    "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd2",
    "sendfile", "copy_file_range", "splice", "tee",
    /* files: the root is read-only, only the scratch is writable */
    "open", "openat", "openat2", "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs", "access",
    "faccessat", "faccessat2", "readlink", "readlinkat", "getdents64", "getcwd", "chdir", "fchdir", "mkdir", "mkdirat",
    "rmdir", "unlink", "unlinkat", "rename", "renameat", "renameat2", "symlink", "symlinkat", "link", "linkat",
    "ftruncate", "truncate", "fsync", "fdatasync", "fallocate", "flock", "chmod", "fchmod", "fchmodat", "utimensat",
    "umask",
    /* sockets: AF_UNIX and socketpairs only (argument filters below); no connect, bind, listen, accept */
    "recvfrom", "recvmsg", "recvmmsg", "shutdown", "getsockopt", "setsockopt", "getsockname", "getpeername",
};
/* clang-format on */

/* ioctl commands seen (the command is 32 bits wide): terminal queries Deno, Python and the C
 * library make on their stdio, close-on-exec and non-blocking flags, interface names and flags of
 * the guest's own network namespace (lo); TIOCSTI and TIOCLINUX (typing into a terminal) are not */
static const unsigned long ioctl_allowed[] = {TCGETS, TIOCGWINSZ, FIOCLEX, FIONCLEX, FIONBIO, FIONREAD, SIOCGIFNAME, SIOCGIFFLAGS};

/* clone(2) flags that would make new namespaces (CLONE_NEWTIME shares bits with the exit signal in clone) */
#define CLONE_NS_MASK                                                                                                              \
    ((unsigned long)(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP))

/*
 * System call numbers past the last one this filter was written against (cachestat, 451, is the
 * last the Debian 12 headers and libseccomp 2.5.4 know) answer ENOSYS: new kernel interfaces are
 * refused until they are reviewed, and C libraries fall back on ENOSYS. From 424 on every
 * architecture shares one numbering.
 */
#define JAIL_FIRST_UNREVIEWED 452
#define JAIL_LAST_UNREVIEWED 511

static int add_rule(scmp_filter_ctx ctx, uint32_t action, int nr, unsigned count, const struct scmp_arg_cmp *cmp, char *err,
                    size_t errsz, const char *what)
{
    int rc = seccomp_rule_add_array(ctx, action, nr, count, cmp);
    if (rc != 0) {
        snprintf(err, errsz, "jail: cannot build the seccomp filter (%s: %s)", what, strerror(-rc));
        return -1;
    }
    return 0;
}

int sb_shim_jail_build_filter(struct sock_fprog *prog, unsigned *rules, int threads_only, char *err, size_t errsz)
{
    scmp_filter_ctx ctx;
    const uint32_t allow = SCMP_ACT_ALLOW, enosys = SCMP_ACT_ERRNO(ENOSYS);
    struct scmp_arg_cmp cmp;
    struct stat st;
    int fd = -1, ret = -1, rc;
    ssize_t n;

    /* a kernel (or container) without seccomp filters: say so, rather than what libseccomp makes of it */
    {
        uint32_t act = SECCOMP_RET_KILL_PROCESS;
        if (syscall(SYS_seccomp, SECCOMP_GET_ACTION_AVAIL, 0, &act) != 0) {
            snprintf(err, errsz, "jail: the kernel refuses seccomp filters (seccomp: %s)", strerror(errno));
            return -1;
        }
    }
    /* everything not allowed below: EPERM */
    if ((ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM))) == NULL) {
        snprintf(err, errsz, "jail: cannot build the seccomp filter (out of memory)");
        return -1;
    }
    /* foreign ABIs (i386 through int 0x80, x32 on x86_64) never reach the rules: they kill */
    if ((rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS)) != 0 ||
        (rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0)) != 0 ||
        (rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2)) != 0) {
        snprintf(err, errsz, "jail: cannot build the seccomp filter (attributes: %s)", strerror(-rc));
        goto Exit;
    }
    *rules = 0;
    for (size_t i = 0; i < sizeof(allowed) / sizeof(allowed[0]); ++i) {
        int nr = seccomp_syscall_resolve_name(allowed[i]);
        if (nr == __NR_SCMP_ERROR || nr < 0)
            continue; /* not a system call on this architecture (see above) */
        if (threads_only == SB_SHIM_JAIL_FILTER_LOOPBACK && nr == SCMP_SYS(setsockopt))
            continue; /* with TCP sockets, an argument filter (below) */
        if (add_rule(ctx, allow, nr, 0, NULL, err, errsz, allowed[i]) != 0)
            goto Exit;
        ++*rules;
    }
    /*
     * prctl: the options a guest was seen to use (naming threads and memory), reading, and nothing
     * that undoes the jail: PR_SET_PDEATHSIG only to a signal (0 would let the guest outlive the
     * process that runs it), never PR_SET_DUMPABLE, PR_SET_PTRACER, PR_SET_CHILD_SUBREAPER, PR_SET_MM,
     * the securebits or the capability sets.
     */
    {
        static const unsigned long prctl_ok[] = {PR_SET_NAME,
                                                 PR_GET_NAME,
                                                 PR_SET_VMA,
                                                 PR_GET_DUMPABLE,
                                                 PR_GET_PDEATHSIG,
                                                 PR_GET_NO_NEW_PRIVS,
                                                 PR_SET_NO_NEW_PRIVS,
                                                 PR_GET_SECCOMP,
                                                 PR_CAPBSET_READ,
                                                 PR_GET_TIMERSLACK,
                                                 PR_SET_TIMERSLACK,
                                                 PR_GET_KEEPCAPS,
                                                 PR_GET_CHILD_SUBREAPER,
                                                 PR_GET_THP_DISABLE,
                                                 PR_GET_TID_ADDRESS,
                                                 PR_GET_SECUREBITS,
                                                 PR_GET_SPECULATION_CTRL,
                                                 PR_SET_SPECULATION_CTRL};
        for (size_t i = 0; i < sizeof(prctl_ok) / sizeof(prctl_ok[0]); ++i) {
            cmp = SCMP_A0(SCMP_CMP_EQ, prctl_ok[i]);
            if (add_rule(ctx, allow, SCMP_SYS(prctl), 1, &cmp, err, errsz, "prctl") != 0)
                goto Exit;
            ++*rules;
        }
        {
            struct scmp_arg_cmp pd[2] = {SCMP_A0(SCMP_CMP_EQ, PR_SET_PDEATHSIG), SCMP_A1(SCMP_CMP_NE, 0)};
            if (add_rule(ctx, allow, SCMP_SYS(prctl), 2, pd, err, errsz, "prctl") != 0)
                goto Exit;
            ++*rules;
        }
    }
    /* sockets: AF_UNIX only (the comparison is on the full register, so high bits cannot sneak past) */
    cmp = SCMP_A0(SCMP_CMP_EQ, AF_UNIX);
    if (add_rule(ctx, allow, SCMP_SYS(socket), 1, &cmp, err, errsz, "socket") != 0 ||
        add_rule(ctx, allow, SCMP_SYS(socketpair), 1, &cmp, err, errsz, "socketpair") != 0)
        goto Exit;
    /*
     * Runs with imports: Deno's module loader is a TCP client of the module path's listeners, which the
     * jail made on 127.0.0.1 in the guest's own network namespace (relay/modules.h). That namespace holds
     * its loopback and nothing else, so a stream socket there reaches those listeners or nothing; no
     * bind, listen or accept, and no other family or type (the type compared without its flags).
     * connect takes any socket: a unix one reaches abstract names of this namespace only (it has
     * none) and paths in the guest's own root (which holds no socket).
     */
    if (threads_only == SB_SHIM_JAIL_FILTER_LOOPBACK) {
        /* TCP itself (protocol 0 or IPPROTO_TCP): no SCTP, MPTCP or other protocol behind a stream socket */
        struct scmp_arg_cmp tcp0[3] = {SCMP_A0(SCMP_CMP_EQ, AF_INET), SCMP_A1(SCMP_CMP_MASKED_EQ, 0xf, SOCK_STREAM),
                                       SCMP_A2(SCMP_CMP_EQ, 0)};
        struct scmp_arg_cmp tcp6[3] = {SCMP_A0(SCMP_CMP_EQ, AF_INET), SCMP_A1(SCMP_CMP_MASKED_EQ, 0xf, SOCK_STREAM),
                                       SCMP_A2(SCMP_CMP_EQ, IPPROTO_TCP)};
        /* socket options: SOL_SOCKET's, and of TCP's only the ones a client sets (TCP_ULP would put kernel TLS, and a
         * module load, behind the socket). Level and name are ints the kernel reads from the low 32 bits: compared
         * there (masked), and as an allow-list, since libseccomp lets an unconditional allow win over a deny */
        static const unsigned tcp_opts[] = {TCP_NODELAY, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT};
        struct scmp_arg_cmp sol[1] = {SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, SOL_SOCKET)};
        if (add_rule(ctx, allow, SCMP_SYS(socket), 3, tcp0, err, errsz, "socket") != 0 ||
            add_rule(ctx, allow, SCMP_SYS(socket), 3, tcp6, err, errsz, "socket") != 0 ||
            add_rule(ctx, allow, SCMP_SYS(connect), 0, NULL, err, errsz, "connect") != 0 ||
            add_rule(ctx, allow, SCMP_SYS(setsockopt), 1, sol, err, errsz, "setsockopt") != 0)
            goto Exit;
        *rules += 4;
        for (size_t i = 0; i < sizeof(tcp_opts) / sizeof(tcp_opts[0]); ++i) {
            struct scmp_arg_cmp opt[2] = {SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, IPPROTO_TCP),
                                          SCMP_A2(SCMP_CMP_MASKED_EQ, 0xffffffffu, tcp_opts[i])};
            if (add_rule(ctx, allow, SCMP_SYS(setsockopt), 2, opt, err, errsz, "setsockopt") != 0)
                goto Exit;
            ++*rules;
        }
    }
    /* a datagram with a destination address could reach a unix socket bound to a path */
    cmp = SCMP_A4(SCMP_CMP_EQ, 0);
    if (add_rule(ctx, allow, SCMP_SYS(sendto), 1, &cmp, err, errsz, "sendto") != 0)
        goto Exit;
    /*
     * clone without any namespace flag; clone3 keeps its flags in memory, so it answers ENOSYS and
     * the C library falls back to clone, whose flags are in a register. A Deno guest (threads_only)
     * was never seen to start a process (it runs with --deny-run): it may start threads only, so
     * that RLIMIT_DATA, which is per process, bounds the whole run's memory where no cgroup does.
     */
    if (threads_only)
        cmp = SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NS_MASK | CLONE_THREAD, CLONE_THREAD);
    else
        cmp = SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NS_MASK, 0);
    if (add_rule(ctx, allow, SCMP_SYS(clone), 1, &cmp, err, errsz, "clone") != 0 ||
        add_rule(ctx, enosys, SCMP_SYS(clone3), 0, NULL, err, errsz, "clone3") != 0)
        goto Exit;
    if (!threads_only) {
        int fk = seccomp_syscall_resolve_name("fork"), vf = seccomp_syscall_resolve_name("vfork");
        if ((fk >= 0 && add_rule(ctx, allow, fk, 0, NULL, err, errsz, "fork") != 0) ||
            (vf >= 0 && add_rule(ctx, allow, vf, 0, NULL, err, errsz, "vfork") != 0))
            goto Exit;
    }
    /* mmap: file mappings (bounded by their files: read-only binds, or the capped scratch) and private
     * anonymous memory (counted in RLIMIT_DATA); shared anonymous memory is neither, and refused */
    cmp = SCMP_A3(SCMP_CMP_MASKED_EQ, MAP_ANONYMOUS, 0);
    if (add_rule(ctx, allow, SCMP_SYS(mmap), 1, &cmp, err, errsz, "mmap") != 0)
        goto Exit;
    cmp = SCMP_A3(SCMP_CMP_MASKED_EQ, MAP_ANONYMOUS | MAP_SHARED_VALIDATE, MAP_ANONYMOUS | MAP_PRIVATE);
    if (add_rule(ctx, allow, SCMP_SYS(mmap), 1, &cmp, err, errsz, "mmap") != 0)
        goto Exit;
    *rules += 7;
    for (size_t i = 0; i < sizeof(ioctl_allowed) / sizeof(ioctl_allowed[0]); ++i) {
        cmp = SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, ioctl_allowed[i]);
        if (add_rule(ctx, allow, SCMP_SYS(ioctl), 1, &cmp, err, errsz, "ioctl") != 0)
            goto Exit;
        ++*rules;
    }
    for (int nr = JAIL_FIRST_UNREVIEWED; nr <= JAIL_LAST_UNREVIEWED; ++nr) {
        if (add_rule(ctx, enosys, nr, 0, NULL, err, errsz, "unreviewed system call") != 0)
            goto Exit;
        ++*rules;
    }

    if ((fd = memfd_create("sb-shim-seccomp", MFD_CLOEXEC)) < 0) {
        snprintf(err, errsz, "jail: cannot export the seccomp filter (memfd_create: %s)", strerror(errno));
        goto Exit;
    }
    if ((rc = seccomp_export_bpf(ctx, fd)) != 0) {
        snprintf(err, errsz, "jail: cannot export the seccomp filter (%s)", strerror(-rc));
        goto Exit;
    }
    if (fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size % (off_t)sizeof(struct sock_filter) != 0 ||
        st.st_size / (off_t)sizeof(struct sock_filter) > BPF_MAXINSNS) {
        snprintf(err, errsz, "jail: the exported seccomp filter has an unexpected size");
        goto Exit;
    }
    if ((prog->filter = sb_mem_try_alloc((size_t)st.st_size)) == NULL) {
        snprintf(err, errsz, "jail: out of memory");
        goto Exit;
    }
    n = pread(fd, prog->filter, (size_t)st.st_size, 0);
    if (n != st.st_size) {
        snprintf(err, errsz, "jail: cannot read back the seccomp filter");
        goto Exit;
    }
    prog->len = (unsigned short)(st.st_size / (off_t)sizeof(struct sock_filter));
    ret = 0;
Exit:
    if (fd >= 0)
        close(fd);
    seccomp_release(ctx);
    return ret;
}
