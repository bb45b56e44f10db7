/* placeholder until the files handler lands: the target's files root is not served yet */
#include <string.h>
#include "svc/handlers.h"

void sb_files_handle(const sb_svc_env_t *env, const sb_files_conf_t *fc, sb_token_t *tok, const sb_method_t *m,
                     const msgpack_object *args, int binary, sb_dispatch_cb cb, void *arg)
{
    sb_result_t res;
    memset(&res, 0, sizeof(res));
    res.status = SB_E_NOT_IMPLEMENTED;
    memcpy(res.message, "files has no host handler", sizeof("files has no host handler"));
    msgpack_sbuffer_init(&res.value);
    cb(arg, &res);
    msgpack_sbuffer_destroy(&res.value);
}
