/*
 * broker/svc/files/files_fs: files.read / write / list on the filesystem
 * (files_fs.h).
 *
 * The containment argument, in one place:
 *  - the root is opened once per call; every path below it goes through
 *    openat2 relative to that descriptor with RESOLVE_BENEATH (no "..", no
 *    absolute path, no jump out of the descriptor's subtree),
 *    RESOLVE_NO_SYMLINKS (no symbolic link in any component, the last one
 *    included, wherever it points: a link that stays inside today may be
 *    retargeted tomorrow) and RESOLVE_NO_MAGICLINKS (no /proc/<pid>/fd-style
 *    link, which would hand us an arbitrary open file) and RESOLVE_NO_XDEV
 *    (no mount point: a procfs or a bind mount the host left inside a root
 *    would otherwise be read like any directory, /proc/<pid>/environ and the
 *    admin secret in it included; the root itself may be a mount point, it is
 *    opened with a plain open);
 *  - directories created for a write are made with mkdirat one segment at a
 *    time relative to a descriptor already known to be beneath the root, and
 *    reopened through openat2 before anything is done inside them;
 *  - a hard link is a second name for an inode that may live outside the
 *    root, and no path check can see that: files with st_nlink > 1 are never
 *    read, never overwritten and never listed;
 *  - nothing but regular files is read (a FIFO would block a worker forever,
 *    a device has side effects), and the open itself is O_NONBLOCK | O_NOCTTY
 *    so that even opening one cannot stall or adopt a terminal.
 * If the kernel has no openat2 we fail closed: there is no userspace
 * emulation of RESOLVE_BENEATH that is free of races.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "sb/buf.h"
#include "sb/limits.h"
#include "sb/value.h"
#include "svc/files/files_fs.h"
#include "svc/files/files_path.h"
#include "util/util.h"

/* a directory with more entries than this is listed as truncated: the scan itself must stay bounded */
#define MAX_LIST_SCAN 100000u
/* JSON bytes of one entry besides its path: {"path":"","type":"file","size":18446744073709551615}, */
#define LIST_ENTRY_OVERHEAD 64u
/* attempts at a fresh temporary name (64 random bits each: a collision means something else is wrong) */
#define TMP_ATTEMPTS 4
/*
 * directories a write may go below: each one it has to create costs a mkdir
 * and an fsync (milliseconds), and a 4096-byte path could otherwise ask for
 * two thousand of them, holding a pool thread for seconds
 */
#define MAX_WRITE_DEPTH 32u
#define DIR_MODE 0750
#define FILE_MODE 0640

__attribute__((format(printf, 4, 5))) static sb_status_t say(sb_status_t st, char *msg, size_t msgsz, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, msgsz, fmt, ap);
    va_end(ap);
    return st;
}

static int open_beneath(int dirfd, const char *path, int flags, mode_t mode)
{
    struct open_how how;
    long fd;

    memset(&how, 0, sizeof(how));
    how.flags = (uint64_t)(unsigned)(flags | O_CLOEXEC | O_NOCTTY);
    how.mode = (flags & O_CREAT) != 0 ? (uint64_t)mode : 0; /* openat2 refuses a mode without O_CREAT */
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
    do {
        fd = syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
    } while (fd < 0 && errno == EINTR);
    return (int)fd;
}

/*
 * Maps the errno of a failed lookup to the guest's view. Only what the guest
 * caused, or may know, is spelled out; everything else is an execution_error
 * whose message (with the system error) goes to the log only.
 */
static SB_WARN_UNUSED sb_status_t lookup_failed(int err, const char *what, char *msg, size_t msgsz)
{
    switch (err) {
    case ENOSYS:
        return say(SB_E_UNAVAILABLE, msg, msgsz, "%s", SB_FILES_WHY_NO_OPENAT2);
    case EXDEV:
        return say(SB_E_FORBIDDEN, msg, msgsz, "%s", SB_FILES_WHY_ESCAPE);
    case ELOOP:
        return say(SB_E_FORBIDDEN, msg, msgsz, "%s", SB_FILES_WHY_SYMLINK);
    case EISDIR:
        return say(SB_E_FORBIDDEN, msg, msgsz, "%s", SB_FILES_WHY_NOTREG);
    case ENOENT:
        return say(SB_E_BAD_ARGS, msg, msgsz, "%s", SB_FILES_WHY_NOENT);
    case ENOTDIR:
        return say(SB_E_BAD_ARGS, msg, msgsz, "%s", SB_FILES_WHY_NOTDIR);
    case ENAMETOOLONG:
        return say(SB_E_BAD_ARGS, msg, msgsz, "%s", SB_FILES_WHY_NAMELONG);
    default:
        return say(SB_E_EXECUTION, msg, msgsz, "files %s failed: %s", what, strerror(err));
    }
}

static void close_keep_errno(int fd)
{
    int saved = errno;
    if (fd >= 0)
        close(fd);
    errno = saved;
}

sb_status_t sb_files_fs_open_root(const char *root, int *fd, char *msg, size_t msgsz)
{
    /* the root is the host's: it must exist (a missing tenant directory is not ours to create) */
    *fd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (*fd < 0)
        return say(SB_E_EXECUTION, msg, msgsz, "files root cannot be opened: %s", strerror(errno));
    return SB_OK;
}

/* ---- read --------------------------------------------------------------------------------------------------------- */

/* fstat's verdict on a file we are about to read or replace */
static SB_WARN_UNUSED sb_status_t check_regular(const struct stat *st, char *msg, size_t msgsz)
{
    if (!S_ISREG(st->st_mode))
        return say(SB_E_FORBIDDEN, msg, msgsz, "%s", SB_FILES_WHY_NOTREG);
    if (st->st_nlink > 1)
        return say(SB_E_FORBIDDEN, msg, msgsz, "%s", SB_FILES_WHY_HARDLINK);
    return SB_OK;
}

sb_status_t sb_files_fs_read(int rootfd, const char *path, size_t cap, uint8_t **data, size_t *len, char *msg, size_t msgsz)
{
    int fd = -1;
    struct stat st;
    sb_buf_t buf;
    size_t hint;
    char *out;
    sb_status_t status;

    *data = NULL;
    *len = 0;
    /* one byte over the cap shows a file that grew past it while we read */
    sb_buf_init(&buf, cap < SB_BUF_MAX_CAP ? cap + 1 : SB_BUF_MAX_CAP);
    if ((fd = open_beneath(rootfd, path, O_RDONLY | O_NONBLOCK, 0)) < 0) {
        status = lookup_failed(errno, "open", msg, msgsz);
        goto Exit;
    }
    if (fstat(fd, &st) != 0) {
        status = say(SB_E_EXECUTION, msg, msgsz, "files fstat failed: %s", strerror(errno));
        goto Exit;
    }
    if ((status = check_regular(&st, msg, msgsz)) != SB_OK)
        goto Exit;
    if (st.st_size < 0 || (uint64_t)st.st_size > cap) {
        status = say(SB_E_BAD_ARGS, msg, msgsz, "files.read file exceeds %zu-byte cap", cap);
        goto Exit;
    }
    /*
     * st_size is a hint, not a bound: the file may grow while we read. The
     * first read asks for one byte more than the hint, which shows growth;
     * after that the buffer doubles, and never passes cap + 1.
     */
    hint = (size_t)st.st_size + 1;
    for (;;) {
        size_t want = buf.len < hint ? hint - buf.len : buf.len;
        char *room;
        ssize_t n;
        if (sb_buf_room(&buf) == 0)
            break;
        if (want > sb_buf_room(&buf))
            want = sb_buf_room(&buf);
        if (sb_buf_reserve(&buf, want, &room) != SB_OK) {
            status = say(SB_E_EXECUTION, msg, msgsz, "files.read out of memory");
            goto Exit;
        }
        n = read(fd, room, want);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            status = say(SB_E_EXECUTION, msg, msgsz, "files read failed: %s", strerror(errno));
            goto Exit;
        }
        if (n == 0)
            break;
        sb_buf_commit(&buf, (size_t)n);
    }
    if (buf.len > cap) {
        status = say(SB_E_BAD_ARGS, msg, msgsz, "files.read file exceeds %zu-byte cap", cap);
        goto Exit;
    }
    if (buf.len != 0) {
        /* the buffer holds bytes, so it has storage to hand over: this does not fail */
        if (sb_buf_take(&buf, &out, len) != SB_OK) {
            status = say(SB_E_EXECUTION, msg, msgsz, "files.read out of memory");
            goto Exit;
        }
        *data = (uint8_t *)out;
    }
    status = SB_OK;
Exit:
    sb_buf_free(&buf);
    if (fd >= 0)
        close(fd);
    return status;
}

/* ---- write -------------------------------------------------------------------------------------------------------- */

/*
 * Walks the directory part of `path` (modified in place: each '/' becomes a
 * NUL in turn), creating missing directories, and returns a readable
 * descriptor of the last one and the final name inside `path`.
 */
static SB_WARN_UNUSED sb_status_t open_parent(int rootfd, char *path, int *dirfd, const char **name, char *msg, size_t msgsz)
{
    char *seg = path, *slash;
    int cur, next;
    sb_status_t status;

    *dirfd = -1;
    /* "." beneath the root is the root itself, opened readable so it can be fsync'ed */
    if ((cur = open_beneath(rootfd, ".", O_RDONLY | O_DIRECTORY, 0)) < 0)
        return lookup_failed(errno, "open", msg, msgsz);
    while ((slash = strchr(seg, '/')) != NULL) {
        *slash = '\0';
        next = open_beneath(cur, seg, O_RDONLY | O_DIRECTORY, 0);
        if (next < 0 && errno == ENOENT) {
            /*
             * mkdirat never follows a symbolic link in its last component (an
             * existing link is EEXIST), and the reopen below refuses one: a
             * link planted between the two calls is caught there.
             */
            if (mkdirat(cur, seg, DIR_MODE) == 0) {
                /* the new entry must survive a crash as much as the file inside it */
                if (fsync(cur) != 0) {
                    status = say(SB_E_EXECUTION, msg, msgsz, "files fsync of a directory failed: %s", strerror(errno));
                    goto Exit;
                }
            } else if (errno != EEXIST) {
                status = lookup_failed(errno, "mkdir", msg, msgsz);
                goto Exit;
            }
            next = open_beneath(cur, seg, O_RDONLY | O_DIRECTORY, 0);
        }
        if (next < 0) {
            status = lookup_failed(errno, "open", msg, msgsz);
            goto Exit;
        }
        close(cur);
        cur = next;
        seg = slash + 1;
    }
    *dirfd = cur;
    *name = seg;
    cur = -1;
    status = SB_OK;
Exit:
    if (cur >= 0)
        close(cur);
    return status;
}

static SB_WARN_UNUSED int write_all(int fd, const uint8_t *p, size_t len)
{
    while (len != 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

sb_status_t sb_files_fs_write(int rootfd, const char *path, const uint8_t *data, size_t len, char *msg, size_t msgsz)
{
    char work[SB_MAX_PATH + 1], tmp[SB_PATH_TMP_PREFIX_LEN + 16 + 1];
    const char *name = NULL;
    int dirfd = -1, fd = -1, have_tmp = 0, attempt;
    struct stat st;
    size_t plen = strlen(path), depth = 0;
    sb_status_t status;

    if (plen >= sizeof(work))
        return say(SB_E_FORBIDDEN, msg, msgsz, "%s", SB_PATH_WHY_UNSAFE);
    for (size_t i = 0; i != plen; ++i)
        depth += path[i] == '/';
    if (depth > MAX_WRITE_DEPTH)
        return say(SB_E_BAD_ARGS, msg, msgsz, "files.write path is deeper than %u directories", MAX_WRITE_DEPTH);
    memcpy(work, path, plen + 1);
    if ((status = open_parent(rootfd, work, &dirfd, &name, msg, msgsz)) != SB_OK)
        goto Exit;

    /* what the name holds now: only a plain file with one link may be replaced */
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if ((status = check_regular(&st, msg, msgsz)) != SB_OK)
            goto Exit;
    } else if (errno != ENOENT) {
        status = lookup_failed(errno, "stat", msg, msgsz);
        goto Exit;
    }

    for (attempt = 0;; ++attempt) {
        uint8_t rnd[8];
        if (sb_random(rnd, sizeof(rnd)) != SB_OK) {
            status = say(SB_E_UNAVAILABLE, msg, msgsz, "no randomness available");
            goto Exit;
        }
        memcpy(tmp, SB_PATH_TMP_PREFIX, SB_PATH_TMP_PREFIX_LEN);
        sb_hex(rnd, sizeof(rnd), tmp + SB_PATH_TMP_PREFIX_LEN);
        if ((fd = open_beneath(dirfd, tmp, O_CREAT | O_EXCL | O_WRONLY, FILE_MODE)) >= 0)
            break;
        if (errno != EEXIST || attempt + 1 == TMP_ATTEMPTS) {
            status = lookup_failed(errno, "create", msg, msgsz);
            goto Exit;
        }
    }
    have_tmp = 1;
    if (write_all(fd, data, len) != 0) {
        status = say(SB_E_EXECUTION, msg, msgsz, "files write failed: %s", strerror(errno));
        goto Exit;
    }
    /* the data is on disk before the name points at it: rename without this can publish an empty file after a crash */
    if (fsync(fd) != 0) {
        status = say(SB_E_EXECUTION, msg, msgsz, "files fsync failed: %s", strerror(errno));
        goto Exit;
    }
    if (close(fd) != 0) {
        fd = -1;
        status = say(SB_E_EXECUTION, msg, msgsz, "files close failed: %s", strerror(errno));
        goto Exit;
    }
    fd = -1;
    if (renameat(dirfd, tmp, dirfd, name) != 0) {
        status = lookup_failed(errno, "rename", msg, msgsz);
        goto Exit;
    }
    have_tmp = 0;
    /* and the rename itself is durable once the directory is */
    if (fsync(dirfd) != 0) {
        status = say(SB_E_EXECUTION, msg, msgsz, "files fsync of the directory failed: %s", strerror(errno));
        goto Exit;
    }
    status = SB_OK;
Exit:
    close_keep_errno(fd);
    if (have_tmp)
        unlinkat(dirfd, tmp, 0);
    if (dirfd >= 0)
        close(dirfd);
    return status;
}

/* ---- list --------------------------------------------------------------------------------------------------------- */

/* what a string costs inside a JSON string literal (jansson escapes '"', '\\' and control characters) */
static size_t json_len(const char *s, size_t len)
{
    size_t n = 0;

    for (size_t i = 0; i != len; ++i) {
        unsigned char c = (unsigned char)s[i];
        n += c < 0x20 ? 6 : (c == '"' || c == '\\') ? 2 : 1;
    }
    return n;
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const sb_files_entry_t *)a)->path, ((const sb_files_entry_t *)b)->path);
}

void sb_files_fs_entries_free(sb_files_entry_t *v, size_t n)
{
    for (size_t i = 0; i != n; ++i)
        sb_mem_free(v[i].path);
    sb_mem_free(v);
}

sb_status_t sb_files_fs_list(int rootfd, const char *dir, sb_files_list_filter_fn filter, void *ctx, size_t max_entries,
                             size_t max_bytes, sb_files_entry_t **out, size_t *n, int *truncated, char *msg, size_t msgsz)
{
    char rel[SB_MAX_PATH + 1];
    size_t prefix = dir != NULL ? strlen(dir) : 0, count = 0, cap = 0, bytes = 0, scanned = 0;
    sb_files_entry_t *v = NULL;
    DIR *d = NULL;
    struct stat dst;
    int fd;
    sb_status_t status;

    *out = NULL;
    *n = 0;
    *truncated = 0;
    if (prefix + 1 >= sizeof(rel))
        return say(SB_E_FORBIDDEN, msg, msgsz, "%s", SB_PATH_WHY_UNSAFE);
    if ((fd = open_beneath(rootfd, dir != NULL ? dir : ".", O_RDONLY | O_DIRECTORY, 0)) < 0) {
        if (errno == ENOTDIR)
            return say(SB_E_BAD_ARGS, msg, msgsz, "%s", SB_FILES_WHY_LIST_NOTDIR);
        return lookup_failed(errno, "open", msg, msgsz);
    }
    if (fstat(fd, &dst) != 0) {
        status = say(SB_E_EXECUTION, msg, msgsz, "files fstat failed: %s", strerror(errno));
        close(fd);
        goto Exit;
    }
    if ((d = fdopendir(fd)) == NULL) {
        status = say(SB_E_EXECUTION, msg, msgsz, "files fdopendir failed: %s", strerror(errno));
        close(fd);
        goto Exit;
    }
    if (prefix != 0) {
        memcpy(rel, dir, prefix);
        rel[prefix++] = '/';
    }
    for (;;) {
        struct dirent *de;
        struct stat st;
        size_t nlen, rlen, cost;
        int is_dir;

        errno = 0;
        if ((de = readdir(d)) == NULL) {
            if (errno != 0) {
                status = say(SB_E_EXECUTION, msg, msgsz, "files readdir failed: %s", strerror(errno));
                goto Exit;
            }
            break;
        }
        if (++scanned > MAX_LIST_SCAN) {
            *truncated = 1;
            break;
        }
        nlen = strlen(de->d_name);
        if ((nlen == 1 && de->d_name[0] == '.') || (nlen == 2 && de->d_name[0] == '.' && de->d_name[1] == '.'))
            continue;
        /* a temporary is a write in progress (or a crash's leftover): never a file the guest can see */
        if (sb_path_is_tmp_name(de->d_name, nlen))
            continue;
        /* names the wire cannot carry as a string, or the guest could not name in files.read, are not shown */
        if (!sb_utf8_valid((const uint8_t *)de->d_name, nlen) || prefix + nlen >= sizeof(rel) ||
            memchr(de->d_name, '\\', nlen) != NULL)
            continue;
        /* lstat semantics relative to a directory beneath the root: a symlink is reported as one, never followed */
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue; /* gone since readdir */
        is_dir = S_ISDIR(st.st_mode);
        if (!is_dir && !(S_ISREG(st.st_mode) && st.st_nlink == 1))
            continue;
        /* a mount point cannot be entered (RESOLVE_NO_XDEV): do not offer it */
        if (st.st_dev != dst.st_dev)
            continue;
        memcpy(rel + prefix, de->d_name, nlen + 1);
        rlen = prefix + nlen;
        if (!filter(ctx, rel, rlen, is_dir))
            continue;
        cost = json_len(rel, rlen) + LIST_ENTRY_OVERHEAD;
        if (count == max_entries || bytes + cost > max_bytes) {
            /* there is more to show than we may: say so, never drop it silently */
            *truncated = 1;
            break;
        }
        if (count == cap) {
            size_t ncap = cap == 0 ? 64 : cap * 2;
            sb_files_entry_t *nv;
            if (ncap > max_entries)
                ncap = max_entries;
            if ((nv = sb_mem_try_realloc_array(v, ncap, sizeof(*v))) == NULL) {
                status = say(SB_E_EXECUTION, msg, msgsz, "files.list out of memory");
                goto Exit;
            }
            v = nv;
            cap = ncap;
        }
        if ((v[count].path = sb_mem_try_strndup(rel, rlen)) == NULL) {
            status = say(SB_E_EXECUTION, msg, msgsz, "files.list out of memory");
            goto Exit;
        }
        v[count].is_dir = is_dir;
        v[count].size = is_dir ? 0 : (uint64_t)st.st_size;
        ++count;
        bytes += cost;
    }
    if (count > 1)
        qsort(v, count, sizeof(*v), entry_cmp);
    *out = v;
    *n = count;
    v = NULL;
    count = 0;
    status = SB_OK;
Exit:
    sb_files_fs_entries_free(v, count);
    if (d != NULL)
        closedir(d);
    return status;
}
