/*
 * The POST /run request (see serve_req.h). The limits are upstream's /run
 * wire: a client that upstream's supervisor accepts is accepted here, except
 * where README.md ("Deviations") says otherwise.
 */
#include <math.h>
#include <string.h>
#include "sb/frame.h"
#include "sb/limits.h"
#include "sb/value.h"
#include "serve/serve_req.h"

/* a valid request nests at most about 36 containers and holds about 10,300 values; the scan's bounds sit well above */
#define PRESCAN_MAX_DEPTH 48u
#define PRESCAN_MAX_VALUES 32768u
/* JavaScript's Number.MAX_SAFE_INTEGER: integral doubles up to it travel as msgpack integers */
#define MAX_SAFE_INTEGER 9007199254740991.0

/*
 * Counts nesting and values in the text without allocating (as proto/json.c
 * does for the RPC route): every value but the first of a container follows a
 * ',', so 1 + commas + containers bounds the values from above.
 */
static sb_status_t prescan(const char *s, size_t len)
{
    size_t depth = 0, values = 1;
    int in_str = 0;

    for (size_t i = 0; i < len; ++i) {
        char ch = s[i];
        if (in_str) {
            if (ch == '\\')
                ++i;
            else if (ch == '"')
                in_str = 0;
            continue;
        }
        switch (ch) {
        case '"':
            in_str = 1;
            break;
        case '[':
        case '{':
            if (++depth >= PRESCAN_MAX_DEPTH)
                return SB_E_TOO_LARGE;
            __attribute__((fallthrough));
        case ',':
            if (++values > PRESCAN_MAX_VALUES)
                return SB_E_TOO_LARGE;
            break;
        case ']':
        case '}':
            if (depth != 0)
                --depth;
            break;
        default:
            break;
        }
    }
    return SB_OK;
}

sb_status_t sb_serve_req_decode(const char *body, size_t len, json_t **out)
{
    json_error_t jerr;

    *out = NULL;
    if (body == NULL || len == 0)
        return SB_E_BAD_ARGS;
    if (prescan(body, len) != SB_OK)
        return SB_E_TOO_LARGE;
    /* jansson refuses invalid UTF-8 and (with the flag) duplicate keys; numbers as doubles, as in JavaScript */
    *out = json_loadb(body, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &jerr);
    return *out != NULL ? SB_OK : SB_E_BAD_ARGS;
}

int sb_serve_req_is_host(const json_t *root)
{
    const json_t *mode = json_is_object(root) ? json_object_get(root, "mode") : NULL;
    return json_is_string(mode) && json_string_length(mode) == 4 && memcmp(json_string_value(mode), "host", 4) == 0;
}

/* ---- schema ---- */

/* a JavaScript integer within [min, max]: a double with no fraction */
static int integer_in(const json_t *v, double min, double max, double *out)
{
    double d;

    if (!json_is_number(v))
        return 0;
    d = json_number_value(v);
    if (!isfinite(d) || d != floor(d) || d < min || d > max)
        return 0;
    *out = d;
    return 1;
}

/* decodes the UTF-8 code point at p[*i] (the bytes are valid: jansson checked) */
static uint32_t next_cp(const unsigned char *p, size_t *i)
{
    uint32_t c = p[*i];
    size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;

    if (n > 1)
        c &= n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07;
    for (size_t k = 1; k < n; ++k)
        c = (c << 6) | (p[*i + k] & 0x3F);
    *i += n;
    return c;
}

/* JavaScript's \s: WhiteSpace and LineTerminator (ECMA-262 sections 12.2 and 12.3) */
static int js_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

/* a host list: an array of at most 32 strings of 1-253 UTF-16 units, none holding '*', '/' or white space */
static int host_list(const json_t *v, size_t *n)
{
    size_t i;
    const json_t *h;

    if (!json_is_array(v) || json_array_size(v) > SB_SERVE_MAX_HOSTS)
        return 0;
    json_array_foreach(v, i, h)
    {
        const unsigned char *p = (const unsigned char *)json_string_value(h);
        size_t len = json_string_length(h), units = 0, k = 0;
        if (!json_is_string(h) || len == 0)
            return 0;
        while (k < len) {
            uint32_t c = next_cp(p, &k);
            units += c > 0xFFFF ? 2 : 1;
            if (c == '*' || c == '/' || js_space(c) || units > SB_SERVE_MAX_HOST_LEN)
                return 0;
        }
    }
    *n = json_array_size(v);
    return 1;
}

typedef struct st_budget_t {
    size_t nodes, bytes;
} budget_t;

static int consume(budget_t *b, size_t bytes)
{
    b->nodes += 1;
    b->bytes += bytes;
    return b->nodes <= SB_SERVE_MAX_INPUT_NODES && b->bytes <= SB_SERVE_MAX_INPUT_BYTES;
}

/*
 * The input, bounded as upstream bounds it: no value deeper than 32 below the
 * input itself, at most 10,000 nodes (object keys count as nodes), and an
 * estimate of at most 1 MiB (strings and keys by their UTF-8 bytes, numbers 24,
 * null and booleans 5, containers 2); arrays of at most 10,000 items.
 */
static int input_ok(const json_t *v, unsigned depth, budget_t *b)
{
    if (depth > SB_SERVE_MAX_INPUT_DEPTH)
        return 0;
    switch (json_typeof(v)) {
    case JSON_STRING:
        return consume(b, json_string_length(v));
    case JSON_REAL:
    case JSON_INTEGER:
        return consume(b, 24);
    case JSON_TRUE:
    case JSON_FALSE:
    case JSON_NULL:
        return consume(b, 5);
    case JSON_ARRAY: {
        size_t i;
        const json_t *e;
        if (!consume(b, 2) || json_array_size(v) > SB_SERVE_MAX_INPUT_NODES)
            return 0;
        json_array_foreach(v, i, e)
        {
            if (!input_ok(e, depth + 1, b))
                return 0;
        }
        return 1;
    }
    case JSON_OBJECT: {
        const char *k;
        const json_t *e;
        if (!consume(b, 2))
            return 0;
        json_object_foreach((json_t *)v, k, e)
        {
            if (!consume(b, strlen(k)) || !input_ok(e, depth + 1, b))
                return 0;
        }
        return 1;
    }
    }
    return 0;
}

static int secret_name_ok(const char *s)
{
    if (*s == '\0')
        return 0;
    for (; *s != '\0'; ++s) {
        char c = *s;
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
            return 0;
    }
    return 1;
}

/* secrets: at most 64 names of [A-Za-z0-9_.-]+, each value a string of at most 64 KiB, 256 KiB in all */
static int secrets_ok(const json_t *v)
{
    const char *k;
    const json_t *e;
    size_t total = 0;

    if (!json_is_object(v) || json_object_size(v) > SB_SERVE_MAX_SECRETS)
        return 0;
    json_object_foreach((json_t *)v, k, e)
    {
        if (!secret_name_ok(k) || !json_is_string(e) || json_string_length(e) > SB_SERVE_MAX_SECRET_VALUE)
            return 0;
        total += strlen(k) + json_string_length(e);
        if (total > SB_SERVE_MAX_SECRETS_TOTAL)
            return 0;
    }
    return 1;
}

int sb_serve_token_ok(const char *token, size_t len)
{
    if (len == 0 || len > SB_SERVE_MAX_TOKEN)
        return 0;
    for (size_t i = 0; i < len; ++i)
        if ((unsigned char)token[i] < 0x21 || (unsigned char)token[i] > 0x7E)
            return 0;
    return 1;
}

static int keys_within(const json_t *o, const char *const *allowed)
{
    const char *k;
    const json_t *v;

    json_object_foreach((json_t *)o, k, v)
    {
        const char *const *a = allowed;
        while (*a != NULL && strcmp(*a, k) != 0)
            ++a;
        if (*a == NULL)
            return 0;
    }
    return 1;
}

sb_status_t sb_serve_req_validate(const json_t *root, sb_serve_run_t *out, const char **why)
{
    static const char *const top_keys[] = {"mode", "source", "input", "capabilities", "secrets", "bindings", NULL};
    static const char *const cap_keys[] = {"net", "import", "timeoutMs", "memoryMb", NULL};
    static const char *const bind_keys[] = {"url", "token", NULL};
    const json_t *source, *caps, *v, *secrets, *bindings;
    size_t n_net = 0, n_import = 0;
    budget_t budget = {0, 0};
    double d;

    memset(out, 0, sizeof(*out));
    if (!json_is_object(root) || !keys_within(root, top_keys)) {
        *why = "the request must be an object of mode, source, input, capabilities, secrets and bindings";
        return SB_E_BAD_ARGS;
    }
    if (!sb_serve_req_is_host(root)) {
        *why = "mode must be \"host\"";
        return SB_E_BAD_ARGS;
    }
    source = json_object_get(root, "source");
    if (!json_is_string(source) || json_string_length(source) == 0 || json_string_length(source) > SB_SERVE_MAX_SOURCE) {
        *why = "source must be a non-empty string of at most 1 MiB";
        return SB_E_BAD_ARGS;
    }
    out->source = json_string_value(source);
    out->source_len = json_string_length(source);

    out->input = json_object_get(root, "input");
    if (out->input == NULL)
        out->input = json_null();
    if (!input_ok(out->input, 0, &budget)) {
        *why = "input is nested deeper than 32, or larger than 10,000 nodes or 1 MiB";
        return SB_E_BAD_ARGS;
    }

    caps = json_object_get(root, "capabilities");
    if (!json_is_object(caps) || !keys_within(caps, cap_keys)) {
        *why = "capabilities must be an object of net, import, timeoutMs and memoryMb";
        return SB_E_BAD_ARGS;
    }
    if ((v = json_object_get(caps, "net")) != NULL) {
        if (!host_list(v, &n_net)) {
            *why = "capabilities.net must be at most 32 hosts without '*', '/' or white space";
            return SB_E_BAD_ARGS;
        }
        out->net = v;
    }
    if ((v = json_object_get(caps, "import")) != NULL) {
        if (!host_list(v, &n_import)) {
            *why = "capabilities.import must be at most 32 hosts without '*', '/' or white space";
            return SB_E_BAD_ARGS;
        }
        out->imports = v;
    }
    if (n_net + n_import > SB_SERVE_MAX_HOSTS) {
        *why = "capabilities.net and capabilities.import hold more than 32 hosts together";
        return SB_E_BAD_ARGS;
    }
    out->timeout_ms = SB_SERVE_DEFAULT_TIMEOUT_MS;
    if ((v = json_object_get(caps, "timeoutMs")) != NULL) {
        if (!integer_in(v, SB_SERVE_MIN_TIMEOUT_MS, SB_SERVE_MAX_TIMEOUT_MS, &d)) {
            *why = "capabilities.timeoutMs must be an integer from 1 to 30000";
            return SB_E_BAD_ARGS;
        }
        out->timeout_ms = (int64_t)d;
    }
    out->memory_mb = SB_SERVE_DEFAULT_MEMORY_MB;
    if ((v = json_object_get(caps, "memoryMb")) != NULL) {
        if (!integer_in(v, SB_SERVE_MIN_MEMORY_MB, SB_SERVE_MAX_MEMORY_MB, &d)) {
            *why = "capabilities.memoryMb must be an integer from 16 to 1024";
            return SB_E_BAD_ARGS;
        }
        out->memory_mb = (unsigned)d;
    }

    /* secrets: null is no secrets, as upstream reads `secrets ?? {}` */
    secrets = json_object_get(root, "secrets");
    if (secrets != NULL && !json_is_null(secrets)) {
        if (!secrets_ok(secrets)) {
            *why = "secrets must be at most 64 strings named [A-Za-z0-9_.-]+, 64 KiB each, 256 KiB in all";
            return SB_E_BAD_ARGS;
        }
        if (json_object_size(secrets) != 0)
            out->secrets = secrets;
    }

    if ((bindings = json_object_get(root, "bindings")) != NULL) {
        const json_t *url, *token;
        if (!json_is_object(bindings) || !keys_within(bindings, bind_keys) ||
            !json_is_string(url = json_object_get(bindings, "url")) ||
            !json_is_string(token = json_object_get(bindings, "token"))) {
            *why = "bindings must be exactly {url, token}";
            return SB_E_BAD_ARGS;
        }
        /* a string that is no URL is refused later as upstream refuses it: "bindings rejected: ..." */
        if (json_string_length(url) > SB_SERVE_MAX_URL) {
            *why = "bindings.url must be a string of at most 2048 bytes";
            return SB_E_BAD_ARGS;
        }
        if (json_string_length(token) == 0 || json_string_length(token) > SB_SERVE_MAX_TOKEN) {
            *why = "bindings.token must be a non-empty string of at most 8192 bytes";
            return SB_E_BAD_ARGS;
        }
        out->has_bindings = 1;
        out->url = json_string_value(url);
        out->url_len = json_string_length(url);
        out->token = json_string_value(token);
        out->token_len = json_string_length(token);
    }
    return SB_OK;
}

/* ---- the init frame ---- */

static void pack_strn(msgpack_packer *pk, const char *s, size_t n)
{
    (void)msgpack_pack_str(pk, n);
    (void)msgpack_pack_str_body(pk, n != 0 ? s : "", n);
}

/* a JSON value as the guest's JSON.parse would have it: integral doubles in the safe range are integers */
static void pack_json(msgpack_packer *pk, const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        const json_t *e;
        (void)msgpack_pack_map(pk, json_object_size(v));
        json_object_foreach((json_t *)v, k, e)
        {
            pack_strn(pk, k, strlen(k));
            pack_json(pk, e);
        }
        return;
    }
    case JSON_ARRAY: {
        size_t i;
        const json_t *e;
        (void)msgpack_pack_array(pk, json_array_size(v));
        json_array_foreach(v, i, e)
        {
            pack_json(pk, e);
        }
        return;
    }
    case JSON_STRING:
        pack_strn(pk, json_string_value(v), json_string_length(v));
        return;
    case JSON_INTEGER:
        (void)msgpack_pack_int64(pk, (int64_t)json_integer_value(v));
        return;
    case JSON_REAL: {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) <= MAX_SAFE_INTEGER)
            (void)msgpack_pack_int64(pk, (int64_t)d);
        else
            (void)msgpack_pack_double(pk, d);
        return;
    }
    case JSON_TRUE:
        (void)msgpack_pack_true(pk);
        return;
    case JSON_FALSE:
        (void)msgpack_pack_false(pk);
        return;
    case JSON_NULL:
        (void)msgpack_pack_nil(pk);
        return;
    }
}

sb_status_t sb_serve_req_pack_init(const sb_serve_run_t *run, int bindings, int fetch, const sb_shim_imports_t *imports,
                                   msgpack_sbuffer *frame)
{
    msgpack_packer pk;
    int with_imports = imports != NULL && imports->n != 0;

    msgpack_sbuffer_init(frame);
    (void)msgpack_sbuffer_write(frame, "\0\0\0\0", 4);
    msgpack_packer_init(&pk, frame, msgpack_sbuffer_write);
    (void)msgpack_pack_map(&pk, with_imports ? 7 : 6);
    pack_strn(&pk, "t", 1);
    pack_strn(&pk, "init", 4);
    pack_strn(&pk, "source", 6);
    pack_strn(&pk, run->source, run->source_len);
    pack_strn(&pk, "input", 5);
    pack_json(&pk, run->input);
    pack_strn(&pk, "bindings", 8);
    (void)(bindings ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk));
    pack_strn(&pk, "fetch", 5);
    (void)(fetch ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk));
    /* always a map, as upstream's guests always have a __secrets object, empty or not */
    pack_strn(&pk, "secrets", 7);
    if (run->secrets != NULL)
        pack_json(&pk, run->secrets);
    else
        (void)msgpack_pack_map(&pk, 0);
    if (with_imports) {
        pack_strn(&pk, "imports", 7);
        sb_shim_imports_pack(imports, &pk);
    }
    if (frame->data == NULL || frame->size - 4 > SB_MAX_FRAME) {
        msgpack_sbuffer_destroy(frame);
        msgpack_sbuffer_init(frame);
        return SB_E_TOO_LARGE;
    }
    sb_frame_header((uint32_t)(frame->size - 4), (uint8_t *)frame->data);
    return SB_OK;
}
