/*
 * The guest's filesystem (jail.h, "the guest's root"; README.md, "The jail").
 *
 * Every jailed guest starts in a mount namespace of its own whose root is a fresh tmpfs holding only:
 *  - the executable, bound read-only (Deno at /runtime/deno, where argv[0] and the runtime's masking
 *    already say it is; a relay command at its own resolved path);
 *  - the ELF interpreter and the shared libraries the executable names (DT_NEEDED, followed
 *    recursively), each bound read-only at the path the loader looks for it; measured with strace,
 *    Deno 2.9.6 loads libc, libdl, libgcc_s, libm, libpthread and librt and nothing else;
 *  - for `relay` only (sb_shim_jail_fs_t.system): the host's /usr read-only, with /bin, /lib, /lib64
 *    and /sbin as the host has them, and each regular file named by an absolute path in the
 *    command's arguments, read-only (a script and its data, e.g. `python3 /x/guest.py /x/scenario`);
 *  - /dev with null, zero, random and urandom, and nothing else (no pts, ptmx, shm or mqueue);
 *  - /work, a tmpfs of its own capped in bytes and inodes: HOME, TMPDIR, DENO_DIR and the cwd;
 *    it is gone with the mount namespace, i.e. with the guest.
 *  - /proc/self/exe, a symlink to the executable, and no procfs: Deno 2.9.6 opens /proc/self/maps,
 *    /proc/self/cgroup, /proc/meminfo and /proc/sys/kernel/osrelease when they exist and runs
 *    without them, but needs /proc/self/exe (measured with strace -f);
 * no /sys (Deno reads /sys/fs/cgroup and /sys/devices/system/cpu/online when there, and falls
 * back to sched_getaffinity), no /etc (the loader finds the libraries in its default directories
 * without /etc/ld.so.cache), no /tmp, /var, /home, /root.
 *
 * The parent works out the plan (sb_shim_jail_plan_fs, allocating); the child only carries it out
 * with raw system calls (sb_shim_jail_mount, async-signal-safe): mount propagation made private, the
 * tmpfs root mounted over /tmp in the new namespace, the binds and scratch made in it, every bind
 * remounted read-only, nosuid and nodev (device nodes keep dev) and noexec unless it is code, then
 * pivot_root into it, the old root detached, and the root itself remounted read-only.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <elf.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "sb/mem.h"
#include "jail/jail.h"

/* where the loader looks for libraries when there is no ld.so.cache (glibc's default directories) */
#if defined(__x86_64__)
#define JAIL_MULTIARCH "x86_64-linux-gnu"
#define JAIL_ELF_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define JAIL_MULTIARCH "aarch64-linux-gnu"
#define JAIL_ELF_MACHINE EM_AARCH64
#else
#error "the jail knows the library layout of x86_64 and aarch64 only"
#endif
static const char *const lib_dirs[] = {
    "/lib/" JAIL_MULTIARCH, "/usr/lib/" JAIL_MULTIARCH, "/lib64", "/usr/lib64", "/lib", "/usr/lib"};

#define JAIL_MAX_BINDS 64u /* an executable with more libraries than this is refused */
#define JAIL_MAX_PHDRS 64u /* program headers read from one ELF file */
#define JAIL_MAX_DYN 1024u /* dynamic entries read from one ELF file */
/* where the new root may be mounted in the guest's namespace before pivot_root: the first that
 * exists and holds none of the bind sources (which the tmpfs would hide) */
static const char *const root_mnts[] = {"/mnt", "/tmp", "/media", "/srv", "/opt", "/var/tmp", "/run", "/boot"};
#define JAIL_ROOT_OPTS "size=1m,nr_inodes=1024,mode=0755"

struct st_sb_shim_jail_fs_t {
    unsigned n;
    sb_shim_jail_bind_t binds[JAIL_MAX_BINDS];
    char *exe;       /* the executable's path inside the root; NULL: none (the probe) */
    const char *mnt; /* one of root_mnts */
    char scratch_opts[96];
};

static int add_bind(sb_shim_jail_fs_t *fs, const char *src, const char *dst, unsigned flags)
{
    sb_shim_jail_bind_t *b;

    for (unsigned i = 0; i < fs->n; ++i)
        if (strcmp(fs->binds[i].dst, dst) == 0)
            return 0; /* already there (a library two others need) */
    if (fs->n == JAIL_MAX_BINDS) {
        errno = E2BIG;
        return -1;
    }
    b = &fs->binds[fs->n];
    if ((b->src = sb_mem_try_strdup(src)) == NULL || (b->dst = sb_mem_try_strdup(dst)) == NULL) {
        sb_mem_free(b->src);
        b->src = NULL;
        errno = ENOMEM;
        return -1;
    }
    b->flags = flags;
    ++fs->n;
    return 0;
}

static int read_at(int fd, void *buf, size_t n, unsigned long long off)
{
    ssize_t r = pread(fd, buf, n, (off_t)off);
    if (r != (ssize_t)n) {
        errno = r < 0 ? errno : ENOEXEC;
        return -1;
    }
    return 0;
}

/* a file offset for virtual address `va` through the PT_LOAD headers; ~0 when none covers it */
static unsigned long long va_to_off(const Elf64_Phdr *ph, unsigned nph, unsigned long long va)
{
    for (unsigned i = 0; i < nph; ++i)
        if (ph[i].p_type == PT_LOAD && va >= ph[i].p_vaddr && va - ph[i].p_vaddr < ph[i].p_filesz)
            return ph[i].p_offset + (va - ph[i].p_vaddr);
    return ~0ull;
}

/*
 * Reads the ELF interpreter (into interp, "" when static) and the DT_NEEDED names (each into
 * needed[k], at most `max`) of a native 64-bit ELF file. The file is the operator's (the Deno binary,
 * the relay command, their libraries), still every count and offset is bounded before use.
 * @return the number of names, or -1 with errno (ENOEXEC: not a native ELF file; then not an error for a script)
 */
static int elf_needs(const char *path, char *interp, size_t interpsz, char needed[][NAME_MAX + 1], unsigned max)
{
    Elf64_Ehdr eh;
    Elf64_Phdr ph[JAIL_MAX_PHDRS];
    Elf64_Dyn dyn[64];
    unsigned long long strtab = 0, dynoff = 0, dynsz = 0, names[64];
    unsigned nph, nnames = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC), ret = -1;

    interp[0] = '\0';
    if (fd < 0)
        return -1;
    if (read_at(fd, &eh, sizeof(eh), 0) != 0 || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_machine != JAIL_ELF_MACHINE || eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum > JAIL_MAX_PHDRS) {
        errno = ENOEXEC;
        goto Exit;
    }
    nph = eh.e_phnum;
    if (read_at(fd, ph, nph * sizeof(Elf64_Phdr), eh.e_phoff) != 0)
        goto Exit;
    for (unsigned i = 0; i < nph; ++i) {
        if (ph[i].p_type == PT_INTERP) {
            if (ph[i].p_filesz < 2 || ph[i].p_filesz > interpsz || read_at(fd, interp, ph[i].p_filesz, ph[i].p_offset) != 0) {
                errno = ENOEXEC;
                goto Exit;
            }
            interp[ph[i].p_filesz - 1] = '\0';
            /* an absolute path without "." or ".." segments: its directories are made in the new root as named */
            if (interp[0] != '/' || strlen(interp) != ph[i].p_filesz - 1 || strstr(interp, "/./") != NULL ||
                strstr(interp, "/../") != NULL || strstr(interp, "//") != NULL ||
                (strlen(interp) >= 2 && strcmp(interp + strlen(interp) - 2, "/.") == 0) ||
                (strlen(interp) >= 3 && strcmp(interp + strlen(interp) - 3, "/..") == 0)) {
                errno = ENOEXEC;
                goto Exit;
            }
        } else if (ph[i].p_type == PT_DYNAMIC) {
            dynoff = ph[i].p_offset;
            dynsz = ph[i].p_filesz;
        }
    }
    if (dynsz / sizeof(Elf64_Dyn) > JAIL_MAX_DYN) {
        errno = ENOEXEC;
        goto Exit;
    }
    for (unsigned long long done = 0, total = dynsz / sizeof(Elf64_Dyn); done < total;) {
        unsigned chunk = total - done > 64 ? 64u : (unsigned)(total - done);
        int end = 0;
        if (read_at(fd, dyn, chunk * sizeof(Elf64_Dyn), dynoff + done * sizeof(Elf64_Dyn)) != 0)
            goto Exit;
        for (unsigned i = 0; i < chunk && !end; ++i) {
            if (dyn[i].d_tag == DT_NULL)
                end = 1;
            else if (dyn[i].d_tag == DT_STRTAB)
                strtab = dyn[i].d_un.d_ptr;
            else if (dyn[i].d_tag == DT_NEEDED && nnames++ < sizeof(names) / sizeof(names[0]))
                names[nnames - 1] = dyn[i].d_un.d_val;
        }
        if (end)
            break;
        done += chunk;
    }
    if (nnames > max || nnames > sizeof(names) / sizeof(names[0])) { /* refused, never cut short */
        errno = E2BIG;
        goto Exit;
    }
    if (nnames != 0) {
        unsigned long long stroff = va_to_off(ph, nph, strtab);
        if (stroff == ~0ull) {
            errno = ENOEXEC;
            goto Exit;
        }
        for (unsigned k = 0; k < nnames; ++k) {
            ssize_t r = pread(fd, needed[k], NAME_MAX, (off_t)(stroff + names[k]));
            if (r <= 0) {
                errno = ENOEXEC;
                goto Exit;
            }
            needed[k][r] = '\0';
            /* a bare file name: the loader searches its directories for it */
            if (strlen(needed[k]) == 0 || strlen(needed[k]) == NAME_MAX || strchr(needed[k], '/') != NULL) {
                errno = ENOEXEC;
                goto Exit;
            }
        }
    }
    ret = (int)nnames;
Exit:
    close(fd);
    return ret;
}

/* adds a bind of `path` (resolved) at `dst`, unless the system binds (/usr) already hold it */
static int add_code(sb_shim_jail_fs_t *fs, int system, const char *path, const char *dst)
{
    char real[PATH_MAX];

    if (realpath(path, real) == NULL)
        return -1;
    if (system && strncmp(real, "/usr/", 5) == 0)
        return 0;
    return add_bind(fs, real, dst, SB_SHIM_JAIL_BIND_EXEC);
}

/* the interpreter and the libraries of `exe`, recursively (breadth first over the binds added) */
static int add_libraries(sb_shim_jail_fs_t *fs, int system, const char *exe, char *err, size_t errsz)
{
    char(*needed)[NAME_MAX + 1] = sb_mem_try_alloc_array(64, NAME_MAX + 1);
    char interp[PATH_MAX];
    const char *file = exe;
    unsigned next;
    int ret = -1;

    if (needed == NULL) {
        snprintf(err, errsz, "jail: out of memory");
        return -1;
    }
    for (next = fs->n;; ++next) {
        int k = elf_needs(file, interp, sizeof(interp), needed, 64);
        if (k < 0) {
            if (errno == ENOEXEC && file == exe)
                ret = 0; /* a script: its interpreter comes from /usr (relay) */
            else
                snprintf(err, errsz, "jail: cannot read the libraries %s needs: %s", file, strerror(errno));
            goto Exit;
        }
        if (interp[0] != '\0' && add_code(fs, system, interp, interp) != 0) {
            snprintf(err, errsz, "jail: cannot bind the ELF interpreter %s: %s", interp, strerror(errno));
            goto Exit;
        }
        for (int i = 0; i < k; ++i) {
            char cand[PATH_MAX];
            int found = 0;
            for (size_t d = 0; d < sizeof(lib_dirs) / sizeof(lib_dirs[0]) && !found; ++d) {
                snprintf(cand, sizeof(cand), "%s/%s", lib_dirs[d], needed[i]);
                if (access(cand, R_OK) == 0)
                    found = 1;
            }
            if (!found) {
                snprintf(err, errsz, "jail: %s needs %s, which is not in the loader's default directories", file, needed[i]);
                goto Exit;
            }
            if (add_code(fs, system, cand, cand) != 0) {
                snprintf(err, errsz, "jail: cannot bind %s: %s", cand, strerror(errno));
                goto Exit;
            }
        }
        /* the next library to read: the binds added after the executable's, in order */
        while (next < fs->n && !(fs->binds[next].flags & SB_SHIM_JAIL_BIND_EXEC))
            ++next;
        if (next >= fs->n)
            break;
        file = fs->binds[next].src;
    }
    ret = 0;
Exit:
    sb_mem_free(needed);
    return ret;
}

void sb_shim_jail_fs_free(sb_shim_jail_fs_t *fs)
{
    if (fs == NULL)
        return;
    for (unsigned i = 0; i < fs->n; ++i) {
        sb_mem_free(fs->binds[i].src);
        sb_mem_free(fs->binds[i].dst);
    }
    sb_mem_free(fs->exe);
    sb_mem_free(fs);
}

const char *sb_shim_jail_fs_exe(const sb_shim_jail_fs_t *fs)
{
    return fs != NULL ? fs->exe : NULL;
}

sb_shim_jail_fs_t *sb_shim_jail_plan_fs(const sb_shim_jail_fs_spec_t *spec, char *err, size_t errsz)
{
    static const char *const devs[] = {"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"};
    static const char *const sys_links[] = {"/bin", "/lib", "/lib64", "/sbin"};
    sb_shim_jail_fs_t *fs = sb_mem_try_calloc(1, sizeof(*fs));
    char real[PATH_MAX];

    if (fs == NULL) {
        snprintf(err, errsz, "jail: out of memory");
        return NULL;
    }
    snprintf(fs->scratch_opts, sizeof(fs->scratch_opts), "size=%llu,nr_inodes=%u,mode=0700", spec->scratch_bytes,
             spec->scratch_inodes);
    for (size_t i = 0; i < sizeof(devs) / sizeof(devs[0]); ++i) {
        /*
         * A shared writable mapping of /dev/zero is shared anonymous memory, which RLIMIT_DATA does not
         * count: a Deno guest (no `system`: it reads no file anyway) gets no /dev/zero, so that
         * RLIMIT_DATA bounds its memory where no cgroup does. A relay guest may start processes, each
         * with its own RLIMIT_DATA: its memory is the cgroup's to bound.
         */
        if (!spec->system && strcmp(devs[i], "/dev/zero") == 0)
            continue;
        if (add_bind(fs, devs[i], devs[i], SB_SHIM_JAIL_BIND_DEV) != 0)
            goto Errno;
    }
    if (spec->system) {
        struct stat st;
        if (add_bind(fs, "/usr", "/usr", SB_SHIM_JAIL_BIND_DIR | SB_SHIM_JAIL_BIND_EXEC) != 0)
            goto Errno;
        for (size_t i = 0; i < sizeof(sys_links) / sizeof(sys_links[0]); ++i) {
            char target[PATH_MAX];
            ssize_t n;
            if (lstat(sys_links[i], &st) != 0)
                continue;
            if (S_ISLNK(st.st_mode)) {
                const char *t = target;
                if ((n = readlink(sys_links[i], target, sizeof(target) - 1)) <= 0)
                    continue;
                target[n] = '\0';
                while (*t == '/')
                    ++t; /* at the top of the root, relative is the same place and cannot leave it */
                if (add_bind(fs, t, sys_links[i], SB_SHIM_JAIL_BIND_SYMLINK) != 0)
                    goto Errno;
            } else if (S_ISDIR(st.st_mode)) {
                if (add_bind(fs, sys_links[i], sys_links[i], SB_SHIM_JAIL_BIND_DIR | SB_SHIM_JAIL_BIND_EXEC) != 0)
                    goto Errno;
            }
        }
    }
    if (spec->exe != NULL) {
        const char *at = spec->exe_in_root;
        if (realpath(spec->exe, real) == NULL) {
            snprintf(err, errsz, "cannot execute %s: %s", spec->exe, strerror(errno));
            goto Fail;
        }
        if (at == NULL)
            at = real;
        if (at[0] != '/' || strcmp(at, "/") == 0 || strncmp(at, "/dev/", 5) == 0 || strncmp(at, "/proc/", 6) == 0 ||
            strcmp(at, "/work") == 0) {
            snprintf(err, errsz, "jail: the executable cannot live at %s inside the guest's root", at);
            goto Fail;
        }
        if ((fs->exe = sb_mem_try_strdup(at)) == NULL)
            goto Errno;
        /* the source as named, not resolved: the child binds it as the guest's uid, so a path the guest
         * could not walk (a 0700 home directory on the way, even behind a symlink) fails as an exec would;
         * a /proc magic link (the probe's /proc/self/exe) names a mount of the parent's namespace, which
         * cannot be bound from the child's: resolved */
        if (!(spec->system && strncmp(at, "/usr/", 5) == 0) &&
            add_bind(fs, spec->exe[0] == '/' && strncmp(spec->exe, "/proc/", 6) != 0 ? spec->exe : real, at,
                     SB_SHIM_JAIL_BIND_EXEC | SB_SHIM_JAIL_BIND_EXE) != 0)
            goto Errno;
        if (add_libraries(fs, spec->system, real, err, errsz) != 0)
            goto Fail;
    }
    if (spec->system && spec->argv != NULL) {
        for (char *const *a = spec->argv + 1; *a != NULL; ++a) {
            struct stat st;
            if ((*a)[0] != '/' || stat(*a, &st) != 0 || !S_ISREG(st.st_mode) || realpath(*a, real) == NULL)
                continue;
            if (strncmp(real, "/usr/", 5) == 0 || strncmp(real, "/dev/", 5) == 0 || strncmp(real, "/proc/", 6) == 0)
                continue;
            if (add_bind(fs, real, real, 0) != 0)
                goto Errno;
        }
    }
    for (size_t m = 0; m < sizeof(root_mnts) / sizeof(root_mnts[0]) && fs->mnt == NULL; ++m) {
        struct stat st;
        size_t ml = strlen(root_mnts[m]);
        int clash = lstat(root_mnts[m], &st) != 0 || !S_ISDIR(st.st_mode);
        for (unsigned i = 0; i < fs->n && !clash; ++i)
            clash = !(fs->binds[i].flags & SB_SHIM_JAIL_BIND_SYMLINK) && strncmp(fs->binds[i].src, root_mnts[m], ml) == 0 &&
                    (fs->binds[i].src[ml] == '/' || fs->binds[i].src[ml] == '\0');
        if (!clash)
            fs->mnt = root_mnts[m];
    }
    if (fs->mnt == NULL) {
        snprintf(err, errsz,
                 "jail: no directory to build the guest's root on (/mnt, /tmp, ... all missing or holding what it binds)");
        goto Fail;
    }
    return fs;
Errno:
    snprintf(err, errsz, "jail: cannot plan the guest's filesystem: %s", strerror(errno));
Fail:
    sb_shim_jail_fs_free(fs);
    return NULL;
}

/* ---- in the child: raw system calls only ---- */

/* mnt + dst into buf */
static int root_path(char *buf, size_t bufsz, const char *mnt, const char *dst)
{
    size_t a = strlen(mnt), b = strlen(dst);
    if (a + b + 1 > bufsz) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, mnt, a);
    memcpy(buf + a, dst, b + 1);
    return 0;
}

/* creates the directories above `dst` (and `dst` itself as a directory or an empty file) in the new root */
static int make_point(int root, const char *dst, int dir)
{
    char p[PATH_MAX];
    size_t n = strlen(dst);

    if (n + 1 > sizeof(p) || dst[0] != '/') {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(p, dst + 1, n); /* relative to the root, NUL included */
    for (char *s = strchr(p, '/'); s != NULL; s = strchr(s + 1, '/')) {
        *s = '\0';
        if (mkdirat(root, p, 0755) != 0 && errno != EEXIST)
            return -1;
        *s = '/';
    }
    if (dir)
        return mkdirat(root, p, 0755) != 0 && errno != EEXIST ? -1 : 0;
    {
        int fd = openat(root, p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0)
            return errno == EEXIST ? 0 : -1;
        close(fd);
    }
    return 0;
}

/* the per-mount flags a remount in a user namespace must keep (the kernel locks them) */
static unsigned long locked_flags(const char *src)
{
    struct statfs sf;
    unsigned long f = 0;

    if (syscall(SYS_statfs, src, &sf) != 0)
        return 0;
    if (sf.f_flags & ST_NOSUID)
        f |= MS_NOSUID;
    if (sf.f_flags & ST_NODEV)
        f |= MS_NODEV;
    if (sf.f_flags & ST_NOEXEC)
        f |= MS_NOEXEC;
    if (sf.f_flags & ST_NOATIME)
        f |= MS_NOATIME;
    if (sf.f_flags & ST_NODIRATIME)
        f |= MS_NODIRATIME;
    if (sf.f_flags & ST_RELATIME)
        f |= MS_RELATIME;
    return f;
}

#define MOUNT_FAIL(st)                                                                                                             \
    do {                                                                                                                           \
        *stage = (st);                                                                                                             \
        goto Fail;                                                                                                                 \
    } while (0)

int sb_shim_jail_mount(const sb_shim_jail_fs_t *fs, int *stage)
{
    char path[PATH_MAX];
    int root = -1;

    /* nothing we mount may reach the host's namespace, nor anything the host mounts reach us */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        MOUNT_FAIL(SB_SHIM_JAIL_STAGE_PROPAGATION);
    if (mount("sandbox-root", fs->mnt, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, JAIL_ROOT_OPTS) != 0)
        MOUNT_FAIL(SB_SHIM_JAIL_STAGE_ROOT);
    if ((root = open(fs->mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        MOUNT_FAIL(SB_SHIM_JAIL_STAGE_ROOT);
    /*
     * No procfs: /proc holds only self/exe, a symlink to the executable, which Deno reads (Rust's
     * current_exe(); its node:process panics without it). A procfs of the guest's PID namespace
     * would show the host's /proc/sys, meminfo, ..., and the kernel refuses it in a user namespace
     * wherever the host's /proc has paths masked (systemd's ProtectKernelTunables=, containers).
     */
    if (mkdirat(root, "proc", 0555) != 0 || mkdirat(root, "proc/self", 0555) != 0 ||
        symlinkat(fs->exe != NULL ? fs->exe : "/", root, "proc/self/exe") != 0)
        MOUNT_FAIL(SB_SHIM_JAIL_STAGE_PROC);
    /* the scratch first: a relay command's files may be bound below /work */
    if (mkdirat(root, "work", 0755) != 0 || root_path(path, sizeof(path), fs->mnt, "/work") != 0 ||
        mount("sandbox-work", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, fs->scratch_opts) != 0)
        MOUNT_FAIL(SB_SHIM_JAIL_STAGE_SCRATCH);
    for (unsigned i = 0; i < fs->n; ++i) {
        const sb_shim_jail_bind_t *b = &fs->binds[i];
        unsigned long fl = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID;
        if (b->flags & SB_SHIM_JAIL_BIND_SYMLINK) {
            if (symlinkat(b->src, root, b->dst + 1) != 0)
                MOUNT_FAIL(SB_SHIM_JAIL_STAGE_BIND);
            continue;
        }
        if (make_point(root, b->dst, (b->flags & SB_SHIM_JAIL_BIND_DIR) != 0) != 0 ||
            root_path(path, sizeof(path), fs->mnt, b->dst) != 0)
            MOUNT_FAIL(SB_SHIM_JAIL_STAGE_BIND);
        if (mount(b->src, path, NULL, MS_BIND, NULL) != 0) {
            /* the executable the guest's uid cannot reach: reported as exec would report it (stage 0) */
            if ((b->flags & SB_SHIM_JAIL_BIND_EXE) && (errno == EACCES || errno == ENOENT || errno == ENOTDIR || errno == ELOOP))
                MOUNT_FAIL(0);
            MOUNT_FAIL(SB_SHIM_JAIL_STAGE_BIND);
        }
        /* a plain bind keeps the source mount's flags; read-only, nosuid, nodev but for the device
         * nodes, noexec but for code; plus whatever the source mount has locked */
        if (!(b->flags & SB_SHIM_JAIL_BIND_DEV))
            fl |= MS_NODEV;
        if (!(b->flags & SB_SHIM_JAIL_BIND_EXEC))
            fl |= MS_NOEXEC;
        if (mount(NULL, path, NULL, fl | locked_flags(b->src), NULL) != 0)
            MOUNT_FAIL(SB_SHIM_JAIL_STAGE_BIND);
    }
    /* pivot_root(".", "."): the old root ends up under the new one, and is detached at once */
    if (fchdir(root) != 0 || syscall(SYS_pivot_root, ".", ".") != 0 || umount2(".", MNT_DETACH) != 0 || chdir("/") != 0)
        MOUNT_FAIL(SB_SHIM_JAIL_STAGE_PIVOT);
    if (mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
        MOUNT_FAIL(SB_SHIM_JAIL_STAGE_PIVOT);
    close(root);
    return 0;
Fail:
    if (root >= 0) {
        int e = errno;
        close(root);
        errno = e;
    }
    return -1;
}
