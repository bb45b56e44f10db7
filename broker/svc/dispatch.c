/*
 * The dispatch table. http.fetch is the broker's own handler (egress); the
 * rest is wired per target: files (a root), collections and store
 * (PostgreSQL), tools (an MCP upstream), globals (static values, or table
 * rows read through PostgreSQL). What the target does not wire answers
 * not_implemented (a collection it does not declare, a document store it does
 * not wire). services, jobs and workflows are never dispatched, and
 * globals.<n>.set is refused: a global is a singleton the host owns. Then,
 * and only then, a call with an argument error is refused with the decoder's
 * reason: a handler receives only calls that decoded whole.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "svc/dispatch.h"
#include "svc/handlers.h"
#include "util/util.h"

static int name_is(const sb_method_t *m, const char *s)
{
    return m->name_len == strlen(s) && memcmp(m->name, s, m->name_len) == 0;
}

static void no_handler(const sb_call_t *call, sb_dispatch_cb cb, void *arg)
{
    sb_answer_error(cb, arg, SB_E_NOT_IMPLEMENTED, "%.*s has no host handler", (int)call->method_len, call->method);
}

/*
 * A granted call whose args the decoder refused: answered here, once its
 * handler is known to exist, so no handler ever sees a malformed call.
 */
static int refused(const sb_call_t *call, sb_dispatch_cb cb, void *arg)
{
    if (call->err_stage == SB_CALL_ERR_NONE)
        return 0;
    sb_answer_error(cb, arg, call->err_status, "%s", call->err);
    return 1;
}

/* a static value is answered here; a table global reads its row through the PostgreSQL pool */
static void get_global(const sb_svc_env_t *env, const sb_target_t *t, sb_token_t *tok, const sb_call_t *call, sb_dispatch_cb cb,
                       void *arg)
{
    for (size_t i = 0; i < t->nglobals; ++i) {
        const sb_global_conf_t *g = &t->globals[i];
        if (!name_is(&call->m, g->name))
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
    no_handler(call, cb, arg);
}

/* 1 when the target declares the collection of a collections.<name>.* call, or wires the document store of a store call */
static int wires_data(const sb_target_t *t, const sb_call_t *call)
{
    if (call->data != NULL && call->data->docstore)
        return t->document_store != NULL;
    for (size_t i = 0; i < t->ncollections; ++i)
        if (name_is(&call->m, t->collections[i].name))
            return 1;
    return 0;
}

/* a tools.call waiting for the store to count it against the run's max_calls */
typedef struct st_tool_count_t {
    const sb_svc_env_t *env;
    const sb_target_t *t;
    sb_token_t *tok;
    const sb_call_t *call;
    sb_dispatch_cb cb;
    void *arg;
} tool_count_t;

static void on_tool_counted(void *p, sb_status_t st, const char *why)
{
    tool_count_t *tc = p;

    (void)why;
    if (st == SB_E_RATE_LIMITED)
        sb_answer_error(tc->cb, tc->arg, SB_E_RATE_LIMITED, "%s", SB_TOOLS_MSG_LIMIT);
    else if (st != SB_OK)
        sb_answer_error(tc->cb, tc->arg, SB_E_UNAVAILABLE, "sandbox token store is unavailable");
    else if (tc->env->tools == NULL)
        /* the count came back after the worker's shutdown took its tools context (a drain that timed out) */
        sb_answer_error(tc->cb, tc->arg, SB_E_UNAVAILABLE, "sandbox tools are unavailable: the worker is shutting down");
    else if (!refused(tc->call, tc->cb, tc->arg))
        sb_tools_handle(tc->env, tc->t, tc->tok, tc->call, tc->cb, tc->arg);
    sb_token_release(tc->tok);
    sb_mem_free(tc);
}

/*
 * Every tools.call attempt counts against max_calls, a malformed one included
 * (PROTOCOL.md section 6b): counted per run in the token store, so the limit
 * is one across workers and, on Redis, across instances. The env is the
 * worker's and the target belongs to a configuration a reload never frees
 * while calls run, so both outlive the count's round trip.
 */
static void count_tool_call(const sb_svc_env_t *env, const sb_target_t *t, sb_token_t *tok, const sb_call_t *call,
                            sb_dispatch_cb cb, void *arg)
{
    tool_count_t *tc;

    if (env->store == NULL) {
        /* nothing to count in: fail closed */
        sb_answer_error(cb, arg, SB_E_UNAVAILABLE, "sandbox token store is unavailable");
        return;
    }
    tc = sb_mem_calloc(1, sizeof(*tc));
    tc->env = env;
    tc->t = t;
    sb_token_addref(tok);
    tc->tok = tok;
    tc->call = call;
    tc->cb = cb;
    tc->arg = arg;
    sb_store_quota_tool_call(env->store, tok, t->tools->max_calls, on_tool_counted, tc);
}

void sb_dispatch(const sb_svc_env_t *env, sb_token_t *tok, const sb_call_t *call, sb_dispatch_cb cb, void *arg)
{
    const sb_method_t *m = &call->m;
    const sb_target_t *t = sb_targets_find(env->targets, tok->target);

    switch (m->kind) {
    case SB_MK_SERVICES:
        sb_answer_error_str(cb, arg, SB_E_NOT_IMPLEMENTED, "services dispatch is not implemented");
        return;
    case SB_MK_JOBS:
        sb_answer_error_str(cb, arg, SB_E_NOT_IMPLEMENTED, "jobs dispatch is not implemented");
        return;
    case SB_MK_WORKFLOWS:
        sb_answer_error_str(cb, arg, SB_E_NOT_IMPLEMENTED, "workflows dispatch is not implemented");
        return;
    case SB_MK_GLOBALS:
        if (m->op == SB_OP_SET) {
            sb_answer_error(cb, arg, SB_E_NOT_IMPLEMENTED, "%.*s guest write is denied: a global is a singleton owned by the host",
                            (int)call->method_len, call->method);
            return;
        }
        if (t != NULL) {
            get_global(env, t, tok, call, cb, arg);
            return;
        }
        break;
    case SB_MK_HTTP:
    case SB_MK_IMPORT:
        /* egress is the broker's own handler, for every run whose manifest grants net (or import, for modules) */
        if (env->fetch != NULL) {
            if (!refused(call, cb, arg))
                sb_fetch_start(env->fetch, env->store, tok, call, cb, arg);
            return;
        }
        break;
    case SB_MK_FILES:
        if (t != NULL && t->files != NULL) {
            if (!refused(call, cb, arg))
                sb_files_handle(env, t->files, tok, call, cb, arg);
            return;
        }
        break;
    case SB_MK_TOOLS:
        if (t != NULL && t->tools != NULL && env->tools != NULL) {
            if (m->op == SB_OP_CALL) {
                count_tool_call(env, t, tok, call, cb, arg);
                return;
            }
            if (!refused(call, cb, arg))
                sb_tools_handle(env, t, tok, call, cb, arg);
            return;
        }
        break;
    case SB_MK_COLLECTIONS:
    case SB_MK_STORE:
        if (t != NULL && env->pg != NULL && wires_data(t, call)) {
            if (!refused(call, cb, arg))
                sb_pg_handle(env, t, tok, call, cb, arg);
            return;
        }
        break;
    default:
        break;
    }
    no_handler(call, cb, arg);
}
