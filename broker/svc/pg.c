/* placeholder until the PostgreSQL module lands */
#include <stdlib.h>
#include <string.h>
#include "svc/handlers.h"

sb_pg_pool_t *sb_pg_pool_create(h2o_loop_t *loop, const char *database_url, const sb_targets_t *targets)
{
    return NULL;
}

void sb_pg_pool_destroy(sb_pg_pool_t *pool)
{
}

int sb_pg_pool_healthy(sb_pg_pool_t *pool)
{
    return pool != NULL;
}

void sb_pg_handle(const sb_svc_env_t *env, const sb_target_t *t, sb_token_t *tok, const sb_method_t *m,
                  const msgpack_object *args, int binary, sb_dispatch_cb cb, void *arg)
{
    sb_result_t res;
    memset(&res, 0, sizeof(res));
    res.status = SB_E_NOT_IMPLEMENTED;
    memcpy(res.message, "collections has no host handler", sizeof("collections has no host handler"));
    msgpack_sbuffer_init(&res.value);
    cb(arg, &res);
    msgpack_sbuffer_destroy(&res.value);
}
