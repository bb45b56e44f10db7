/*
 * broker/call/path: files-axis path normalisation and the storage shape
 * (call/path.h).
 *
 * The rules are upstream's (PROTOCOL.md section 6, "Paths") so that a
 * manifest means the same thing here as there: a path is relative, has no NUL
 * and no backslash, runs of '/' collapse, one leading "./" is stripped and no
 * segment may be "..". Single "." segments are kept verbatim, exactly like
 * upstream; they cannot climb out of a scope, and sb_path_storage_check
 * refuses them before anything touches storage (a refusal, not a second
 * normalisation: the opened path stays the checked one).
 *
 * The same function normalises the globs of files.read and files.write at
 * mint time, so a glob and a path are compared in the same canonical form.
 */
#include <string.h>
#include "sb/limits.h"
#include "call/path.h"

static int has_dotdot_segment(const char *p, size_t len)
{
    size_t start = 0, i;

    for (i = 0; i <= len; ++i) {
        if (i == len || p[i] == '/') {
            if (i - start == 2 && p[start] == '.' && p[start + 1] == '.')
                return 1;
            start = i + 1;
        }
    }
    return 0;
}

sb_status_t sb_path_normalize(const char *in, size_t len, char *out, size_t outsz)
{
    size_t i, olen = 0;

    if (in == NULL || len == 0)
        return SB_E_FORBIDDEN;
    if (len > SB_MAX_PATH)
        return SB_E_TOO_LARGE;
    if (in[0] == '/')
        return SB_E_FORBIDDEN;
    for (i = 0; i != len; ++i)
        if (in[i] == '\0' || in[i] == '\\')
            return SB_E_FORBIDDEN;

    /* collapse runs of '/'; the result is never longer than the input */
    for (i = 0; i != len; ++i) {
        if (in[i] == '/' && olen != 0 && out[olen - 1] == '/')
            continue;
        if (olen + 1 >= outsz)
            return SB_E_TOO_LARGE;
        out[olen++] = in[i];
    }
    /* one leading "./"; what follows cannot be '/' because runs are collapsed */
    if (olen >= 2 && out[0] == '.' && out[1] == '/') {
        memmove(out, out + 2, olen - 2);
        olen -= 2;
    }
    if (olen == 0 || has_dotdot_segment(out, olen))
        return SB_E_FORBIDDEN;
    out[olen] = '\0';
    return SB_OK;
}

int sb_path_is_tmp_name(const char *name, size_t len)
{
    return len >= SB_PATH_TMP_PREFIX_LEN && memcmp(name, SB_PATH_TMP_PREFIX, SB_PATH_TMP_PREFIX_LEN) == 0;
}

sb_status_t sb_path_storage_check(const char *path, size_t len, const char **why)
{
    size_t start = 0, i;

    if (len == 0) {
        *why = SB_PATH_WHY_UNSAFE;
        return SB_E_FORBIDDEN;
    }
    for (i = 0; i <= len; ++i) {
        if (i == len || path[i] == '/') {
            size_t n = i - start;
            const char *seg = path + start;
            if (n == 0 || (n == 1 && seg[0] == '.')) {
                *why = SB_PATH_WHY_SEGMENT;
                return SB_E_FORBIDDEN;
            }
            /* sb_path_normalize refuses these already; never trust a single layer */
            if (n == 2 && seg[0] == '.' && seg[1] == '.') {
                *why = SB_PATH_WHY_UNSAFE;
                return SB_E_FORBIDDEN;
            }
            if (sb_path_is_tmp_name(seg, n)) {
                *why = SB_PATH_WHY_RESERVED;
                return SB_E_FORBIDDEN;
            }
            start = i + 1;
        }
    }
    return SB_OK;
}
