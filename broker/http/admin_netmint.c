/*
 * The net-mint credential (see admin_netmint.h).
 *
 * Least privilege, stated once: a token it mints grants fetching from the
 * hosts in `net` and loading modules from the hosts in `import`
 * (PROTOCOL.md section 6c), for at most timeoutMs + 30 s, and nothing else (no target,
 * so no data, files or tools; no scope; the configured quotas). Revoking
 * needs the token itself, so it reaches only tokens its holder was given;
 * even then only those under the reserved run id prefix, with no target and
 * no scope: the shape it mints.
 */
#include <stdio.h>
#include <string.h>
#include "http/admin_int.h"
#include "http/admin_netmint.h"
#include "http/async.h"
#include "http/worker.h"
#include "obs/log.h"
#include "obs/metrics.h"
#include "sb/limits.h"
#include "util/util.h"

typedef struct st_netmint_op_t {
    sb_async_t super;
    const char *op;
    char token_hex[65];
    char tokref[13];
    char run_id[SB_MAX_RUN_ID + 1];
    uint8_t hash[32];
    int64_t expires_at;
    json_t *caps;
    sb_token_t *tok;
} netmint_op_t;

static void op_dispose(sb_async_t *a)
{
    netmint_op_t *op = (netmint_op_t *)a;
    explicit_bzero(op->token_hex, sizeof(op->token_hex));
    json_decref(op->caps);
    sb_token_release(op->tok);
}

static void forbidden(h2o_req_t *req, const char *op, const char *message)
{
    sb_admin_refuse(req, op, SB_E_FORBIDDEN, message, NULL, "net-mint");
}

int sb_admin_netmint_reserved(const char *run_id)
{
    return strncmp(run_id, SB_NETMINT_RUN_PREFIX, sizeof(SB_NETMINT_RUN_PREFIX) - 1) == 0;
}

/* the bearer is the net-mint secret: compared as SHA-256 digests in constant time, as the admin secret is */
static int authorized(h2o_req_t *req)
{
    const char *secret = sb_current_worker->server->conf->admin_net_mint_secret;
    ssize_t i = h2o_find_header(&req->headers, H2O_TOKEN_AUTHORIZATION, -1);
    uint8_t got[32], want[32];
    h2o_iovec_t v;
    int ok;

    if (secret == NULL || i < 0)
        return 0;
    v = req->headers.entries[i].value;
    if (v.len < 7 || !h2o_lcstris(v.base, 7, H2O_STRLIT("bearer ")))
        return 0;
    sb_sha256(v.base + 7, v.len - 7, got);
    sb_sha256(secret, strlen(secret), want);
    ok = sb_ct_equal(got, want, 32);
    explicit_bzero(want, sizeof(want));
    return ok;
}

static void on_stored(void *arg, sb_status_t st)
{
    netmint_op_t *op = arg;
    h2o_req_t *req = op->super.req;
    sb_logline_t l;

    if (req != NULL) {
        if (st == SB_OK) {
            sb_log_begin(&l, SB_LOG_INFO, "token.minted");
            sb_log_cstr(&l, "runId", op->run_id);
            sb_log_cstr(&l, "token", op->tokref);
            sb_log_cstr(&l, "credential", "net-mint");
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

/*
 * {runId, capabilities: {net?, import?, timeoutMs}}, nothing else: runId
 * under the reserved prefix, net and import non-empty lists (at least one of
 * them), timeoutMs 1..30,000.
 */
static int host_list_or_absent(const json_t *v)
{
    return v == NULL || (json_is_array(v) && json_array_size(v) != 0);
}

static void mint_one(h2o_req_t *req)
{
    sb_config_t *conf = sb_current_worker->server->conf;
    static const char shape[] = "the net-mint credential mints only {runId: \"" SB_NETMINT_RUN_PREFIX
                                "...\", capabilities: {net?: [hosts], import?: [hosts], timeoutMs: 1..30000}}";
    json_error_t jerr;
    json_t *body, *run, *caps, *net, *import, *timeout;
    char err[512];
    uint8_t raw[32];
    int64_t ttl_ms;
    netmint_op_t *op;
    sb_token_t *tok;

    if (req->entity.base == NULL || req->entity.len == 0 || req->entity.len > SB_MAX_ADMIN_BODY ||
        (body = json_loadb(req->entity.base, req->entity.len, JSON_REJECT_DUPLICATES, &jerr)) == NULL) {
        sb_admin_send_error(req, "mint", SB_E_BAD_ARGS, "invalid JSON body");
        return;
    }
    run = json_object_get(body, "runId");
    caps = json_object_get(body, "capabilities");
    net = json_object_get(caps, "net");
    import = json_object_get(caps, "import");
    timeout = json_object_get(caps, "timeoutMs");
    if (!json_is_object(body) || json_object_size(body) != 2 || !json_is_string(run) || !json_is_object(caps) ||
        (net == NULL && import == NULL) || json_object_size(caps) != (size_t)(1 + (net != NULL) + (import != NULL)) ||
        !host_list_or_absent(net) || !host_list_or_absent(import) || !json_is_integer(timeout) || json_integer_value(timeout) < 1 ||
        json_integer_value(timeout) > SB_NETMINT_MAX_TIMEOUT_MS || strlen(json_string_value(run)) != json_string_length(run) ||
        !sb_admin_netmint_reserved(json_string_value(run))) {
        json_decref(body);
        forbidden(req, "mint", shape);
        return;
    }
    if (sb_random(raw, sizeof(raw)) != SB_OK) {
        json_decref(body);
        sb_admin_send_error(req, "mint", SB_E_UNAVAILABLE, "no randomness available");
        return;
    }
    op = (netmint_op_t *)sb_async_attach(req, sizeof(*op), op_dispose);
    op->op = "mint";
    sb_hex(raw, sizeof(raw), op->token_hex);
    explicit_bzero(raw, sizeof(raw));
    sb_sha256(op->token_hex, 64, op->hash);
    sb_hex(op->hash, 6, op->tokref);
    /* the manifest parser is the one the admin secret's mints go through: a bad net entry is refused the same way */
    if (sb_token_build(op->hash, json_string_value(run), caps, NULL, NULL, 0, &tok, err, sizeof(err)) != SB_OK) {
        json_decref(body);
        sb_admin_send_error(req, "mint", SB_E_BAD_ARGS, err);
        return;
    }
    tok->quota.calls = conf->quota_calls;
    tok->quota.concurrent = conf->quota_concurrent;
    tok->quota.fetch_bytes = conf->quota_fetch_bytes;
    ttl_ms = (int64_t)json_integer_value(timeout) + 30000;
    if (ttl_ms > conf->max_ttl_ms)
        ttl_ms = conf->max_ttl_ms;
    tok->expires_at_ms = op->expires_at = sb_now_ms() + ttl_ms;
    memcpy(op->run_id, tok->run_id, strlen(tok->run_id) + 1); /* at most SB_MAX_RUN_ID bytes (sb_token_build) */
    op->tok = tok;
    op->caps = json_incref(caps);
    json_decref(body);
    sb_async_retain(&op->super);
    sb_store_put(sb_current_worker->store, tok, op->caps, on_stored, op);
}

static void on_revoked(void *arg, sb_status_t st)
{
    netmint_op_t *op = arg;
    h2o_req_t *req = op->super.req;
    sb_logline_t l;

    if (st == SB_OK) {
        sb_log_begin(&l, SB_LOG_INFO, "token.revoked");
        sb_log_cstr(&l, "token", op->tokref);
        sb_log_cstr(&l, "credential", "net-mint");
        sb_log_end(&l);
    }
    if (req != NULL) {
        if (st == SB_OK) {
            sb_admin_send(req, "revoke_token", SB_OK_NO_CONTENT, NULL, 0);
        } else {
            sb_admin_send_store_error(req, "revoke_token", st);
        }
    }
    sb_async_release(&op->super);
}

static void on_token_revoked(void *arg, sb_status_t st, const char *run_id)
{
    (void)run_id; /* net-mint runs have no timeline worth a line: the token reference says which */
    on_revoked(arg, st);
}

/* the record decides: only a token of the shape this credential mints is revoked */
static void on_looked_up(void *arg, sb_status_t st, sb_token_t *tok)
{
    netmint_op_t *op = arg;
    h2o_req_t *req = op->super.req;

    if (st == SB_E_UNAUTHORIZED) {
        /* unknown or expired: nothing to revoke, and the answer is the idempotent one */
        on_revoked(op, SB_OK);
        return;
    }
    if (st != SB_OK) {
        if (req != NULL)
            sb_admin_send_store_error(req, "revoke_token", st);
        sb_async_release(&op->super);
        return;
    }
    if (!sb_admin_netmint_reserved(tok->run_id) || tok->target[0] != '\0' || tok->scope_len != 0) {
        sb_token_release(tok);
        if (req != NULL)
            forbidden(req, "revoke_token", "the net-mint credential revokes only the network tokens it mints");
        sb_async_release(&op->super);
        return;
    }
    sb_token_release(tok);
    sb_store_revoke_token(sb_current_worker->store, op->hash, on_token_revoked, op);
}

static void revoke_one(h2o_req_t *req, const char *seg, size_t len)
{
    netmint_op_t *op;

    if (!sb_is_token_format(seg, len)) {
        sb_admin_send_error(req, "revoke_token", SB_E_BAD_ARGS, "token: expected 64 lowercase hex characters");
        return;
    }
    op = (netmint_op_t *)sb_async_attach(req, sizeof(*op), op_dispose);
    op->op = "revoke_token";
    sb_sha256(seg, 64, op->hash);
    sb_hex(op->hash, 6, op->tokref);
    sb_async_retain(&op->super);
    sb_store_get(sb_current_worker->store, op->hash, on_looked_up, op);
}

int sb_admin_netmint_on_req(h2o_req_t *req, h2o_iovec_t path)
{
    if (!authorized(req))
        return 0;
    if (h2o_memis(path.base, path.len, H2O_STRLIT("/admin/v1/tokens")) &&
        h2o_memis(req->method.base, req->method.len, H2O_STRLIT("POST"))) {
        mint_one(req);
    } else if (path.len > 17 && memcmp(path.base, "/admin/v1/tokens/", 17) == 0 &&
               h2o_memis(req->method.base, req->method.len, H2O_STRLIT("DELETE"))) {
        revoke_one(req, path.base + 17, path.len - 17);
    } else {
        /* inspection too: a token's record names its run, target, scope and manifest, more than this credential needs */
        forbidden(req, sb_admin_op_of(req, path), "the net-mint credential can only mint and revoke network tokens");
    }
    return 1;
}
