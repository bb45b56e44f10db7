/*
 * broker/http: the routes the listeners serve (server.c registers them).
 *
 *   public  POST <rpc_path>       sb_rpc_on_req    (rpc.c)
 *           GET /healthz, /readyz sb_health_on_req (health.c)
 *   admin   /admin/v1/..., /metrics, health        sb_admin_on_req (admin.c)
 *
 * Each returns 0 when it answered (or will answer) the request, -1 to let h2o
 * answer 404.
 */
#ifndef SB_ROUTES_H
#define SB_ROUTES_H

#include <h2o.h>

int sb_rpc_on_req(h2o_handler_t *self, h2o_req_t *req);
/** frees what the worker thread kept for its next calls (rpc.c); at the worker's end, on its thread */
void sb_rpc_worker_done(void);
int sb_admin_on_req(h2o_handler_t *self, h2o_req_t *req);
int sb_health_on_req(h2o_handler_t *self, h2o_req_t *req);

#endif
