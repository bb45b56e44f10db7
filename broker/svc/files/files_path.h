/*
 * broker/svc/files_path: the pure string half of the files handler (no I/O,
 * no h2o), so a fuzzer and the unit tests can reach it on its own.
 *
 *   - the files root: the target's root template with every {scopeKey}
 *     placeholder replaced by the token's value for that key;
 *   - the guest path: args.path normalised again (sb_path_normalize) and held
 *     to the stricter shape the storage layer needs;
 *   - the MIME type files.read reports, from the file name's extension.
 *
 * Every function is thread-safe and allocates nothing.
 */
#ifndef SB_FILES_PATH_H
#define SB_FILES_PATH_H

#include <stddef.h>
#include "sb/status.h"

/* names the write path uses for its temporary files; the guest can never name, read or list one */
#define SB_FILES_TMP_PREFIX ".sb-tmp-"
#define SB_FILES_TMP_PREFIX_LEN (sizeof(SB_FILES_TMP_PREFIX) - 1)

/* placeholder keys, as the token scope keys are spelled: [A-Za-z0-9_-]{1,64} */
#define SB_FILES_MAX_SCOPE_KEY 64u

/* reasons (static strings; tests assert them byte for byte) */
#define SB_FILES_WHY_SCOPE "files root scope value is missing or unsafe"
#define SB_FILES_WHY_TEMPLATE "files root template is malformed"
#define SB_FILES_WHY_ROOT_LONG "files root is too long"
#define SB_FILES_WHY_UNSAFE "files path is missing or unsafe"
#define SB_FILES_WHY_SEGMENT "files path has an empty or \".\" segment"
#define SB_FILES_WHY_RESERVED "files path names a reserved temporary file"

/**
 * Looks a scope key up.
 * @param ctx the caller's context
 * @param key the NUL-terminated key from the template
 * @return the NUL-terminated value, or NULL when the token does not bind the key
 */
typedef const char *(*sb_files_scope_fn)(void *ctx, const char *key);

/**
 * Expands a root template ("/srv/files/{tenantId}").
 *
 * A value is substituted only if it is a safe single path segment: non-empty,
 * not "." or "..", and free of '/' and NUL. A segment of the result that holds
 * substituted text must not be "." or ".." either (two values side by side).
 * @param tmpl the NUL-terminated template (absolute, from the configuration)
 * @param out receives the NUL-terminated root
 * @param why receives a static reason on failure
 * @return SB_OK; SB_E_FORBIDDEN (SB_FILES_WHY_SCOPE: a value is missing or
 *         unsafe, the guest's side of the line); SB_E_EXECUTION (the template
 *         is malformed or the result does not fit `out`: the host's side)
 */
SB_WARN_UNUSED sb_status_t sb_files_root_expand(const char *tmpl, sb_files_scope_fn lookup, void *ctx, char *out, size_t outsz,
                                                const char **why);

/**
 * Normalises a guest path (sb_path_normalize) and holds the result to the
 * shape the storage layer needs: no empty segment (a trailing '/'), no "."
 * segment, no segment starting with SB_FILES_TMP_PREFIX. The capability check
 * matched its globs against the same normalised bytes, so the path that is
 * opened is exactly the path that was granted: nothing is collapsed here that
 * the check did not see collapsed.
 * @param out receives the NUL-terminated path (at least SB_MAX_PATH + 1 bytes for every valid input)
 * @param why receives a static reason on failure
 * @return SB_OK or SB_E_FORBIDDEN
 */
SB_WARN_UNUSED sb_status_t sb_files_guest_path(const char *in, size_t len, char *out, size_t outsz, const char **why);

/** 1 if a directory entry name is one of our temporary files */
int sb_files_is_tmp_name(const char *name, size_t len);

/** the MIME type for a file name, by extension (case-insensitive); "application/octet-stream" when unknown; never NULL */
const char *sb_files_mime_type(const char *path, size_t len);

#endif
