/*
 * sandbox-broker: the stdio frame (proto/PROTOCOL.md, "Stdio frames").
 *
 * A frame is a 4-byte big-endian payload length followed by that many bytes
 * holding exactly one msgpack map. The decoder is incremental and capped: it
 * never allocates more than the bytes that actually arrived (rounded up), and
 * never more than its cap.
 */
#ifndef SB_FRAME_H
#define SB_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include "sb/buf.h"
#include "sb/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SB_FRAME_HEADER_LEN 4u

typedef struct st_sb_frame_reader_t {
    size_t cap;       /* largest payload accepted */
    uint8_t hdr[4];   /* the length prefix being assembled */
    size_t hdr_have;  /* bytes of hdr received */
    size_t need;      /* payload length of the current frame (valid once hdr_have == 4) */
    sb_buf_t payload; /* payload bytes received so far; its cap is `need` */
    int ready;        /* the previous call returned a whole frame */
} sb_frame_reader_t;

/** initialises a reader that accepts payloads of 1..cap bytes */
void sb_frame_reader_init(sb_frame_reader_t *r, size_t cap);
/** releases the reader's buffer */
void sb_frame_reader_dispose(sb_frame_reader_t *r);

/**
 * Feeds bytes to the reader.
 * @param in bytes read from the stream
 * @param len how many
 * @param consumed receives how many bytes of `in` were used (the rest belongs to later frames)
 * @param payload on SB_OK, the frame's payload; valid until the next call or dispose
 * @param payload_len its length
 * @return SB_OK (a whole frame), SB_E_AGAIN (all input consumed, frame incomplete),
 *         SB_E_TOO_LARGE (declared length above the cap), SB_E_BAD_ARGS (zero length),
 *         SB_E_NOMEM. After an error the reader must not be fed again.
 */
SB_WARN_UNUSED sb_status_t sb_frame_feed(sb_frame_reader_t *r, const uint8_t *in, size_t len, size_t *consumed,
                                         const uint8_t **payload, size_t *payload_len);

/** writes the 4-byte big-endian header for a payload of `len` bytes */
void sb_frame_header(uint32_t len, uint8_t out[SB_FRAME_HEADER_LEN]);

#ifdef __cplusplus
}
#endif
#endif
