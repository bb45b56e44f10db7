/*
 * The jansson route, kept only as a reference for the tests, the fuzz
 * drivers and the JSON benchmark: what the RPC route decoded JSON with
 * before sb_json_parse replaced it (jansson parses the text, its tree is
 * packed as msgpack). Nothing in broker/, proto/ or supervisor-shim/ uses
 * it. A depth and node pre-scan runs first, so jansson is never handed
 * text whose tree would pass the caps: the same caps and refusals as the
 * route had (PROTOCOL.md section 1).
 */
#ifndef SB_TESTS_JSON_REF_H
#define SB_TESTS_JSON_REF_H

#include <stddef.h>
#include <jansson.h>
#include <msgpack.h>
#include "sb/limits.h"
#include "sb/status.h"
#include "sb/value.h"

/*
 * Counts nesting and values in JSON text without allocating. Inside a
 * container every value but the first follows a ',', so 1 (the root) +
 * commas + containers bounds the number of values from above; map keys are
 * not values, as sb_mp_check counts them.
 */
static inline sb_status_t sb_ref_json_prescan(const char *s, size_t len, const char **why)
{
    size_t depth = 0, nodes = 1;
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
            if (++depth >= SB_MAX_DEPTH) {
                *why = "value nesting is too deep";
                return SB_E_TOO_LARGE;
            }
            /* a container is a value too */
            __attribute__((fallthrough));
        case ',':
            if (++nodes > SB_MAX_NODES) {
                *why = "value has too many nodes";
                return SB_E_TOO_LARGE;
            }
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

/**
 * JSON text (strict UTF-8, duplicate keys refused, NUL allowed inside
 * strings) packed as msgpack into `packed`, the old way.
 * @return SB_OK, SB_E_BAD_ARGS ("invalid JSON"), SB_E_TOO_LARGE (depth or node cap), SB_E_NOMEM
 */
static inline sb_status_t sb_ref_json_decode(const char *text, size_t len, msgpack_sbuffer *packed, const char **why)
{
    json_error_t err;
    json_t *root;
    msgpack_packer pk;
    sb_status_t st;
    const char *dummy;

    if (why == NULL)
        why = &dummy;
    if ((st = sb_ref_json_prescan(text, len, why)) != SB_OK)
        return st;
    /* jansson validates UTF-8 strictly (lone surrogate escapes included) */
    if ((root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_ANY, &err)) == NULL) {
        *why = "invalid JSON";
        return SB_E_BAD_ARGS;
    }
    msgpack_packer_init(&pk, packed, msgpack_sbuffer_write);
    st = sb_mp_pack_json(&pk, root, why);
    json_decref(root);
    return st;
}

#endif
