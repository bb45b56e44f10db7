/*
 * Unit tests for proto/method.c: the method grammar and the per-method caps.
 */
#include <string.h>
#include "tap.h"
#include "sb/limits.h"
#include "sb/method.h"

static const struct {
    const char *s;
    sb_method_kind_t kind;
    sb_method_op_t op;
    const char *name, *fn;
} accept[] = {
    {"files.read", SB_MK_FILES, SB_OP_READ, "", ""},
    {"files.write", SB_MK_FILES, SB_OP_WRITE, "", ""},
    {"files.list", SB_MK_FILES, SB_OP_LIST, "", ""},
    {"collections.posts.find", SB_MK_COLLECTIONS, SB_OP_FIND, "posts", ""},
    {"collections.posts.findOne", SB_MK_COLLECTIONS, SB_OP_FIND_ONE, "posts", ""},
    {"collections.posts.create", SB_MK_COLLECTIONS, SB_OP_CREATE, "posts", ""},
    {"collections.posts.update", SB_MK_COLLECTIONS, SB_OP_UPDATE, "posts", ""},
    {"collections.posts.delete", SB_MK_COLLECTIONS, SB_OP_DELETE, "posts", ""},
    {"collections.document_store.find", SB_MK_COLLECTIONS, SB_OP_FIND, "document_store", ""},
    {"collections.__proto__.find", SB_MK_COLLECTIONS, SB_OP_FIND, "__proto__", ""},
    {"collections.A-z_09.find", SB_MK_COLLECTIONS, SB_OP_FIND, "A-z_09", ""},
    {"collections.files.find", SB_MK_COLLECTIONS, SB_OP_FIND, "files", ""},
    {"store.notes.find", SB_MK_STORE, SB_OP_FIND, "notes", ""},
    {"store.notes.findOne", SB_MK_STORE, SB_OP_FIND_ONE, "notes", ""},
    {"store.notes.create", SB_MK_STORE, SB_OP_CREATE, "notes", ""},
    {"store.notes.update", SB_MK_STORE, SB_OP_UPDATE, "notes", ""},
    {"store.notes.delete", SB_MK_STORE, SB_OP_DELETE, "notes", ""},
    {"globals.site.get", SB_MK_GLOBALS, SB_OP_GET, "site", ""},
    {"globals.site.set", SB_MK_GLOBALS, SB_OP_SET, "site", ""},
    {"services.billing.charge", SB_MK_SERVICES, SB_OP_CALL, "billing", "charge"},
    {"services.a.b", SB_MK_SERVICES, SB_OP_CALL, "a", "b"},
    {"jobs.enqueue.send-mail", SB_MK_JOBS, SB_OP_ENQUEUE, "send-mail", ""},
    {"workflows.trigger.onboard", SB_MK_WORKFLOWS, SB_OP_TRIGGER, "onboard", ""},
    {"email.send", SB_MK_EMAIL, SB_OP_SEND, "", ""},
    {"http.fetch", SB_MK_HTTP, SB_OP_FETCH, "", ""},
    {"tools.list", SB_MK_TOOLS, SB_OP_LIST, "", ""},
    {"tools.call", SB_MK_TOOLS, SB_OP_CALL, "", ""},
    {"import.fetch", SB_MK_IMPORT, SB_OP_FETCH, "", ""},
};

static const char *const reject[] = {
    "",
    "import",
    "import.get",
    "import.fetch.x",
    "Import.fetch",
    ".",
    "files",
    "files.",
    ".files.read",
    "files.read.",
    "files..read",
    "files.read.x",
    "files.delete",
    "Files.read",
    "files.READ",
    "files.read ",
    " files.read",
    "collections.posts",
    "collections.posts.find.x",
    "collections..find",
    "collections.posts.findone",
    "collections.posts.get",
    "collections.po sts.find",
    "collections.po.st.find",
    "collections.pösts.find",
    "collections.posts$.find",
    "collections.posts.find\n",
    "store.notes",
    "store.notes.get",
    "store..find",
    "globals.site.read",
    "globals.site",
    "globals..get",
    "services.billing",
    "services.billing.",
    "services.billing.ch@rge",
    "services.billing.charge.x",
    "jobs.enqueue",
    "jobs.run.x",
    "jobs.enqueue.x.y",
    "jobs.enqueue.a b",
    "workflows.trigger",
    "workflows.start.x",
    "email.sendAll",
    "email",
    "http.get",
    "http.fetch.x",
    "tools.run",
    "tools.list.x",
    "knowledge.read",
    "unknown.method",
};

static void test_accept(void)
{
    size_t i;

    for (i = 0; i != sizeof(accept) / sizeof(accept[0]); ++i) {
        sb_method_t m;
        sb_status_t st = sb_method_parse(accept[i].s, strlen(accept[i].s), &m);
        is_int(st, SB_OK, "parse \"%s\"", accept[i].s);
        if (st != SB_OK)
            continue;
        is_int(m.kind, accept[i].kind, "kind of \"%s\"", accept[i].s);
        is_int(m.op, accept[i].op, "op of \"%s\"", accept[i].s);
        ok(m.name_len == strlen(accept[i].name) && memcmp(m.name, accept[i].name, m.name_len) == 0, "name of \"%s\"", accept[i].s);
        ok(m.fn_len == strlen(accept[i].fn) && memcmp(m.fn, accept[i].fn, m.fn_len) == 0, "fn of \"%s\"", accept[i].s);
    }
}

static void test_reject(void)
{
    size_t i;

    for (i = 0; i != sizeof(reject) / sizeof(reject[0]); ++i) {
        sb_method_t m;
        is_int(sb_method_parse(reject[i], strlen(reject[i]), &m), SB_E_BAD_METHOD, "reject \"%s\"", reject[i]);
    }
}

static void test_bytes(void)
{
    sb_method_t m;
    char buf[600];
    size_t n;

    /* an embedded NUL is not a name character, and the length is authoritative */
    is_int(sb_method_parse("files.read\0x", 12, &m), SB_E_BAD_METHOD, "embedded NUL refused");
    is_int(sb_method_parse("files.readx", 10, &m), SB_OK, "length bounds the string (not NUL)");
    is_int(sb_method_parse("http.fetch\x80", 11, &m), SB_E_BAD_METHOD, "non-ASCII byte refused");
    is_int(sb_method_parse(NULL, 0, &m), SB_E_BAD_METHOD, "NULL refused");

    /* names: 1..128 */
    memcpy(buf, "collections.", 12);
    memset(buf + 12, 'a', 128);
    memcpy(buf + 140, ".find", 5);
    is_int(sb_method_parse(buf, 145, &m), SB_OK, "128-byte name accepted");
    is_int(m.name_len, 128, "128-byte name length");
    memcpy(buf, "collections.", 12);
    memset(buf + 12, 'a', 129);
    memcpy(buf + 141, ".find", 5);
    is_int(sb_method_parse(buf, 146, &m), SB_E_BAD_METHOD, "129-byte name refused");

    /* method length: at most SB_MAX_METHOD_LEN; services.<128>.<117> is exactly 256 */
    n = 0;
    memcpy(buf, "services.", 9);
    n = 9;
    memset(buf + n, 'a', 128);
    n += 128;
    buf[n++] = '.';
    memset(buf + n, 'b', 118);
    n += 118;
    is_int(n, SB_MAX_METHOD_LEN, "constructed a 256-byte method");
    is_int(sb_method_parse(buf, n, &m), SB_OK, "256-byte method accepted");
    buf[n++] = 'b';
    is_int(sb_method_parse(buf, n, &m), SB_E_BAD_METHOD, "257-byte method refused");
    is_int(sb_method_parse(buf, 1000, &m), SB_E_BAD_METHOD, "over-long length refused without reading");
}

static void test_caps(void)
{
    static const struct {
        const char *s;
        size_t req, resp;
    } caps[] = {
        {"http.fetch", SB_MAX_RPC_WIRE, SB_MAX_RPC_WIRE},
        {"tools.call", SB_MAX_TOOLS_CALL_REQUEST, SB_MAX_NATIVE_RESPONSE},
        {"tools.list", SB_MAX_TOOLS_LIST_REQUEST, SB_MAX_NATIVE_RESPONSE},
        {"files.read", SB_MAX_NATIVE_REQUEST, SB_MAX_NATIVE_RESPONSE},
        {"collections.a.create", SB_MAX_NATIVE_REQUEST, SB_MAX_NATIVE_RESPONSE},
        {"store.a.find", SB_MAX_NATIVE_REQUEST, SB_MAX_NATIVE_RESPONSE},
        {"services.a.b", SB_MAX_NATIVE_REQUEST, SB_MAX_NATIVE_RESPONSE},
        {"email.send", SB_MAX_NATIVE_REQUEST, SB_MAX_NATIVE_RESPONSE},
    };
    size_t i;

    for (i = 0; i != sizeof(caps) / sizeof(caps[0]); ++i) {
        sb_method_t m;
        if (sb_method_parse(caps[i].s, strlen(caps[i].s), &m) != SB_OK) {
            ok(0, "parse %s", caps[i].s);
            continue;
        }
        is_int(sb_method_request_cap(&m), caps[i].req, "request cap of %s", caps[i].s);
        is_int(sb_method_response_cap(&m), caps[i].resp, "response cap of %s", caps[i].s);
        is_int(sb_method_request_cap_str(caps[i].s, strlen(caps[i].s)), caps[i].req, "request cap (string) of %s", caps[i].s);
    }
    is_int(sb_method_request_cap(&(sb_method_t){.kind = SB_MK_HTTP, .op = SB_OP_FETCH}), 7121580, "http.fetch cap value");
    is_int(sb_method_request_cap(&(sb_method_t){.kind = SB_MK_IMPORT, .op = SB_OP_FETCH}), SB_MAX_NATIVE_REQUEST,
           "import.fetch request cap: a URL");
    is_int(sb_method_response_cap(&(sb_method_t){.kind = SB_MK_IMPORT, .op = SB_OP_FETCH}), 7121580,
           "import.fetch response cap: a module");
    is_int(sb_method_request_cap_str("http.fetch.x", 12), SB_MAX_NATIVE_REQUEST, "unparseable: native cap");
    is_int(sb_method_request_cap_str("", 0), SB_MAX_NATIVE_REQUEST, "empty: native cap");
    is_int(sb_method_request_cap_str("tools.lis", 9), SB_MAX_NATIVE_REQUEST, "near miss: native cap");
    is_int(sb_method_request_cap(NULL), SB_MAX_NATIVE_REQUEST, "no parsed method: native cap");
}

static void test_names(void)
{
    static const char *const ops[SB_OP_COUNT_] = {"read", "write", "list", "find",    "findOne", "create", "update", "delete",
                                                  "get",  "set",   "call", "enqueue", "trigger", "send",   "fetch"};
    static const char *const kinds[SB_MK_COUNT_] = {"files",     "collections", "store", "globals", "services", "jobs",
                                                    "workflows", "email",       "http",  "tools",   "import"};
    int i;

    for (i = 0; i != SB_OP_COUNT_; ++i)
        is_str(sb_method_op_name((sb_method_op_t)i), ops[i], "op name %d", i);
    for (i = 0; i != SB_MK_COUNT_; ++i)
        is_str(sb_method_kind_name((sb_method_kind_t)i), kinds[i], "kind name %d", i);
    is_str(sb_method_op_name(SB_OP_COUNT_), "unknown", "op name out of range");
    is_str(sb_method_kind_name(SB_MK_COUNT_), "unknown", "kind name out of range");
}

int main(void)
{
    test_accept();
    test_reject();
    test_bytes();
    test_caps();
    test_names();
    return done_testing();
}
