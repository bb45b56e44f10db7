/*
 * Unit tests for broker/call/call.c and where.c: the typed-call decoders.
 *
 * Every bad shape of every family, with its exact status, reason and stage
 * (the check's subject, or the args answered after the grant), and what a
 * good call decodes to: the files path in the check's normal form, the
 * document-store namespace from each of upstream's shapes, the where tree
 * node for node, the fetch request with its headers dropped and lowercased,
 * the tools arguments size cap. Guest names echoed in reasons are cut on a
 * code point boundary (tested with multibyte names across the cut).
 *
 * Arguments are written as JSON and go through sb_json_parse (packed, then
 * sb_mp_decode), as the RPC route decodes them; msgpack-only shapes (bin,
 * duplicate keys) are packed by hand.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "sb/limits.h"
#include "sb/value.h"
#include "call/call.h"
#include "call/path.h"

/* ---- arguments ------------------------------------------------------------------------------------------------------- */

#define MAX_KEEP 1024
static msgpack_sbuffer kept_sb[MAX_KEEP];
static msgpack_zone kept_zone[MAX_KEEP];
static size_t nkept;

static const msgpack_object *keep(const char *data, size_t len)
{
    static msgpack_object objs[MAX_KEEP];
    const char *why = NULL;

    if (nkept == MAX_KEEP)
        abort();
    msgpack_sbuffer_init(&kept_sb[nkept]);
    msgpack_sbuffer_write(&kept_sb[nkept], data, len);
    msgpack_zone_init(&kept_zone[nkept], 1024);
    if (sb_mp_decode((const uint8_t *)kept_sb[nkept].data, len, &kept_zone[nkept], &objs[nkept], &why) != SB_OK) {
        printf("# bad test msgpack: %s\n", why);
        abort();
    }
    return &objs[nkept++];
}

/* JSON text packed as msgpack, through the RPC route's decoder (sb_json_parse) */
static sb_status_t json_to_packed(const char *json, msgpack_sbuffer *sb, const char **why)
{
    msgpack_zone z;
    msgpack_object o;
    msgpack_packer pk;
    sb_status_t st;

    msgpack_zone_init(&z, 1024);
    if ((st = sb_json_parse(json, strlen(json), &z, &o, why)) == SB_OK) {
        msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
        sb_mp_pack_object(&pk, &o);
    }
    msgpack_zone_destroy(&z);
    return st;
}

/* JSON text -> args object, through the project's JSON edge; NULL means absent args */
static const msgpack_object *J(const char *json)
{
    msgpack_sbuffer sb;
    const char *why = NULL;
    const msgpack_object *o;

    if (json == NULL)
        return NULL;
    msgpack_sbuffer_init(&sb);
    if (json_to_packed(json, &sb, &why) != SB_OK) {
        printf("# bad test JSON: %s: %s\n", why, json);
        abort();
    }
    o = keep(sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return o;
}

/* a hand-packed literal, without its terminating NUL (duplicate keys: decoded without the pre-check) */
static const msgpack_object *raw(const char *data, size_t len)
{
    static msgpack_object objs[64];
    static msgpack_zone zones[64];
    static size_t n;
    size_t off = 0;

    if (n == 64)
        abort();
    msgpack_zone_init(&zones[n], 256);
    if (msgpack_unpack(data, len, &off, &zones[n], &objs[n]) != MSGPACK_UNPACK_SUCCESS)
        abort();
    return &objs[n++];
}
#define RAW(lit) raw(lit, sizeof(lit) - 1)

static void free_kept(void)
{
    for (size_t i = 0; i < nkept; ++i) {
        msgpack_sbuffer_destroy(&kept_sb[i]);
        msgpack_zone_destroy(&kept_zone[i]);
    }
    nkept = 0;
}

/* ---- decoding -------------------------------------------------------------------------------------------------------- */

static sb_call_t call;
static msgpack_zone zone;
static int zone_live;

static sb_status_t decode_obj(const char *method, const msgpack_object *args, int binary)
{
    sb_method_t m;

    if (sb_method_parse(method, strlen(method), &m) != SB_OK) {
        printf("# bad test method %s\n", method);
        abort();
    }
    if (zone_live)
        msgpack_zone_destroy(&zone);
    msgpack_zone_init(&zone, 1024);
    zone_live = 1;
    return sb_call_decode(&call, &m, method, strlen(method), args, binary, &zone);
}

static sb_status_t decode(const char *method, const char *json)
{
    return decode_obj(method, J(json), 0);
}

static const char *stage_name(sb_call_err_stage_t s)
{
    return s == SB_CALL_ERR_NONE ? "none" : s == SB_CALL_ERR_NOW ? "now" : s == SB_CALL_ERR_SUBJECT ? "subject" : "args";
}

/* the last decode failed at this stage, with this status and exactly this reason */
static void expect_err(const char *label, sb_call_err_stage_t stage, sb_status_t st, const char *reason)
{
    if (!ok(call.err_stage == stage && call.err_status == st && strcmp(call.err, reason) == 0, "%s", label))
        printf("#   want %s %d \"%s\"\n#   got  %s %d \"%s\"\n", stage_name(stage), (int)st, reason, stage_name(call.err_stage),
               (int)call.err_status, call.err);
    ok(sb_utf8_valid((const uint8_t *)call.err, strlen(call.err)), "  reason is valid UTF-8");
}

static void expect_ok(const char *label)
{
    if (!ok(call.err_stage == SB_CALL_ERR_NONE, "%s decodes", label))
        printf("#   got %s %d \"%s\"\n", stage_name(call.err_stage), (int)call.err_status, call.err);
}

#define SUBJECT SB_CALL_ERR_SUBJECT
#define ARGS SB_CALL_ERR_ARGS

/* ---- files ----------------------------------------------------------------------------------------------------------- */

static void test_files(void)
{
    static const char unsafe[] = "files path is missing or unsafe";
    static const struct {
        const char *method, *args;
        sb_call_err_stage_t stage;
        sb_status_t st;
        const char *reason;
    } bad[] = {
        {"files.read", NULL, SUBJECT, SB_E_FORBIDDEN, unsafe},
        {"files.read", "null", SUBJECT, SB_E_FORBIDDEN, unsafe},
        {"files.read", "[\"a\"]", SUBJECT, SB_E_FORBIDDEN, unsafe},
        {"files.read", "{}", SUBJECT, SB_E_FORBIDDEN, unsafe},
        {"files.read", "{\"path\": null}", SUBJECT, SB_E_FORBIDDEN, unsafe},
        {"files.read", "{\"path\": 5}", SUBJECT, SB_E_FORBIDDEN, unsafe},
        {"files.read", "{\"path\": \"\"}", SUBJECT, SB_E_FORBIDDEN, unsafe},
        {"files.read", "{\"path\": \"/etc/passwd\"}", SUBJECT, SB_E_FORBIDDEN, unsafe},
        {"files.read", "{\"path\": \"a/../b\"}", SUBJECT, SB_E_FORBIDDEN, unsafe},
        {"files.read", "{\"path\": \"a\\\\b\"}", SUBJECT, SB_E_FORBIDDEN, unsafe},
        {"files.read", "{\"path\": \"a\\u0000b\"}", SUBJECT, SB_E_FORBIDDEN, unsafe},
        {"files.write", "{\"content\": \"x\"}", SUBJECT, SB_E_FORBIDDEN, unsafe},
        {"files.list", "{\"path\": 1}", SUBJECT, SB_E_FORBIDDEN, unsafe},
        {"files.list", "{\"path\": \"..\"}", SUBJECT, SB_E_FORBIDDEN, unsafe},
        /* after the grant */
        {"files.list", "[1]", ARGS, SB_E_BAD_ARGS, "files.list args must be an object"},
        {"files.list", "\"x\"", ARGS, SB_E_BAD_ARGS, "files.list args must be an object"},
        {"files.read", "{\"path\": \"a\", \"mode\": 1}", ARGS, SB_E_BAD_ARGS, "files.read args has an unknown key"},
        {"files.list", "{\"title\": \"x\"}", ARGS, SB_E_BAD_ARGS, "files.list args has an unknown key"},
        {"files.read", "{\"path\": \"a/./b\"}", ARGS, SB_E_FORBIDDEN, "files path has an empty or \".\" segment"},
        {"files.read", "{\"path\": \"dir/\"}", ARGS, SB_E_FORBIDDEN, "files path has an empty or \".\" segment"},
        {"files.list", "{\"path\": \".\"}", ARGS, SB_E_FORBIDDEN, "files path has an empty or \".\" segment"},
        {"files.read", "{\"path\": \"d/.sb-tmp-1\"}", ARGS, SB_E_FORBIDDEN, "files path names a reserved temporary file"},
        {"files.write", "{\"path\": \"a\"}", ARGS, SB_E_BAD_ARGS, "files.write takes content or contentBase64, exactly one"},
        {"files.write", "{\"path\": \"a\", \"content\": null}", ARGS, SB_E_BAD_ARGS,
         "files.write takes content or contentBase64, exactly one"},
        {"files.write", "{\"path\": \"a\", \"content\": \"x\", \"contentBase64\": \"eA==\"}", ARGS, SB_E_BAD_ARGS,
         "files.write takes content or contentBase64, exactly one"},
        {"files.write", "{\"path\": \"a\", \"content\": 5}", ARGS, SB_E_BAD_ARGS, "files.write content must be a string or bin"},
        {"files.write", "{\"path\": \"a\", \"content\": {}}", ARGS, SB_E_BAD_ARGS, "files.write content must be a string or bin"},
        {"files.write", "{\"path\": \"a\", \"contentBase64\": 5}", ARGS, SB_E_BAD_ARGS,
         "files.write contentBase64 must be a base64 string"},
        {"files.write", "{\"path\": \"a\", \"contentBase64\": \"eA\"}", ARGS, SB_E_BAD_ARGS,
         "files.write contentBase64 must be a base64 string"},
        {"files.write", "{\"path\": \"a\", \"contentBase64\": \"e A==\"}", ARGS, SB_E_BAD_ARGS,
         "files.write contentBase64 must be a base64 string"},
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        char label[256];
        snprintf(label, sizeof(label), "%s %s", bad[i].method, bad[i].args != NULL ? bad[i].args : "(no args)");
        ok(decode(bad[i].method, bad[i].args) == bad[i].st, "%s: status", label);
        expect_err(label, bad[i].stage, bad[i].st, bad[i].reason);
    }

    /* the path is the check's normal form: the bytes the globs match are the bytes the handler opens */
    decode("files.read", "{\"path\": \".//docs//a.md\", \"scope\": \"ignored\"}");
    expect_ok("files.read ./ and //");
    is_str(call.files->path, "docs/a.md", "  normalised path");
    is_int(call.files->path_len, 9, "  its length");
    decode("files.list", NULL);
    expect_ok("files.list without args");
    is_int(call.files->has_path, 0, "  lists the root");
    decode("files.list", "{\"path\": null}");
    expect_ok("files.list path null");
    is_int(call.files->has_path, 0, "  null is absent");
    decode("files.write", "{\"path\": \"o/x\", \"content\": \"hi\", \"title\": \"t\", \"mime_type\": \"m\"}");
    expect_ok("files.write text content (title, mime_type ignored)");
    ok(call.files->content_len == 2 && memcmp(call.files->content, "hi", 2) == 0, "  content bytes");
    decode("files.write", "{\"path\": \"o/x\", \"contentBase64\": \"AAEC/w==\"}");
    expect_ok("files.write base64 content");
    ok(call.files->content_len == 4 && memcmp(call.files->content, "\x00\x01\x02\xff", 4) == 0, "  decoded bytes");
    decode("files.write", "{\"path\": \"o/x\", \"contentBase64\": \"\"}");
    expect_ok("files.write empty base64");
    is_int(call.files->content_len, 0, "  no bytes");
    /* {"path": "o", "content": bin} */
    decode_obj("files.write",
               RAW("\x82\xa4path\xa1o\xa7"
                   "content\xc4\x03\x01\x02\x03"),
               1);
    expect_ok("files.write bin content");
    ok(call.files->content_len == 3 && memcmp(call.files->content, "\x01\x02\x03", 3) == 0, "  bin bytes");
    /* {"path": "a", "path": "b"}: two copies of the subject */
    decode_obj("files.read",
               RAW("\x82\xa4path\xa1"
                   "a\xa4path\xa1"
                   "b"),
               1);
    expect_err("duplicate path", SUBJECT, SB_E_BAD_ARGS, "args has a duplicate or non-string key \"path\"");
    /* {"path": "a", bin "path": "b"} */
    decode_obj("files.read",
               RAW("\x82\xa4path\xa1"
                   "a\xc4\x04path\xa1"
                   "b"),
               1);
    expect_err("path as str and bin", SUBJECT, SB_E_BAD_ARGS, "args has a duplicate or non-string key \"path\"");
}

/* ---- collections and the document store ------------------------------------------------------------------------------ */

static void test_data(void)
{
    static const char ns[] = "document_store namespace is missing or invalid";
    static const struct {
        const char *method, *args;
        sb_call_err_stage_t stage;
        sb_status_t st;
        const char *reason;
    } bad[] = {
        /* the namespace of collections.document_store.*, the check's subject */
        {"collections.document_store.find", NULL, SUBJECT, SB_E_FORBIDDEN, ns},
        {"collections.document_store.find", "{}", SUBJECT, SB_E_FORBIDDEN, ns},
        {"collections.document_store.find", "{\"where\": {\"key\": \"k\"}}", SUBJECT, SB_E_FORBIDDEN, ns},
        {"collections.document_store.find", "{\"where\": {\"store\": {\"in\": [\"notes\"]}}}", SUBJECT, SB_E_FORBIDDEN, ns},
        {"collections.document_store.find", "{\"where\": {\"store\": {\"equals\": \"notes\", \"gt\": \"a\"}}}", SUBJECT,
         SB_E_FORBIDDEN, ns},
        {"collections.document_store.find", "{\"where\": {\"store\": \"no tes\"}}", SUBJECT, SB_E_FORBIDDEN, ns},
        {"collections.document_store.findOne", "{\"where\": {\"store\": 5}}", SUBJECT, SB_E_FORBIDDEN, ns},
        {"collections.document_store.delete", "{\"where\": \"notes\"}", SUBJECT, SB_E_FORBIDDEN, ns},
        {"collections.document_store.update", "{\"store\": \"notes\", \"data\": {\"x\": 1}}", SUBJECT, SB_E_FORBIDDEN, ns},
        {"collections.document_store.create", "{\"data\": {\"store\": \"notes\"}}", SUBJECT, SB_E_FORBIDDEN, ns},
        {"collections.document_store.create", "{\"where\": {\"store\": \"notes\"}}", SUBJECT, SB_E_FORBIDDEN, ns},
        {"collections.document_store.create", "{\"store\": \"\"}", SUBJECT, SB_E_FORBIDDEN, ns},
        {"collections.document_store.create", "{\"store\": [\"notes\"]}", SUBJECT, SB_E_FORBIDDEN, ns},
        {"collections.document_store.create", "[]", SUBJECT, SB_E_FORBIDDEN, ns},
        /* the rest: answered after the grant */
        {"collections.posts.find", "[1]", ARGS, SB_E_BAD_ARGS, "find args must be an object"},
        {"collections.posts.find", "{\"bogus\": 1}", ARGS, SB_E_BAD_ARGS, "find takes no argument \"bogus\""},
        {"collections.posts.findOne", "{\"limit\": 1}", ARGS, SB_E_BAD_ARGS, "findOne takes no argument \"limit\""},
        {"collections.posts.create", "{\"data\": {}, \"where\": {}}", ARGS, SB_E_BAD_ARGS, "create takes no argument \"where\""},
        {"collections.posts.delete", "{\"data\": {}}", ARGS, SB_E_BAD_ARGS, "delete takes no argument \"data\""},
        {"store.notes.create", "{\"key\": \"k\"}", ARGS, SB_E_BAD_ARGS, "create takes no argument \"key\""},
        {"collections.posts.find", "{\"limit\": -1}", ARGS, SB_E_BAD_ARGS, "limit must be a non-negative integer"},
        {"collections.posts.find", "{\"limit\": \"5\"}", ARGS, SB_E_BAD_ARGS, "limit must be a non-negative integer"},
        {"collections.posts.find", "{\"limit\": 1.5}", ARGS, SB_E_BAD_ARGS, "limit must be a non-negative integer"},
        {"collections.posts.find", "{\"offset\": 100001}", ARGS, SB_E_BAD_ARGS, "offset must be an integer from 0 to 100000"},
        {"collections.posts.find", "{\"offset\": -1}", ARGS, SB_E_BAD_ARGS, "offset must be an integer from 0 to 100000"},
        {"collections.posts.find", "{\"sort\": []}", ARGS, SB_E_BAD_ARGS, "sort takes 1-8 fields"},
        {"collections.posts.find", "{\"sort\": [\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}", ARGS, SB_E_BAD_ARGS,
         "sort takes 1-8 fields"},
        {"collections.posts.find", "{\"sort\": 5}", ARGS, SB_E_BAD_ARGS, "sort entries are field names, \"-\" for descending"},
        {"collections.posts.find", "{\"sort\": [\"a\", \"\"]}", ARGS, SB_E_BAD_ARGS,
         "sort entries are field names, \"-\" for descending"},
        {"collections.posts.find", "{\"select\": \"title\"}", ARGS, SB_E_BAD_ARGS,
         "select must be an array of field names or an object"},
        {"collections.posts.find", "{\"select\": [\"title\", 1]}", ARGS, SB_E_BAD_ARGS, "select entries must be field names"},
        {"collections.posts.create", "{}", ARGS, SB_E_BAD_ARGS, "data must be a non-empty object"},
        {"collections.posts.create", "{\"data\": [1]}", ARGS, SB_E_BAD_ARGS, "data must be a non-empty object"},
        {"collections.posts.update", "{\"where\": {\"id\": 1}}", ARGS, SB_E_BAD_ARGS, "data must be a non-empty object"},
        {"collections.posts.update", "{\"data\": {}}", ARGS, SB_E_BAD_ARGS, "data must be a non-empty object"},
        /* the where language */
        {"collections.posts.find", "{\"where\": [1]}", ARGS, SB_E_BAD_ARGS, "where must be an object"},
        {"collections.posts.find", "{\"where\": {\"title\": {}}}", ARGS, SB_E_BAD_ARGS, "where.title has no operator"},
        {"collections.posts.find", "{\"where\": {\"title\": {\"regex\": \"x\"}}}", ARGS, SB_E_BAD_ARGS,
         "unknown operator \"regex\" on \"title\""},
        {"collections.posts.find", "{\"where\": {\"and\": []}}", ARGS, SB_E_BAD_ARGS,
         "where.and needs a non-empty array of conditions"},
        {"collections.posts.find", "{\"where\": {\"or\": {}}}", ARGS, SB_E_BAD_ARGS,
         "where.or needs a non-empty array of conditions"},
        {"collections.posts.find", "{\"where\": {\"or\": [5]}}", ARGS, SB_E_BAD_ARGS, "where must be an object"},
        {"collections.posts.find", "{\"where\": {\"views\": {\"gt\": null}}}", ARGS, SB_E_BAD_ARGS,
         "operator \"gt\" on \"views\" needs a scalar"},
        {"collections.posts.find", "{\"where\": {\"views\": {\"lte\": [1]}}}", ARGS, SB_E_BAD_ARGS,
         "operator \"lte\" on \"views\" needs a scalar"},
        {"collections.posts.find", "{\"where\": {\"views\": {\"in\": 1}}}", ARGS, SB_E_BAD_ARGS,
         "operator \"in\" on \"views\" needs an array of at most 100 values"},
        {"collections.posts.find", "{\"where\": {\"views\": {\"not_in\": [1, null]}}}", ARGS, SB_E_BAD_ARGS,
         "operator \"not_in\" on \"views\" cannot hold null"},
        {"collections.posts.find", "{\"where\": {\"title\": {\"like\": 1}}}", ARGS, SB_E_BAD_ARGS,
         "operator \"like\" on \"title\" needs a string"},
        {"collections.posts.find", "{\"where\": {\"title\": {\"contains\": \"a\\u0000b\"}}}", ARGS, SB_E_BAD_ARGS,
         "operator \"contains\" on \"title\" needs a string"},
        {"collections.posts.find", "{\"where\": {\"title\": {\"exists\": \"yes\"}}}", ARGS, SB_E_BAD_ARGS,
         "operator \"exists\" on \"title\" needs true or false"},
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        char label[320];
        snprintf(label, sizeof(label), "%s %s", bad[i].method, bad[i].args != NULL ? bad[i].args : "(no args)");
        ok(decode(bad[i].method, bad[i].args) == bad[i].st, "%s: status", label);
        expect_err(label, bad[i].stage, bad[i].st, bad[i].reason);
    }

    /* caps of the where language */
    {
        char deep[1024], conds[8192], in[1024];
        size_t n = 0;
        for (int i = 0; i < 9; ++i)
            n += (size_t)snprintf(deep + n, sizeof(deep) - n, "{\"and\": [");
        n += (size_t)snprintf(deep + n, sizeof(deep) - n, "{\"views\": 1}");
        for (int i = 0; i < 9; ++i)
            n += (size_t)snprintf(deep + n, sizeof(deep) - n, "]}");
        snprintf(conds, sizeof(conds), "{\"where\": %s}", deep);
        decode("collections.posts.find", conds);
        expect_err("nesting 9", ARGS, SB_E_BAD_ARGS, "where is nested deeper than 8");
        n = (size_t)snprintf(conds, sizeof(conds), "{\"where\": {\"and\": [");
        for (int i = 0; i < 33; ++i)
            n += (size_t)snprintf(conds + n, sizeof(conds) - n, "%s{\"views\": {\"gt\": 0, \"lt\": 9}}", i ? "," : "");
        snprintf(conds + n, sizeof(conds) - n, "]}}");
        decode("collections.posts.find", conds);
        expect_err("66 conditions", ARGS, SB_E_BAD_ARGS, "where has more than 64 conditions");
        n = (size_t)snprintf(in, sizeof(in), "{\"where\": {\"views\": {\"in\": [");
        for (int i = 0; i < 101; ++i)
            n += (size_t)snprintf(in + n, sizeof(in) - n, "%s%d", i ? "," : "", i);
        snprintf(in + n, sizeof(in) - n, "]}}}");
        decode("collections.posts.find", in);
        expect_err("in with 101 values", ARGS, SB_E_BAD_ARGS, "operator \"in\" on \"views\" needs an array of at most 100 values");
    }

    /* the document-store namespace, from each spelling */
    decode("store.notes.find", "{}");
    expect_ok("store.notes.find");
    ok(call.data->docstore && strcmp(call.data->ns, "notes") == 0 && call.data->ns_len == 5, "  namespace from the method");
    decode("collections.document_store.find", "{\"where\": {\"store\": \"notes\", \"key\": \"k\"}}");
    expect_ok("document_store.find where.store");
    ok(call.data->docstore && strcmp(call.data->ns, "notes") == 0, "  namespace from where.store");
    decode("collections.document_store.update", "{\"where\": {\"store\": {\"equals\": \"rw\"}}, \"data\": {\"data\": 1}}");
    expect_ok("document_store.update where.store.equals");
    ok(strcmp(call.data->ns, "rw") == 0, "  namespace from {equals}");
    /* upstream's create, byte for byte: {...x, store: s} */
    decode("collections.document_store.create", "{\"key\":\"k1\",\"data\":{\"v\":1},\"store\":\"notes\"}");
    expect_ok("upstream create");
    ok(strcmp(call.data->ns, "notes") == 0, "  namespace from the top-level store");
    ok(call.data->ndata == 2 && call.data->data[0].len == 3 && memcmp(call.data->data[0].name, "key", 3) == 0 &&
           call.data->data[1].len == 4 && memcmp(call.data->data[1].name, "data", 4) == 0,
       "  the document's fields, store left out");
    decode("collections.document_store.create", "{\"store\":\"notes\"}");
    expect_ok("upstream create of an empty document");
    is_int(call.data->ndata, 0, "  no fields");
    decode("collections.posts.find", "{}");
    expect_ok("collections.posts.find");
    ok(!call.data->docstore && call.data->ns == NULL, "  a collection has no namespace");

    /* what a find decodes to */
    decode("collections.posts.find",
           "{\"where\": {\"a\": 1, \"b\": {\"gt\": 2, \"lt\": 3}, \"or\": [{\"c\": null}, {}]},"
           " \"limit\": 500, \"offset\": 7, \"sort\": [\"-x\", \"y\"], \"select\": {\"p\": true, \"q\": 1}}");
    expect_ok("a full find");
    {
        const sb_call_data_t *d = call.data;
        const sb_where_t *w = d->where;
        ok(d->has_limit && d->limit == 500 && d->offset == 7, "  page (the limit clamp is the builder's)");
        ok(d->nsort == 2 && d->sort[0].desc && d->sort[0].len == 1 && d->sort[0].name[0] == 'x' && !d->sort[1].desc, "  sort keys");
        ok(d->has_select && d->nselect == 2 && d->select[0].wanted && !d->select[1].wanted, "  select {p: true, q: 1}");
        ok(w != NULL && w->kind == SB_WHERE_ALL && w->n == 3, "  where: a map of three entries");
        ok(w->v[0].kind == SB_WHERE_COND && w->v[0].op == SB_WOP_EQUALS && w->v[0].field_len == 1, "  a bare value is equals");
        ok(w->v[1].kind == SB_WHERE_OPS && w->v[1].n == 2 && w->v[1].v[0].op == SB_WOP_GT && w->v[1].v[1].op == SB_WOP_LT,
           "  an operator map keeps its operators, in order");
        ok(w->v[2].kind == SB_WHERE_OR && w->v[2].n == 2 && w->v[2].v[0].kind == SB_WHERE_ALL && w->v[2].v[1].n == 0,
           "  or holds where maps ({} is TRUE)");
    }
    decode("collections.posts.find", "{\"where\": null, \"sort\": null, \"select\": null, \"limit\": null}");
    expect_ok("nulls are absent");
    ok(call.data->where == NULL && call.data->nsort == 0 && !call.data->has_select && !call.data->has_limit, "  nothing set");
}

/* ---- guest names echoed in reasons: cut on a code point boundary ------------------------------------------------------- */

static void test_utf8_echo(void)
{
    char field[200], json[512], want[300];
    size_t n;

    /* a field of 63 ASCII bytes and one 2-byte character: 65 bytes, cut at 64 would split the character */
    memset(field, 'f', 63);
    memcpy(field + 63, "\xc3\xa9", 2);
    field[65] = '\0';
    snprintf(json, sizeof(json), "{\"where\": {\"%s\": {}}}", field);
    decode("collections.posts.find", json);
    snprintf(want, sizeof(want), "where.%.63s has no operator", field);
    expect_err("a 2-byte character across the 64-byte cut is left out whole", ARGS, SB_E_BAD_ARGS, want);
    /* 62 ASCII bytes and a 3-byte character (65 bytes): cut to 62 */
    memset(field, 'g', 62);
    memcpy(field + 62, "\xe2\x82\xac", 3);
    field[65] = '\0';
    snprintf(json, sizeof(json), "{\"where\": {\"%s\": {\"eq\": 1}}}", field);
    decode("collections.posts.find", json);
    snprintf(want, sizeof(want), "unknown operator \"eq\" on \"%.62s\"", field);
    expect_err("a 3-byte character across the field cut", ARGS, SB_E_BAD_ARGS, want);
    /* an operator of 31 ASCII bytes and a 4-byte character (35 bytes): cut at 32 leaves 31 */
    memset(field, 'o', 31);
    memcpy(field + 31, "\xf0\x9f\x98\x80", 4);
    field[35] = '\0';
    snprintf(json, sizeof(json), "{\"where\": {\"title\": {\"%s\": 1}}}", field);
    decode("collections.posts.find", json);
    snprintf(want, sizeof(want), "unknown operator \"%.31s\" on \"title\"", field);
    expect_err("a 4-byte character across the 32-byte operator cut", ARGS, SB_E_BAD_ARGS, want);
    /* an unknown argument key: 30 ASCII bytes and a 4-byte character, cut at 32 leaves 30 */
    memset(field, 'k', 30);
    memcpy(field + 30, "\xf0\x9f\x98\x80", 4);
    field[34] = '\0';
    snprintf(json, sizeof(json), "{\"%s\": 1}", field);
    decode("collections.posts.find", json);
    snprintf(want, sizeof(want), "find takes no argument \"%.30s\"", field);
    expect_err("a 4-byte character across the 32-byte key cut", ARGS, SB_E_BAD_ARGS, want);
    /* exactly at the cut: a character that ends on byte 64 is kept */
    memset(field, 'h', 62);
    memcpy(field + 62, "\xc3\xa9", 2);
    field[64] = 'z';
    field[65] = '\0';
    snprintf(json, sizeof(json), "{\"where\": {\"%s\": {}}}", field);
    decode("collections.posts.find", json);
    n = (size_t)snprintf(want, sizeof(want), "where.%.64s has no operator", field);
    ok(n > 0, "built");
    expect_err("a character ending on the cut is kept", ARGS, SB_E_BAD_ARGS, want);
}

/* ---- tools ----------------------------------------------------------------------------------------------------------- */

static void test_tools(void)
{
    static const char name[] = "tools.call name is missing or invalid", args[] = "invalid sandbox custom tool arguments";
    char big[70000], longname[300];
    size_t n;

    decode("tools.list", NULL);
    expect_ok("tools.list without args");
    decode("tools.list", "{}");
    expect_ok("tools.list {}");
    decode("tools.list", "{\"x\": 1}");
    expect_err("tools.list {x}", ARGS, SB_E_BAD_ARGS, args);
    decode("tools.list", "null");
    expect_err("tools.list null", ARGS, SB_E_BAD_ARGS, args);
    decode("tools.list", "[]");
    expect_err("tools.list []", ARGS, SB_E_BAD_ARGS, args);

    decode("tools.call", NULL);
    expect_err("tools.call without args", SUBJECT, SB_E_FORBIDDEN, name);
    decode("tools.call", "[\"echo\"]");
    expect_err("tools.call with an array", SUBJECT, SB_E_FORBIDDEN, name);
    decode("tools.call", "{\"name\": 5}");
    expect_err("tools.call name 5", SUBJECT, SB_E_FORBIDDEN, name);
    decode("tools.call", "{\"name\": \"\"}");
    expect_err("tools.call empty name", SUBJECT, SB_E_FORBIDDEN, name);
    memset(longname, 'n', 257);
    longname[257] = '\0';
    snprintf(big, sizeof(big), "{\"name\": \"%s\"}", longname);
    decode("tools.call", big);
    expect_err("tools.call 257-byte name", SUBJECT, SB_E_FORBIDDEN, name);
    longname[256] = '\0';
    snprintf(big, sizeof(big), "{\"name\": \"%s\"}", longname);
    decode("tools.call", big);
    expect_ok("tools.call 256-byte name");
    decode("tools.call", "{\"name\": \"echo\", \"envelope\": {}}");
    expect_err("tools.call extra key", ARGS, SB_E_BAD_ARGS, args);
    decode("tools.call", "{\"name\": \"echo\", \"arguments\": []}");
    expect_err("tools.call arguments array", ARGS, SB_E_BAD_ARGS, args);
    decode("tools.call", "{\"name\": \"echo\", \"arguments\": null}");
    expect_err("tools.call arguments null", ARGS, SB_E_BAD_ARGS, args);
    /* {"name": "echo", "arguments": {"n": 2^64 - 1}}: above int64, JSON cannot carry it to the MCP server */
    decode_obj("tools.call",
               RAW("\x82\xa4name\xa4"
                   "echo\xa9"
                   "arguments\x81\xa1n\xcf\xff\xff\xff\xff\xff\xff\xff\xff"),
               1);
    expect_err("tools.call arguments JSON cannot carry", ARGS, SB_E_BAD_ARGS, args);
    decode("tools.call", "{\"name\": \"echo\", \"arguments\": {\"message\": \"hi\"}}");
    expect_ok("tools.call with arguments");
    ok(call.tools->name_len == 4 && memcmp(call.tools->name, "echo", 4) == 0 && call.tools->arguments != NULL, "  name, arguments");
    /* the 63 KiB cap, on the packed form: a map {"m": str} packs as 1 + 2 + (3 + len) */
    n = (size_t)snprintf(big, sizeof(big), "{\"name\": \"echo\", \"arguments\": {\"m\": \"");
    memset(big + n, 'x', 64512 - 6);
    snprintf(big + n + 64512 - 6, sizeof(big) - n - 64512 + 6, "\"}}");
    decode("tools.call", big);
    expect_ok("tools.call arguments of exactly 64512 packed bytes");
    memset(big + n, 'x', 64512 - 5);
    snprintf(big + n + 64512 - 5, sizeof(big) - n - 64512 + 5, "\"}}");
    decode("tools.call", big);
    expect_err("tools.call arguments of 64513 packed bytes", ARGS, SB_E_BAD_ARGS, "sandbox custom tool arguments are too large");
}

/* ---- http.fetch ------------------------------------------------------------------------------------------------------ */

static void test_fetch(void)
{
    static const struct {
        const char *args;
        sb_call_err_stage_t stage;
        const char *reason;
    } bad[] = {
        {NULL, SUBJECT, "http.fetch url is invalid: missing or not a string"},
        {"[]", SUBJECT, "http.fetch url is invalid: missing or not a string"},
        {"{}", SUBJECT, "http.fetch url is invalid: missing or not a string"},
        {"{\"url\": 5}", SUBJECT, "http.fetch url is invalid: missing or not a string"},
        {"{\"url\": \"ftp://example.com/\"}", SUBJECT, "http.fetch url is invalid: unsupported scheme"},
        {"{\"url\": \"http://u@example.com/\"}", SUBJECT, "http.fetch url is invalid: userinfo is not allowed"},
        {"{\"url\": \"https://example.com/\", \"mode\": \"cors\"}", ARGS, "http.fetch args has an unknown key"},
        {"{\"url\": \"https://example.com/\", \"method\": 5}", ARGS,
         "http.fetch method must be an HTTP token of at most 32 characters"},
        {"{\"url\": \"https://example.com/\", \"method\": \"GE T\"}", ARGS,
         "http.fetch method must be an HTTP token of at most 32 characters"},
        {"{\"url\": \"https://example.com/\", \"method\": \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}", ARGS,
         "http.fetch method must be an HTTP token of at most 32 characters"},
        {"{\"url\": \"https://example.com/\", \"method\": \"connect\"}", ARGS, "http.fetch method CONNECT is not allowed"},
        {"{\"url\": \"https://example.com/\", \"method\": \"TRACE\"}", ARGS, "http.fetch method TRACE is not allowed"},
        {"{\"url\": \"https://example.com/\", \"headers\": []}", ARGS, "http.fetch headers must be an object"},
        {"{\"url\": \"https://example.com/\", \"headers\": {\"a b\": \"x\"}}", ARGS, "http.fetch header names must be HTTP tokens"},
        {"{\"url\": \"https://example.com/\", \"headers\": {\"x\": \"a\\r\\nb\"}}", ARGS,
         "http.fetch header values must not contain control characters"},
        {"{\"url\": \"https://example.com/\", \"bodyBase64\": 0}", ARGS, "http.fetch bodyBase64 must be a base64 string"},
        {"{\"url\": \"https://example.com/\", \"bodyBase64\": \"abc\"}", ARGS, "http.fetch bodyBase64 must be a base64 string"},
        {"{\"url\": \"https://example.com/\", \"bodyBase64\": \"\", \"body\": \"x\"}", ARGS,
         "http.fetch takes body or bodyBase64, not both"},
        {"{\"url\": \"https://example.com/\", \"body\": 5}", ARGS, "http.fetch body must be bin or str"},
    };
    char headers[8192];
    size_t n;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        char label[320];
        snprintf(label, sizeof(label), "http.fetch %s", bad[i].args != NULL ? bad[i].args : "(no args)");
        ok(decode("http.fetch", bad[i].args) == SB_E_BAD_ARGS, "%s: status", label);
        expect_err(label, bad[i].stage, SB_E_BAD_ARGS, bad[i].reason);
    }
    n = (size_t)snprintf(headers, sizeof(headers), "{\"url\": \"https://example.com/\", \"headers\": {");
    for (int i = 0; i < 65; ++i)
        n += (size_t)snprintf(headers + n, sizeof(headers) - n, "%s\"h%d\": \"v\"", i ? "," : "", i);
    snprintf(headers + n, sizeof(headers) - n, "}}");
    decode("http.fetch", headers);
    expect_err("65 headers", ARGS, SB_E_BAD_ARGS, "http.fetch headers exceed 64 entries or 65536 bytes");

    decode("http.fetch", "{\"url\": \"HTTPS://Example.COM./a/../b?q#f\", \"method\": \"post\", \"headers\": {\"X-Up\": \"1\","
                         " \"Host\": \"evil\", \"content-length\": \"9\", \"n\": 5, \"Authorization\": \"t\"},"
                         " \"bodyBase64\": \"aGk=\"}");
    expect_ok("a full fetch");
    {
        const sb_call_fetch_t *f = call.fetch;
        ok(f->url.scheme == SB_URL_HTTPS && strcmp(f->url.host, "example.com") == 0 && f->url.port == 443 &&
               strcmp(f->url.target, "/b?q") == 0,
           "  the URL parsed once, canonical");
        is_str(f->method, "POST", "  method uppercased");
        ok(f->nheaders == 2 && strcmp(f->headers[0].name, "x-up") == 0 && f->headers[0].value_len == 1 &&
               strcmp(f->headers[1].name, "authorization") == 0,
           "  headers lowercased; host, content-length and non-string values dropped");
        ok(f->body_len == 2 && memcmp(f->body, "hi", 2) == 0, "  body decoded");
    }
    decode("http.fetch", "{\"url\": \"http://example.com\", \"method\": null, \"bodyBase64\": null}");
    expect_ok("a bare fetch");
    ok(strcmp(call.fetch->method, "GET") == 0 && call.fetch->nheaders == 0 && call.fetch->body_len == 0, "  GET, nothing else");
}

/* ---- the rest -------------------------------------------------------------------------------------------------------- */

static void test_others(void)
{
    static const char *const methods[] = {"globals.site.get", "services.billing.charge", "jobs.enqueue.mail",
                                          "workflows.trigger.onboard", "email.send"};
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); ++i) {
        ok(decode(methods[i], "[1, {\"x\": null}]") == SB_OK, "%s ignores its args", methods[i]);
        ok(call.files == NULL && call.data == NULL && call.tools == NULL && call.fetch == NULL, "  and decodes no family");
    }
    decode("files.read", "{\"path\": \"a\"}");
    ok(call.m.kind == SB_MK_FILES && call.method_len == 10 && memcmp(call.method, "files.read", 10) == 0 && call.cid == NULL,
       "the call keeps its method");
}

int main(void)
{
    test_files();
    test_data();
    test_utf8_echo();
    test_tools();
    test_fetch();
    test_others();
    if (zone_live)
        msgpack_zone_destroy(&zone);
    free_kept();
    return done_testing();
}
