/*
 * Unit tests for supervisor-shim/relay/url.c: the broker URL parser, its
 * normalisation (PROTOCOL.md section 3, "The broker URL") and the comparison
 * serve makes between bindings.url and SANDBOX_BROKER_URL.
 */
#include <string.h>
#include "tap.h"
#include "../../supervisor-shim/relay/url.c"

typedef struct st_accepted_t {
    const char *in;
    int https;
    const char *host, *host_header;
    unsigned port;
    const char *path, *query, *target;
} accepted_t;

static const accepted_t accepted[] = {
    {"http://127.0.0.1:8080/api/sandbox/rpc", 0, "127.0.0.1", "127.0.0.1:8080", 8080, "/api/sandbox/rpc", "", "/api/sandbox/rpc"},
    {"HTTP://Broker.Example/api/", 0, "broker.example", "broker.example", 80, "/api", "", "/api"},
    {"https://b.example:443", 1, "b.example", "b.example", 443, "/", "", "/"},
    {"https://b.example:8443/", 1, "b.example", "b.example:8443", 8443, "/", "", "/"},
    {"http://b/rpc?channel=canonical", 0, "b", "b", 80, "/rpc", "channel=canonical", "/rpc?channel=canonical"},
    {"http://b/rpc/?a=1&b=%2F/?", 0, "b", "b", 80, "/rpc", "a=1&b=%2F/?", "/rpc?a=1&b=%2F/?"},
    {"http://b?x", 0, "b", "b", 80, "/", "x", "/?x"},
    {"http://b/rpc?", 0, "b", "b", 80, "/rpc", "", "/rpc"},
    {"http://b/x//", 0, "b", "b", 80, "/x/", "", "/x/"},
    {"http://[::1]:9/p", 0, "::1", "[::1]:9", 9, "/p", "", "/p"},
    {"http://[::1]:80/p", 0, "::1", "[::1]", 80, "/p", "", "/p"},
};

static const struct {
    const char *in, *why;
} refused[] = {
    {"http://b/rpc#frag", "broker URL must not have a fragment"},
    {"http://b/rpc?x#", "broker URL must not have a fragment"},
    {"http://u:p@b/rpc", "broker URL must not carry userinfo"},
    {"http://u@b?x", "broker URL must not carry userinfo"},
    {"ftp://b/x", "broker URL must start with http:// or https://"},
    {"http://b/a b", "broker URL contains whitespace, control, non-ASCII or backslash characters"},
    {"http://b\\@evil/", "broker URL contains whitespace, control, non-ASCII or backslash characters"},
    {"http://b/x?a\"b", "broker URL query has invalid characters"},
    {"http://b/x?a<b", "broker URL query has invalid characters"},
    {"http://b:0/", "broker URL has an invalid port"},
    {"http:///x", "broker URL has an empty or overlong host"},
};

/* pairs that name the same broker (or not) after normalisation */
static const struct {
    const char *a, *b;
    int same;
} pairs[] = {
    {"http://127.0.0.1:8080/sandbox/rpc?channel=canonical", "HTTP://127.0.0.1:8080/sandbox/rpc/?channel=canonical", 1},
    {"http://Broker.Example/rpc", "http://broker.example:80/rpc", 1},
    {"https://b/rpc", "https://b:443/rpc/", 1},
    {"http://b", "http://b/", 1},
    {"http://b/rpc?", "http://b/rpc", 1},
    {"http://b/rpc?channel=canonical", "http://b/rpc?channel=other", 0},
    {"http://b/rpc?channel=canonical", "http://b/rpc", 0},
    {"http://b/rpc?a=1&b=2", "http://b/rpc?b=2&a=1", 0},
    {"http://b/rpc?x=%41", "http://b/rpc?x=A", 0},
    {"http://b/rpc", "https://b/rpc", 0},
    {"http://b/rpc", "http://b:8080/rpc", 0},
    {"http://b/rpc", "http://b/RPC", 0},
    {"http://b/x//", "http://b/x/", 0},
    {"http://b/rpc", "http://b.example/rpc", 0},
};

int main(void)
{
    sb_shim_url_t u, v;
    const char *why;

    for (size_t i = 0; i < sizeof(accepted) / sizeof(accepted[0]); ++i) {
        const accepted_t *w = &accepted[i];
        why = NULL;
        if (!ok(sb_shim_url_parse(w->in, &u, &why) == SB_OK, "accepted: %s", w->in)) {
            printf("#   why: %s\n", why);
            continue;
        }
        is_int(u.https, w->https, "%s: scheme", w->in);
        is_str(u.host, w->host, "%s: host", w->in);
        is_str(u.host_header, w->host_header, "%s: Host header", w->in);
        is_int(u.port, w->port, "%s: port", w->in);
        is_str(u.path, w->path, "%s: path", w->in);
        is_str(u.query, w->query, "%s: query", w->in);
        is_str(u.target, w->target, "%s: request-target", w->in);
    }
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); ++i) {
        why = NULL;
        ok(sb_shim_url_parse(refused[i].in, &u, &why) == SB_E_BAD_ARGS, "refused: %s", refused[i].in);
        is_str(why, refused[i].why, "%s: reason", refused[i].in);
    }
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); ++i) {
        int pa = sb_shim_url_parse(pairs[i].a, &u, &why) == SB_OK, pb = sb_shim_url_parse(pairs[i].b, &v, &why) == SB_OK;
        ok(pa && pb, "both parse: %s, %s", pairs[i].a, pairs[i].b);
        is_int(sb_shim_url_equal(&u, &v), pairs[i].same, "%s %s %s", pairs[i].a, pairs[i].same ? "==" : "!=", pairs[i].b);
        is_int(sb_shim_url_equal(&v, &u), pairs[i].same, "symmetric: %s, %s", pairs[i].b, pairs[i].a);
    }
    {
        /* a query of exactly the cap parses; one byte more does not */
        char big[64 + SB_SHIM_MAX_URL_QUERY + 2];
        size_t n = (size_t)snprintf(big, sizeof(big), "http://b/p?");
        memset(big + n, 'q', SB_SHIM_MAX_URL_QUERY);
        big[n + SB_SHIM_MAX_URL_QUERY] = '\0';
        ok(sb_shim_url_parse(big, &u, &why) == SB_OK && strlen(u.query) == SB_SHIM_MAX_URL_QUERY, "query at its cap");
        big[n + SB_SHIM_MAX_URL_QUERY] = 'q';
        big[n + SB_SHIM_MAX_URL_QUERY + 1] = '\0';
        ok(sb_shim_url_parse(big, &u, &why) == SB_E_BAD_ARGS, "query above its cap");
        is_str(why, "broker URL query is too long", "reason");
    }
    return done_testing();
}
