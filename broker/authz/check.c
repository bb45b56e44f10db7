/*
 * broker/authz: the per-call capability check (authz.h, sb_authz_check).
 *
 * Runs on every call, before any handler, with the run's manifest. Deny by
 * default: every branch must find an explicit grant, an omitted axis grants
 * nothing, and an argument of the wrong msgpack type is treated exactly like
 * a missing one. The decision table is upstream's checkBindingCapability
 * (questpie-wire.md section 4.1) with three deliberate differences:
 *  - collections.document_store.* is clamped to the namespace named in the
 *    call (our decision 4; upstream accepts any granted store);
 *  - store.<ns>.<op> and tools.(list|call) are first-class methods;
 *  - bracketed IPv6 net entries match IPv6 URLs numerically (upstream's never
 *    match, section 6.1 quirk).
 *
 * A key that appears twice in an args map (or as both str and bin) makes the
 * call SB_E_BAD_ARGS: if we checked one copy and a handler used the other,
 * the check would be worth nothing.
 *
 * Reasons (tests assert them byte for byte; <N> is a grammar-checked name from
 * the method, <verb> one of read/create/update/delete/write, <host>:<port> the
 * canonical host, IPv6 bracketed, and the effective port):
 *
 *   status     reason
 *   forbidden  no capability manifest
 *   forbidden  files path is missing or unsafe
 *   forbidden  files.read path is not in the read scope
 *   forbidden  files.write path is not in the write scope
 *   forbidden  files.list requires a files.read scope
 *   forbidden  files.list path is not in the read scope
 *   forbidden  collection "<N>" does not grant "<verb>"
 *   forbidden  document_store namespace is missing or invalid
 *   forbidden  store "<N>" does not grant "<verb>"
 *   forbidden  global "<N>" does not grant "<verb>"
 *   forbidden  service "<N>" is not granted
 *   forbidden  job "<N>" is not granted
 *   forbidden  workflow "<N>" is not granted
 *   forbidden  email.send is not grantable in the current capability model
 *   forbidden  tools are not granted
 *   forbidden  tools.call name is missing or invalid
 *   forbidden  tools.call name is not granted
 *   forbidden  http.fetch requires a net allowlist
 *   bad_args   http.fetch url is invalid: missing or not a string
 *   bad_args   http.fetch url is invalid: <why from sb_url_parse>
 *   forbidden  http.fetch host "<host>:<port>" is not in the net allowlist
 *   bad_args   args has a duplicate or non-string key "<key>"
 *   forbidden  unknown method
 *
 * Guest-supplied strings (paths, tool names, store namespaces that are not
 * names) are never echoed: reasons end up in logs and in the guest's error.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "sb/limits.h"
#include "authz/manifest_int.h"
#include "call/path.h"
#include "call/url.h"

/* tools.call names, as upstream's custom-tools handler bounds them */
#define MAX_TOOL_NAME 256u

#define VERB_BIT(op) SB_MANIFEST_VERB_BIT(op)

static const char reason_path[] = "files path is missing or unsafe";

typedef enum en_arg_t { ARG_MISSING, ARG_FOUND, ARG_AMBIGUOUS } arg_t;

__attribute__((format(printf, 4, 5))) static sb_status_t say(sb_status_t st, char *reason, size_t reasonsz, const char *fmt, ...)
{
    va_list ap;

    if (reason != NULL && reasonsz != 0) {
        va_start(ap, fmt);
        vsnprintf(reason, reasonsz, fmt, ap);
        va_end(ap);
    }
    return st;
}

/*
 * Looks `key` up in `map` (which may be NULL or not a map: then everything is
 * missing). Only a str key counts as the key; a second match, or a bin key
 * with the same bytes, is ambiguous.
 */
static arg_t arg_get(const msgpack_object *map, const char *key, const msgpack_object **val)
{
    size_t n = strlen(key);
    uint32_t i;

    *val = NULL;
    if (map == NULL || map->type != MSGPACK_OBJECT_MAP)
        return ARG_MISSING;
    for (i = 0; i != map->via.map.size; ++i) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR) {
            if (k->via.str.size != n || memcmp(k->via.str.ptr, key, n) != 0)
                continue;
        } else if (k->type == MSGPACK_OBJECT_BIN) {
            if (k->via.bin.size == n && memcmp(k->via.bin.ptr, key, n) == 0)
                return ARG_AMBIGUOUS;
            continue;
        } else {
            continue;
        }
        if (*val != NULL)
            return ARG_AMBIGUOUS;
        *val = &map->via.map.ptr[i].val;
    }
    return *val != NULL ? ARG_FOUND : ARG_MISSING;
}

static sb_status_t ambiguous(const char *key, char *reason, size_t reasonsz)
{
    return say(SB_E_BAD_ARGS, reason, reasonsz, "args has a duplicate or non-string key \"%s\"", key);
}

/* a str value, or NULL (missing and wrong type are the same thing) */
static int as_str(const msgpack_object *v, const char **s, size_t *len)
{
    if (v == NULL || v->type != MSGPACK_OBJECT_STR)
        return 0;
    *s = v->via.str.ptr;
    *len = v->via.str.size;
    return 1;
}

static int is_name(const char *s, size_t len)
{
    size_t i;

    if (len == 0 || len > 128)
        return 0;
    for (i = 0; i != len; ++i) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* ---- files --------------------------------------------------------------------------------------------------------- */

static sb_status_t check_files(const sb_manifest_t *m, sb_method_op_t op, const msgpack_object *args, char *reason, size_t reasonsz)
{
    const msgpack_object *v;
    const char *s;
    size_t len, nlen;
    char path[SB_MAX_PATH + 1];
    arg_t a = arg_get(args, "path", &v);

    if (a == ARG_AMBIGUOUS)
        return ambiguous("path", reason, reasonsz);

    if (op == SB_OP_LIST) {
        if (sb_manifest__files_read_count(m) == 0)
            return say(SB_E_FORBIDDEN, reason, reasonsz, "files.list requires a files.read scope");
        /* the path is optional, and nil means absent; any other non-string is not a path */
        if (v == NULL || v->type == MSGPACK_OBJECT_NIL)
            return SB_OK;
        if (!as_str(v, &s, &len) || sb_path_normalize(s, len, path, sizeof(path)) != SB_OK)
            return say(SB_E_FORBIDDEN, reason, reasonsz, "%s", reason_path);
        nlen = strlen(path);
        if (sb_manifest__files_read_match(m, path, nlen) || sb_manifest__files_read_under(m, path, nlen))
            return SB_OK;
        return say(SB_E_FORBIDDEN, reason, reasonsz, "files.list path is not in the read scope");
    }

    if (!as_str(v, &s, &len) || sb_path_normalize(s, len, path, sizeof(path)) != SB_OK)
        return say(SB_E_FORBIDDEN, reason, reasonsz, "%s", reason_path);
    nlen = strlen(path);
    if (op == SB_OP_READ) {
        if (sb_manifest__files_read_match(m, path, nlen))
            return SB_OK;
        return say(SB_E_FORBIDDEN, reason, reasonsz, "files.read path is not in the read scope");
    }
    if (op == SB_OP_WRITE) {
        if (sb_manifest__files_write_match(m, path, nlen))
            return SB_OK;
        return say(SB_E_FORBIDDEN, reason, reasonsz, "files.write path is not in the write scope");
    }
    return say(SB_E_FORBIDDEN, reason, reasonsz, "unknown method");
}

/* ---- collections, store, globals ------------------------------------------------------------------------------------ */

/* the verb a collections/store operation needs: read for find/findOne, else its own name (collections) or write (stores) */
static sb_method_op_t crud_verb(sb_method_op_t op, int store)
{
    if (op == SB_OP_FIND || op == SB_OP_FIND_ONE)
        return SB_OP_READ;
    return store ? SB_OP_WRITE : op;
}

static sb_status_t check_store_ns(const sb_manifest_t *m, const char *ns, size_t len, sb_method_op_t op, char *reason,
                                  size_t reasonsz)
{
    sb_method_op_t verb = crud_verb(op, 1);

    if ((sb_manifest__store_verbs(m, ns, len) & VERB_BIT(verb)) != 0)
        return SB_OK;
    return say(SB_E_FORBIDDEN, reason, reasonsz, "store \"%.*s\" does not grant \"%s\"", (int)len, ns, sb_method_op_name(verb));
}

/*
 * collections.document_store.<op>: the namespace comes from the call, as the
 * guest's store sugar puts it (section 5.3): data.store for create,
 * where.store (a string, or {"equals": string}) for the others.
 */
static sb_status_t check_document_store(const sb_manifest_t *m, sb_method_op_t op, const msgpack_object *args, char *reason,
                                        size_t reasonsz)
{
    const msgpack_object *outer, *v, *eq;
    const char *ns = NULL;
    size_t len = 0;
    const char *outer_key = op == SB_OP_CREATE ? "data" : "where";

    if (arg_get(args, outer_key, &outer) == ARG_AMBIGUOUS)
        return ambiguous(outer_key, reason, reasonsz);
    if (arg_get(outer, "store", &v) == ARG_AMBIGUOUS)
        return ambiguous("store", reason, reasonsz);
    if (!as_str(v, &ns, &len) && op != SB_OP_CREATE && v != NULL && v->type == MSGPACK_OBJECT_MAP) {
        /* {"equals": ns} and nothing else: another operator could widen the filter */
        if (v->via.map.size == 1) {
            if (arg_get(v, "equals", &eq) == ARG_AMBIGUOUS)
                return ambiguous("equals", reason, reasonsz);
            if (!as_str(eq, &ns, &len))
                ns = NULL;
        }
    }
    if (ns == NULL || !is_name(ns, len))
        return say(SB_E_FORBIDDEN, reason, reasonsz, "document_store namespace is missing or invalid");
    return check_store_ns(m, ns, len, op, reason, reasonsz);
}

static sb_status_t check_collection(const sb_manifest_t *m, const sb_method_t *meth, const msgpack_object *args, char *reason,
                                    size_t reasonsz)
{
    sb_method_op_t verb;

    if (meth->name_len == sizeof("document_store") - 1 && memcmp(meth->name, "document_store", meth->name_len) == 0)
        return check_document_store(m, meth->op, args, reason, reasonsz);
    verb = crud_verb(meth->op, 0);
    if ((sb_manifest__collection_verbs(m, meth->name, meth->name_len) & VERB_BIT(verb)) != 0)
        return SB_OK;
    return say(SB_E_FORBIDDEN, reason, reasonsz, "collection \"%.*s\" does not grant \"%s\"", (int)meth->name_len, meth->name,
               sb_method_op_name(verb));
}

static sb_status_t check_global(const sb_manifest_t *m, const sb_method_t *meth, char *reason, size_t reasonsz)
{
    sb_method_op_t verb = meth->op == SB_OP_GET ? SB_OP_READ : SB_OP_WRITE;

    if ((sb_manifest__global_verbs(m, meth->name, meth->name_len) & VERB_BIT(verb)) != 0)
        return SB_OK;
    return say(SB_E_FORBIDDEN, reason, reasonsz, "global \"%.*s\" does not grant \"%s\"", (int)meth->name_len, meth->name,
               sb_method_op_name(verb));
}

/* ---- tools and http.fetch ------------------------------------------------------------------------------------------ */

static sb_status_t check_tools(const sb_manifest_t *m, sb_method_op_t op, const msgpack_object *args, char *reason, size_t reasonsz)
{
    const msgpack_object *v;
    const char *name;
    size_t len;

    if (sb_manifest__tools_count(m) == 0)
        return say(SB_E_FORBIDDEN, reason, reasonsz, "tools are not granted");
    if (op == SB_OP_LIST)
        return SB_OK;
    if (arg_get(args, "name", &v) == ARG_AMBIGUOUS)
        return ambiguous("name", reason, reasonsz);
    if (!as_str(v, &name, &len) || len == 0 || len > MAX_TOOL_NAME)
        return say(SB_E_FORBIDDEN, reason, reasonsz, "tools.call name is missing or invalid");
    if (sb_manifest__tools_match(m, name, len))
        return SB_OK;
    return say(SB_E_FORBIDDEN, reason, reasonsz, "tools.call name is not granted");
}

static sb_status_t check_fetch(const sb_manifest_t *m, const msgpack_object *args, char *reason, size_t reasonsz)
{
    const msgpack_object *v;
    const char *s, *why = NULL;
    size_t len;
    sb_url_t url;
    char hostport[SB_URL_MAX_HOST + 16];

    if (sb_manifest__net_count(m) == 0)
        return say(SB_E_FORBIDDEN, reason, reasonsz, "http.fetch requires a net allowlist");
    if (arg_get(args, "url", &v) == ARG_AMBIGUOUS)
        return ambiguous("url", reason, reasonsz);
    if (!as_str(v, &s, &len))
        return say(SB_E_BAD_ARGS, reason, reasonsz, "http.fetch url is invalid: missing or not a string");
    if (sb_url_parse(s, len, &url, &why) != SB_OK)
        return say(SB_E_BAD_ARGS, reason, reasonsz, "http.fetch url is invalid: %s", why);
    if (sb_manifest__net_allows(m, &url))
        return SB_OK;
    sb_url_hostport(&url, hostport, sizeof(hostport));
    return say(SB_E_FORBIDDEN, reason, reasonsz, "http.fetch host \"%s\" is not in the net allowlist", hostport);
}

/* ---- the check ----------------------------------------------------------------------------------------------------- */

sb_status_t sb_authz_check(const sb_manifest_t *m, const sb_method_t *meth, const msgpack_object *args, char *reason,
                           size_t reasonsz)
{
    if (reason != NULL && reasonsz != 0)
        reason[0] = '\0';
    if (m == NULL || meth == NULL)
        return say(SB_E_FORBIDDEN, reason, reasonsz, "no capability manifest");

    switch (meth->kind) {
    case SB_MK_FILES:
        return check_files(m, meth->op, args, reason, reasonsz);
    case SB_MK_COLLECTIONS:
        return check_collection(m, meth, args, reason, reasonsz);
    case SB_MK_STORE:
        return check_store_ns(m, meth->name, meth->name_len, meth->op, reason, reasonsz);
    case SB_MK_GLOBALS:
        return check_global(m, meth, reason, reasonsz);
    case SB_MK_SERVICES:
        if (sb_manifest__has_service(m, meth->name, meth->name_len))
            return SB_OK;
        return say(SB_E_FORBIDDEN, reason, reasonsz, "service \"%.*s\" is not granted", (int)meth->name_len, meth->name);
    case SB_MK_JOBS:
        if (sb_manifest__has_job(m, meth->name, meth->name_len))
            return SB_OK;
        return say(SB_E_FORBIDDEN, reason, reasonsz, "job \"%.*s\" is not granted", (int)meth->name_len, meth->name);
    case SB_MK_WORKFLOWS:
        if (sb_manifest__has_workflow(m, meth->name, meth->name_len))
            return SB_OK;
        return say(SB_E_FORBIDDEN, reason, reasonsz, "workflow \"%.*s\" is not granted", (int)meth->name_len, meth->name);
    case SB_MK_EMAIL:
        return say(SB_E_FORBIDDEN, reason, reasonsz, "email.send is not grantable in the current capability model");
    case SB_MK_HTTP:
        return check_fetch(m, args, reason, reasonsz);
    case SB_MK_TOOLS:
        return check_tools(m, meth->op, args, reason, reasonsz);
    default:
        break;
    }
    return say(SB_E_FORBIDDEN, reason, reasonsz, "unknown method");
}

/* ---- the handlers' questions (authz.h) ---------------------------------------------------------------------------- */

int sb_authz_files_visible(const sb_manifest_t *m, const char *path, size_t len, int is_dir)
{
    if (m == NULL)
        return 0;
    if (sb_manifest__files_read_match(m, path, len))
        return 1;
    return is_dir && sb_manifest__files_read_under(m, path, len);
}

int sb_authz_tool_granted(const sb_manifest_t *m, const char *name, size_t len)
{
    return m != NULL && sb_manifest__tools_match(m, name, len);
}

int sb_authz_net_allows(const sb_manifest_t *m, const sb_url_t *url)
{
    return m != NULL && sb_manifest__net_allows(m, url);
}
