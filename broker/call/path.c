/*
 * broker/authz: files-axis path normalisation (authz.h, sb_path_normalize).
 *
 * The rules are upstream's (questpie-wire.md section 4.2) so that a manifest
 * means the same thing here as there: a path is relative, has no NUL and no
 * backslash, runs of '/' collapse, one leading "./" is stripped and no segment
 * may be "..". Single "." segments are kept verbatim, exactly like upstream;
 * they cannot climb out of a scope, and the files target normalises again
 * before it touches storage (the "normalise here, write there" fix upstream
 * had to make is the target's job, not ours to paper over).
 *
 * The same function normalises the globs of files.read and files.write at
 * mint time, so a glob and a path are compared in the same canonical form.
 */
#include <string.h>
#include "sb/limits.h"
#include "authz/authz.h"

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
