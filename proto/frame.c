/*
 * Incremental, capped decoder for length-prefixed frames (PROTOCOL.md,
 * "Stdio frames"). The payload buffer grows with the bytes that arrive, so a
 * peer that announces a large frame and then stalls holds only what it sent.
 */
#include <stdlib.h>
#include <string.h>
#include "sb/frame.h"

void sb_frame_reader_init(sb_frame_reader_t *r, size_t cap)
{
    memset(r, 0, sizeof(*r));
    r->cap = cap;
}

void sb_frame_reader_dispose(sb_frame_reader_t *r)
{
    free(r->buf);
    r->buf = NULL;
    r->have = r->alloc = 0;
}

void sb_frame_header(uint32_t len, uint8_t out[SB_FRAME_HEADER_LEN])
{
    out[0] = (uint8_t)(len >> 24);
    out[1] = (uint8_t)(len >> 16);
    out[2] = (uint8_t)(len >> 8);
    out[3] = (uint8_t)len;
}

static sb_status_t reserve(sb_frame_reader_t *r, size_t want)
{
    size_t n;
    uint8_t *p;

    if (want <= r->alloc)
        return SB_OK;
    n = r->alloc != 0 ? r->alloc : 4096;
    while (n < want)
        n *= 2;
    if (n > r->need)
        n = r->need;
    if ((p = realloc(r->buf, n)) == NULL)
        return SB_E_NOMEM;
    r->buf = p;
    r->alloc = n;
    return SB_OK;
}

sb_status_t sb_frame_feed(sb_frame_reader_t *r, const uint8_t *in, size_t len, size_t *consumed, const uint8_t **payload,
                          size_t *payload_len)
{
    size_t used = 0, take;
    sb_status_t st;

    if (r->ready) {
        /* the caller has processed the previous frame; start the next one */
        r->ready = 0;
        r->hdr_have = 0;
        r->have = 0;
        r->need = 0;
    }
    while (r->hdr_have < SB_FRAME_HEADER_LEN) {
        if (used == len) {
            *consumed = used;
            return SB_E_AGAIN;
        }
        r->hdr[r->hdr_have++] = in[used++];
        if (r->hdr_have == SB_FRAME_HEADER_LEN) {
            r->need = (size_t)r->hdr[0] << 24 | (size_t)r->hdr[1] << 16 | (size_t)r->hdr[2] << 8 | (size_t)r->hdr[3];
            *consumed = used;
            if (r->need == 0)
                return SB_E_BAD_ARGS;
            if (r->need > r->cap)
                return SB_E_TOO_LARGE;
        }
    }
    take = r->need - r->have;
    if (take > len - used)
        take = len - used;
    if ((st = reserve(r, r->have + take)) != SB_OK) {
        *consumed = used;
        return st;
    }
    if (take != 0)
        memcpy(r->buf + r->have, in + used, take);
    r->have += take;
    used += take;
    *consumed = used;
    if (r->have < r->need)
        return SB_E_AGAIN;
    r->ready = 1;
    *payload = r->buf;
    *payload_len = r->need;
    return SB_OK;
}
