/*
 * broker/authz: the per-call capability check (authz.h, sb_authz_check).
 *
 * Runs on every call, before any handler, with the run's manifest, on the
 * typed call (call/call.h): the path, URL, tool name and namespace it decides
 * on are the ones the decoder produced and the handler will use; the check
 * never reads the raw msgpack args. Deny by default: every branch must find
 * an explicit grant, an omitted axis grants nothing, and an argument the
 * decoder refused (the call's "subject" error) is answered at the point where
 * the check needs it, after the axis checks that come first. The decision
 * table is upstream's checkBindingCapability (PROTOCOL.md section 6) with
 * three deliberate differences:
 *  - collections.document_store.* is clamped to the namespace named in the
 *    call (our decision 4; upstream accepts any granted store);
 *  - store.<ns>.<op> and tools.(list|call) are first-class methods;
 *  - bracketed IPv6 net entries match IPv6 URLs numerically (upstream's never
 *    match, section 6.1 quirk).
 *
 * A key that appears twice in an args map (or as both str and bin) makes the
 * call SB_E_BAD_ARGS (the decoder's subject error): if we checked one copy
 * and a handler used the other, the check would be worth nothing.
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
 *   forbidden  http.fetch method "<M>" is not allowed for host "<host>:<port>" (net methods rule)
 *   forbidden  http.fetch path is not allowed for host "<host>:<port>" (net paths rule)
 *   forbidden  http.fetch path for host "<host>:<port>" has an encoded '/', '\', '.' or '%', a ';', or a dot segment (net paths
 * rule) bad_args   args has a duplicate or non-string key "<key>" forbidden  unknown method
 *
 * Guest-supplied strings (paths, tool names, store namespaces that are not
 * names) are never echoed: reasons end up in logs and in the guest's error.
 * The decoder's reasons (call.c) are listed in PROTOCOL.md with the methods.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "sb/limits.h"
#include "authz/manifest_int.h"
#include "call/call.h"
#include "call/path.h"

#define VERB_BIT(op) SB_MANIFEST_VERB_BIT(op)

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

/* the decoder's error in the argument the check decides on, answered here; SB_OK when there is none */
static sb_status_t subject_error(const sb_call_t *call, char *reason, size_t reasonsz)
{
    if (call->err_stage != SB_CALL_ERR_SUBJECT)
        return SB_OK;
    return say(call->err_status, reason, reasonsz, "%s", call->err);
}

/* ---- files --------------------------------------------------------------------------------------------------------- */

static sb_status_t check_files(const sb_manifest_t *m, const sb_call_t *call, char *reason, size_t reasonsz)
{
    const sb_call_files_t *f = call->files;
    sb_method_op_t op = call->m.op;
    sb_status_t st;

    if (op == SB_OP_LIST && sb_manifest__files_read_count(m) == 0)
        return say(SB_E_FORBIDDEN, reason, reasonsz, "files.list requires a files.read scope");
    if ((st = subject_error(call, reason, reasonsz)) != SB_OK)
        return st;
    if (f == NULL || (!f->has_path && op != SB_OP_LIST))
        return say(SB_E_FORBIDDEN, reason, reasonsz, "%s", SB_PATH_WHY_UNSAFE);
    switch (op) {
    case SB_OP_LIST:
        /* no path lists the root; a path must match a read glob or be a directory one lives under */
        if (!f->has_path || sb_manifest__files_read_match(m, f->path, f->path_len) ||
            sb_manifest__files_read_under(m, f->path, f->path_len))
            return SB_OK;
        return say(SB_E_FORBIDDEN, reason, reasonsz, "files.list path is not in the read scope");
    case SB_OP_READ:
        if (sb_manifest__files_read_match(m, f->path, f->path_len))
            return SB_OK;
        return say(SB_E_FORBIDDEN, reason, reasonsz, "files.read path is not in the read scope");
    case SB_OP_WRITE:
        if (sb_manifest__files_write_match(m, f->path, f->path_len))
            return SB_OK;
        return say(SB_E_FORBIDDEN, reason, reasonsz, "files.write path is not in the write scope");
    default:
        return say(SB_E_FORBIDDEN, reason, reasonsz, "unknown method");
    }
}

/* ---- collections, store, globals ------------------------------------------------------------------------------------ */

/* the verb a collections/store operation needs: read for find/findOne, else its own name (collections) or write (stores) */
static sb_method_op_t crud_verb(sb_method_op_t op, int store)
{
    if (op == SB_OP_FIND || op == SB_OP_FIND_ONE)
        return SB_OP_READ;
    return store ? SB_OP_WRITE : op;
}

/*
 * The document store, both spellings: store.<ns>.<op> names the namespace in
 * the method, collections.document_store.<op> in its args (the decoder took
 * it from where.store, or the top-level store of create). Either way the
 * namespace checked is the one the handler clamps every statement to.
 */
static sb_status_t check_store(const sb_manifest_t *m, const sb_call_t *call, char *reason, size_t reasonsz)
{
    const sb_call_data_t *d = call->data;
    sb_method_op_t verb = crud_verb(call->m.op, 1);
    sb_status_t st;

    if ((st = subject_error(call, reason, reasonsz)) != SB_OK)
        return st;
    if (d == NULL || d->ns == NULL)
        return say(SB_E_FORBIDDEN, reason, reasonsz, "document_store namespace is missing or invalid");
    if ((sb_manifest__store_verbs(m, d->ns, d->ns_len) & VERB_BIT(verb)) != 0)
        return SB_OK;
    return say(SB_E_FORBIDDEN, reason, reasonsz, "store \"%.*s\" does not grant \"%s\"", (int)d->ns_len, d->ns,
               sb_method_op_name(verb));
}

static sb_status_t check_collection(const sb_manifest_t *m, const sb_call_t *call, char *reason, size_t reasonsz)
{
    const sb_method_t *meth = &call->m;
    sb_method_op_t verb;

    if (meth->name_len == sizeof("document_store") - 1 && memcmp(meth->name, "document_store", meth->name_len) == 0)
        return check_store(m, call, reason, reasonsz);
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

static sb_status_t check_tools(const sb_manifest_t *m, const sb_call_t *call, char *reason, size_t reasonsz)
{
    const sb_call_tools_t *t = call->tools;
    sb_status_t st;

    if (sb_manifest__tools_count(m) == 0)
        return say(SB_E_FORBIDDEN, reason, reasonsz, "tools are not granted");
    if (call->m.op == SB_OP_LIST)
        return SB_OK;
    if ((st = subject_error(call, reason, reasonsz)) != SB_OK)
        return st;
    if (t == NULL || t->name == NULL)
        return say(SB_E_FORBIDDEN, reason, reasonsz, "tools.call name is missing or invalid");
    if (sb_manifest__tools_match(m, t->name, t->name_len))
        return SB_OK;
    return say(SB_E_FORBIDDEN, reason, reasonsz, "tools.call name is not granted");
}

static sb_status_t check_fetch(const sb_manifest_t *m, const sb_call_t *call, char *reason, size_t reasonsz)
{
    sb_net_verdict_t v;
    sb_status_t st;

    if (sb_manifest__net_count(m) == 0)
        return say(SB_E_FORBIDDEN, reason, reasonsz, "http.fetch requires a net allowlist");
    if ((st = subject_error(call, reason, reasonsz)) != SB_OK)
        return st;
    if (call->fetch == NULL)
        return say(SB_E_BAD_ARGS, reason, reasonsz, "http.fetch url is invalid: missing or not a string");
    if ((v = sb_authz_fetch_verdict(m, &call->fetch->url, call->fetch->method)) == SB_NET_OK)
        return SB_OK;
    sb_authz_fetch_reason(v, &call->fetch->url, call->fetch->method, 0, reason, reasonsz);
    return SB_E_FORBIDDEN;
}

/* ---- the check ----------------------------------------------------------------------------------------------------- */

sb_status_t sb_authz_check(const sb_manifest_t *m, const sb_call_t *call, char *reason, size_t reasonsz)
{
    const sb_method_t *meth;

    if (reason != NULL && reasonsz != 0)
        reason[0] = '\0';
    if (m == NULL || call == NULL)
        return say(SB_E_FORBIDDEN, reason, reasonsz, "no capability manifest");
    meth = &call->m;
    switch (meth->kind) {
    case SB_MK_FILES:
        return check_files(m, call, reason, reasonsz);
    case SB_MK_COLLECTIONS:
        return check_collection(m, call, reason, reasonsz);
    case SB_MK_STORE:
        return check_store(m, call, reason, reasonsz);
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
        return check_fetch(m, call, reason, reasonsz);
    case SB_MK_TOOLS:
        return check_tools(m, call, reason, reasonsz);
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

int sb_authz_fetch_allows(const sb_manifest_t *m, const sb_url_t *url, const char *method)
{
    return sb_authz_fetch_verdict(m, url, method) == SB_NET_OK;
}

sb_net_verdict_t sb_authz_fetch_verdict(const sb_manifest_t *m, const sb_url_t *url, const char *method)
{
    return m != NULL ? sb_manifest__net_verdict(m, url, method) : SB_NET_NO_HOST;
}

size_t sb_authz_fetch_reason(sb_net_verdict_t v, const sb_url_t *url, const char *method, int redirect, char *buf, size_t bufsz)
{
    char hp[SB_URL_MAX_HOST + 16];
    const char *what = redirect ? "http.fetch redirect" : "http.fetch";
    int n;

    sb_url_hostport(url, hp, sizeof(hp));
    switch (v) {
    case SB_NET_OK:
        n = snprintf(buf, bufsz, "allowed");
        break;
    case SB_NET_METHOD:
        n = snprintf(buf, bufsz, "%s method \"%s\" is not allowed for host \"%s\" (net methods rule)", what, method, hp);
        break;
    case SB_NET_PATH:
        n = snprintf(buf, bufsz, "%s path is not allowed for host \"%s\" (net paths rule)", what, hp);
        break;
    case SB_NET_PATH_ENCODING:
        n = snprintf(buf, bufsz,
                     "%s path for host \"%s\" has an encoded '/', '\\', '.' or '%%', a ';', or a dot segment (net paths rule)",
                     what, hp);
        break;
    default:
        n = snprintf(buf, bufsz, "%s host \"%s\" is not in the net allowlist", what, hp);
        break;
    }
    return n < 0 ? 0 : (size_t)n < bufsz ? (size_t)n : bufsz != 0 ? bufsz - 1 : 0;
}

/* ---- decide rules (authz.h) ---------------------------------------------------------------------------------------- */

int sb_authz_has_decide(const sb_manifest_t *m)
{
    return m != NULL && sb_manifest__decide_any(m);
}

int sb_authz_needs_decision(const sb_manifest_t *m, const sb_call_t *call)
{
    /* a call of a family no rule names costs this one test */
    if (m == NULL || !sb_manifest__decide_kind(m, (int)call->m.kind))
        return 0;
    if (sb_manifest__decide_method_match(m, call->method, call->method_len))
        return 1;
    /* the document store answers under two names (store.<ns>.<op>, collections.document_store.<op>): a rule on either holds both */
    if (call->data != NULL && call->data->docstore && call->data->ns != NULL && call->data->ns_len <= SB_MAX_NAME) {
        char canon[SB_MAX_NAME + 64];
        const char *op = sb_method_op_name(call->m.op);
        int n = snprintf(canon, sizeof(canon), "store.%.*s.%s", (int)call->data->ns_len, call->data->ns, op);
        if (n > 0 && (size_t)n < sizeof(canon) && sb_manifest__decide_method_match(m, canon, (size_t)n))
            return 1;
        n = snprintf(canon, sizeof(canon), "collections.document_store.%s", op);
        if (n > 0 && (size_t)n < sizeof(canon) && sb_manifest__decide_method_match(m, canon, (size_t)n))
            return 1;
    }
    if (call->m.kind == SB_MK_HTTP && call->fetch != NULL)
        return sb_manifest__decide_fetch_match(m, &call->fetch->url, call->fetch->method);
    return 0;
}

int sb_authz_fetch_needs_decision(const sb_manifest_t *m, const sb_url_t *url, const char *method)
{
    if (!sb_authz_has_decide(m))
        return 0;
    return sb_manifest__decide_method_match(m, "http.fetch", 10) || sb_manifest__decide_fetch_match(m, url, method);
}
