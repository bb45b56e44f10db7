/*
 * tools.list / tools.call on the target's MCP upstream (handlers.h).
 *
 * Two gates, both deny by default: the manifest's `tools` globs (checked by
 * broker/authz before we run, and again here for every tool tools.list
 * returns) and the target's `release` list (what the host chose to expose
 * from its tool server). A tool reaches the guest only when both name it.
 *
 * Limits are upstream's custom-tools hard maxima (PROTOCOL.md section
 * 6b, "Tools"): tools.call arguments 63 KiB packed (checked by the typed-call
 * decoder, call/call.c), a tools/list payload and a tools/call result
 * 768 KiB each, 256 tools, one operation timeout, a number of tools.call per
 * run (every granted attempt counts, a malformed or unreleased one included,
 * so probing is not free: dispatch counts it in the token store before it
 * refuses bad args) and a number of operations in flight per worker
 * and upstream. Upstream answers a limit with forbidden; we answer
 * rate_limited, our code for an exhausted quota (PROTOCOL.md section 7).
 *
 * Every upstream failure is execution_error: the detail (with the upstream
 * URL) goes into the result message, which the RPC route logs under the
 * call's correlation id and replaces with the fixed upstream string on the
 * wire, so nothing the tool server says reaches the guest unless it is a
 * result.
 *
 * The per-run tools.call counter lives in the token store, next to the run's
 * other quotas (sb_store_quota_tool_call): a run's calls land on any worker,
 * and on Redis on any instance, and all of them count against one limit.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "authz/authz.h"
#include "sb/limits.h"
#include "sb/value.h"
#include "svc/handlers.h"
#include "svc/tools/mcp_client.h"
#include "svc/tools/mcp_wire.h"
#include "util/util.h"

/* PROTOCOL.md section 6b ("Tools"), upstream's hard maxima */
#define SB_TOOLS_MAX_LIST 786432u   /* a tools/list payload (each page, and what we return) */
#define SB_TOOLS_MAX_RESULT 786432u /* a tools/call result */
#define SB_TOOLS_MAX_TOOLS 256u     /* tools an upstream may list, over every page */
#define SB_TOOLS_MAX_NAME SB_CALL_MAX_TOOL_NAME
/* release list entries (targets.<t>.tools.release holds at most this many, target.c) */
#define SB_TOOLS_MAX_RELEASE 256u
/* ours: pagination is bounded too, and so is a cursor we send back */
#define SB_TOOLS_MAX_PAGES 16u
#define SB_TOOLS_MAX_CURSOR 1024u

static const char msg_bad_args[] = "invalid sandbox custom tool arguments";
static const char msg_limit[] = SB_TOOLS_MSG_LIMIT;
static const char msg_not_released[] = "tools.call name is not released by the target";

/* ---- per-worker state ------------------------------------------------------------------------------------------------ */

/* one tools upstream as this worker sees it: its MCP session and its operations in flight */
typedef struct st_upstream_t {
    const sb_tools_conf_t *conf;
    sb_mcp_t *mcp;       /* NULL when the URL was refused */
    const char *url_why; /* why it was refused */
    unsigned inflight;
    h2o_timeout_t deadline; /* conf->timeout_ms: one operation, every page and the session set-up included */
} upstream_t;

struct st_sb_tools_ctx_t {
    h2o_loop_t *loop;
    upstream_t **ups;
    size_t nups;
    h2o_linklist_t ops;
};

typedef struct st_tools_op_t {
    h2o_linklist_t link; /* in ctx->ops */
    sb_tools_ctx_t *ctx;
    upstream_t *up;
    const sb_target_t *t;
    sb_token_t *tok;  /* our reference, held while the operation is in flight */
    const char *what; /* "tools/list" or "tools/call" */
    char tool[SB_TOOLS_MAX_NAME + 1];
    sb_dispatch_cb cb;
    void *arg;
    h2o_timeout_entry_t deadline;
    sb_mcp_call_t *call;
    /* tools.list */
    msgpack_sbuffer tools; /* the tools we return, packed one after the other */
    size_t ntools, nseen, pages;
    uint8_t emitted[SB_TOOLS_MAX_RELEASE]; /* by release index: an upstream listing a name twice yields it once */
} tools_op_t;

sb_tools_ctx_t *sb_tools_ctx_create(h2o_loop_t *loop)
{
    sb_tools_ctx_t *ctx = sb_mem_calloc(1, sizeof(*ctx));

    ctx->loop = loop;
    h2o_linklist_init_anchor(&ctx->ops);
    return ctx;
}

/* ---- replies --------------------------------------------------------------------------------------------------------- */

/* ends an operation: the callback runs, then everything the operation held is released */
static void op_finish(tools_op_t *op, sb_result_t *res)
{
    if (h2o_linklist_is_linked(&op->link))
        h2o_linklist_unlink(&op->link);
    if (h2o_timeout_is_linked(&op->deadline))
        h2o_timeout_unlink(&op->deadline);
    if (op->call != NULL) {
        sb_mcp_call_cancel(op->call);
        op->call = NULL;
    }
    --op->up->inflight;
    op->cb(op->arg, res);
    sb_token_release(op->tok);
    msgpack_sbuffer_destroy(&op->tools);
    sb_mem_free(op);
}

/* execution_error with the upstream and the detail (logged under the correlation id, redacted on the wire) */
__attribute__((format(printf, 2, 3))) static void op_fail(tools_op_t *op, const char *fmt, ...)
{
    sb_result_t res;
    char detail[SB_RESULT_MAX_MESSAGE];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    sb_result_init(&res);
    sb_result_fail(&res, SB_E_EXECUTION, "tools upstream %s: %s", sb_mcp_url(op->up->mcp), detail);
    op_finish(op, &res);
    sb_result_dispose(&res);
}
static void op_succeed(tools_op_t *op, msgpack_sbuffer *value)
{
    sb_result_t res;

    sb_result_init(&res);
    res.value = *value; /* moved: op_finish's caller no longer owns it */
    msgpack_sbuffer_init(value);
    op_finish(op, &res);
    sb_result_dispose(&res);
}
static void on_deadline(h2o_timeout_entry_t *entry)
{
    tools_op_t *op = H2O_STRUCT_FROM_MEMBER(tools_op_t, deadline, entry);

    if (op->tool[0] != '\0')
        op_fail(op, "%s \"%s\": no result within %llu ms", op->what, op->tool, (unsigned long long)op->up->conf->timeout_ms);
    else
        op_fail(op, "%s: no result within %llu ms", op->what, (unsigned long long)op->up->conf->timeout_ms);
}

/* ---- shared helpers -------------------------------------------------------------------------------------------------- */

static void upstream_destroy(sb_tools_ctx_t *ctx, upstream_t *up)
{
    sb_mcp_destroy(up->mcp);
    h2o_timeout_dispose(ctx->loop, &up->deadline);
    sb_mem_free(up);
}

static int conf_is_current(const sb_targets_t *targets, const sb_tools_conf_t *tc)
{
    for (size_t i = 0; targets != NULL && i < targets->n; ++i)
        if (targets->v[i].tools == tc)
            return 1;
    return 0;
}

/*
 * The session for a target's upstream, created on first use. A configuration
 * reload (SIGHUP) publishes new target objects and keeps the old ones
 * allocated; sessions of upstreams that are no longer configured are closed
 * here once nothing is in flight on them.
 */
static upstream_t *get_upstream(sb_tools_ctx_t *ctx, const sb_targets_t *targets, const sb_tools_conf_t *tc)
{
    upstream_t *up, **v;
    size_t o = 0;

    for (size_t i = 0; i < ctx->nups; ++i)
        if (ctx->ups[i]->conf == tc)
            return ctx->ups[i];
    for (size_t i = 0; i < ctx->nups; ++i) {
        if (ctx->ups[i]->inflight == 0 && !conf_is_current(targets, ctx->ups[i]->conf))
            upstream_destroy(ctx, ctx->ups[i]);
        else
            ctx->ups[o++] = ctx->ups[i];
    }
    ctx->nups = o;
    up = sb_mem_calloc(1, sizeof(*up));
    up->conf = tc;
    if (sb_mcp_create(ctx->loop, tc->upstream, tc->timeout_ms, &up->mcp, &up->url_why) != SB_OK)
        up->mcp = NULL;
    h2o_timeout_init(ctx->loop, &up->deadline, tc->timeout_ms);
    /* one entry per configured target (and per retired one still busy): as small as the configuration */
    v = sb_mem_realloc(ctx->ups, (ctx->nups + 1) * sizeof(*v));
    ctx->ups = v;
    ctx->ups[ctx->nups++] = up;
    return up;
}

/* the index of `name` in the target's release list, or -1 */
static int released_index(const sb_tools_conf_t *tc, const char *name, size_t len)
{
    for (size_t i = 0; i < tc->nrelease && i < SB_TOOLS_MAX_RELEASE; ++i)
        if (strlen(tc->release[i]) == len && memcmp(tc->release[i], name, len) == 0)
            return (int)i;
    return -1;
}

/* admits an operation (concurrency) and starts its clock; NULL after replying when it cannot run */
static tools_op_t *op_start(sb_tools_ctx_t *ctx, upstream_t *up, const sb_target_t *t, sb_token_t *tok, const char *what,
                            sb_dispatch_cb cb, void *arg)
{
    tools_op_t *op;

    if (up->mcp == NULL) {
        sb_answer_error(cb, arg, SB_E_EXECUTION, "tools upstream %s is refused: %s", up->conf->upstream, up->url_why);
        return NULL;
    }
    if (up->inflight >= up->conf->concurrency) {
        sb_answer_error(cb, arg, SB_E_RATE_LIMITED, "%s", msg_limit);
        return NULL;
    }
    op = sb_mem_calloc(1, sizeof(*op));
    op->ctx = ctx;
    op->up = up;
    op->t = t;
    op->what = what;
    op->cb = cb;
    op->arg = arg;
    /* the callback may run long after the route dropped its reference */
    sb_token_addref(tok);
    op->tok = tok;
    msgpack_sbuffer_init(&op->tools);
    ++up->inflight;
    h2o_linklist_insert(&ctx->ops, &op->link);
    op->deadline.cb = on_deadline;
    h2o_timeout_link(ctx->loop, &up->deadline, &op->deadline);
    return op;
}

/* decodes a packed result object handed over by the MCP client */
SB_WARN_UNUSED static sb_status_t decode_result(const char *packed, size_t len, msgpack_zone *zone, msgpack_object *out)
{
    const char *why = NULL;
    sb_status_t st = sb_mp_decode((const uint8_t *)packed, len, zone, out, &why);
    if (st == SB_OK && out->type != MSGPACK_OBJECT_MAP)
        st = SB_E_BAD_ARGS;
    return st;
}

static int is_nil_or_absent(const msgpack_object *v)
{
    return v == NULL || v->type == MSGPACK_OBJECT_NIL;
}

/* ---- tools.list ------------------------------------------------------------------------------------------------------ */

static void list_page(tools_op_t *op, json_t *cursor);

/*
 * Appends one tool, keeping only the fields of MCP's Tool that we pass on
 * (MCP 2025-06-18, server/tools, "Tool": name, title, description,
 * inputSchema, outputSchema, annotations); anything else the server adds
 * (_meta, icons, ...) stays behind.
 * @return NULL, or the name of the malformed field
 */
static const char *pack_tool(tools_op_t *op, const msgpack_object *tool)
{
    static const char *const keys[] = {"name", "title", "description", "inputSchema", "outputSchema", "annotations"};
    static const msgpack_object_type types[] = {MSGPACK_OBJECT_STR, MSGPACK_OBJECT_STR, MSGPACK_OBJECT_STR,
                                                MSGPACK_OBJECT_MAP, MSGPACK_OBJECT_MAP, MSGPACK_OBJECT_MAP};
    const msgpack_object *vals[6];
    msgpack_packer pk;
    uint32_t n = 0;

    for (size_t i = 0; i < 6; ++i) {
        vals[i] = sb_mp_get(tool, keys[i]);
        if (is_nil_or_absent(vals[i])) {
            vals[i] = NULL;
            /* inputSchema is required: "a JSON Schema object defining the expected parameters" */
            if (i == 3)
                return keys[i];
            continue;
        }
        if (vals[i]->type != types[i])
            return keys[i];
        ++n;
    }
    msgpack_packer_init(&pk, &op->tools, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, n);
    for (size_t i = 0; i < 6; ++i) {
        if (vals[i] == NULL)
            continue;
        msgpack_pack_str_with_body(&pk, keys[i], strlen(keys[i]));
        sb_mp_pack_object(&pk, vals[i]);
    }
    return NULL;
}

static void list_done(tools_op_t *op)
{
    msgpack_sbuffer out;
    msgpack_packer pk;

    msgpack_sbuffer_init(&out);
    msgpack_packer_init(&pk, &out, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    msgpack_pack_str_with_body(&pk, "tools", 5);
    msgpack_pack_array(&pk, (uint32_t)op->ntools);
    if (op->tools.size != 0)
        msgpack_sbuffer_write(&out, op->tools.data, op->tools.size);
    op_succeed(op, &out);
    msgpack_sbuffer_destroy(&out);
}

static void on_list_page(void *arg, sb_status_t st, const char *detail, const char *packed, size_t len)
{
    tools_op_t *op = arg;
    const sb_tools_conf_t *tc = op->up->conf;
    const msgpack_object *tools, *next;
    msgpack_object result;
    msgpack_zone zone;
    json_t *cursor = NULL;

    op->call = NULL; /* the client frees it once we return */
    if (st != SB_OK) {
        op_fail(op, "%s", detail);
        return;
    }
    msgpack_zone_init(&zone, 4096);
    if (decode_result(packed, len, &zone, &result) != SB_OK) {
        op_fail(op, "tools/list: unreadable result");
        goto Exit;
    }
    /* server/tools, "Listing Tools": result {tools: Tool[], nextCursor?} */
    tools = sb_mp_get(&result, "tools");
    if (tools == NULL || tools->type != MSGPACK_OBJECT_ARRAY) {
        op_fail(op, "tools/list: the result has no tools array");
        goto Exit;
    }
    ++op->pages;
    for (uint32_t i = 0; i < tools->via.array.size; ++i) {
        const msgpack_object *tool = &tools->via.array.ptr[i], *name = sb_mp_get(tool, "name");
        const char *bad;
        int idx;
        if (tool->type != MSGPACK_OBJECT_MAP || name == NULL || name->type != MSGPACK_OBJECT_STR || name->via.str.size == 0 ||
            name->via.str.size > SB_TOOLS_MAX_NAME) {
            op_fail(op, "tools/list: a tool without a valid name");
            goto Exit;
        }
        if (++op->nseen > SB_TOOLS_MAX_TOOLS) {
            op_fail(op, "tools/list: the upstream lists more than %u tools", SB_TOOLS_MAX_TOOLS);
            goto Exit;
        }
        /* released by the target AND granted by the run's manifest: nothing else is even named to the guest */
        if ((idx = released_index(tc, name->via.str.ptr, name->via.str.size)) < 0 || op->emitted[idx] ||
            !sb_authz_tool_granted(op->tok->manifest, name->via.str.ptr, name->via.str.size))
            continue;
        if ((bad = pack_tool(op, tool)) != NULL) {
            op_fail(op, "tools/list: tool \"%s\" has a malformed %s", tc->release[idx], bad);
            goto Exit;
        }
        op->emitted[idx] = 1;
        ++op->ntools;
        if (op->tools.size > SB_TOOLS_MAX_LIST) {
            op_fail(op, "tools/list: the released tools exceed %u bytes", SB_TOOLS_MAX_LIST);
            goto Exit;
        }
    }
    /* server/tools, "Pagination": a nextCursor means more pages; it is opaque and sent back as is */
    next = sb_mp_get(&result, "nextCursor");
    if (!is_nil_or_absent(next)) {
        if (next->type != MSGPACK_OBJECT_STR || next->via.str.size > SB_TOOLS_MAX_CURSOR) {
            op_fail(op, "tools/list: nextCursor is not a string of at most %u bytes", SB_TOOLS_MAX_CURSOR);
            goto Exit;
        }
        if (op->pages >= SB_TOOLS_MAX_PAGES) {
            op_fail(op, "tools/list: the upstream paginates beyond %u pages", SB_TOOLS_MAX_PAGES);
            goto Exit;
        }
        if ((cursor = json_stringn(next->via.str.ptr, next->via.str.size)) == NULL) {
            op_fail(op, "tools/list: nextCursor is not valid UTF-8");
            goto Exit;
        }
        list_page(op, cursor);
        goto Exit;
    }
    list_done(op);
Exit:
    msgpack_zone_destroy(&zone);
}

/* requests one page; `cursor` (stolen) is NULL for the first */
static void list_page(tools_op_t *op, json_t *cursor)
{
    json_t *params = NULL;

    if (cursor != NULL && (params = json_pack("{s:o}", "cursor", cursor)) == NULL)
        sb_fatal(__FILE__, __LINE__, "out of memory");
    op->call = sb_mcp_call(op->up->mcp, "tools/list", params, SB_TOOLS_MAX_LIST + SB_MCP_ENVELOPE_SLACK, on_list_page, op);
}

/* the decoder took the args: absent or exactly {} */
static void handle_list(sb_tools_ctx_t *ctx, const sb_targets_t *targets, const sb_target_t *t, sb_token_t *tok, sb_dispatch_cb cb,
                        void *arg)
{
    upstream_t *up;
    tools_op_t *op;

    up = get_upstream(ctx, targets, t->tools);
    if ((op = op_start(ctx, up, t, tok, "tools/list", cb, arg)) == NULL)
        return;
    list_page(op, NULL);
}

/* ---- tools.call ------------------------------------------------------------------------------------------------------ */

static void on_call_result(void *arg, sb_status_t st, const char *detail, const char *packed, size_t len)
{
    tools_op_t *op = arg;
    const msgpack_object *content, *structured, *is_error;
    msgpack_object result;
    msgpack_zone zone;
    msgpack_sbuffer out;
    msgpack_packer pk;

    op->call = NULL;
    if (st != SB_OK) {
        op_fail(op, "tool \"%s\": %s", op->tool, detail);
        return;
    }
    msgpack_zone_init(&zone, 4096);
    msgpack_sbuffer_init(&out);
    if (decode_result(packed, len, &zone, &result) != SB_OK) {
        op_fail(op, "tools/call \"%s\": unreadable result", op->tool);
        goto Exit;
    }
    /* server/tools, "Tool Result": content (required array), structuredContent (object), isError (boolean) */
    content = sb_mp_get(&result, "content");
    structured = sb_mp_get(&result, "structuredContent");
    is_error = sb_mp_get(&result, "isError");
    if (content == NULL || content->type != MSGPACK_OBJECT_ARRAY) {
        op_fail(op, "tools/call \"%s\": the result has no content array", op->tool);
        goto Exit;
    }
    if (is_nil_or_absent(structured))
        structured = NULL;
    else if (structured->type != MSGPACK_OBJECT_MAP) {
        op_fail(op, "tools/call \"%s\": structuredContent is not an object", op->tool);
        goto Exit;
    }
    if (is_nil_or_absent(is_error))
        is_error = NULL;
    else if (is_error->type != MSGPACK_OBJECT_BOOLEAN) {
        op_fail(op, "tools/call \"%s\": isError is not a boolean", op->tool);
        goto Exit;
    }
    msgpack_packer_init(&pk, &out, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1u + (structured != NULL) + (is_error != NULL));
    msgpack_pack_str_with_body(&pk, "content", 7);
    sb_mp_pack_object(&pk, content);
    if (structured != NULL) {
        msgpack_pack_str_with_body(&pk, "structuredContent", 17);
        sb_mp_pack_object(&pk, structured);
    }
    if (is_error != NULL) {
        msgpack_pack_str_with_body(&pk, "isError", 7);
        sb_mp_pack_object(&pk, is_error);
    }
    if (out.size > SB_TOOLS_MAX_RESULT) {
        op_fail(op, "tools/call \"%s\": the result exceeds %u bytes", op->tool, SB_TOOLS_MAX_RESULT);
        goto Exit;
    }
    op_succeed(op, &out);
Exit:
    msgpack_sbuffer_destroy(&out);
    msgpack_zone_destroy(&zone);
}

/* the decoder took exactly {name, arguments?} (call.c); the manifest granted the name and dispatch counted the attempt */
static void handle_call(sb_tools_ctx_t *ctx, const sb_targets_t *targets, const sb_target_t *t, sb_token_t *tok,
                        const sb_call_tools_t *call, sb_dispatch_cb cb, void *arg)
{
    const sb_tools_conf_t *tc = t->tools;
    json_t *arguments = NULL, *params;
    upstream_t *up;
    tools_op_t *op;

    /* the manifest granted the name; the target must also release it (deny by default on both sides) */
    if (released_index(tc, call->name, call->name_len) < 0) {
        sb_answer_error(cb, arg, SB_E_FORBIDDEN, "%s", msg_not_released);
        return;
    }
    /* bin values become base64 text, as everywhere JSON carries them (the decoder checked JSON can carry the rest) */
    if (call->arguments != NULL && sb_json_from_mp(call->arguments, &arguments) != SB_OK) {
        sb_answer_error(cb, arg, SB_E_BAD_ARGS, "%s", msg_bad_args);
        return;
    }
    up = get_upstream(ctx, targets, tc);
    if ((op = op_start(ctx, up, t, tok, "tools/call", cb, arg)) == NULL)
        goto Exit;
    memcpy(op->tool, call->name, call->name_len);
    op->tool[call->name_len] = '\0';
    /* server/tools, "Calling Tools": params {name, arguments?} */
    params = json_pack("{s:s}", "name", op->tool);
    if (params == NULL || (arguments != NULL && json_object_set_new(params, "arguments", arguments) != 0))
        sb_fatal(__FILE__, __LINE__, "out of memory");
    arguments = NULL;
    op->call = sb_mcp_call(up->mcp, "tools/call", params, SB_TOOLS_MAX_RESULT + SB_MCP_ENVELOPE_SLACK, on_call_result, op);
Exit:
    json_decref(arguments);
}

/* ---- entry points ---------------------------------------------------------------------------------------------------- */

void sb_tools_handle(const sb_svc_env_t *env, const sb_target_t *t, sb_token_t *tok, const sb_call_t *call, sb_dispatch_cb cb,
                     void *arg)
{
    switch (call->m.op) {
    case SB_OP_LIST:
        handle_list(env->tools, env->targets, t, tok, cb, arg);
        return;
    case SB_OP_CALL:
        if (call->tools != NULL && call->tools->name != NULL) {
            handle_call(env->tools, env->targets, t, tok, call->tools, cb, arg);
            return;
        }
        break;
    default:
        break;
    }
    sb_answer_error(cb, arg, SB_E_BAD_METHOD, "invalid sandbox custom tool method");
}

void sb_tools_ctx_destroy(sb_tools_ctx_t *ctx)
{
    if (ctx == NULL)
        return;
    /* operations still in flight (the drain timed out) answer now, exactly once */
    while (!h2o_linklist_is_empty(&ctx->ops)) {
        tools_op_t *op = H2O_STRUCT_FROM_MEMBER(tools_op_t, link, ctx->ops.next);
        op_fail(op, "%s: the worker is shutting down", op->what);
    }
    for (size_t i = 0; i < ctx->nups; ++i)
        upstream_destroy(ctx, ctx->ups[i]);
    sb_mem_free(ctx->ups);
    sb_mem_free(ctx);
}
