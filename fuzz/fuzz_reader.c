/*
 * libFuzzer driver for proto/buf.c: sb_reader_t driven by random operation
 * sequences, with an sb_buf_t as the sink for what it reads.
 *
 * Input: byte 0 = how many bytes (mod 64) at the end are the reader's data;
 * the bytes between are a program of operations, each an opcode byte and
 * its argument bytes (a missing byte reads as 0).
 *
 * The reader runs over an exact-size heap copy of its data, so any read past
 * the end is an ASan error. A model (an offset into the data) predicts every
 * operation. Properties:
 *  - every fetch succeeds exactly when the model says the bytes are there,
 *    returns exactly the model's bytes (views point into the data, never
 *    outside it), and moves the reader by exactly what it consumed; a failed
 *    fetch does not move it;
 *  - until / until_seq / take_charset / dec / hex agree with byte-at-a-time
 *    reference implementations;
 *  - remaining + offset is always the data's length; a saved copy of the
 *    reader rolls back exactly;
 *  - the sink: every append of a view, a byte or printf'd text succeeds
 *    exactly when it fits the cap, never truncates, keeps the NUL after the
 *    bytes and storage at most cap + 1 (and at most twice what it holds,
 *    past the first block); its bytes always equal a model copy; consume,
 *    truncate and reset do what the model does; injected allocation failures
 *    (sb_mem_fail_nth) are SB_E_NOMEM and change nothing.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sb/buf.h"
#include "sb/mem.h"
#include "fuzz.h"

#define SINK_MODEL 4096

typedef struct st_prog_t {
    const uint8_t *p;
    size_t left;
} prog_t;

static uint8_t op_byte(prog_t *g)
{
    if (g->left == 0)
        return 0;
    --g->left;
    return *g->p++;
}

static size_t op_size(prog_t *g)
{
    uint8_t b = op_byte(g);
    /* mostly small, sometimes huge (to probe overflow) */
    if (b == 0xff)
        return SIZE_MAX - op_byte(g);
    if (b == 0xfe)
        return (size_t)1 << (op_byte(g) % 64);
    return b % 80;
}

typedef struct st_sink_t {
    sb_buf_t b;
    uint8_t model[SINK_MODEL];
    size_t len;
    size_t high; /* the most it held (or reserved) since its storage was last released */
} sink_t;

static void sink_check(sink_t *s)
{
    if (s->len > s->high)
        s->high = s->len;
    const sb_buf_t *b = &s->b;
    SB_FUZZ_ASSERT(b->len == s->len, "sink holds %zu bytes, model %zu", b->len, s->len);
    SB_FUZZ_ASSERT(b->len <= sb_buf_cap(b), "sink above its cap");
    if (b->base == NULL) {
        SB_FUZZ_ASSERT(b->len == 0 && b->_alloc == 0, "no storage but bytes");
        return;
    }
    SB_FUZZ_ASSERT(b->_alloc >= b->len + 1 && b->base[b->len] == '\0', "no NUL after the bytes");
    SB_FUZZ_ASSERT(b->_alloc <= sb_buf_cap(b) + 1, "storage %zu above cap + 1 (%zu)", b->_alloc, sb_buf_cap(b));
    SB_FUZZ_ASSERT(b->_alloc <= 256 || b->_alloc <= 2 * (s->high + 1), "storage %zu after holding at most %zu bytes", b->_alloc,
                   s->high);
    SB_FUZZ_ASSERT(b->len == 0 || memcmp(b->base, s->model, b->len) == 0, "sink bytes differ from the model");
}

static void sink_append(sink_t *s, const void *p, size_t n, int fail)
{
    sb_status_t st;
    if (fail)
        sb_mem_fail_nth(1);
    st = sb_buf_append(&s->b, p, n);
    sb_mem_fail_nth(0);
    if (n > sb_buf_cap(&s->b) - s->len) {
        SB_FUZZ_ASSERT(st == SB_E_TOO_LARGE, "append past the cap: %d", (int)st);
    } else if (st == SB_E_NOMEM) {
        SB_FUZZ_ASSERT(fail, "NOMEM without an injected failure");
    } else {
        SB_FUZZ_ASSERT(st == SB_OK, "append within the cap: %d", (int)st);
        memcpy(s->model + s->len, p, n);
        s->len += n;
    }
    sink_check(s);
}

static size_t ref_until(const uint8_t *d, size_t off, size_t len, uint8_t delim)
{
    for (size_t i = off; i < len; ++i)
        if (d[i] == delim)
            return i - off;
    return SIZE_MAX;
}

static size_t ref_until_seq(const uint8_t *d, size_t off, size_t len, const uint8_t *seq, size_t n)
{
    for (size_t i = off; i + n <= len; ++i)
        if (memcmp(d + i, seq, n) == 0)
            return i - off;
    return SIZE_MAX;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static sink_t sink;
    size_t dlen, off = 0;
    uint8_t *d;
    sb_reader_t r, saved;
    size_t saved_off = 0;
    prog_t g;
    int have_saved = 0;

    if (size == 0)
        return 0;
    dlen = data[0] % 64;
    if (dlen > size - 1)
        dlen = size - 1;
    if ((d = malloc(dlen != 0 ? dlen : 1)) == NULL)
        abort();
    memcpy(d, data + size - dlen, dlen);
    g.p = data + 1;
    g.left = size - 1 - dlen;

    sb_reader_init(&r, dlen != 0 ? d : NULL, dlen);
    sb_buf_init(&sink.b, 0);
    sink.len = sink.high = 0;
    sb_buf_set_cap(&sink.b, 16 + data[0] * 8u);
    if (data[0] & 0x80) {
        sb_buf_free(&sink.b);
        sb_buf_init_secret(&sink.b, 16 + data[0] * 8u);
    }

    while (g.left != 0) {
        uint8_t op = op_byte(&g);
        size_t left = dlen - off, n;
        sb_view_t v = {NULL, 0};
        sb_status_t st;
        SB_FUZZ_ASSERT(sb_reader_remaining(&r) == left && sb_reader_offset(&r) == off,
                       "accounting: remaining %zu offset %zu, model %zu %zu", sb_reader_remaining(&r), sb_reader_offset(&r), left,
                       off);
        switch (op % 20) {
        case 0: { /* u8 */
            uint8_t u = 0;
            st = sb_reader_u8(&r, &u);
            SB_FUZZ_ASSERT(st == (left >= 1 ? SB_OK : SB_E_AGAIN), "u8 status");
            if (st == SB_OK) {
                SB_FUZZ_ASSERT(u == d[off], "u8 value");
                off += 1;
            }
            break;
        }
        case 1: { /* be16 */
            uint16_t u = 0;
            st = sb_reader_be16(&r, &u);
            SB_FUZZ_ASSERT(st == (left >= 2 ? SB_OK : SB_E_AGAIN), "be16 status");
            if (st == SB_OK) {
                SB_FUZZ_ASSERT(u == (uint16_t)(d[off] << 8 | d[off + 1]), "be16 value");
                off += 2;
            }
            break;
        }
        case 2: { /* be32 */
            uint32_t u = 0;
            st = sb_reader_be32(&r, &u);
            SB_FUZZ_ASSERT(st == (left >= 4 ? SB_OK : SB_E_AGAIN), "be32 status");
            if (st == SB_OK) {
                uint32_t want = 0;
                for (int i = 0; i < 4; ++i)
                    want = want << 8 | d[off + (size_t)i];
                SB_FUZZ_ASSERT(u == want, "be32 value");
                off += 4;
            }
            break;
        }
        case 3: { /* be64 */
            uint64_t u = 0;
            st = sb_reader_be64(&r, &u);
            SB_FUZZ_ASSERT(st == (left >= 8 ? SB_OK : SB_E_AGAIN), "be64 status");
            if (st == SB_OK) {
                uint64_t want = 0;
                for (int i = 0; i < 8; ++i)
                    want = want << 8 | d[off + (size_t)i];
                SB_FUZZ_ASSERT(u == want, "be64 value");
                off += 8;
            }
            break;
        }
        case 4: /* bytes */
        case 5: /* peek_bytes */
            n = op_size(&g);
            st = op % 20 == 4 ? sb_reader_bytes(&r, n, &v) : sb_reader_peek_bytes(&r, n, &v);
            SB_FUZZ_ASSERT(st == (n <= left ? SB_OK : SB_E_AGAIN), "bytes(%zu) with %zu left: %d", n, left, (int)st);
            if (st == SB_OK) {
                SB_FUZZ_ASSERT(v.len == n && (n == 0 || v.base == d + off), "bytes view");
                if (op % 20 == 4)
                    off += n;
                if (n <= 80)
                    sink_append(&sink, v.base, v.len, (op & 0x80) != 0);
            }
            break;
        case 6: { /* copy */
            uint8_t tmp[80];
            n = op_byte(&g) % sizeof(tmp);
            st = sb_reader_copy(&r, tmp, n);
            SB_FUZZ_ASSERT(st == (n <= left ? SB_OK : SB_E_AGAIN), "copy status");
            if (st == SB_OK) {
                SB_FUZZ_ASSERT(n == 0 || memcmp(tmp, d + off, n) == 0, "copy bytes");
                off += n;
            }
            break;
        }
        case 7: /* skip */
            n = op_size(&g);
            st = sb_reader_skip(&r, n);
            SB_FUZZ_ASSERT(st == (n <= left ? SB_OK : SB_E_AGAIN), "skip status");
            if (st == SB_OK)
                off += n;
            break;
        case 8: { /* peek, peek_at */
            uint8_t u = 0;
            n = op_size(&g);
            st = sb_reader_peek(&r, &u);
            SB_FUZZ_ASSERT(st == (left >= 1 ? SB_OK : SB_E_AGAIN) && (st != SB_OK || u == d[off]), "peek");
            st = sb_reader_peek_at(&r, n, &u);
            SB_FUZZ_ASSERT(st == (n < left ? SB_OK : SB_E_AGAIN) && (st != SB_OK || u == d[off + n]), "peek_at(%zu)", n);
            break;
        }
        case 9: { /* until */
            uint8_t delim = op_byte(&g);
            size_t want = ref_until(d, off, dlen, delim);
            st = sb_reader_until(&r, delim, &v);
            SB_FUZZ_ASSERT(st == (want != SIZE_MAX ? SB_OK : SB_E_AGAIN), "until status");
            if (st == SB_OK) {
                SB_FUZZ_ASSERT(v.len == want && (want == 0 || v.base == d + off), "until view");
                off += want;
            }
            break;
        }
        case 10: { /* until_seq */
            uint8_t seq[4];
            size_t want;
            n = op_byte(&g) % 5;
            for (size_t i = 0; i < n; ++i)
                seq[i] = op_byte(&g);
            st = sb_reader_until_seq(&r, seq, n, &v);
            if (n == 0) {
                SB_FUZZ_ASSERT(st == SB_E_BAD_ARGS, "until_seq of nothing");
                break;
            }
            want = ref_until_seq(d, off, dlen, seq, n);
            SB_FUZZ_ASSERT(st == (want != SIZE_MAX ? SB_OK : SB_E_AGAIN), "until_seq status");
            if (st == SB_OK) {
                SB_FUZZ_ASSERT(v.len == want && (want == 0 || v.base == d + off), "until_seq view");
                off += want;
            }
            break;
        }
        case 11: { /* take_charset */
            char set[4];
            size_t sl = op_byte(&g) % 5, want = 0;
            for (size_t i = 0; i < sl; ++i)
                set[i] = (char)op_byte(&g);
            while (off + want < dlen && sl != 0 && memchr(set, d[off + want], sl) != NULL)
                ++want;
            n = sb_reader_take_charset(&r, set, sl, (op & 0x80) ? NULL : &v);
            SB_FUZZ_ASSERT(n == want, "take_charset took %zu, model %zu", n, want);
            if (!(op & 0x80))
                SB_FUZZ_ASSERT(v.len == want && (want == 0 || v.base == d + off), "take_charset view");
            off += want;
            break;
        }
        case 12:
        case 13: { /* dec, hex */
            unsigned base = op % 20 == 12 ? 10 : 16;
            uint64_t max = op_byte(&g) & 1 ? UINT64_MAX : op_byte(&g) * 1000u, got = 0, want = 0;
            size_t k = 0;
            int over = 0;
            for (; off + k < dlen; ++k) {
                uint8_t c = d[off + k];
                int dg = c >= '0' && c <= '9'                 ? c - '0'
                         : base == 16 && c >= 'a' && c <= 'f' ? c - 'a' + 10
                         : base == 16 && c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                              : -1;
                if (dg < 0)
                    break;
                if (!over &&
                    (__builtin_mul_overflow(want, base, &want) || __builtin_add_overflow(want, (uint64_t)dg, &want) || want > max))
                    over = 1;
            }
            st = base == 10 ? sb_reader_dec(&r, max, &got) : sb_reader_hex(&r, max, &got);
            if (k == 0)
                SB_FUZZ_ASSERT(st == SB_E_BAD_ARGS, "number without digits: %d", (int)st);
            else if (over)
                SB_FUZZ_ASSERT(st == SB_E_TOO_LARGE, "number above max: %d", (int)st);
            else
                SB_FUZZ_ASSERT(st == SB_OK && got == want, "number %llu, model %llu", (unsigned long long)got,
                               (unsigned long long)want);
            if (st == SB_OK)
                off += k;
            break;
        }
        case 14: { /* expect */
            uint8_t lit[4];
            size_t ln = op_byte(&g) % 5;
            int want;
            /* half the time a literal taken from the data, so it matches */
            for (size_t i = 0; i < ln; ++i)
                lit[i] = (op & 0x40) && off + i < dlen ? d[off + i] : op_byte(&g);
            want = ln <= left && (ln == 0 || memcmp(d + off, lit, ln) == 0);
            SB_FUZZ_ASSERT(sb_reader_expect(&r, lit, ln) == want, "expect");
            if (want)
                off += ln;
            break;
        }
        case 15: /* save / restore */
            if (have_saved && (op & 1)) {
                r = saved;
                off = saved_off;
            } else {
                saved = r;
                saved_off = off;
                have_saved = 1;
            }
            break;
        case 16: { /* rest */
            v = sb_reader_rest(&r);
            SB_FUZZ_ASSERT(v.len == left && (left == 0 || v.base == d + off), "rest");
            break;
        }
        case 17: { /* sink: a byte, or printf */
            char t[40];
            int tn;
            if (op & 0x40) {
                uint8_t c = op_byte(&g);
                sink_append(&sink, &c, 1, (op & 0x80) != 0);
                break;
            }
            n = op_byte(&g);
            tn = snprintf(t, sizeof(t), "%zu:%0*d", n, (int)(n % 24), (int)n);
            {
                size_t before = sink.len;
                if (op & 0x80)
                    sb_mem_fail_nth(1);
                st = sb_buf_printf(&sink.b, "%zu:%0*d", n, (int)(n % 24), (int)n);
                sb_mem_fail_nth(0);
                if ((size_t)tn > sb_buf_cap(&sink.b) - before)
                    SB_FUZZ_ASSERT(st == SB_E_TOO_LARGE, "printf past the cap: %d", (int)st);
                else if (st != SB_E_NOMEM || !(op & 0x80)) {
                    SB_FUZZ_ASSERT(st == SB_OK, "printf within the cap: %d", (int)st);
                    memcpy(sink.model + sink.len, t, (size_t)tn);
                    sink.len += (size_t)tn;
                }
            }
            sink_check(&sink);
            break;
        }
        case 18: /* sink: consume, truncate, reset */
            n = op_byte(&g) % 96;
            if (op & 0x40) {
                sb_buf_consume(&sink.b, n);
                if (n >= sink.len)
                    sink.len = 0;
                else {
                    memmove(sink.model, sink.model + n, sink.len - n);
                    sink.len -= n;
                }
            } else if (op & 0x80) {
                sb_buf_reset(&sink.b);
                sink.len = 0;
            } else {
                sb_buf_truncate(&sink.b, n);
                if (n < sink.len)
                    sink.len = n;
            }
            sink_check(&sink);
            break;
        default: { /* sink: reserve + commit, or take */
            char *room = NULL;
            n = op_size(&g);
            if (op & 0x40) {
                char *out = NULL;
                size_t ol = 0;
                st = sb_buf_take(&sink.b, &out, &ol);
                SB_FUZZ_ASSERT(st == SB_OK && ol == sink.len && out[ol] == '\0' && (ol == 0 || memcmp(out, sink.model, ol) == 0),
                               "take");
                sb_mem_free(out);
                sink.len = sink.high = 0;
                sink_check(&sink);
                break;
            }
            st = sb_buf_reserve(&sink.b, n, &room);
            if (n > sb_buf_cap(&sink.b) - sink.len) {
                SB_FUZZ_ASSERT(st == SB_E_TOO_LARGE, "reserve past the cap");
            } else {
                size_t k = n < 8 ? n : 8;
                SB_FUZZ_ASSERT(st == SB_OK && room == sink.b.base + sink.len, "reserve");
                /* storage was sized for what was reserved, not only for what is committed */
                if (sink.len + n > sink.high)
                    sink.high = sink.len + n;
                memset(room, 'R', k);
                sb_buf_commit(&sink.b, k);
                memset(sink.model + sink.len, 'R', k);
                sink.len += k;
            }
            sink_check(&sink);
            break;
        }
        }
        SB_FUZZ_ASSERT(sink.len <= SINK_MODEL - 128, "model overflow");
    }
    SB_FUZZ_ASSERT(sb_reader_remaining(&r) + sb_reader_offset(&r) == dlen, "remaining + offset == length");
    sb_buf_free(&sink.b);
    free(d);
    return 0;
}
