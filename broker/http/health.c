/*
 * broker/http: GET /healthz (liveness) and /readyz (the token store answers,
 * the database too when a target uses one, and the worker is not draining),
 * on both listeners.
 */
#include <stdio.h>
#include <string.h>
#include "sb/buf.h"
#include "sb/limits.h"
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
            /* the database counts only when a target uses one; a role lacking privileges the targets need is not ready */
            int store_up = sb_store_conn_healthy(w->store), db_up = w->svc.pg == NULL || sb_pg_pool_healthy(w->svc.pg);
            const char *missing = db_up ? sb_pg_pool_problem(w->svc.pg) : NULL;
            int ok = store_up && db_up && missing == NULL;
            sb_buf_t body;
            sb_buf_init(&body, SB_MAX_NATIVE_RESULT);
            if (sb_buf_printf(&body, "{\"ok\":%s,\"tokenStore\":\"%s\"%s", ok ? "true" : "false", store_up ? "up" : "down",
                              w->svc.pg == NULL ? ""
                              : !db_up          ? ",\"database\":\"down\""
                              : missing != NULL ? ",\"database\":\"missing_privileges\",\"missingPrivileges\":"
                                                : ",\"database\":\"up\"") != SB_OK ||
                (missing != NULL && sb_buf_append_json_str_lossy(&body, missing, strlen(missing)) != SB_OK) ||
                sb_buf_append_char(&body, '}') != SB_OK) {
                sb_buf_free(&body);
                sb_reply_send(req, SB_E_UNAVAILABLE, "application/json", H2O_STRLIT("{\"ok\":false}"));
                return 0;
            }
            sb_reply_send_buf(req, ok ? SB_OK : SB_E_UNAVAILABLE, "application/json", &body);
        }
        return 0;
    }
    return -1;
}
