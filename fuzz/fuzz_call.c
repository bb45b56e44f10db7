/*
 * libFuzzer driver for broker/call (sb_call_decode), the typed-call decoder,
 * with the capability check (sb_authz_check) and the error bodies the RPC
 * route would answer with (sb_reply_error_body).
 *
 * Input: byte 0 picks the method (from a fixed list covering every family,
 * both document-store spellings included); byte 1, bit 0: the request is
 * msgpack (else JSON); the rest is the args value, decoded as the route
 * decodes a body (sb_mp_decode, or sb_json_parse);
 * an empty rest means "no args". The call is decoded, then checked against a
 * fixed manifest that grants something on every axis.
 *
 * Properties:
 *  - the decoder answers SB_OK exactly when the call carries no error; an
 *    error has a stage, a status from the table and a non-empty reason that
 *    is valid UTF-8; decoding the same args again gives the same call;
 *  - the check never changes the call (a canonical dump of every decoded
 *    field is the same before and after), so a granted call is exactly what
 *    dispatch hands the handler;
 *  - a call that is granted and carries no error is what its raw args say,
 *    decoded once: the files path is sb_path_normalize of args.path, passes
 *    the storage shape and matches a glob of the manifest; the fetch URL is
 *    sb_url_parse of args.url, field for field, and its host is allowed; the
 *    tool name is args.name byte for byte and matches a tools glob; the
 *    document-store namespace is the one the args (or the method) name, and
 *    the manifest grants it the verb;
 *  - an error in the check's subject is never granted: a call whose subject
 *    the decoder refused is refused by the check (or by an axis before it);
 *  - every error reply the route could send for the call (the decoder's,
 *    the check's, in JSON and in msgpack) is valid UTF-8; the JSON one parses
 *    (jansson, strict) with the right code, the msgpack one passes the
 *    pre-check.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <msgpack.h>
#include "sb/limits.h"
#include "sb/method.h"
#include "sb/value.h"
#include "authz/authz.h"
#include "call/call.h"
#include "call/path.h"
#include "http/reply.h"
#include "fuzz.h"

static const char *const methods[] = {
    "files.read",
    "files.write",
    "files.list",
    "collections.posts.find",
    "collections.posts.findOne",
    "collections.posts.create",
    "collections.posts.update",
    "collections.posts.delete",
    "collections.document_store.find",
    "collections.document_store.findOne",
    "collections.document_store.create",
    "collections.document_store.update",
    "collections.document_store.delete",
    "store.notes.find",
    "store.ro.create",
    "globals.site.get",
    "services.billing.charge",
    "email.send",
    "http.fetch",
    "tools.list",
    "tools.call",
    "import.fetch",
};

static const char manifest_json[] =
    "{\"net\": [\"example.com\", \"*.ok.test\", \"[::1]:8080\", \"1.2.3.4\", \"xn--bcher-kva.example\"],"
    " \"import\": [\"esm.test\", \"*.cdn.test:8443\"],"
    " \"files\": {\"read\": [\"docs/**\", \"a/?/b\", \"*.md\", \"x\"], \"write\": [\"out/**\", \"x\"]},"
    " \"data\": {\"collections\": {\"posts\": [\"read\", \"create\", \"update\", \"delete\"]},"
    "          \"globals\": {\"site\": [\"read\"]}, \"stores\": {\"notes\": [\"read\", \"write\"], \"ro\": [\"read\"]}},"
    " \"services\": [\"billing\"], \"tools\": [\"echo\", \"git*\", \"a?c\"]}";
static const char *const read_globs[] = {"docs/**", "a/?/b", "*.md", "x", NULL};
static const char *const write_globs[] = {"out/**", "x", NULL};
static const char *const tool_globs[] = {"echo", "git*", "a?c", NULL};

static sb_manifest_t *manifest;

/* ---- a canonical dump of everything the decoder produced --------------------------------------------------------- */

typedef struct st_dump_t {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} dump_t;

static void put_bytes(dump_t *d, const void *p, size_t n)
{
    msgpack_pack_bin(&d->pk, n);
    if (n != 0)
        msgpack_pack_bin_body(&d->pk, p, n);
}

static void put_where(dump_t *d, const sb_where_t *w)
{
    if (w == NULL) {
        msgpack_pack_nil(&d->pk);
        return;
    }
    msgpack_pack_array(&d->pk, 5);
    msgpack_pack_int(&d->pk, (int)w->kind);
    put_bytes(d, w->field, w->field_len);
    msgpack_pack_int(&d->pk, (int)w->op);
    if (w->value != NULL)
        msgpack_pack_object(&d->pk, *w->value);
    else
        msgpack_pack_nil(&d->pk);
    msgpack_pack_array(&d->pk, w->n);
    for (uint32_t i = 0; i < w->n; ++i)
        put_where(d, &w->v[i]);
}

static void dump_call(const sb_call_t *c, msgpack_sbuffer *out)
{
    dump_t d;

    msgpack_sbuffer_init(&d.sb);
    msgpack_packer_init(&d.pk, &d.sb, msgpack_sbuffer_write);
    msgpack_pack_array(&d.pk, 4);
    msgpack_pack_int(&d.pk, (int)c->err_stage);
    msgpack_pack_int(&d.pk, (int)c->err_status);
    put_bytes(&d, c->err, strlen(c->err));
    if (c->files != NULL) {
        put_bytes(&d, "files", 5);
        msgpack_pack_int(&d.pk, c->files->has_path);
        put_bytes(&d, c->files->path, c->files->path_len);
        put_bytes(&d, c->files->content, c->files->content_len);
    } else if (c->data != NULL) {
        const sb_call_data_t *x = c->data;
        put_bytes(&d, "data", 4);
        msgpack_pack_int(&d.pk, x->docstore);
        put_bytes(&d, x->ns, x->ns != NULL ? x->ns_len : 0);
        put_where(&d, x->where);
        for (size_t i = 0; i < x->ndata; ++i) {
            put_bytes(&d, x->data[i].name, x->data[i].len);
            msgpack_pack_object(&d.pk, *x->data[i].value);
        }
        msgpack_pack_int(&d.pk, x->has_limit);
        msgpack_pack_uint64(&d.pk, x->limit);
        msgpack_pack_uint64(&d.pk, x->offset);
        for (size_t i = 0; i < x->nsort; ++i) {
            put_bytes(&d, x->sort[i].name, x->sort[i].len);
            msgpack_pack_int(&d.pk, x->sort[i].desc);
        }
        msgpack_pack_int(&d.pk, x->has_select);
        for (size_t i = 0; i < x->nselect; ++i) {
            put_bytes(&d, x->select[i].name, x->select[i].len);
            msgpack_pack_int(&d.pk, x->select[i].wanted);
        }
    } else if (c->tools != NULL) {
        put_bytes(&d, "tools", 5);
        put_bytes(&d, c->tools->name, c->tools->name_len);
        if (c->tools->arguments != NULL)
            msgpack_pack_object(&d.pk, *c->tools->arguments);
    } else if (c->fetch != NULL) {
        const sb_call_fetch_t *f = c->fetch;
        put_bytes(&d, "fetch", 5);
        msgpack_pack_int(&d.pk, (int)f->url.scheme);
        msgpack_pack_int(&d.pk, (int)f->url.host_kind);
        put_bytes(&d, f->url.host, f->url.host_len);
        msgpack_pack_int(&d.pk, f->url.port);
        put_bytes(&d, f->url.target, f->url.target_len);
        put_bytes(&d, f->method, strlen(f->method));
        for (size_t i = 0; i < f->nheaders; ++i) {
            const sb_call_header_t *h = &f->headers[i];
            put_bytes(&d, h->name, h->name_len);
            put_bytes(&d, h->value, h->value_len);
            /* the secret placeholders: inside the value, well formed, in order (PROTOCOL.md section 5) */
            for (size_t k = 0; k < h->nph; ++k) {
                const sb_placeholder_t *p = &h->ph[k];
                SB_FUZZ_ASSERT(p->start + p->len <= h->value_len && (k == 0 || p->start >= h->ph[k - 1].start + h->ph[k - 1].len),
                               "placeholder %zu of header %zu out of place", k, i);
                SB_FUZZ_ASSERT(memcmp(h->value + p->start, SB_PLACEHOLDER_OPEN, SB_PLACEHOLDER_OPEN_LEN) == 0 &&
                                   sb_placeholder_is_name(h->value + p->name, p->name_len),
                               "placeholder %zu of header %zu malformed", k, i);
                msgpack_pack_uint64(&d.pk, p->start);
                msgpack_pack_uint64(&d.pk, p->len);
            }
        }
        for (size_t k = 0; k < f->nsecrets; ++k) {
            for (size_t j = 0; j < k; ++j)
                SB_FUZZ_ASSERT(!(f->secrets[j].len == f->secrets[k].len &&
                                 memcmp(f->secrets[j].name, f->secrets[k].name, f->secrets[k].len) == 0),
                               "secret name %zu listed twice", k);
            put_bytes(&d, f->secrets[k].name, f->secrets[k].len);
        }
        put_bytes(&d, f->body, f->body_len);
    } else {
        msgpack_pack_nil(&d.pk);
    }
    *out = d.sb;
}

static int same_dump(const msgpack_sbuffer *a, const msgpack_sbuffer *b)
{
    return a->size == b->size && (a->size == 0 || memcmp(a->data, b->data, a->size) == 0);
}

/* ---- the error replies ------------------------------------------------------------------------------------------------ */

/* the error body, in a buffer capped as the route caps it; its length */
static size_t error_body(char *buf, sb_status_t st, const char *message, int binary)
{
    sb_buf_t b;
    size_t n;

    sb_buf_init(&b, SB_REPLY_ERROR_MAX);
    SB_FUZZ_ASSERT(sb_reply_error_body(&b, st, message, "0f0e0d0c-0b0a-4908-8706-050403020100", binary) == SB_OK,
                   "no error body within SB_REPLY_ERROR_MAX");
    n = b.len;
    memcpy(buf, b.base, n);
    sb_buf_free(&b);
    return n;
}

static void check_reply(sb_status_t st, const char *message)
{
    char buf[SB_REPLY_ERROR_MAX];
    size_t n;
    json_error_t jerr;
    json_t *j;
    msgpack_zone zone;
    msgpack_object o;
    const char *why = NULL;

    n = error_body(buf, st, message, 0);
    SB_FUZZ_ASSERT(sb_utf8_valid((const uint8_t *)buf, n), "JSON error body is not UTF-8: %.*s", (int)n, buf);
    j = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &jerr);
    SB_FUZZ_ASSERT(j != NULL, "JSON error body does not parse (%s): %.*s", jerr.text, (int)n, buf);
    SB_FUZZ_ASSERT(json_is_false(json_object_get(j, "ok")) &&
                       strcmp(json_string_value(json_object_get(json_object_get(j, "error"), "code")), sb_status_code(st)) == 0,
                   "JSON error body: %.*s", (int)n, buf);
    json_decref(j);
    n = error_body(buf, st, message, 1);
    msgpack_zone_init(&zone, 1024);
    SB_FUZZ_ASSERT(sb_mp_decode((const uint8_t *)buf, n, &zone, &o, &why) == SB_OK, "msgpack error body refused: %s", why);
    msgpack_zone_destroy(&zone);
}

/* ---- what a granted call must be -------------------------------------------------------------------------------------- */

static int glob_any(const char *const *globs, const char *s, size_t len)
{
    for (size_t i = 0; globs[i] != NULL; ++i)
        if (sb_glob_match(globs[i], strlen(globs[i]), s, len))
            return 1;
    return 0;
}

/* a directory that some glob lives under (files.list) */
static int under_any(const char *const *globs, const char *dir, size_t len)
{
    for (size_t i = 0; globs[i] != NULL; ++i)
        if (strlen(globs[i]) > len && memcmp(globs[i], dir, len) == 0 && globs[i][len] == '/')
            return 1;
    return 0;
}

static const msgpack_object *raw_str(const msgpack_object *args, const char *key)
{
    const msgpack_object *v = sb_mp_get(args, key);
    return v != NULL && v->type == MSGPACK_OBJECT_STR ? v : NULL;
}

static void check_granted(const sb_call_t *c, const msgpack_object *args)
{
    const sb_method_t *m = &c->m;

    switch (m->kind) {
    case SB_MK_FILES: {
        const sb_call_files_t *f = c->files;
        const msgpack_object *p = raw_str(args, "path");
        char norm[SB_MAX_PATH + 1];
        const char *why = NULL;
        SB_FUZZ_ASSERT(f != NULL, "granted files call without files args");
        if (!f->has_path) {
            SB_FUZZ_ASSERT(m->op == SB_OP_LIST, "files.%s granted without a path", sb_method_op_name(m->op));
            return;
        }
        SB_FUZZ_ASSERT(p != NULL && sb_path_normalize(p->via.str.ptr, p->via.str.size, norm, sizeof(norm)) == SB_OK &&
                           strcmp(norm, f->path) == 0 && strlen(f->path) == f->path_len,
                       "the handler's path \"%s\" is not the normal form of args.path", f->path);
        SB_FUZZ_ASSERT(sb_path_storage_check(f->path, f->path_len, &why) == SB_OK, "granted path \"%s\": %s", f->path, why);
        SB_FUZZ_ASSERT(m->op == SB_OP_WRITE ? glob_any(write_globs, f->path, f->path_len)
                       : m->op == SB_OP_READ
                           ? glob_any(read_globs, f->path, f->path_len)
                           : glob_any(read_globs, f->path, f->path_len) || under_any(read_globs, f->path, f->path_len),
                       "files.%s granted \"%s\", which no glob matches", sb_method_op_name(m->op), f->path);
        return;
    }
    case SB_MK_HTTP: {
        const msgpack_object *u = raw_str(args, "url");
        sb_url_t url;
        SB_FUZZ_ASSERT(c->fetch != NULL && u != NULL && sb_url_parse(u->via.str.ptr, u->via.str.size, &url, NULL) == SB_OK,
                       "http.fetch granted for a URL the parser refuses");
        SB_FUZZ_ASSERT(url.scheme == c->fetch->url.scheme && url.host_kind == c->fetch->url.host_kind &&
                           strcmp(url.host, c->fetch->url.host) == 0 && url.port == c->fetch->url.port &&
                           strcmp(url.target, c->fetch->url.target) == 0,
                       "the handler's URL is not args.url parsed once");
        SB_FUZZ_ASSERT(sb_authz_fetch_allows(manifest, &c->fetch->url, c->fetch->method), "granted URL not in net");
        return;
    }
    case SB_MK_IMPORT: {
        const msgpack_object *u = raw_str(args, "url");
        sb_url_t url;
        SB_FUZZ_ASSERT(c->fetch != NULL && u != NULL && sb_url_parse(u->via.str.ptr, u->via.str.size, &url, NULL) == SB_OK,
                       "import.fetch granted for a URL the parser refuses");
        SB_FUZZ_ASSERT(strcmp(url.host, c->fetch->url.host) == 0 && url.port == c->fetch->url.port &&
                           strcmp(url.target, c->fetch->url.target) == 0,
                       "the handler's URL is not args.url parsed once");
        SB_FUZZ_ASSERT(strcmp(c->fetch->method, "GET") == 0 && c->fetch->nheaders == 0 && c->fetch->body_len == 0,
                       "import.fetch granted with more than a GET of its URL");
        SB_FUZZ_ASSERT(sb_authz_import_allows(manifest, &c->fetch->url), "granted URL not in import");
        SB_FUZZ_ASSERT(c->module_path, "import.fetch granted as a binding call");
        /* a net grant is no import grant: example.com is in net only */
        SB_FUZZ_ASSERT(strcmp(c->fetch->url.host, "example.com") != 0, "import.fetch granted a net host");
        return;
    }
    case SB_MK_TOOLS:
        if (m->op == SB_OP_CALL) {
            const msgpack_object *n = raw_str(args, "name");
            SB_FUZZ_ASSERT(c->tools != NULL && n != NULL && n->via.str.size == c->tools->name_len &&
                               memcmp(n->via.str.ptr, c->tools->name, n->via.str.size) == 0,
                           "the handler's tool name is not args.name");
            SB_FUZZ_ASSERT(glob_any(tool_globs, c->tools->name, c->tools->name_len), "tool granted that no glob matches");
        }
        return;
    case SB_MK_COLLECTIONS:
    case SB_MK_STORE: {
        const sb_call_data_t *d = c->data;
        const msgpack_object *ns = NULL;
        int write = m->op != SB_OP_FIND && m->op != SB_OP_FIND_ONE;
        SB_FUZZ_ASSERT(d != NULL, "granted data call without data args");
        if (!d->docstore)
            return;
        SB_FUZZ_ASSERT(d->ns != NULL && strlen(d->ns) == d->ns_len, "document store granted without a namespace");
        if (m->kind == SB_MK_STORE) {
            SB_FUZZ_ASSERT(d->ns_len == m->name_len && memcmp(d->ns, m->name, m->name_len) == 0, "namespace is not the method's");
        } else {
            if (m->op == SB_OP_CREATE) {
                ns = raw_str(args, "store");
            } else {
                const msgpack_object *s = sb_mp_get(sb_mp_get(args, "where"), "store");
                ns = s != NULL && s->type == MSGPACK_OBJECT_MAP ? sb_mp_get(s, "equals") : s;
            }
            SB_FUZZ_ASSERT(ns != NULL && ns->type == MSGPACK_OBJECT_STR && ns->via.str.size == d->ns_len &&
                               memcmp(ns->via.str.ptr, d->ns, d->ns_len) == 0,
                           "the clamped namespace \"%s\" is not the one the args name", d->ns);
        }
        SB_FUZZ_ASSERT(strcmp(d->ns, "notes") == 0 || (strcmp(d->ns, "ro") == 0 && !write), "store \"%s\" granted for %s", d->ns,
                       sb_method_op_name(m->op));
        return;
    }
    default:
        return;
    }
}

/* ---- the driver ------------------------------------------------------------------------------------------------------ */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *method;
    sb_method_t m;
    sb_call_t call, again;
    msgpack_zone zone, zone2;
    msgpack_sbuffer before, after, twice;
    msgpack_object root;
    const msgpack_object *args = NULL;
    const char *why = NULL;
    char reason[512];
    int binary;
    sb_status_t st, ast;

    if (size < 2 || size > 65536)
        return 0;
    if (manifest == NULL) {
        char err[256];
        json_t *j = json_loads(manifest_json, 0, NULL);
        SB_FUZZ_ASSERT(j != NULL && sb_manifest_parse(j, &manifest, err, sizeof(err)) == SB_OK, "fixed manifest");
        json_decref(j);
    }
    method = methods[data[0] % (sizeof(methods) / sizeof(methods[0]))];
    binary = data[1] & 1;
    SB_FUZZ_ASSERT(sb_method_parse(method, strlen(method), &m) == SB_OK, "fixed method %s", method);
    msgpack_zone_init(&zone, 2048);
    if (size > 2) {
        if (binary)
            st = sb_mp_decode(data + 2, size - 2, &zone, &root, &why);
        else
            st = sb_json_parse((const char *)data + 2, size - 2, &zone, &root, &why);
        if (st != SB_OK)
            goto Exit; /* the route answers these before the grammar */
        args = &root;
    }

    st = sb_call_decode(&call, &m, method, strlen(method), args, binary, &zone);
    SB_FUZZ_ASSERT((st == SB_OK) == (call.err_stage == SB_CALL_ERR_NONE), "status %d with stage %d", (int)st, (int)call.err_stage);
    if (st != SB_OK) {
        SB_FUZZ_ASSERT(st == call.err_status && st != SB_E_AGAIN && (unsigned)st < SB_STATUS_COUNT_, "error status %d", (int)st);
        SB_FUZZ_ASSERT(call.err[0] != '\0' && sb_utf8_valid((const uint8_t *)call.err, strlen(call.err)),
                       "reason empty or not UTF-8: %s", call.err);
        SB_FUZZ_ASSERT(call.err_stage != SB_CALL_ERR_NOW || st == SB_E_NOMEM, "answered before the check: %s", call.err);
        check_reply(st, call.err);
    }
    /* deterministic */
    msgpack_zone_init(&zone2, 2048);
    (void)sb_call_decode(&again, &m, method, strlen(method), args, binary, &zone2);
    dump_call(&call, &before);
    dump_call(&again, &twice);
    SB_FUZZ_ASSERT(same_dump(&before, &twice), "decoding twice gives two calls");
    msgpack_sbuffer_destroy(&twice);
    msgpack_zone_destroy(&zone2);

    /* the check reads the call and never changes it */
    call.module_path = (data[1] & 2) != 0; /* the route's header: import.fetch is refused without it */
    ast = sb_authz_check(manifest, &call, reason, sizeof(reason));
    dump_call(&call, &after);
    SB_FUZZ_ASSERT(same_dump(&before, &after), "sb_authz_check changed the call");
    SB_FUZZ_ASSERT(ast == SB_OK || ast == SB_E_FORBIDDEN || ast == SB_E_BAD_ARGS, "check status %d", (int)ast);
    if (ast != SB_OK) {
        SB_FUZZ_ASSERT(reason[0] != '\0' && sb_utf8_valid((const uint8_t *)reason, strlen(reason)), "check reason: %s", reason);
        check_reply(ast, reason);
    } else {
        SB_FUZZ_ASSERT(call.err_stage != SB_CALL_ERR_SUBJECT, "granted a call whose subject the decoder refused: %s", call.err);
        /* dispatch refuses an argument error before any handler; only a whole call reaches one */
        if (call.err_stage == SB_CALL_ERR_NONE)
            check_granted(&call, args);
    }
    msgpack_sbuffer_destroy(&before);
    msgpack_sbuffer_destroy(&after);
Exit:
    msgpack_zone_destroy(&zone);
    return 0;
}
