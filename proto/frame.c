/*
 * Incremental, capped decoder for length-prefixed frames (PROTOCOL.md,
 * "Stdio frames"). The payload buffer grows with the bytes that arrive (the
 * sb_buf_t growth rule, capped at the declared length), so a peer that
 * announces a large frame and then stalls holds only what it sent.
 */
#include <string.h>
#include "sb/frame.h"

void sb_frame_reader_init(sb_frame_reader_t *r, size_t cap)
{
    memset(r, 0, sizeof(*r));
    r->cap = cap;
    sb_buf_init(&r->payload, 0);
}

void sb_frame_reader_dispose(sb_frame_reader_t *r)
{
    sb_buf_free(&r->payload);
}

void sb_frame_header(uint32_t len, uint8_t out[SB_FRAME_HEADER_LEN])
{
    out[0] = (uint8_t)(len >> 24);
    out[1] = (uint8_t)(len >> 16);
    out[2] = (uint8_t)(len >> 8);
    out[3] = (uint8_t)len;
}

sb_status_t sb_frame_feed(sb_frame_reader_t *r, const uint8_t *in, size_t len, size_t *consumed, const uint8_t **payload,
                          size_t *payload_len)
{
    sb_reader_t rd;
    sb_view_t chunk;
    size_t take;
    sb_status_t st;

    sb_reader_init(&rd, in, len);
    if (r->ready) {
        /* the caller has processed the previous frame; start the next one (keeping the storage) */
        r->ready = 0;
        r->hdr_have = 0;
        r->need = 0;
        sb_buf_reset(&r->payload);
        sb_buf_set_cap(&r->payload, 0);
    }
    while (r->hdr_have < SB_FRAME_HEADER_LEN) {
        if (sb_reader_u8(&rd, &r->hdr[r->hdr_have]) != SB_OK) {
            *consumed = sb_reader_offset(&rd);
            return SB_E_AGAIN;
        }
        if (++r->hdr_have == SB_FRAME_HEADER_LEN) {
            r->need = sb_load_be32(r->hdr);
            *consumed = sb_reader_offset(&rd);
            if (r->need == 0)
                return SB_E_BAD_ARGS;
            if (r->need > r->cap)
                return SB_E_TOO_LARGE;
            sb_buf_set_cap(&r->payload, r->need);
        }
    }
    take = r->need - r->payload.len;
    if (take > sb_reader_remaining(&rd))
        take = sb_reader_remaining(&rd);
    *consumed = sb_reader_offset(&rd);
    if (take != 0) {
        /* neither can fail but for memory: take fits both the bytes left and the frame's cap */
        if ((st = sb_reader_bytes(&rd, take, &chunk)) != SB_OK || (st = sb_buf_append(&r->payload, chunk.base, chunk.len)) != SB_OK)
            return st;
        *consumed = sb_reader_offset(&rd);
    }
    if (r->payload.len < r->need)
        return SB_E_AGAIN;
    r->ready = 1;
    *payload = (const uint8_t *)r->payload.base;
    *payload_len = r->need;
    return SB_OK;
}
