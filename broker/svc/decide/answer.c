/*
 * The decider's wire (decide.h, PROTOCOL.md section 5a): the description of
 * a call the broker sends, and the parser of the answer it gets back.
 *
 * The description is written from the typed call (call/call.h), the same
 * values the check decided on and the handler will use, so what the decider
 * sees is what will run. It carries names and shapes, never a header value, a
 * request body, a secret (a placeholder's name at most) or the run's token.
 *
 * The answer is untrusted bytes from the network: bounded before it is
 * parsed, parsed once by the project's strict JSON reader (PROTOCOL.md
 * section 1: UTF-8, unique keys, nesting and node caps), and anything but
 * the exact schema is malformed, which the caller turns into a refusal.
 */
#include <stdio.h>
#include <string.h>
#include <msgpack.h>
#include "sb/limits.h"
#include "sb/method.h"
#include "sb/value.h"
#include "call/url.h"
#include "call/where.h"
#include "svc/decide/decide.h"

/* ---- the answer ----------------------------------------------------------------------------------------------------- */

sb_status_t sb_decide_parse_answer(const char *body, size_t len, sb_decide_answer_t *out, const char **why)
{
    msgpack_zone zone;
    msgpack_object root;
    const msgpack_object *v = NULL, *decision = NULL, *reason = NULL;
    const char *jwhy = NULL;
    sb_status_t st = SB_E_BAD_ARGS;

    memset(out, 0, sizeof(*out));
    /* the bound comes before any allocation */
    if (len > SB_MAX_DECIDE_ANSWER) {
        *why = "the answer is larger than 4096 bytes";
        return SB_E_BAD_ARGS;
    }
    if (body == NULL || len == 0) {
        *why = "the answer is empty";
        return SB_E_BAD_ARGS;
    }
    msgpack_zone_init(&zone, 1024);
    if (sb_json_parse(body, len, &zone, &root, &jwhy) != SB_OK) {
        *why = "the answer is not valid JSON";
        goto Exit;
    }
    if (root.type != MSGPACK_OBJECT_MAP) {
        *why = "the answer is not a JSON object";
        goto Exit;
    }
    for (uint32_t i = 0; i < root.via.map.size; ++i) {
        const msgpack_object *k = &root.via.map.ptr[i].key, *val = &root.via.map.ptr[i].val;
        if (sb_mp_str_is(k, "v"))
            v = val;
        else if (sb_mp_str_is(k, "decision"))
            decision = val;
        else if (sb_mp_str_is(k, "reason"))
            reason = val;
        else {
            *why = "the answer has an unknown key";
            goto Exit;
        }
    }
    if (v == NULL || v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 != SB_DECIDE_VERSION) {
        *why = "the answer's \"v\" is not 1";
        goto Exit;
    }
    if (decision != NULL && sb_mp_str_is(decision, "allow")) {
        out->allow = 1;
    } else if (decision != NULL && sb_mp_str_is(decision, "deny")) {
        out->allow = 0;
    } else {
        *why = "the answer's \"decision\" is not \"allow\" or \"deny\"";
        goto Exit;
    }
    if (reason != NULL) {
        if (reason->type != MSGPACK_OBJECT_STR) {
            *why = "the answer's \"reason\" is not a string";
            goto Exit;
        }
        if (reason->via.str.size > SB_MAX_DECIDE_REASON) {
            *why = "the answer's \"reason\" is longer than 256 bytes";
            goto Exit;
        }
        /* it reaches the guest and the log: no control characters (the parser already checked UTF-8) */
        for (uint32_t i = 0; i < reason->via.str.size; ++i) {
            unsigned char c = (unsigned char)reason->via.str.ptr[i];
            if (c < 0x20 || c == 0x7f) {
                *why = "the answer's \"reason\" has a control character";
                goto Exit;
            }
        }
        memcpy(out->reason, reason->via.str.ptr, reason->via.str.size);
        out->reason[reason->via.str.size] = '\0';
    }
    st = SB_OK;
Exit:
    msgpack_zone_destroy(&zone);
    if (st != SB_OK)
        memset(out, 0, sizeof(*out));
    return st;
}

/* ---- the description ------------------------------------------------------------------------------------------------ */

/* the operators' names on the wire (PROTOCOL.md section 6b), in sb_where_op_t order */
static const char *const where_ops[SB_WOP_COUNT_] = {"equals", "not_equals", "gt",   "gte",      "lt",    "lte",
                                                     "in",     "not_in",     "like", "contains", "exists"};

#define TRY(x)                                                                                                                     \
    do {                                                                                                                           \
        if ((st = (x)) != SB_OK)                                                                                                   \
            return st;                                                                                                             \
    } while (0)

static sb_status_t put_key(sb_buf_t *b, int *first, const char *key)
{
    sb_status_t st;
    if (!*first)
        TRY(sb_buf_append_char(b, ','));
    *first = 0;
    TRY(sb_buf_append_json_str(b, key, strlen(key)));
    return sb_buf_append_char(b, ':');
}

static sb_status_t put_str(sb_buf_t *b, int *first, const char *key, const char *s, size_t len)
{
    sb_status_t st;
    TRY(put_key(b, first, key));
    return sb_buf_append_json_str_lossy(b, s, len);
}

static sb_status_t put_uint(sb_buf_t *b, int *first, const char *key, uint64_t n)
{
    sb_status_t st;
    TRY(put_key(b, first, key));
    return sb_buf_printf(b, "%llu", (unsigned long long)n);
}

static sb_status_t put_value(sb_buf_t *b, const msgpack_object *o)
{
    const char *why = NULL;
    return sb_json_write(b, o, &why);
}

/* a where map back as the JSON the guest sent (the typed tree mirrors it node for node: call/where.h) */
static sb_status_t put_where(sb_buf_t *b, const sb_where_t *w, unsigned depth)
{
    sb_status_t st;

    if (depth > SB_WHERE_MAX_DEPTH * 2 + 2)
        return SB_E_TOO_LARGE;
    TRY(sb_buf_append_char(b, '{'));
    for (uint32_t i = 0; i < w->n; ++i) {
        const sb_where_t *c = &w->v[i];
        if (i != 0)
            TRY(sb_buf_append_char(b, ','));
        switch (c->kind) {
        case SB_WHERE_AND:
        case SB_WHERE_OR:
            TRY(sb_buf_append_str(b, c->kind == SB_WHERE_AND ? "\"and\":[" : "\"or\":["));
            for (uint32_t j = 0; j < c->n; ++j) {
                if (j != 0)
                    TRY(sb_buf_append_char(b, ','));
                TRY(put_where(b, &c->v[j], depth + 1));
            }
            TRY(sb_buf_append_char(b, ']'));
            break;
        case SB_WHERE_OPS:
            TRY(sb_buf_append_json_str_lossy(b, c->field, c->field_len));
            TRY(sb_buf_append_str(b, ":{"));
            for (uint32_t j = 0; j < c->n; ++j) {
                const sb_where_t *k = &c->v[j];
                if (j != 0)
                    TRY(sb_buf_append_char(b, ','));
                TRY(sb_buf_printf(b, "\"%s\":", (unsigned)k->op < SB_WOP_COUNT_ ? where_ops[k->op] : "equals"));
                TRY(put_value(b, k->value));
            }
            TRY(sb_buf_append_char(b, '}'));
            break;
        case SB_WHERE_COND:
            TRY(sb_buf_append_json_str_lossy(b, c->field, c->field_len));
            TRY(sb_buf_append_char(b, ':'));
            TRY(put_value(b, c->value));
            break;
        default: /* an ALL directly inside an ALL does not occur (where.h) */
            return SB_E_BAD_ARGS;
        }
    }
    return sb_buf_append_char(b, '}');
}

/* the field names of a create / update, never their values */
static sb_status_t put_fields(sb_buf_t *b, int *first, const sb_call_data_t *d)
{
    sb_status_t st;
    TRY(put_key(b, first, "fields"));
    TRY(sb_buf_append_char(b, '['));
    for (size_t i = 0; i < d->ndata; ++i) {
        if (i != 0)
            TRY(sb_buf_append_char(b, ','));
        TRY(sb_buf_append_json_str_lossy(b, d->data[i].name, d->data[i].len));
    }
    return sb_buf_append_char(b, ']');
}

/*
 * The args object. `full` 0 leaves out what may be large (a where, a tool's
 * arguments) and lists it in *omitted instead.
 */
static sb_status_t put_args(sb_buf_t *b, const sb_call_t *call, int full, const char **omitted)
{
    const sb_method_t *m = &call->m;
    int first = 1;
    sb_status_t st;

    *omitted = NULL;
    TRY(sb_buf_append_char(b, '{'));
    switch (m->kind) {
    case SB_MK_FILES:
        if (call->files != NULL && call->files->has_path)
            TRY(put_str(b, &first, "path", call->files->path, call->files->path_len));
        if (call->files != NULL && m->op == SB_OP_WRITE)
            TRY(put_uint(b, &first, "bytes", call->files->content_len));
        break;
    case SB_MK_COLLECTIONS:
    case SB_MK_STORE:
        if (call->data != NULL && call->data->docstore && call->data->ns != NULL)
            TRY(put_str(b, &first, "namespace", call->data->ns, call->data->ns_len));
        else
            TRY(put_str(b, &first, "collection", m->name, m->name_len));
        if (call->data == NULL)
            break;
        if (call->data->where != NULL) {
            if (full) {
                TRY(put_key(b, &first, "where"));
                TRY(put_where(b, call->data->where, 0));
            } else {
                *omitted = "where";
            }
        }
        if (m->op == SB_OP_CREATE || m->op == SB_OP_UPDATE)
            TRY(put_fields(b, &first, call->data));
        if (call->data->has_limit)
            TRY(put_uint(b, &first, "limit", call->data->limit));
        if (call->data->offset != 0)
            TRY(put_uint(b, &first, "offset", call->data->offset));
        break;
    case SB_MK_GLOBALS:
    case SB_MK_SERVICES:
    case SB_MK_JOBS:
    case SB_MK_WORKFLOWS:
        TRY(put_str(b, &first, "name", m->name, m->name_len));
        if (m->fn_len != 0)
            TRY(put_str(b, &first, "function", m->fn, m->fn_len));
        break;
    case SB_MK_TOOLS:
        if (call->tools != NULL && call->tools->name != NULL) {
            TRY(put_str(b, &first, "tool", call->tools->name, call->tools->name_len));
            if (call->tools->arguments != NULL) {
                if (full) {
                    TRY(put_key(b, &first, "arguments"));
                    TRY(put_value(b, call->tools->arguments));
                } else {
                    *omitted = "arguments";
                }
            }
        }
        break;
    case SB_MK_HTTP:
    case SB_MK_IMPORT: /* the same request shape: GET, no headers, no body */
        if (call->fetch != NULL) {
            const sb_call_fetch_t *f = call->fetch;
            char hp[SB_URL_MAX_HOST + 16];
            sb_url_hostport(&f->url, hp, sizeof(hp));
            TRY(put_key(b, &first, "url"));
            TRY(sb_buf_append_char(b, '"'));
            TRY(sb_buf_append_str(b, f->url.scheme == SB_URL_HTTPS ? "https://" : "http://"));
            /* the canonical host and the target are printable ASCII without '"' or '\' (call/url.h) */
            TRY(sb_buf_append_str(b, hp));
            TRY(sb_buf_append(b, f->url.target, f->url.target_len));
            TRY(sb_buf_append_char(b, '"'));
            TRY(put_str(b, &first, "method", f->method, strlen(f->method)));
            /* header names only: a value may hold a credential or a secret's placeholder */
            TRY(put_key(b, &first, "headers"));
            TRY(sb_buf_append_char(b, '['));
            for (size_t i = 0; i < f->nheaders; ++i) {
                if (i != 0)
                    TRY(sb_buf_append_char(b, ','));
                TRY(sb_buf_append_json_str_lossy(b, f->headers[i].name, f->headers[i].name_len));
            }
            TRY(sb_buf_append_char(b, ']'));
            if (f->nsecrets != 0) {
                TRY(put_key(b, &first, "secrets"));
                TRY(sb_buf_append_char(b, '['));
                for (size_t i = 0; i < f->nsecrets; ++i) {
                    if (i != 0)
                        TRY(sb_buf_append_char(b, ','));
                    TRY(sb_buf_append_json_str_lossy(b, f->secrets[i].name, f->secrets[i].len));
                }
                TRY(sb_buf_append_char(b, ']'));
            }
            TRY(put_uint(b, &first, "bodyBytes", f->body_len));
        }
        break;
    default:
        break;
    }
    return sb_buf_append_char(b, '}');
}

static sb_status_t describe(sb_buf_t *b, const char *cid, const char *run_id, const char *target, const sb_call_t *call,
                            uint64_t deadline_ms, int full, int *partial)
{
    const char *omitted = NULL;
    int first = 1;
    sb_status_t st;

    TRY(sb_buf_printf(b, "{\"v\":%d", SB_DECIDE_VERSION));
    first = 0;
    TRY(put_str(b, &first, "id", cid != NULL ? cid : "", cid != NULL ? strlen(cid) : 0));
    TRY(put_str(b, &first, "runId", run_id, strlen(run_id)));
    if (target != NULL && target[0] != '\0')
        TRY(put_str(b, &first, "target", target, strlen(target)));
    else
        TRY(sb_buf_append_str(b, ",\"target\":null"));
    TRY(put_str(b, &first, "method", call->method, call->method_len));
    TRY(put_uint(b, &first, "deadlineMs", deadline_ms));
    TRY(put_key(b, &first, "args"));
    TRY(put_args(b, call, full, &omitted));
    *partial = omitted != NULL;
    if (omitted != NULL)
        TRY(sb_buf_printf(b, ",\"omitted\":[\"%s\"]", omitted));
    return sb_buf_append_char(b, '}');
}

sb_status_t sb_decide_describe(sb_buf_t *out, const char *cid, const char *run_id, const char *target, const sb_call_t *call,
                               uint64_t deadline_ms, int *partial)
{
    size_t start = out->len;
    int left_out = 0;
    sb_status_t st = describe(out, cid, run_id, target, call, deadline_ms, 1, &left_out);

    /* too large, or a value JSON cannot carry (binary): the same description without the big parts */
    if (st == SB_E_TOO_LARGE || st == SB_E_BAD_ARGS) {
        sb_buf_truncate(out, start);
        st = describe(out, cid, run_id, target, call, deadline_ms, 0, &left_out);
        if (st == SB_E_BAD_ARGS)
            st = SB_E_TOO_LARGE;
    }
    if (st != SB_OK)
        sb_buf_truncate(out, start);
    if (partial != NULL)
        *partial = st == SB_OK && left_out;
    return st;
}
