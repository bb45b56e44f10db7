/*
 * broker/http: GET /healthz (liveness) and /readyz (the token store answers,
 * the database too when a target uses one, and the worker is not draining),
 * on both listeners.
 */
#include <stdio.h>
#include "http/reply.h"
#include "http/routes.h"
#include "http/worker.h"
#include "svc/handlers.h"

int sb_health_on_req(h2o_handler_t *self, h2o_req_t *req)
{
    sb_worker_t *w = sb_current_worker;

    if (!h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET")) &&
        !h2o_memis(req->method.base, req->method.len, H2O_STRLIT("HEAD")))
        return -1;
    if (h2o_memis(req->path_normalized.base, req->path_normalized.len, H2O_STRLIT("/healthz"))) {
        sb_reply_send(req, SB_OK, "application/json", H2O_STRLIT("{\"ok\":true}"));
        return 0;
    }
    if (h2o_memis(req->path_normalized.base, req->path_normalized.len, H2O_STRLIT("/readyz"))) {
        if (w->stopping)
            sb_reply_send(req, SB_E_UNAVAILABLE, "application/json",
                          H2O_STRLIT("{\"ok\":false,\"tokenStore\":\"up\",\"draining\":true}"));
        else {
            /* the database counts only when a target uses one */
            int store_up = sb_store_conn_healthy(w->store), db_up = w->svc.pg == NULL || sb_pg_pool_healthy(w->svc.pg);
            char body[128];
            int n = snprintf(body, sizeof(body), "{\"ok\":%s,\"tokenStore\":\"%s\"%s}", store_up && db_up ? "true" : "false",
                             store_up ? "up" : "down",
                             w->svc.pg == NULL ? ""
                             : db_up           ? ",\"database\":\"up\""
                                               : ",\"database\":\"down\"");
            sb_reply_send(req, store_up && db_up ? SB_OK : SB_E_UNAVAILABLE, "application/json", body, (size_t)n);
        }
        return 0;
    }
    return -1;
}
