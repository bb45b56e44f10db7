/*
 * libFuzzer driver for broker/authz: the capability manifest parser
 * (sb_manifest_parse) and the per-call check (sb_authz_check), on the typed
 * call the route builds (sb_call_decode, then the check).
 *
 * Input: JSON text, then optionally a NUL byte and up to five NUL-separated
 * strings: path, url, tool name, store namespace, method. The text goes
 * through json_loadb and sb_manifest_parse; a parsed manifest is checked
 * against a fixed list of methods (plus the fifth string, when it parses)
 * with args built from the strings, with no args, and with ambiguous args.
 *
 * Properties:
 *  - a refusal is SB_E_BAD_ARGS with a printable, NUL-terminated message and
 *    no manifest; SB_E_NOMEM never happens on small input;
 *  - sb_authz_check answers SB_OK, SB_E_FORBIDDEN or SB_E_BAD_ARGS, with a
 *    printable reason on refusal, and answers the same way twice;
 *  - deny by default: the empty manifest grants nothing, email.send is never
 *    granted, ambiguous (duplicate-key) args never pass;
 *  - files.read/write are only granted for a path sb_path_normalize accepts,
 *    and a URL sb_url_parse rejects is never granted for http.fetch;
 *  - decide rules (capabilities.decide): whether a call needs a decision is
 *    deterministic, and never so in a manifest without decide rules.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <msgpack.h>
#include "sb/method.h"
#include "sb/limits.h"
#include "authz/authz.h"
#include "call/call.h"
#include "call/path.h"
#include "call/url.h"
#include "fuzz.h"

enum { S_PATH, S_URL, S_NAME, S_NS, S_METHOD, S_COUNT };

typedef struct st_str_t {
    const char *p;
    size_t len;
    int present;
} str_t;

static const char *const methods[] = {
    "files.read",
    "files.write",
    "files.list",
    "collections.posts.find",
    "collections.posts.create",
    "collections.posts.delete",
    "collections.__proto__.find",
    "collections.document_store.find",
    "collections.document_store.findOne",
    "collections.document_store.create",
    "collections.document_store.update",
    "store.notes.findOne",
    "store.notes.delete",
    "globals.site.get",
    "globals.site.set",
    "services.billing.charge",
    "jobs.enqueue.mail",
    "workflows.trigger.onboard",
    "email.send",
    "http.fetch",
    "tools.list",
    "tools.call",
};

static int printable(const char *s, size_t bufsz)
{
    size_t n = strnlen(s, bufsz);

    if (n == bufsz)
        return 0; /* not NUL-terminated */
    for (size_t i = 0; i < n; ++i)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
            return 0;
    return 1;
}

static void pack_str(msgpack_packer *pk, const str_t *s)
{
    if (s->present)
        msgpack_pack_str_with_body(pk, s->p, s->len);
    else
        msgpack_pack_nil(pk);
}

/* {path, url, name, where: {store: ns}, data: {store: ns}, store: ns}, or with every key twice when `dup` */
static void pack_args(msgpack_sbuffer *sb, const str_t *s, int dup)
{
    msgpack_packer pk;
    int copies = dup ? 2 : 1;

    msgpack_sbuffer_clear(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, (size_t)(6 * copies));
    for (int c = 0; c < copies; ++c) {
        msgpack_pack_str_with_body(&pk, "path", 4);
        pack_str(&pk, &s[S_PATH]);
        msgpack_pack_str_with_body(&pk, "url", 3);
        pack_str(&pk, &s[S_URL]);
        msgpack_pack_str_with_body(&pk, "name", 4);
        pack_str(&pk, &s[S_NAME]);
        msgpack_pack_str_with_body(&pk, "where", 5);
        if (s[S_NS].len % 2 == 0) {
            msgpack_pack_map(&pk, 1);
            msgpack_pack_str_with_body(&pk, "store", 5);
            pack_str(&pk, &s[S_NS]);
        } else {
            /* the {"store": {"equals": ns}} form */
            msgpack_pack_map(&pk, 1);
            msgpack_pack_str_with_body(&pk, "store", 5);
            msgpack_pack_map(&pk, 1);
            msgpack_pack_str_with_body(&pk, "equals", 6);
            pack_str(&pk, &s[S_NS]);
        }
        msgpack_pack_str_with_body(&pk, "data", 4);
        msgpack_pack_map(&pk, 1);
        msgpack_pack_str_with_body(&pk, "store", 5);
        pack_str(&pk, &s[S_NS]);
        /* upstream's document-store create: {...doc, store: ns} */
        msgpack_pack_str_with_body(&pk, "store", 5);
        pack_str(&pk, &s[S_NS]);
    }
}

static sb_status_t check(const sb_manifest_t *m, const sb_method_t *meth, const msgpack_object *args)
{
    char reason[160], again[160];
    sb_status_t st, st2;
    msgpack_zone zone;
    sb_call_t call, *c = &call;

    msgpack_zone_init(&zone, 1024);
    (void)sb_call_decode(&call, meth, "fuzz.method", 11, args, 0, &zone);
    memset(reason, 0x7f, sizeof(reason));
    st = sb_authz_check(m, c, reason, sizeof(reason));
    SB_FUZZ_ASSERT(st == SB_OK || st == SB_E_FORBIDDEN || st == SB_E_BAD_ARGS, "sb_authz_check status %d", (int)st);
    SB_FUZZ_ASSERT(printable(reason, sizeof(reason)), "reason not printable or not terminated");
    SB_FUZZ_ASSERT(st == SB_OK || reason[0] != '\0', "refusal %d without a reason", (int)st);
    st2 = sb_authz_check(m, c, again, sizeof(again));
    SB_FUZZ_ASSERT(st == st2 && strcmp(reason, again) == 0, "sb_authz_check is not deterministic");
    /* a tiny reason buffer is still terminated */
    st2 = sb_authz_check(m, c, again, 3);
    SB_FUZZ_ASSERT(st == st2 && strnlen(again, 3) < 3, "reason buffer of 3 bytes");
    SB_FUZZ_ASSERT(sb_authz_check(m, c, NULL, 0) == st, "NULL reason buffer");
    {
        int nd = sb_authz_needs_decision(m, c);
        SB_FUZZ_ASSERT(nd == 0 || nd == 1, "sb_authz_needs_decision answered %d", nd);
        SB_FUZZ_ASSERT(nd == sb_authz_needs_decision(m, c), "sb_authz_needs_decision is not deterministic");
        SB_FUZZ_ASSERT(!nd || sb_authz_has_decide(m), "a decision needed without any decide rule");
    }
    msgpack_zone_destroy(&zone);
    return st;
}

static void check_method(const sb_manifest_t *m, const sb_manifest_t *empty, const sb_method_t *meth, const msgpack_object *args,
                         const msgpack_object *dup_args, const str_t *s)
{
    sb_status_t st = check(m, meth, args);
    char norm[SB_MAX_PATH + 1];

    SB_FUZZ_ASSERT(check(empty, meth, args) != SB_OK, "the empty manifest granted %s", sb_method_kind_name(meth->kind));
    SB_FUZZ_ASSERT(check(NULL, meth, args) == SB_E_FORBIDDEN, "no manifest must be forbidden");
    if (meth->kind == SB_MK_EMAIL)
        SB_FUZZ_ASSERT(st == SB_E_FORBIDDEN, "email.send granted");
    if (st == SB_OK && meth->kind == SB_MK_FILES && meth->op != SB_OP_LIST)
        SB_FUZZ_ASSERT(s[S_PATH].present && sb_path_normalize(s[S_PATH].p, s[S_PATH].len, norm, sizeof(norm)) == SB_OK,
                       "files granted for an unsafe path");
    if (st == SB_OK && meth->kind == SB_MK_FILES && meth->op == SB_OP_LIST && s[S_PATH].present)
        SB_FUZZ_ASSERT(sb_path_normalize(s[S_PATH].p, s[S_PATH].len, norm, sizeof(norm)) == SB_OK,
                       "files.list granted for an unsafe path");
    if (meth->kind == SB_MK_HTTP && st == SB_OK) {
        sb_url_t u;
        SB_FUZZ_ASSERT(s[S_URL].present && sb_url_parse(s[S_URL].p, s[S_URL].len, &u, NULL) == SB_OK, "a rejected URL was granted");
    }
    /* the same call with every arg twice: never granted when the decision reads an arg */
    st = check(m, meth, dup_args);
    if (meth->kind == SB_MK_FILES && meth->op != SB_OP_LIST)
        SB_FUZZ_ASSERT(st != SB_OK, "files granted with duplicate path keys");
    if (meth->kind == SB_MK_HTTP)
        SB_FUZZ_ASSERT(st != SB_OK, "http.fetch granted with duplicate url keys");
    /* and without args */
    st = check(m, meth, NULL);
    if (meth->kind == SB_MK_HTTP || (meth->kind == SB_MK_FILES && meth->op != SB_OP_LIST))
        SB_FUZZ_ASSERT(st != SB_OK, "granted without args");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul != NULL ? (size_t)(nul - data) : size;
    str_t s[S_COUNT];
    json_t *root;
    json_error_t jerr;
    sb_manifest_t *m = NULL, *empty = NULL;
    char err[256];
    sb_status_t st;
    size_t interned;

    if (size > 65536)
        return 0;
    memset(s, 0, sizeof(s));
    if (nul != NULL) {
        const char *p = (const char *)nul + 1, *end = (const char *)data + size;
        for (int i = 0; i < S_COUNT && p <= end; ++i) {
            const char *q = memchr(p, 0, (size_t)(end - p));
            s[i].p = p;
            s[i].len = q != NULL ? (size_t)(q - p) : (size_t)(end - p);
            s[i].present = 1;
            p += s[i].len + 1;
        }
    }

    root = json_loadb((const char *)data, jlen, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (root == NULL)
        return 0;
    memset(err, 0x7f, sizeof(err));
    interned = sb_manifest_interned_count();
    st = sb_manifest_parse(root, &m, err, sizeof(err));
    if (st == SB_OK) {
        /* manifests are interned: the same input again is the same object */
        sb_manifest_t *again = NULL;
        SB_FUZZ_ASSERT(sb_manifest_parse(root, &again, err, sizeof(err)) == SB_OK && again == m, "a second parse is not shared");
        sb_manifest_free(again);
    }
    json_decref(root);
    if (st != SB_OK) {
        SB_FUZZ_ASSERT(st == SB_E_BAD_ARGS, "sb_manifest_parse status %d (%s)", (int)st, err);
        SB_FUZZ_ASSERT(m == NULL, "refused manifest returned anyway");
        SB_FUZZ_ASSERT(printable(err, sizeof(err)) && err[0] != '\0', "error message not printable or empty");
        return 0;
    }
    SB_FUZZ_ASSERT(m != NULL, "SB_OK without a manifest");
    {
        int64_t t = sb_manifest_timeout_ms(m);
        SB_FUZZ_ASSERT(t == -1 || (t >= 1 && t <= 86400000), "timeoutMs %lld", (long long)t);
    }
    SB_FUZZ_ASSERT(sb_manifest_parse(NULL, &empty, err, sizeof(err)) == SB_OK && empty != NULL, "the empty manifest");

    {
        msgpack_sbuffer sb1, sb2;
        msgpack_zone z;
        msgpack_object args, dup_args;
        size_t off = 0;
        sb_method_t meth;

        msgpack_sbuffer_init(&sb1);
        msgpack_sbuffer_init(&sb2);
        msgpack_zone_init(&z, 1024);
        pack_args(&sb1, s, 0);
        pack_args(&sb2, s, 1);
        SB_FUZZ_ASSERT(msgpack_unpack(sb1.data, sb1.size, &off, &z, &args) == MSGPACK_UNPACK_SUCCESS, "args unpack");
        off = 0;
        SB_FUZZ_ASSERT(msgpack_unpack(sb2.data, sb2.size, &off, &z, &dup_args) == MSGPACK_UNPACK_SUCCESS, "dup args unpack");

        for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); ++i) {
            SB_FUZZ_ASSERT(sb_method_parse(methods[i], strlen(methods[i]), &meth) == SB_OK, "fixed method %s", methods[i]);
            check_method(m, empty, &meth, &args, &dup_args, s);
        }
        if (s[S_METHOD].present && sb_method_parse(s[S_METHOD].p, s[S_METHOD].len, &meth) == SB_OK)
            check_method(m, empty, &meth, &args, &dup_args, s);
        /* args that are not a map */
        (void)check(m, &meth, &args.via.map.ptr[0].key);

        msgpack_zone_destroy(&z);
        msgpack_sbuffer_destroy(&sb1);
        msgpack_sbuffer_destroy(&sb2);
    }
    sb_manifest_free(m);
    sb_manifest_free(empty);
    SB_FUZZ_ASSERT(sb_manifest_interned_count() == interned, "a manifest outlived its last reference");
    return 0;
}
