/*
 * Token records: building, validating, (de)serialising. Records are built
 * once and never changed, so threads share them by reference count.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "store/store.h"
#include "authz/secrets.h"
#include "util/util.h"
#include "sb/mem.h"
#include "sb/value.h"

_Static_assert(sizeof(sb_token_t) % _Alignof(sb_scope_kv_t) == 0, "the scope array follows the struct, aligned");

void sb_token_addref(sb_token_t *t)
{
    atomic_fetch_add_explicit(&t->_refcnt, 1, memory_order_relaxed);
}

void sb_token_release(sb_token_t *t)
{
    if (t == NULL || atomic_fetch_sub_explicit(&t->_refcnt, 1, memory_order_acq_rel) != 1)
        return;
    sb_manifest_free(t->manifest);
    sb_secrets_free(t->secrets);
    sb_mem_free(t);
}

static int is_printable_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return 0;
    return sb_utf8_valid((const uint8_t *)s, n);
}

/* copies `len` bytes and a NUL to *at, advancing it; returns the copy */
static const char *put_str(char **at, const char *s, size_t len)
{
    char *p = *at;
    memcpy(p, s, len);
    p[len] = '\0';
    *at = p + len + 1;
    return p;
}

sb_status_t sb_token_build(const uint8_t hash[32], const char *run_id, const json_t *capabilities, const char *target,
                           const json_t *scope, int64_t expires_at_ms, sb_token_t **out, char *err, size_t errsz)
{
    sb_token_t *t;
    sb_manifest_t *manifest;
    size_t rlen = strlen(run_id), tlen = target != NULL ? strlen(target) : 0, nscope = 0, size;
    sb_status_t st;
    char *at;

    if (rlen == 0 || rlen > SB_MAX_RUN_ID || !is_printable_utf8(run_id, rlen)) {
        snprintf(err, errsz, "runId: expected 1-%u printable bytes", SB_MAX_RUN_ID);
        return SB_E_BAD_ARGS;
    }
    if (target != NULL && !sb_is_name(target, SB_MAX_TARGET_NAME)) {
        snprintf(err, errsz, "target: expected a name of [A-Za-z0-9_-]{1,%u}", SB_MAX_TARGET_NAME);
        return SB_E_BAD_ARGS;
    }
    /* every string is bounded here, so the record's size is: at most about 5.6 KiB */
    size = sizeof(*t) + rlen + 1 + tlen + 1;
    if (scope != NULL && !json_is_null(scope)) {
        const char *k;
        json_t *v;
        if (!json_is_object(scope)) {
            snprintf(err, errsz, "scope: expected an object");
            return SB_E_BAD_ARGS;
        }
        if (json_object_size(scope) > SB_MAX_SCOPE_ENTRIES) {
            snprintf(err, errsz, "scope: more than %u entries", SB_MAX_SCOPE_ENTRIES);
            return SB_E_BAD_ARGS;
        }
        json_object_foreach((json_t *)scope, k, v)
        {
            size_t vlen;
            if (!sb_is_name(k, 64)) {
                /* cut on a code point boundary: the message is JSON text */
                snprintf(err, errsz, "scope.%.*s: expected a key of [A-Za-z0-9_-]{1,64}", (int)sb_utf8_cut(k, strlen(k), 64), k);
                return SB_E_BAD_ARGS;
            }
            if (!json_is_string(v) || (vlen = json_string_length(v)) == 0 || vlen > SB_MAX_SCOPE_VALUE ||
                !is_printable_utf8(json_string_value(v), vlen)) {
                snprintf(err, errsz, "scope.%s: expected a string of 1-%u printable bytes", k, SB_MAX_SCOPE_VALUE);
                return SB_E_BAD_ARGS;
            }
            size += sizeof(sb_scope_kv_t) + strlen(k) + 1 + vlen + 1;
            ++nscope;
        }
    }
    {
        char merr[256];
        if ((st = sb_manifest_parse(capabilities, &manifest, merr, sizeof(merr))) != SB_OK) {
            snprintf(err, errsz, "%s", merr);
            return st;
        }
    }
    if ((t = sb_mem_try_calloc(1, size)) == NULL) {
        sb_manifest_free(manifest);
        snprintf(err, errsz, "out of memory");
        return SB_E_NOMEM;
    }
    /* the layout: the struct, the scope array (pointer-aligned: sizeof(*t) is), then the strings */
    atomic_init(&t->_refcnt, 1);
    memcpy(t->hash, hash, 32);
    t->expires_at_ms = expires_at_ms;
    t->manifest = manifest;
    t->scope = (sb_scope_kv_t *)(void *)(t + 1);
    at = (char *)(t->scope + nscope);
    t->run_id = put_str(&at, run_id, rlen);
    t->target = put_str(&at, target != NULL ? target : "", tlen);
    if (nscope != 0) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)scope, k, v)
        {
            t->scope[t->scope_len].key = put_str(&at, k, strlen(k));
            t->scope[t->scope_len].value = put_str(&at, json_string_value(v), json_string_length(v));
            ++t->scope_len;
        }
    }
    *out = t;
    return SB_OK;
}

char *sb_token_serialize(const sb_token_t *t, const json_t *capabilities)
{
    json_t *o = json_object(), *scope = json_object();
    char *s;

    for (size_t i = 0; i < t->scope_len; ++i)
        json_object_set_new(scope, t->scope[i].key, json_string(t->scope[i].value));
    /*
     * The order is part of the format (jansson keeps insertion order): the
     * Redis call-path script finds the mint id at a fixed offset and reads
     * runId, expiresAt and the two call quotas from the start of the text with
     * one anchored match instead of decoding the whole record; records in
     * another order (older ones) take its full-decode path.
     */
    json_object_set_new(o, "v", json_integer(1));
    {
        /* a fresh id per write: records never change, so (token hash, mint id) names one record's bytes */
        uint8_t rnd[16];
        char hex[33];
        if (sb_random(rnd, sizeof(rnd)) != SB_OK) {
            json_decref(scope);
            json_decref(o);
            return NULL;
        }
        sb_hex(rnd, sizeof(rnd), hex);
        json_object_set_new(o, "mint", json_string(hex));
    }
    json_object_set_new(o, "runId", json_string(t->run_id));
    json_object_set_new(o, "expiresAt", json_integer(t->expires_at_ms));
    {
        json_t *q = json_object();
        json_object_set_new(q, "calls", json_integer((json_int_t)t->quota.calls));
        json_object_set_new(q, "concurrent", json_integer((json_int_t)t->quota.concurrent));
        json_object_set_new(q, "fetchBytes", json_integer((json_int_t)t->quota.fetch_bytes));
        json_object_set_new(o, "quota", q);
    }
    json_object_set_new(o, "target", json_string(t->target));
    json_object_set_new(o, "scope", scope);
    json_object_set(o, "capabilities", capabilities != NULL ? (json_t *)capabilities : json_null());
    if (sb_secrets_count(t->secrets) != 0) {
        json_t *sealed = sb_secrets_seal(t->secrets, t->hash);
        if (sealed == NULL) {
            json_decref(o);
            return NULL;
        }
        json_object_set_new(o, "secrets", sealed);
    }
    s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (s == NULL)
        sb_fatal(__FILE__, __LINE__, "out of memory");
    return s;
}

sb_status_t sb_token_deserialize(const uint8_t hash[32], const char *s, size_t len, sb_token_t **out)
{
    json_t *o, *run, *target, *exp;
    char err[256];
    sb_status_t st = SB_E_UNAVAILABLE;

    if (len > SB_MAX_TOKEN_RECORD || (o = json_loadb(s, len, JSON_REJECT_DUPLICATES, NULL)) == NULL)
        return SB_E_UNAVAILABLE;
    run = json_object_get(o, "runId");
    target = json_object_get(o, "target");
    exp = json_object_get(o, "expiresAt");
    if (json_integer_value(json_object_get(o, "v")) != 1 || !json_is_string(run) || !json_is_string(target) ||
        !json_is_integer(exp))
        goto Exit;
    if (sb_token_build(hash, json_string_value(run), json_object_get(o, "capabilities"),
                       json_string_length(target) != 0 ? json_string_value(target) : NULL, json_object_get(o, "scope"),
                       json_integer_value(exp), out, err, sizeof(err)) == SB_OK) {
        json_t *q = json_object_get(o, "quota");
        (*out)->quota.calls = json_integer_value(json_object_get(q, "calls"));
        (*out)->quota.concurrent = json_integer_value(json_object_get(q, "concurrent"));
        (*out)->quota.fetch_bytes = json_integer_value(json_object_get(q, "fetchBytes"));
        /* a record without quotas is not ours to guess about; nor are secrets we cannot open */
        if ((*out)->quota.calls <= 0 || (*out)->quota.concurrent <= 0 || (*out)->quota.fetch_bytes <= 0 ||
            (json_object_get(o, "secrets") != NULL &&
             sb_secrets_unseal(json_object_get(o, "secrets"), hash, (*out)->manifest, &(*out)->secrets) != SB_OK)) {
            sb_token_release(*out);
            *out = NULL;
        } else {
            st = SB_OK;
        }
    }
Exit:
    json_decref(o);
    return st;
}
