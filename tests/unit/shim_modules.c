/*
 * Unit tests for supervisor-shim/relay/modules.c: capabilities.import entries as origins, the import
 * map and --allow-import value Deno gets, the origin of a module URL, and the parser of Deno's
 * module requests (PROTOCOL.md section 2, "Modules").
 */
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "../../supervisor-shim/relay/modules.c"

static int add(sb_shim_imports_t *im, const char *e, const char **why)
{
    return sb_shim_imports_add(im, e, strlen(e), why);
}

static void test_entries(void)
{
    static const struct {
        const char *in, *origin;
    } good[] = {
        {"esm.sh", "https://esm.sh"},
        {"ESM.sh:443", "https://esm.sh"},
        {"cdn.example:8443", "https://cdn.example:8443"},
        {"10.0.0.1", "https://10.0.0.1"},
        {"[::1]:9443", "https://[::1]:9443"},
        {"a_b-c.example", "https://a_b-c.example"},
        {"esm.sh.", "https://esm.sh"},
        {"Esm.Sh.:8443", "https://esm.sh:8443"},
        {"[2001:DB8:0:0::1]", "https://[2001:db8::1]"},
        {"[::ffff:10.0.0.1]:8443", "https://[::ffff:10.0.0.1]:8443"},
    };
    static const char *const bad[] = {"",
                                      "*.esm.sh",
                                      "esm.sh/x",
                                      "esm.sh:",
                                      "esm.sh:0",
                                      "esm.sh:65536",
                                      "esm.sh:+1",
                                      "esm.sh:123456",
                                      ".esm.sh",
                                      "-esm.sh",
                                      "a..b",
                                      "::1",
                                      "[::1",
                                      "[]",
                                      "[xyz]:1",
                                      "esm.sh:80:81",
                                      "es m.sh",
                                      "esm.sh\t",
                                      "https://esm.sh",
                                      "user@esm.sh",
                                      "[1::2::3]",
                                      "[::1.2.3]",
                                      ".",
                                      "[0000:0000:0000:0000:0000:0000:0000:0000:0000]"};
    const char *why = NULL;

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); ++i) {
        sb_shim_imports_t im;
        memset(&im, 0, sizeof(im));
        is_int(add(&im, good[i].in, &why), 0, "entry %s", good[i].in);
        is_int(im.n, 1, "one origin for %s", good[i].in);
        is_str(im.origin[0], good[i].origin, "origin of %s", good[i].in);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        sb_shim_imports_t im;
        memset(&im, 0, sizeof(im));
        why = NULL;
        is_int(add(&im, bad[i], &why), -1, "refused: \"%s\"", bad[i]);
        is_str(why, "an import entry must be a host name, an IPv4 address or a bracketed IPv6 address, with an optional :port",
               "why for \"%s\"", bad[i]);
        is_int(im.n, 0, "nothing kept for \"%s\"", bad[i]);
    }
    {
        /* the bytes past the entry's length are not the entry's */
        sb_shim_imports_t im;
        memset(&im, 0, sizeof(im));
        is_int(sb_shim_imports_add(&im, "esm.sh:8443", 6, &why), 0, "a length-bound entry");
        is_str(im.origin[0], "https://esm.sh", "read to its length only");
        is_int(sb_shim_imports_add(&im, "a\0b", 3, &why), -1, "a NUL inside the entry");
    }
}

static void test_dedup_and_cap(void)
{
    sb_shim_imports_t im;
    const char *why = NULL;
    char name[32];

    memset(&im, 0, sizeof(im));
    is_int(add(&im, "esm.sh", &why), 0, "first");
    is_int(add(&im, "esm.sh:443", &why), 0, "the same origin again");
    is_int(add(&im, "ESM.SH", &why), 0, "and in capitals");
    is_int(im.n, 1, "kept once");
    for (unsigned i = 1; i < SB_SHIM_MAX_IMPORT_ORIGINS; ++i) {
        snprintf(name, sizeof(name), "h%u.example", i);
        if (add(&im, name, &why) != 0)
            break;
    }
    is_int(im.n, SB_SHIM_MAX_IMPORT_ORIGINS, "up to the cap");
    why = NULL;
    is_int(add(&im, "one-more.example", &why), -1, "one more");
    is_str(why, "too many import origins", "why");
    is_int(add(&im, "h3.example", &why), 0, "an origin it has is still fine at the cap");
}

static void test_flags(void)
{
    sb_shim_imports_t im;
    const char *why = NULL;
    sb_buf_t b;

    memset(&im, 0, sizeof(im));
    (void)add(&im, "esm.sh", &why);
    (void)add(&im, "cdn.example:8443", &why);
    (void)add(&im, "[::1]:9443", &why);
    sb_buf_init(&b, 65536);
    is_int(sb_shim_imports_map(&im, &b), SB_OK, "map");
    ok(b.len == strlen("{\"imports\":{\"https://esm.sh/\":\"http://127.0.0.1:41000/\",\"https://cdn.example:8443/\":"
                       "\"http://127.0.0.1:41001/\",\"https://[::1]:9443/\":\"http://127.0.0.1:41002/\"}}") &&
           memcmp(b.base,
                  "{\"imports\":{\"https://esm.sh/\":\"http://127.0.0.1:41000/\",\"https://cdn.example:8443/\":"
                  "\"http://127.0.0.1:41001/\",\"https://[::1]:9443/\":\"http://127.0.0.1:41002/\"}}",
                  b.len) == 0,
       "the import map, origin i on port 41000 + i");
    sb_buf_free(&b);
    sb_buf_init(&b, 65536);
    is_int(sb_shim_imports_allow(&im, &b), SB_OK, "allow");
    ok(b.len == strlen("127.0.0.1:41000,127.0.0.1:41001,127.0.0.1:41002") &&
           memcmp(b.base, "127.0.0.1:41000,127.0.0.1:41001,127.0.0.1:41002", b.len) == 0,
       "--allow-import: the listeners only");
    sb_buf_free(&b);
    {
        msgpack_sbuffer sb;
        msgpack_packer pk;
        msgpack_unpacked u;
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        sb_shim_imports_pack(&im, &pk);
        msgpack_unpacked_init(&u);
        ok(msgpack_unpack_next(&u, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS && u.data.type == MSGPACK_OBJECT_MAP &&
               u.data.via.map.size == 3,
           "the init frame's imports: a map of three");
        ok(u.data.via.map.ptr[1].key.via.str.size == 22 &&
               memcmp(u.data.via.map.ptr[1].key.via.str.ptr, "http://127.0.0.1:41001", 22) == 0,
           "keyed by the listener's prefix");
        ok(u.data.via.map.ptr[1].val.via.str.size == 24 &&
               memcmp(u.data.via.map.ptr[1].val.via.str.ptr, "https://cdn.example:8443", 24) == 0,
           "to its origin");
        msgpack_unpacked_destroy(&u);
        msgpack_sbuffer_destroy(&sb);
    }
}

static void test_find(void)
{
    sb_shim_imports_t im;
    const char *why = NULL;
    size_t off = 0;
    static const struct {
        const char *url;
        int want;
        const char *path;
    } cases[] = {
        {"https://esm.sh/x.js", 0, "/x.js"},
        {"https://esm.sh:443/x.js?a=1", 0, "/x.js?a=1"},
        {"https://ESM.SH/x", 0, "/x"},
        {"https://esm.sh", 0, ""},
        {"https://cdn.example:8443/v2/m.js", 1, "/v2/m.js"},
        {"https://cdn.example/v2/m.js", -1, NULL},
        {"http://esm.sh/x.js", -1, NULL},
        {"https://esm.sh.evil/x.js", -1, NULL},
        {"https://sub.esm.sh/x.js", -1, NULL},
        {"https://esm.sh:8443/x.js", -1, NULL},
        {"https://[::1]:9443/m", 2, "/m"},
        {"https://[::2]:9443/m", -1, NULL},
        {"https://", -1, NULL},
        {"", -1, NULL},
    };

    memset(&im, 0, sizeof(im));
    (void)add(&im, "esm.sh", &why);
    (void)add(&im, "cdn.example:8443", &why);
    (void)add(&im, "[::1]:9443", &why);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        int k = sb_shim_imports_find(&im, cases[i].url, strlen(cases[i].url), &off);
        is_int(k, cases[i].want, "origin of %s", cases[i].url);
        if (k >= 0 && cases[i].path != NULL)
            is_str(cases[i].url + off, cases[i].path, "its path");
    }
}

static void request_is(const char *in, sb_status_t want, const char *target, const char *why_want)
{
    char t[SB_SHIM_MODULE_MAX_TARGET + 1] = "";
    const char *why = NULL;
    size_t hl = 0;
    sb_status_t st = sb_shim_module_parse_request((const uint8_t *)in, strlen(in), &hl, t, &why);

    char label[48];
    size_t k = 0;

    /* the request's first bytes, its line ends shown as | */
    for (const char *p = in; *p != '\0' && k < sizeof(label) - 1; ++p)
        label[k++] = *p == '\r' || *p == '\n' ? '|' : (*p < 0x20 || *p >= 0x7f ? '?' : *p);
    label[k] = '\0';
    is_int(st, want, "status for %s", label);
    if (want == SB_OK) {
        is_str(t, target, "target");
        is_int(hl, strlen(in), "the whole head");
    } else if (why_want != NULL) {
        is_str(why, why_want, "why");
    }
}

static void test_requests(void)
{
    char *big;

    request_is("GET /lib/a.js HTTP/1.1\r\nuser-agent: Deno/2.9.6\r\naccept: */*\r\nhost: 127.0.0.1:41000\r\n\r\n", SB_OK,
               "/lib/a.js", NULL);
    request_is("GET /x?y=1 HTTP/1.0\r\n\r\n", SB_OK, "/x?y=1", NULL);
    request_is("GET /x HTTP/1.1\r\nContent-Length: 0\r\n\r\n", SB_OK, "/x", NULL);
    request_is("GET /x HTTP/1.1\r\nhost: a", SB_E_AGAIN, NULL, NULL);
    request_is("", SB_E_AGAIN, NULL, NULL);
    request_is("POST /x HTTP/1.1\r\n\r\n", SB_E_BAD_ARGS, NULL, "a module request must be GET of a path");
    request_is("GET http://evil/x HTTP/1.1\r\n\r\n", SB_E_BAD_ARGS, NULL, "a module request must be GET of a path");
    request_is("GET x HTTP/1.1\r\n\r\n", SB_E_BAD_ARGS, NULL, "a module request must be GET of a path");
    request_is("GET /x HTTP/2\r\n\r\n", SB_E_BAD_ARGS, NULL, "module request line is not GET <path> HTTP/1.x");
    request_is("GET /x\tHTTP/1.1\r\n\r\n", SB_E_BAD_ARGS, NULL, "module request target holds a byte that is not visible ASCII");
    request_is("GET /\xc3\xa9 HTTP/1.1\r\n\r\n", SB_E_BAD_ARGS, NULL,
               "module request target holds a byte that is not visible ASCII");
    request_is("GET /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nabcde", SB_E_BAD_ARGS, NULL,
               "module request header is malformed or announces a body");
    request_is("GET /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", SB_E_BAD_ARGS, NULL,
               "module request header is malformed or announces a body");
    request_is("GET /x HTTP/1.1\r\nno colon\r\n\r\n", SB_E_BAD_ARGS, NULL,
               "module request header is malformed or announces a body");
    request_is("GET /x HTTP/1.1\r\nx: a\x01\r\n\r\n", SB_E_BAD_ARGS, NULL,
               "module request header is malformed or announces a body");
    /* a target at the cap, and one byte over */
    big = malloc(SB_SHIM_MODULE_MAX_HEAD + 64);
    memcpy(big, "GET /", 5);
    memset(big + 5, 'a', SB_SHIM_MODULE_MAX_TARGET - 1);
    strcpy(big + 4 + SB_SHIM_MODULE_MAX_TARGET, " HTTP/1.1\r\n\r\n");
    {
        char *want = strndup(big + 4, SB_SHIM_MODULE_MAX_TARGET);
        request_is(big, SB_OK, want, NULL);
        free(want);
    }
    memset(big + 5, 'a', SB_SHIM_MODULE_MAX_TARGET);
    strcpy(big + 5 + SB_SHIM_MODULE_MAX_TARGET, " HTTP/1.1\r\n\r\n");
    request_is(big, SB_E_TOO_LARGE, NULL, "module request target too long");
    /* a head that never ends within the cap */
    memcpy(big, "GET /x HTTP/1.1\r\n", 17);
    memset(big + 17, 'h', SB_SHIM_MODULE_MAX_HEAD);
    big[SB_SHIM_MODULE_MAX_HEAD + 17] = '\0';
    request_is(big, SB_E_TOO_LARGE, NULL, "module request head too large");
    free(big);
}

int main(void)
{
    test_entries();
    test_dedup_and_cap();
    test_flags();
    test_find();
    test_requests();
    return done_testing();
}
