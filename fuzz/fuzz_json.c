/*
 * libFuzzer driver for proto/json.c: JSON text -> packed msgpack
 * (sb_json_decode, with its depth/node pre-scan) and back (sb_json_from_mp).
 *
 * Properties:
 *  - on SB_OK, the packed bytes pass sb_mp_decode (the msgpack route's
 *    pre-check), sb_json_from_mp converts them back, and the result equals
 *    jansson's own parse of the text (a JSON -> msgpack -> JSON round trip);
 *  - SB_E_BAD_ARGS means jansson (with the same flags) refuses the text too;
 *    SB_E_TOO_LARGE is the only other refusal;
 *  - every refusal has a `why`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <msgpack.h>
#include "sb/value.h"
#include "fuzz.h"

#define FLAGS (JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_ANY)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    msgpack_sbuffer sb;
    msgpack_zone z;
    msgpack_object o;
    const char *why = NULL;
    json_t *want, *got = NULL;
    json_error_t err;
    sb_status_t st;
    char *text;

    /* an exact-size, non-NUL-terminated copy: reading past `size` is an ASan error */
    if ((text = calloc(1, size != 0 ? size : 1)) == NULL)
        abort();
    if (size != 0)
        memcpy(text, data, size);

    msgpack_sbuffer_init(&sb);
    st = sb_json_decode(text, size, &sb, &why);
    want = json_loadb(text, size, FLAGS, &err);
    if (st != SB_OK) {
        SB_FUZZ_ASSERT(st == SB_E_BAD_ARGS || st == SB_E_TOO_LARGE, "sb_json_decode status %d", (int)st);
        SB_FUZZ_ASSERT(why != NULL && *why != '\0', "refusal without a reason");
        SB_FUZZ_ASSERT(st != SB_E_BAD_ARGS || want == NULL, "sb_json_decode says bad_args (%s), jansson parses it", why);
        goto Exit;
    }
    SB_FUZZ_ASSERT(want != NULL, "sb_json_decode accepted what jansson refuses: %s", err.text);

    msgpack_zone_init(&z, 1024);
    st = sb_mp_decode((const uint8_t *)sb.data, sb.size, &z, &o, &why);
    SB_FUZZ_ASSERT(st == SB_OK, "sb_json_decode output refused by sb_mp_decode: %d %s", (int)st, why);
    st = sb_json_from_mp(&o, &got);
    SB_FUZZ_ASSERT(st == SB_OK, "sb_json_from_mp status %d", (int)st);
    SB_FUZZ_ASSERT(json_equal(want, got), "JSON -> msgpack -> JSON round trip differs");
    json_decref(got);
    msgpack_zone_destroy(&z);
Exit:
    json_decref(want);
    msgpack_sbuffer_destroy(&sb);
    free(text);
    return 0;
}
