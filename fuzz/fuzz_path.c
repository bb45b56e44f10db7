/*
 * libFuzzer driver for broker/call/path.c (sb_path_normalize).
 *
 * Input: byte 0 picks an output buffer size (small sizes probe the bound
 * checks; the buffer is heap-allocated at exactly that size so an overrun is
 * an ASan error), the rest is the path.
 *
 * Properties of an accepted path's output:
 *  - no ".." segment, no "//", no leading '/', no backslash, no NUL, not empty,
 *    never longer than the input;
 *  - it equals a reference written straight from PROTOCOL.md section 6 ("Paths")
 *    (collapse '/' runs, strip ONE leading "./", refuse ".." segments);
 *  - normalising it again is the identity, with the one exception the spec
 *    makes: only one leading "./" is stripped per pass, so an output that
 *    still starts with "./" (input "././a") loses that prefix on the next pass
 *    (and "./" alone becomes unsafe). Both cases are checked exactly.
 * A refusal is SB_E_FORBIDDEN or SB_E_TOO_LARGE, and TOO_LARGE only for an
 * input above SB_MAX_PATH or an output that does not fit the buffer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "sb/limits.h"
#include "call/path.h"
#include "fuzz.h"

static int has_dotdot_segment(const char *p, size_t len)
{
    size_t start = 0;

    for (size_t i = 0; i <= len; ++i) {
        if (i == len || p[i] == '/') {
            if (i - start == 2 && p[start] == '.' && p[start + 1] == '.')
                return 1;
            start = i + 1;
        }
    }
    return 0;
}

/* the spec, in the most obvious way; returns the length or -1 (unsafe) */
static long reference(const uint8_t *in, size_t len, char *out)
{
    size_t n = 0;

    if (len == 0 || in[0] == '/' || memchr(in, '\0', len) != NULL || memchr(in, '\\', len) != NULL)
        return -1;
    for (size_t i = 0; i < len; ++i) {
        if (in[i] == '/' && n > 0 && out[n - 1] == '/')
            continue;
        out[n++] = (char)in[i];
    }
    if (n >= 2 && out[0] == '.' && out[1] == '/') {
        memmove(out, out + 2, n - 2);
        n -= 2;
    }
    if (n == 0 || has_dotdot_segment(out, n))
        return -1;
    return (long)n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char ref[SB_MAX_PATH + 16], big[SB_MAX_PATH + 1], again[SB_MAX_PATH + 1];
    size_t outsz, len;
    const char *in;
    char *out, *inbuf;
    long want;
    sb_status_t st;

    if (size < 1 || size > SB_MAX_PATH + 64)
        return 0;
    /* byte 0: 0 means "large enough", else a small buffer of 1..255 bytes */
    outsz = data[0] == 0 ? SB_MAX_PATH + 1 : data[0];
    len = size - 1;
    inbuf = calloc(1, len != 0 ? len : 1);
    out = malloc(outsz);
    if (inbuf == NULL || out == NULL)
        abort();
    if (len != 0)
        memcpy(inbuf, data + 1, len);
    in = inbuf;

    st = sb_path_normalize(in, len, out, outsz);
    want = len <= SB_MAX_PATH ? reference(data + 1, len, ref) : -2;

    if (st != SB_OK) {
        SB_FUZZ_ASSERT(st == SB_E_FORBIDDEN || st == SB_E_TOO_LARGE, "status %d", (int)st);
        if (len > SB_MAX_PATH)
            SB_FUZZ_ASSERT(st == SB_E_TOO_LARGE || len == 0 || in[0] == '/', "oversized input: status %d", (int)st);
        else if (st == SB_E_FORBIDDEN)
            SB_FUZZ_ASSERT(want == -1, "refused as unsafe, the reference accepts \"%.*s\"", (int)want, ref);
        else
            /* too large for this buffer: the large buffer must then succeed or be unsafe */
            SB_FUZZ_ASSERT(outsz <= SB_MAX_PATH, "TOO_LARGE with a full-size buffer");
        goto Exit;
    }
    {
        size_t olen = strlen(out);
        SB_FUZZ_ASSERT(olen < outsz, "output does not fit its buffer");
        SB_FUZZ_ASSERT(olen > 0 && olen <= len, "output length %zu for input %zu", olen, len);
        SB_FUZZ_ASSERT(out[0] != '/', "leading '/'");
        SB_FUZZ_ASSERT(strstr(out, "//") == NULL, "\"//\" in the output");
        SB_FUZZ_ASSERT(strchr(out, '\\') == NULL, "backslash in the output");
        SB_FUZZ_ASSERT(!has_dotdot_segment(out, olen), "\"..\" segment in the output");
        SB_FUZZ_ASSERT(memchr(in, '\0', len) == NULL, "an input with NUL was accepted");
        SB_FUZZ_ASSERT(want >= 0 && (size_t)want == olen && memcmp(ref, out, olen) == 0,
                       "output \"%s\" differs from the reference (%ld)", out, want);

        /* normalising again */
        st = sb_path_normalize(out, olen, again, sizeof(again));
        if (olen >= 2 && out[0] == '.' && out[1] == '/') {
            if (olen == 2)
                SB_FUZZ_ASSERT(st == SB_E_FORBIDDEN, "\"./\" normalised again: %d", (int)st);
            else
                SB_FUZZ_ASSERT(st == SB_OK && strcmp(again, out + 2) == 0, "\"%s\" normalised again gave \"%s\"", out, again);
        } else {
            SB_FUZZ_ASSERT(st == SB_OK && strcmp(again, out) == 0, "not idempotent: \"%s\" -> \"%s\"", out, again);
        }
        /* the same input with a full-size buffer gives the same answer */
        SB_FUZZ_ASSERT(sb_path_normalize(in, len, big, sizeof(big)) == SB_OK && strcmp(big, out) == 0,
                       "buffer size changed the answer");
    }
Exit:
    free(out);
    free(inbuf);
    return 0;
}
