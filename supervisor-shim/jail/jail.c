/*
 * The guest jail (see jail.h; what each layer stops and does not stop is in README.md, "The jail").
 *
 * Why each piece is there:
 *  - user namespace: the guest's ids are mapped one to one (inside uid U is outside uid U) and the
 *    namespace's root is unmapped, so nothing in it is ever uid 0 and exec grants no capabilities.
 *    As root we hand every concurrent guest a uid of its own (uid_base + slot), so one guest cannot
 *    signal, ptrace or read another's /proc files; RLIMIT_NPROC is counted per user namespace and
 *    uid since Linux 5.14, so it is a per-run cap either way.
 *  - PID namespace: the guest is pid 1 of its own namespace; when it dies (it has PR_SET_PDEATHSIG,
 *    so also when the shim dies) the kernel kills everything it started, setsid() or not, and the
 *    guest cannot name any process outside by pid (kill, pidfd_open).
 *  - network namespace: only `lo`, down; no route to anything. Abstract unix sockets are per
 *    network namespace too. Unix sockets bound to paths are not: connect/bind are refused below.
 *  - IPC, UTS and cgroup namespaces: no System V IPC or POSIX message queues shared with the host,
 *    the hostname reads "sandbox", and /proc/self/cgroup does not show the host's cgroup paths.
 *  - mount namespace: a root of its own (mounts.c).
 *  - seccomp: an allow-list of what Deno and plain relay guests were measured to call (seccomp.c),
 *    everything else refused with EPERM so Deno reports a clean error; foreign system call ABIs
 *    (i386 int 0x80, x32) kill the process, since a 64-bit runtime never uses them and they would
 *    bypass every rule.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/securebits.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <seccomp.h>
#include "sb/mem.h"
#include "jail/child.h"
#include "jail/jail.h"

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

/* the namespaces of every jailed guest, as clone(2) flags */
/* (the cgroup namespace comes later, in sb_shim_jail_enter: once the guest is in its run's cgroup) */
#define JAIL_NS_FLAGS ((unsigned long)(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS))

struct st_sb_shim_jail_t {
    int on;
    int privileged; /* root: a uid per guest, maps written as a privileged process */
    unsigned long uid_base;
    unsigned slots;
    unsigned nproc;
    unsigned long long fsize;
    char *lock_file;
    int cgroup_dir; /* -1: none */
    char *cgroup_path;
    struct sock_fprog prog;          /* relay guests: processes allowed */
    struct sock_fprog prog_threads;  /* Deno guests: threads only */
    struct sock_fprog prog_loopback; /* Deno guests of runs with imports: threads and loopback TCP clients */
    unsigned rules;
    char describe[1536];
};

static atomic_uint_fast64_t jail_failures;
static atomic_uint cgroup_seq;

void sb_shim_jail_count_failure(void)
{
    atomic_fetch_add(&jail_failures, 1);
}

uint64_t sb_shim_jail_failures(void)
{
    return (uint64_t)atomic_load(&jail_failures);
}

unsigned long long sb_shim_jail_cpu_limit(unsigned timeout_ms)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);

    if (timeout_ms == 0)
        return 0;
    return (unsigned long long)(cpus > 0 ? cpus : 1) * ((timeout_ms + 999ull) / 1000u) + SB_SHIM_JAIL_CPU_MARGIN_S;
}

unsigned long long sb_shim_jail_scratch_bytes(const sb_shim_jail_t *j)
{
    return j->fsize;
}

unsigned long sb_shim_jail_clone_flags(void)
{
    return JAIL_NS_FLAGS;
}

void sb_shim_jail_config_init(sb_shim_jail_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->uid_base = SB_SHIM_JAIL_UID_BASE;
    cfg->slots = SB_SHIM_JAIL_SLOTS;
    cfg->nproc = SB_SHIM_JAIL_NPROC;
    cfg->fsize = SB_SHIM_JAIL_FSIZE;
    cfg->lock_file = SB_SHIM_JAIL_LOCK_FILE;
}

/* strict decimal in [min, max] */
static int parse_ull(const char *s, unsigned long long min, unsigned long long max, unsigned long long *out)
{
    unsigned long long v = 0;

    if (s == NULL || *s == '\0' || strlen(s) > 12)
        return -1;
    for (const char *p = s; *p != '\0'; ++p) {
        if (*p < '0' || *p > '9')
            return -1;
        v = v * 10 + (unsigned long long)(*p - '0');
    }
    if (v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int sb_shim_jail_config_option(sb_shim_jail_config_t *cfg, const char *name, const char *val, const char **why)
{
    unsigned long long v;

    if (strncmp(name, "--jail=", 7) == 0 || strcmp(name, "--jail") == 0) {
        const char *w = name[6] == '=' ? name + 7 : val;
        if (w != NULL && strcmp(w, "on") == 0) {
            cfg->off = 0;
        } else if (w != NULL && strcmp(w, "off") == 0) {
            cfg->off = 1;
        } else {
            *why = "--jail wants on or off";
            return -1;
        }
        return 1;
    }
    if (strcmp(name, "--jail-uid-base") == 0) {
        /* uid 0 is never a guest; ids at 2^31 and above are avoided (signed-id bugs in tools) */
        if (parse_ull(val, 1, 0x7fffffffull, &v) != 0) {
            *why = "--jail-uid-base wants 1..2147483647";
            return -1;
        }
        cfg->uid_base = (unsigned long)v;
    } else if (strcmp(name, "--jail-slots") == 0) {
        if (parse_ull(val, 1, 65536, &v) != 0) {
            *why = "--jail-slots wants 1..65536";
            return -1;
        }
        cfg->slots = (unsigned)v;
    } else if (strcmp(name, "--jail-nproc") == 0) {
        if (parse_ull(val, 1, 65536, &v) != 0) {
            *why = "--jail-nproc wants 1..65536";
            return -1;
        }
        cfg->nproc = (unsigned)v;
    } else if (strcmp(name, "--jail-fsize-mb") == 0) {
        /* not 0: Deno writes its SQLite caches into DENO_DIR and dies of SIGXFSZ under 0 */
        if (parse_ull(val, 1, 1048576, &v) != 0) {
            *why = "--jail-fsize-mb wants 1..1048576";
            return -1;
        }
        cfg->fsize = v * 1024u * 1024u;
    } else if (strcmp(name, "--jail-cgroup") == 0) {
        if (val == NULL || val[0] != '/') {
            *why = "--jail-cgroup wants an absolute directory";
            return -1;
        }
        cfg->cgroup = val;
    } else if (strcmp(name, "--jail-lock-file") == 0) {
        if (val == NULL || val[0] != '/') {
            *why = "--jail-lock-file wants an absolute path";
            return -1;
        }
        cfg->lock_file = val;
    } else {
        return 0;
    }
    return 1;
}

/* ---- start-up checks ---- */

/* 1 when [first, first + count) of our own user namespace's ids is mapped (/proc/self/{u,g}id_map) */
static int ids_mapped(const char *file, unsigned long first, unsigned long count)
{
    char buf[4096];
    const char *p;

    if (sb_shim_read_small_file(file, buf, sizeof(buf)) < 0)
        return 0;
    for (p = buf; *p != '\0';) {
        unsigned long long v[3] = {0, 0, 0};
        for (int k = 0; k < 3; ++k) {
            while (*p == ' ')
                ++p;
            if (*p < '0' || *p > '9')
                return 0;
            while (*p >= '0' && *p <= '9')
                v[k] = v[k] * 10 + (unsigned long long)(*p++ - '0');
        }
        /* inside-first, outside-first, count: our ids are the inside ones */
        if (first >= v[0] && first + count <= v[0] + v[2])
            return 1;
        while (*p != '\0' && *p != '\n')
            ++p;
        if (*p == '\n')
            ++p;
    }
    return 0;
}

/* reads a small file below `dirfd` into buf (NUL-terminated); -1 on error */
static ssize_t read_small(int dirfd, const char *name, char *buf, size_t bufsz)
{
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    ssize_t n;

    if (fd < 0)
        return -1;
    n = read(fd, buf, bufsz - 1);
    close(fd);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    return n;
}

static int has_word(const char *list, const char *word)
{
    size_t wl = strlen(word);
    for (const char *p = list; (p = strstr(p, word)) != NULL; p += wl)
        if ((p == list || p[-1] == ' ') && (p[wl] == '\0' || p[wl] == ' ' || p[wl] == '\n'))
            return 1;
    return 0;
}

static int open_cgroup(sb_shim_jail_t *j, const char *path, char *err, size_t errsz)
{
    struct statfs sf;
    char ctl[512];

    if ((j->cgroup_dir = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        snprintf(err, errsz, "jail: cannot open the cgroup directory %s: %s", path, strerror(errno));
        return -1;
    }
    if (fstatfs(j->cgroup_dir, &sf) != 0 || sf.f_type != CGROUP2_SUPER_MAGIC) {
        snprintf(err, errsz, "jail: %s is not a cgroup v2 directory", path);
        return -1;
    }
    /* the per-run cgroups are its children: their memory.max and pids.max exist only if the
     * controllers are enabled in this directory's subtree_control */
    if (read_small(j->cgroup_dir, "cgroup.subtree_control", ctl, sizeof(ctl)) < 0) {
        snprintf(err, errsz, "jail: cannot read %s/cgroup.subtree_control: %s", path, strerror(errno));
        return -1;
    }
    if (!has_word(ctl, "memory") || !has_word(ctl, "pids")) {
        size_t l = strlen(ctl);
        while (l > 0 && ctl[l - 1] == '\n')
            ctl[--l] = '\0';
        snprintf(err, errsz, "jail: the memory and pids controllers are not enabled in %s/cgroup.subtree_control (it has: %s)",
                 path, l != 0 ? ctl : "none");
        return -1;
    }
    if (faccessat(j->cgroup_dir, ".", W_OK, AT_EACCESS) != 0) {
        snprintf(err, errsz, "jail: cannot create cgroups in %s: %s", path, strerror(errno));
        return -1;
    }
    if ((j->cgroup_path = sb_mem_try_strdup(path)) == NULL) {
        snprintf(err, errsz, "jail: out of memory");
        return -1;
    }
    return 0;
}

/* the lock file's directory: created root-only when missing, so nobody else can hold our uids */
static int open_lock_file(const char *path, char *err, size_t errsz)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    int fd;

    if (slash == NULL || (size_t)(slash - path) >= sizeof(dir)) {
        snprintf(err, errsz, "jail: bad lock file path %s", path);
        return -1;
    }
    if (slash != path) {
        memcpy(dir, path, (size_t)(slash - path));
        dir[slash - path] = '\0';
        if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
            snprintf(err, errsz, "jail: cannot create %s: %s", dir, strerror(errno));
            return -1;
        }
    }
    if ((fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0) {
        snprintf(err, errsz, "jail: cannot open the uid lock file %s: %s", path, strerror(errno));
        return -1;
    }
    return fd;
}

sb_shim_jail_t *sb_shim_jail_new(const sb_shim_jail_config_t *cfg, char *err, size_t errsz)
{
    sb_shim_jail_t *j = sb_mem_try_calloc(1, sizeof(*j));
    int fd;

    if (j == NULL) {
        snprintf(err, errsz, "jail: out of memory");
        return NULL;
    }
    j->cgroup_dir = -1;
    if (cfg->off) {
        snprintf(j->describe, sizeof(j->describe),
                 "jail: OFF (--jail=off): the guest runs without namespaces, seccomp, a uid of its own or process and "
                 "file-size limits; only the runtime's own permissions stand between it and this machine");
        return j;
    }
    j->on = 1;
    j->privileged = geteuid() == 0;
    j->uid_base = cfg->uid_base;
    j->slots = cfg->slots;
    j->nproc = cfg->nproc;
    j->fsize = cfg->fsize;
    if (j->privileged) {
        if ((unsigned long long)cfg->uid_base + cfg->slots > 0x80000000ull) {
            snprintf(err, errsz, "jail: --jail-uid-base + --jail-slots must stay below 2^31");
            goto Fail;
        }
        if (!ids_mapped("/proc/self/uid_map", cfg->uid_base, cfg->slots) ||
            !ids_mapped("/proc/self/gid_map", cfg->uid_base, cfg->slots)) {
            snprintf(err, errsz, "jail: guest ids %lu..%lu are not mapped in this user namespace (--jail-uid-base)", cfg->uid_base,
                     cfg->uid_base + cfg->slots - 1);
            goto Fail;
        }
        if ((fd = open_lock_file(cfg->lock_file, err, errsz)) < 0)
            goto Fail;
        close(fd);
        if ((j->lock_file = sb_mem_try_strdup(cfg->lock_file)) == NULL) {
            snprintf(err, errsz, "jail: out of memory");
            goto Fail;
        }
    }
    if (cfg->cgroup != NULL && open_cgroup(j, cfg->cgroup, err, errsz) != 0)
        goto Fail;
    if (sb_shim_jail_build_filter(&j->prog, &j->rules, 0, err, errsz) != 0)
        goto Fail;

    {
        char ids[128], mem[512], left[200] = "";
        unsigned removed = 0, kept = 0;
        /* what guests of an older shim left under TMPDIR, whose uids run nothing now (leftovers.c) */
        if (j->privileged)
            sb_shim_jail__sweep((uid_t)j->uid_base, j->slots, &removed, &kept);
        if (removed != 0 || kept != 0)
            snprintf(left, sizeof(left),
                     "; %u work directories older guests left under TMPDIR removed, %u kept (their uids are not handed out)",
                     removed, kept);
        if (j->privileged)
            snprintf(ids, sizeof(ids), "uid/gid %lu+slot (%u slots)", j->uid_base, j->slots);
        else
            snprintf(ids, sizeof(ids), "uid/gid %lu/%lu shared by every guest (not root: run as root for a uid per guest)",
                     (unsigned long)geteuid(), (unsigned long)getegid());
        if (j->cgroup_path != NULL)
            snprintf(mem, sizeof(mem), "a cgroup per run under %s (memory.max = memory limit + %u MiB, pids.max %u)",
                     j->cgroup_path, SB_SHIM_JAIL_DENO_OVERHEAD_MB, j->nproc);
        else
            snprintf(
                mem, sizeof(mem),
                "no cgroup v2 subtree (--jail-cgroup): memory is bounded only by the V8 heap cap and "
                "RLIMIT_DATA (per process: a Deno guest is one process, its filter allows threads only; a relay "
                "guest may fork up to RLIMIT_NPROC processes, each with its own), and the scratch tmpfs by its "
                "size; shared anonymous memory, memfd, shm and (for Deno guests) /dev/zero are refused; processes by RLIMIT_NPROC");
        snprintf(
            j->describe, sizeof(j->describe),
            "jail: on: user, mount, pid, net (lo down), ipc, uts, cgroup namespaces; a tmpfs root of its own (the "
            "executable and its libraries read-only, /dev null random urandom (and zero for relay guests), /proc/self/exe only, "
            "scratch /work %llu MiB / %u inodes; no host /tmp, /etc, /home, /sys); %s, no groups or capabilities; "
            "no_new_privs; seccomp allow-list (%u rules, everything else EPERM); rlimits nproc %u, fsize %llu MiB, data "
            "memory limit + %u MiB + "
            "%u MiB per CPU, core 0; %s%s",
            j->fsize / (1024u * 1024u), SB_SHIM_JAIL_SCRATCH_INODES, ids, j->rules, j->nproc, j->fsize / (1024u * 1024u),
            SB_SHIM_JAIL_DATA_BASE_MB, SB_SHIM_JAIL_DATA_PER_CPU_MB, mem, left);
    }
    return j;
Fail:
    sb_shim_jail_free(j);
    return NULL;
}

void sb_shim_jail_free(sb_shim_jail_t *j)
{
    if (j == NULL)
        return;
    if (j->cgroup_dir >= 0)
        close(j->cgroup_dir);
    sb_mem_free(j->cgroup_path);
    sb_mem_free(j->lock_file);
    sb_mem_free(j->prog.filter);
    sb_mem_free(j->prog_threads.filter);
    sb_mem_free(j->prog_loopback.filter);
    sb_mem_free(j);
}

int sb_shim_jail_enabled(const sb_shim_jail_t *j)
{
    return j != NULL && j->on;
}

int sb_shim_jail_privileged(const sb_shim_jail_t *j)
{
    return j != NULL && j->privileged;
}

const char *sb_shim_jail_describe(const sb_shim_jail_t *j)
{
    return j->describe;
}

/* ---- per run ---- */

/*
 * 1 when a process runs as `uid` (any of its real, effective, saved or filesystem uids), or when that
 * cannot be known. A lock is given back when the process holding it dies, which can be before its
 * guest is gone (the guest dies of PR_SET_PDEATHSIG a moment later, or a guest of an older shim
 * outlived it): the slot is taken only once nothing runs as its uid any more.
 */
int sb_shim_jail__uid_in_use(uid_t uid)
{
    DIR *d = opendir("/proc");
    struct dirent *de;
    int used = 0;

    if (d == NULL)
        return 1;
    while (!used && (de = readdir(d)) != NULL) {
        char path[64], buf[2048];
        const char *p;
        int fd;
        ssize_t n;
        if (de->d_name[0] < '1' || de->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%.20s/status", de->d_name);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            continue; /* gone meanwhile */
        n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
            continue;
        buf[n] = '\0';
        /* the kernel escapes newlines in Name:, so "\nUid:" is its own line */
        if ((p = strstr(buf, "\nUid:")) == NULL)
            continue;
        p += 5;
        for (int k = 0; k < 4 && !used; ++k) {
            unsigned long long v = 0;
            while (*p == '\t' || *p == ' ')
                ++p;
            if (*p < '0' || *p > '9')
                break;
            while (*p >= '0' && *p <= '9')
                v = v * 10 + (unsigned long long)(*p++ - '0');
            used = v == (unsigned long long)uid;
        }
    }
    closedir(d);
    return used;
}

/* takes the byte at offset `uid` of the lock file; an open file description lock, so two runs of
 * one process conflict like two processes do, and the lock goes when the descriptor is closed */
static int take_uid(const sb_shim_jail_t *j, sb_shim_jail_run_t *run, char *err, size_t errsz)
{
    unsigned start = 0;
    int fd = open(j->lock_file, O_RDWR | O_CLOEXEC | O_NOFOLLOW);

    if (fd < 0) {
        snprintf(err, errsz, "jail: cannot open the uid lock file %s: %s", j->lock_file, strerror(errno));
        return -1;
    }
    if (getrandom(&start, sizeof(start), GRND_NONBLOCK) != (ssize_t)sizeof(start))
        start = (unsigned)getpid();
    for (unsigned i = 0; i < j->slots; ++i) {
        unsigned long uid = j->uid_base + (start + i) % j->slots;
        struct flock fl;
        memset(&fl, 0, sizeof(fl));
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        fl.l_start = (off_t)uid;
        fl.l_len = 1;
        if (fcntl(fd, F_OFD_SETLK, &fl) == 0) {
            /* still running as it, or owning what an older shim's guest left: not handed out */
            if (sb_shim_jail__uid_in_use((uid_t)uid) || sb_shim_jail__uid_owns_files((uid_t)uid)) {
                fl.l_type = F_UNLCK;
                (void)fcntl(fd, F_OFD_SETLK, &fl);
                continue;
            }
            run->uid = (uid_t)uid;
            run->gid = (gid_t)uid;
            run->lock_fd = fd;
            return 0;
        }
        if (errno != EAGAIN && errno != EACCES) {
            snprintf(err, errsz, "jail: cannot lock a guest uid: %s", strerror(errno));
            close(fd);
            return -1;
        }
    }
    close(fd);
    snprintf(err, errsz, "jail: all %u guest uids are in use (--jail-slots)", j->slots);
    return -1;
}

static int write_at(int dirfd, const char *name, const char *val)
{
    int fd = openat(dirfd, name, O_WRONLY | O_CLOEXEC);
    size_t n = strlen(val);
    ssize_t w;

    if (fd < 0)
        return -1;
    w = write(fd, val, n);
    if (w != (ssize_t)n) {
        int e = w < 0 ? errno : EIO;
        close(fd);
        errno = e;
        return -1;
    }
    return close(fd);
}

static int make_cgroup(const sb_shim_jail_t *j, unsigned memory_mb, sb_shim_jail_run_t *run, char *err, size_t errsz)
{
    char val[32];
    unsigned long long mem = ((unsigned long long)memory_mb + SB_SHIM_JAIL_DENO_OVERHEAD_MB) * 1024u * 1024u;

    snprintf(run->cgroup_name, sizeof(run->cgroup_name), "sb-%ld-%u", (long)getpid(), atomic_fetch_add(&cgroup_seq, 1));
    if (mkdirat(j->cgroup_dir, run->cgroup_name, 0755) != 0) {
        snprintf(err, errsz, "jail: cannot create the run's cgroup in %s: %s", j->cgroup_path, strerror(errno));
        run->cgroup_name[0] = '\0';
        return -1;
    }
    if ((run->cgroup_fd = openat(j->cgroup_dir, run->cgroup_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        snprintf(err, errsz, "jail: cannot open the run's cgroup: %s", strerror(errno));
        return -1;
    }
    snprintf(val, sizeof(val), "%llu", mem);
    if (write_at(run->cgroup_fd, "memory.max", val) != 0) {
        snprintf(err, errsz, "jail: cannot set memory.max: %s", strerror(errno));
        return -1;
    }
    /* swap would let the guest exceed memory.max; the file exists only with swap accounting */
    if (write_at(run->cgroup_fd, "memory.swap.max", "0") != 0 && errno != ENOENT) {
        snprintf(err, errsz, "jail: cannot set memory.swap.max: %s", strerror(errno));
        return -1;
    }
    /* an OOM kill takes the whole run, not one thread's process of it */
    if (write_at(run->cgroup_fd, "memory.oom.group", "1") != 0 && errno != ENOENT) {
        snprintf(err, errsz, "jail: cannot set memory.oom.group: %s", strerror(errno));
        return -1;
    }
    snprintf(val, sizeof(val), "%u", j->nproc);
    if (write_at(run->cgroup_fd, "pids.max", val) != 0) {
        snprintf(err, errsz, "jail: cannot set pids.max: %s", strerror(errno));
        return -1;
    }
    return 0;
}

sb_status_t sb_shim_jail_begin(sb_shim_jail_t *j, unsigned memory_mb, const char *home, sb_shim_jail_run_t *run, char *err,
                               size_t errsz)
{
    memset(run, 0, sizeof(*run));
    run->lock_fd = run->cgroup_fd = run->parent_fd = -1;
    if (!sb_shim_jail_enabled(j))
        return SB_OK;
    run->active = 1;
    {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        unsigned long long mb = (unsigned long long)(memory_mb != 0 ? memory_mb : SB_SHIM_JAIL_DEFAULT_MEMORY_MB) +
                                SB_SHIM_JAIL_DATA_BASE_MB +
                                SB_SHIM_JAIL_DATA_PER_CPU_MB * (unsigned long long)(cpus > 0 ? cpus : 1);
        run->data_limit = mb * 1024u * 1024u;
    }
    if (j->privileged) {
        if (take_uid(j, run, err, errsz) != 0)
            goto Fail;
    } else {
        run->uid = geteuid();
        run->gid = getegid();
    }
    if (home != NULL && j->privileged && fchownat(AT_FDCWD, home, run->uid, run->gid, AT_SYMLINK_NOFOLLOW) != 0) {
        snprintf(err, errsz, "jail: cannot hand %s to the guest uid: %s", home, strerror(errno));
        goto Fail;
    }
    if (j->cgroup_dir >= 0 && make_cgroup(j, memory_mb != 0 ? memory_mb : SB_SHIM_JAIL_DEFAULT_MEMORY_MB, run, err, errsz) != 0)
        goto Fail;
    return SB_OK;
Fail:
    sb_shim_jail_count_failure();
    sb_shim_jail_end(j, run);
    return SB_E_EXECUTION;
}

sb_status_t sb_shim_jail_attach(const sb_shim_jail_t *j, const sb_shim_jail_run_t *run, pid_t pid, char *err, size_t errsz)
{
    char path[64], map[64], what[32] = "";
    int proc;

    snprintf(path, sizeof(path), "/proc/%ld", (long)pid);
    if ((proc = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        snprintf(err, errsz, "jail: cannot open %s: %s", path, strerror(errno));
        goto Fail;
    }
    /* unprivileged, the kernel lets us map only our own ids, and the gid only once setgroups is
     * denied; privileged, the child clears its groups itself (it holds CAP_SETGID in its namespace) */
    if (!j->privileged && write_at(proc, "setgroups", "deny") != 0) {
        snprintf(what, sizeof(what), "setgroups");
        goto Errno;
    }
    snprintf(map, sizeof(map), "%lu %lu 1\n", (unsigned long)run->gid, (unsigned long)run->gid);
    if (write_at(proc, "gid_map", map) != 0) {
        snprintf(what, sizeof(what), "gid_map");
        goto Errno;
    }
    snprintf(map, sizeof(map), "%lu %lu 1\n", (unsigned long)run->uid, (unsigned long)run->uid);
    if (write_at(proc, "uid_map", map) != 0) {
        snprintf(what, sizeof(what), "uid_map");
        goto Errno;
    }
    close(proc);
    if (run->cgroup_fd >= 0) {
        snprintf(map, sizeof(map), "%ld", (long)pid);
        if (write_at(run->cgroup_fd, "cgroup.procs", map) != 0) {
            snprintf(err, errsz, "jail: cannot move the guest into its cgroup: %s", strerror(errno));
            goto Fail;
        }
    }
    return SB_OK;
Errno:
    snprintf(err, errsz, "jail: cannot write the guest's %s (uid %lu): %s", what, (unsigned long)run->uid, strerror(errno));
    close(proc);
Fail:
    return SB_E_EXECUTION; /* counted by the spawn, which owns the child */
}

#define ENTER_FAIL(st)                                                                                                             \
    do {                                                                                                                           \
        fail->stage = (st);                                                                                                        \
        fail->err = errno;                                                                                                         \
        return -1;                                                                                                                 \
    } while (0)

int sb_shim_jail_enter(const sb_shim_jail_t *j, const sb_shim_jail_run_t *run, unsigned nofile, sb_shim_jail_fail_t *fail)
{
    static const char hostname[] = "sandbox";
    struct __user_cap_header_struct hdr;
    struct __user_cap_data_struct data[2];
    struct rlimit rl;
    const struct sock_fprog *prog;

    /* while we still hold CAP_SYS_ADMIN in our user namespace: the hostname of our UTS namespace,
     * and a cgroup namespace rooted at the cgroup the parent has just moved us into */
    if (sethostname(hostname, sizeof(hostname) - 1) != 0)
        ENTER_FAIL(SB_SHIM_JAIL_STAGE_HOSTNAME);
    if (unshare(CLONE_NEWCGROUP) != 0)
        ENTER_FAIL(SB_SHIM_JAIL_STAGE_CGROUPNS);
    if (j->privileged && setgroups(0, NULL) != 0)
        ENTER_FAIL(SB_SHIM_JAIL_STAGE_GROUPS);
    if (setresgid(run->gid, run->gid, run->gid) != 0)
        ENTER_FAIL(SB_SHIM_JAIL_STAGE_GID);
    if (setresuid(run->uid, run->uid, run->uid) != 0)
        ENTER_FAIL(SB_SHIM_JAIL_STAGE_UID);
    /*
     * The kernel clears PR_SET_PDEATHSIG on every credential change, so the one set before the uid
     * switch is gone (as root the uid changed): set it again, then make sure the spawning process did
     * not die before it was: its end of our socket would then be closed. From here on its death kills us.
     */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        ENTER_FAIL(SB_SHIM_JAIL_STAGE_PDEATHSIG);
    if (run->parent_fd >= 0) {
        struct pollfd pfd;
        pfd.fd = run->parent_fd;
        pfd.events = POLLIN | POLLRDHUP;
        pfd.revents = 0;
        if (poll(&pfd, 1, 0) != 0) {
            errno = ESRCH;
            ENTER_FAIL(SB_SHIM_JAIL_STAGE_PDEATHSIG);
        }
    }
    /* a root of its own (mounts.c), while we still hold CAP_SYS_ADMIN in our user namespace; as the
     * guest's uid already, so nothing is bound that the guest could not read anyway */
    {
        int stage = SB_SHIM_JAIL_STAGE_ROOT;
        /* no planned root is a failure, never the host's root */
        if (run->fs == NULL)
            errno = EINVAL;
        if (run->fs == NULL || sb_shim_jail_mount(run->fs, &stage) != 0)
            ENTER_FAIL(stage);
    }
    /*
     * The namespace's uid 0 is unmapped, so setresuid kept our capabilities (the kernel clears them
     * only on a change away from the namespace's root) and exec would drop them; drop them here
     * anyway, bounding and ambient sets included, and lock the securebits so nothing regains them.
     */
    if (prctl(PR_SET_SECUREBITS,
              SECBIT_KEEP_CAPS_LOCKED | SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE |
                  SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED,
              0, 0, 0) != 0)
        ENTER_FAIL(SB_SHIM_JAIL_STAGE_CAPS);
    for (int c = 0; c < 64; ++c)
        if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0 && errno != EINVAL)
            ENTER_FAIL(SB_SHIM_JAIL_STAGE_CAPS);
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0)
        ENTER_FAIL(SB_SHIM_JAIL_STAGE_CAPS);
    memset(&hdr, 0, sizeof(hdr));
    memset(data, 0, sizeof(data));
    hdr.version = _LINUX_CAPABILITY_VERSION_3;
    if (syscall(SYS_capset, &hdr, data) != 0)
        ENTER_FAIL(SB_SHIM_JAIL_STAGE_CAPS);

    rl.rlim_cur = rl.rlim_max = 0;
    if (setrlimit(RLIMIT_CORE, &rl) != 0)
        ENTER_FAIL(SB_SHIM_JAIL_STAGE_RLIMIT);
    rl.rlim_cur = rl.rlim_max = j->nproc;
    if (setrlimit(RLIMIT_NPROC, &rl) != 0)
        ENTER_FAIL(SB_SHIM_JAIL_STAGE_RLIMIT);
    rl.rlim_cur = rl.rlim_max = (rlim_t)j->fsize;
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
        ENTER_FAIL(SB_SHIM_JAIL_STAGE_RLIMIT);
    rl.rlim_cur = rl.rlim_max = (rlim_t)run->data_limit;
    if (setrlimit(RLIMIT_DATA, &rl) != 0)
        ENTER_FAIL(SB_SHIM_JAIL_STAGE_RLIMIT);
    /* soft = hard: at the limit the kernel sends SIGKILL, which a guest cannot block as it can SIGXCPU */
    if (run->cpu_limit != 0) {
        rl.rlim_cur = rl.rlim_max = (rlim_t)run->cpu_limit;
        if (setrlimit(RLIMIT_CPU, &rl) != 0)
            ENTER_FAIL(SB_SHIM_JAIL_STAGE_RLIMIT);
    }
    if (nofile != 0) {
        rl.rlim_cur = rl.rlim_max = nofile;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            ENTER_FAIL(SB_SHIM_JAIL_STAGE_RLIMIT);
    }

    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        ENTER_FAIL(SB_SHIM_JAIL_STAGE_NO_NEW_PRIVS);
    prog = run->threads_only == SB_SHIM_JAIL_FILTER_LOOPBACK ? &j->prog_loopback : run->threads_only ? &j->prog_threads : &j->prog;
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, prog) != 0) {
        if (errno != ENOSYS || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog, 0, 0) != 0)
            ENTER_FAIL(SB_SHIM_JAIL_STAGE_SECCOMP);
    }
    return 0;
}

void sb_shim_jail_end(sb_shim_jail_t *j, sb_shim_jail_run_t *run)
{
    sb_shim_jail_fs_free(run->fs);
    run->fs = NULL;
    if (!run->active)
        return;
    if (run->cgroup_fd >= 0)
        close(run->cgroup_fd);
    run->cgroup_fd = -1;
    if (run->cgroup_name[0] != '\0') {
        /* the PID namespace is gone once its pid 1 was reaped, so this normally succeeds at once;
         * anything left (a process the namespace did not hold) is killed through cgroup.kill */
        for (int i = 0; i < 50 && unlinkat(j->cgroup_dir, run->cgroup_name, AT_REMOVEDIR) != 0; ++i) {
            if (errno != EBUSY) {
                fprintf(stderr, "sandbox-shim: jail: cannot remove cgroup %s/%s: %s\n", j->cgroup_path, run->cgroup_name,
                        strerror(errno));
                break;
            }
            if (i == 0) {
                int d = openat(j->cgroup_dir, run->cgroup_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (d >= 0) {
                    (void)write_at(d, "cgroup.kill", "1");
                    close(d);
                }
            }
            usleep(2000);
        }
        run->cgroup_name[0] = '\0';
    }
    if (run->lock_fd >= 0)
        close(run->lock_fd);
    run->lock_fd = -1;
    run->active = 0;
}

int sb_shim_jail_move_fd(sb_shim_jail_t *j, int fd)
{
    if (j == NULL || j->cgroup_dir < 0)
        return 0;
    if (j->cgroup_dir == fd)
        return 1;
    if (dup3(j->cgroup_dir, fd, O_CLOEXEC) != fd)
        return -1;
    close(j->cgroup_dir);
    j->cgroup_dir = fd;
    return 1;
}

unsigned sb_shim_jail_sweep(sb_shim_jail_t *j, pid_t owner)
{
    char prefix[32];
    size_t pl;
    unsigned removed = 0;
    int fd;
    DIR *d;
    struct dirent *de;

    if (j == NULL || j->cgroup_dir < 0)
        return 0;
    /* make_cgroup names a run's cgroup sb-<pid of the process that made it>-<sequence> */
    pl = (size_t)snprintf(prefix, sizeof(prefix), "sb-%ld-", (long)owner);
    if ((fd = openat(j->cgroup_dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0 || (d = fdopendir(fd)) == NULL) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    while ((de = readdir(d)) != NULL) {
        sb_shim_jail_run_t run;
        if (strncmp(de->d_name, prefix, pl) != 0 || strlen(de->d_name) >= sizeof(run.cgroup_name))
            continue;
        memset(&run, 0, sizeof(run));
        run.active = 1;
        run.lock_fd = run.cgroup_fd = -1;
        memcpy(run.cgroup_name, de->d_name, strlen(de->d_name) + 1);
        sb_shim_jail_end(j, &run);
        if (unlinkat(j->cgroup_dir, de->d_name, AT_REMOVEDIR) != 0 && errno == ENOENT)
            ++removed;
    }
    closedir(d);
    return removed;
}

const char *sb_shim_jail_stage_name(int stage)
{
    switch (stage) {
    case SB_SHIM_JAIL_STAGE_HANDSHAKE:
        return "starting the guest";
    case SB_SHIM_JAIL_STAGE_HOSTNAME:
        return "setting the hostname in the guest's UTS namespace";
    case SB_SHIM_JAIL_STAGE_CGROUPNS:
        return "a cgroup namespace";
    case SB_SHIM_JAIL_STAGE_GROUPS:
        return "dropping supplementary groups";
    case SB_SHIM_JAIL_STAGE_GID:
        return "setting the guest gid";
    case SB_SHIM_JAIL_STAGE_UID:
        return "setting the guest uid";
    case SB_SHIM_JAIL_STAGE_CAPS:
        return "dropping capabilities";
    case SB_SHIM_JAIL_STAGE_RLIMIT:
        return "setting resource limits";
    case SB_SHIM_JAIL_STAGE_NO_NEW_PRIVS:
        return "setting no_new_privs";
    case SB_SHIM_JAIL_STAGE_SECCOMP:
        return "loading the seccomp filter";
    case SB_SHIM_JAIL_STAGE_PROPAGATION:
        return "making mount propagation private in the guest's mount namespace";
    case SB_SHIM_JAIL_STAGE_ROOT:
        return "mounting the guest's tmpfs root";
    case SB_SHIM_JAIL_STAGE_BIND:
        return "binding the guest's executable, libraries or devices read-only into its root";
    case SB_SHIM_JAIL_STAGE_SCRATCH:
        return "mounting the guest's scratch tmpfs";
    case SB_SHIM_JAIL_STAGE_PIVOT:
        return "pivot_root into the guest's root and detaching the old one";
    case SB_SHIM_JAIL_STAGE_PDEATHSIG:
        return "re-arming PR_SET_PDEATHSIG after the uid change (the shim is gone)";
    case SB_SHIM_JAIL_STAGE_PROC:
        return "making the guest's /proc (self/exe only)";
    case SB_SHIM_JAIL_STAGE_CWD:
        return "entering the guest's working directory";
    case SB_SHIM_JAIL_STAGE_LOOPBACK:
        return "making the module path's listeners in the guest's network namespace";
    default:
        return "preparing the guest";
    }
}

int sb_shim_jail_prepare(sb_shim_jail_t *j, int threads_only, char *err, size_t errsz)
{
    unsigned rules = 0;

    struct sock_fprog *prog = threads_only == SB_SHIM_JAIL_FILTER_LOOPBACK ? &j->prog_loopback : &j->prog_threads;

    if (!sb_shim_jail_enabled(j) || !threads_only || prog->filter != NULL)
        return 0;
    if (sb_shim_jail_build_filter(prog, &rules, threads_only, err, errsz) != 0) {
        sb_shim_jail_count_failure();
        return -1;
    }
    return 0;
}

sb_status_t sb_shim_jail_probe(sb_shim_jail_t *j, char *err, size_t errsz)
{
    sb_shim_spawn_t sp;
    sb_shim_child_t c;
    int status = 0;

    if (!sb_shim_jail_enabled(j))
        return SB_OK;
    /* a service forks its runs from here on: every filter compiled once, before */
    if (sb_shim_jail_prepare(j, SB_SHIM_JAIL_FILTER_THREADS, err, errsz) != 0 ||
        sb_shim_jail_prepare(j, SB_SHIM_JAIL_FILTER_LOOPBACK, err, errsz) != 0)
        return SB_E_EXECUTION;
    memset(&sp, 0, sizeof(sp));
    sp.path = NULL; /* exit right after the jail is in place */
    sp.jail = j;
    if (sb_shim_child_spawn(&sp, &c, err, errsz) != SB_OK)
        return SB_E_EXECUTION;
    while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR)
        ;
    c.pid = -1; /* reaped */
    sb_shim_child_close(&c);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(err, errsz, "jail: the probe guest did not exit cleanly (status %d)", status);
        sb_shim_jail_count_failure();
        return SB_E_EXECUTION;
    }
    return SB_OK;
}
