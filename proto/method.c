/*
 * sandbox-broker: the RPC method grammar (include/sb/method.h).
 *
 * The grammar is the upstream parseBindingMethod (PROTOCOL.md section 4)
 * plus our store.<ns>.<op>, tools.(list|call) and import.fetch methods. A method string is a
 * closed set of shapes; anything that is not exactly one of them is
 * SB_E_BAD_METHOD, so the dispatcher and the capability check never see a
 * string they have to guess about.
 */
#include <string.h>
#include "sb/limits.h"
#include "sb/method.h"

/* names are [A-Za-z0-9_-]{1,128} */
#define MAX_NAME_LEN SB_MAX_NAME
/* the longest method has three segments */
#define MAX_SEGMENTS 3u

typedef struct st_segment_t {
    const char *p;
    size_t len;
} segment_t;

static const char *const op_names[SB_OP_COUNT_] = {
    [SB_OP_READ] = "read",        [SB_OP_WRITE] = "write",   [SB_OP_LIST] = "list",     [SB_OP_FIND] = "find",
    [SB_OP_FIND_ONE] = "findOne", [SB_OP_CREATE] = "create", [SB_OP_UPDATE] = "update", [SB_OP_DELETE] = "delete",
    [SB_OP_GET] = "get",          [SB_OP_SET] = "set",       [SB_OP_CALL] = "call",     [SB_OP_ENQUEUE] = "enqueue",
    [SB_OP_TRIGGER] = "trigger",  [SB_OP_SEND] = "send",     [SB_OP_FETCH] = "fetch",
};

static const char *const kind_names[SB_MK_COUNT_] = {
    [SB_MK_FILES] = "files",         [SB_MK_COLLECTIONS] = "collections",
    [SB_MK_STORE] = "store",         [SB_MK_GLOBALS] = "globals",
    [SB_MK_SERVICES] = "services",   [SB_MK_JOBS] = "jobs",
    [SB_MK_WORKFLOWS] = "workflows", [SB_MK_EMAIL] = "email",
    [SB_MK_HTTP] = "http",           [SB_MK_TOOLS] = "tools",
    [SB_MK_IMPORT] = "import",
};

static int seg_is(const segment_t *seg, const char *lit)
{
    size_t n = strlen(lit);
    return seg->len == n && memcmp(seg->p, lit, n) == 0;
}

/* ASCII only, by byte value: <ctype.h> is locale-sensitive and banned on wire data */
static int is_name_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static int is_name(const segment_t *seg)
{
    size_t i;

    if (seg->len == 0 || seg->len > MAX_NAME_LEN)
        return 0;
    for (i = 0; i != seg->len; ++i)
        if (!is_name_char((unsigned char)seg->p[i]))
            return 0;
    return 1;
}

/* the five operations of collections.<name> and store.<ns> */
static int parse_crud_op(const segment_t *seg, sb_method_op_t *op)
{
    static const sb_method_op_t ops[] = {SB_OP_FIND, SB_OP_FIND_ONE, SB_OP_CREATE, SB_OP_UPDATE, SB_OP_DELETE};
    size_t i;

    for (i = 0; i != sizeof(ops) / sizeof(ops[0]); ++i) {
        if (seg_is(seg, op_names[ops[i]])) {
            *op = ops[i];
            return 1;
        }
    }
    return 0;
}

/* splits on '.', refusing empty segments and more than MAX_SEGMENTS; returns the count or 0 */
static size_t split(const char *s, size_t len, segment_t *segs)
{
    size_t n = 0, start = 0, i;

    for (i = 0; i <= len; ++i) {
        if (i == len || s[i] == '.') {
            if (i == start || n == MAX_SEGMENTS)
                return 0;
            segs[n].p = s + start;
            segs[n].len = i - start;
            ++n;
            start = i + 1;
        }
    }
    return n;
}

sb_status_t sb_method_parse(const char *s, size_t len, sb_method_t *out)
{
    segment_t segs[MAX_SEGMENTS];
    sb_method_t m = {.name = "", .fn = ""};
    size_t n;

    if (s == NULL || len == 0 || len > SB_MAX_METHOD_LEN)
        return SB_E_BAD_METHOD;
    if ((n = split(s, len, segs)) == 0)
        return SB_E_BAD_METHOD;

    if (n == 2) {
        if (seg_is(&segs[0], "files")) {
            m.kind = SB_MK_FILES;
            if (seg_is(&segs[1], "read"))
                m.op = SB_OP_READ;
            else if (seg_is(&segs[1], "write"))
                m.op = SB_OP_WRITE;
            else if (seg_is(&segs[1], "list"))
                m.op = SB_OP_LIST;
            else
                return SB_E_BAD_METHOD;
        } else if (seg_is(&segs[0], "email") && seg_is(&segs[1], "send")) {
            m.kind = SB_MK_EMAIL;
            m.op = SB_OP_SEND;
        } else if (seg_is(&segs[0], "http") && seg_is(&segs[1], "fetch")) {
            m.kind = SB_MK_HTTP;
            m.op = SB_OP_FETCH;
        } else if (seg_is(&segs[0], "import") && seg_is(&segs[1], "fetch")) {
            m.kind = SB_MK_IMPORT;
            m.op = SB_OP_FETCH;
        } else if (seg_is(&segs[0], "tools")) {
            m.kind = SB_MK_TOOLS;
            if (seg_is(&segs[1], "list"))
                m.op = SB_OP_LIST;
            else if (seg_is(&segs[1], "call"))
                m.op = SB_OP_CALL;
            else
                return SB_E_BAD_METHOD;
        } else {
            return SB_E_BAD_METHOD;
        }
    } else if (n == 3) {
        if (seg_is(&segs[0], "collections") || seg_is(&segs[0], "store")) {
            m.kind = seg_is(&segs[0], "store") ? SB_MK_STORE : SB_MK_COLLECTIONS;
            if (!is_name(&segs[1]) || !parse_crud_op(&segs[2], &m.op))
                return SB_E_BAD_METHOD;
            m.name = segs[1].p;
            m.name_len = segs[1].len;
        } else if (seg_is(&segs[0], "globals")) {
            m.kind = SB_MK_GLOBALS;
            if (!is_name(&segs[1]))
                return SB_E_BAD_METHOD;
            if (seg_is(&segs[2], "get"))
                m.op = SB_OP_GET;
            else if (seg_is(&segs[2], "set"))
                m.op = SB_OP_SET;
            else
                return SB_E_BAD_METHOD;
            m.name = segs[1].p;
            m.name_len = segs[1].len;
        } else if (seg_is(&segs[0], "services")) {
            m.kind = SB_MK_SERVICES;
            m.op = SB_OP_CALL;
            if (!is_name(&segs[1]) || !is_name(&segs[2]))
                return SB_E_BAD_METHOD;
            m.name = segs[1].p;
            m.name_len = segs[1].len;
            m.fn = segs[2].p;
            m.fn_len = segs[2].len;
        } else if (seg_is(&segs[0], "jobs") && seg_is(&segs[1], "enqueue")) {
            m.kind = SB_MK_JOBS;
            m.op = SB_OP_ENQUEUE;
            if (!is_name(&segs[2]))
                return SB_E_BAD_METHOD;
            m.name = segs[2].p;
            m.name_len = segs[2].len;
        } else if (seg_is(&segs[0], "workflows") && seg_is(&segs[1], "trigger")) {
            m.kind = SB_MK_WORKFLOWS;
            m.op = SB_OP_TRIGGER;
            if (!is_name(&segs[2]))
                return SB_E_BAD_METHOD;
            m.name = segs[2].p;
            m.name_len = segs[2].len;
        } else {
            return SB_E_BAD_METHOD;
        }
    } else {
        return SB_E_BAD_METHOD;
    }

    *out = m;
    return SB_OK;
}

size_t sb_method_request_cap(const sb_method_t *m)
{
    if (m == NULL)
        return SB_MAX_NATIVE_REQUEST; /* a method that does not parse: refused later, never given more room */
    if (m->kind == SB_MK_HTTP)
        return SB_MAX_RPC_WIRE;
    if (m->kind == SB_MK_TOOLS)
        return m->op == SB_OP_LIST ? SB_MAX_TOOLS_LIST_REQUEST : SB_MAX_TOOLS_CALL_REQUEST;
    return SB_MAX_NATIVE_REQUEST;
}

size_t sb_method_response_cap(const sb_method_t *m)
{
    /* a module answers in one response, like a fetch: up to the per-module cap (PROTOCOL.md section 6c) */
    return m->kind == SB_MK_HTTP || m->kind == SB_MK_IMPORT ? SB_MAX_RPC_WIRE : SB_MAX_NATIVE_RESPONSE;
}

size_t sb_method_request_cap_str(const char *s, size_t len)
{
    sb_method_t m;

    return sb_method_request_cap(sb_method_parse(s, len, &m) == SB_OK ? &m : NULL);
}

const char *sb_method_op_name(sb_method_op_t op)
{
    return (unsigned)op < SB_OP_COUNT_ ? op_names[op] : "unknown";
}

const char *sb_method_kind_name(sb_method_kind_t kind)
{
    return (unsigned)kind < SB_MK_COUNT_ ? kind_names[kind] : "unknown";
}
