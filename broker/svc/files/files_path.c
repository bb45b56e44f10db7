/*
 * broker/svc/files/files_path: root templates and MIME types (files_path.h).
 * The guest path itself is decoded once, with the rest of the call, by
 * broker/call (call/path.h).
 */
#include <string.h>
#include "sb/limits.h"
#include "svc/files/files_path.h"

static int is_key_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static int is_dot_segment(const char *s, size_t len)
{
    return (len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.');
}

/* a value that can stand for exactly one directory name and nothing else */
static int safe_value(const char *v)
{
    size_t n;

    if (v == NULL)
        return 0;
    n = strlen(v);
    return n != 0 && !is_dot_segment(v, n) && memchr(v, '/', n) == NULL;
}

sb_status_t sb_files_root_expand(const char *tmpl, sb_files_scope_fn lookup, void *ctx, char *out, size_t outsz, const char **why)
{
    size_t olen = 0, seg_start = 0;
    int seg_substituted = 0;
    const char *p = tmpl;

    if (tmpl == NULL || tmpl[0] != '/' || outsz == 0) {
        *why = SB_FILES_WHY_TEMPLATE;
        return SB_E_EXECUTION;
    }
    for (;;) {
        char c = *p;
        /* a segment ends: it may hold substituted text, which must not turn it into "." or ".." */
        if (c == '/' || c == '\0') {
            if (seg_substituted && is_dot_segment(out + seg_start, olen - seg_start)) {
                *why = SB_FILES_WHY_SCOPE;
                return SB_E_FORBIDDEN;
            }
            seg_substituted = 0;
            seg_start = olen + 1;
            if (c == '\0')
                break;
        }
        if (c == '{') {
            char key[SB_FILES_MAX_SCOPE_KEY + 1];
            size_t klen = 0, vlen;
            const char *v;
            ++p;
            while (is_key_char(*p) && klen < SB_FILES_MAX_SCOPE_KEY)
                key[klen++] = *p++;
            if (klen == 0 || *p != '}') {
                *why = SB_FILES_WHY_TEMPLATE;
                return SB_E_EXECUTION;
            }
            ++p;
            key[klen] = '\0';
            v = lookup(ctx, key);
            if (!safe_value(v)) {
                *why = SB_FILES_WHY_SCOPE;
                return SB_E_FORBIDDEN;
            }
            vlen = strlen(v);
            if (vlen >= outsz - olen) {
                *why = SB_FILES_WHY_ROOT_LONG;
                return SB_E_EXECUTION;
            }
            memcpy(out + olen, v, vlen);
            olen += vlen;
            seg_substituted = 1;
            continue;
        }
        if (c == '}') {
            *why = SB_FILES_WHY_TEMPLATE;
            return SB_E_EXECUTION;
        }
        if (olen + 1 >= outsz) {
            *why = SB_FILES_WHY_ROOT_LONG;
            return SB_E_EXECUTION;
        }
        out[olen++] = c;
        ++p;
    }
    out[olen] = '\0';
    return SB_OK;
}

/* ---- MIME types ----------------------------------------------------------------------------------------------------- */

static char ascii_lower(char c)
{
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

const char *sb_files_mime_type(const char *path, size_t len)
{
    static const struct {
        const char *ext;
        const char *type;
    } types[] = {
        {"txt", "text/plain"},
        {"md", "text/markdown"},
        {"markdown", "text/markdown"},
        {"html", "text/html"},
        {"htm", "text/html"},
        {"css", "text/css"},
        {"csv", "text/csv"},
        {"tsv", "text/tab-separated-values"},
        {"js", "text/javascript"},
        {"mjs", "text/javascript"},
        {"ts", "text/plain"},
        {"json", "application/json"},
        {"xml", "application/xml"},
        {"yaml", "application/yaml"},
        {"yml", "application/yaml"},
        {"pdf", "application/pdf"},
        {"zip", "application/zip"},
        {"gz", "application/gzip"},
        {"wasm", "application/wasm"},
        {"png", "image/png"},
        {"jpg", "image/jpeg"},
        {"jpeg", "image/jpeg"},
        {"gif", "image/gif"},
        {"webp", "image/webp"},
        {"svg", "image/svg+xml"},
        {"ico", "image/x-icon"},
        {"mp3", "audio/mpeg"},
        {"wav", "audio/wav"},
        {"mp4", "video/mp4"},
        {"webm", "video/webm"},
        {NULL, NULL},
    };
    char ext[16];
    size_t i, dot, n;

    /* the extension of the last segment only: "a.d/readme" has none */
    for (dot = len; dot != 0; --dot) {
        if (path[dot - 1] == '/')
            return "application/octet-stream";
        if (path[dot - 1] == '.')
            break;
    }
    if (dot == 0 || (n = len - dot) == 0 || n >= sizeof(ext))
        return "application/octet-stream";
    for (i = 0; i != n; ++i)
        ext[i] = ascii_lower(path[dot + i]);
    ext[n] = '\0';
    for (i = 0; types[i].ext != NULL; ++i)
        if (strcmp(types[i].ext, ext) == 0)
            return types[i].type;
    return "application/octet-stream";
}
