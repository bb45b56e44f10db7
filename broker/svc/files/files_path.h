/*
 * broker/svc/files/files_path: the pure string half of the files handler (no I/O,
 * no h2o), so a fuzzer and the unit tests can reach it on its own.
 *
 *   - the files root: the target's root template with every {scopeKey}
 *     placeholder replaced by the token's value for that key;
 *   - the MIME type files.read reports, from the file name's extension.
 *
 * Every function is thread-safe and allocates nothing.
 */
#ifndef SB_FILES_PATH_H
#define SB_FILES_PATH_H

#include <stddef.h>
#include "sb/status.h"

/* placeholder keys, as the token scope keys are spelled: [A-Za-z0-9_-]{1,64} */
#define SB_FILES_MAX_SCOPE_KEY 64u

/* reasons (static strings; tests assert them byte for byte) */
#define SB_FILES_WHY_SCOPE "files root scope value is missing or unsafe"
#define SB_FILES_WHY_TEMPLATE "files root template is malformed"
#define SB_FILES_WHY_ROOT_LONG "files root is too long"

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

/** the MIME type for a file name, by extension (case-insensitive); "application/octet-stream" when unknown; never NULL */
const char *sb_files_mime_type(const char *path, size_t len);

#endif
