/*
 * broker/http: request state that may outlive the request (async.h).
 */
#include <stdlib.h>
#include "http/async.h"
#include "util/util.h"

static void on_guard_dispose(void *p)
{
    sb_async_t *a = *(sb_async_t **)p;
    a->req = NULL;
    --a->worker->inflight;
    sb_async_release(a);
}

void sb_async_attach_to(h2o_req_t *req, sb_async_t *a, void (*dispose)(sb_async_t *), void (*free_fn)(sb_async_t *))
{
    sb_async_t **slot;
    a->_refcnt = 1;
    a->req = req;
    a->worker = sb_current_worker;
    a->_dispose = dispose;
    a->_free = free_fn;
    slot = h2o_mem_alloc_shared(&req->pool, sizeof(*slot), on_guard_dispose);
    *slot = a;
    ++a->worker->inflight;
}

sb_async_t *sb_async_attach(h2o_req_t *req, size_t size, void (*dispose)(sb_async_t *))
{
    sb_async_t *a = sb_mem_calloc(1, size);
    sb_async_attach_to(req, a, dispose, NULL);
    return a;
}

void sb_async_retain(sb_async_t *a)
{
    ++a->_refcnt;
}

void sb_async_release(sb_async_t *a)
{
    if (--a->_refcnt != 0)
        return;
    if (a->_dispose != NULL)
        a->_dispose(a);
    if (a->_free != NULL)
        a->_free(a);
    else
        sb_mem_free(a);
}
