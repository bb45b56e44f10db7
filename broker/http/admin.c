/*
 * The admin listener (PROTOCOL.md, "Admin API"): token minting, token and run
 * revocation, token and run inspection, health, readiness and metrics. It is served only on its own
 * address; the public listener never routes here.
 *
 * Every /admin/ request needs "Authorization: Bearer <secret>". The secret is
 * compared as SHA-256 digests with CRYPTO_memcmp, so neither its content nor
 * its length leaks through timing.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <netdb.h>
#include "http/admin_int.h"
#include "http/admin_netmint.h"
#include "http/framing.h"
#include "http/async.h"
#include "http/reply.h"
#include "http/reqid.h"
#include "http/routes.h"
#include "http/worker.h"
#include "authz/secrets.h"
#include "svc/target.h"
#include "obs/log.h"
#include "obs/metrics.h"
#include "sb/limits.h"
#include "util/util.h"

typedef struct st_admin_op_t {
    sb_async_t super;
    const char *op;
    char token_hex[65]; /* minted token, answered once stored */
    int64_t expires_at;
    char tokref[13];
    char run_id[SB_MAX_RUN_ID + 1];
    json_t *caps;
    sb_token_t *tok;
    json_t *body; /* an inspection waiting for the run's timeline */
} admin_op_t;

static void op_dispose(sb_async_t *a)
{
    admin_op_t *op = (admin_op_t *)a;
    explicit_bzero(op->token_hex, sizeof(op->token_hex));
    json_decref(op->caps);
    json_decref(op->body);
    sb_token_release(op->tok);
}

void sb_admin_send(h2o_req_t *req, const char *op, sb_status_t st, const char *body, size_t len)
{
    sb_log_flush();
    sb_metrics_admin(op, sb_status_http(st));
    sb_reply_send(req, st, len != 0 ? "application/json" : NULL, body, len);
}

void sb_admin_send_json(h2o_req_t *req, const char *op, sb_status_t st, json_t *body)
{
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (text == NULL)
        sb_fatal(__FILE__, __LINE__, "out of memory");
    sb_admin_send(req, op, st, text, strlen(text));
    sb_mem_free_foreign(text);
}

void sb_admin_send_error(h2o_req_t *req, const char *op, sb_status_t st, const char *message)
{
    sb_buf_t body;

    sb_buf_init(&body, SB_REPLY_ERROR_MAX);
    if (sb_reply_error_body(&body, st, message, NULL, 0) == SB_OK) {
        sb_admin_send(req, op, st, body.base, body.len);
    } else {
        /* no memory for the body: the fixed execution_error one */
        sb_view_t v = sb_reply_error_fallback(0);
        sb_admin_send(req, op, SB_E_EXECUTION, (const char *)v.base, v.len);
    }
    sb_buf_free(&body);
}

void sb_admin_send_store_error(h2o_req_t *req, const char *op, sb_status_t st)
{
    if (st == SB_E_RATE_LIMITED)
        sb_admin_send_error(req, op, SB_E_RATE_LIMITED, "the token store is full");
    else
        sb_admin_send_error(req, op, SB_E_UNAVAILABLE, "the token store is unavailable");
}

/* "host:port" ("[v6]:port") of the peer, or "unknown" */
static void remote_of(h2o_req_t *req, char *out, size_t outsz)
{
    struct sockaddr_storage ss;
    socklen_t len = req->conn->callbacks->get_peername(req->conn, (struct sockaddr *)&ss);
    char host[NI_MAXHOST];
    int32_t port;

    if (len == 0 || h2o_socket_getnumerichost((struct sockaddr *)&ss, len, host) == SIZE_MAX) {
        snprintf(out, outsz, "unknown");
        return;
    }
    port = h2o_socket_getport((struct sockaddr *)&ss);
    if (ss.ss_family == AF_INET6)
        snprintf(out, outsz, "[%s]:%d", host, (int)port);
    else
        snprintf(out, outsz, "%s:%d", host, (int)port);
}

void sb_admin_refuse(h2o_req_t *req, const char *op, sb_status_t st, const char *message, const char *why, const char *credential)
{
    char remote[NI_MAXHOST + 16], rid[SB_MAX_REQUEST_ID + 1];
    sb_logline_t l;

    remote_of(req, remote, sizeof(remote));
    sb_log_begin(&l, SB_LOG_WARN, "admin.refused");
    sb_log_cstr(&l, "op", op);
    sb_log_str(&l, "method", req->method.base, req->method.len);
    sb_log_cstr(&l, "remote", remote);
    if (sb_http_request_id(req, rid))
        sb_log_cstr(&l, "requestId", rid);
    if (credential != NULL)
        sb_log_cstr(&l, "credential", credential);
    sb_log_int(&l, "status", sb_status_http(st));
    sb_log_cstr(&l, "reason", why != NULL ? why : message);
    sb_log_end(&l);
    sb_admin_send_error(req, op, st, message);
}

static int method_is(h2o_req_t *req, const char *m)
{
    return h2o_memis(req->method.base, req->method.len, m, strlen(m));
}

const char *sb_admin_op_of(h2o_req_t *req, h2o_iovec_t path)
{
    if (h2o_memis(path.base, path.len, H2O_STRLIT("/admin/v1/tokens")))
        return method_is(req, "POST") ? "mint" : "other";
    if (path.len > 17 && memcmp(path.base, "/admin/v1/tokens/", 17) == 0)
        return method_is(req, "DELETE") ? "revoke_token" : method_is(req, "GET") ? "inspect_token" : "other";
    if (path.len > 15 + 7 && memcmp(path.base, "/admin/v1/runs/", 15) == 0 && memcmp(path.base + path.len - 7, "/events", 7) == 0)
        return method_is(req, "GET") ? "run_events" : "other";
    if (path.len > 15 && memcmp(path.base, "/admin/v1/runs/", 15) == 0)
        return method_is(req, "DELETE") ? "revoke_run" : method_is(req, "GET") ? "inspect_run" : "other";
    return "other";
}

/* NULL when the bearer is the admin secret, else why not (for the log; the secret itself is never logged) */
static const char *unauthorized(h2o_req_t *req)
{
    ssize_t i = h2o_find_header(&req->headers, H2O_TOKEN_AUTHORIZATION, -1);
    uint8_t got[32];
    h2o_iovec_t v;

    if (i < 0)
        return "no Authorization header";
    v = req->headers.entries[i].value;
    if (v.len < 7 || !h2o_lcstris(v.base, 7, H2O_STRLIT("bearer ")))
        return "the Authorization header is not a Bearer credential";
    sb_sha256(v.base + 7, v.len - 7, got);
    if (sb_ct_equal(got, sb_current_worker->server->admin_secret_hash, 32))
        return NULL;
    /* after a reload that rotated the secret, the old one works for five more minutes */
    if (sb_current_worker->previous_secret_until > sb_now_ms() && sb_ct_equal(got, sb_current_worker->previous_secret_hash, 32))
        return NULL;
    return "wrong admin secret";
}

/*
 * strict percent-decoding of one path segment: a literal '/' ends the segment
 * and is refused, while "%2F" decodes to '/' (run ids may contain it, and every
 * mintable run id must be revocable); NUL, control bytes and malformed escapes
 * are refused
 */
static int decode_segment(const char *s, size_t len, char *out, size_t outsz)
{
    size_t o = 0;
    for (size_t i = 0; i < len; ++i) {
        int c = (unsigned char)s[i];
        if (c == '/')
            return -1;
        if (c == '%') {
            int v1, v2;
            if (len - i < 3 || (v1 = sb_hex_digit(s[i + 1])) < 0 || (v2 = sb_hex_digit(s[i + 2])) < 0)
                return -1;
            c = v1 << 4 | v2;
            i += 2;
        }
        if (c < 0x20 || c == 0x7f || o + 1 >= outsz)
            return -1;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return o == 0 ? -1 : 0;
}

static void on_stored(void *arg, sb_status_t st)
{
    admin_op_t *op = arg;
    h2o_req_t *req = op->super.req;
    sb_logline_t l;

    if (req != NULL) {
        if (st == SB_OK) {
            sb_log_begin(&l, SB_LOG_INFO, "token.minted");
            sb_log_cstr(&l, "runId", op->run_id);
            sb_log_cstr(&l, "token", op->tokref);
            sb_log_int(&l, "expiresAt", op->expires_at);
            sb_log_end(&l);
            sb_admin_send_json(req, "mint", SB_OK_CREATED,
                               json_pack("{s:s, s:I}", "token", op->token_hex, "expiresAt", (json_int_t)op->expires_at));
        } else if (st == SB_E_BAD_ARGS) {
            sb_admin_send_error(req, "mint", SB_E_CONFLICT, "that token is already registered");
        } else {
            sb_admin_send_store_error(req, "mint", st);
        }
    }
    sb_async_release(&op->super);
}

static void on_revoked(void *arg, sb_status_t st);

/* a token revocation names the run the token belonged to, when the store knew it: its log line and timeline event say so */
static void on_token_revoked(void *arg, sb_status_t st, const char *run_id)
{
    admin_op_t *op = arg;

    if (st == SB_OK && run_id != NULL && op->run_id[0] == '\0')
        snprintf(op->run_id, sizeof(op->run_id), "%s", run_id);
    on_revoked(arg, st);
}

static void on_revoked(void *arg, sb_status_t st)
{
    admin_op_t *op = arg;
    h2o_req_t *req = op->super.req;
    sb_logline_t l;

    if (st == SB_OK) {
        sb_log_begin(&l, SB_LOG_INFO, strcmp(op->op, "revoke_run") == 0 ? "run.revoked" : "token.revoked");
        if (op->run_id[0] != '\0')
            sb_log_cstr(&l, "runId", op->run_id);
        if (op->tokref[0] != '\0')
            sb_log_cstr(&l, "token", op->tokref);
        sb_log_end(&l);
        if (op->run_id[0] != '\0' && sb_store_timeline_enabled(sb_current_worker->store)) {
            sb_store_timeline_begin(&l, "revoke");
            sb_log_cstr(&l, "runId", op->run_id);
            if (op->tokref[0] != '\0')
                sb_log_cstr(&l, "token", op->tokref); /* one token of the run, not the run */
            sb_store_timeline_end(&l, sb_current_worker->store, op->run_id, 0);
        }
    }
    if (req != NULL) {
        if (st == SB_OK) {
            sb_admin_send(req, op->op, SB_OK_NO_CONTENT, NULL, 0);
        } else {
            sb_admin_send_store_error(req, op->op, st);
        }
    }
    sb_async_release(&op->super);
}

static int64_t clamp_ttl(int64_t ttl, int64_t max)
{
    return ttl > max ? max : ttl;
}

/*
 * A mint body held secret values: the request's copy is wiped, and so is
 * whatever the connection's read buffer still holds of consumed bytes (h2o
 * may have copied the body out of it), leaving only bytes not yet read.
 */
static void wipe_request(h2o_req_t *req)
{
    h2o_socket_t *sock = req->conn->callbacks->get_socket != NULL ? req->conn->callbacks->get_socket(req->conn) : NULL;

    if (req->entity.base != NULL)
        explicit_bzero(req->entity.base, req->entity.len);
    if (sock != NULL && sock->input != NULL && sock->input->bytes != NULL && sock->input->_fd == -1) {
        h2o_buffer_t *in = sock->input;
        size_t head = (size_t)(in->bytes - in->_buf), used = head + in->size;
        explicit_bzero(in->_buf, head);
        if (used < in->capacity)
            explicit_bzero(in->_buf + used, in->capacity - used);
    }
}

/*
 * The run's secrets (PROTOCOL.md section 5, "Secrets"): the mint body's, then
 * the target's that the manifest names. The body's copies of the values are
 * wiped as soon as they are parsed.
 */
static sb_status_t mint_secrets(sb_token_t *tok, const json_t *given, char *err, size_t errsz)
{
    const sb_targets_t *targets = atomic_load(&sb_current_worker->server->targets);
    const sb_target_t *t = tok->target[0] != '\0' ? sb_targets_find(targets, tok->target) : NULL;
    sb_status_t st;

    if ((st = sb_secrets_parse(given, tok->manifest, &tok->secrets, err, errsz)) != SB_OK)
        return st == SB_E_NOMEM ? sb_fail_bad_args(err, errsz, "secrets: out of memory") : st;
    for (size_t i = 0; i < sb_manifest_secret_count(tok->manifest); ++i) {
        char path[64];
        snprintf(path, sizeof(path), "capabilities.secrets[%zu]", i);
        if (t == NULL)
            return sb_fail_bad_args(err, errsz, "%s: the run has no target to take secrets from", path);
        if ((st = sb_secrets_add_from(&tok->secrets, t->secrets, sb_manifest_secret_name(tok->manifest, i), tok->manifest, path,
                                      err, errsz)) != SB_OK)
            return st;
    }
    /* Redis keeps records at rest: without a key to seal them with, no record may carry a secret */
    if (sb_secrets_count(tok->secrets) != 0 && strcmp(sb_store_kind(sb_current_worker->server->store), "memory") != 0 &&
        !sb_secrets_have_key())
        return sb_fail_bad_args(err, errsz,
                                "secrets: the Redis token store has no secrets_key_file; a run with secrets cannot be stored");
    return SB_OK;
}

static void mint(h2o_req_t *req)
{
    sb_config_t *conf = sb_current_worker->server->conf;
    json_error_t jerr;
    json_t *body, *run, *caps, *target, *scope, *ttl, *given;
    const char *k;
    json_t *v;
    char err[512];
    uint8_t raw[32], hash[32];
    int64_t ttl_ms, now = sb_now_ms();
    admin_op_t *op;
    sb_token_t *tok;

    if (req->entity.base == NULL || req->entity.len == 0) {
        sb_admin_send_error(req, "mint", SB_E_BAD_ARGS, "invalid JSON body");
        return;
    }
    if (req->entity.len > SB_MAX_ADMIN_BODY) {
        sb_admin_send_error(req, "mint", SB_E_TOO_LARGE, "request body is too large");
        return;
    }
    if ((body = json_loadb(req->entity.base, req->entity.len, JSON_REJECT_DUPLICATES, &jerr)) == NULL || !json_is_object(body)) {
        json_decref(body);
        sb_admin_send_error(req, "mint", SB_E_BAD_ARGS, "invalid JSON body");
        return;
    }
    json_object_foreach(body, k, v)
    {
        if (strcmp(k, "runId") != 0 && strcmp(k, "capabilities") != 0 && strcmp(k, "target") != 0 && strcmp(k, "scope") != 0 &&
            strcmp(k, "ttlMs") != 0 && strcmp(k, "token") != 0 && strcmp(k, "quotas") != 0 && strcmp(k, "secrets") != 0) {
            snprintf(err, sizeof(err), "%s: unknown key", k);
            goto BadArgs;
        }
    }
    run = json_object_get(body, "runId");
    caps = json_object_get(body, "capabilities");
    target = json_object_get(body, "target");
    scope = json_object_get(body, "scope");
    ttl = json_object_get(body, "ttlMs");
    given = json_object_get(body, "token");
    if (!json_is_string(run)) {
        snprintf(err, sizeof(err), "runId: expected a string");
        goto BadArgs;
    }
    if (strlen(json_string_value(run)) != json_string_length(run)) {
        snprintf(err, sizeof(err), "runId: must not contain NUL");
        goto BadArgs;
    }
    if (sb_admin_netmint_reserved(json_string_value(run))) {
        snprintf(err, sizeof(err), "runId: the prefix %s is reserved for the net-mint credential", SB_NETMINT_RUN_PREFIX);
        goto BadArgs;
    }
    if (caps != NULL && !json_is_object(caps)) {
        snprintf(err, sizeof(err), "capabilities: expected an object");
        goto BadArgs;
    }
    if (target != NULL && !json_is_null(target)) {
        if (!json_is_string(target)) {
            snprintf(err, sizeof(err), "target: expected a string");
            goto BadArgs;
        }
        if (json_object_get(conf->targets, json_string_value(target)) == NULL) {
            const char *t = json_string_value(target);
            /* cut on a code point boundary: the message is JSON text */
            snprintf(err, sizeof(err), "target: no target named \"%.*s\" is configured", (int)sb_utf8_cut(t, strlen(t), 128), t);
            goto BadArgs;
        }
    } else {
        target = NULL;
    }
    if (ttl != NULL && (!json_is_integer(ttl) || json_integer_value(ttl) < 1)) {
        snprintf(err, sizeof(err), "ttlMs: expected a positive integer");
        goto BadArgs;
    }
    if (given != NULL && (!json_is_string(given) || !sb_is_token_format(json_string_value(given), json_string_length(given)))) {
        snprintf(err, sizeof(err), "token: expected 64 lowercase hex characters");
        goto BadArgs;
    }
    if (given == NULL) {
        if (sb_random(raw, sizeof(raw)) != SB_OK) {
            json_decref(body);
            sb_admin_send_error(req, "mint", SB_E_UNAVAILABLE, "no randomness available");
            return;
        }
    }

    op = (admin_op_t *)sb_async_attach(req, sizeof(*op), op_dispose);
    op->op = "mint";
    if (given != NULL)
        memcpy(op->token_hex, json_string_value(given), 65);
    else
        sb_hex(raw, sizeof(raw), op->token_hex);
    /* the store knows tokens only by hash, registered and minted alike */
    sb_sha256(op->token_hex, 64, hash);
    explicit_bzero(raw, sizeof(raw));
    {
        char h[13];
        sb_hex(hash, 6, h);
        memcpy(op->tokref, h, 13);
    }
    if (sb_token_build(hash, json_string_value(run), caps, target != NULL ? json_string_value(target) : NULL, scope, 0, &tok, err,
                       sizeof(err)) != SB_OK) {
        json_decref(body);
        sb_admin_send_error(req, "mint", SB_E_BAD_ARGS, err);
        return;
    }
    if (mint_secrets(tok, json_object_get(body, "secrets"), err, sizeof(err)) != SB_OK) {
        sb_token_release(tok);
        goto BadArgs;
    }
    /* quotas: the configured defaults, unless the host sets them for this run */
    tok->quota.calls = conf->quota_calls;
    tok->quota.concurrent = conf->quota_concurrent;
    tok->quota.fetch_bytes = conf->quota_fetch_bytes;
    {
        json_t *q = json_object_get(body, "quotas");
        static const struct {
            const char *key;
            int64_t max;
        } qk[] = {{"calls", 1000000}, {"concurrent", 1024}, {"fetchBytes", 1LL << 40}};
        if (q != NULL) {
            const char *qkey;
            json_t *qv;
            if (!json_is_object(q)) {
                snprintf(err, sizeof(err), "quotas: expected an object");
                sb_token_release(tok);
                goto BadArgs;
            }
            json_object_foreach(q, qkey, qv)
            {
                size_t i = 0;
                while (i < 3 && strcmp(qk[i].key, qkey) != 0)
                    ++i;
                if (i == 3) {
                    snprintf(err, sizeof(err), "quotas.%.*s: unknown key", (int)sb_utf8_cut(qkey, strlen(qkey), 64), qkey);
                    sb_token_release(tok);
                    goto BadArgs;
                }
                if (!json_is_integer(qv) || json_integer_value(qv) < 1 || json_integer_value(qv) > qk[i].max) {
                    snprintf(err, sizeof(err), "quotas.%s: expected an integer from 1 to %lld", qkey, (long long)qk[i].max);
                    sb_token_release(tok);
                    goto BadArgs;
                }
                *(i == 0   ? &tok->quota.calls
                  : i == 1 ? &tok->quota.concurrent
                           : &tok->quota.fetch_bytes) = (int64_t)json_integer_value(qv);
            }
        }
    }
    /* TTL: explicit, else timeoutMs + 30 s, else the default; never above max_ttl_ms */
    if (ttl != NULL)
        ttl_ms = (int64_t)json_integer_value(ttl);
    else if (sb_manifest_timeout_ms(tok->manifest) > 0)
        ttl_ms = sb_manifest_timeout_ms(tok->manifest) + 30000;
    else
        ttl_ms = conf->default_ttl_ms;
    ttl_ms = clamp_ttl(ttl_ms, conf->max_ttl_ms);
    tok->expires_at_ms = op->expires_at = now + ttl_ms;
    memcpy(op->run_id, tok->run_id, strlen(tok->run_id) + 1); /* at most SB_MAX_RUN_ID bytes (sb_token_build) */
    op->tok = tok;
    op->caps = caps != NULL ? json_incref(caps) : json_object();
    json_decref(body);
    /* the request's bytes held the values too */
    if (tok->secrets != NULL)
        wipe_request(req);
    sb_async_retain(&op->super);
    sb_store_put(sb_current_worker->store, tok, op->caps, on_stored, op);
    return;

BadArgs:
    if (json_object_get(body, "secrets") != NULL)
        wipe_request(req);
    json_decref(body);
    sb_admin_send_error(req, "mint", SB_E_BAD_ARGS, err);
}

/*
 * The id in the path of /admin/v1/runs/<runId> and /admin/v1/tokens/<token>,
 * decoded into `id` (a token must be 64 lowercase hex characters), and the
 * operation that answers it; NULL when the id was refused (answered).
 */
static admin_op_t *start_id_op(h2o_req_t *req, const char *opname, int by_run, const char *seg, size_t seglen,
                               char id[SB_MAX_RUN_ID + 1])
{
    admin_op_t *op;

    if (decode_segment(seg, seglen, id, SB_MAX_RUN_ID + 1) != 0) {
        sb_admin_send_error(req, opname, SB_E_BAD_ARGS, by_run ? "runId: malformed" : "token: malformed");
        return NULL;
    }
    if (!by_run && !sb_is_token_format(id, strlen(id))) {
        sb_admin_send_error(req, opname, SB_E_BAD_ARGS, "token: expected 64 lowercase hex characters");
        return NULL;
    }
    op = (admin_op_t *)sb_async_attach(req, sizeof(*op), op_dispose);
    op->op = opname;
    sb_async_retain(&op->super);
    return op;
}

static void revoke_id(h2o_req_t *req, int by_run, const char *seg, size_t seglen)
{
    char id[SB_MAX_RUN_ID + 1];
    admin_op_t *op;

    if ((op = start_id_op(req, by_run ? "revoke_run" : "revoke_token", by_run, seg, seglen, id)) == NULL)
        return;
    if (by_run) {
        memcpy(op->run_id, id, strlen(id) + 1);
        sb_store_revoke_run(sb_current_worker->store, op->run_id, on_revoked, op);
    } else {
        uint8_t hash[32];
        char h[13];
        sb_sha256(id, 64, hash);
        sb_hex(hash, 6, h);
        memcpy(op->tokref, h, 13);
        sb_store_revoke_token(sb_current_worker->store, hash, on_token_revoked, op);
    }
}

/* ---- inspection (PROTOCOL.md section 9, "Inspection"): what the store holds, never a token ---------------------------- */

/* one token record as the inspection routes show it: its hash prefix (as logged), never the token */
static json_t *token_json(const sb_token_t *tok)
{
    char ref[13];
    json_t *o, *scope = json_object();

    sb_hex(tok->hash, 6, ref);
    for (size_t i = 0; i < tok->scope_len; ++i)
        json_object_set_new(scope, tok->scope[i].key, json_string(tok->scope[i].value));
    o = json_pack("{s:s, s:I, s:o, s:o, s:{s:I, s:I, s:I}, s:o}", "tokenHash", ref, "expiresAt", (json_int_t)tok->expires_at_ms,
                  "target", tok->target[0] != '\0' ? json_string(tok->target) : json_null(), "scope", scope, "quotas", "calls",
                  (json_int_t)tok->quota.calls, "concurrent", (json_int_t)tok->quota.concurrent, "fetchBytes",
                  (json_int_t)tok->quota.fetch_bytes, "capabilities", sb_manifest_to_json(tok->manifest));
    if (o == NULL)
        sb_fatal(__FILE__, __LINE__, "out of memory");
    /* the names of the secrets the run holds (from its mint and its target), never a value */
    if (sb_secrets_count(tok->secrets) != 0) {
        json_t *names = json_array();
        if (names == NULL || json_object_set_new(o, "secrets", names) != 0)
            sb_fatal(__FILE__, __LINE__, "out of memory");
        for (size_t i = 0; i < sb_secrets_count(tok->secrets); ++i)
            if (json_array_append_new(names, json_string(sb_secrets_name(tok->secrets, i))) != 0)
                sb_fatal(__FILE__, __LINE__, "out of memory");
    }
    return o;
}

static json_t *usage_json(const sb_store_usage_t *u)
{
    json_t *o = json_pack("{s:I, s:I, s:I}", "calls", (json_int_t)u->calls, "inFlight", (json_int_t)u->inflight, "fetchedBytes",
                          (json_int_t)u->fetched_bytes);
    if (o == NULL)
        sb_fatal(__FILE__, __LINE__, "out of memory");
    return o;
}

/* ---- the run timeline (docs/audit.md, "The run timeline") ------------------------------------------------------------- */

/* the stored events that parse as JSON objects; the rest are counted in *invalid */
static json_t *parse_events(const sb_view_t *events, size_t n, size_t *invalid)
{
    json_t *list = json_array();
    *invalid = 0;
    for (size_t i = 0; i < n; ++i) {
        json_t *e = json_loadb((const char *)events[i].base, events[i].len, JSON_REJECT_DUPLICATES, NULL);
        if (!json_is_object(e) || !json_is_string(json_object_get(e, "ts")) || !json_is_string(json_object_get(e, "inst")) ||
            !json_is_integer(json_object_get(e, "n"))) {
            json_decref(e);
            ++*invalid;
            continue;
        }
        json_array_append_new(list, e);
    }
    return list;
}

/* time (ms, fixed width: a string order), then the instance, then its own sequence */
static int event_order(const void *a, const void *b)
{
    json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    int c = strcmp(json_string_value(json_object_get(x, "ts")), json_string_value(json_object_get(y, "ts")));
    json_int_t nx, ny;
    if (c != 0)
        return c;
    if ((c = strcmp(json_string_value(json_object_get(x, "inst")), json_string_value(json_object_get(y, "inst")))) != 0)
        return c;
    nx = json_integer_value(json_object_get(x, "n"));
    ny = json_integer_value(json_object_get(y, "n"));
    return nx < ny ? -1 : nx > ny;
}

static json_t *sorted_events(const sb_view_t *events, size_t n, size_t *invalid)
{
    json_t *list = parse_events(events, n, invalid), *out = json_array();
    size_t m = json_array_size(list);
    json_t **v = sb_mem_calloc(m + 1, sizeof(*v));
    for (size_t i = 0; i < m; ++i)
        v[i] = json_array_get(list, i);
    qsort(v, m, sizeof(*v), event_order);
    for (size_t i = 0; i < m; ++i)
        json_array_append(out, v[i]);
    sb_mem_free(v);
    json_decref(list);
    return out;
}

static void on_run_events(void *arg, sb_status_t st, const sb_view_t *events, size_t n)
{
    admin_op_t *op = arg;
    h2o_req_t *req = op->super.req;
    size_t invalid;

    if (req != NULL) {
        if (st != SB_OK) {
            sb_admin_send_store_error(req, "run_events", st);
        } else if (n == 0) {
            sb_admin_send_error(req, "run_events", SB_E_NOT_FOUND, "no events for that run");
        } else {
            json_t *list = sorted_events(events, n, &invalid);
            sb_admin_send_json(req, "run_events", SB_OK,
                               json_pack("{s:s, s:o, s:I, s:b}", "runId", op->run_id, "events", list, "invalid",
                                         (json_int_t)invalid, "capped",
                                         n >= (size_t)sb_current_worker->server->conf->timeline_max_events));
        }
    }
    sb_async_release(&op->super);
}

static void run_events(h2o_req_t *req, const char *seg, size_t seglen)
{
    char id[SB_MAX_RUN_ID + 1];
    admin_op_t *op;

    if ((op = start_id_op(req, "run_events", 1, seg, seglen, id)) == NULL)
        return;
    if (!sb_store_timeline_enabled(sb_current_worker->store)) {
        sb_admin_send_error(req, "run_events", SB_E_NOT_FOUND, "the run timeline is off (timeline_max_events is 0)");
        sb_async_release(&op->super);
        return;
    }
    memcpy(op->run_id, id, strlen(id) + 1);
    sb_store_timeline_get(sb_current_worker->store, op->run_id, on_run_events, op);
}

/* the inspection's counts: calls by outcome (code), secrets placed per host */
static void on_run_counts(void *arg, sb_status_t st, const sb_view_t *events, size_t n)
{
    admin_op_t *op = arg;
    h2o_req_t *req = op->super.req;
    json_t *outcomes = json_object(), *secrets = json_object(), *list;
    size_t invalid = 0;

    if (req == NULL)
        goto Exit;
    if (st == SB_OK) {
        list = parse_events(events, n, &invalid);
        for (size_t i = 0; i < json_array_size(list); ++i) {
            json_t *e = json_array_get(list, i);
            const char *type = json_string_value(json_object_get(e, "event"));
            if (type != NULL && strcmp(type, "call") == 0 && json_is_string(json_object_get(e, "code"))) {
                const char *code = json_string_value(json_object_get(e, "code"));
                json_object_set_new(outcomes, code, json_integer(json_integer_value(json_object_get(outcomes, code)) + 1));
            } else if (type != NULL && strcmp(type, "secret") == 0 && json_is_string(json_object_get(e, "host")) &&
                       json_is_string(json_object_get(e, "name"))) {
                const char *host = json_string_value(json_object_get(e, "host"));
                json_t *h = json_object_get(secrets, host), *name = json_object_get(e, "name");
                if (h == NULL) {
                    h = json_object();
                    json_object_set_new(secrets, host, h);
                }
                json_object_set_new(h, json_string_value(name),
                                    json_integer(json_integer_value(json_object_get(h, json_string_value(name))) + 1));
            }
        }
        json_decref(list);
        json_object_set(op->body, "callsByOutcome", outcomes);
        json_object_set(op->body, "secretsByHost", secrets);
    }
    /* a timeline that cannot be read leaves the counts out; the inspection itself stands */
    sb_admin_send_json(req, "inspect_run", SB_OK, op->body);
    op->body = NULL;
Exit:
    json_decref(outcomes);
    json_decref(secrets);
    sb_async_release(&op->super);
}

static void on_run_inspected(void *arg, sb_status_t st, sb_token_t *const *toks, size_t ntoks, size_t nlive,
                             const sb_store_usage_t *usage)
{
    admin_op_t *op = arg;
    h2o_req_t *req = op->super.req;

    if (req == NULL)
        goto Exit;
    if (st != SB_OK) {
        sb_admin_send_store_error(req, "inspect_run", st);
    } else if (nlive == 0) {
        sb_admin_send_error(req, "inspect_run", SB_E_NOT_FOUND, "no live token for that run");
    } else {
        json_t *list = json_array();
        for (size_t i = 0; i < ntoks; ++i)
            json_array_append_new(list, token_json(toks[i]));
        op->body = json_pack("{s:s, s:I, s:o, s:b, s:o}", "runId", op->run_id, "liveTokens", (json_int_t)nlive, "tokens", list,
                             "truncated", nlive > ntoks, "usage", usage_json(usage));
        if (op->body == NULL)
            sb_fatal(__FILE__, __LINE__, "out of memory");
        if (sb_store_timeline_enabled(sb_current_worker->store)) {
            /* the counts a host shows a user come from the run's timeline (the same reference goes on) */
            sb_store_timeline_get(sb_current_worker->store, op->run_id, on_run_counts, op);
            return;
        }
        sb_admin_send_json(req, "inspect_run", SB_OK, op->body);
        op->body = NULL;
    }
Exit:
    sb_async_release(&op->super);
}

static void on_token_usage(void *arg, sb_status_t st, sb_token_t *const *toks, size_t ntoks, size_t nlive,
                           const sb_store_usage_t *usage)
{
    admin_op_t *op = arg;
    h2o_req_t *req = op->super.req;

    (void)toks;
    (void)ntoks;
    (void)nlive;
    if (req == NULL)
        goto Exit;
    if (st != SB_OK) {
        sb_admin_send_store_error(req, "inspect_token", st);
    } else {
        json_t *o = token_json(op->tok);
        json_object_set_new(o, "runId", json_string(op->tok->run_id));
        json_object_set_new(o, "usage", usage_json(usage));
        sb_admin_send_json(req, "inspect_token", SB_OK, o);
    }
Exit:
    sb_async_release(&op->super);
}

static void on_token_record(void *arg, sb_status_t st, sb_token_t *tok)
{
    admin_op_t *op = arg;
    h2o_req_t *req = op->super.req;

    if (req == NULL || st != SB_OK) {
        if (req != NULL && st == SB_E_UNAUTHORIZED)
            sb_admin_send_error(req, "inspect_token", SB_E_NOT_FOUND, "no live token with that value");
        else if (req != NULL)
            sb_admin_send_store_error(req, "inspect_token", st);
        sb_token_release(tok);
        sb_async_release(&op->super);
        return;
    }
    op->tok = tok; /* released with the op */
    /* the run's usage, on the same reference (the callback releases it) */
    sb_store_inspect_run(sb_current_worker->store, tok->run_id, 0, on_token_usage, op);
}

static void inspect_id(h2o_req_t *req, int by_run, const char *seg, size_t seglen)
{
    char id[SB_MAX_RUN_ID + 1];
    admin_op_t *op;

    if ((op = start_id_op(req, by_run ? "inspect_run" : "inspect_token", by_run, seg, seglen, id)) == NULL)
        return;
    if (by_run) {
        memcpy(op->run_id, id, strlen(id) + 1);
        sb_store_inspect_run(sb_current_worker->store, op->run_id, SB_MAX_INSPECT_TOKENS, on_run_inspected, op);
    } else {
        uint8_t hash[32];
        sb_sha256(id, 64, hash);
        explicit_bzero(id, sizeof(id));
        sb_store_get(sb_current_worker->store, hash, on_token_record, op);
    }
}

/* 405 with the methods the path takes in Allow (RFC 9110 section 15.5.6) */
static void wrong_method(h2o_req_t *req, const char *op, const char *allow, const char *message)
{
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ALLOW, NULL, allow, strlen(allow));
    sb_admin_send_error(req, op, SB_E_METHOD_NOT_ALLOWED, message);
}

int sb_admin_on_req(h2o_handler_t *self, h2o_req_t *req)
{
    h2o_iovec_t path = req->path;
    size_t q;

    if (sb_http_framing_refuse(req))
        return 0;
    /* the raw path (query dropped): ids are decoded here, strictly, once */
    for (q = 0; q < path.len && path.base[q] != '?'; ++q)
        ;
    path.len = q;
    if (path.len >= 7 && memcmp(path.base, "/admin/", 7) == 0) {
        const char *op = sb_admin_op_of(req, path), *why;
        if ((why = unauthorized(req)) != NULL) {
            if (sb_admin_netmint_on_req(req, path))
                return 0;
            sb_admin_refuse(req, op, SB_E_UNAUTHORIZED, "missing or wrong admin secret", why, NULL);
            return 0;
        }
        if (h2o_memis(path.base, path.len, H2O_STRLIT("/admin/v1/tokens"))) {
            if (strcmp(op, "mint") != 0) {
                wrong_method(req, op, "POST", "use POST");
                return 0;
            }
            mint(req);
            return 0;
        }
        if (path.len > 17 && memcmp(path.base, "/admin/v1/tokens/", 17) == 0) {
            if (strcmp(op, "revoke_token") == 0)
                revoke_id(req, 0, path.base + 17, path.len - 17);
            else if (strcmp(op, "inspect_token") == 0)
                inspect_id(req, 0, path.base + 17, path.len - 17);
            else
                wrong_method(req, op, "GET, DELETE", "use GET or DELETE");
            return 0;
        }
        if (path.len > 15 + 7 && memcmp(path.base, "/admin/v1/runs/", 15) == 0 &&
            memcmp(path.base + path.len - 7, "/events", 7) == 0) {
            if (strcmp(op, "run_events") == 0)
                run_events(req, path.base + 15, path.len - 15 - 7);
            else
                wrong_method(req, op, "GET", "use GET");
            return 0;
        }
        if (path.len > 15 && memcmp(path.base, "/admin/v1/runs/", 15) == 0) {
            if (strcmp(op, "revoke_run") == 0)
                revoke_id(req, 1, path.base + 15, path.len - 15);
            else if (strcmp(op, "inspect_run") == 0)
                inspect_id(req, 1, path.base + 15, path.len - 15);
            else
                wrong_method(req, op, "GET, DELETE", "use GET or DELETE");
            return 0;
        }
        sb_admin_send_error(req, op, SB_E_NOT_FOUND, "no such admin endpoint");
        return 0;
    }
    if (h2o_memis(path.base, path.len, H2O_STRLIT("/metrics")) && h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET"))) {
        sb_buf_t text;
        sb_status_t st = sb_metrics_render(&text);
        if (st == SB_OK)
            sb_reply_send_buf(req, SB_OK, "text/plain; version=0.0.4", &text);
        else
            sb_admin_send_error(req, "other", st, "the metrics text could not be rendered");
        sb_buf_free(&text);
        return 0;
    }
    return sb_health_on_req(self, req);
}
