/*
 * libFuzzer driver for broker/svc/tools/mcp_wire.c: the event-stream parser and the
 * JSON-RPC response picker that read what an MCP upstream answers.
 *
 * Input: byte 0 picks the mode and the caps, bytes 1-2 seed the chunking,
 * the rest is the response body.
 *   byte0 & 1    0: the body is an SSE stream, 1: a JSON body
 *   byte0 >> 1   the message cap: 16 + 64 * (byte0 >> 1) bytes
 *   byte1        the request id looked for (signed: -128..127)
 *
 * Properties:
 *  - chunking never matters: feeding the stream whole and in pieces of
 *    pseudo-random sizes (1 byte to all) yields the same events, in order,
 *    and the same status;
 *  - every event's data is at most the cap, contains no CR, and its type
 *    contains neither CR nor LF and is at most SB_SSE_MAX_EVENT_TYPE bytes;
 *  - a stream that contains no LF and no CR dispatches nothing;
 *  - the picker returns only documented statuses; its message is a
 *    NUL-terminated string; on SB_OK the output is exactly one msgpack map
 *    that the pre-check accepts, and on any failure nothing was appended;
 *  - the picker is deterministic.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sb/value.h"
#include "svc/tools/mcp_wire.h"
#include "fuzz.h"

typedef struct st_trace_t {
    uint8_t *buf; /* type NUL data NUL, per event */
    size_t len, cap;
    size_t n;
    size_t max_data;
} trace_t;

static void trace_put(trace_t *t, const char *p, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap != 0 ? t->cap : 1024;
        while (cap < t->len + n + 1)
            cap *= 2;
        if ((t->buf = realloc(t->buf, cap)) == NULL)
            abort();
        t->cap = cap;
    }
    memcpy(t->buf + t->len, p, n);
    t->buf[t->len + n] = 0;
    t->len += n + 1;
}

static int on_event(void *arg, const char *type, size_t type_len, const char *data, size_t data_len)
{
    trace_t *t = arg;

    SB_FUZZ_ASSERT(data_len <= t->max_data, "event data of %zu bytes over the %zu cap", data_len, t->max_data);
    SB_FUZZ_ASSERT(type_len <= SB_SSE_MAX_EVENT_TYPE, "event type of %zu bytes", type_len);
    SB_FUZZ_ASSERT(memchr(data, '\r', data_len) == NULL, "CR in event data");
    SB_FUZZ_ASSERT(memchr(type, '\r', type_len) == NULL && memchr(type, '\n', type_len) == NULL, "line end in event type");
    trace_put(t, type, type_len);
    trace_put(t, data, data_len);
    ++t->n;
    return 0;
}

static sb_status_t run_stream(const uint8_t *p, size_t len, size_t max, sb_fuzz_rng_t *rng, trace_t *t)
{
    sb_sse_t s;
    sb_status_t st = SB_OK;
    size_t off = 0;

    memset(t, 0, sizeof(*t));
    t->max_data = max;
    sb_sse_init(&s, max);
    while (off < len) {
        size_t n = rng != NULL ? sb_fuzz_rng_chunk(rng, len - off) : len - off;
        if ((st = sb_sse_feed(&s, (const char *)p + off, n, on_event, t, NULL)) != SB_OK)
            break;
        off += n;
    }
    sb_sse_dispose(&s);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sb_fuzz_rng_t rng;
    trace_t whole, pieces;
    sb_status_t st1, st2;
    size_t max;
    int64_t id;
    int json;
    const uint8_t *body;
    size_t len;

    if (size < 3)
        return 0;
    json = data[0] & 1;
    max = 16 + 64 * (size_t)(data[0] >> 1);
    id = (int8_t)data[1];
    body = data + 3;
    len = size - 3;

    /* the parser: chunking-invariant, bounded events */
    sb_fuzz_rng_seed(&rng, data, 3);
    st1 = run_stream(body, len, max, NULL, &whole);
    st2 = run_stream(body, len, max, &rng, &pieces);
    SB_FUZZ_ASSERT(st1 == st2, "status %d whole, %d in pieces", (int)st1, (int)st2);
    SB_FUZZ_ASSERT(st1 == SB_OK || st1 == SB_E_TOO_LARGE, "unexpected parser status %d", (int)st1);
    if (st1 == SB_OK) {
        SB_FUZZ_ASSERT(whole.n == pieces.n && whole.len == pieces.len &&
                           (whole.len == 0 || memcmp(whole.buf, pieces.buf, whole.len) == 0),
                       "events differ between whole (%zu) and chunked (%zu) feeding", whole.n, pieces.n);
        if (memchr(body, '\n', len) == NULL && memchr(body, '\r', len) == NULL)
            SB_FUZZ_ASSERT(whole.n == 0, "an event without any line end");
    }
    free(whole.buf);
    free(pieces.buf);

    /* the picker */
    {
        sb_mcp_body_t kind = json ? SB_MCP_BODY_JSON : SB_MCP_BODY_SSE;
        msgpack_sbuffer out, out2;
        char err[512], err2[512];
        sb_status_t st, again;

        msgpack_sbuffer_init(&out);
        msgpack_sbuffer_init(&out2);
        memset(err, 'x', sizeof(err));
        st = sb_mcp_pick_response(kind, (const char *)body, len, id, max, &out, err, sizeof(err));
        SB_FUZZ_ASSERT(st == SB_OK || st == SB_E_EXECUTION || st == SB_E_TOO_LARGE || st == SB_E_BAD_ARGS || st == SB_E_NOMEM,
                       "undocumented picker status %d", (int)st);
        SB_FUZZ_ASSERT(memchr(err, '\0', sizeof(err)) != NULL, "unterminated message");
        if (st == SB_OK) {
            size_t obj_len = 0;
            const char *why = NULL;
            SB_FUZZ_ASSERT(out.size != 0, "success without a result");
            SB_FUZZ_ASSERT(sb_mp_check((const uint8_t *)out.data, out.size, &obj_len, &why) == SB_OK && obj_len == out.size,
                           "the result is not one valid msgpack object (%s)", why != NULL ? why : "trailing bytes");
            SB_FUZZ_ASSERT(((uint8_t)out.data[0] & 0xf0) == 0x80 || (uint8_t)out.data[0] == 0xde || (uint8_t)out.data[0] == 0xdf,
                           "the result is not a map");
        } else {
            SB_FUZZ_ASSERT(out.size == 0, "a failure appended %zu bytes", out.size);
            SB_FUZZ_ASSERT(err[0] != '\0', "a failure without a message");
        }
        again = sb_mcp_pick_response(kind, (const char *)body, len, id, max, &out2, err2, sizeof(err2));
        SB_FUZZ_ASSERT(again == st && out2.size == out.size && (out.size == 0 || memcmp(out.data, out2.data, out.size) == 0) &&
                           strcmp(err, err2) == 0,
                       "the picker is not deterministic");
        msgpack_sbuffer_destroy(&out);
        msgpack_sbuffer_destroy(&out2);
    }
    return 0;
}
