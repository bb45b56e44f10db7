/*
 * Unit tests for broker/authz/secrets.c and broker/call/placeholder.c: mint
 * validation with the exact path of every error, the per-hop decision and its
 * reasons, redaction of every form of a value (including a value split across
 * the reads that assembled a response, and a body at the cap), and sealing
 * for the Redis store (round trip, wrong key, wrong token, tampering).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "sb/limits.h"
#include "sb/value.h"
#include "authz/authz.h"
#include "authz/secrets.h"
#include "call/placeholder.h"
#include "fetch/http1.h"

#define VALUE "s3cr3t-V4lue_0123"

static sb_manifest_t *manifest(const char *text)
{
    json_t *j = json_loads(text, 0, NULL);
    sb_manifest_t *m = NULL;
    char err[256];
    if (sb_manifest_parse(j, &m, err, sizeof(err)) != SB_OK)
        printf("# manifest: %s\n", err);
    json_decref(j);
    return m;
}

static sb_status_t parse(const sb_manifest_t *m, const char *text, sb_secrets_t **out, char *err, size_t errsz)
{
    json_t *j = json_loads(text, JSON_DECODE_ANY, NULL);
    sb_status_t st;
    if (j == NULL) {
        printf("# bad test JSON %s\n", text);
        return SB_E_EXECUTION;
    }
    st = sb_secrets_parse(j, m, out, err, errsz);
    /* the parse wipes the body's copies of the values */
    if (st == SB_OK && json_is_object(j)) {
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v)
        {
            const json_t *val = json_object_get(v, "value");
            if (json_is_string(val))
                ok(strstr(json_string_value(val), VALUE) == NULL && json_string_value(val)[0] == '\0', "value wiped in the body");
        }
    }
    json_decref(j);
    return st;
}

static void test_validation(void)
{
    static const struct {
        const char *json;
        const char *err;
    } cases[] = {
        {"{}", NULL},
        {"null", NULL},
        {"{\"gh\": {\"value\": \"" VALUE "\", \"hosts\": [\"api.test\"]}}", NULL},
        {"{\"a.b-c_D\": {\"value\": \"x\", \"hosts\": [\"api.test\", {\"host\": \"api.test\", \"methods\": [\"GET\"]}],"
         " \"headers\": [\"X-Key\"], \"methods\": [\"GET\"], \"paths\": [\"/v1/**\"], \"schemes\": [\"http\", \"https\"]}}",
         NULL},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"sub.wild.test\", \"*.wild.test\", \"*.deep.wild.test:8443\"]}}", NULL},
        {"[]", "secrets: expected an object"},
        {"{\"\": {}}", "secrets.: expected a name of [A-Za-z0-9_.-]{1,64}"},
        {"{\"a/b\": {}}", "secrets.a/b: expected a name of [A-Za-z0-9_.-]{1,64}"},
        {"{\"gh\": []}", "secrets.gh: expected an object"},
        {"{\"gh\": {\"hosts\": [\"api.test\"]}}", "secrets.gh.value: expected a string of 1-8192 bytes"},
        {"{\"gh\": {\"value\": 1, \"hosts\": [\"api.test\"]}}", "secrets.gh.value: expected a string of 1-8192 bytes"},
        {"{\"gh\": {\"value\": \"\", \"hosts\": [\"api.test\"]}}", "secrets.gh.value: expected a string of 1-8192 bytes"},
        {"{\"gh\": {\"value\": \"a\\rb\", \"hosts\": [\"api.test\"]}}", "secrets.gh.value: must not contain CR, LF or NUL"},
        {"{\"gh\": {\"value\": \"a\\nb\", \"hosts\": [\"api.test\"]}}", "secrets.gh.value: must not contain CR, LF or NUL"},
        {"{\"gh\": {\"value\": \"x\"}}", "secrets.gh.hosts: expected a non-empty array of net entries"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": \"api.test\"}}", "secrets.gh.hosts: expected a non-empty array of net entries"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [1]}}", "secrets.gh.hosts[0]: must be a string or an object"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"api.test:99999\"]}}", "secrets.gh.hosts[0]: invalid port"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"evil.test\"]}}", "secrets.gh.hosts[0]: the host is not in capabilities.net"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"api.test:8443\"]}}", NULL},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"port.test\"]}}", "secrets.gh.hosts[0]: the host is not in capabilities.net"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"port.test:444\"]}}",
         "secrets.gh.hosts[0]: the host is not in capabilities.net"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"port.test:443\"]}}", NULL},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"wild.test\"]}}", "secrets.gh.hosts[0]: the host is not in capabilities.net"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"*.test\"]}}", "secrets.gh.hosts[0]: the host is not in capabilities.net"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"[::1]\"]}}", "secrets.gh.hosts[0]: the host is not in capabilities.net"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"api.test\"], \"headers\": []}}",
         "secrets.gh.headers: expected an array of 1-256 header names"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"api.test\"], \"headers\": [\"a:b\"]}}",
         "secrets.gh.headers[0]: expected a header name"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"api.test\"], \"methods\": [\"get\"]}}",
         "secrets.gh.methods[0]: expected an uppercase HTTP method"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"api.test\"], \"methods\": []}}",
         "secrets.gh.methods: must not be empty (omit it to allow any)"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"api.test\"], \"paths\": [\"v1\"]}}",
         "secrets.gh.paths[0]: expected a glob starting with '/'"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"api.test\"], \"schemes\": [\"HTTPS\"]}}",
         "secrets.gh.schemes[0]: expected \"http\" or \"https\""},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"api.test\"], \"schemes\": [\"http\", \"https\", \"http\"]}}",
         "secrets.gh.schemes: expected an array of \"http\" and/or \"https\""},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"api.test\"], \"value_env\": \"X\"}}", "secrets.gh.value_env: unknown key"},
        {"{\"gh\": {\"value\": \"x\", \"hosts\": [\"api.test\"], \"Hosts\": []}}", "secrets.gh.Hosts: unknown key"},
    };
    sb_manifest_t *m = manifest("{\"net\": [\"api.test\", \"api.test:8443\", \"port.test:443\", \"*.wild.test\"]}");
    char big[80 + SB_MAX_SECRET_VALUE + 2], err[512];
    sb_secrets_t *s;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        sb_status_t st;
        s = (sb_secrets_t *)1;
        strcpy(err, "(untouched)"); /* checksrc:allow test fixture */
        st = parse(m, cases[i].json, &s, err, sizeof(err));
        if (cases[i].err == NULL) {
            is_int(st, SB_OK, "accept %s", cases[i].json);
            if (st != SB_OK)
                printf("#   err: %s\n", err);
            sb_secrets_free(s);
        } else {
            is_int(st, SB_E_BAD_ARGS, "reject %s", cases[i].json);
            ok(s == NULL, "  no set");
            is_str(err, cases[i].err, "  error message");
        }
    }
    /* sizes: 8192 bytes is the longest value, 32 the most secrets */
    snprintf(big, sizeof(big), "{\"gh\": {\"value\": \"%0*d\", \"hosts\": [\"api.test\"]}}", (int)SB_MAX_SECRET_VALUE, 0);
    is_int(parse(m, big, &s, err, sizeof(err)), SB_OK, "a value of 8192 bytes");
    is_int((int)sb_secrets_count(s), 1, "  one secret");
    sb_secrets_free(s);
    snprintf(big, sizeof(big), "{\"gh\": {\"value\": \"%0*d\", \"hosts\": [\"api.test\"]}}", (int)SB_MAX_SECRET_VALUE + 1, 0);
    is_int(parse(m, big, &s, err, sizeof(err)), SB_E_BAD_ARGS, "a value of 8193 bytes");
    is_str(err, "secrets.gh.value: expected a string of 1-8192 bytes", "  message");
    {
        json_t *o = json_object();
        for (int i = 0; i < 33; ++i) {
            char name[8];
            snprintf(name, sizeof(name), "s%d", i);
            json_object_set_new(o, name, json_pack("{s:s, s:[s]}", "value", "x", "hosts", "api.test"));
            s = NULL;
            if (i == 31) {
                is_int(sb_secrets_parse(o, m, &s, err, sizeof(err)), SB_OK, "32 secrets");
                is_int((int)sb_secrets_count(s), 32, "  all of them");
                sb_secrets_free(s);
            }
        }
        is_int(sb_secrets_parse(o, m, &s, err, sizeof(err)), SB_E_BAD_ARGS, "33 secrets");
        is_str(err, "secrets: more than 32 secrets", "  message");
        json_decref(o);
    }
    sb_manifest_free(m);
}

static void test_placeholders(void)
{
    static const struct {
        const char *s;
        int r;
        size_t start, len;
    } cases[] = {
        {"Bearer {{secret:gh}}", 1, 7, 13}, {"{{secret:a.b-c_9}}x", 1, 0, 18},
        {"no placeholder", 0, 0, 0},        {"{{secret:gh}", -1, 0, 0},
        {"{{secret:}}", -1, 0, 0},          {"{{secret:a b}}", -1, 0, 0},
        {"{{secret:gh}x}", -1, 0, 0},       {"{{secret", 0, 0, 0},
        {"{secret:gh}}", 0, 0, 0},          {"{{{secret:gh}}}", 1, 1, 13},
        {"{{SECRET:gh}}", 0, 0, 0},         {"{{secret:gh/x}}", -1, 0, 0},
    };
    char longname[100];
    sb_placeholder_t p;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        int r = sb_placeholder_next(cases[i].s, strlen(cases[i].s), 0, &p);
        is_int(r, cases[i].r, "placeholder in \"%s\"", cases[i].s);
        if (r == 1 && cases[i].r == 1) {
            is_int((int)p.start, (int)cases[i].start, "  start");
            is_int((int)p.len, (int)cases[i].len, "  length");
        }
    }
    snprintf(longname, sizeof(longname), "{{secret:%064d}}", 0);
    is_int(sb_placeholder_next(longname, strlen(longname), 0, &p), 1, "a 64-byte name");
    snprintf(longname, sizeof(longname), "{{secret:%065d}}", 0);
    is_int(sb_placeholder_next(longname, strlen(longname), 0, &p), -1, "a 65-byte name");
    /* several in one value, found in order */
    {
        const char *v = "{{secret:a}}:{{secret:bb}}";
        ok(sb_placeholder_next(v, strlen(v), 0, &p) == 1 && p.start == 0 && p.name_len == 1, "first of two");
        ok(sb_placeholder_next(v, strlen(v), p.start + p.len, &p) == 1 && p.start == 13 && p.name_len == 2, "second of two");
        ok(sb_placeholder_next(v, strlen(v), p.start + p.len, &p) == 0, "no third");
    }
}

static sb_url_t url(const char *u)
{
    sb_url_t out;
    const char *why;
    if (sb_url_parse(u, strlen(u), &out, &why) != SB_OK)
        printf("# bad test URL %s: %s\n", u, why);
    return out;
}

static void test_decide(void)
{
    sb_manifest_t *m = manifest("{\"net\": [\"api.test\", \"*.cdn.test\", \"other.test\"]}");
    sb_secrets_t *s = NULL;
    const sb_secret_t *sec;
    char err[512], reason[512];
    const char *v;
    size_t vlen;
    static const struct {
        const char *name, *header, *url, *method, *reason; /* reason NULL: granted */
    } cases[] = {
        {"gh", "authorization", "https://api.test/repos/acme/x", "GET", NULL},
        {"gh", "authorization", "https://API.test:443/repos/acme/", "HEAD", NULL},
        {"gh", "authorization", "http://api.test/repos/acme/x", "GET",
         "http.fetch secret \"gh\" may not be sent over http (secret schemes rule)"},
        {"gh", "authorization", "https://api.test:8443/repos/acme/x", "GET",
         "http.fetch secret \"gh\" may not be sent to host \"api.test:8443\" (secret hosts rule)"},
        {"gh", "authorization", "https://other.test/repos/acme/x", "GET",
         "http.fetch secret \"gh\" may not be sent to host \"other.test:443\" (secret hosts rule)"},
        {"gh", "x-api-key", "https://api.test/repos/acme/x", "GET",
         "http.fetch secret \"gh\" may not be sent in header \"x-api-key\" (secret headers rule)"},
        {"gh", "authorization", "https://api.test/repos/acme/x", "POST",
         "http.fetch secret \"gh\" may not be sent with method \"POST\" (secret methods rule)"},
        {"gh", "authorization", "https://api.test/repos/other", "GET",
         "http.fetch secret \"gh\" may not be sent to this path (secret paths rule)"},
        {"gh", "authorization", "https://api.test/repos/acme/%2e%2e/other", "GET",
         "http.fetch secret \"gh\" may not be sent: the path has an encoded '/', '\\', '.' or '%', a ';', or a dot segment (secret paths "
         "rule)"},
        {"nope", "authorization", "https://api.test/repos/acme/x", "GET", "http.fetch secret \"nope\" is not granted to this run"},
        /* host entries with their own rules, and wildcards */
        {"cdn", "x-key", "http://a.cdn.test/up", "PUT", NULL},
        {"cdn", "x-key", "http://a.cdn.test/up", "GET",
         "http.fetch secret \"cdn\" may not be sent to host \"a.cdn.test:80\" with this method (secret hosts rule)"},
        {"cdn", "X-Key", "http://a.cdn.test/up", "PUT",
         "http.fetch secret \"cdn\" may not be sent in header \"X-Key\" (secret headers rule)"},
        {"cdn", "x-key", "http://cdn.test/up", "PUT",
         "http.fetch secret \"cdn\" may not be sent to host \"cdn.test:80\" (secret hosts rule)"},
    };

    if (parse(m,
              "{\"gh\": {\"value\": \"" VALUE "\", \"hosts\": [\"api.test:443\"], \"methods\": [\"GET\", \"HEAD\"],"
              " \"paths\": [\"/repos/acme/**\"]},"
              " \"cdn\": {\"value\": \"cdn-value\", \"hosts\": [{\"host\": \"*.cdn.test\", \"methods\": [\"PUT\"]}],"
              " \"headers\": [\"X-Key\"], \"schemes\": [\"http\"]}}",
              &s, err, sizeof(err)) != SB_OK)
        printf("# parse: %s\n", err);
    ok(s != NULL, "the set parsed");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        sb_url_t u = url(cases[i].url);
        sb_status_t st = sb_secrets_decide(s, cases[i].name, strlen(cases[i].name), cases[i].header, &u, cases[i].method, &sec,
                                           reason, sizeof(reason));
        if (cases[i].reason == NULL) {
            is_int(st, SB_OK, "grant %s %s %s %s", cases[i].name, cases[i].header, cases[i].method, cases[i].url);
            ok(sec != NULL, "  the secret");
        } else {
            is_int(st, SB_E_FORBIDDEN, "refuse %s %s %s %s", cases[i].name, cases[i].header, cases[i].method, cases[i].url);
            is_str(reason, cases[i].reason, "  reason");
            ok(strstr(reason, VALUE) == NULL, "  no value in the reason");
        }
    }
    {
        sb_url_t u = url("https://api.test/repos/acme/x");
        ok(sb_secrets_decide(s, "gh", 2, "authorization", &u, "GET", &sec, reason, sizeof(reason)) == SB_OK, "gh granted");
        sb_secret_value(sec, &v, &vlen);
        ok(vlen == strlen(VALUE) && memcmp(v, VALUE, vlen) == 0, "  its value");
        ok(sb_secrets_decide(NULL, "gh", 2, "authorization", &u, "GET", &sec, reason, sizeof(reason)) == SB_E_FORBIDDEN,
           "a run without secrets");
        is_str(reason, "http.fetch secret \"gh\" is not granted to this run", "  reason");
    }
    sb_secrets_free(s);
    sb_manifest_free(m);
}

static sb_secrets_t *one_secret(const char *value)
{
    sb_manifest_t *m = manifest("{\"net\": [\"api.test\"]}");
    json_t *j = json_pack("{s:{s:s, s:[s]}}", "gh", "value", value, "hosts", "api.test");
    sb_secrets_t *s = NULL;
    char err[256];
    if (sb_secrets_parse(j, m, &s, err, sizeof(err)) != SB_OK)
        printf("# parse: %s\n", err);
    json_decref(j);
    sb_manifest_free(m);
    return s;
}

static char *redact(const sb_secrets_t *s, const char *in, size_t len, size_t *outlen)
{
    char *out = NULL, *copy;
    if (sb_secrets_redact(s, in, len, 1u << 20, &out, outlen) != SB_OK)
        return NULL;
    if (out != NULL)
        return out;
    copy = malloc(len + 1);
    memcpy(copy, in, len);
    *outlen = len;
    return copy;
}

static void expect_redacted(const sb_secrets_t *s, const char *in, const char *want)
{
    size_t n;
    char *got = redact(s, in, strlen(in), &n);
    ok(got != NULL && n == strlen(want) && memcmp(got, want, n) == 0, "redact \"%s\" -> \"%s\" (got \"%.*s\")", in, want,
       got != NULL ? (int)n : 0, got != NULL ? got : "");
    free(got);
}

static void test_redact(void)
{
    sb_secrets_t *s = one_secret(VALUE);
    char buf[256], b64[64];
    size_t n;
    char *out;

    expect_redacted(s, "nothing here", "nothing here");
    expect_redacted(s, VALUE, "{{secret:gh}}");
    expect_redacted(s, "a" VALUE "b" VALUE "c", "a{{secret:gh}}b{{secret:gh}}c");
    expect_redacted(s, "x-s3cr3t-v4lue_0123", "x-{{secret:gh}}"); /* lowercased: a header name, or a case-folding upstream */
    /* base64 of the value alone, and inside a longer text at every alignment */
    sb_b64_encode((const uint8_t *)VALUE, strlen(VALUE), b64);
    snprintf(buf, sizeof(buf), "x=%s;", b64);
    expect_redacted(s, buf, "x={{secret:gh}};");
    for (int k = 0; k < 3; ++k) {
        char plain[64], enc[128];
        size_t len;
        snprintf(plain, sizeof(plain), "%.*s" VALUE "tail", k + 3, "user:");
        len = strlen(plain);
        sb_b64_encode((const uint8_t *)plain, len, enc);
        out = redact(s, enc, strlen(enc), &n);
        ok(out != NULL && memmem(out, n, "{{secret:gh}}", 13) != NULL, "base64 at alignment %d redacted (%s)", k, enc);
        {
            /* what is left decodes to no more than the bits next to the value */
            char left[128];
            snprintf(left, sizeof(left), "%.*s", (int)n, out);
            ok(strstr(left, "czNjcjN0") == NULL && strstr(left, "M2NyM3Qt") == NULL && strstr(left, "zY3IzdC1") == NULL,
               "  no run of the value's base64 is left");
        }
        free(out);
    }
    /* URL-safe base64: a value whose encoding has '+' or '/' */
    {
        sb_secrets_t *t = one_secret(">>>?x?>>>?y?");
        char enc[64];
        sb_b64_encode((const uint8_t *)">>>?x?>>>?y?", 12, enc);
        ok(strchr(enc, '+') != NULL && strchr(enc, '/') != NULL, "the standard form has '+' and '/' (%s)", enc);
        for (char *c = enc; *c; ++c)
            *c = *c == '+' ? '-' : *c == '/' ? '_' : *c;
        out = redact(t, enc, strlen(enc), &n);
        ok(out != NULL && memmem(out, n, "{{secret:gh}}", 13) != NULL, "URL-safe base64 redacted (%s)", enc);
        free(out);
        sb_secrets_free(t);
    }
    /* percent-encoded, upper and lower hex */
    {
        sb_secrets_t *t = one_secret("a b/c&d");
        expect_redacted(t, "q=a%20b%2Fc%26d&x", "q={{secret:gh}}&x");
        expect_redacted(t, "q=a%20b%2fc%26d", "q={{secret:gh}}");
        expect_redacted(t, "a b/c&d", "{{secret:gh}}");
        sb_secrets_free(t);
    }
    /* the output cap: a short value repeated grows the text; the cap refuses it before allocating */
    {
        sb_secrets_t *t = one_secret("x");
        char *big = malloc(100000);
        memset(big, 'x', 100000);
        is_int(sb_secrets_redact(t, big, 100000, 200000, &out, &n), SB_E_TOO_LARGE, "growth past the cap is refused");
        ok(out == NULL, "  no output");
        is_int(sb_secrets_redact(t, big, 1000, 200000, &out, &n), SB_OK, "growth within the cap");
        is_int((int)n, 13000, "  every byte a placeholder");
        free(out);
        free(big);
        sb_secrets_free(t);
    }
    sb_secrets_free(s);
}

/* a response assembled by the reader from reads that split the value, and a body exactly at the cap */
static void test_redact_response(void)
{
    sb_secrets_t *s = one_secret(VALUE);
    const size_t cap = 4096;
    char head[128], *resp, *body;
    size_t hlen, total, n, done_at = 0;
    sb_http1_reader_t r;
    char *out;

    body = malloc(cap);
    memset(body, '.', cap);
    memcpy(body + 1000, VALUE, strlen(VALUE));
    memcpy(body + cap - strlen(VALUE), VALUE, strlen(VALUE)); /* the value ends the body at the cap */
    hlen = (size_t)snprintf(head, sizeof(head), "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", cap);
    total = hlen + cap;
    resp = malloc(total);
    memcpy(resp, head, hlen);
    memcpy(resp + hlen, body, cap);
    for (size_t split = hlen + 1000 + 1; split < hlen + 1000 + strlen(VALUE); split += 5) {
        size_t consumed, fed = 0;
        int done = 0;
        char *buf = malloc(total);
        sb_http1_init(&r, 0, cap);
        /* two reads, the first ending inside the value; the reader keeps what it has not consumed */
        memcpy(buf, resp, split);
        ok(sb_http1_feed(&r, buf, split, 0, &consumed, &done) == NULL, "first read (split at %zu)", split);
        fed = split;
        memmove(buf, buf + consumed, split - consumed);
        memcpy(buf + split - consumed, resp + fed, total - fed);
        ok(sb_http1_feed(&r, buf, split - consumed + total - fed, 0, &consumed, &done) == NULL && done, "  second read completes");
        is_int((int)r.res.body_len, (int)cap, "  the body is whole, at the cap");
        is_int(sb_secrets_redact(s, (const char *)r.res.body, r.res.body_len, 2 * cap, &out, &n), SB_OK, "  redacted");
        ok(out != NULL && memmem(out, n, VALUE, strlen(VALUE)) == NULL, "  no value left");
        ok(out != NULL && n == cap - 2 * strlen(VALUE) + 26 && memcmp(out + n - 13, "{{secret:gh}}", 13) == 0,
           "  both occurrences, the last one whole at the end");
        free(out);
        sb_http1_dispose(&r);
        free(buf);
        ++done_at;
    }
    ok(done_at > 0, "splits tried");
    free(resp);
    free(body);
    sb_secrets_free(s);
}

static void test_seal(void)
{
    sb_manifest_t *m = manifest("{\"net\": [\"api.test\"]}");
    sb_secrets_t *s = one_secret(VALUE), *back = NULL;
    uint8_t key[32], other[32], hash[32], hash2[32];
    json_t *sealed;
    char *text, err[256];
    const sb_secret_t *sec;
    sb_url_t u = url("https://api.test/");
    const char *v;
    size_t vlen;

    memset(key, 7, sizeof(key));
    memset(other, 8, sizeof(other));
    memset(hash, 1, sizeof(hash));
    memset(hash2, 2, sizeof(hash2));
    sb_secrets_set_key(NULL);
    ok(sb_secrets_seal(s, hash) == NULL, "no key: nothing is sealed");
    sb_secrets_set_key(key);
    ok(sb_secrets_have_key(), "a key is set");
    sealed = sb_secrets_seal(s, hash);
    ok(sealed != NULL, "sealed");
    text = json_dumps(sealed, JSON_COMPACT);
    ok(strstr(text, VALUE) == NULL, "the value is not in the sealed form: %s", text);
    ok(strstr(text, "\"hosts\":[\"api.test\"]") != NULL, "the rules are");
    {
        /* a fresh nonce per seal */
        json_t *again = sb_secrets_seal(s, hash);
        char *t2 = json_dumps(again, JSON_COMPACT);
        ok(strcmp(text, t2) != 0, "two seals differ");
        free(t2);
        json_decref(again);
    }
    is_int(sb_secrets_unseal(sealed, hash, m, &back), SB_OK, "unsealed");
    ok(back != NULL && sb_secrets_decide(back, "gh", 2, "authorization", &u, "GET", &sec, err, sizeof(err)) == SB_OK, "  usable");
    if (back != NULL && sec != NULL) {
        sb_secret_value(sec, &v, &vlen);
        ok(vlen == strlen(VALUE) && memcmp(v, VALUE, vlen) == 0, "  the same value");
    }
    sb_secrets_free(back);
    back = NULL;
    is_int(sb_secrets_unseal(sealed, hash2, m, &back), SB_E_UNAVAILABLE, "another token's hash: refused");
    sb_secrets_set_key(other);
    is_int(sb_secrets_unseal(sealed, hash, m, &back), SB_E_UNAVAILABLE, "another key: refused");
    sb_secrets_set_key(key);
    {
        /* the name is bound too: a sealed value moved to another name does not open */
        json_t *moved = json_object();
        json_object_set(moved, "other", json_object_get(sealed, "gh"));
        is_int(sb_secrets_unseal(moved, hash, m, &back), SB_E_UNAVAILABLE, "moved to another name: refused");
        json_decref(moved);
    }
    {
        json_t *e = json_object_get(sealed, "gh");
        char *b = strdup(json_string_value(json_object_get(e, "sealed")));
        b[10] = b[10] == 'A' ? 'B' : 'A';
        json_object_set_new(e, "sealed", json_string(b));
        is_int(sb_secrets_unseal(sealed, hash, m, &back), SB_E_UNAVAILABLE, "tampered: refused");
        json_object_set_new(e, "sealed", json_string("not base64!"));
        is_int(sb_secrets_unseal(sealed, hash, m, &back), SB_E_UNAVAILABLE, "garbage: refused");
        ok(back == NULL, "  nothing returned");
        free(b);
    }
    sb_secrets_set_key(NULL);
    free(text);
    json_decref(sealed);
    sb_secrets_free(s);
    sb_manifest_free(m);
}

static void test_key_file(void)
{
    char path[] = "/tmp/sbkeyXXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    uint8_t key[32];
    char err[512];

    fputs("00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF\n", f);
    fclose(f);
    is_int(sb_secrets_read_key(path, key, err, sizeof(err)), SB_OK, "64 hex digits");
    ok(key[0] == 0x00 && key[1] == 0x11 && key[31] == 0xff, "  decoded");
    f = fopen(path, "w");
    fwrite("\n\n0123456789abcdef0123456789abcd", 1, 32, f);
    fclose(f);
    is_int(sb_secrets_read_key(path, key, err, sizeof(err)), SB_OK, "32 raw bytes (even ones that end in a newline)");
    ok(key[0] == '\n' && key[31] == 'd', "  as they are");
    f = fopen(path, "w");
    fputs("0011", f);
    fclose(f);
    is_int(sb_secrets_read_key(path, key, err, sizeof(err)), SB_E_BAD_ARGS, "too short");
    ok(strstr(err, "holds neither 32 raw bytes nor 64 hex digits") != NULL && strstr(err, "0011") == NULL, "  message: %s", err);
    unlink(path);
    is_int(sb_secrets_read_key(path, key, err, sizeof(err)), SB_E_BAD_ARGS, "missing file");
    ok(strstr(err, "cannot open") != NULL, "  message: %s", err);
}

int main(void)
{
    test_validation();
    test_placeholders();
    test_decide();
    test_redact();
    test_redact_response();
    test_seal();
    test_key_file();
    return done_testing();
}
