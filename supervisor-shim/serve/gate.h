/*
 * serve/gate: what serve decides on a connection's first request head, before h2o reads a body.
 *
 * h2o 2.2.5 buffers a whole request body before the handler runs, and has no hook between the head
 * and the body. So serve reads a new connection's head itself, decides here, and hands the
 * connection to h2o only when the head is acceptable: a stranger's body is never read, and no
 * JSON of a stranger's is parsed. README.md, "serve as an HTTP service", says what is decided where.
 */
#ifndef SB_SERVE_GATE_H
#define SB_SERVE_GATE_H

#include <stddef.h>
#include <stdint.h>

typedef enum en_sb_serve_gate_t {
    SB_GATE_MORE = 0,  /* the head is not complete yet */
    SB_GATE_PASS,      /* hand the connection to h2o */
    SB_GATE_BAD_HEAD,  /* 400: the head does not parse, or is longer than h2o reads */
    SB_GATE_FRAMING,   /* 400: ambiguous body framing (RFC 9112 section 6.3) */
    SB_GATE_DENIED,    /* 403: a body without the admission header */
    SB_GATE_TOO_LARGE, /* 413: a Content-Length above the body cap */
} sb_serve_gate_t;

typedef struct st_sb_serve_gate_head_t {
    int admitted; /* exactly one admission header, equal to the secret */
    int is_run;   /* POST /run (the target's path, before any query) */
    int has_body; /* a Content-Length above 0, or chunked */
    /* the request line's method and target, pointing into the bytes decided (set once the head parses) */
    const char *method, *target;
    size_t method_len, target_len;
} sb_serve_gate_head_t;

/** The longest head looked at: h2o's own limit (H2O_MAX_REQLEN); longer is SB_GATE_BAD_HEAD. */
#define SB_SERVE_GATE_MAX_HEAD 8192u

/**
 * Decides a request head at the start of `buf` (what follows it is not looked at).
 * Refused, in this order: a head that does not parse or passes SB_SERVE_GATE_MAX_HEAD; ambiguous
 * framing (an obs-fold line; Transfer-Encoding on HTTP/1.0, with Content-Length, more than once or
 * other than "chunked"; more than one Content-Length, or one that is not 1*DIGIT); a Content-Length
 * above `max_body` (413, upstream's first check); a body (Content-Length above 0, or chunked)
 * without the admission header. A request without a body passes whatever its admission: the
 * handler answers it as before (400 for an empty POST /run, 404, /health, /metrics).
 * @param admission_hash SHA-256 of the admission secret; the header's value is hashed and compared
 *        in constant time
 * @param out filled when the answer is not SB_GATE_MORE or SB_GATE_BAD_HEAD
 * @param why set to a static reason for every refusal
 */
sb_serve_gate_t sb_serve_gate_head(const char *buf, size_t len, const uint8_t admission_hash[32], size_t max_body,
                                   sb_serve_gate_head_t *out, const char **why);

#endif
