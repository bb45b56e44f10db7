/*
 * sandbox-shim: guest frames, from stdout bytes to validated messages.
 *
 * The pure half of the relay's guest side (proto/PROTOCOL.md section 2): the
 * length-prefixed frame stream is cut into payloads by proto's capped frame
 * reader, each payload is pre-checked and decoded, and `call` and `result`
 * maps are validated against the frame contract. No I/O and no run state:
 * what depends on the run (call after result, duplicate in-flight ids,
 * --max-calls, a result racing calls) stays in relay.c. Shared by relay.c and
 * fuzz/fuzz_shim_frames.c, so the fuzzer exercises exactly what the relay runs.
 */
#ifndef SB_SHIM_FRAMES_H
#define SB_SHIM_FRAMES_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <msgpack.h>
#include "sb/frame.h"
#include "sb/status.h"

/* result frame budgets (PROTOCOL.md section 2, rule 6) */
#define SB_SHIM_MAX_LOGS 1000u
#define SB_SHIM_MAX_LOG_BYTES 4000u
#define SB_SHIM_MAX_LOG_TOTAL (1024u * 1024u)
#define SB_SHIM_MAX_OUTPUT (1024u * 1024u)
#define SB_SHIM_MAX_ERROR_BYTES 65536u
/* a call frame may exceed its method's request cap by this much (the frame's own keys) */
#define SB_SHIM_CALL_FRAME_SLACK 1024u

typedef enum en_sb_shim_msg_kind_t {
    SB_SHIM_MSG_NONE = 0, /* not a map with a known string "t" */
    SB_SHIM_MSG_CALL,
    SB_SHIM_MSG_RESULT
} sb_shim_msg_kind_t;

typedef struct st_sb_shim_msg_t {
    /**
     * The frame's kind. Set as soon as the payload is a map whose "t" is "call" or
     * "result", even when the rest of the frame is invalid, so the caller can apply
     * its state rules (call after result, second result) before the frame's own.
     */
    sb_shim_msg_kind_t kind;
    /* call (valid on SB_OK): method points into the payload and is not NUL-terminated */
    uint64_t id;
    const char *method;
    size_t method_len;
    const msgpack_object *args; /* NULL when absent; lives in `zone` */
    /* result (valid on SB_OK): new references owned by the message */
    int ok;
    json_t *output; /* NULL when absent (the guest returned undefined) or when !ok */
    json_t *error;  /* the guest's error string; NULL when ok */
    json_t *logs;   /* array of strings */
    /* private: the decoded tree */
    msgpack_zone _zone;
    int _zone_live;
} sb_shim_msg_t;

/**
 * Takes the next message from guest stdout bytes.
 *
 * Feeds `in` to the frame reader; once a whole frame is there, decodes and
 * validates it into `msg`. The caller calls this again with the unused rest
 * of its input (`len - *used`) after handling the message, and must dispose
 * of `msg` (sb_shim_msg_dispose) before the next call: the message's objects
 * point into the reader's payload buffer and into the message's zone.
 *
 * @param rd a reader initialised with the frame cap (SB_MAX_FRAME); after an error
 *        other than SB_E_AGAIN it must not be fed again
 * @param used receives how many bytes of `in` were used
 * @param msg receives the message (always initialised; dispose it on every return)
 * @param why on error, a static description of the violation
 * @param detail on error, an extra static detail or NULL (the msgpack problem for bad msgpack)
 * @return SB_E_AGAIN (all of `in` used, no whole frame yet);
 *         SB_OK (msg->kind is CALL or RESULT, validated);
 *         SB_E_BAD_ARGS: a guest protocol violation (bad length, bad msgpack, not a map,
 *         unknown kind, malformed call) with msg->kind NONE or CALL, or an invalid result
 *         with msg->kind RESULT (PROTOCOL.md section 2, rules 6 and 7);
 *         SB_E_NOMEM (the reader could not grow)
 */
SB_WARN_UNUSED sb_status_t sb_shim_frames_next(sb_frame_reader_t *rd, const uint8_t *in, size_t len, size_t *used,
                                               sb_shim_msg_t *msg, const char **why, const char **detail);

/**
 * Decodes and validates one frame payload (the bytes after the length prefix).
 * Same contract as sb_shim_frames_next for `msg`, `why` and `detail`; the
 * message references `p`, which must outlive it.
 * @return SB_OK or SB_E_BAD_ARGS
 */
SB_WARN_UNUSED sb_status_t sb_shim_msg_decode(const uint8_t *p, size_t len, sb_shim_msg_t *msg, const char **why,
                                              const char **detail);

/** releases what a message holds; it is empty (kind NONE) afterwards */
void sb_shim_msg_dispose(sb_shim_msg_t *msg);

/**
 * Packs the broker request body of a validated call: {method, args?} (PROTOCOL.md section 3).
 * @param body an initialised sbuffer the body is appended to
 * @return SB_OK, SB_E_BAD_ARGS (msg is not a validated call) or SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_shim_call_body(const sb_shim_msg_t *msg, msgpack_sbuffer *body);

#endif
