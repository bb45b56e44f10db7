/*
 * The dispatch table. http.fetch is the broker's own handler (egress).
 * Targets wire handlers for files, collections, store, globals.get and tools;
 * until a target does, those answer not_implemented. services, jobs and workflows are never dispatched, and
 * globals.<n>.set is refused: a global is a singleton the host owns.
 */
#include <stdio.h>
#include <string.h>
#include "svc/dispatch.h"
#include "fetch/fetch.h"

static void reply(sb_dispatch_cb cb, void *arg, sb_status_t st, const char *fmt, const char *a, size_t alen)
{
    sb_result_t res;
    memset(&res, 0, sizeof(res));
    res.status = st;
    snprintf(res.message, sizeof(res.message), fmt, (int)alen, a);
    msgpack_sbuffer_init(&res.value);
    cb(arg, &res);
    msgpack_sbuffer_destroy(&res.value);
}

void sb_dispatch(const sb_svc_env_t *env, sb_token_t *tok, const sb_method_t *m, const char *raw_method, size_t raw_len,
                 const msgpack_object *args, int binary, sb_dispatch_cb cb, void *arg)
{
    const char *kind = sb_method_kind_name(m->kind);

    switch (m->kind) {
    case SB_MK_SERVICES:
    case SB_MK_JOBS:
    case SB_MK_WORKFLOWS:
        reply(cb, arg, SB_E_NOT_IMPLEMENTED, "%.*s dispatch is not implemented", kind, strlen(kind));
        return;
    case SB_MK_GLOBALS:
        if (m->op == SB_OP_SET) {
            reply(cb, arg, SB_E_NOT_IMPLEMENTED, "%.*s guest write is denied: a global is a singleton owned by the host",
                  raw_method, raw_len);
            return;
        }
        break;
    case SB_MK_HTTP:
        /* egress is the broker's own handler, for every run whose manifest grants net */
        if (env->fetch != NULL) {
            sb_fetch_start(env->fetch, tok, args, binary, cb, arg);
            return;
        }
        break;
    default:
        break;
    }
    reply(cb, arg, SB_E_NOT_IMPLEMENTED, "%.*s has no host handler", raw_method, raw_len);
}
