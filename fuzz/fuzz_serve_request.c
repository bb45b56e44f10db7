/*
 * libFuzzer driver for supervisor-shim/serve/serve_req.c: the body of a POST /run,
 * from bytes to the typed run and the init frame the guest gets, and for
 * supervisor-shim/relay/url.c as serve uses it on bindings.url.
 *
 * serve_req.c, url.c and modules.c are compiled into this driver (#include below), so
 * they get the instrumentation; nothing from fuzz/CMakeLists.txt is needed.
 *
 * Input: the request body. Properties:
 *  1. decode agrees with jansson: SB_OK exactly when jansson (same flags)
 *     parses the text, unless the pre-scan refused it as too deep or too many
 *     values (SB_E_TOO_LARGE), which needs more than 47 levels or 32,768 values;
 *  2. a validated run is host mode and within every limit of the schema,
 *     checked here independently: source 1 B - 1 MiB, timeoutMs 1-30,000,
 *     memoryMb 16-1,024, host lists of strings (at most 32 in all), secrets
 *     (at most 64 strings of [A-Za-z0-9_.-]+, 64 KiB each, 256 KiB in all),
 *     bindings {url, token} within 2,048 / 8,192 bytes; and validating twice
 *     gives the same verdict;
 *  3. the init frame of a validated run always packs: its header states its
 *     size, it fits SB_MAX_FRAME, msgpack-c unpacks it whole, it is
 *     {t:"init", source, input, bindings, fetch, secrets} with the source
 *     byte for byte and the input equal to the JSON input (integral doubles
 *     within 2^53 as integers, as the guest's JSON.parse would have them);
 *  4. bindings.url: equality is reflexive, and a URL url.c accepts has a
 *     normalised form that parses to an equal URL, unless its path still ends
 *     in '/' (only one trailing '/' is ignored: "/x//" and "/x/" differ, as
 *     upstream compares them).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <msgpack.h>
#include "sb/frame.h"
#include "sb/limits.h"
#include "fuzz.h"
#include "../supervisor-shim/serve/serve_req.c"
#include "../supervisor-shim/relay/url.c"
#include "../supervisor-shim/relay/modules.c"

#define FLAGS (JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL)

static const msgpack_object *key_of(const msgpack_object *map, const char *k)
{
    size_t n = strlen(k);
    for (uint32_t i = 0; i < map->via.map.size; ++i) {
        const msgpack_object *key = &map->via.map.ptr[i].key;
        if (key->type == MSGPACK_OBJECT_STR && key->via.str.size == n && memcmp(key->via.str.ptr, k, n) == 0)
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

/* the JSON value and the packed one say the same thing */
static int same(const json_t *j, const msgpack_object *o)
{
    switch (json_typeof(j)) {
    case JSON_NULL:
        return o->type == MSGPACK_OBJECT_NIL;
    case JSON_TRUE:
    case JSON_FALSE:
        return o->type == MSGPACK_OBJECT_BOOLEAN && o->via.boolean == json_is_true(j);
    case JSON_STRING:
        return o->type == MSGPACK_OBJECT_STR && o->via.str.size == json_string_length(j) &&
               (o->via.str.size == 0 || memcmp(o->via.str.ptr, json_string_value(j), o->via.str.size) == 0);
    case JSON_INTEGER:
    case JSON_REAL: {
        double d = json_number_value(j);
        if (d == floor(d) && fabs(d) <= 9007199254740991.0)
            return (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && (double)o->via.u64 == d) ||
                   (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && (double)o->via.i64 == d);
        return o->type == MSGPACK_OBJECT_FLOAT64 && (o->via.f64 == d || (isnan(d) && isnan(o->via.f64)));
    }
    case JSON_ARRAY:
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != json_array_size(j))
            return 0;
        for (uint32_t i = 0; i < o->via.array.size; ++i)
            if (!same(json_array_get(j, i), &o->via.array.ptr[i]))
                return 0;
        return 1;
    case JSON_OBJECT: {
        const char *k;
        json_t *v;
        if (o->type != MSGPACK_OBJECT_MAP || o->via.map.size != json_object_size(j))
            return 0;
        json_object_foreach((json_t *)j, k, v)
        {
            const msgpack_object *e = key_of(o, k);
            if (e == NULL || !same(v, e))
                return 0;
        }
        return 1;
    }
    }
    return 0;
}

static void check_hosts(const json_t *list)
{
    size_t i;
    const json_t *h;

    if (list == NULL)
        return;
    SB_FUZZ_ASSERT(json_is_array(list) && json_array_size(list) <= SB_SERVE_MAX_HOSTS, "host list shape");
    json_array_foreach(list, i, h)
    {
        const char *s = json_string_value(h);
        SB_FUZZ_ASSERT(s != NULL && json_string_length(h) > 0, "host %zu is not a non-empty string", i);
        SB_FUZZ_ASSERT(memchr(s, '*', json_string_length(h)) == NULL && memchr(s, '/', json_string_length(h)) == NULL &&
                           memchr(s, ' ', json_string_length(h)) == NULL,
                       "host %zu holds '*', '/' or a space", i);
    }
}

static void check_run(const json_t *root, const sb_serve_run_t *run)
{
    const char *k;
    json_t *v;
    size_t total = 0;

    SB_FUZZ_ASSERT(sb_serve_req_is_host(root), "a validated run is host mode");
    SB_FUZZ_ASSERT(run->source_len >= 1 && run->source_len <= SB_SERVE_MAX_SOURCE, "source length %zu", run->source_len);
    SB_FUZZ_ASSERT(run->timeout_ms >= 1 && run->timeout_ms <= 30000, "timeoutMs %lld", (long long)run->timeout_ms);
    SB_FUZZ_ASSERT(run->memory_mb >= 16 && run->memory_mb <= 1024, "memoryMb %u", run->memory_mb);
    SB_FUZZ_ASSERT(run->input != NULL, "input is null, never absent");
    check_hosts(run->net);
    check_hosts(run->imports);
    SB_FUZZ_ASSERT((run->net != NULL ? json_array_size(run->net) : 0) +
                           (run->imports != NULL ? json_array_size(run->imports) : 0) <=
                       SB_SERVE_MAX_HOSTS,
                   "more than 32 hosts");
    if (run->secrets != NULL) {
        SB_FUZZ_ASSERT(json_is_object(run->secrets) && json_object_size(run->secrets) <= 64, "secrets shape");
        json_object_foreach((json_t *)run->secrets, k, v)
        {
            SB_FUZZ_ASSERT(*k != '\0' &&
                               strspn(k, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") == strlen(k),
                           "secret name %s", k);
            SB_FUZZ_ASSERT(json_is_string(v) && json_string_length(v) <= SB_SERVE_MAX_SECRET_VALUE, "secret value");
            total += strlen(k) + json_string_length(v);
        }
        SB_FUZZ_ASSERT(total <= SB_SERVE_MAX_SECRETS_TOTAL, "secrets total %zu", total);
    }
    if (run->has_bindings) {
        SB_FUZZ_ASSERT(run->url_len >= 1 && run->url_len <= SB_SERVE_MAX_URL, "url length");
        SB_FUZZ_ASSERT(run->token_len >= 1 && run->token_len <= SB_SERVE_MAX_TOKEN, "token length");
    }
}

static void check_init(const sb_serve_run_t *run)
{
    msgpack_sbuffer frame;
    msgpack_unpacked u;
    size_t off = 0;
    const msgpack_object *src, *in, *sec;
    int bindings = run->has_bindings, fetch = run->net != NULL;

    SB_FUZZ_ASSERT(sb_serve_req_pack_init(run, bindings, fetch, NULL, &frame) == SB_OK, "a validated run must pack");
    SB_FUZZ_ASSERT(frame.size > 4 && frame.size - 4 <= SB_MAX_FRAME, "frame size %zu", frame.size);
    SB_FUZZ_ASSERT(((uint32_t)(uint8_t)frame.data[0] << 24 | (uint32_t)(uint8_t)frame.data[1] << 16 |
                    (uint32_t)(uint8_t)frame.data[2] << 8 | (uint8_t)frame.data[3]) == frame.size - 4,
                   "frame header");
    msgpack_unpacked_init(&u);
    SB_FUZZ_ASSERT(msgpack_unpack_next(&u, frame.data + 4, frame.size - 4, &off) == MSGPACK_UNPACK_SUCCESS && off == frame.size - 4,
                   "the frame unpacks whole");
    SB_FUZZ_ASSERT(u.data.type == MSGPACK_OBJECT_MAP && u.data.via.map.size == 6u, "init keys");
    src = key_of(&u.data, "source");
    in = key_of(&u.data, "input");
    sec = key_of(&u.data, "secrets");
    SB_FUZZ_ASSERT(src != NULL && src->type == MSGPACK_OBJECT_STR && src->via.str.size == run->source_len &&
                       memcmp(src->via.str.ptr, run->source, run->source_len) == 0,
                   "source byte for byte");
    SB_FUZZ_ASSERT(in != NULL && same(run->input, in), "input packed as JSON.parse has it");
    SB_FUZZ_ASSERT(sec != NULL && sec->type == MSGPACK_OBJECT_MAP &&
                       (run->secrets != NULL ? same(run->secrets, sec) : sec->via.map.size == 0),
                   "secrets: the run's, or an empty map");
    SB_FUZZ_ASSERT(key_of(&u.data, "bindings")->via.boolean == bindings && key_of(&u.data, "fetch")->via.boolean == fetch, "flags");
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&frame);
}

static void check_url(const sb_serve_run_t *run)
{
    sb_shim_url_t a, b;
    const char *why = NULL;
    char norm[SB_SHIM_MAX_HOST + sizeof(a.target) + 32];

    if (!run->has_bindings || strlen(run->url) != run->url_len || sb_shim_url_parse(run->url, &a, &why) != SB_OK)
        return;
    SB_FUZZ_ASSERT(sb_shim_url_equal(&a, &a), "equality is reflexive");
    snprintf(norm, sizeof(norm), "%s://%s%s", a.https ? "https" : "http", a.host_header, a.target);
    SB_FUZZ_ASSERT(sb_shim_url_parse(norm, &b, &why) == SB_OK, "the normalised form %s parses (%s)", norm, why);
    if (strcmp(a.path, "/") == 0 || a.path[strlen(a.path) - 1] != '/')
        SB_FUZZ_ASSERT(sb_shim_url_equal(&a, &b) && strcmp(a.target, b.target) == 0, "normalisation is a fixed point: %s", norm);
    else
        SB_FUZZ_ASSERT(!sb_shim_url_equal(&a, &b) && strcmp(a.query, b.query) == 0, "a second '/' is not ignored: %s", norm);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = calloc(1, size != 0 ? size : 1);
    json_t *root = NULL, *ref;
    json_error_t jerr;
    sb_serve_run_t run, again;
    const char *why = NULL, *why2 = NULL;
    sb_status_t st, st2;

    if (text == NULL)
        abort();
    if (size != 0)
        memcpy(text, data, size);
    st = sb_serve_req_decode(text, size, &root);
    ref = size != 0 ? json_loadb(text, size, FLAGS, &jerr) : NULL;
    SB_FUZZ_ASSERT(st == SB_OK || st == SB_E_BAD_ARGS || st == SB_E_TOO_LARGE, "decode status %d", (int)st);
    SB_FUZZ_ASSERT(st != SB_OK || ref != NULL, "decode accepted what jansson refuses");
    SB_FUZZ_ASSERT(st != SB_E_BAD_ARGS || ref == NULL, "decode refused what jansson parses");
    if (st == SB_OK) {
        SB_FUZZ_ASSERT(json_equal(root, ref), "decode and jansson disagree on the value");
        st = sb_serve_req_validate(root, &run, &why);
        st2 = sb_serve_req_validate(root, &again, &why2);
        SB_FUZZ_ASSERT(st == st2 && why == why2, "validation is deterministic");
        SB_FUZZ_ASSERT(st == SB_OK || (st == SB_E_BAD_ARGS && why != NULL), "refusal %d without a reason", (int)st);
        if (st == SB_OK) {
            check_run(root, &run);
            check_init(&run);
            check_url(&run);
        }
    }
    json_decref(root);
    json_decref(ref);
    free(text);
    return 0;
}
