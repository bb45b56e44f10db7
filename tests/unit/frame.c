/*
 * Unit tests for proto/frame.c: the incremental, capped stdio frame decoder
 * (PROTOCOL.md, "Stdio frames": 4-byte big-endian length, then the payload).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "sb/frame.h"
#include "sb/limits.h"
#include "sb/mem.h"

#define MAX_FRAMES 8

/* a stream of frames and the payloads it carries */
typedef struct st_stream_t {
    uint8_t *bytes;
    size_t len;
    const uint8_t *payload[MAX_FRAMES];
    size_t payload_len[MAX_FRAMES];
    size_t n;
} stream_t;

static void stream_add(stream_t *s, const uint8_t *payload, size_t len)
{
    s->bytes = realloc(s->bytes, s->len + SB_FRAME_HEADER_LEN + len);
    if (s->bytes == NULL)
        abort();
    sb_frame_header((uint32_t)len, s->bytes + s->len);
    memcpy(s->bytes + s->len + SB_FRAME_HEADER_LEN, payload, len);
    s->len += SB_FRAME_HEADER_LEN + len;
    s->payload[s->n] = payload;
    s->payload_len[s->n] = len;
    ++s->n;
}

/*
 * Feeds `in` to the reader, all of it, and compares every frame that comes
 * out with the next expected payload. Returns the number of mismatches
 * (0 when everything matched); *next is the index of the next expected frame.
 */
static int feed_all(sb_frame_reader_t *r, const stream_t *s, const uint8_t *in, size_t len, size_t *next)
{
    int bad = 0;

    while (len != 0) {
        size_t consumed = 0, plen = 0;
        const uint8_t *payload = NULL;
        sb_status_t st = sb_frame_feed(r, in, len, &consumed, &payload, &plen);
        if (consumed > len)
            return bad + 1;
        in += consumed;
        len -= consumed;
        if (st == SB_E_AGAIN) {
            if (len != 0)
                ++bad; /* AGAIN must mean "all input consumed" */
            break;
        }
        if (st != SB_OK)
            return bad + 1;
        if (*next >= s->n || plen != s->payload_len[*next] || memcmp(payload, s->payload[*next], plen) != 0)
            ++bad;
        ++*next;
    }
    return bad;
}

static uint8_t p1[1] = {0x80};
static uint8_t p2[300];
static uint8_t p3[5000];
static uint8_t p4[3] = {0x81, 0xa1, 0x61};

static void init_payloads(void)
{
    for (size_t i = 0; i < sizeof(p2); ++i)
        p2[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof(p3); ++i)
        p3[i] = (uint8_t)(i * 13 + 5);
}

static void test_header(void)
{
    uint8_t h[4];

    sb_frame_header(0x01020304u, h);
    ok(h[0] == 1 && h[1] == 2 && h[2] == 3 && h[3] == 4, "header is big-endian");
    sb_frame_header(0xffffffffu, h);
    ok(h[0] == 0xff && h[1] == 0xff && h[2] == 0xff && h[3] == 0xff, "header of 0xffffffff");
    sb_frame_header(5, h);
    ok(h[0] == 0 && h[1] == 0 && h[2] == 0 && h[3] == 5, "header of 5");
}

static void test_one_buffer(const stream_t *s)
{
    sb_frame_reader_t r;
    size_t next = 0;

    sb_frame_reader_init(&r, 65536);
    is_int(feed_all(&r, s, s->bytes, s->len, &next), 0, "several frames in one buffer decode in order");
    is_int(next, s->n, "all %zu frames came out of one buffer", s->n);
    sb_frame_reader_dispose(&r);
}

static void test_every_split(const stream_t *s)
{
    int bad = 0, missing = 0;

    for (size_t k = 0; k <= s->len; ++k) {
        sb_frame_reader_t r;
        size_t next = 0;
        sb_frame_reader_init(&r, 65536);
        bad += feed_all(&r, s, s->bytes, k, &next);
        bad += feed_all(&r, s, s->bytes + k, s->len - k, &next);
        if (next != s->n)
            ++missing;
        sb_frame_reader_dispose(&r);
    }
    is_int(bad, 0, "split at each of the %zu byte boundaries: every frame intact", s->len + 1);
    is_int(missing, 0, "split at every byte boundary: no frame lost");
}

static void test_byte_at_a_time(const stream_t *s)
{
    sb_frame_reader_t r;
    size_t next = 0;
    int bad = 0;

    sb_frame_reader_init(&r, 65536);
    for (size_t i = 0; i < s->len; ++i)
        bad += feed_all(&r, s, s->bytes + i, 1, &next);
    is_int(bad, 0, "one byte at a time: every frame intact");
    is_int(next, s->n, "one byte at a time: every frame delivered");
    sb_frame_reader_dispose(&r);
}

static void test_three_way_splits(const stream_t *s)
{
    int bad = 0, missing = 0;

    /* every pair of cut points over the first 320 bytes (the first three frames and the start of the fourth) */
    for (size_t a = 0; a <= 320; ++a) {
        for (size_t b = a; b <= 320; b += 7) {
            sb_frame_reader_t r;
            size_t next = 0;
            sb_frame_reader_init(&r, 65536);
            bad += feed_all(&r, s, s->bytes, a, &next);
            bad += feed_all(&r, s, s->bytes + a, b - a, &next);
            bad += feed_all(&r, s, s->bytes + b, s->len - b, &next);
            if (next != s->n)
                ++missing;
            sb_frame_reader_dispose(&r);
        }
    }
    is_int(bad, 0, "three-way splits: every frame intact");
    is_int(missing, 0, "three-way splits: no frame lost");
}

static void test_zero_length(void)
{
    sb_frame_reader_t r;
    const uint8_t in[] = {0, 0, 0, 0, 0x80};
    const uint8_t *payload = NULL;
    size_t consumed = 99, plen = 0;

    sb_frame_reader_init(&r, 65536);
    is_int(sb_frame_feed(&r, in, sizeof(in), &consumed, &payload, &plen), SB_E_BAD_ARGS, "zero length -> SB_E_BAD_ARGS");
    is_int(consumed, 4, "zero length: refused right after the header");
    ok(r.payload.base == NULL && r.payload._alloc == 0, "zero length: nothing allocated");
    sb_frame_reader_dispose(&r);

    /* the same, fed one byte at a time */
    sb_frame_reader_init(&r, 65536);
    for (int i = 0; i < 3; ++i) {
        is_int(sb_frame_feed(&r, in + i, 1, &consumed, &payload, &plen), SB_E_AGAIN, "zero length: header byte %d -> AGAIN", i);
        is_int(consumed, 1, "zero length: header byte %d consumed", i);
    }
    is_int(sb_frame_feed(&r, in + 3, 2, &consumed, &payload, &plen), SB_E_BAD_ARGS, "zero length, split header -> SB_E_BAD_ARGS");
    is_int(consumed, 1, "zero length, split header: only the 4th header byte consumed");
    sb_frame_reader_dispose(&r);

    /* a good frame, then a zero-length one */
    sb_frame_reader_init(&r, 65536);
    {
        const uint8_t two[] = {0, 0, 0, 1, 0xc0, 0, 0, 0, 0};
        is_int(sb_frame_feed(&r, two, sizeof(two), &consumed, &payload, &plen), SB_OK, "good frame before a zero-length one");
        is_int(consumed, 5, "good frame: 5 bytes consumed");
        is_int(sb_frame_feed(&r, two + 5, 4, &consumed, &payload, &plen), SB_E_BAD_ARGS, "then zero length -> SB_E_BAD_ARGS");
    }
    sb_frame_reader_dispose(&r);
}

static void test_too_large(void)
{
    sb_frame_reader_t r;
    const uint8_t *payload = NULL;
    size_t consumed = 0, plen = 0;
    uint8_t in[64];

    memset(in, 0xab, sizeof(in));

    /* cap + 1, header split 3 + 1, with payload bytes behind the 4th header byte */
    sb_frame_reader_init(&r, 1000);
    sb_frame_header(1001, in);
    is_int(sb_frame_feed(&r, in, 3, &consumed, &payload, &plen), SB_E_AGAIN, "cap+1: three header bytes -> AGAIN");
    is_int(consumed, 3, "cap+1: three header bytes consumed");
    is_int(sb_frame_feed(&r, in + 3, sizeof(in) - 3, &consumed, &payload, &plen), SB_E_TOO_LARGE,
           "cap+1 -> SB_E_TOO_LARGE on the 4th header byte");
    is_int(consumed, 1, "cap+1: nothing after the header consumed");
    ok(r.payload.base == NULL && r.payload._alloc == 0 && r.payload.len == 0, "cap+1: nothing allocated");
    sb_frame_reader_dispose(&r);

    /* exactly the cap is accepted */
    {
        uint8_t *s = malloc(4 + 1000);
        if (s == NULL)
            abort();
        sb_frame_header(1000, s);
        memset(s + 4, 0x5a, 1000);
        sb_frame_reader_init(&r, 1000);
        is_int(sb_frame_feed(&r, s, 4 + 1000, &consumed, &payload, &plen), SB_OK, "length == cap is accepted");
        is_int(plen, 1000, "length == cap: payload length");
        ok(r.payload._alloc <= 1001, "length == cap: buffer never larger than the cap and its NUL (%zu)", r.payload._alloc);
        sb_frame_reader_dispose(&r);
        free(s);
    }

    /* the production cap, one above it, and a 4 GiB prefix */
    sb_frame_reader_init(&r, SB_MAX_FRAME);
    sb_frame_header(SB_MAX_FRAME + 1, in);
    is_int(sb_frame_feed(&r, in, sizeof(in), &consumed, &payload, &plen), SB_E_TOO_LARGE, "SB_MAX_FRAME + 1 -> SB_E_TOO_LARGE");
    ok(r.payload.base == NULL && r.payload._alloc == 0, "SB_MAX_FRAME + 1: nothing allocated");
    sb_frame_reader_dispose(&r);

    sb_frame_reader_init(&r, SB_MAX_FRAME);
    memset(in, 0xff, 4);
    is_int(sb_frame_feed(&r, in, sizeof(in), &consumed, &payload, &plen), SB_E_TOO_LARGE, "4 GiB prefix ff ff ff ff -> SB_E_TOO_LARGE");
    is_int(consumed, 4, "4 GiB prefix: refused right after the header");
    ok(r.payload.base == NULL && r.payload._alloc == 0, "4 GiB prefix: nothing allocated");
    sb_frame_reader_dispose(&r);

    /* 0x80000000: would be negative as a signed 32-bit length */
    sb_frame_reader_init(&r, SB_MAX_FRAME);
    in[0] = 0x80, in[1] = in[2] = in[3] = 0;
    is_int(sb_frame_feed(&r, in, 4, &consumed, &payload, &plen), SB_E_TOO_LARGE, "2 GiB prefix 80 00 00 00 -> SB_E_TOO_LARGE");
    sb_frame_reader_dispose(&r);
}

/* memory follows the bytes received, not the declared length */
static void test_memory_growth(void)
{
    sb_frame_reader_t r;
    const uint8_t *payload = NULL;
    size_t consumed = 0, plen = 0, total = 0, worst = 0;
    static uint8_t chunk[10000];
    uint8_t hdr[4];
    int bounded = 1;

    memset(chunk, 0x11, sizeof(chunk));

    /* a 4 GiB - 1 frame with no cap at all: the buffer follows the bytes */
    sb_frame_reader_init(&r, SIZE_MAX);
    memset(hdr, 0xff, 4);
    is_int(sb_frame_feed(&r, hdr, 4, &consumed, &payload, &plen), SB_E_AGAIN, "4 GiB prefix without a cap: AGAIN");
    ok(r.payload.base == NULL && r.payload._alloc == 0, "4 GiB prefix without a cap: header alone allocates nothing");
    is_int(sb_frame_feed(&r, chunk, 100, &consumed, &payload, &plen), SB_E_AGAIN, "4 GiB prefix: 100 payload bytes -> AGAIN");
    ok(r.payload._alloc <= 4096, "4 GiB prefix: 100 bytes received, %zu bytes allocated", r.payload._alloc);
    sb_frame_reader_dispose(&r);

    /* a declared 7 MB frame (the production cap), fed in 10000-byte chunks: the buffer stays within 2x what arrived */
    sb_frame_reader_init(&r, SB_MAX_FRAME);
    sb_frame_header(SB_MAX_FRAME, hdr);
    is_int(sb_frame_feed(&r, hdr, 4, &consumed, &payload, &plen), SB_E_AGAIN, "SB_MAX_FRAME header: AGAIN");
    ok(r.payload._alloc == 0, "SB_MAX_FRAME header: nothing allocated yet");
    is_int(sb_frame_feed(&r, chunk, 1, &consumed, &payload, &plen), SB_E_AGAIN, "SB_MAX_FRAME: one byte -> AGAIN");
    ok(r.payload._alloc <= 4096, "SB_MAX_FRAME: one byte received, %zu bytes allocated", r.payload._alloc);
    total = 1;
    while (total < SB_MAX_FRAME) {
        size_t n = SB_MAX_FRAME - total < sizeof(chunk) ? SB_MAX_FRAME - total : sizeof(chunk);
        sb_status_t st = sb_frame_feed(&r, chunk, n, &consumed, &payload, &plen);
        total += consumed;
        if (r.payload._alloc > (total < 2048 ? 4096 : 2 * total) || r.payload._alloc < r.payload.len ||
            r.payload._alloc > SB_MAX_FRAME + 1)
            bounded = 0;
        if (r.payload._alloc > worst)
            worst = r.payload._alloc;
        if (st == SB_OK)
            break;
        if (st != SB_E_AGAIN || consumed != n) {
            bounded = 0;
            break;
        }
    }
    ok(bounded, "memory grows only with the bytes received (allocation <= 2x bytes, <= cap)");
    is_int(total, SB_MAX_FRAME, "the whole SB_MAX_FRAME payload was consumed");
    is_int(plen, SB_MAX_FRAME, "SB_MAX_FRAME payload delivered");
    ok(worst <= SB_MAX_FRAME + 1, "buffer never exceeded the cap and its NUL (%zu)", worst);
    sb_frame_reader_dispose(&r);
    ok(r.payload.base == NULL && r.payload._alloc == 0 && r.payload.len == 0, "dispose releases the buffer");
}

/* a large frame followed by a small one reuses the buffer and delivers the right bytes */
static void test_reuse(void)
{
    stream_t s = {0};
    sb_frame_reader_t r;
    size_t next = 0;

    stream_add(&s, p3, sizeof(p3));
    stream_add(&s, p4, sizeof(p4));
    stream_add(&s, p3, sizeof(p3));
    sb_frame_reader_init(&r, sizeof(p3));
    is_int(feed_all(&r, &s, s.bytes, s.len, &next), 0, "big, small, big frames with cap == big");
    is_int(next, 3, "big, small, big: three frames");
    sb_frame_reader_dispose(&r);
    free(s.bytes);
}

static void test_empty_feed(void)
{
    sb_frame_reader_t r;
    const uint8_t *payload = NULL;
    size_t consumed = 99, plen = 0;
    uint8_t b = 0;

    sb_frame_reader_init(&r, 16);
    is_int(sb_frame_feed(&r, &b, 0, &consumed, &payload, &plen), SB_E_AGAIN, "empty feed -> AGAIN");
    is_int(consumed, 0, "empty feed consumes nothing");
    sb_frame_reader_dispose(&r);
}

/* the payload buffer cannot grow: NOMEM, with the header bytes accounted as consumed */
static void test_nomem(void)
{
    sb_frame_reader_t r;
    const uint8_t *payload = NULL;
    size_t consumed = 0, plen = 0;
    uint8_t in[4 + 3] = {0, 0, 0, 3, 'a', 'b', 'c'};

    sb_frame_reader_init(&r, 16);
    sb_mem_fail_nth(1);
    is_int(sb_frame_feed(&r, in, sizeof(in), &consumed, &payload, &plen), SB_E_NOMEM, "payload allocation fails: NOMEM");
    is_int(consumed, 4, "NOMEM: the header was consumed, the payload was not");
    ok(r.payload.base == NULL && r.payload.len == 0, "NOMEM: nothing buffered");
    sb_frame_reader_dispose(&r);
    sb_frame_reader_init(&r, 16);
    is_int(sb_frame_feed(&r, in, sizeof(in), &consumed, &payload, &plen), SB_OK, "without the failure: the frame");
    ok(plen == 3 && memcmp(payload, "abc", 3) == 0, "without the failure: its payload");
    sb_frame_reader_dispose(&r);
}

int main(void)
{
    stream_t s = {0};

    init_payloads();
    stream_add(&s, p1, sizeof(p1));
    stream_add(&s, p2, sizeof(p2));
    stream_add(&s, p4, sizeof(p4));
    stream_add(&s, p3, sizeof(p3));
    stream_add(&s, p1, sizeof(p1));

    test_header();
    test_one_buffer(&s);
    test_every_split(&s);
    test_byte_at_a_time(&s);
    test_three_way_splits(&s);
    test_zero_length();
    test_too_large();
    test_memory_growth();
    test_reuse();
    test_empty_feed();
    test_nomem();
    free(s.bytes);
    return done_testing();
}
