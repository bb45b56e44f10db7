/*
 * Capped growable buffer (see buf.h).
 */
#include <stdlib.h>
#include <string.h>
#include "buf.h"

void sb_shim_buf_init(sb_shim_buf_t *b, size_t cap)
{
    memset(b, 0, sizeof(*b));
    b->cap = cap;
}

void sb_shim_buf_dispose(sb_shim_buf_t *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->alloc = 0;
}

sb_status_t sb_shim_buf_append(sb_shim_buf_t *b, const void *p, size_t n)
{
    size_t want, na;
    uint8_t *np;

    if (n > b->cap || b->len > b->cap - n)
        return SB_E_TOO_LARGE;
    want = b->len + n;
    if (want > b->alloc) {
        na = b->alloc != 0 ? b->alloc : 256;
        while (na < want)
            na = na > SIZE_MAX / 2 ? want : na * 2;
        if (na > b->cap)
            na = b->cap;
        if ((np = realloc(b->p, na)) == NULL)
            return SB_E_NOMEM;
        b->p = np;
        b->alloc = na;
    }
    if (n != 0)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    return SB_OK;
}

sb_status_t sb_shim_buf_appends(sb_shim_buf_t *b, const char *s)
{
    return sb_shim_buf_append(b, s, strlen(s));
}

void sb_shim_buf_consume(sb_shim_buf_t *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}
