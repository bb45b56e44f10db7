/*
 * broker/http: answering a request (reply.h).
 */
#include <stdatomic.h>
#include <string.h>
#include "http/reply.h"
#include "http/worker.h"

void sb_send_bytes(h2o_req_t *req, int status, const char *reason, const char *ctype, const char *body, size_t len)
{
    static h2o_generator_t generator = {NULL, NULL};
    h2o_iovec_t buf = h2o_strdup(&req->pool, body, len);

    req->res.status = status;
    req->res.reason = reason;
    req->res.content_length = len;
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, ctype, strlen(ctype));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL, H2O_STRLIT("no-store"));
    if (atomic_load_explicit(&sb_current_worker->server->stopping, memory_order_relaxed))
        req->http1_is_persistent = 0;
    h2o_start_response(req, &generator);
    h2o_send(req, &buf, 1, H2O_SEND_STATE_FINAL);
}
