/*
 * libFuzzer driver for the files paths: the guest path the files handler
 * opens (broker/call/path.c: sb_path_normalize, then sb_path_storage_check,
 * as the typed-call decoder runs them), the root template it opens it under
 * (broker/svc/files/files_path.c, sb_files_root_expand) and the MIME type it
 * reports.
 *
 * Input: byte 0 picks the mode.
 *
 *   even: guest path. Byte 1 picks the output buffer size (0: large enough;
 *         else 1..255 bytes, heap-allocated at exactly that size so an
 *         overrun is an ASan error); the rest is the path.
 *         Properties: accepted exactly when sb_path_normalize accepts and the
 *         normalised form has no empty, "." or ".." segment and no segment
 *         starting with ".sb-tmp-" (the reference below); an accepted path
 *         equals that normalised form, is relative, free of NUL and
 *         backslash, is accepted again unchanged (a fixed point), and joined
 *         to a root it resolves lexically to itself: the path opened is the
 *         path the globs were matched against. Refusals are FORBIDDEN with a
 *         reason. The MIME type is never NULL and has one '/'.
 *
 *   odd:  root template. Byte 1 picks the output size as above; the rest is
 *         split at 0xff bytes into the template and up to four scope values
 *         for the keys k0..k3 (a missing part is an unbound key).
 *         Properties: on success the root is NUL-free, fits its buffer, is
 *         absolute, has exactly as many '/' as the template (no value ever
 *         adds a separator), every value that was looked up is a safe single
 *         segment, and a template without literal "." or ".." segments gives
 *         a root without them. FORBIDDEN happens only when a looked-up value
 *         is missing or unsafe; any other failure is EXECUTION; every failure
 *         has a reason.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "sb/limits.h"
#include "call/path.h"
#include "svc/files/files_path.h"
#include "fuzz.h"

#define NVALUES 4

/* what the typed files call holds: the normal form of the check, held to the storage shape */
static sb_status_t guest_path(const char *in, size_t len, char *out, size_t outsz, const char **why)
{
    sb_status_t st = sb_path_normalize(in, len, out, outsz);
    if (st != SB_OK) {
        *why = SB_PATH_WHY_UNSAFE;
        return SB_E_FORBIDDEN;
    }
    return sb_path_storage_check(out, strlen(out), why);
}

/* ---- guest paths -------------------------------------------------------------------------------------------------- */

static int segment_ok(const char *s, size_t n)
{
    if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
        return 0;
    return !(n >= 8 && memcmp(s, ".sb-tmp-", 8) == 0);
}

/* 1 if every '/'-separated segment is a plain name */
static int all_segments_ok(const char *p, size_t len)
{
    size_t start = 0;

    for (size_t i = 0; i <= len; ++i) {
        if (i == len || p[i] == '/') {
            if (!segment_ok(p + start, i - start))
                return 0;
            start = i + 1;
        }
    }
    return 1;
}

/* "/r/" + path resolved the way a shell would resolve "." and "..": equal to the plain join when nothing moves */
static int resolves_to_itself(const char *p, size_t len)
{
    static char stack[SB_MAX_PATH + 8];
    size_t top = 0, start = 0;

    for (size_t i = 0; i <= len; ++i) {
        if (i == len || p[i] == '/') {
            size_t n = i - start;
            if (n == 0 || (n == 1 && p[start] == '.'))
                return 0;
            if (n == 2 && p[start] == '.' && p[start + 1] == '.')
                return 0;
            if (top != 0)
                stack[top++] = '/';
            memcpy(stack + top, p + start, n);
            top += n;
            start = i + 1;
        }
    }
    return top == len && memcmp(stack, p, len) == 0;
}

static void fuzz_guest_path(const uint8_t *data, size_t size)
{
    static char ref[SB_MAX_PATH + 1], again[SB_MAX_PATH + 1];
    size_t outsz, len;
    char *in, *out;
    const char *why = NULL, *mime;
    sb_status_t st, nst;
    int want;

    if (size < 2)
        return;
    outsz = data[1] == 0 ? SB_MAX_PATH + 1 : data[1];
    len = size - 2;
    if ((in = malloc(len != 0 ? len : 1)) == NULL || (out = malloc(outsz)) == NULL)
        abort();
    if (len != 0)
        memcpy(in, data + 2, len);

    st = guest_path(in, len, out, outsz, &why);
    nst = sb_path_normalize(in, len, ref, outsz < sizeof(ref) ? outsz : sizeof(ref));
    want = nst == SB_OK && all_segments_ok(ref, strlen(ref));

    if (st != SB_OK) {
        SB_FUZZ_ASSERT(st == SB_E_FORBIDDEN, "status %d", (int)st);
        SB_FUZZ_ASSERT(why != NULL && why[0] != '\0', "a refusal without a reason");
        SB_FUZZ_ASSERT(!want, "refused (%s), the reference accepts \"%s\"", why, ref);
        goto Exit;
    }
    {
        size_t olen = strlen(out);
        SB_FUZZ_ASSERT(want, "accepted \"%s\", the reference refuses", out);
        SB_FUZZ_ASSERT(olen < outsz && olen > 0 && olen <= len, "output length %zu (buffer %zu, input %zu)", olen, outsz, len);
        SB_FUZZ_ASSERT(strcmp(out, ref) == 0, "\"%s\" is not the normalised \"%s\"", out, ref);
        SB_FUZZ_ASSERT(out[0] != '/', "absolute output");
        SB_FUZZ_ASSERT(memchr(in, '\0', len) == NULL && strchr(out, '\\') == NULL, "NUL or backslash got through");
        SB_FUZZ_ASSERT(resolves_to_itself(out, olen), "\"%s\" moves when resolved", out);
        why = NULL;
        SB_FUZZ_ASSERT(guest_path(out, olen, again, sizeof(again), &why) == SB_OK && strcmp(again, out) == 0,
                       "not a fixed point: \"%s\" -> \"%s\" (%s)", out, again, why != NULL ? why : "");
        mime = sb_files_mime_type(out, olen);
        SB_FUZZ_ASSERT(mime != NULL && strchr(mime, '/') != NULL && strchr(mime, '/') == strrchr(mime, '/'), "bad MIME type");
    }
Exit:
    free(out);
    free(in);
}

/* ---- root templates ------------------------------------------------------------------------------------------------- */

typedef struct st_scope_t {
    char *values[NVALUES]; /* NULL: unbound */
    int looked_up_unsafe;  /* some looked-up key was unbound or unsafe */
    int looked_up;
} scope_t;

static int value_safe(const char *v)
{
    size_t n;

    if (v == NULL)
        return 0;
    n = strlen(v);
    return n != 0 && strchr(v, '/') == NULL && !(n == 1 && v[0] == '.') && !(n == 2 && v[0] == '.' && v[1] == '.');
}

static const char *lookup(void *ctx, const char *key)
{
    scope_t *s = ctx;
    const char *v = NULL;

    if (key[0] == 'k' && key[1] >= '0' && key[1] < '0' + NVALUES && key[2] == '\0')
        v = s->values[key[1] - '0'];
    ++s->looked_up;
    if (!value_safe(v))
        s->looked_up_unsafe = 1;
    return v;
}

static size_t count_slashes(const char *s)
{
    size_t n = 0;
    for (; *s != '\0'; ++s)
        n += *s == '/';
    return n;
}

/* 1 if a segment of the template that holds no placeholder is "." or ".." */
static int template_has_literal_dot_segment(const char *t)
{
    size_t start = 0, len = strlen(t);

    for (size_t i = 0; i <= len; ++i) {
        if (i == len || t[i] == '/') {
            size_t n = i - start;
            if ((n == 1 && t[start] == '.') || (n == 2 && t[start] == '.' && t[start + 1] == '.'))
                return 1;
            start = i + 1;
        }
    }
    return 0;
}

static int root_has_dot_segment(const char *r)
{
    return template_has_literal_dot_segment(r);
}

static void fuzz_root(const uint8_t *data, size_t size)
{
    scope_t s;
    char *parts[1 + NVALUES] = {NULL}, *out;
    size_t outsz, nparts = 0, start = 2;
    const char *why = NULL;
    sb_status_t st;

    if (size < 2 || size > 8192)
        return;
    outsz = data[1] == 0 ? 4096 : data[1];
    /* split at 0xff; NUL bytes end a part early, exactly as the C strings they become */
    for (size_t i = 2; i <= size && nparts < 1 + NVALUES; ++i) {
        if (i == size || data[i] == 0xff) {
            size_t n = i - start;
            if ((parts[nparts] = malloc(n + 1)) == NULL)
                abort();
            memcpy(parts[nparts], data + start, n);
            parts[nparts][n] = '\0';
            ++nparts;
            start = i + 1;
        }
    }
    memset(&s, 0, sizeof(s));
    for (size_t i = 1; i < nparts; ++i)
        s.values[i - 1] = parts[i];
    if ((out = malloc(outsz)) == NULL)
        abort();

    st = sb_files_root_expand(parts[0], lookup, &s, out, outsz, &why);
    if (st == SB_OK) {
        size_t olen = strnlen(out, outsz);
        SB_FUZZ_ASSERT(olen < outsz, "root not terminated inside its buffer");
        SB_FUZZ_ASSERT(out[0] == '/' && parts[0][0] == '/', "a relative root");
        SB_FUZZ_ASSERT(!s.looked_up_unsafe, "an unbound or unsafe value was substituted into \"%s\"", out);
        SB_FUZZ_ASSERT(count_slashes(out) == count_slashes(parts[0]), "a value added a separator: \"%s\"", out);
        if (!template_has_literal_dot_segment(parts[0]))
            SB_FUZZ_ASSERT(!root_has_dot_segment(out), "a dot segment appeared: \"%s\"", out);
        if (s.looked_up == 0)
            SB_FUZZ_ASSERT(strcmp(out, parts[0]) == 0, "no placeholder, yet \"%s\" != \"%s\"", out, parts[0]);
    } else {
        SB_FUZZ_ASSERT(why != NULL && why[0] != '\0', "a failure without a reason");
        SB_FUZZ_ASSERT(st == SB_E_FORBIDDEN || st == SB_E_EXECUTION, "status %d", (int)st);
        if (st == SB_E_FORBIDDEN)
            SB_FUZZ_ASSERT(s.looked_up_unsafe, "forbidden (%s) although every value was safe", why);
    }
    free(out);
    for (size_t i = 0; i < nparts; ++i)
        free(parts[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > SB_MAX_PATH + 64)
        return 0;
    if ((data[0] & 1) == 0)
        fuzz_guest_path(data, size);
    else
        fuzz_root(data, size);
    return 0;
}
