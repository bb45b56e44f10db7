/*
 * sandbox-shim jail: what older shims' guests may have left on the host (see jail.h).
 *
 * A jailed guest now writes nothing on the host: its HOME, DENO_DIR and TMPDIR are the scratch of
 * its own root. Before that, a guest had a work directory under TMPDIR (TMPDIR/sb-shim-XXXXXX, its
 * `home` owned by the guest's uid) and could write into the host's world-writable directories.
 * What such a guest left must never be read by a later guest given the same uid, so:
 *  - at start-up the old work directories whose guest uid runs nothing are removed, fd-relative and
 *    bounded (a chain deeper than SWEEP_MAX_DEPTH, or more than SWEEP_MAX_ENTRIES entries, stops
 *    the removal: what is left is kept, and reported);
 *  - a uid that still owns anything at the top of /tmp, /var/tmp, /dev/shm or TMPDIR, or an old
 *    work directory's `home`, is never handed out (sb_shim_jail__uid_owns_files).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "jail/jail.h"

#define PREFIX "sb-shim-"
#define SWEEP_MAX_DEPTH 32
#define SWEEP_MAX_ENTRIES 100000u
/* entries looked at per directory when a uid is checked: /tmp can be large, the check is per spawn */
#define OWNS_MAX_ENTRIES 10000u

static const char *tmpdir(void)
{
    const char *t = getenv("TMPDIR");
    return t != NULL && t[0] == '/' && strlen(t) < 200 ? t : "/tmp";
}

/* 1 when an entry of `dir` (the top level only; an old work directory's home too) belongs to uid */
static int dir_owned_by(const char *dir, uid_t uid)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW), found = 0;
    unsigned n = 0;
    DIR *d;
    struct dirent *de;

    if (fd < 0)
        return 0;
    if ((d = fdopendir(fd)) == NULL) {
        close(fd);
        return 0;
    }
    while (!found && n++ < OWNS_MAX_ENTRIES && (de = readdir(d)) != NULL) {
        struct stat st;
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue; /* gone meanwhile */
        if (st.st_uid == uid)
            found = 1;
        if (!found && strncmp(de->d_name, PREFIX, sizeof(PREFIX) - 1) == 0 && S_ISDIR(st.st_mode)) {
            char home[300];
            snprintf(home, sizeof(home), "%s/home", de->d_name);
            if (fstatat(fd, home, &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_uid == uid)
                found = 1;
        }
    }
    closedir(d);
    return found;
}

int sb_shim_jail__uid_owns_files(uid_t uid)
{
    static const char *const dirs[] = {"/tmp", "/var/tmp", "/dev/shm"};
    const char *t = tmpdir();

    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); ++i)
        if (dir_owned_by(dirs[i], uid))
            return 1;
    return strcmp(t, "/tmp") != 0 && strcmp(t, "/var/tmp") != 0 && dir_owned_by(t, uid);
}

/* removes `name` below `parent`, never following a link; -1 when anything had to stay */
static int remove_tree(int parent, const char *name, int depth, unsigned *budget)
{
    struct stat st;
    int fd, rc = 0;
    DIR *d;
    struct dirent *de;

    if (*budget == 0 || depth > SWEEP_MAX_DEPTH)
        return -1;
    --*budget;
    if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode))
        return unlinkat(parent, name, 0) == 0 || errno == ENOENT ? 0 : -1;
    if ((fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW)) < 0)
        return -1;
    if ((d = fdopendir(fd)) == NULL) {
        close(fd);
        return -1;
    }
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (remove_tree(fd, de->d_name, depth + 1, budget) != 0)
            rc = -1;
        if (*budget == 0) {
            rc = -1;
            break;
        }
    }
    closedir(d);
    if (rc == 0 && unlinkat(parent, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
        rc = -1;
    return rc;
}

void sb_shim_jail__sweep(uid_t base, unsigned slots, unsigned *removed, unsigned *kept)
{
    const char *t = tmpdir();
    int fd = open(t, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    unsigned budget = SWEEP_MAX_ENTRIES, n = 0;
    DIR *d;
    struct dirent *de;

    *removed = *kept = 0;
    if (fd < 0)
        return;
    if ((d = fdopendir(fd)) == NULL) {
        close(fd);
        return;
    }
    while (n++ < OWNS_MAX_ENTRIES && (de = readdir(d)) != NULL) {
        char home[300];
        struct stat st;
        if (strncmp(de->d_name, PREFIX, sizeof(PREFIX) - 1) != 0)
            continue;
        snprintf(home, sizeof(home), "%s/home", de->d_name);
        /* an old jailed run's directory: its home belongs to a guest uid of our range */
        if (fstatat(fd, home, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) || st.st_uid < base ||
            st.st_uid - base >= slots)
            continue;
        /* its guest (or a guest of that uid) still runs: not a leftover */
        if (sb_shim_jail__uid_in_use(st.st_uid))
            continue;
        if (remove_tree(fd, de->d_name, 0, &budget) == 0)
            ++*removed;
        else
            ++*kept;
    }
    closedir(d);
}
