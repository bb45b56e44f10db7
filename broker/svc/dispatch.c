/*
 * The dispatch table. http.fetch is the broker's own handler (egress); the
 * rest is wired per target: files (a root), collections and store
 * (PostgreSQL), tools (an MCP upstream), globals (static values, or table
 * rows read through PostgreSQL). What the target does not wire answers
 * not_implemented. services, jobs and workflows are never dispatched, and
 * globals.<n>.set is refused: a global is a singleton the host owns.
 */
#include <stdio.h>
#include <string.h>
#include "svc/dispatch.h"
#include "svc/handlers.h"

static int name_is(const sb_method_t *m, const char *s)
{
    return m->name_len == strlen(s) && memcmp(m->name, s, m->name_len) == 0;
}

/* a static value is answered here; a table global reads its row through the PostgreSQL pool */
static void get_global(const sb_svc_env_t *env, const sb_target_t *t, sb_token_t *tok, const sb_method_t *m, const char *raw,
                       size_t raw_len, sb_dispatch_cb cb, void *arg)
{
    for (size_t i = 0; i < t->nglobals; ++i) {
        const sb_global_conf_t *g = &t->globals[i];
        if (!name_is(m, g->name))
            continue;
        if (g->table != NULL) {
            sb_pg_global(env, t, g, tok, cb, arg);
        } else {
            sb_result_t res;
            sb_result_init(&res);
            msgpack_sbuffer_write(&res.value, g->value.data, g->value.size);
            cb(arg, &res);
            sb_result_dispose(&res);
        }
        return;
    }
    sb_answer_error(cb, arg, SB_E_NOT_IMPLEMENTED, "%.*s has no host handler", (int)raw_len, raw);
}

void sb_dispatch(const sb_svc_env_t *env, sb_token_t *tok, const sb_method_t *m, const char *raw_method, size_t raw_len,
                 const msgpack_object *args, int binary, sb_dispatch_cb cb, void *arg)
{
    const char *kind = sb_method_kind_name(m->kind);
    const sb_target_t *t = sb_targets_find(env->targets, tok->target);

    switch (m->kind) {
    case SB_MK_SERVICES:
    case SB_MK_JOBS:
    case SB_MK_WORKFLOWS:
        sb_answer_error(cb, arg, SB_E_NOT_IMPLEMENTED, "%.*s dispatch is not implemented", (int)strlen(kind), kind);
        return;
    case SB_MK_GLOBALS:
        if (m->op == SB_OP_SET) {
            sb_answer_error(cb, arg, SB_E_NOT_IMPLEMENTED, "%.*s guest write is denied: a global is a singleton owned by the host",
                            (int)raw_len, raw_method);
            return;
        }
        if (t != NULL) {
            get_global(env, t, tok, m, raw_method, raw_len, cb, arg);
            return;
        }
        break;
    case SB_MK_HTTP:
        /* egress is the broker's own handler, for every run whose manifest grants net */
        if (env->fetch != NULL) {
            sb_fetch_start(env->fetch, env->store, tok, args, binary, cb, arg);
            return;
        }
        break;
    case SB_MK_FILES:
        if (t != NULL && t->files != NULL) {
            sb_files_handle(env, t->files, tok, m, args, binary, cb, arg);
            return;
        }
        break;
    case SB_MK_TOOLS:
        if (t != NULL && t->tools != NULL && env->tools != NULL) {
            sb_tools_handle(env, t, tok, m, args, binary, cb, arg);
            return;
        }
        break;
    case SB_MK_COLLECTIONS:
    case SB_MK_STORE:
        if (t != NULL && env->pg != NULL) {
            /* the PostgreSQL module answers not_implemented for collections the target does not declare */
            sb_pg_handle(env, t, tok, m, args, binary, cb, arg);
            return;
        }
        break;
    default:
        break;
    }
    sb_answer_error(cb, arg, SB_E_NOT_IMPLEMENTED, "%.*s has no host handler", (int)raw_len, raw_method);
}
