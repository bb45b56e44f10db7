/*
 * Unit tests for broker/authz/check.c: the per-call capability check, with
 * exact statuses and exact reasons (the table at the top of check.c), on the
 * typed call as the route builds it (sb_call_decode, then sb_authz_check).
 *
 * Arguments are real msgpack objects: each test writes them as JSON for
 * readability, the helper packs that with msgpack_packer and reads it back
 * with msgpack_unpack, exactly as the RPC route will hand them over. Cases
 * JSON cannot express (duplicate keys, bin keys and values) are packed by hand.
 */
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "sb/limits.h"
#include "sb/method.h"
#include "authz/authz.h"
#include "call/call.h"

/* ---- msgpack argument helpers -------------------------------------------------------------------------------------- */

#define MAX_ARGS 512
static msgpack_unpacked unpacked[MAX_ARGS];
/* msgpack_unpack_next does not copy str/bin bodies: objects point into the packed bytes, so keep them */
static char *packed[MAX_ARGS];
static size_t nunpacked;

static void pack_json(msgpack_packer *pk, const json_t *j)
{
    const char *key;
    size_t klen, i;
    json_t *v;

    switch (json_typeof(j)) {
    case JSON_OBJECT:
        msgpack_pack_map(pk, json_object_size(j));
        json_object_keylen_foreach((json_t *)j, key, klen, v)
        {
            msgpack_pack_str_with_body(pk, key, klen);
            pack_json(pk, v);
        }
        break;
    case JSON_ARRAY:
        msgpack_pack_array(pk, json_array_size(j));
        for (i = 0; i != json_array_size(j); ++i)
            pack_json(pk, json_array_get(j, i));
        break;
    case JSON_STRING:
        msgpack_pack_str_with_body(pk, json_string_value(j), json_string_length(j));
        break;
    case JSON_INTEGER:
        msgpack_pack_int64(pk, json_integer_value(j));
        break;
    case JSON_REAL:
        msgpack_pack_double(pk, json_real_value(j));
        break;
    case JSON_TRUE:
        msgpack_pack_true(pk);
        break;
    case JSON_FALSE:
        msgpack_pack_false(pk);
        break;
    case JSON_NULL:
        msgpack_pack_nil(pk);
        break;
    }
}

/* unpacks a packed buffer; the object lives until the end of the test */
static const msgpack_object *args_raw(const char *buf, size_t len)
{
    msgpack_unpacked *up;
    size_t off = 0;

    if (nunpacked == MAX_ARGS) {
        printf("# out of argument slots\n");
        exit(1);
    }
    packed[nunpacked] = malloc(len);
    memcpy(packed[nunpacked], buf, len);
    up = &unpacked[nunpacked];
    buf = packed[nunpacked++];
    msgpack_unpacked_init(up);
    if (msgpack_unpack_next(up, buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len) {
        printf("# bad test msgpack\n");
        exit(1);
    }
    return &up->data;
}

/* JSON text -> msgpack -> msgpack_object; NULL text means absent args */
static const msgpack_object *args(const char *text)
{
    msgpack_sbuffer sbuf;
    msgpack_packer pk;
    json_error_t jerr;
    json_t *j;
    const msgpack_object *o;

    if (text == NULL)
        return NULL;
    if ((j = json_loads(text, JSON_DECODE_ANY, &jerr)) == NULL) {
        printf("# bad test JSON %s: %s\n", text, jerr.text);
        exit(1);
    }
    msgpack_sbuffer_init(&sbuf);
    msgpack_packer_init(&pk, &sbuf, msgpack_sbuffer_write);
    pack_json(&pk, j);
    o = args_raw(sbuf.data, sbuf.size);
    msgpack_sbuffer_destroy(&sbuf);
    json_decref(j);
    return o;
}

/* a packed literal, without its terminating NUL */
#define RAW(lit) args_raw(lit, sizeof(lit) - 1)

static void free_args(void)
{
    size_t i;

    for (i = 0; i != nunpacked; ++i) {
        msgpack_unpacked_destroy(&unpacked[i]);
        free(packed[i]);
    }
    nunpacked = 0;
}

static sb_manifest_t *manifest(const char *text)
{
    json_error_t jerr;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &jerr);
    sb_manifest_t *m = NULL;
    char err[256];

    if (j == NULL || sb_manifest_parse(j, &m, err, sizeof(err)) != SB_OK) {
        printf("# bad test manifest %s: %s\n", text, j == NULL ? jerr.text : err);
        exit(1);
    }
    json_decref(j);
    return m;
}

/* ---- the check, one line per case ---------------------------------------------------------------------------------- */

#define OK_ SB_OK, ""
#define FORBIDDEN(r) SB_E_FORBIDDEN, r
#define BAD_ARGS(r) SB_E_BAD_ARGS, r

static void expect_obj(const sb_manifest_t *m, const char *label, const char *method, const msgpack_object *a, sb_status_t want,
                       const char *reason)
{
    sb_method_t meth;
    sb_call_t call;
    msgpack_zone zone;
    char got[512] = "(untouched)";
    sb_status_t st;

    if (sb_method_parse(method, strlen(method), &meth) != SB_OK) {
        ok(0, "%s: method %s parses", label, method);
        return;
    }
    /* as the route runs it: decode once, check the typed call */
    msgpack_zone_init(&zone, 1024);
    (void)sb_call_decode(&call, &meth, method, strlen(method), a, 0, &zone);
    st = sb_authz_check(m, &call, got, sizeof(got));
    is_int(st, want, "%s %s", method, label);
    is_str(got, reason, "  reason");
    msgpack_zone_destroy(&zone);
}

static void expect(const sb_manifest_t *m, const char *method, const char *args_json, sb_status_t want, const char *reason)
{
    expect_obj(m, args_json != NULL ? args_json : "(no args)", method, args(args_json), want, reason);
}

static const char full_manifest[] =
    "{"
    " \"net\": [\"example.com\", \"API.example.org:8443\", \"*.cdn.example\", \"*.ports.example:444\","
    "          \"[2001:db8::1]:443\", \"::2\", \"1.2.3.4\", \"[::ffff:7f00:1]\", \"trailing.example.\"],"
    " \"files\": {\"read\": [\"docs/**\", \"./notes/*.md\", \"a/**/b\", \"exact.txt\", \"top/*\", \"lit[1]{x}\"],"
    "            \"write\": [\"out/**\"]},"
    " \"data\": {"
    "   \"collections\": {\"posts\": [\"read\"], \"comments\": [\"read\", \"create\", \"update\", \"delete\", \"read\"],"
    "                     \"drafts\": [\"create\"], \"__proto__\": [\"read\"], \"empty\": []},"
    "   \"globals\": {\"site\": [\"read\"], \"flags\": [\"write\"], \"both\": [\"read\", \"write\"]},"
    "   \"stores\": {\"notes\": [\"read\"], \"inbox\": [\"write\"], \"rw\": [\"read\", \"write\"], \"toString\": [\"read\"]}"
    " },"
    " \"services\": [\"billing\", \"constructor\"], \"jobs\": [\"reindex\"], \"workflows\": [\"onboard\"],"
    " \"tools\": [\"github.*\", \"search\", \"x?z\"]"
    "}";

static void test_files(const sb_manifest_t *m)
{
    static const char unsafe[] = "files path is missing or unsafe";
    static const char not_read[] = "files.read path is not in the read scope";

    /* files.read */
    expect(m, "files.read", "{\"path\": \"docs/a.md\"}", OK_);
    expect(m, "files.read", "{\"path\": \"docs/x/y/z\"}", OK_);
    expect(m, "files.read", "{\"path\": \"./docs/a\"}", OK_);
    expect(m, "files.read", "{\"path\": \"docs//a\"}", OK_);
    expect(m, "files.read", "{\"path\": \"docs/\"}", OK_);
    expect(m, "files.read", "{\"path\": \"notes/a.md\"}", OK_);
    expect(m, "files.read", "{\"path\": \"a/x/b\"}", OK_);
    expect(m, "files.read", "{\"path\": \"a/x/y/b\"}", OK_);
    expect(m, "files.read", "{\"path\": \"exact.txt\"}", OK_);
    expect(m, "files.read", "{\"path\": \"top/x\"}", OK_);
    expect(m, "files.read", "{\"path\": \"lit[1]{x}\"}", OK_);
    expect(m, "files.read", "{\"path\": \"docs/a\", \"scope\": \"x\"}", OK_);
    expect(m, "files.read", "{\"path\": \"docs/./a\"}", OK_);
    expect(m, "files.read", "{\"path\": \"docs\"}", FORBIDDEN(not_read));
    expect(m, "files.read", "{\"path\": \"notes/sub/a.md\"}", FORBIDDEN(not_read));
    expect(m, "files.read", "{\"path\": \"notes/a.txt\"}", FORBIDDEN(not_read));
    expect(m, "files.read", "{\"path\": \"a/b\"}", FORBIDDEN(not_read));
    expect(m, "files.read", "{\"path\": \"exact.txtx\"}", FORBIDDEN(not_read));
    expect(m, "files.read", "{\"path\": \"top/x/y\"}", FORBIDDEN(not_read));
    expect(m, "files.read", "{\"path\": \"lit1x\"}", FORBIDDEN(not_read));
    expect(m, "files.read", "{\"path\": \"out/a\"}", FORBIDDEN(not_read));
    expect(m, "files.read", "{\"path\": \"docsx/a\"}", FORBIDDEN(not_read));
    expect(m, "files.read", "{\"path\": \"../docs/a\"}", FORBIDDEN(unsafe));
    expect(m, "files.read", "{\"path\": \"docs/../secret\"}", FORBIDDEN(unsafe));
    expect(m, "files.read", "{\"path\": \"docs/..\"}", FORBIDDEN(unsafe));
    expect(m, "files.read", "{\"path\": \"/docs/a\"}", FORBIDDEN(unsafe));
    expect(m, "files.read", "{\"path\": \"docs\\\\a\"}", FORBIDDEN(unsafe));
    expect(m, "files.read", "{\"path\": \"\"}", FORBIDDEN(unsafe));
    expect(m, "files.read", "{\"path\": \"./\"}", FORBIDDEN(unsafe));
    expect(m, "files.read", "{\"path\": 1}", FORBIDDEN(unsafe));
    expect(m, "files.read", "{\"path\": null}", FORBIDDEN(unsafe));
    expect(m, "files.read", "{\"path\": [\"docs/a\"]}", FORBIDDEN(unsafe));
    expect(m, "files.read", "{\"path\": {\"docs/a\": 1}}", FORBIDDEN(unsafe));
    expect(m, "files.read", "{\"Path\": \"docs/a\"}", FORBIDDEN(unsafe));
    expect(m, "files.read", "{}", FORBIDDEN(unsafe));
    expect(m, "files.read", NULL, FORBIDDEN(unsafe));
    expect(m, "files.read", "null", FORBIDDEN(unsafe));
    expect(m, "files.read", "[\"docs/a\"]", FORBIDDEN(unsafe));
    expect(m, "files.read", "\"docs/a\"", FORBIDDEN(unsafe));
    /* {"path": bin "docs/a"}: a bin is not a string */
    expect_obj(m, "bin path", "files.read",
               RAW("\x81\xa4path\xc4\x06"
                   "docs/a"),
               FORBIDDEN(unsafe));
    /* embedded NUL in the path */
    expect_obj(m, "NUL in path", "files.read",
               RAW("\x81\xa4path\xa8"
                   "docs/a\0b"),
               FORBIDDEN(unsafe));
    /* duplicate key: one copy safe, the other not */
    expect_obj(m, "duplicate path", "files.read",
               RAW("\x82\xa4path\xa6"
                   "docs/a\xa4path\xa4../x"),
               BAD_ARGS("args has a duplicate or non-string key \"path\""));
    expect_obj(m, "duplicate path (same value)", "files.read",
               RAW("\x82\xa4path\xa6"
                   "docs/a\xa4path\xa6"
                   "docs/a"),
               BAD_ARGS("args has a duplicate or non-string key \"path\""));
    /* {bin "path": "../x", "path": "docs/a"} */
    expect_obj(m, "bin key", "files.read",
               RAW("\x82\xc4\x04path\xa4../x\xa4path\xa6"
                   "docs/a"),
               BAD_ARGS("args has a duplicate or non-string key \"path\""));
    /* an integer key is just another key */
    expect_obj(m, "int key", "files.read",
               RAW("\x82\x01\xa4../x\xa4path\xa6"
                   "docs/a"),
               OK_);

    /* files.write: write scope only */
    expect(m, "files.write", "{\"path\": \"out/a\", \"content\": \"x\"}", OK_);
    expect(m, "files.write", "{\"path\": \"out/x/y\"}", OK_);
    expect(m, "files.write", "{\"path\": \"docs/a\"}", FORBIDDEN("files.write path is not in the write scope"));
    expect(m, "files.write", "{\"path\": \"out\"}", FORBIDDEN("files.write path is not in the write scope"));
    expect(m, "files.write", "{\"path\": \"out/../docs/a\"}", FORBIDDEN(unsafe));
    expect(m, "files.write", "{}", FORBIDDEN(unsafe));
    expect(m, "files.write", NULL, FORBIDDEN(unsafe));

    /* files.list: path optional, nil is absent, prefix rule */
    expect(m, "files.list", NULL, OK_);
    expect(m, "files.list", "{}", OK_);
    expect(m, "files.list", "{\"path\": null}", OK_);
    expect(m, "files.list", "{\"path\": \"docs\"}", OK_);
    expect(m, "files.list", "{\"path\": \"docs/\"}", OK_);
    expect(m, "files.list", "{\"path\": \"./docs\"}", OK_);
    expect(m, "files.list", "{\"path\": \"docs/sub\"}", OK_);
    expect(m, "files.list", "{\"path\": \"a\"}", OK_);
    expect(m, "files.list", "{\"path\": \"notes\"}", OK_);
    expect(m, "files.list", "{\"path\": \"top\"}", OK_);
    expect(m, "files.list", "{\"path\": \"doc\"}", FORBIDDEN("files.list path is not in the read scope"));
    expect(m, "files.list", "{\"path\": \"out\"}", FORBIDDEN("files.list path is not in the read scope"));
    expect(m, "files.list", "{\"path\": \"exact.txt/\"}", FORBIDDEN("files.list path is not in the read scope"));
    expect(m, "files.list", "{\"path\": \"a/x\"}", FORBIDDEN("files.list path is not in the read scope"));
    expect(m, "files.list", "{\"path\": \"../\"}", FORBIDDEN(unsafe));
    expect(m, "files.list", "{\"path\": \"/\"}", FORBIDDEN(unsafe));
    expect(m, "files.list", "{\"path\": \"\"}", FORBIDDEN(unsafe));
    expect(m, "files.list", "{\"path\": 1}", FORBIDDEN(unsafe));
    expect(m, "files.list", "{\"path\": false}", FORBIDDEN(unsafe));
    expect_obj(m, "bin path", "files.list", RAW("\x81\xa4path\xc4\x01x"), FORBIDDEN(unsafe));
    expect_obj(m, "duplicate path", "files.list", RAW("\x82\xa4path\xc0\xa4path\xa4../x"),
               BAD_ARGS("args has a duplicate or non-string key \"path\""));
}

static void test_data(const sb_manifest_t *m)
{
    static const char ns_missing[] = "document_store namespace is missing or invalid";

    /* collections */
    expect(m, "collections.posts.find", "{}", OK_);
    expect(m, "collections.posts.findOne", NULL, OK_);
    expect(m, "collections.posts.create", "{}", FORBIDDEN("collection \"posts\" does not grant \"create\""));
    expect(m, "collections.posts.update", "{}", FORBIDDEN("collection \"posts\" does not grant \"update\""));
    expect(m, "collections.posts.delete", "{}", FORBIDDEN("collection \"posts\" does not grant \"delete\""));
    expect(m, "collections.comments.find", "{}", OK_);
    expect(m, "collections.comments.findOne", "{}", OK_);
    expect(m, "collections.comments.create", "{}", OK_);
    expect(m, "collections.comments.update", "{}", OK_);
    expect(m, "collections.comments.delete", "{}", OK_);
    expect(m, "collections.drafts.create", "{}", OK_);
    expect(m, "collections.drafts.find", "{}", FORBIDDEN("collection \"drafts\" does not grant \"read\""));
    expect(m, "collections.empty.find", "{}", FORBIDDEN("collection \"empty\" does not grant \"read\""));
    expect(m, "collections.unknown.find", "{}", FORBIDDEN("collection \"unknown\" does not grant \"read\""));
    expect(m, "collections.Posts.find", "{}", FORBIDDEN("collection \"Posts\" does not grant \"read\""));
    expect(m, "collections.post.find", "{}", FORBIDDEN("collection \"post\" does not grant \"read\""));
    expect(m, "collections.postsx.find", "{}", FORBIDDEN("collection \"postsx\" does not grant \"read\""));
    /* own keys only: listed literally grants, merely "inherited-looking" never does */
    expect(m, "collections.__proto__.find", "{}", OK_);
    expect(m, "collections.__proto__.create", "{}", FORBIDDEN("collection \"__proto__\" does not grant \"create\""));
    expect(m, "collections.constructor.find", "{}", FORBIDDEN("collection \"constructor\" does not grant \"read\""));
    expect(m, "collections.toString.find", "{}", FORBIDDEN("collection \"toString\" does not grant \"read\""));
    expect(m, "collections.hasOwnProperty.find", "{}", FORBIDDEN("collection \"hasOwnProperty\" does not grant \"read\""));

    /* collections.document_store: the namespace from the call, clamped to data.stores */
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": \"notes\"}}", OK_);
    expect(m, "collections.document_store.findOne", "{\"where\": {\"store\": \"notes\", \"id\": 3}}", OK_);
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": {\"equals\": \"notes\"}}}", OK_);
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": \"rw\"}, \"limit\": 5}", OK_);
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": \"toString\"}}", OK_);
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": \"inbox\"}}",
           FORBIDDEN("store \"inbox\" does not grant \"read\""));
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": \"unknown\"}}",
           FORBIDDEN("store \"unknown\" does not grant \"read\""));
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": \"__proto__\"}}",
           FORBIDDEN("store \"__proto__\" does not grant \"read\""));
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": \"constructor\"}}",
           FORBIDDEN("store \"constructor\" does not grant \"read\""));
    /* create: upstream's shape, the document's fields and store at the top level ({...doc, store: ns}) */
    expect(m, "collections.document_store.create", "{\"key\": \"k1\", \"data\": {\"v\": 1}, \"store\": \"inbox\"}", OK_);
    expect(m, "collections.document_store.create", "{\"store\": \"rw\"}", OK_);
    expect(m, "collections.document_store.create", "{\"store\": \"notes\"}", FORBIDDEN("store \"notes\" does not grant \"write\""));
    expect(m, "collections.document_store.create", "{\"key\": \"k1\", \"data\": {\"v\": 1}, \"store\": \"notes\"}",
           FORBIDDEN("store \"notes\" does not grant \"write\""));
    expect(m, "collections.document_store.update", "{\"where\": {\"store\": \"inbox\"}, \"data\": {\"x\": 1}}", OK_);
    expect(m, "collections.document_store.update", "{\"where\": {\"store\": {\"equals\": \"inbox\"}}}", OK_);
    expect(m, "collections.document_store.delete", "{\"where\": {\"store\": \"rw\"}}", OK_);
    expect(m, "collections.document_store.delete", "{\"where\": {\"store\": \"notes\"}}",
           FORBIDDEN("store \"notes\" does not grant \"write\""));
    /* create takes the top-level store, the others where.store: data.store is a document field, never a namespace */
    expect(m, "collections.document_store.create", "{\"where\": {\"store\": \"inbox\"}}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.create", "{\"data\": {\"store\": \"inbox\"}}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.update", "{\"data\": {\"store\": \"inbox\"}}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.update", "{\"store\": \"inbox\", \"data\": {\"x\": 1}}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.create", "{\"store\": {\"equals\": \"inbox\"}}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.create", "{\"store\": \"no tes\"}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.create", "[\"inbox\"]", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.create", NULL, FORBIDDEN(ns_missing));
    /* missing or malformed namespaces */
    expect(m, "collections.document_store.find", NULL, FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.find", "{}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.find", "{\"where\": {}}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.find", "{\"where\": \"notes\"}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.find", "{\"where\": [\"notes\"]}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": 1}}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": null}}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": [\"notes\"]}}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": \"\"}}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": \"no tes\"}}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": {}}}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": {\"equals\": 1}}}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": {\"in\": [\"notes\"]}}}", FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": {\"equals\": \"notes\", \"not\": \"x\"}}}",
           FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": {\"equals\": {\"equals\": \"notes\"}}}}",
           FORBIDDEN(ns_missing));
    expect(m, "collections.document_store.find", "{\"where\": {\"Store\": \"notes\"}}", FORBIDDEN(ns_missing));
    /* {"where": {"store": "notes", "store": "inbox"}} */
    expect_obj(m, "duplicate store", "collections.document_store.find",
               RAW("\x81\xa5where\x82\xa5store\xa5notes\xa5store\xa5inbox"),
               BAD_ARGS("args has a duplicate or non-string key \"store\""));
    /* {"where": {...}, "where": {...}} */
    expect_obj(m, "duplicate where", "collections.document_store.find",
               RAW("\x82\xa5where\x81\xa5store\xa5notes\xa5where\x81\xa5store\xa5inbox"),
               BAD_ARGS("args has a duplicate or non-string key \"where\""));
    /* {"where": {"store": {"equals": "notes", bin "equals": "inbox"}}}: size 2, refused as a widening operator */
    expect_obj(m, "two equals", "collections.document_store.find",
               RAW("\x81\xa5where\x81\xa5store\x82\xa6"
                   "equals\xa5notes\xc4\x06"
                   "equals\xa5inbox"),
               FORBIDDEN(ns_missing));
    /* {"where": {"store": {bin "equals": "notes"}}} */
    expect_obj(m, "bin equals", "collections.document_store.find",
               RAW("\x81\xa5where\x81\xa5store\x81\xc4\x06"
                   "equals\xa5notes"),
               BAD_ARGS("args has a duplicate or non-string key \"equals\""));

    /* store.<ns>.<op>: exactly the namespace of the method */
    expect(m, "store.notes.find", "{}", OK_);
    expect(m, "store.notes.findOne", NULL, OK_);
    expect(m, "store.notes.create", "{}", FORBIDDEN("store \"notes\" does not grant \"write\""));
    expect(m, "store.notes.update", "{}", FORBIDDEN("store \"notes\" does not grant \"write\""));
    expect(m, "store.notes.delete", "{}", FORBIDDEN("store \"notes\" does not grant \"write\""));
    expect(m, "store.inbox.create", "{}", OK_);
    expect(m, "store.inbox.update", "{}", OK_);
    expect(m, "store.inbox.delete", "{}", OK_);
    expect(m, "store.inbox.find", "{}", FORBIDDEN("store \"inbox\" does not grant \"read\""));
    expect(m, "store.inbox.findOne", "{}", FORBIDDEN("store \"inbox\" does not grant \"read\""));
    expect(m, "store.rw.find", "{}", OK_);
    expect(m, "store.rw.delete", "{}", OK_);
    expect(m, "store.toString.find", "{}", OK_);
    expect(m, "store.Notes.find", "{}", FORBIDDEN("store \"Notes\" does not grant \"read\""));
    expect(m, "store.note.find", "{}", FORBIDDEN("store \"note\" does not grant \"read\""));
    expect(m, "store.constructor.find", "{}", FORBIDDEN("store \"constructor\" does not grant \"read\""));
    expect(m, "store.__proto__.find", "{}", FORBIDDEN("store \"__proto__\" does not grant \"read\""));
    expect(m, "store.document_store.find", "{}", FORBIDDEN("store \"document_store\" does not grant \"read\""));
    /* store.<ns> does not look at args at all (the handler pins the namespace) */
    expect(m, "store.notes.find", "{\"where\": {\"store\": \"inbox\"}}", OK_);

    /* globals */
    expect(m, "globals.site.get", NULL, OK_);
    expect(m, "globals.site.set", "{}", FORBIDDEN("global \"site\" does not grant \"write\""));
    expect(m, "globals.flags.set", "{}", OK_);
    expect(m, "globals.flags.get", "{}", FORBIDDEN("global \"flags\" does not grant \"read\""));
    expect(m, "globals.both.get", "{}", OK_);
    expect(m, "globals.both.set", "{}", OK_);
    expect(m, "globals.other.get", "{}", FORBIDDEN("global \"other\" does not grant \"read\""));
    expect(m, "globals.__proto__.get", "{}", FORBIDDEN("global \"__proto__\" does not grant \"read\""));
    expect(m, "globals.constructor.set", "{}", FORBIDDEN("global \"constructor\" does not grant \"write\""));
    expect(m, "globals.posts.get", "{}", FORBIDDEN("global \"posts\" does not grant \"read\""));
}

static void test_names(const sb_manifest_t *m)
{
    expect(m, "services.billing.charge", "{}", OK_);
    expect(m, "services.billing.refund", NULL, OK_);
    expect(m, "services.constructor.x", "{}", OK_);
    expect(m, "services.other.charge", "{}", FORBIDDEN("service \"other\" is not granted"));
    expect(m, "services.Billing.charge", "{}", FORBIDDEN("service \"Billing\" is not granted"));
    expect(m, "services.toString.x", "{}", FORBIDDEN("service \"toString\" is not granted"));
    expect(m, "services.__proto__.x", "{}", FORBIDDEN("service \"__proto__\" is not granted"));
    expect(m, "jobs.enqueue.reindex", "{}", OK_);
    expect(m, "jobs.enqueue.other", "{}", FORBIDDEN("job \"other\" is not granted"));
    expect(m, "jobs.enqueue.billing", "{}", FORBIDDEN("job \"billing\" is not granted"));
    expect(m, "jobs.enqueue.__proto__", "{}", FORBIDDEN("job \"__proto__\" is not granted"));
    expect(m, "workflows.trigger.onboard", "{}", OK_);
    expect(m, "workflows.trigger.other", "{}", FORBIDDEN("workflow \"other\" is not granted"));
    expect(m, "workflows.trigger.constructor", "{}", FORBIDDEN("workflow \"constructor\" is not granted"));
    expect(m, "email.send", "{\"to\": \"a@example.com\"}",
           FORBIDDEN("email.send is not grantable in the current capability model"));
    expect(m, "email.send", NULL, FORBIDDEN("email.send is not grantable in the current capability model"));
}

static void test_tools(const sb_manifest_t *m)
{
    char name[300], json[400];

    expect(m, "tools.list", NULL, OK_);
    expect(m, "tools.list", "{}", OK_);
    expect(m, "tools.call", "{\"name\": \"github.create_issue\", \"arguments\": {}}", OK_);
    expect(m, "tools.call", "{\"name\": \"github.\"}", OK_);
    expect(m, "tools.call", "{\"name\": \"search\"}", OK_);
    expect(m, "tools.call", "{\"name\": \"xyz\"}", OK_);
    expect(m, "tools.call", "{\"name\": \"searchx\"}", FORBIDDEN("tools.call name is not granted"));
    expect(m, "tools.call", "{\"name\": \"Search\"}", FORBIDDEN("tools.call name is not granted"));
    expect(m, "tools.call", "{\"name\": \"github\"}", FORBIDDEN("tools.call name is not granted"));
    expect(m, "tools.call", "{\"name\": \"x/z\"}", FORBIDDEN("tools.call name is not granted"));
    expect(m, "tools.call", "{\"name\": \"github.a/b\"}", FORBIDDEN("tools.call name is not granted"));
    expect(m, "tools.call", "{\"name\": \"__proto__\"}", FORBIDDEN("tools.call name is not granted"));
    expect(m, "tools.call", "{}", FORBIDDEN("tools.call name is missing or invalid"));
    expect(m, "tools.call", NULL, FORBIDDEN("tools.call name is missing or invalid"));
    expect(m, "tools.call", "{\"name\": \"\"}", FORBIDDEN("tools.call name is missing or invalid"));
    expect(m, "tools.call", "{\"name\": 1}", FORBIDDEN("tools.call name is missing or invalid"));
    expect(m, "tools.call", "{\"name\": [\"search\"]}", FORBIDDEN("tools.call name is missing or invalid"));
    expect_obj(m, "duplicate name", "tools.call", RAW("\x82\xa4name\xa6search\xa4name\xa3xyz"),
               BAD_ARGS("args has a duplicate or non-string key \"name\""));
    /* 256 bytes is the longest name */
    memcpy(name, "github.", 7);
    memset(name + 7, 'a', 249);
    name[256] = '\0';
    snprintf(json, sizeof(json), "{\"name\": \"%s\"}", name);
    expect(m, "tools.call", json, OK_);
    name[256] = 'a';
    name[257] = '\0';
    snprintf(json, sizeof(json), "{\"name\": \"%s\"}", name);
    expect(m, "tools.call", json, FORBIDDEN("tools.call name is missing or invalid"));
}

static void test_fetch(const sb_manifest_t *m)
{
    sb_manifest_t *wild;

    expect(m, "http.fetch", "{\"url\": \"https://example.com/x\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"http://example.com:8080/\", \"method\": \"POST\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"https://EXAMPLE.com./\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"https://trailing.example/\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"https://www.example.com/\"}",
           FORBIDDEN("http.fetch host \"www.example.com:443\" is not in the net allowlist"));
    expect(m, "http.fetch", "{\"url\": \"https://example.com.evil.example/\"}",
           FORBIDDEN("http.fetch host \"example.com.evil.example:443\" is not in the net allowlist"));
    expect(m, "http.fetch", "{\"url\": \"https://evilexample.com/\"}",
           FORBIDDEN("http.fetch host \"evilexample.com:443\" is not in the net allowlist"));
    /* entry with a port: that port only */
    expect(m, "http.fetch", "{\"url\": \"https://api.example.org:8443/v1\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"https://api.example.org/\"}",
           FORBIDDEN("http.fetch host \"api.example.org:443\" is not in the net allowlist"));
    expect(m, "http.fetch", "{\"url\": \"http://api.example.org:8444/\"}",
           FORBIDDEN("http.fetch host \"api.example.org:8444\" is not in the net allowlist"));
    /* wildcards: strict subdomains only */
    expect(m, "http.fetch", "{\"url\": \"https://a.cdn.example/\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"https://a.b.cdn.example:9999/\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"https://cdn.example/\"}",
           FORBIDDEN("http.fetch host \"cdn.example:443\" is not in the net allowlist"));
    expect(m, "http.fetch", "{\"url\": \"https://evilcdn.example/\"}",
           FORBIDDEN("http.fetch host \"evilcdn.example:443\" is not in the net allowlist"));
    expect(m, "http.fetch", "{\"url\": \"https://x.ports.example:444/\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"https://x.ports.example/\"}",
           FORBIDDEN("http.fetch host \"x.ports.example:443\" is not in the net allowlist"));
    /* IPv6 entries compare numerically */
    expect(m, "http.fetch", "{\"url\": \"https://[2001:db8::1]/\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"https://[2001:DB8:0:0:0:0:0:1]:443/\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"http://[2001:db8::1]/\"}",
           FORBIDDEN("http.fetch host \"[2001:db8::1]:80\" is not in the net allowlist"));
    expect(m, "http.fetch", "{\"url\": \"http://[::2]:1234/\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"http://[::3]/\"}", FORBIDDEN("http.fetch host \"[::3]:80\" is not in the net allowlist"));
    expect(m, "http.fetch", "{\"url\": \"http://[::ffff:127.0.0.1]/\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"http://1.2.3.4/\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"http://1.2.3.5/\"}",
           FORBIDDEN("http.fetch host \"1.2.3.5:80\" is not in the net allowlist"));
    /* an IPv4 literal is not its IPv4-mapped IPv6 form, nor the reverse */
    expect(m, "http.fetch", "{\"url\": \"http://127.0.0.1/\"}",
           FORBIDDEN("http.fetch host \"127.0.0.1:80\" is not in the net allowlist"));
    expect(m, "http.fetch", "{\"url\": \"http://[::ffff:1.2.3.4]/\"}",
           FORBIDDEN("http.fetch host \"[::ffff:1.2.3.4]:80\" is not in the net allowlist"));
    /* the url must parse: bad_args with the parser's reason */
    expect(m, "http.fetch", "{\"url\": \"ftp://example.com/\"}", BAD_ARGS("http.fetch url is invalid: unsupported scheme"));
    expect(m, "http.fetch", "{\"url\": \"http://2130706433/\"}", BAD_ARGS("http.fetch url is invalid: non-canonical IPv4 address"));
    expect(m, "http.fetch", "{\"url\": \"http://user@example.com/\"}",
           BAD_ARGS("http.fetch url is invalid: userinfo is not allowed"));
    expect(m, "http.fetch", "{\"url\": \"http://example.com\\\\@evil/\"}",
           BAD_ARGS("http.fetch url is invalid: backslash is not allowed"));
    expect(m, "http.fetch", "{\"url\": \"\"}", BAD_ARGS("http.fetch url is invalid: empty URL"));
    expect(m, "http.fetch", "{\"url\": \"/relative\"}", BAD_ARGS("http.fetch url is invalid: not an absolute URL"));
    expect(m, "http.fetch", "{}", BAD_ARGS("http.fetch url is invalid: missing or not a string"));
    expect(m, "http.fetch", NULL, BAD_ARGS("http.fetch url is invalid: missing or not a string"));
    expect(m, "http.fetch", "{\"url\": 1}", BAD_ARGS("http.fetch url is invalid: missing or not a string"));
    expect(m, "http.fetch", "{\"url\": null}", BAD_ARGS("http.fetch url is invalid: missing or not a string"));
    expect(m, "http.fetch", "{\"URL\": \"https://example.com/\"}", BAD_ARGS("http.fetch url is invalid: missing or not a string"));
    expect_obj(m, "bin url", "http.fetch", RAW("\x81\xa3url\xc4\x14https://example.com/"),
               BAD_ARGS("http.fetch url is invalid: missing or not a string"));
    expect_obj(m, "duplicate url", "http.fetch", RAW("\x82\xa3url\xb4https://example.com/\xa3url\xb0http://10.0.0.1/"),
               BAD_ARGS("args has a duplicate or non-string key \"url\""));

    /* "*.0.0.1" is a wildcard over names; it never matches an address */
    wild = manifest("{\"net\": [\"*.0.0.1\", \"*.com\"]}");
    expect(wild, "http.fetch", "{\"url\": \"http://127.0.0.1/\"}",
           FORBIDDEN("http.fetch host \"127.0.0.1:80\" is not in the net allowlist"));
    expect(wild, "http.fetch", "{\"url\": \"http://example.com/\"}", OK_);
    expect(wild, "http.fetch", "{\"url\": \"http://com/\"}", FORBIDDEN("http.fetch host \"com:80\" is not in the net allowlist"));
    sb_manifest_free(wild);
}

/* net entries with method and path rules (PROTOCOL.md section 6.1) */
static void test_fetch_rules(void)
{
    sb_manifest_t *m =
        manifest("{\"net\": [{\"host\": \"api.test\", \"methods\": [\"GET\", \"HEAD\"], \"paths\": [\"/repos/acme/**\"]},"
                 " {\"host\": \"up.test\", \"methods\": [\"PUT\"]}, {\"host\": \"up.test\", \"paths\": [\"/public/*\"]},"
                 " \"any.test\"]}");

    expect(m, "http.fetch", "{\"url\": \"https://api.test/repos/acme/x/issues?state=open\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"https://api.test/repos/acme/\", \"method\": \"head\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"https://api.test/repos/acme/x\", \"method\": \"POST\"}",
           FORBIDDEN("http.fetch method \"POST\" is not allowed for host \"api.test:443\" (net methods rule)"));
    expect(m, "http.fetch", "{\"url\": \"https://api.test/repos/other/x\"}",
           FORBIDDEN("http.fetch path is not allowed for host \"api.test:443\" (net paths rule)"));
    expect(m, "http.fetch", "{\"url\": \"https://api.test/repos/acme\"}",
           FORBIDDEN("http.fetch path is not allowed for host \"api.test:443\" (net paths rule)"));
    /* the query is not part of the path a rule matches */
    expect(m, "http.fetch", "{\"url\": \"https://api.test/x?/repos/acme/y\"}",
           FORBIDDEN("http.fetch path is not allowed for host \"api.test:443\" (net paths rule)"));
    /* dot segments are resolved by the parser, so "/repos/acme/../other" is "/repos/other" */
    expect(m, "http.fetch", "{\"url\": \"https://api.test/repos/acme/../other\"}",
           FORBIDDEN("http.fetch path is not allowed for host \"api.test:443\" (net paths rule)"));
    /* encodings a server may decode before routing are refused whatever the glob says */
    expect(m, "http.fetch", "{\"url\": \"https://api.test/repos/acme/..%2Fother\"}",
           FORBIDDEN("http.fetch path for host \"api.test:443\" has an encoded '/', '\\', '.' or '%', a ';', or a dot segment (net "
                     "paths rule)"));
    expect(m, "http.fetch", "{\"url\": \"https://api.test/repos/acme/%2e%2e/x\"}",
           FORBIDDEN("http.fetch path for host \"api.test:443\" has an encoded '/', '\\', '.' or '%', a ';', or a dot segment (net "
                     "paths rule)"));
    expect(m, "http.fetch", "{\"url\": \"https://api.test/repos/acme/a%5cb\"}",
           FORBIDDEN("http.fetch path for host \"api.test:443\" has an encoded '/', '\\', '.' or '%', a ';', or a dot segment (net "
                     "paths rule)"));
    expect(m, "http.fetch", "{\"url\": \"https://api.test/repos/acme/a%2fb\"}",
           FORBIDDEN("http.fetch path for host \"api.test:443\" has an encoded '/', '\\', '.' or '%', a ';', or a dot segment (net "
                     "paths rule)"));
    /* path parameters (servlet containers strip them before resolving "..;") and an encoded '%' (decoded twice) */
    expect(m, "http.fetch", "{\"url\": \"https://api.test/repos/acme/..;/other\"}",
           FORBIDDEN("http.fetch path for host \"api.test:443\" has an encoded '/', '\\', '.' or '%', a ';', or a dot segment (net "
                     "paths rule)"));
    expect(m, "http.fetch", "{\"url\": \"https://api.test/repos/acme/%252e%252e/other\"}",
           FORBIDDEN("http.fetch path for host \"api.test:443\" has an encoded '/', '\\', '.' or '%', a ';', or a dot segment (net "
                     "paths rule)"));
    /* other percent-encodings are ordinary bytes */
    expect(m, "http.fetch", "{\"url\": \"https://api.test/repos/acme/a%20b\"}", OK_);
    /* entries for one host add up: PUT anywhere, or anything under /public/ */
    expect(m, "http.fetch", "{\"url\": \"https://up.test/x/y\", \"method\": \"PUT\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"https://up.test/public/a\", \"method\": \"DELETE\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"https://up.test/x\", \"method\": \"DELETE\"}",
           FORBIDDEN("http.fetch method \"DELETE\" is not allowed for host \"up.test:443\" (net methods rule)"));
    /* a string entry still means any method, any path, and no encoding check */
    expect(m, "http.fetch", "{\"url\": \"https://any.test/a%2Fb\", \"method\": \"DELETE\"}", OK_);
    expect(m, "http.fetch", "{\"url\": \"https://other.test/\"}",
           FORBIDDEN("http.fetch host \"other.test:443\" is not in the net allowlist"));
    sb_manifest_free(m);
}

/* everything is denied by a manifest that grants nothing, whatever the args */
static void test_empty(const char *text)
{
    sb_manifest_t *m = manifest(text);

    expect(m, "files.read", "{\"path\": \"a\"}", FORBIDDEN("files.read path is not in the read scope"));
    expect(m, "files.write", "{\"path\": \"a\"}", FORBIDDEN("files.write path is not in the write scope"));
    expect(m, "files.list", NULL, FORBIDDEN("files.list requires a files.read scope"));
    expect(m, "files.list", "{\"path\": \"a\"}", FORBIDDEN("files.list requires a files.read scope"));
    expect(m, "collections.posts.find", "{}", FORBIDDEN("collection \"posts\" does not grant \"read\""));
    expect(m, "collections.__proto__.find", "{}", FORBIDDEN("collection \"__proto__\" does not grant \"read\""));
    expect(m, "collections.constructor.create", "{}", FORBIDDEN("collection \"constructor\" does not grant \"create\""));
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": \"notes\"}}",
           FORBIDDEN("store \"notes\" does not grant \"read\""));
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": \"__proto__\"}}",
           FORBIDDEN("store \"__proto__\" does not grant \"read\""));
    expect(m, "store.notes.create", "{}", FORBIDDEN("store \"notes\" does not grant \"write\""));
    expect(m, "store.toString.find", "{}", FORBIDDEN("store \"toString\" does not grant \"read\""));
    expect(m, "globals.site.get", "{}", FORBIDDEN("global \"site\" does not grant \"read\""));
    expect(m, "globals.__proto__.set", "{}", FORBIDDEN("global \"__proto__\" does not grant \"write\""));
    expect(m, "services.billing.charge", "{}", FORBIDDEN("service \"billing\" is not granted"));
    expect(m, "services.constructor.call", "{}", FORBIDDEN("service \"constructor\" is not granted"));
    expect(m, "jobs.enqueue.reindex", "{}", FORBIDDEN("job \"reindex\" is not granted"));
    expect(m, "workflows.trigger.onboard", "{}", FORBIDDEN("workflow \"onboard\" is not granted"));
    expect(m, "email.send", "{}", FORBIDDEN("email.send is not grantable in the current capability model"));
    expect(m, "tools.list", "{}", FORBIDDEN("tools are not granted"));
    expect(m, "tools.call", "{\"name\": \"search\"}", FORBIDDEN("tools are not granted"));
    /* the net axis is checked before the URL is even looked at */
    expect(m, "http.fetch", "{\"url\": \"https://example.com/\"}", FORBIDDEN("http.fetch requires a net allowlist"));
    expect(m, "http.fetch", "{\"url\": \"ftp://bad\"}", FORBIDDEN("http.fetch requires a net allowlist"));
    expect(m, "http.fetch", NULL, FORBIDDEN("http.fetch requires a net allowlist"));
    sb_manifest_free(m);
}

/* one axis granted says nothing about the others */
static void test_omitted_axes(void)
{
    sb_manifest_t *m = manifest("{\"files\": {\"write\": [\"**\"]}, \"data\": {\"globals\": {\"posts\": [\"read\"]}},"
                                " \"services\": [\"reindex\"], \"import\": [\"example.com\"]}");

    expect(m, "files.write", "{\"path\": \"a/b\"}", OK_);
    expect(m, "files.read", "{\"path\": \"a/b\"}", FORBIDDEN("files.read path is not in the read scope"));
    expect(m, "files.list", "{}", FORBIDDEN("files.list requires a files.read scope"));
    expect(m, "globals.posts.get", "{}", OK_);
    expect(m, "collections.posts.find", "{}", FORBIDDEN("collection \"posts\" does not grant \"read\""));
    expect(m, "store.posts.find", "{}", FORBIDDEN("store \"posts\" does not grant \"read\""));
    expect(m, "jobs.enqueue.reindex", "{}", FORBIDDEN("job \"reindex\" is not granted"));
    expect(m, "workflows.trigger.reindex", "{}", FORBIDDEN("workflow \"reindex\" is not granted"));
    /* import is not net */
    expect(m, "http.fetch", "{\"url\": \"https://example.com/\"}", FORBIDDEN("http.fetch requires a net allowlist"));
    sb_manifest_free(m);

    /* document_store ignores data.collections entirely */
    m = manifest("{\"data\": {\"collections\": {\"document_store\": [\"read\", \"create\", \"update\", \"delete\"]}}}");
    expect(m, "collections.document_store.find", "{\"where\": {\"store\": \"notes\"}}",
           FORBIDDEN("store \"notes\" does not grant \"read\""));
    expect(m, "collections.document_store.create", "{\"store\": \"notes\"}", FORBIDDEN("store \"notes\" does not grant \"write\""));
    expect(m, "collections.document_store.find", "{}", FORBIDDEN("document_store namespace is missing or invalid"));
    sb_manifest_free(m);
}

/* a call decoded from no args */
static sb_call_t *call_of(sb_call_t *call, msgpack_zone *zone, const char *method)
{
    sb_method_t meth;

    if (sb_method_parse(method, strlen(method), &meth) != SB_OK)
        ok(0, "parse %s", method);
    (void)sb_call_decode(call, &meth, method, strlen(method), NULL, 0, zone);
    return call;
}

static void test_reason_buffer(const sb_manifest_t *m)
{
    sb_call_t call, *meth;
    msgpack_zone zone;
    char small[8];

    msgpack_zone_init(&zone, 1024);
    meth = call_of(&call, &zone, "email.send");
    is_int(sb_authz_check(m, meth, small, sizeof(small)), SB_E_FORBIDDEN, "small reason buffer");
    is_str(small, "email.s", "  truncated reason");
    is_int(sb_authz_check(m, meth, NULL, 0), SB_E_FORBIDDEN, "no reason buffer");
    is_int(sb_authz_check(NULL, meth, small, sizeof(small)), SB_E_FORBIDDEN, "no manifest");
    meth = call_of(&call, &zone, "files.list");
    memcpy(small, "junk", 5);
    is_int(sb_authz_check(m, meth, small, sizeof(small)), SB_OK, "granted");
    is_str(small, "", "  reason cleared when granted");
    {
        char big[64];
        is_int(sb_authz_check(NULL, meth, big, sizeof(big)), SB_E_FORBIDDEN, "no manifest");
        is_str(big, "no capability manifest", "  reason");
        is_int(sb_authz_check(m, NULL, big, sizeof(big)), SB_E_FORBIDDEN, "no call");
    }
    msgpack_zone_destroy(&zone);
}

/* decide rules: which granted calls need the decider (PROTOCOL.md section 5a); they never change the check */
static int needs(const sb_manifest_t *m, const char *method, const char *args_json)
{
    sb_method_t meth;
    sb_call_t call;
    msgpack_zone zone;
    int r;

    if (sb_method_parse(method, strlen(method), &meth) != SB_OK)
        return -1;
    msgpack_zone_init(&zone, 1024);
    (void)sb_call_decode(&call, &meth, method, strlen(method), args(args_json), 0, &zone);
    r = sb_authz_needs_decision(m, &call);
    msgpack_zone_destroy(&zone);
    return r;
}

static void test_decide(void)
{
    sb_manifest_t *m =
        manifest("{\"data\": {\"collections\": {\"posts\": [\"read\", \"delete\"]}, \"stores\": {\"notes\": [\"read\", "
                 "\"write\"]}}, \"net\": [\"pay.test\", \"api.test\"], \"tools\": [\"*\"],"
                 " \"decide\": {\"methods\": [\"collections.posts.delete\", \"store.*.create\", \"tools.call\"],"
                 " \"fetch\": [{\"host\": \"pay.test\", \"methods\": [\"POST\"], \"paths\": [\"/v1/**\"]}]}}");
    sb_manifest_t *plain = manifest("{\"data\": {\"collections\": {\"posts\": [\"read\", \"delete\"]}}}");
    sb_manifest_t *all_fetch = manifest("{\"net\": [\"api.test\"], \"decide\": {\"methods\": [\"http.fetch\"]}}");
    sb_url_t u;
    const char *why;

    ok(sb_authz_has_decide(m) && !sb_authz_has_decide(plain) && !sb_authz_has_decide(NULL), "has_decide");
    is_int(needs(m, "collections.posts.delete", "{\"where\": {\"id\": 1}}"), 1, "collections.posts.delete needs a decision");
    is_int(needs(m, "collections.posts.find", "{}"), 0, "collections.posts.find does not");
    is_int(needs(m, "collections.comments.delete", "{}"), 0, "another collection's delete does not");
    is_int(needs(m, "store.notes.create", "{\"data\": {\"a\": 1}}"), 1, "store.*.create matches store.notes.create");
    is_int(needs(m, "store.notes.update", "{\"data\": {\"a\": 1}}"), 0, "store.notes.update does not");
    is_int(needs(m, "collections.document_store.create", "{\"store\": \"notes\", \"data\": {\"a\": 1}}"), 1,
           "the document store's other name is held by the store.* rule");
    is_int(needs(m, "tools.call", "{\"name\": \"x\"}"), 1, "tools.call");
    is_int(needs(m, "tools.list", "{}"), 0, "tools.list does not");
    is_int(needs(m, "http.fetch", "{\"url\": \"https://pay.test/v1/charges\", \"method\": \"POST\"}"), 1,
           "POST to a decide.fetch path");
    is_int(needs(m, "http.fetch", "{\"url\": \"https://pay.test/v1/charges\"}"), 0, "GET is not in the rule's methods");
    is_int(needs(m, "http.fetch", "{\"url\": \"https://pay.test/v2/x\", \"method\": \"POST\"}"), 0, "a path outside the rule");
    is_int(needs(m, "http.fetch", "{\"url\": \"https://pay.test/v1/%2e%2e/v2\", \"method\": \"POST\"}"), 1,
           "an ambiguous path under a paths rule needs a decision");
    is_int(needs(m, "http.fetch", "{\"url\": \"https://api.test/v1/x\", \"method\": \"POST\"}"), 0, "another host");
    is_int(needs(plain, "collections.posts.delete", "{}"), 0, "no decide rules: nothing needs a decision");
    {
        sb_manifest_t *ds = manifest("{\"data\": {\"stores\": {\"notes\": [\"write\"]}},"
                                     " \"decide\": {\"methods\": [\"collections.document_store.create\"]}}");
        is_int(needs(ds, "store.notes.create", "{\"data\": {\"a\": 1}}"), 1,
               "a collections.document_store rule holds the store.<ns> name too");
        is_int(needs(ds, "store.notes.update", "{\"data\": {\"a\": 1}}"), 0, "another op is not held");
        is_int(needs(ds, "tools.call", "{\"name\": \"x\"}"), 0, "a family no rule names");
        sb_manifest_free(ds);
    }
    is_int(needs(all_fetch, "http.fetch", "{\"url\": \"https://api.test/\"}"), 1, "decide.methods http.fetch holds every fetch");
    /* a rule never grants: the check still refuses what the manifest does not grant */
    expect(m, "collections.drafts.delete", "{}", FORBIDDEN("collection \"drafts\" does not grant \"delete\""));
    expect(m, "collections.posts.delete", "{}", OK_);
    /* a redirect hop */
    if (sb_url_parse("https://pay.test/v1/refunds", 27, &u, &why) == SB_OK) {
        ok(sb_authz_fetch_needs_decision(m, &u, "POST"), "a redirect hop to a decide.fetch path");
        ok(!sb_authz_fetch_needs_decision(m, &u, "GET"), "a GET hop is not held");
        ok(!sb_authz_fetch_needs_decision(plain, &u, "POST"), "no rules: no hop is held");
    } else {
        ok(0, "test URL parses");
    }
    sb_manifest_free(m);
    sb_manifest_free(plain);
    sb_manifest_free(all_fetch);
}

int main(void)
{
    sb_manifest_t *m = manifest(full_manifest);

    test_files(m);
    test_data(m);
    test_names(m);
    test_tools(m);
    test_fetch(m);
    test_fetch_rules();
    test_reason_buffer(m);
    sb_manifest_free(m);
    free_args();

    test_empty("{}");
    test_empty("null");
    test_empty("{\"net\": [], \"files\": {\"read\": [], \"write\": []}, \"data\": {\"collections\": {}, \"globals\": {},"
               " \"stores\": {}}, \"services\": [], \"jobs\": [], \"workflows\": [], \"tools\": []}");
    free_args();
    test_omitted_axes();
    free_args();
    test_decide();
    free_args();
    return done_testing();
}
