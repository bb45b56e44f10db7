/*
 * broker/authz/secrets: parsing, the per-hop decision and redaction
 * (secrets.h). Sealing for the Redis store is in seal.c.
 *
 * Why redaction knows several forms of a value: an upstream that echoes a
 * request (or logs it into its answer) may hand the value back raw, inside a
 * Basic credential or a JSON blob in base64, or percent-encoded in a URL. The
 * base64 forms are taken at each of the three byte alignments a value can
 * have inside a longer encoded text, keeping only the characters that depend
 * on the value alone, so "user:<value>" encoded is caught as well as the value
 * encoded by itself. Longer forms are replaced first.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include "authz/secrets.h"
#include "authz/manifest_int.h"
#include "call/placeholder.h"
#include "sb/limits.h"
#include "sb/value.h"
#include "util/util.h"

#define MAX_FORMS 14
#define SCHEME_BIT(s) (1u << (unsigned)(s))

typedef struct st_form_t {
    char *p;
    size_t len;
    char *tail; /* base64 at alignment 0: the rest of the value's own padded encoding, consumed too when it follows */
    size_t tail_len;
} form_t;

struct st_sb_secret_t {
    char name[SB_MAX_SECRET_NAME + 1];
    size_t name_len;
    char *value;
    size_t value_len;
    sb_net_entry_t *hosts;
    size_t nhosts;
    char **headers; /* lowercase */
    size_t nheaders;
    sb_http_rules_t rules;
    unsigned schemes;
    char *rules_text; /* the rule keys as given, compact JSON (what a stored record carries beside the sealed value) */
    char placeholder[SB_PLACEHOLDER_MAX_LEN + 1];
    size_t placeholder_len;
    form_t forms[MAX_FORMS];
    size_t nforms;
};

typedef struct st_pattern_t {
    const form_t *form;
    const sb_secret_t *sec;
} pattern_t;

struct st_sb_secrets_t {
    sb_secret_t *v; /* SB_MAX_SECRETS of room */
    size_t n;
    pattern_t *order; /* every form of every secret, longest first */
    size_t norder;
};

typedef enum en_mode_t { MODE_MINT, MODE_CONFIG } mode_t_;

#define fail(...) sb_fail_bad_args(__VA_ARGS__)

/* ---- small helpers --------------------------------------------------------------------------------------------------- */

static void wipe(void *p, size_t n)
{
    if (p != NULL && n != 0)
        explicit_bzero(p, n);
}

/* overwrites a jansson string's bytes in place (its storage is about to be freed by its owner) */
static void wipe_json_string(json_t *s)
{
    if (json_is_string(s))
        wipe((char *)json_string_value(s), json_string_length(s));
}

static void free_secret(sb_secret_t *s)
{
    if (s->value != NULL) {
        wipe(s->value, s->value_len);
        sb_mem_free(s->value);
    }
    for (size_t i = 0; i < s->nforms; ++i) {
        wipe(s->forms[i].p, s->forms[i].len);
        sb_mem_free(s->forms[i].p);
        wipe(s->forms[i].tail, s->forms[i].tail_len);
        sb_mem_free(s->forms[i].tail);
    }
    sb_manifest__free_net(s->hosts, s->nhosts);
    for (size_t i = 0; i < s->nheaders; ++i)
        sb_mem_free(s->headers[i]);
    sb_mem_free(s->headers);
    sb_manifest__free_rules(&s->rules);
    sb_mem_free_foreign(s->rules_text);
    memset(s, 0, sizeof(*s));
}

void sb_secrets_free(sb_secrets_t *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; i < s->n; ++i)
        free_secret(&s->v[i]);
    sb_mem_free(s->v);
    sb_mem_free(s->order);
    sb_mem_free(s);
}

size_t sb_secrets_count(const sb_secrets_t *s)
{
    return s != NULL ? s->n : 0;
}

const char *sb_secrets_name(const sb_secrets_t *s, size_t i)
{
    return s != NULL && i < s->n ? s->v[i].name : NULL;
}

static sb_secrets_t *new_set(void)
{
    sb_secrets_t *s = sb_mem_calloc(1, sizeof(*s));
    s->v = sb_mem_calloc(SB_MAX_SECRETS, sizeof(*s->v));
    return s;
}

static int is_tchar(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* ---- forms of a value ------------------------------------------------------------------------------------------------ */

static void add_form(sb_secret_t *s, const char *p, size_t len)
{
    if (len == 0 || s->nforms == MAX_FORMS)
        return;
    for (size_t i = 0; i < s->nforms; ++i)
        if (s->forms[i].len == len && memcmp(s->forms[i].p, p, len) == 0)
            return;
    s->forms[s->nforms].p = sb_mem_alloc(len);
    memcpy(s->forms[s->nforms].p, p, len);
    s->forms[s->nforms].len = len;
    ++s->nforms;
}

/* encodeURIComponent's form: unreserved bytes stay, every other byte is %XX (upper or lower hex) */
static void add_percent_forms(sb_secret_t *s)
{
    static const char *const digits[2] = {"0123456789ABCDEF", "0123456789abcdef"};
    char *buf = sb_mem_alloc(s->value_len * 3 + 1);

    for (int d = 0; d < 2; ++d) {
        size_t o = 0;
        for (size_t i = 0; i < s->value_len; ++i) {
            unsigned char c = (unsigned char)s->value[i];
            if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("-_.!~*'()", c) != NULL) {
                buf[o++] = (char)c;
            } else {
                buf[o++] = '%';
                buf[o++] = digits[d][c >> 4];
                buf[o++] = digits[d][c & 15];
            }
        }
        add_form(s, buf, o);
        wipe(buf, o);
    }
    sb_mem_free(buf);
}

/*
 * base64 forms: at each alignment k (the value starting k bytes after a
 * 3-byte group boundary), the characters that depend on value bits only, in
 * the standard and the URL-safe alphabets; at alignment 0 the rest of the
 * value's own padded encoding is a tail consumed with them when it follows,
 * so the value encoded alone is replaced whole in the same scan. A value too
 * short for that has its padded encoding as a form of its own.
 */
static void add_base64_forms(sb_secret_t *s)
{
    size_t n = s->value_len + 2, enc_len = sb_b64_encoded_len(n), full_len = sb_b64_encoded_len(s->value_len);
    uint8_t *raw = sb_mem_alloc(n);
    char *enc = sb_mem_alloc(enc_len + 1);

    for (size_t k = 0; k < 3; ++k) {
        size_t total = k + s->value_len, j0 = (8 * k + 5) / 6, j1;
        memset(raw, 0, k);
        memcpy(raw + k, s->value, s->value_len);
        sb_b64_encode(raw, total, enc);
        if (8 * total < 6)
            continue;
        j1 = (8 * total - 6) / 6; /* the last character whose six bits are all value bits */
        if (j1 < j0 || j1 - j0 + 1 < 4) {
            if (k == 0) {
                sb_b64_encode((const uint8_t *)s->value, s->value_len, enc);
                add_form(s, enc, full_len);
            }
            continue;
        }
        for (int alphabet = 0; alphabet < 2; ++alphabet) {
            size_t before = s->nforms;
            if (alphabet == 1)
                for (size_t i = j0; i < full_len; ++i)
                    enc[i] = enc[i] == '+' ? '-' : enc[i] == '/' ? '_' : enc[i];
            add_form(s, enc + j0, j1 - j0 + 1);
            if (k == 0 && s->nforms != before && full_len > j1 + 1) {
                form_t *f = &s->forms[s->nforms - 1];
                f->tail_len = full_len - (j1 + 1);
                f->tail = sb_mem_alloc(f->tail_len);
                memcpy(f->tail, enc + j1 + 1, f->tail_len);
            }
        }
    }
    wipe(raw, n);
    wipe(enc, enc_len);
    sb_mem_free(raw);
    sb_mem_free(enc);
}

static void make_forms(sb_secret_t *s)
{
    char *lower = sb_mem_alloc(s->value_len);

    add_form(s, s->value, s->value_len);
    add_percent_forms(s);
    add_base64_forms(s);
    /*
     * lowercased: response header names arrive so (fetch/http1.c), and an upstream that folds case (a hex
     * key, for one, means the same in either case) must not hand the value back that way
     */
    for (size_t i = 0; i < s->value_len; ++i)
        lower[i] = s->value[i] >= 'A' && s->value[i] <= 'Z' ? (char)(s->value[i] - 'A' + 'a') : s->value[i];
    add_form(s, lower, s->value_len);
    wipe(lower, s->value_len);
    sb_mem_free(lower);
}

static int cmp_pattern(const void *a, const void *b)
{
    size_t la = ((const pattern_t *)a)->form->len, lb = ((const pattern_t *)b)->form->len;
    return la < lb ? 1 : la > lb ? -1 : 0;
}

/* the redaction order over the whole set, rebuilt whenever a secret is added */
static void build_order(sb_secrets_t *s)
{
    size_t n = 0;

    sb_mem_free(s->order);
    for (size_t i = 0; i < s->n; ++i)
        n += s->v[i].nforms;
    s->order = sb_mem_calloc(n != 0 ? n : 1, sizeof(*s->order));
    s->norder = 0;
    for (size_t i = 0; i < s->n; ++i)
        for (size_t f = 0; f < s->v[i].nforms; ++f) {
            s->order[s->norder].form = &s->v[i].forms[f];
            s->order[s->norder].sec = &s->v[i];
            ++s->norder;
        }
    qsort(s->order, s->norder, sizeof(*s->order), cmp_pattern);
}

/* ---- parsing --------------------------------------------------------------------------------------------------------- */

static sb_status_t check_value(const char *v, size_t len, const char *path, char *err, size_t errsz)
{
    if (len == 0 || len > SB_MAX_SECRET_VALUE)
        return fail(err, errsz, "%s: expected a string of 1-%u bytes", path, SB_MAX_SECRET_VALUE);
    for (size_t i = 0; i < len; ++i)
        if (v[i] == '\r' || v[i] == '\n' || v[i] == '\0')
            return fail(err, errsz, "%s: must not contain CR, LF or NUL", path);
    return SB_OK;
}

/* a configured value: from a file (one trailing newline dropped) or an environment variable; unreadable fails closed */
static sb_status_t config_value(const json_t *file, const json_t *env, const char *path, char **out, size_t *len, char *err,
                                size_t errsz)
{
    char vpath[256];
    sb_status_t st;

    if ((file != NULL) == (env != NULL))
        return fail(err, errsz, "%s: expected exactly one of value_file and value_env", path);
    if (env != NULL) {
        const char *v;
        snprintf(vpath, sizeof(vpath), "%s.value_env", path);
        if (!json_is_string(env) || json_string_length(env) == 0)
            return fail(err, errsz, "%s: expected an environment variable name", vpath);
        if ((v = getenv(json_string_value(env))) == NULL)
            return fail(err, errsz, "%s: %s is not set", vpath, json_string_value(env));
        *len = strlen(v);
        if ((st = check_value(v, *len, vpath, err, errsz)) != SB_OK)
            return st;
        *out = sb_mem_alloc(*len + 1);
        memcpy(*out, v, *len + 1);
        return SB_OK;
    }
    snprintf(vpath, sizeof(vpath), "%s.value_file", path);
    if (!json_is_string(file) || json_string_length(file) == 0)
        return fail(err, errsz, "%s: expected a file path", vpath);
    {
        char buf[SB_MAX_SECRET_VALUE + 3];
        FILE *fp = fopen(json_string_value(file), "rb");
        size_t n;
        if (fp == NULL)
            return fail(err, errsz, "%s: cannot open %s: %s", vpath, json_string_value(file), strerror(errno));
        n = fread(buf, 1, sizeof(buf), fp);
        if (ferror(fp)) {
            fclose(fp);
            wipe(buf, sizeof(buf));
            return fail(err, errsz, "%s: cannot read %s", vpath, json_string_value(file));
        }
        fclose(fp);
        if (n > 0 && buf[n - 1] == '\n')
            --n;
        if (n > 0 && buf[n - 1] == '\r')
            --n;
        if ((st = check_value(buf, n, vpath, err, errsz)) != SB_OK) {
            wipe(buf, sizeof(buf));
            return st;
        }
        *out = sb_mem_alloc(n + 1);
        memcpy(*out, buf, n);
        (*out)[n] = '\0';
        *len = n;
        wipe(buf, sizeof(buf));
    }
    return SB_OK;
}

static sb_status_t parse_headers(const json_t *v, const char *path, sb_secret_t *s, char *err, size_t errsz)
{
    size_t i;

    if (v == NULL) {
        s->headers = sb_mem_calloc(1, sizeof(*s->headers));
        s->headers[0] = sb_mem_strdup("authorization");
        s->nheaders = 1;
        return SB_OK;
    }
    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > SB_MAX_MANIFEST_ENTRIES)
        return fail(err, errsz, "%s: expected an array of 1-%u header names", path, SB_MAX_MANIFEST_ENTRIES);
    s->headers = sb_mem_calloc(json_array_size(v), sizeof(*s->headers));
    for (i = 0; i < json_array_size(v); ++i) {
        const json_t *e = json_array_get(v, i);
        const char *h = json_string_value(e);
        size_t len = json_string_length(e);
        char *c;
        if (!json_is_string(e) || len == 0 || len > 256)
            return fail(err, errsz, "%s[%zu]: expected a header name", path, i);
        for (size_t k = 0; k < len; ++k)
            if (!is_tchar(h[k]))
                return fail(err, errsz, "%s[%zu]: expected a header name", path, i);
        c = sb_mem_strdup(h);
        for (size_t k = 0; k < len; ++k)
            if (c[k] >= 'A' && c[k] <= 'Z')
                c[k] = (char)(c[k] - 'A' + 'a');
        s->headers[s->nheaders++] = c;
    }
    return SB_OK;
}

static sb_status_t parse_schemes(const json_t *v, const char *path, sb_secret_t *s, char *err, size_t errsz)
{
    if (v == NULL) {
        s->schemes = SCHEME_BIT(SB_URL_HTTPS);
        return SB_OK;
    }
    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > 2)
        return fail(err, errsz, "%s: expected an array of \"http\" and/or \"https\"", path);
    for (size_t i = 0; i < json_array_size(v); ++i) {
        const char *e = json_string_value(json_array_get(v, i));
        if (e != NULL && strcmp(e, "https") == 0)
            s->schemes |= SCHEME_BIT(SB_URL_HTTPS);
        else if (e != NULL && strcmp(e, "http") == 0)
            s->schemes |= SCHEME_BIT(SB_URL_HTTP);
        else
            return fail(err, errsz, "%s[%zu]: expected \"http\" or \"https\"", path, i);
    }
    return SB_OK;
}

/*
 * One secret: NAME: {value | value_file | value_env, hosts, headers?, methods?, paths?, schemes?}.
 * With a manifest, every host must be admitted by its net.
 */
static sb_status_t parse_one(const char *name, size_t nlen, const json_t *o, mode_t_ mode, const sb_manifest_t *m, const char *base,
                             sb_secret_t *s, char *err, size_t errsz)
{
    char path[SB_MAX_SECRET_NAME + 160], sub[SB_MAX_SECRET_NAME + 200];
    const char *key;
    json_t *val, *value = NULL, *vfile = NULL, *venv = NULL, *hosts = NULL, *headers = NULL, *methods = NULL, *paths = NULL,
                 *schemes = NULL, *rules;
    sb_status_t st;

    if (!sb_placeholder_is_name(name, nlen)) {
        char q[80];
        return fail(err, errsz, "%s.%s: expected a name of [A-Za-z0-9_.-]{1,64}", base,
                    sb_quote_printable(name, nlen, 64, q, sizeof(q)));
    }
    snprintf(path, sizeof(path), "%s.%s", base, name);
    memcpy(s->name, name, nlen);
    s->name[nlen] = '\0';
    s->name_len = nlen;
    s->placeholder_len = (size_t)snprintf(s->placeholder, sizeof(s->placeholder), SB_PLACEHOLDER_OPEN "%s}}", s->name);
    if (!json_is_object(o))
        return fail(err, errsz, "%s: expected an object", path);
    json_object_foreach((json_t *)o, key, val)
    {
        if (mode == MODE_MINT && strcmp(key, "value") == 0)
            value = val;
        else if (mode == MODE_CONFIG && strcmp(key, "value_file") == 0)
            vfile = val;
        else if (mode == MODE_CONFIG && strcmp(key, "value_env") == 0)
            venv = val;
        else if (strcmp(key, "hosts") == 0)
            hosts = val;
        else if (strcmp(key, "headers") == 0)
            headers = val;
        else if (strcmp(key, "methods") == 0)
            methods = val;
        else if (strcmp(key, "paths") == 0)
            paths = val;
        else if (strcmp(key, "schemes") == 0)
            schemes = val;
        else {
            char q[80];
            return fail(err, errsz, "%s.%s: unknown key", path, sb_quote_printable(key, strlen(key), 64, q, sizeof(q)));
        }
    }
    if (mode == MODE_MINT) {
        snprintf(sub, sizeof(sub), "%s.value", path);
        if (!json_is_string(value))
            return fail(err, errsz, "%s: expected a string of 1-%u bytes", sub, SB_MAX_SECRET_VALUE);
        if ((st = check_value(json_string_value(value), json_string_length(value), sub, err, errsz)) != SB_OK)
            return st;
        s->value_len = json_string_length(value);
        s->value = sb_mem_alloc(s->value_len + 1);
        memcpy(s->value, json_string_value(value), s->value_len);
        s->value[s->value_len] = '\0';
    } else if ((st = config_value(vfile, venv, path, &s->value, &s->value_len, err, errsz)) != SB_OK) {
        return st;
    }
    snprintf(sub, sizeof(sub), "%s.hosts", path);
    if (hosts == NULL || !json_is_array(hosts) || json_array_size(hosts) == 0)
        return fail(err, errsz, "%s: expected a non-empty array of net entries", sub);
    if ((st = sb_manifest__parse_net(hosts, sub, 1, &s->hosts, &s->nhosts, err, errsz)) != SB_OK)
        return st == SB_E_NOMEM ? fail(err, errsz, "%s: out of memory", sub) : st;
    if (m != NULL) {
        for (size_t i = 0; i < s->nhosts; ++i)
            if (!sb_manifest__net_covers(m, &s->hosts[i]))
                return fail(err, errsz, "%s[%zu]: the host is not in capabilities.net", sub, i);
    }
    snprintf(sub, sizeof(sub), "%s.headers", path);
    if ((st = parse_headers(headers, sub, s, err, errsz)) != SB_OK)
        return st;
    snprintf(sub, sizeof(sub), "%s.schemes", path);
    if ((st = parse_schemes(schemes, sub, s, err, errsz)) != SB_OK)
        return st;
    if ((st = sb_manifest__parse_rules(methods, paths, path, &s->rules, err, errsz)) != SB_OK)
        return st == SB_E_NOMEM ? fail(err, errsz, "%s: out of memory", path) : st;
    /* the rules as given, for a stored record (the value travels sealed beside them) */
    rules = json_object();
    json_object_set(rules, "hosts", hosts);
    if (headers != NULL)
        json_object_set(rules, "headers", headers);
    if (methods != NULL)
        json_object_set(rules, "methods", methods);
    if (paths != NULL)
        json_object_set(rules, "paths", paths);
    if (schemes != NULL)
        json_object_set(rules, "schemes", schemes);
    s->rules_text = json_dumps(rules, JSON_COMPACT);
    json_decref(rules);
    if (s->rules_text == NULL)
        sb_fatal(__FILE__, __LINE__, "out of memory");
    make_forms(s);
    return SB_OK;
}

static sb_status_t parse_set(const json_t *obj, mode_t_ mode, const sb_manifest_t *m, const char *base, sb_secrets_t **out,
                             char *err, size_t errsz)
{
    sb_secrets_t *s;
    const char *name;
    json_t *o;
    sb_status_t st;

    *out = NULL;
    if (obj == NULL || json_is_null(obj))
        return SB_OK;
    if (!json_is_object(obj))
        return fail(err, errsz, "%s: expected an object", base);
    if (json_object_size(obj) > SB_MAX_SECRETS)
        return fail(err, errsz, "%s: more than %u secrets", base, SB_MAX_SECRETS);
    if (json_object_size(obj) == 0)
        return SB_OK;
    s = new_set();
    json_object_foreach((json_t *)obj, name, o)
    {
        st = parse_one(name, strlen(name), o, mode, m, base, &s->v[s->n], err, errsz);
        ++s->n; /* counted either way: freed with the set */
        if (st != SB_OK) {
            sb_secrets_free(s);
            return st;
        }
    }
    build_order(s);
    *out = s;
    return SB_OK;
}

sb_status_t sb_secrets_parse(const json_t *obj, const sb_manifest_t *m, sb_secrets_t **out, char *err, size_t errsz)
{
    sb_status_t st = parse_set(obj, MODE_MINT, m, "secrets", out, err, errsz);
    /* the mint body's copies of the values are the caller's, but they need not outlive the parse */
    if (obj != NULL && json_is_object(obj)) {
        const char *name;
        json_t *o;
        json_object_foreach((json_t *)obj, name, o)
        {
            wipe_json_string(json_object_get(o, "value"));
        }
    }
    return st;
}

sb_status_t sb_secrets_parse_config(const json_t *obj, const char *path, sb_secrets_t **out, char *err, size_t errsz)
{
    return parse_set(obj, MODE_CONFIG, NULL, path, out, err, errsz);
}

static const sb_secret_t *find(const sb_secrets_t *s, const char *name, size_t len)
{
    if (s == NULL)
        return NULL;
    for (size_t i = 0; i < s->n; ++i)
        if (s->v[i].name_len == len && memcmp(s->v[i].name, name, len) == 0)
            return &s->v[i];
    return NULL;
}

/* a new secret in *to from the rules text and value of `src`, checked against the run's net like a minted one */
static sb_status_t add_copy(sb_secrets_t **to, const char *name, const char *rules_text, const char *value, size_t value_len,
                            const sb_manifest_t *m, const char *base, char *err, size_t errsz)
{
    json_t *o, *v;
    sb_secrets_t *s = *to;
    sb_status_t st;

    if (find(s, name, strlen(name)) != NULL)
        return fail(err, errsz, "%s: the run already has a secret named \"%s\"", base, name);
    if (sb_secrets_count(s) == SB_MAX_SECRETS)
        return fail(err, errsz, "%s: more than %u secrets", base, SB_MAX_SECRETS);
    if ((o = json_loads(rules_text, 0, NULL)) == NULL)
        return fail(err, errsz, "%s: unreadable rules", base);
    v = json_stringn_nocheck(value, value_len);
    json_object_set_new(o, "value", v);
    if (s == NULL)
        s = *to = new_set();
    st = parse_one(name, strlen(name), o, MODE_MINT, m, base, &s->v[s->n], err, errsz);
    ++s->n;
    wipe_json_string(v);
    json_decref(o);
    if (st != SB_OK) {
        free_secret(&s->v[--s->n]);
        return st;
    }
    build_order(s);
    return SB_OK;
}

sb_status_t sb_secrets_add_from(sb_secrets_t **to, const sb_secrets_t *from, const char *name, const sb_manifest_t *m,
                                const char *path, char *err, size_t errsz)
{
    const sb_secret_t *src = find(from, name, strlen(name));

    if (src == NULL)
        return fail(err, errsz, "%s: the run's target has no secret named \"%s\"", path, name);
    return add_copy(to, name, src->rules_text, src->value, src->value_len, m, path, err, errsz);
}

/* ---- the decision ---------------------------------------------------------------------------------------------------- */

__attribute__((format(printf, 4, 5))) static sb_status_t refuse(const sb_secret_t *sec, char *reason, size_t reasonsz,
                                                                const char *fmt, ...)
{
    va_list ap;
    int n;

    if (reason == NULL || reasonsz == 0)
        return SB_E_FORBIDDEN;
    n = snprintf(reason, reasonsz, "http.fetch secret \"%s\" ", sec->name);
    if (n > 0 && (size_t)n < reasonsz) {
        va_start(ap, fmt);
        vsnprintf(reason + n, reasonsz - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return SB_E_FORBIDDEN;
}

sb_status_t sb_secrets_decide(const sb_secrets_t *s, const char *name, size_t len, const char *header, const sb_url_t *u,
                              const char *method, const sb_secret_t **out, char *reason, size_t reasonsz)
{
    const sb_secret_t *sec = find(s, name, len);
    sb_net_verdict_t v = SB_NET_NO_HOST;
    char hp[SB_URL_MAX_HOST + 16];
    size_t i;

    *out = NULL;
    if (sec == NULL) {
        if (reason != NULL && reasonsz != 0)
            snprintf(reason, reasonsz, "http.fetch secret \"%.*s\" is not granted to this run", (int)len, name);
        return SB_E_FORBIDDEN;
    }
    if ((sec->schemes & SCHEME_BIT(u->scheme)) == 0)
        return refuse(sec, reason, reasonsz, "may not be sent over %s (secret schemes rule)",
                      u->scheme == SB_URL_HTTPS ? "https" : "http");
    for (i = 0; i < sec->nhosts; ++i) {
        if (!sb_manifest__entry_host_matches(&sec->hosts[i], u))
            continue;
        if ((v = sb_manifest__rules_verdict(&sec->hosts[i].rules, u, method)) == SB_NET_OK)
            break;
    }
    if (i == sec->nhosts) {
        sb_url_hostport(u, hp, sizeof(hp));
        if (v == SB_NET_NO_HOST)
            return refuse(sec, reason, reasonsz, "may not be sent to host \"%s\" (secret hosts rule)", hp);
        return refuse(sec, reason, reasonsz, "may not be sent to host \"%s\" with this %s (secret hosts rule)", hp,
                      v == SB_NET_METHOD ? "method" : "path");
    }
    for (i = 0; i < sec->nheaders && strcmp(sec->headers[i], header) != 0; ++i)
        ;
    if (i == sec->nheaders)
        return refuse(sec, reason, reasonsz, "may not be sent in header \"%s\" (secret headers rule)", header);
    switch (sb_manifest__rules_verdict(&sec->rules, u, method)) {
    case SB_NET_OK:
        break;
    case SB_NET_METHOD:
        return refuse(sec, reason, reasonsz, "may not be sent with method \"%s\" (secret methods rule)", method);
    case SB_NET_PATH_ENCODING:
        return refuse(
            sec, reason, reasonsz,
            "may not be sent: the path has an encoded '/', '\\', '.' or '%%', a ';', or a dot segment (secret paths rule)");
    default:
        return refuse(sec, reason, reasonsz, "may not be sent to this path (secret paths rule)");
    }
    *out = sec;
    return SB_OK;
}

void sb_secret_value(const sb_secret_t *sec, const char **value, size_t *len)
{
    *value = sec->value;
    *len = sec->value_len;
}

/* ---- redaction ------------------------------------------------------------------------------------------------------- */

/* the bytes a hit of f at `at` replaces: the form, and its tail when that follows */
static size_t hit_len(const char *in, size_t len, size_t at, const form_t *f)
{
    size_t end = at + f->len;
    if (f->tail_len != 0 && len - end >= f->tail_len && memcmp(in + end, f->tail, f->tail_len) == 0)
        return f->len + f->tail_len;
    return f->len;
}

/* hits of f, and the bytes they replace */
static size_t count_hits(const char *in, size_t len, const form_t *f, size_t *bytes)
{
    size_t n = 0, at = 0;
    const char *hit;

    *bytes = 0;
    while (at + f->len <= len && (hit = memmem(in + at, len - at, f->p, f->len)) != NULL) {
        size_t h = hit_len(in, len, (size_t)(hit - in), f);
        ++n;
        *bytes += h;
        at = (size_t)(hit - in) + h;
    }
    return n;
}

sb_status_t sb_secrets_redact(const sb_secrets_t *s, const char *in, size_t len, size_t cap, char **out, size_t *outlen)
{
    const char *cur = in;
    char *owned = NULL;
    size_t curlen = len;

    *out = NULL;
    *outlen = len;
    if (s == NULL)
        return SB_OK;
    for (size_t p = 0; p < s->norder; ++p) {
        const form_t *f = s->order[p].form;
        const sb_secret_t *sec = s->order[p].sec;
        size_t hits, replaced, newlen, at = 0, o = 0;
        char *next;
        if (curlen < f->len || (hits = count_hits(cur, curlen, f, &replaced)) == 0)
            continue;
        /* bounded before allocating: a short value repeated many times grows by the placeholder's length each time */
        if (sec->placeholder_len > f->len && hits > (cap - (curlen < cap ? curlen : cap)) / (sec->placeholder_len - f->len)) {
            if (owned != NULL) {
                wipe(owned, curlen);
                sb_mem_free(owned);
            }
            return SB_E_TOO_LARGE;
        }
        newlen = curlen - replaced + hits * sec->placeholder_len;
        if (newlen > cap) {
            if (owned != NULL) {
                wipe(owned, curlen);
                sb_mem_free(owned);
            }
            return SB_E_TOO_LARGE;
        }
        if ((next = sb_mem_try_alloc(newlen != 0 ? newlen : 1)) == NULL) {
            if (owned != NULL) {
                wipe(owned, curlen);
                sb_mem_free(owned);
            }
            return SB_E_NOMEM;
        }
        while (at < curlen) {
            const char *hit = at + f->len <= curlen ? memmem(cur + at, curlen - at, f->p, f->len) : NULL;
            size_t take = hit != NULL ? (size_t)(hit - cur) - at : curlen - at;
            memcpy(next + o, cur + at, take);
            o += take;
            at += take;
            if (hit == NULL)
                break;
            memcpy(next + o, sec->placeholder, sec->placeholder_len);
            o += sec->placeholder_len;
            at += hit_len(cur, curlen, at, f);
        }
        if (owned != NULL) {
            wipe(owned, curlen);
            sb_mem_free(owned);
        }
        owned = next;
        cur = next;
        curlen = o;
    }
    *out = owned;
    *outlen = curlen;
    return SB_OK;
}

/* ---- at rest --------------------------------------------------------------------------------------------------------- */

#define NONCE_LEN 12
#define TAG_LEN 16

static uint8_t g_key[32];
static int g_have_key;

void sb_secrets_set_key(const uint8_t key[32])
{
    if (key == NULL) {
        OPENSSL_cleanse(g_key, sizeof(g_key));
        g_have_key = 0;
        return;
    }
    memcpy(g_key, key, sizeof(g_key));
    g_have_key = 1;
}

int sb_secrets_have_key(void)
{
    return g_have_key;
}

sb_status_t sb_secrets_read_key(const char *path, uint8_t key[32], char *err, size_t errsz)
{
    uint8_t buf[130];
    FILE *fp = fopen(path, "rb");
    size_t n;
    sb_status_t st = SB_OK;

    if (fp == NULL)
        return fail(err, errsz, "secrets_key_file: cannot open %s: %s", path, strerror(errno));
    n = fread(buf, 1, sizeof(buf), fp);
    if (ferror(fp))
        st = fail(err, errsz, "secrets_key_file: cannot read %s", path);
    fclose(fp);
    if (st == SB_OK && n == 32) {
        memcpy(key, buf, 32);
    } else if (st == SB_OK) {
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
            --n;
        if (n != 64)
            st = fail(err, errsz, "secrets_key_file: %s holds neither 32 raw bytes nor 64 hex digits", path);
        for (size_t i = 0; st == SB_OK && i < 32; ++i) {
            int hi = sb_hex_digit((char)buf[2 * i]), lo = sb_hex_digit((char)buf[2 * i + 1]);
            if (hi < 0 || lo < 0)
                st = fail(err, errsz, "secrets_key_file: %s holds neither 32 raw bytes nor 64 hex digits", path);
            else
                key[i] = (uint8_t)(hi << 4 | lo);
        }
    }
    OPENSSL_cleanse(buf, sizeof(buf));
    return st;
}

/*
 * AES-256-GCM over the value; aad = token hash || name || NUL || the rules
 * (sorted compact JSON), so a record's rules cannot be widened by whoever can
 * write to Redis without the key; out = nonce || ciphertext || tag
 */
static int gcm(int enc, const uint8_t hash[32], const char *name, const char *rules, const uint8_t *nonce, const uint8_t *in,
               size_t len, uint8_t *out, uint8_t *tag)
{
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int ok = 0, n;

    if (c == NULL)
        return 0;
    if (EVP_CipherInit_ex(c, EVP_aes_256_gcm(), NULL, NULL, NULL, enc) != 1 ||
        EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, NONCE_LEN, NULL) != 1 ||
        EVP_CipherInit_ex(c, NULL, NULL, g_key, nonce, enc) != 1 || EVP_CipherUpdate(c, NULL, &n, hash, 32) != 1 ||
        EVP_CipherUpdate(c, NULL, &n, (const uint8_t *)name, (int)strlen(name) + 1) != 1 ||
        EVP_CipherUpdate(c, NULL, &n, (const uint8_t *)rules, (int)strlen(rules)) != 1 ||
        EVP_CipherUpdate(c, out, &n, in, (int)len) != 1)
        goto Exit;
    if (!enc && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, TAG_LEN, tag) != 1)
        goto Exit;
    if (EVP_CipherFinal_ex(c, out + n, &n) != 1)
        goto Exit;
    if (enc && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, TAG_LEN, tag) != 1)
        goto Exit;
    ok = 1;
Exit:
    EVP_CIPHER_CTX_free(c);
    return ok;
}

json_t *sb_secrets_seal(const sb_secrets_t *s, const uint8_t hash[32])
{
    json_t *o;
    uint8_t *box;
    char *b64;

    if (!g_have_key || s == NULL)
        return NULL;
    o = json_object();
    box = sb_mem_alloc(NONCE_LEN + SB_MAX_SECRET_VALUE + TAG_LEN);
    b64 = sb_mem_alloc(sb_b64_encoded_len(NONCE_LEN + SB_MAX_SECRET_VALUE + TAG_LEN) + 1);
    for (size_t i = 0; i < s->n; ++i) {
        const sb_secret_t *sec = &s->v[i];
        size_t blen = NONCE_LEN + sec->value_len + TAG_LEN;
        json_t *rules = json_loads(sec->rules_text, 0, NULL);
        char *aad = rules != NULL ? json_dumps(rules, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        int ok = aad != NULL && sb_random(box, NONCE_LEN) == SB_OK &&
                 gcm(1, hash, sec->name, aad, box, (const uint8_t *)sec->value, sec->value_len, box + NONCE_LEN,
                     box + NONCE_LEN + sec->value_len);
        sb_mem_free_foreign(aad);
        if (!ok) {
            json_decref(rules);
            json_decref(o);
            o = NULL;
            break;
        }
        sb_b64_encode(box, blen, b64);
        json_object_set_new(rules, "sealed", json_string(b64));
        json_object_set_new(o, sec->name, rules);
    }
    sb_mem_free(box);
    sb_mem_free(b64);
    return o;
}

sb_status_t sb_secrets_unseal(const json_t *o, const uint8_t hash[32], const sb_manifest_t *m, sb_secrets_t **out)
{
    const char *name;
    json_t *e;
    uint8_t *box, *plain;
    sb_status_t st = SB_OK;
    char err[256];

    *out = NULL;
    if (!json_is_object(o) || json_object_size(o) > SB_MAX_SECRETS || (json_object_size(o) != 0 && !g_have_key))
        return json_is_object(o) && json_object_size(o) == 0 ? SB_OK : SB_E_UNAVAILABLE;
    box = sb_mem_alloc(NONCE_LEN + SB_MAX_SECRET_VALUE + TAG_LEN + 3);
    plain = sb_mem_alloc(SB_MAX_SECRET_VALUE + 1);
    json_object_foreach((json_t *)o, name, e)
    {
        json_t *sealed = json_object_get(e, "sealed"), *rules;
        size_t blen = 0;
        char *text, *aad;
        int ok;
        if (!json_is_object(e) || (rules = json_deep_copy(e)) == NULL) {
            st = SB_E_UNAVAILABLE;
            break;
        }
        json_object_del(rules, "sealed");
        aad = json_dumps(rules, JSON_COMPACT | JSON_SORT_KEYS);
        ok = aad != NULL && json_is_string(sealed) &&
             json_string_length(sealed) <= sb_b64_encoded_len(NONCE_LEN + SB_MAX_SECRET_VALUE + TAG_LEN) &&
             sb_b64_decode(json_string_value(sealed), json_string_length(sealed), box, &blen) == SB_OK &&
             blen >= NONCE_LEN + 1 + TAG_LEN &&
             gcm(0, hash, name, aad, box, box + NONCE_LEN, blen - NONCE_LEN - TAG_LEN, plain, box + blen - TAG_LEN);
        sb_mem_free_foreign(aad);
        if (!ok) {
            /* a tag that does not verify comes after the plaintext was written: wipe it too */
            OPENSSL_cleanse(plain, SB_MAX_SECRET_VALUE + 1);
            json_decref(rules);
            st = SB_E_UNAVAILABLE;
            break;
        }
        text = json_dumps(rules, JSON_COMPACT);
        json_decref(rules);
        if (text == NULL)
            sb_fatal(__FILE__, __LINE__, "out of memory");
        st = add_copy(out, name, text, (const char *)plain, blen - NONCE_LEN - TAG_LEN, m, "secrets", err, sizeof(err));
        sb_mem_free_foreign(text);
        OPENSSL_cleanse(plain, SB_MAX_SECRET_VALUE + 1);
        if (st != SB_OK) {
            st = SB_E_UNAVAILABLE;
            break;
        }
    }
    OPENSSL_cleanse(box, NONCE_LEN + SB_MAX_SECRET_VALUE + TAG_LEN + 3);
    sb_mem_free(box);
    sb_mem_free(plain);
    if (st != SB_OK) {
        sb_secrets_free(*out);
        *out = NULL;
    }
    return st;
}
