/*
 * broker/http: the state of a request that may outlive it (a pending
 * token-store call, a handler in flight).
 *
 * Allocated with sb_async_attach; one reference belongs to the request and is
 * dropped when h2o disposes of the request, at which point `req` turns NULL.
 * Asynchronous operations take a reference of their own and must check `req`
 * before answering. Loop-local: attach, retain and release on the worker that
 * owns the request.
 */
#ifndef SB_ASYNC_H
#define SB_ASYNC_H

#include <stddef.h>
#include <h2o.h>
#include "http/worker.h"

typedef struct st_sb_async_t {
    int _refcnt;
    h2o_req_t *req;
    sb_worker_t *worker;
    void (*_dispose)(struct st_sb_async_t *);
    void (*_free)(struct st_sb_async_t *); /* NULL: sb_mem_free */
} sb_async_t;

/**
 * Allocates `size` zeroed bytes (a struct that starts with sb_async_t) tied to
 * the request; counts as one of the worker's requests in flight until released.
 * @param dispose runs before the memory is freed, when the last reference goes
 */
sb_async_t *sb_async_attach(h2o_req_t *req, size_t size, void (*dispose)(sb_async_t *));
/**
 * sb_async_attach for memory the caller provides (zeroed where sb_async_t
 * lies); `free_fn` takes it back after the dispose, instead of sb_mem_free
 */
void sb_async_attach_to(h2o_req_t *req, sb_async_t *a, void (*dispose)(sb_async_t *), void (*free_fn)(sb_async_t *));
void sb_async_retain(sb_async_t *a);
void sb_async_release(sb_async_t *a);

#endif
