/*
 * libFuzzer driver for proto/method.c (sb_method_parse and the per-method
 * caps), the grammar both the broker and the shim rely on.
 *
 * Input: byte 0 == 0xff selects the structured mode (the rest picks a kind,
 * an op and names, we build the method string and it must parse back to
 * exactly that); anything else is a raw method string.
 *
 * Properties of every accepted method:
 *  - kind and op are in range, name and fn point into the input;
 *  - printing it back (kind, op, name, fn) gives exactly the input: the
 *    grammar has one spelling per method, so no two strings mean the same;
 *  - names are [A-Za-z0-9_-]{1,128}; the string is at most SB_MAX_METHOD_LEN;
 *  - the caps agree (request_cap_str == request_cap of the parse).
 * Every refused string gets SB_MAX_NATIVE_REQUEST from request_cap_str.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sb/limits.h"
#include "sb/method.h"
#include "fuzz.h"

static int is_name(const char *s, size_t n)
{
    if (n == 0 || n > 128)
        return 0;
    for (size_t i = 0; i < n; ++i) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* the method string of a parsed method; returns its length */
static size_t print(const sb_method_t *m, char *buf, size_t bufsz)
{
    const char *op = sb_method_op_name(m->op), *kind = sb_method_kind_name(m->kind);
    int n;

    switch (m->kind) {
    case SB_MK_FILES:
    case SB_MK_EMAIL:
    case SB_MK_HTTP:
    case SB_MK_TOOLS:
    case SB_MK_IMPORT:
        n = snprintf(buf, bufsz, "%s.%s", kind, op);
        break;
    case SB_MK_COLLECTIONS:
    case SB_MK_STORE:
    case SB_MK_GLOBALS:
        n = snprintf(buf, bufsz, "%s.%.*s.%s", kind, (int)m->name_len, m->name, op);
        break;
    case SB_MK_SERVICES:
        n = snprintf(buf, bufsz, "services.%.*s.%.*s", (int)m->name_len, m->name, (int)m->fn_len, m->fn);
        break;
    case SB_MK_JOBS:
        n = snprintf(buf, bufsz, "jobs.enqueue.%.*s", (int)m->name_len, m->name);
        break;
    case SB_MK_WORKFLOWS:
        n = snprintf(buf, bufsz, "workflows.trigger.%.*s", (int)m->name_len, m->name);
        break;
    default:
        n = 0;
        break;
    }
    return n < 0 ? 0 : (size_t)n;
}

static void check(const char *s, size_t len)
{
    sb_method_t m;
    char buf[600];
    size_t n, cap;
    sb_status_t st = sb_method_parse(s, len, &m);

    if (st != SB_OK) {
        SB_FUZZ_ASSERT(st == SB_E_BAD_METHOD, "status %d", (int)st);
        SB_FUZZ_ASSERT(sb_method_request_cap_str(s, len) == SB_MAX_NATIVE_REQUEST, "cap of a refused method");
        return;
    }
    SB_FUZZ_ASSERT(len >= 1 && len <= SB_MAX_METHOD_LEN, "accepted %zu bytes", len);
    SB_FUZZ_ASSERT((unsigned)m.kind < SB_MK_COUNT_ && (unsigned)m.op < SB_OP_COUNT_, "kind %d op %d", (int)m.kind, (int)m.op);
    if (m.name_len != 0) {
        SB_FUZZ_ASSERT(m.name >= s && m.name + m.name_len <= s + len, "name outside the input");
        SB_FUZZ_ASSERT(is_name(m.name, m.name_len), "bad name");
    }
    if (m.fn_len != 0) {
        SB_FUZZ_ASSERT(m.fn >= s && m.fn + m.fn_len <= s + len, "fn outside the input");
        SB_FUZZ_ASSERT(is_name(m.fn, m.fn_len), "bad fn");
    }
    SB_FUZZ_ASSERT((m.fn_len != 0) == (m.kind == SB_MK_SERVICES), "fn only for services");
    n = print(&m, buf, sizeof(buf));
    SB_FUZZ_ASSERT(n == len && memcmp(buf, s, len) == 0, "\"%.*s\" parsed, prints back as \"%.*s\"", (int)len, s, (int)n, buf);

    cap = sb_method_request_cap(&m);
    SB_FUZZ_ASSERT(cap == sb_method_request_cap_str(s, len), "cap_str disagrees");
    SB_FUZZ_ASSERT(cap == SB_MAX_NATIVE_REQUEST || cap == SB_MAX_TOOLS_CALL_REQUEST || cap == SB_MAX_TOOLS_LIST_REQUEST ||
                       cap == SB_MAX_RPC_WIRE,
                   "request cap %zu", cap);
    SB_FUZZ_ASSERT((cap == SB_MAX_RPC_WIRE) == (m.kind == SB_MK_HTTP), "only http.fetch has the wire cap");
    SB_FUZZ_ASSERT(sb_method_response_cap(&m) ==
                       (m.kind == SB_MK_HTTP || m.kind == SB_MK_IMPORT ? SB_MAX_RPC_WIRE : SB_MAX_NATIVE_RESPONSE),
                   "response cap");
}

/* structured mode: build a method from the input and require the parse to give it back */
static void structured(const uint8_t *d, size_t n)
{
    static const char *const shapes[] = {
        "files.read",
        "files.write",
        "files.list",
        "email.send",
        "http.fetch",
        "tools.list",
        "tools.call",
        "collections.%s.find",
        "collections.%s.findOne",
        "collections.%s.create",
        "collections.%s.update",
        "collections.%s.delete",
        "store.%s.find",
        "store.%s.delete",
        "globals.%s.get",
        "globals.%s.set",
        "services.%s.%s",
        "jobs.enqueue.%s",
        "workflows.trigger.%s",
    };
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-";
    char name[200], fn[200], buf[600];
    size_t nl, fl, k = 0;
    const char *shape;
    int len;
    sb_method_t m;

    if (n < 3)
        return;
    shape = shapes[d[0] % (sizeof(shapes) / sizeof(shapes[0]))];
    nl = 1 + d[1] % 140;
    fl = 1 + d[2] % 140;
    d += 3, n -= 3;
    for (size_t i = 0; i < nl; ++i)
        name[i] = alphabet[(k < n ? d[k++] : i) % 64];
    for (size_t i = 0; i < fl; ++i)
        fn[i] = alphabet[(k < n ? d[k++] : i * 7) % 64];
    name[nl] = fn[fl] = '\0';
    if (strstr(shape, "%s.%s") != NULL)
        len = snprintf(buf, sizeof(buf), "services.%s.%s", name, fn);
    else if (strstr(shape, "%s") != NULL)
        len = snprintf(buf, sizeof(buf), shape, name);
    else
        len = snprintf(buf, sizeof(buf), "%s", shape);
    {
        sb_status_t st = sb_method_parse(buf, (size_t)len, &m);
        /* names longer than 128 or a string longer than 256 are the only refusals */
        int valid = nl <= 128 && fl <= 128 && (size_t)len <= SB_MAX_METHOD_LEN;
        if (strstr(shape, "%s") == NULL)
            valid = 1;
        else if (strstr(shape, "%s.%s") == NULL)
            valid = nl <= 128 && (size_t)len <= SB_MAX_METHOD_LEN;
        SB_FUZZ_ASSERT((st == SB_OK) == valid, "built \"%s\": status %d, expected %s", buf, (int)st, valid ? "ok" : "refusal");
    }
    check(buf, (size_t)len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s;

    if (size >= 1 && data[0] == 0xff) {
        structured(data + 1, size - 1);
        return 0;
    }
    /* an exact-size copy: the parser must not read past `size` (it need not be NUL-terminated) */
    if ((s = calloc(1, size != 0 ? size : 1)) == NULL)
        abort();
    if (size != 0)
        memcpy(s, data, size);
    check(s, size);
    free(s);
    return 0;
}
