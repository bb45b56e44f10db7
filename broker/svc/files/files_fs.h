/*
 * broker/svc/files/files_fs: the storage half of the files handler.
 *
 * Blocking system calls, run on the files worker threads (files.c), never on
 * an h2o loop. Every guest path is opened relative to a descriptor of the
 * files root with openat2 and RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
 * RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV, so the kernel, not a string check,
 * guarantees that no "..", symbolic link, /proc magic link or mount point
 * leads outside the root.
 *
 * Paths handed in have passed sb_path_normalize and sb_path_storage_check. Messages written to `msg`
 * never quote the path (reasons reach logs and the guest); those of
 * SB_E_EXECUTION carry the system error for the log and are redacted on the
 * wire by the RPC route.
 *
 * Every function is thread-safe and keeps no state.
 */
#ifndef SB_FILES_FS_H
#define SB_FILES_FS_H

#include <stddef.h>
#include <stdint.h>
#include "sb/status.h"
#include "call/path.h"

/* reasons (tests assert them byte for byte) */
#define SB_FILES_WHY_NO_OPENAT2 "files needs openat2 (Linux 5.6 or later) and this kernel has none"
#define SB_FILES_WHY_ESCAPE "files path escapes the root" /* "..", absolute, or a mount point */
#define SB_FILES_WHY_SYMLINK "files path crosses a symbolic link"
#define SB_FILES_WHY_NOENT "files path does not exist"
#define SB_FILES_WHY_NOTDIR "files path has a file where a directory is expected"
#define SB_FILES_WHY_NAMELONG "files path has a name longer than the filesystem allows"
#define SB_FILES_WHY_NOTREG "files path is not a regular file"
#define SB_FILES_WHY_HARDLINK "files path is a file with more than one hard link"
#define SB_FILES_WHY_LIST_NOTDIR "files.list path is not a directory"

/** one files.list entry */
typedef struct st_sb_files_entry_t {
    char *path; /* relative to the root, NUL-terminated; owned by the array */
    int is_dir;
    uint64_t size; /* 0 for directories */
} sb_files_entry_t;

/**
 * Decides whether files.list shows an entry.
 * @param path the entry's path relative to the root (NUL-terminated)
 * @return non-zero to show it
 */
typedef int (*sb_files_list_filter_fn)(void *ctx, const char *path, size_t len, int is_dir);

/**
 * Opens an existing files root (never creates it) with O_PATH | O_DIRECTORY.
 * @param fd receives the descriptor (close it)
 * @return SB_OK or SB_E_EXECUTION (missing, not a directory, ...: the host's problem)
 */
SB_WARN_UNUSED sb_status_t sb_files_fs_open_root(const char *root, int *fd, char *msg, size_t msgsz);

/**
 * Reads a regular file with exactly one link beneath the root, at most `cap`
 * bytes: the loop stops at cap + 1 bytes whatever fstat claimed.
 * @param data receives the bytes (release with sb_mem_free; NULL when empty)
 * @return SB_OK; SB_E_FORBIDDEN (escape, symlink, not regular, hard link);
 *         SB_E_BAD_ARGS (missing, too large, ...); SB_E_UNAVAILABLE (no openat2);
 *         SB_E_EXECUTION (I/O errors, out of memory)
 */
SB_WARN_UNUSED sb_status_t sb_files_fs_read(int rootfd, const char *path, size_t cap, uint8_t **data, size_t *len, char *msg,
                                            size_t msgsz);

/**
 * Replaces (or creates) a file atomically: missing parent directories are
 * created one segment at a time beneath the root, the bytes go to a fresh
 * SB_PATH_TMP_PREFIX file in the target directory, which is written, fsync'ed
 * and renamed onto the final name, and the directory is fsync'ed. A reader
 * sees the old file or the new one, never part of one; a crash leaves at most
 * a stray temporary, never a partial file under the final name. The
 * temporary is unlinked on every failure. A path more than 32 directories
 * deep is SB_E_BAD_ARGS before any I/O.
 * @return as sb_files_fs_read
 */
SB_WARN_UNUSED sb_status_t sb_files_fs_write(int rootfd, const char *path, const uint8_t *data, size_t len, char *msg,
                                             size_t msgsz);

/**
 * Lists a directory beneath the root (the root itself when `dir` is NULL):
 * regular files with one link and directories, never symbolic links, special
 * files, mount points, temporaries or names that are not UTF-8, filtered by `filter`, sorted
 * by path. Stops, with *truncated = 1, at max_entries entries, when their
 * estimated JSON size would pass max_bytes, or after scanning a bounded number
 * of directory entries.
 * @param out receives the entries (free with sb_files_fs_entries_free)
 * @return as sb_files_fs_read
 */
SB_WARN_UNUSED sb_status_t sb_files_fs_list(int rootfd, const char *dir, sb_files_list_filter_fn filter, void *ctx,
                                            size_t max_entries, size_t max_bytes, sb_files_entry_t **out, size_t *n, int *truncated,
                                            char *msg, size_t msgsz);
void sb_files_fs_entries_free(sb_files_entry_t *v, size_t n);

#endif
