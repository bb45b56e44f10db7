/*
 * sandbox-shim: a growable byte buffer with a hard cap (curl's dynbuf idea).
 *
 * Every append is checked against the cap before anything is allocated, so a
 * peer that announces or sends too much costs at most `cap` bytes.
 */
#ifndef SB_SHIM_BUF_H
#define SB_SHIM_BUF_H

#include <stddef.h>
#include <stdint.h>
#include "sb/status.h"

typedef struct st_sb_shim_buf_t {
    uint8_t *p;   /* owned; NULL until the first append */
    size_t len;   /* bytes in use */
    size_t alloc; /* bytes allocated */
    size_t cap;   /* len never exceeds this */
} sb_shim_buf_t;

/** initialises an empty buffer that will hold at most `cap` bytes */
void sb_shim_buf_init(sb_shim_buf_t *b, size_t cap);
/** frees the storage; the buffer is empty (and reusable) afterwards */
void sb_shim_buf_dispose(sb_shim_buf_t *b);
/**
 * Appends bytes.
 * @return SB_OK, SB_E_TOO_LARGE (len + n above the cap; nothing appended) or SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_shim_buf_append(sb_shim_buf_t *b, const void *p, size_t n);
/** appends a NUL-terminated string (same statuses as sb_shim_buf_append) */
SB_WARN_UNUSED sb_status_t sb_shim_buf_appends(sb_shim_buf_t *b, const char *s);
/** drops the first `n` bytes (n <= len) */
void sb_shim_buf_consume(sb_shim_buf_t *b, size_t n);

#endif
