/*
 * Unit tests for broker/call/url.c: the strict http.fetch URL parser and
 * redirect resolution (issue 4, "URL parsing").
 */
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "sb/limits.h"
#include "call/url.h"

typedef struct st_want_t {
    const char *url;
    sb_url_scheme_t scheme;
    sb_url_host_kind_t kind;
    const char *host;
    unsigned port;
    int port_explicit;
    const char *target;
} want_t;

#define H SB_URL_HTTP
#define S SB_URL_HTTPS
#define NAME SB_URL_HOST_NAME
#define V4 SB_URL_HOST_IPV4
#define V6 SB_URL_HOST_IPV6

static const want_t accepted[] = {
    {"http://example.com", H, NAME, "example.com", 80, 0, "/"},
    {"https://example.com", S, NAME, "example.com", 443, 0, "/"},
    {"HTTPS://Example.COM/Path?Q=1#frag", S, NAME, "example.com", 443, 0, "/Path?Q=1"},
    {"hTtP://example.com:8080/a", H, NAME, "example.com", 8080, 1, "/a"},
    {"https://example.com:443/", S, NAME, "example.com", 443, 1, "/"},
    {"http://example.com:65535/", H, NAME, "example.com", 65535, 1, "/"},
    {"http://example.com:1/", H, NAME, "example.com", 1, 1, "/"},
    {"http://example.com:00080/", H, NAME, "example.com", 80, 1, "/"},
    {"http://example.com./", H, NAME, "example.com", 80, 0, "/"},
    {"http://localhost./", H, NAME, "localhost", 80, 0, "/"},
    {"http://a-b.c-d.e/", H, NAME, "a-b.c-d.e", 80, 0, "/"},
    {"http://ab--cd.example/", H, NAME, "ab--cd.example", 80, 0, "/"},
    {"http://123.example/", H, NAME, "123.example", 80, 0, "/"},
    {"http://example.123a/", H, NAME, "example.123a", 80, 0, "/"},
    {"http://0x.example/", H, NAME, "0x.example", 80, 0, "/"},
    {"http://127.0.0.1/", H, V4, "127.0.0.1", 80, 0, "/"},
    {"http://127.0.0.1./x", H, V4, "127.0.0.1", 80, 0, "/x"},
    {"http://0.0.0.0:8080/", H, V4, "0.0.0.0", 8080, 1, "/"},
    {"http://255.255.255.255/", H, V4, "255.255.255.255", 80, 0, "/"},
    {"http://10.20.30.40/", H, V4, "10.20.30.40", 80, 0, "/"},
    {"http://[::1]/", H, V6, "::1", 80, 0, "/"},
    {"http://[::1]:8080", H, V6, "::1", 8080, 1, "/"},
    {"https://[2001:DB8::1]:8443/x", S, V6, "2001:db8::1", 8443, 1, "/x"},
    {"http://[0:0:0:0:0:0:0:1]/", H, V6, "::1", 80, 0, "/"},
    {"http://[::ffff:127.0.0.1]/", H, V6, "::ffff:127.0.0.1", 80, 0, "/"},
    {"http://[::ffff:7f00:1]/", H, V6, "::ffff:127.0.0.1", 80, 0, "/"},
    {"http://[64:ff9b::7f00:1]/", H, V6, "64:ff9b::7f00:1", 80, 0, "/"},
    /* IDN: UTS#46 non-transitional, result re-parsed */
    {"http://bücher.de/", H, NAME, "xn--bcher-kva.de", 80, 0, "/"},
    {"http://BÜCHER.DE/", H, NAME, "xn--bcher-kva.de", 80, 0, "/"},
    {"http://xn--bcher-kva.de/", H, NAME, "xn--bcher-kva.de", 80, 0, "/"},
    {"http://XN--BCHER-KVA.de/", H, NAME, "xn--bcher-kva.de", 80, 0, "/"},
    {"http://faß.de/", H, NAME, "xn--fa-hia.de", 80, 0, "/"},
    {"http://ｅｘａｍｐｌｅ.com/", H, NAME, "example.com", 80, 0, "/"},
    {"http://example.com。/", H, NAME, "example.com", 80, 0, "/"},
    {"http://１２７.０.０.１/", H, V4, "127.0.0.1", 80, 0, "/"},
    /* target: origin-form, fragment dropped, dot segments removed, unsafe bytes encoded */
    {"http://example.com?x=1", H, NAME, "example.com", 80, 0, "/?x=1"},
    {"http://example.com#top", H, NAME, "example.com", 80, 0, "/"},
    {"http://example.com/#", H, NAME, "example.com", 80, 0, "/"},
    {"http://example.com/a?b#c?d", H, NAME, "example.com", 80, 0, "/a?b"},
    {"http://example.com/a/../b/./c", H, NAME, "example.com", 80, 0, "/b/c"},
    {"http://example.com/a/b/..", H, NAME, "example.com", 80, 0, "/a/"},
    {"http://example.com/a/b/.", H, NAME, "example.com", 80, 0, "/a/b/"},
    {"http://example.com/..", H, NAME, "example.com", 80, 0, "/"},
    {"http://example.com/../../x", H, NAME, "example.com", 80, 0, "/x"},
    {"http://example.com/a//b", H, NAME, "example.com", 80, 0, "/a//b"},
    {"http://example.com/a/..b/.c", H, NAME, "example.com", 80, 0, "/a/..b/.c"},
    {"http://example.com/?a=/../b", H, NAME, "example.com", 80, 0, "/?a=/../b"},
    {"http://example.com/%2e%2e/x", H, NAME, "example.com", 80, 0, "/%2e%2e/x"},
    {"http://example.com/é?é", H, NAME, "example.com", 80, 0, "/%C3%A9?%C3%A9"},
    {"http://example.com/a\"b<c>`{}", H, NAME, "example.com", 80, 0, "/a%22b%3Cc%3E%60%7B%7D"},
    {"http://example.com/100%", H, NAME, "example.com", 80, 0, "/100%"},
};

static const struct {
    const char *url;
    const char *why;
} reject[] = {
    {"", "empty URL"},
    /* schemes */
    {"ftp://example.com/", "unsupported scheme"},
    {"file:///etc/passwd", "unsupported scheme"},
    {"javascript:alert(1)", "unsupported scheme"},
    {"data:text/plain,x", "unsupported scheme"},
    {"httpx://example.com/", "unsupported scheme"},
    {"example.com/a", "not an absolute URL"},
    {"//example.com/", "not an absolute URL"},
    {"/path", "not an absolute URL"},
    {"1http://x/", "not an absolute URL"},
    {"http", "not an absolute URL"},
    {":", "not an absolute URL"},
    {"http:example.com", "missing \"//\" after the scheme"},
    {"http:/example.com", "missing \"//\" after the scheme"},
    {"http:", "missing \"//\" after the scheme"},
    /* userinfo */
    {"http://user@example.com/", "userinfo is not allowed"},
    {"http://user:pass@example.com/", "userinfo is not allowed"},
    {"http://example.com@evil.example/", "userinfo is not allowed"},
    {"http://@example.com/", "userinfo is not allowed"},
    /* backslash, whitespace, control */
    {"http://a\\b.com/", "backslash is not allowed"},
    {"http:\\\\example.com", "backslash is not allowed"},
    {"http://example.com\\@evil.example/", "backslash is not allowed"},
    {"http://example.com/a\\b", "backslash is not allowed"},
    {"http://exa mple.com/", "control character or whitespace"},
    {" http://example.com/", "control character or whitespace"},
    {"http://example.com/ ", "control character or whitespace"},
    {"http://example.com/\t", "control character or whitespace"},
    {"http://exam\tple.com/", "control character or whitespace"},
    {"http://example.com/a\nb", "control character or whitespace"},
    {"http://example.com/\r", "control character or whitespace"},
    {"http://example.com/\x7f", "control character or whitespace"},
    {"http://example.com/\x01", "control character or whitespace"},
    {"http://example.com/#\x1f", "control character or whitespace"},
    /* empty host */
    {"http:///a", "empty host"},
    {"http://", "empty host"},
    {"http://:80/", "empty host"},
    {"http://./", "empty host"},
    {"http://?x", "empty host"},
    {"http://#x", "empty host"},
    {"http://::1/", "empty host"},
    /* percent-encoded host */
    {"http://%31%32%37.0.0.1/", "percent-encoded host is not allowed"},
    {"http://exa%6Dple.com/", "percent-encoded host is not allowed"},
    {"http://example.com%2F@x/", "userinfo is not allowed"},
    {"http://example.com%00/", "percent-encoded host is not allowed"},
    /* IPv6 */
    {"http://[fe80::1%25eth0]/", "zone id is not allowed"},
    {"http://[fe80::1%eth0]/", "zone id is not allowed"},
    {"http://[fe80::1%/", "zone id is not allowed"},
    {"http://[::1/", "invalid IPv6 literal"},
    {"http://[::g]/", "invalid IPv6 literal"},
    {"http://[1.2.3.4]/", "invalid IPv6 literal"},
    {"http://[]/", "invalid IPv6 literal"},
    {"http://[::1]x/", "invalid IPv6 literal"},
    {"http://[::1]]/", "invalid IPv6 literal"},
    {"http://[1:2:3:4:5:6:7:8:9]/", "invalid IPv6 literal"},
    {"http://[v1.fe]/", "invalid IPv6 literal"},
    {"http://[0000:0000:0000:0000:0000:0000:0000:0000:1]/", "invalid IPv6 literal"},
    {"http://a[b]/", "invalid host name"},
    {"http://a]b/", "invalid host name"},
    /* ports */
    {"http://example.com:/", "invalid port"},
    {"http://example.com:0/", "invalid port"},
    {"http://example.com:65536/", "invalid port"},
    {"http://example.com:123456/", "invalid port"},
    {"http://example.com:80a/", "invalid port"},
    {"http://example.com:-1/", "invalid port"},
    {"http://example.com:+80/", "invalid port"},
    {"http://example.com:80:80/", "invalid port"},
    {"http://example.com:0x50/", "invalid port"},
    {"http://[::1]:/", "invalid port"},
    {"http://[::1]:99999/", "invalid port"},
    {"http://[::1]:0/", "invalid port"},
    /* numeric hosts other than the canonical dotted quad */
    {"http://2130706433/", "non-canonical IPv4 address"},
    {"http://0x7f.1/", "non-canonical IPv4 address"},
    {"http://0x7f000001/", "non-canonical IPv4 address"},
    {"http://0X7F000001/", "non-canonical IPv4 address"},
    {"http://0177.0.0.1/", "non-canonical IPv4 address"},
    {"http://127.0.0.01/", "non-canonical IPv4 address"},
    {"http://127.00.0.1/", "non-canonical IPv4 address"},
    {"http://127.1/", "non-canonical IPv4 address"},
    {"http://127.0.1/", "non-canonical IPv4 address"},
    {"http://256.0.0.1/", "non-canonical IPv4 address"},
    {"http://1.2.3.256/", "non-canonical IPv4 address"},
    {"http://1.2.3.4.5/", "non-canonical IPv4 address"},
    {"http://1.2.3.0x4/", "non-canonical IPv4 address"},
    {"http://0x7f.0.0.1/", "non-canonical IPv4 address"},
    {"http://017700000001/", "non-canonical IPv4 address"},
    {"http://4294967296/", "non-canonical IPv4 address"},
    {"http://1/", "non-canonical IPv4 address"},
    {"http://0/", "non-canonical IPv4 address"},
    {"http://0x/", "non-canonical IPv4 address"},
    {"http://example.1/", "non-canonical IPv4 address"},
    {"http://example.0x10/", "non-canonical IPv4 address"},
    {"http://.1.2.3.4/", "non-canonical IPv4 address"},
    {"http://1..2.3.4/", "non-canonical IPv4 address"},
    {"http://1.2.3.4../", "invalid host name"},
    {"http://１２７.１/", "non-canonical IPv4 address"},
    {"http://０x7f.0.0.1/", "non-canonical IPv4 address"},
    /* host names */
    {"http://a_b.example/", "invalid host name"},
    {"http://-a.example/", "invalid host name"},
    {"http://a-.example/", "invalid host name"},
    {"http://a..b/", "invalid host name"},
    {"http://.example.com/", "invalid host name"},
    {"http://example.com../", "invalid host name"},
    {"http://*.example.com/", "invalid host name"},
    {"http://exa!mple.com/", "invalid host name"},
    {"http://exa\"mple.com/", "invalid host name"},
    {"http://a／b.example/", "invalid host name"},
    {"http://a％41.example/", "invalid host name"},
    {"http://a：80.example/", "invalid host name"},
    /* IDN failures */
    {"http://xn--zz.example/", "invalid internationalised host name"},
    {"http://xn--a.example/", "invalid internationalised host name"},
    {"http://\xff.example/", "invalid internationalised host name"},
    {"http://\xc3.example/", "invalid internationalised host name"},
    {"http://a\xc2\xad"
     "b\xe2\x80\x8b-.example/",
     "invalid internationalised host name"},
};

static void check_accept(const want_t *w)
{
    sb_url_t u;
    const char *why = "(unset)";
    sb_status_t st = sb_url_parse(w->url, strlen(w->url), &u, &why);

    is_int(st, SB_OK, "accept %s", w->url);
    if (st != SB_OK) {
        printf("#   why: %s\n", why);
        return;
    }
    is_int(u.scheme, w->scheme, "  scheme");
    is_int(u.host_kind, w->kind, "  host kind");
    is_str(u.host, w->host, "  host");
    is_int(u.host_len, strlen(w->host), "  host_len");
    is_int(u.port, w->port, "  port");
    is_int(u.port_explicit, w->port_explicit, "  port_explicit");
    is_str(u.target, w->target, "  target");
    is_int(u.target_len, strlen(w->target), "  target_len");
    if (w->kind == V4) {
        char buf[INET_ADDRSTRLEN];
        is_str(inet_ntop(AF_INET, &u.addr.v4, buf, sizeof(buf)), w->host, "  numeric IPv4 address");
    } else if (w->kind == V6) {
        struct in6_addr a;
        ok(inet_pton(AF_INET6, w->host, &a) == 1 && memcmp(&a, &u.addr.v6, sizeof(a)) == 0, "  numeric IPv6 address");
    }
}

static void test_parse(void)
{
    size_t i;

    for (i = 0; i != sizeof(accepted) / sizeof(accepted[0]); ++i)
        check_accept(&accepted[i]);
    for (i = 0; i != sizeof(reject) / sizeof(reject[0]); ++i) {
        sb_url_t u;
        const char *why = NULL;
        is_int(sb_url_parse(reject[i].url, strlen(reject[i].url), &u, &why), SB_E_BAD_ARGS, "reject %s", reject[i].url);
        is_str(why, reject[i].why, "  why");
    }
}

static void test_bytes(void)
{
    sb_url_t u;
    const char *why = NULL;
    char *big;
    size_t n;

    /* embedded NUL (the length is authoritative) */
    is_int(sb_url_parse("http://example.com\0.evil/", 25, &u, &why), SB_E_BAD_ARGS, "embedded NUL refused");
    is_str(why, "control character or whitespace", "  why");
    is_int(sb_url_parse("http://example.comXXX", 18, &u, &why), SB_OK, "length bounds the string");
    is_str(u.host, "example.com", "  host");
    is_int(sb_url_parse(NULL, 0, &u, &why), SB_E_BAD_ARGS, "NULL refused");
    is_str(why, "empty URL", "  why");
    is_int(sb_url_parse("ftp://x/", 8, &u, NULL), SB_E_BAD_ARGS, "why may be NULL");

    /* host lengths: labels up to 63, names up to 253 */
    big = malloc(SB_MAX_URL + 64);
    n = (size_t)snprintf(big, SB_MAX_URL, "http://%.*s.example/", 63,
                         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    is_int(sb_url_parse(big, n, &u, &why), SB_OK, "63-byte label accepted");
    n = (size_t)snprintf(big, SB_MAX_URL, "http://%.*s.example/", 64,
                         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    is_int(sb_url_parse(big, n, &u, &why), SB_E_BAD_ARGS, "64-byte label refused");
    is_str(why, "invalid host name", "  why");
    /* three labels of 63 plus their dots (192 bytes) and one of 61: 253 */
    memcpy(big, "http://", 7);
    n = 7;
    for (int i = 0; i != 3; ++i) {
        memset(big + n, 'a' + i, 63);
        n += 63;
        big[n++] = '.';
    }
    memset(big + n, 'd', 61);
    n += 61;
    memcpy(big + n, "/", 1);
    is_int(sb_url_parse(big, n + 1, &u, &why), SB_OK, "253-byte host accepted");
    is_int(u.host_len, 253, "  host_len 253");
    memcpy(big + n, "./", 2);
    is_int(sb_url_parse(big, n + 2, &u, &why), SB_OK, "253-byte host with a trailing dot accepted");
    memcpy(big + n, "d/", 2);
    is_int(sb_url_parse(big, n + 2, &u, &why), SB_E_BAD_ARGS, "254-byte host refused");
    is_str(why, "host name is too long", "  why");
    memset(big + 7, 'a', 2000);
    memcpy(big + 2007, "/", 1);
    is_int(sb_url_parse(big, 2008, &u, &why), SB_E_BAD_ARGS, "2000-byte host refused");
    is_str(why, "host name is too long", "  why");

    /* whole-URL and target caps */
    memcpy(big, "http://example.com/", 19);
    memset(big + 19, 'p', SB_MAX_URL - 19);
    is_int(sb_url_parse(big, SB_MAX_URL, &u, &why), SB_OK, "SB_MAX_URL bytes accepted");
    is_int(u.target_len, SB_MAX_URL - 18, "  target length");
    big[SB_MAX_URL] = 'p';
    is_int(sb_url_parse(big, SB_MAX_URL + 1, &u, &why), SB_E_BAD_ARGS, "SB_MAX_URL + 1 bytes refused");
    is_str(why, "URL is too long", "  why");
    /* percent-encoding can grow the target past its buffer */
    memcpy(big, "http://example.com/", 19);
    n = 19;
    while (n + 2 <= SB_MAX_URL) {
        memcpy(big + n, "\xc3\xa9", 2);
        n += 2;
    }
    is_int(sb_url_parse(big, n, &u, &why), SB_E_BAD_ARGS, "target that outgrows SB_MAX_URL when encoded refused");
    is_str(why, "URL is too long", "  why");
    free(big);
}

static void test_resolve(void)
{
    static const struct {
        const char *base, *ref;
        const char *want; /* "scheme://host:port target" or "!why" */
    } cases[] = {
        {"https://example.com:8443/a/b/c?q=1", "https://other.example/x", "https://other.example:443/x"},
        {"https://example.com:8443/a/b/c?q=1", "HTTP://other.example", "http://other.example:80/"},
        {"https://example.com:8443/a/b/c?q=1", "//other.example/x", "https://other.example:443/x"},
        {"http://example.com/a", "//other.example:81", "http://other.example:81/"},
        {"https://example.com:8443/a/b/c?q=1", "/x/y", "https://example.com:8443/x/y"},
        {"https://example.com:8443/a/b/c?q=1", "/x/../y", "https://example.com:8443/y"},
        {"https://example.com:8443/a/b/c?q=1", "?z=2", "https://example.com:8443/a/b/c?z=2"},
        {"https://example.com:8443/a/b/c?q=1", "d", "https://example.com:8443/a/b/d"},
        {"https://example.com:8443/a/b/c?q=1", "d?e#f", "https://example.com:8443/a/b/d?e"},
        {"https://example.com:8443/a/b/c?q=1", "./d", "https://example.com:8443/a/b/d"},
        {"https://example.com:8443/a/b/c?q=1", "../d", "https://example.com:8443/a/d"},
        {"https://example.com:8443/a/b/c?q=1", "../../../../d", "https://example.com:8443/d"},
        {"https://example.com:8443/a/b/c?q=1", "./", "https://example.com:8443/a/b/"},
        {"https://example.com:8443/a/b/c?q=1", "..", "https://example.com:8443/a/"},
        {"https://example.com:8443/a/b/c?q=1", "", "https://example.com:8443/a/b/c?q=1"},
        {"https://example.com:8443/a/b/c?q=1", "#frag", "https://example.com:8443/a/b/c?q=1"},
        {"https://example.com/a/b/", "c", "https://example.com:443/a/b/c"},
        {"https://example.com/", "c", "https://example.com:443/c"},
        {"http://[::1]:8080/a", "b", "http://::1:8080/b"},
        {"http://[::1]/a", "//[2001:db8::2]/x", "http://2001:db8::2:80/x"},
        {"http://127.0.0.1/a", "b?c", "http://127.0.0.1:80/b?c"},
        /* refusals come from the same parser */
        {"https://example.com/", "ftp://x/", "!unsupported scheme"},
        {"https://example.com/", "javascript:alert(1)", "!unsupported scheme"},
        {"https://example.com/", "g:h", "!unsupported scheme"},
        {"https://example.com/", "http:foo", "!missing \"//\" after the scheme"},
        {"https://example.com/", "//user@evil.example/", "!userinfo is not allowed"},
        {"https://example.com/", "\\\\evil.example", "!backslash is not allowed"},
        {"https://example.com/", "/\\evil.example", "!backslash is not allowed"},
        {"https://example.com/", "//127.1/", "!non-canonical IPv4 address"},
        {"https://example.com/", "//[fe80::1%25lo]/", "!zone id is not allowed"},
        {"https://example.com/", "// evil.example", "!control character or whitespace"},
        {"https://example.com/", "///x", "!empty host"},
        {"https://example.com/", " /x", "!control character or whitespace"},
    };
    size_t i;

    for (i = 0; i != sizeof(cases) / sizeof(cases[0]); ++i) {
        sb_url_t base, out;
        const char *why = NULL;
        sb_status_t st;
        if (sb_url_parse(cases[i].base, strlen(cases[i].base), &base, &why) != SB_OK) {
            ok(0, "base %s parses", cases[i].base);
            continue;
        }
        st = sb_url_resolve(&base, cases[i].ref, strlen(cases[i].ref), &out, &why);
        if (cases[i].want[0] == '!') {
            is_int(st, SB_E_BAD_ARGS, "resolve \"%s\" against %s is refused", cases[i].ref, cases[i].base);
            is_str(why, cases[i].want + 1, "  why");
        } else {
            char got[SB_MAX_URL + 400];
            is_int(st, SB_OK, "resolve \"%s\" against %s", cases[i].ref, cases[i].base);
            if (st != SB_OK) {
                printf("#   why: %s\n", why);
                continue;
            }
            snprintf(got, sizeof(got), "%s://%s:%u%s", out.scheme == SB_URL_HTTPS ? "https" : "http", out.host, (unsigned)out.port,
                     out.target);
            is_str(got, cases[i].want, "  result");
        }
    }

    {
        sb_url_t base, out;
        const char *why = NULL;
        char *big = malloc(SB_MAX_URL + 2);
        if (sb_url_parse("http://example.com/", 19, &base, &why) != SB_OK)
            ok(0, "base");
        memset(big, 'a', SB_MAX_URL + 1);
        is_int(sb_url_resolve(&base, big, SB_MAX_URL + 1, &out, &why), SB_E_BAD_ARGS, "over-long reference refused");
        is_str(why, "URL is too long", "  why");
        is_int(sb_url_resolve(&base, big, SB_MAX_URL - 10, &out, &why), SB_E_BAD_ARGS, "composed URL over the cap refused");
        is_str(why, "URL is too long", "  why");
        is_int(sb_url_resolve(&base, NULL, 0, &out, &why), SB_OK, "NULL reference is the base");
        is_str(out.target, "/", "  target");
        free(big);
    }
}

static void test_format(void)
{
    static const struct {
        const char *url, *hostport, *host_header;
    } cases[] = {
        {"http://Example.com/", "example.com:80", "example.com"},
        {"https://example.com/", "example.com:443", "example.com"},
        {"https://example.com:443/", "example.com:443", "example.com"},
        {"http://example.com:8080/", "example.com:8080", "example.com:8080"},
        {"https://example.com:80/", "example.com:80", "example.com:80"},
        {"http://[::1]/", "[::1]:80", "[::1]"},
        {"http://[::1]:8080/", "[::1]:8080", "[::1]:8080"},
        {"http://1.2.3.4:81/", "1.2.3.4:81", "1.2.3.4:81"},
    };
    size_t i;

    for (i = 0; i != sizeof(cases) / sizeof(cases[0]); ++i) {
        sb_url_t u;
        char buf[300];
        const char *why;
        if (sb_url_parse(cases[i].url, strlen(cases[i].url), &u, &why) != SB_OK) {
            ok(0, "parse %s", cases[i].url);
            continue;
        }
        is_int(sb_url_hostport(&u, buf, sizeof(buf)), strlen(cases[i].hostport), "hostport length of %s", cases[i].url);
        is_str(buf, cases[i].hostport, "hostport of %s", cases[i].url);
        is_int(sb_url_host_header(&u, buf, sizeof(buf)), strlen(cases[i].host_header), "Host length of %s", cases[i].url);
        is_str(buf, cases[i].host_header, "Host of %s", cases[i].url);
    }
    {
        sb_url_t u;
        char buf[6];
        const char *why;
        if (sb_url_parse("http://example.com/", 19, &u, &why) != SB_OK)
            ok(0, "parse");
        is_int(sb_url_hostport(&u, buf, sizeof(buf)), 5, "hostport truncates");
        is_str(buf, "examp", "  truncated output");
    }
}

int main(void)
{
    test_parse();
    test_bytes();
    test_resolve();
    test_format();
    return done_testing();
}
