/* placeholder until the MCP client lands: tools are not served yet */
#include <stdlib.h>
#include <string.h>
#include "svc/handlers.h"

struct st_sb_tools_ctx_t {
    int unused;
};

sb_tools_ctx_t *sb_tools_ctx_create(h2o_loop_t *loop)
{
    return NULL;
}

void sb_tools_ctx_destroy(sb_tools_ctx_t *ctx)
{
    free(ctx);
}

void sb_tools_handle(const sb_svc_env_t *env, const sb_target_t *t, sb_token_t *tok, const sb_method_t *m,
                     const msgpack_object *args, int binary, sb_dispatch_cb cb, void *arg)
{
    sb_result_t res;
    memset(&res, 0, sizeof(res));
    res.status = SB_E_NOT_IMPLEMENTED;
    memcpy(res.message, "tools has no host handler", sizeof("tools has no host handler"));
    msgpack_sbuffer_init(&res.value);
    cb(arg, &res);
    msgpack_sbuffer_destroy(&res.value);
}
