/*
 * libFuzzer driver for proto/frame.c (the incremental, capped stdio frame
 * decoder).
 *
 * Input: byte 0 picks the mode.
 *  - even: the rest describes a sequence of frames (see build_frames); they are
 *    encoded with sb_frame_header, optionally followed by a bad header (zero
 *    or above the cap), and the stream is fed in random chunks.
 *    Property: the frames decoded equal the originals, in order, and the bad
 *    header yields exactly its error.
 *  - odd: bytes 1-2 pick a cap, the rest is a raw stream fed in random chunks.
 *    Property: the incremental decoder agrees with a whole-buffer reference
 *    decoder (same frames, same error at the same offset) for every chunking.
 * Both modes check after every call that the buffer never exceeds the cap and
 * only grows with bytes received.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "sb/frame.h"
#include "fuzz.h"

/* frames built per input in the round-trip mode */
#define MAX_FRAMES 64
/* frames the reference decodes before it stops comparing */
#define MAX_REF 4096

typedef struct st_span_t {
    size_t off, len; /* payload position in the stream */
} span_t;

/* the reference: decode a complete buffer at once */
typedef struct st_expect_t {
    span_t frames[MAX_REF];
    size_t n;
    int truncated;   /* the reference stopped at MAX_REF frames: compare those only */
    sb_status_t end; /* SB_E_AGAIN (stream ends, maybe mid-frame), SB_E_BAD_ARGS or SB_E_TOO_LARGE */
    size_t end_off;  /* for errors: stream offset right after the offending header */
    size_t partial;  /* for AGAIN: payload bytes of the unfinished frame (0 if its header is incomplete) */
    size_t hdr_have; /* for AGAIN: header bytes of the unfinished frame */
} expect_t;

static void reference(const uint8_t *s, size_t len, size_t cap, expect_t *e)
{
    size_t pos = 0;

    memset(e, 0, sizeof(*e));
    e->end = SB_E_AGAIN;
    for (;;) {
        size_t need;
        if (e->n == MAX_REF) {
            e->truncated = 1;
            return;
        }
        if (len - pos < SB_FRAME_HEADER_LEN) {
            e->hdr_have = len - pos;
            return;
        }
        need = (size_t)s[pos] << 24 | (size_t)s[pos + 1] << 16 | (size_t)s[pos + 2] << 8 | s[pos + 3];
        pos += SB_FRAME_HEADER_LEN;
        if (need == 0 || need > cap) {
            e->end = need == 0 ? SB_E_BAD_ARGS : SB_E_TOO_LARGE;
            e->end_off = pos;
            return;
        }
        if (len - pos < need) {
            e->hdr_have = SB_FRAME_HEADER_LEN;
            e->partial = len - pos;
            return;
        }
        e->frames[e->n].off = pos;
        e->frames[e->n].len = need;
        ++e->n;
        pos += need;
    }
}

/* feed the stream in random chunks and compare with the reference */
static void run(const uint8_t *s, size_t len, size_t cap, sb_fuzz_rng_t *rng)
{
    sb_frame_reader_t r;
    expect_t e;
    size_t pos = 0, got = 0;
    sb_status_t last = SB_E_AGAIN;

    reference(s, len, cap, &e);
    sb_frame_reader_init(&r, cap);
    while (pos < len && !(e.truncated && got == e.n)) {
        size_t chunk = sb_fuzz_rng_chunk(rng, len - pos), consumed = (size_t)-1, plen = 0, alloc_before = r.payload._alloc;
        const uint8_t *payload = NULL;
        /* a fresh copy per call, so reading past the chunk is an ASan error */
        uint8_t *copy = malloc(chunk);
        if (copy == NULL)
            abort();
        memcpy(copy, s + pos, chunk);
        last = sb_frame_feed(&r, copy, chunk, &consumed, &payload, &plen);
        free(copy);

        SB_FUZZ_ASSERT(consumed <= chunk, "consumed %zu of a %zu-byte chunk", consumed, chunk);
        SB_FUZZ_ASSERT(r.payload._alloc <= cap + 1, "buffer of %zu bytes above the cap %zu and its NUL", r.payload._alloc, cap);
        SB_FUZZ_ASSERT(r.payload._alloc >= r.payload.len, "buffer of %zu bytes holds %zu", r.payload._alloc, r.payload.len);
        SB_FUZZ_ASSERT(r.payload._alloc <= alloc_before || r.payload._alloc <= 4096 || r.payload._alloc <= 2 * r.payload.len,
                       "buffer grew from %zu to %zu with only %zu bytes received", alloc_before, r.payload._alloc, r.payload.len);
        pos += consumed;
        if (last == SB_OK) {
            SB_FUZZ_ASSERT(got < e.n, "decoder produced frame %zu, the reference only %zu", got, e.n);
            SB_FUZZ_ASSERT(plen == e.frames[got].len, "frame %zu: length %zu, want %zu", got, plen, e.frames[got].len);
            SB_FUZZ_ASSERT(pos == e.frames[got].off + plen, "frame %zu ends at %zu, want %zu", got, pos, e.frames[got].off + plen);
            SB_FUZZ_ASSERT(memcmp(payload, s + e.frames[got].off, plen) == 0, "frame %zu: payload differs", got);
            ++got;
            continue;
        }
        if (last == SB_E_AGAIN) {
            SB_FUZZ_ASSERT(consumed == chunk, "AGAIN after consuming %zu of %zu", consumed, chunk);
            continue;
        }
        /* an error ends the stream */
        SB_FUZZ_ASSERT(last == e.end, "status %d, the reference says %d", (int)last, (int)e.end);
        SB_FUZZ_ASSERT(pos == e.end_off, "error at offset %zu, want %zu", pos, e.end_off);
        SB_FUZZ_ASSERT(got == e.n, "error after %zu frames, want %zu", got, e.n);
        SB_FUZZ_ASSERT(last != SB_E_TOO_LARGE || r.payload.len == 0, "TOO_LARGE after buffering %zu bytes", r.payload.len);
        break;
    }
    if (!e.truncated && (last == SB_OK || last == SB_E_AGAIN)) {
        SB_FUZZ_ASSERT(pos == len, "stopped at %zu of %zu without an error", pos, len);
        SB_FUZZ_ASSERT(got == e.n, "%zu frames decoded, the reference has %zu", got, e.n);
        SB_FUZZ_ASSERT(e.end == SB_E_AGAIN, "the reference ends in error %d, the decoder did not", (int)e.end);
        if (last == SB_E_AGAIN && e.hdr_have == SB_FRAME_HEADER_LEN)
            SB_FUZZ_ASSERT(r.payload.len == e.partial, "unfinished frame holds %zu bytes, want %zu", r.payload.len, e.partial);
    }
    sb_frame_reader_dispose(&r);
}

/*
 * Frame descriptions: a byte with the top bit clear is a short frame of
 * (b & 0x7f) + 1 bytes copied from the input; with the top bit set, the next
 * byte completes a long frame of ((b & 0x3f) << 8 | next) + 1 bytes (up to
 * 16 KiB, beyond the reader's 4 KiB first allocation) filled from the PRNG.
 * Bit 6 of a long-frame byte ends the list with a bad header.
 */
static void build_frames(const uint8_t *d, size_t n, sb_fuzz_rng_t *rng)
{
    uint8_t *s = NULL;
    size_t len = 0, i = 0, frames = 0, maxlen = 1, cap;
    int bad_tail = 0;

    while (i < n && frames < MAX_FRAMES) {
        uint8_t b = d[i++];
        size_t plen;
        const uint8_t *src = NULL;
        if (b & 0x80) {
            if (i == n)
                break;
            if (b & 0x40) {
                bad_tail = 1;
                break;
            }
            plen = ((size_t)(b & 0x3f) << 8 | d[i++]) + 1;
        } else {
            plen = (size_t)(b & 0x7f) + 1;
            if (n - i >= plen) {
                src = d + i;
                i += plen;
            }
        }
        s = realloc(s, len + SB_FRAME_HEADER_LEN + plen);
        if (s == NULL)
            abort();
        sb_frame_header((uint32_t)plen, s + len);
        len += SB_FRAME_HEADER_LEN;
        if (src != NULL) {
            memcpy(s + len, src, plen);
        } else {
            for (size_t k = 0; k < plen; ++k)
                s[len + k] = (uint8_t)sb_fuzz_rng_next(rng);
        }
        len += plen;
        if (plen > maxlen)
            maxlen = plen;
        ++frames;
    }
    /* the cap is the largest frame (exactly at the cap must pass), or something above it */
    cap = maxlen + (sb_fuzz_rng_next(rng) % 2 == 0 ? 0 : sb_fuzz_rng_next(rng) % 70000);
    if (bad_tail) {
        uint32_t v = sb_fuzz_rng_next(rng), bad;
        switch (v % 4) {
        case 0:
            bad = 0;
            break;
        case 1:
            bad = (uint32_t)cap + 1;
            break;
        case 2:
            bad = 0xffffffffu;
            break;
        default:
            bad = (uint32_t)cap + 1 + (v >> 4);
            break;
        }
        s = realloc(s, len + SB_FRAME_HEADER_LEN + 8);
        if (s == NULL)
            abort();
        sb_frame_header(bad, s + len);
        memset(s + len + SB_FRAME_HEADER_LEN, 0x5a, 8);
        len += SB_FRAME_HEADER_LEN + 8;
    }
    if (len != 0) {
        expect_t e;
        reference(s, len, cap, &e);
        /* the reference itself must see exactly the frames we encoded */
        SB_FUZZ_ASSERT(e.n == frames, "reference decoded %zu of %zu encoded frames", e.n, frames);
        if (bad_tail)
            SB_FUZZ_ASSERT(e.end != SB_E_AGAIN, "reference missed the bad header");
        else
            SB_FUZZ_ASSERT(e.end == SB_E_AGAIN && e.hdr_have == 0 && e.partial == 0, "reference sees an unfinished frame");
        run(s, len, cap, rng);
    }
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sb_fuzz_rng_t rng;

    if (size < 1)
        return 0;
    sb_fuzz_rng_seed(&rng, data, size);
    if ((data[0] & 1) == 0) {
        build_frames(data + 1, size - 1, &rng);
    } else if (size >= 3) {
        size_t cap = 1 + (((size_t)data[1] << 8 | data[2]) % 70000);
        run(data + 3, size - 3, cap, &rng);
        /* and once more with the production cap */
        run(data + 3, size - 3, 7122604u, &rng);
    }
    return 0;
}
