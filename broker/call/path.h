/*
 * broker/call/path: files-axis paths (PROTOCOL.md section 6, "Paths").
 *
 * One normal form serves the capability check, the globs of the manifest
 * and the files handler: sb_path_normalize is what a glob is matched
 * against, and the typed call (call.h) holds exactly those bytes for the
 * handler to open. sb_path_storage_check then holds a normalised path to the
 * stricter shape the storage layer needs; it never changes a byte, so a path
 * that passes it is opened exactly as it was checked.
 *
 * Every function is pure, thread-safe and allocates nothing.
 */
#ifndef SB_CALL_PATH_H
#define SB_CALL_PATH_H

#include <stddef.h>
#include "sb/status.h"

/* names the files write path uses for its temporary files; a guest path can never name one */
#define SB_PATH_TMP_PREFIX ".sb-tmp-"
#define SB_PATH_TMP_PREFIX_LEN (sizeof(SB_PATH_TMP_PREFIX) - 1)

/* reasons (static strings; tests assert them byte for byte) */
#define SB_PATH_WHY_UNSAFE "files path is missing or unsafe"
#define SB_PATH_WHY_SEGMENT "files path has an empty or \".\" segment"
#define SB_PATH_WHY_RESERVED "files path names a reserved temporary file"

/**
 * Normalises a files path: non-empty, no NUL, no backslash, not absolute,
 * runs of '/' collapsed, one leading "./" stripped, no ".." segment. Single
 * "." segments are kept verbatim, as upstream keeps them.
 * @param out receives the NUL-terminated result (never longer than the input)
 * @return SB_OK, SB_E_FORBIDDEN (unsafe) or SB_E_TOO_LARGE (more than SB_MAX_PATH bytes, or `out` too small)
 */
SB_WARN_UNUSED sb_status_t sb_path_normalize(const char *in, size_t len, char *out, size_t outsz);

/**
 * Holds a normalised path to the shape the storage layer needs: no empty
 * segment (a trailing '/'), no "." or ".." segment, no segment starting with
 * SB_PATH_TMP_PREFIX.
 *
 * Why a "." segment is refused rather than collapsed: the check keeps it and
 * matched its globs against that form. "a/./b" matches the glob "a/?/b"
 * while "a/b" does not, so collapsing it afterwards would open a path that
 * was never granted (upstream's "normalise here, write there" bug). Refusing
 * it keeps the opened path byte-identical to the checked one. Temporary
 * names are refused so a guest can neither read a half-written file nor
 * clobber another call's temporary.
 * @param why receives a static reason on failure
 * @return SB_OK or SB_E_FORBIDDEN
 */
SB_WARN_UNUSED sb_status_t sb_path_storage_check(const char *path, size_t len, const char **why);

/** 1 if a directory entry name is one of the files write path's temporary files */
int sb_path_is_tmp_name(const char *name, size_t len);

#endif
