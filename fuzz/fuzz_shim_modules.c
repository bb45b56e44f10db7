/*
 * libFuzzer driver for supervisor-shim/relay/modules.c: the parser of a module request Deno sends
 * to the module path's listeners, and capabilities.import entries as origins (PROTOCOL.md section 2,
 * "Modules").
 *
 * modules.c is compiled into this driver (#include below), so it gets the instrumentation.
 *
 * Input: the bytes read as a request head, and again as one import entry. Properties:
 *  1. a request parses the same twice; a whole one has a target that starts with "/", is visible
 *     ASCII of at most SB_SHIM_MODULE_MAX_TARGET bytes, and a head that ends with the blank line,
 *     within the input and SB_SHIM_MODULE_MAX_HEAD; "more" only while the input is shorter than the
 *     head cap and holds no blank line; bytes after a whole head change nothing;
 *  2. an accepted entry is an origin "https://" + a lower-case host (+ ":port" other than 443) of
 *     name characters, digits, brackets, dots and colons only, so it needs no escaping in the import
 *     map; the map is JSON with it as a key; a URL of that origin is found again at that index with
 *     its path; adding the origin's own authority again keeps one origin;
 *  3. a refused entry keeps nothing and says why.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "fuzz.h"
#include "../supervisor-shim/relay/modules.c"

static void check_request(const uint8_t *data, size_t size)
{
    char t1[SB_SHIM_MODULE_MAX_TARGET + 1], t2[SB_SHIM_MODULE_MAX_TARGET + 1];
    const char *why1 = NULL, *why2 = NULL;
    size_t h1 = 0, h2 = 0;
    sb_status_t s1 = sb_shim_module_parse_request(data, size, &h1, t1, &why1);
    sb_status_t s2 = sb_shim_module_parse_request(data, size, &h2, t2, &why2);

    SB_FUZZ_ASSERT(s1 == s2, "the same request parsed twice differs");
    if (s1 == SB_OK) {
        size_t n = strlen(t1);
        SB_FUZZ_ASSERT(h1 == h2 && strcmp(t1, t2) == 0, "the same head, another target");
        SB_FUZZ_ASSERT(t1[0] == '/' && n <= SB_SHIM_MODULE_MAX_TARGET, "a target outside origin-form or its cap");
        for (size_t i = 0; i < n; ++i)
            SB_FUZZ_ASSERT((unsigned char)t1[i] > 0x20 && (unsigned char)t1[i] < 0x7f, "a target byte that is not visible ASCII");
        SB_FUZZ_ASSERT(h1 >= 4 && h1 <= size && h1 <= SB_SHIM_MODULE_MAX_HEAD && memcmp(data + h1 - 4, "\r\n\r\n", 4) == 0,
                       "a head that does not end with its blank line");
        if (h1 < size) {
            /* what follows a whole head is not read */
            char t3[SB_SHIM_MODULE_MAX_TARGET + 1];
            const char *why3 = NULL;
            size_t h3 = 0;
            SB_FUZZ_ASSERT(sb_shim_module_parse_request(data, h1, &h3, t3, &why3) == SB_OK && h3 == h1 && strcmp(t3, t1) == 0,
                           "the head alone parses otherwise");
        }
    } else if (s1 == SB_E_AGAIN) {
        SB_FUZZ_ASSERT(size < SB_SHIM_MODULE_MAX_HEAD, "more asked past the head cap");
        for (size_t i = 0; i + 3 < size; ++i)
            SB_FUZZ_ASSERT(memcmp(data + i, "\r\n\r\n", 4) != 0, "more asked of a head that ended");
    } else {
        SB_FUZZ_ASSERT((s1 == SB_E_BAD_ARGS || s1 == SB_E_TOO_LARGE) && why1 != NULL && why1 == why2, "a refusal without a reason");
    }
}

static void check_entry(const uint8_t *data, size_t size)
{
    static sb_shim_imports_t im;
    const char *why = NULL;
    sb_buf_t b;
    json_t *map;
    char url[SB_SHIM_MAX_ORIGIN + 8];
    size_t off = 0;

    memset(&im, 0, sizeof(im));
    if (sb_shim_imports_add(&im, (const char *)data, size, &why) != 0) {
        SB_FUZZ_ASSERT(im.n == 0 && why != NULL, "a refused entry kept something, or said nothing");
        return;
    }
    SB_FUZZ_ASSERT(im.n == 1 && strncmp(im.origin[0], "https://", 8) == 0 && strlen(im.origin[0]) > 8,
                   "an accepted entry's origin");
    for (const char *p = im.origin[0] + 8; *p != '\0'; ++p)
        SB_FUZZ_ASSERT((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || strchr("-._[]:", *p) != NULL,
                       "an origin byte that would need escaping or could change the URL");
    sb_buf_init(&b, 1u << 16);
    SB_FUZZ_ASSERT(sb_shim_imports_map(&im, &b) == SB_OK, "the map");
    map = json_loadb(b.base, b.len, 0, NULL);
    snprintf(url, sizeof(url), "%s/", im.origin[0]);
    SB_FUZZ_ASSERT(map != NULL && json_is_string(json_object_get(json_object_get(map, "imports"), url)),
                   "the map is not JSON keyed by the origin");
    json_decref(map);
    sb_buf_free(&b);
    snprintf(url, sizeof(url), "%s/m.js", im.origin[0]);
    SB_FUZZ_ASSERT(sb_shim_imports_find(&im, url, strlen(url), &off) == 0 && strcmp(url + off, "/m.js") == 0,
                   "a URL of the origin is not found at its index");
    SB_FUZZ_ASSERT(sb_shim_imports_add(&im, im.origin[0] + 8, strlen(im.origin[0] + 8), &why) == 0 && im.n == 1,
                   "the origin's own authority is another origin");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_request(data, size);
    check_entry(data, size);
    return 0;
}
