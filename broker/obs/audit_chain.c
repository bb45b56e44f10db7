#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include "obs/audit_chain.h"
#include "sb/buf.h"
#include "util/util.h"

/* lowercase hex only: the writer never writes uppercase, so any other spelling is an edit */
static int unhex_lower(const uint8_t *s, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; ++i) {
        int hi = s[2 * i], lo = s[2 * i + 1];
        hi = hi >= '0' && hi <= '9' ? hi - '0' : hi >= 'a' && hi <= 'f' ? hi - 'a' + 10 : -1;
        lo = lo >= '0' && lo <= '9' ? lo - '0' : lo >= 'a' && lo <= 'f' ? lo - 'a' + 10 : -1;
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

#define LIT(r, s) sb_reader_expect((r), (s), sizeof(s) - 1)

/* a decimal without leading zeros (so one value has one spelling) */
static int dec(sb_reader_t *r, uint64_t *out)
{
    uint8_t c0, c1;
    if (sb_reader_peek(r, &c0) != SB_OK)
        return -1;
    if (c0 == '0' && sb_reader_peek_at(r, 1, &c1) == SB_OK && c1 >= '0' && c1 <= '9')
        return -1;
    return sb_reader_dec(r, UINT64_MAX, out) == SB_OK ? 0 : -1;
}

sb_status_t sb_audit_record_parse(const char *line, size_t len, sb_audit_record_t *out, const char **why)
{
    static const char sig_head[] = ",\"sig\":\"";
    const size_t sig_tail = sizeof(sig_head) - 1 + 2 * SB_AUDIT_SIG_LEN + 2; /* ,"sig":"<hex>"} */
    sb_reader_t r;
    sb_view_t v;
    size_t body_len = len;

    memset(out, 0, sizeof(*out));
    *why = "not a chain record";
    if (len > SB_AUDIT_RECORD_MAX) {
        *why = "record longer than any the writer writes";
        return SB_E_BAD_ARGS;
    }
    /* a signed record ends with its signature, which covers every byte before it */
    if (len > sig_tail && memcmp(line + len - sig_tail, sig_head, sizeof(sig_head) - 1) == 0 && line[len - 2] == '"' &&
        line[len - 1] == '}') {
        if (unhex_lower((const uint8_t *)line + len - sig_tail + sizeof(sig_head) - 1, SB_AUDIT_SIG_LEN, out->sig) != 0) {
            *why = "malformed signature";
            return SB_E_BAD_ARGS;
        }
        out->has_sig = 1;
        out->signed_len = len - sig_tail;
        body_len = out->signed_len;
    }
    sb_reader_init(&r, line, body_len);
    if (!LIT(&r, "{\"seq\":") || dec(&r, &out->seq) != 0 || !LIT(&r, ",\"inst\":\"") ||
        sb_reader_bytes(&r, SB_AUDIT_INST_LEN, &v) != SB_OK) {
        *why = "no chain prefix (seq, inst)";
        return SB_E_BAD_ARGS;
    }
    for (size_t i = 0; i < SB_AUDIT_INST_LEN; ++i) {
        uint8_t c = v.base[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
            *why = "malformed instance id";
            return SB_E_BAD_ARGS;
        }
    }
    memcpy(out->inst, v.base, SB_AUDIT_INST_LEN);
    if (!LIT(&r, "\",\"prev\":\"") || sb_reader_bytes(&r, 64, &v) != SB_OK || unhex_lower(v.base, 32, out->prev) != 0 ||
        !LIT(&r, "\",\"ts\":\"") || sb_reader_skip(&r, 24) != SB_OK || !LIT(&r, "\",\"event\":\"") ||
        sb_reader_until(&r, '"', &v) != SB_OK || v.len == 0 || v.len >= sizeof(out->event) || sb_reader_skip(&r, 1) != SB_OK) {
        *why = "no chain prefix (prev, ts, event)";
        return SB_E_BAD_ARGS;
    }
    memcpy(out->event, v.base, v.len);
    if (strcmp(out->event, "audit.genesis") == 0) {
        out->kind = SB_AUDIT_REC_GENESIS;
        if (!LIT(&r, ",\"key\":\"")) {
            *why = "genesis without its key field";
            return SB_E_BAD_ARGS;
        }
        if (sb_reader_peek_bytes(&r, 65, &v) == SB_OK && v.base[64] == '"') {
            if (unhex_lower(v.base, 32, out->key) != 0) {
                *why = "malformed genesis key";
                return SB_E_BAD_ARGS;
            }
            out->has_key = 1;
            if (sb_reader_skip(&r, 64) != SB_OK)
                return SB_E_BAD_ARGS;
        }
        if (!LIT(&r, "\"")) {
            *why = "malformed genesis key";
            return SB_E_BAD_ARGS;
        }
    } else if (strcmp(out->event, "audit.checkpoint") == 0) {
        out->kind = SB_AUDIT_REC_CHECKPOINT;
        if (!LIT(&r, ",\"reason\":\"") || sb_reader_until(&r, '"', &v) != SB_OK || v.len == 0 || v.len >= sizeof(out->reason)) {
            *why = "checkpoint without its reason";
            return SB_E_BAD_ARGS;
        }
        memcpy(out->reason, v.base, v.len);
    } else if (strcmp(out->event, "audit.gap") == 0) {
        out->kind = SB_AUDIT_REC_GAP;
        if (!LIT(&r, ",\"lost\":") || dec(&r, &out->lost) != 0) {
            *why = "gap without its count";
            return SB_E_BAD_ARGS;
        }
        out->torn = LIT(&r, ",\"torn\":true");
    } else {
        out->kind = SB_AUDIT_REC_CALL;
    }
    if (out->has_sig && out->kind != SB_AUDIT_REC_GENESIS && out->kind != SB_AUDIT_REC_CHECKPOINT) {
        *why = "a signature on a record that is not a genesis or checkpoint";
        return SB_E_BAD_ARGS;
    }
    if (out->kind == SB_AUDIT_REC_GENESIS && out->seq != 0) {
        *why = "genesis with a sequence number other than 0";
        return SB_E_BAD_ARGS;
    }
    if (!out->has_sig && (body_len == 0 || line[body_len - 1] != '}')) {
        *why = "record does not end with }";
        return SB_E_BAD_ARGS;
    }
    return SB_OK;
}

void sb_audit_hash(const void *p, size_t len, uint8_t out[32])
{
    sb_sha256(p, len, out);
}

static void ssl_reason(const char *path, const char *what, char *err, size_t errsz)
{
    unsigned long e = ERR_get_error();
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    snprintf(err, errsz, "%s: %s%s%s", path, what, e != 0 ? ": " : "", e != 0 ? buf : "");
    ERR_clear_error();
}

static EVP_PKEY *read_key(const char *path, int want_private, char *err, size_t errsz)
{
    FILE *fp = fopen(path, "r");
    EVP_PKEY *key = NULL;
    uint8_t raw[32];

    if (fp == NULL) {
        snprintf(err, errsz, "%s: %s", path, strerror(errno));
        return NULL;
    }
    key = PEM_read_PrivateKey(fp, NULL, NULL, NULL);
    if (key == NULL && !want_private) {
        ERR_clear_error();
        rewind(fp);
        key = PEM_read_PUBKEY(fp, NULL, NULL, NULL);
    }
    fclose(fp);
    if (key == NULL) {
        ssl_reason(path, want_private ? "not a PEM private key" : "not a PEM public or private key", err, errsz);
        return NULL;
    }
    if (sb_audit_key_raw(key, raw) != 0) {
        snprintf(err, errsz, "%s: not an Ed25519 key (make one with: openssl genpkey -algorithm ed25519)", path);
        EVP_PKEY_free(key);
        return NULL;
    }
    return key;
}

EVP_PKEY *sb_audit_key_read_private(const char *path, char *err, size_t errsz)
{
    return read_key(path, 1, err, errsz);
}

EVP_PKEY *sb_audit_key_read_public(const char *path, char *err, size_t errsz)
{
    return read_key(path, 0, err, errsz);
}

int sb_audit_key_raw(EVP_PKEY *key, uint8_t out[32])
{
    size_t n = 32;
    if (EVP_PKEY_id(key) != EVP_PKEY_ED25519 || EVP_PKEY_get_raw_public_key(key, out, &n) != 1 || n != 32) {
        ERR_clear_error();
        return -1;
    }
    return 0;
}

int sb_audit_sign(EVP_PKEY *key, const void *p, size_t len, uint8_t sig[SB_AUDIT_SIG_LEN])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    size_t n = SB_AUDIT_SIG_LEN;
    int ok = ctx != NULL && EVP_DigestSignInit(ctx, NULL, NULL, NULL, key) == 1 && EVP_DigestSign(ctx, sig, &n, p, len) == 1 &&
             n == SB_AUDIT_SIG_LEN;
    EVP_MD_CTX_free(ctx);
    if (!ok)
        ERR_clear_error();
    return ok ? 0 : -1;
}

int sb_audit_sig_ok(const uint8_t pub[32], const void *p, size_t len, const uint8_t sig[SB_AUDIT_SIG_LEN])
{
    EVP_PKEY *key = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, pub, 32);
    EVP_MD_CTX *ctx = key != NULL ? EVP_MD_CTX_new() : NULL;
    int ok = ctx != NULL && EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, key) == 1 &&
             EVP_DigestVerify(ctx, sig, SB_AUDIT_SIG_LEN, p, len) == 1;
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(key);
    ERR_clear_error();
    return ok;
}
