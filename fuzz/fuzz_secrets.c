/*
 * libFuzzer driver for broker/call/placeholder.c and broker/authz/secrets.c:
 * the placeholder scanner, the mint-body parser of `secrets` and redaction.
 *
 * Input: byte 0 picks a value length n (1-32), the next n bytes become the
 * value (mapped into [A-Z0-9_-], an alphabet no placeholder text contains, so
 * a redacted text can only hold the value where the input put it), the rest
 * is the text. Properties:
 *  - every placeholder the scanner finds lies inside the text, starts with
 *    "{{secret:", ends with "}}" and names a valid name; scanning from just
 *    past one finds the next or nothing, and stops;
 *  - redacting the text leaves no occurrence of the value, raw or as standard
 *    base64 of itself, and is deterministic;
 *  - the text as a mint body's `secrets` object parses, or is refused with
 *    bad_args and a non-empty message that does not contain the value.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "authz/authz.h"
#include "authz/secrets.h"
#include "call/placeholder.h"
#include "sb/mem.h"
#include "sb/value.h"
#include "fuzz.h"

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-";

static sb_manifest_t *net_manifest(void)
{
    static sb_manifest_t *m;
    if (m == NULL) {
        json_t *caps = json_pack("{s:[s,s]}", "net", "api.test", "*.cdn.test");
        char err[256];
        if (sb_manifest_parse(caps, &m, err, sizeof(err)) != SB_OK)
            abort();
        json_decref(caps);
    }
    return m;
}

static void check_placeholders(const char *s, size_t len)
{
    size_t from = 0, rounds = 0;
    sb_placeholder_t p;
    int r;

    while ((r = sb_placeholder_next(s, len, from, &p)) == 1) {
        SB_FUZZ_ASSERT(p.start >= from && p.start + p.len <= len, "placeholder outside the text");
        SB_FUZZ_ASSERT(memcmp(s + p.start, SB_PLACEHOLDER_OPEN, SB_PLACEHOLDER_OPEN_LEN) == 0, "no opening");
        SB_FUZZ_ASSERT(s[p.start + p.len - 1] == '}' && s[p.start + p.len - 2] == '}', "no closing");
        SB_FUZZ_ASSERT(p.name == p.start + SB_PLACEHOLDER_OPEN_LEN && p.name + p.name_len + 2 == p.start + p.len, "name span");
        SB_FUZZ_ASSERT(sb_placeholder_is_name(s + p.name, p.name_len), "invalid name accepted");
        from = p.start + p.len;
        SB_FUZZ_ASSERT(++rounds <= len, "the scan does not advance");
    }
    SB_FUZZ_ASSERT(r == 0 || r == -1, "unexpected result %d", r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char value[33], b64[64];
    size_t n, tlen, olen, olen2;
    const char *text;
    sb_secrets_t *s = NULL;
    json_t *j;
    char *out = NULL, *out2 = NULL, err[512];

    if (size < 2)
        return 0;
    n = (size_t)(data[0] % 32) + 1;
    if (size < 1 + n)
        return 0;
    for (size_t i = 0; i < n; ++i)
        value[i] = alphabet[data[1 + i] % (sizeof(alphabet) - 1)];
    value[n] = '\0';
    text = (const char *)data + 1 + n;
    tlen = size - 1 - n;

    check_placeholders(text, tlen);

    j = json_pack("{s:{s:s, s:[s]}}", "gh", "value", value, "hosts", "api.test");
    SB_FUZZ_ASSERT(sb_secrets_parse(j, net_manifest(), &s, err, sizeof(err)) == SB_OK, "a good secret refused: %s", err);
    json_decref(j);
    if (sb_secrets_redact(s, text, tlen, 64 * tlen + 64, &out, &olen) == SB_OK) {
        const char *res = out != NULL ? out : text;
        SB_FUZZ_ASSERT(memmem(res, olen, value, n) == NULL, "the value survived redaction");
        if (n >= 3) {
            sb_b64_encode((const uint8_t *)value, n, b64);
            SB_FUZZ_ASSERT(memmem(res, olen, b64, strlen(b64)) == NULL, "the value's base64 survived redaction");
        }
        SB_FUZZ_ASSERT(sb_secrets_redact(s, text, tlen, 64 * tlen + 64, &out2, &olen2) == SB_OK && olen2 == olen &&
                           (out == NULL) == (out2 == NULL) && (out == NULL || memcmp(out, out2, olen) == 0),
                       "redaction is not deterministic");
    }
    sb_mem_free(out);
    sb_mem_free(out2);
    sb_secrets_free(s);

    /* the text as the mint body's secrets object */
    if ((j = json_loadb(text, tlen, JSON_REJECT_DUPLICATES, NULL)) != NULL) {
        sb_secrets_t *t = NULL;
        sb_status_t st = sb_secrets_parse(j, net_manifest(), &t, err, sizeof(err));
        SB_FUZZ_ASSERT(st == SB_OK || st == SB_E_BAD_ARGS, "unexpected status %d", (int)st);
        if (st == SB_E_BAD_ARGS)
            SB_FUZZ_ASSERT(err[0] != '\0' && t == NULL, "a refusal without a message");
        sb_secrets_free(t);
        json_decref(j);
    }
    return 0;
}
