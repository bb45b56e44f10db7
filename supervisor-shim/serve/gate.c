/*
 * The gate on a connection's first request head (see gate.h).
 *
 * The head is parsed with the parser h2o itself uses, picohttpparser's phr_parse_request, which
 * libh2o-evloop exports (Debian ships no header for it: the prototype is below), in the same window
 * and with the same header count, so that the head decided here is the head h2o acts on. The framing
 * rules are the broker listener's (broker/http/framing.c, RFC 9112 sections 5.2, 6.1 and 6.3).
 */
#include <string.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include "serve/gate.h"

#define ADMISSION "x-questpie-sandbox-host-admission"
#define MAX_HEADERS 100 /* H2O_MAX_HEADERS */

struct phr_header {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
};
int phr_parse_request(const char *buf, size_t len, const char **method, size_t *method_len, const char **path, size_t *path_len,
                      int *minor_version, struct phr_header *headers, size_t *num_headers, size_t last_len);

/* ASCII case-insensitive equality with a lowercase literal */
static int ieq(const char *s, size_t n, const char *lit)
{
    size_t l = strlen(lit);
    if (s == NULL || n != l)
        return 0;
    for (size_t i = 0; i != n; ++i) {
        char c = s[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != lit[i])
            return 0;
    }
    return 1;
}

/* 1*DIGIT into *v, saturating at SIZE_MAX; 0 when not digits */
static int digits(const char *s, size_t n, size_t *v)
{
    size_t x = 0;
    if (n == 0)
        return 0;
    for (size_t i = 0; i != n; ++i) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        x = x > (SIZE_MAX - 9) / 10 ? SIZE_MAX : x * 10 + (size_t)(s[i] - '0');
    }
    *v = x;
    return 1;
}

static int admission_ok(const struct phr_header *h, const uint8_t want[32])
{
    uint8_t got[32];
    unsigned len = 32;
    if (EVP_Digest(h->value, h->value_len, got, &len, EVP_sha256(), NULL) != 1)
        return 0;
    return CRYPTO_memcmp(got, want, 32) == 0;
}

sb_serve_gate_t sb_serve_gate_head(const char *buf, size_t len, const uint8_t admission_hash[32], size_t max_body,
                                   sb_serve_gate_head_t *out, const char **why)
{
    struct phr_header headers[MAX_HEADERS];
    size_t nheaders = MAX_HEADERS, ncl = 0, nte = 0, nadm = 0, cl_value = 0, mlen, plen;
    const struct phr_header *cl = NULL, *te = NULL, *adm = NULL;
    const char *method, *path;
    int minor, r;

    memset(out, 0, sizeof(*out));
    r = phr_parse_request(buf, len > SB_SERVE_GATE_MAX_HEAD ? SB_SERVE_GATE_MAX_HEAD : len, &method, &mlen, &path, &plen, &minor,
                          headers, &nheaders, 0);
    if (r == -2 && len < SB_SERVE_GATE_MAX_HEAD)
        return SB_GATE_MORE;
    if (r <= 0) {
        *why = r == -2 ? "the request head is too long" : "the request head does not parse";
        return SB_GATE_BAD_HEAD;
    }
    out->method = method;
    out->method_len = mlen;
    out->target = path;
    out->target_len = plen;
    for (size_t i = 0; i != nheaders; ++i) {
        const struct phr_header *h = headers + i;
        if (h->name == NULL) {
            *why = "obs-fold line in the request head";
            return SB_GATE_FRAMING;
        }
        if (ieq(h->name, h->name_len, "content-length"))
            ++ncl, cl = h;
        else if (ieq(h->name, h->name_len, "transfer-encoding"))
            ++nte, te = h;
        else if (ieq(h->name, h->name_len, ADMISSION))
            ++nadm, adm = h;
    }
    if (te != NULL) {
        if (minor == 0)
            *why = "Transfer-Encoding in an HTTP/1.0 request";
        else if (cl != NULL)
            *why = "both Transfer-Encoding and Content-Length";
        else if (nte != 1)
            *why = "more than one Transfer-Encoding field";
        else if (!ieq(te->value, te->value_len, "chunked"))
            *why = "Transfer-Encoding other than chunked";
        else
            *why = NULL;
        if (*why != NULL)
            return SB_GATE_FRAMING;
    }
    if (cl != NULL) {
        if (ncl != 1) {
            *why = "more than one Content-Length field";
            return SB_GATE_FRAMING;
        }
        if (!digits(cl->value, cl->value_len, &cl_value)) {
            *why = "Content-Length is not a decimal number";
            return SB_GATE_FRAMING;
        }
    }
    out->admitted = nadm == 1 && admission_ok(adm, admission_hash);
    {
        size_t p = 0;
        while (p < plen && path[p] != '?')
            ++p;
        out->is_run = mlen == 4 && memcmp(method, "POST", 4) == 0 && p == 4 && memcmp(path, "/run", 4) == 0;
    }
    out->has_body = te != NULL || cl_value > 0;
    if (cl_value > max_body) {
        *why = "request body too large";
        return SB_GATE_TOO_LARGE;
    }
    if (out->has_body && !out->admitted) {
        *why = "a request body without the admission header";
        return SB_GATE_DENIED;
    }
    return SB_GATE_PASS;
}
