/*
 * broker/authz: the capability manifest (authz.h, sb_manifest_*).
 *
 * Schema: upstream's ExecutorCapabilities (PROTOCOL.md section 5) plus a
 * tools axis. Every key is optional and an omitted axis grants nothing. The
 * parse is strict because a manifest the host thinks means one thing and we
 * read as another is a privilege bug: unknown keys, wrong types, unknown
 * verbs, unsafe globs and malformed net entries are mint-time errors that
 * name the offending path.
 *
 * The parse builds a tree of our own copies (no jansson reference survives
 * the parse), then packs it into one pointer-free allocation (see "the packed
 * form" below) and interns it: identical manifests are one shared,
 * reference-counted object. It is immutable afterwards, so one manifest may be
 * read from every worker thread. Names are compared as exact bytes over
 * our own entries only: "__proto__", "constructor" or "toString" are ordinary
 * names that grant something only when the manifest literally lists them
 * (upstream needed hasOwnProperty for that; we have no prototype chain).
 *
 * check.c reads the parsed form through the sb_manifest__* accessors at the
 * bottom of this file (declared once, in manifest_int.h).
 */
#include <arpa/inet.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sb/limits.h"
#include "sb/mem.h"
#include "authz/manifest_int.h"
#include "call/path.h"
#include "call/url.h"
#include "util/util.h"

#define MAX_NAME_LEN SB_MAX_NAME
#define MAX_TIMEOUT_MS 86400000
#define MIN_MEMORY_MB 16
#define MAX_MEMORY_MB 65536
/* how much of an offending key or value an error message quotes */
#define MAX_QUOTE 64u

#define VERB_BIT(op) SB_MANIFEST_VERB_BIT(op)

typedef struct st_mstr_t {
    char *p; /* NUL-terminated copy; len excludes the NUL */
    size_t len;
} mstr_t;

typedef struct st_mlist_t {
    mstr_t *v;
    size_t n;
} mlist_t;

typedef struct st_grant_t {
    mstr_t name;
    unsigned verbs; /* VERB_BIT(SB_OP_READ) | ... */
} grant_t;

typedef struct st_grants_t {
    grant_t *v;
    size_t n;
} grants_t;

typedef sb_net_entry_t net_entry_t;

typedef struct st_netlist_t {
    net_entry_t *v;
    size_t n;
} netlist_t;

/* the parse tree: what the parse builds before it is packed (and freed) */
typedef struct st_mtree_t {
    netlist_t net, import;
    mlist_t files_read, files_write; /* normalised globs */
    grants_t collections, globals, stores;
    mlist_t services, jobs, workflows;
    mlist_t tools;          /* globs over tool names */
    mlist_t secrets;        /* the target secrets the run receives, by name */
    mlist_t decide_methods; /* decide.methods: method patterns whose calls need the decider's allow */
    netlist_t decide_fetch; /* decide.fetch: http.fetch requests (net entry grammar) that need it */
    int64_t timeout_ms, memory_mb;
} mtree_t;

typedef enum en_list_kind_t { LIST_NAMES, LIST_FILE_GLOBS, LIST_TOOL_GLOBS, LIST_SECRET_NAMES, LIST_METHOD_PATTERNS } list_kind_t;

/* ---- small helpers ------------------------------------------------------------------------------------------------- */

/* the parsers' error exit and quoting, shared (util.h) */
#define fail(...) sb_fail_bad_args(__VA_ARGS__)
#define quote(s, len, buf, bufsz) sb_quote_printable((s), (len), MAX_QUOTE, (buf), (bufsz))

static int key_is(const char *key, size_t klen, const char *lit)
{
    size_t n = strlen(lit);
    return klen == n && memcmp(key, lit, n) == 0;
}

static int is_name_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static int is_name(const char *s, size_t len)
{
    size_t i;

    if (len == 0 || len > MAX_NAME_LEN)
        return 0;
    for (i = 0; i != len; ++i)
        if (!is_name_char((unsigned char)s[i]))
            return 0;
    return 1;
}

static int is_tool_glob(const char *s, size_t len)
{
    size_t i;

    if (len == 0)
        return 0;
    for (i = 0; i != len; ++i) {
        unsigned char c = (unsigned char)s[i];
        if (!(is_name_char(c) || c == '.' || c == '*' || c == '?'))
            return 0;
    }
    return 1;
}

/*
 * A decide method pattern: the segments of a method (sb/method.h), any of
 * which but the first may be "*" (exactly one whole segment). The first
 * segment names the family literally, and the pattern must be able to match
 * at least one method the grammar accepts: a typo that can never match would
 * silently leave the calls it meant to hold ungated, so it is a mint error.
 */
#define PATTERN_MAX_SEGMENTS 3
static const char *const pattern_fill[] = {"x", "enqueue", "trigger"};

static int pattern_instance_parses(const char *const *seg, const size_t *seglen, size_t nseg, size_t at, char *buf)
{
    size_t o = 0;
    sb_method_t m;

    if (at == nseg) {
        for (size_t i = 0; i != nseg; ++i) {
            if (i != 0)
                buf[o++] = '.';
            memcpy(buf + o, seg[i], seglen[i]);
            o += seglen[i];
        }
        return sb_method_parse(buf, o, &m) == SB_OK;
    }
    if (!(seglen[at] == 1 && seg[at][0] == '*'))
        return pattern_instance_parses(seg, seglen, nseg, at + 1, buf);
    {
        const char *const *s2 = seg;
        const char *fill[PATTERN_MAX_SEGMENTS];
        size_t len2[PATTERN_MAX_SEGMENTS];
        int ok = 0;
        memcpy(fill, s2, nseg * sizeof(*fill));
        memcpy(len2, seglen, nseg * sizeof(*len2));
        for (size_t f = 0; !ok && f != sizeof(pattern_fill) / sizeof(pattern_fill[0]) + SB_OP_COUNT_; ++f) {
            fill[at] = f < sizeof(pattern_fill) / sizeof(pattern_fill[0])
                           ? pattern_fill[f]
                           : sb_method_op_name((sb_method_op_t)(f - sizeof(pattern_fill) / sizeof(pattern_fill[0])));
            len2[at] = strlen(fill[at]);
            ok = pattern_instance_parses(fill, len2, nseg, at + 1, buf);
        }
        return ok;
    }
}

static const char *check_method_pattern(const char *s, size_t len)
{
    const char *seg[PATTERN_MAX_SEGMENTS];
    size_t seglen[PATTERN_MAX_SEGMENTS], nseg = 0, start = 0;
    char buf[SB_MAX_METHOD_LEN + 64];

    if (len == 0 || len > SB_MAX_METHOD_LEN)
        return "expected a method pattern of at most 256 bytes";
    for (size_t i = 0; i <= len; ++i) {
        if (i != len && s[i] != '.')
            continue;
        if (nseg == PATTERN_MAX_SEGMENTS)
            return "a method has at most 3 segments";
        seg[nseg] = s + start;
        seglen[nseg] = i - start;
        if (!(seglen[nseg] == 1 && s[start] == '*') && !is_name(s + start, seglen[nseg]))
            return "each segment is a name or \"*\"";
        ++nseg;
        start = i + 1;
    }
    if (seglen[0] == 1 && seg[0][0] == '*')
        return "the first segment names the method family";
    if (!pattern_instance_parses(seg, seglen, nseg, 0, buf))
        return "matches no method";
    return NULL;
}

static char ascii_lower(char c)
{
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

static sb_status_t copy_str(mstr_t *dst, const char *s, size_t len)
{
    if ((dst->p = sb_mem_try_alloc(len + 1)) == NULL)
        return SB_E_NOMEM;
    memcpy(dst->p, s, len);
    dst->p[len] = '\0';
    dst->len = len;
    return SB_OK;
}

/* array checks shared by every list: type, then the entry cap before anything is allocated */
static sb_status_t check_array(const json_t *v, const char *path, char *err, size_t errsz)
{
    if (!json_is_array(v))
        return fail(err, errsz, "%s: must be an array", path);
    if (json_array_size(v) > SB_MAX_MANIFEST_ENTRIES)
        return fail(err, errsz, "%s: too many entries (max %u)", path, SB_MAX_MANIFEST_ENTRIES);
    return SB_OK;
}

/* element i must be a string of at most SB_MAX_MANIFEST_STRING bytes */
static sb_status_t array_string(const json_t *v, size_t i, const char *path, const char **s, size_t *len, char *err, size_t errsz)
{
    const json_t *e = json_array_get(v, i);

    if (!json_is_string(e))
        return fail(err, errsz, "%s[%zu]: must be a string", path, i);
    *s = json_string_value(e);
    *len = json_string_length(e);
    if (*len > SB_MAX_MANIFEST_STRING)
        return fail(err, errsz, "%s[%zu]: string is too long (max %u bytes)", path, i, SB_MAX_MANIFEST_STRING);
    return SB_OK;
}

/* ---- lists of names and globs -------------------------------------------------------------------------------------- */

static sb_status_t parse_list(const json_t *v, const char *path, list_kind_t kind, mlist_t *out, char *err, size_t errsz)
{
    size_t i, n;
    sb_status_t st;

    if ((st = check_array(v, path, err, errsz)) != SB_OK)
        return st;
    if ((n = json_array_size(v)) == 0)
        return SB_OK;
    if ((out->v = sb_mem_try_calloc(n, sizeof(*out->v))) == NULL)
        return SB_E_NOMEM;
    for (i = 0; i != n; ++i) {
        const char *s;
        size_t len;
        char norm[SB_MAX_MANIFEST_STRING + 1];
        if ((st = array_string(v, i, path, &s, &len, err, errsz)) != SB_OK)
            return st;
        switch (kind) {
        case LIST_NAMES:
            if (!is_name(s, len))
                return fail(err, errsz, "%s[%zu]: invalid name", path, i);
            break;
        case LIST_TOOL_GLOBS:
            if (!is_tool_glob(s, len))
                return fail(err, errsz, "%s[%zu]: invalid tool glob", path, i);
            break;
        case LIST_SECRET_NAMES:
            if (!sb_manifest__is_secret_name(s, len))
                return fail(err, errsz, "%s[%zu]: expected a secret name of [A-Za-z0-9_.-]{1,64}", path, i);
            break;
        case LIST_METHOD_PATTERNS: {
            const char *why = check_method_pattern(s, len);
            if (why != NULL)
                return fail(err, errsz, "%s[%zu]: invalid method pattern: %s", path, i, why);
            break;
        }
        case LIST_FILE_GLOBS:
            /* a glob is normalised like a path (section 4.2); one that is not safe is refused at mint */
            if (sb_path_normalize(s, len, norm, sizeof(norm)) != SB_OK)
                return fail(err, errsz, "%s[%zu]: unsafe glob", path, i);
            s = norm;
            len = strlen(norm);
            break;
        }
        if ((st = copy_str(&out->v[out->n], s, len)) != SB_OK)
            return st;
        ++out->n;
    }
    return SB_OK;
}

/* ---- net and import entries ---------------------------------------------------------------------------------------- */

static int parse_entry_port(const char *p, size_t n, uint16_t *port)
{
    unsigned v = 0;
    size_t i;

    if (n == 0 || n > 5)
        return 0;
    for (i = 0; i != n; ++i) {
        if (p[i] < '0' || p[i] > '9')
            return 0;
        v = v * 10 + (unsigned)(p[i] - '0');
    }
    if (v == 0 || v > 65535)
        return 0;
    *port = (uint16_t)v;
    return 1;
}

static int parse_entry_v6(const char *p, size_t n, net_entry_t *e)
{
    char buf[INET6_ADDRSTRLEN];

    if (n == 0 || n >= sizeof(buf) || memchr(p, '%', n) != NULL)
        return 0;
    memcpy(buf, p, n);
    buf[n] = '\0';
    if (inet_pton(AF_INET6, buf, &e->v6) != 1 || inet_ntop(AF_INET6, &e->v6, e->host, sizeof(e->host)) == NULL)
        return 0;
    e->host_len = strlen(e->host);
    e->is_v6 = 1;
    return 1;
}

/*
 * host[:port] | *.suffix[:port] | [v6][:port] | bare v6 (two or more colons, no port), as upstream parses
 * them (section 6.1); returns NULL or why the entry is malformed
 */
static const char *parse_net_entry(const char *s, size_t len, net_entry_t *e)
{
    const char *host = s, *colon;
    size_t hlen = len, i, ncolons = 0;

    memset(e, 0, sizeof(*e));
    if (len == 0)
        return "empty entry";
    for (i = 0; i != len; ++i) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c == 0x7f)
            return "whitespace or control character";
        if (c >= 0x80)
            return "non-ASCII host (use the A-label form)";
        if (c == '/')
            return "'/' is not allowed";
        if (c == '@')
            return "'@' is not allowed";
        if (c == ':')
            ++ncolons;
    }

    if (s[0] == '[') {
        const char *rb = memchr(s, ']', len);
        if (rb == NULL || !parse_entry_v6(s + 1, (size_t)(rb - s) - 1, e))
            return "invalid IPv6 literal";
        if (rb + 1 != s + len && (rb[1] != ':' || !parse_entry_port(rb + 2, (size_t)(s + len - rb - 2), &e->port)))
            return "invalid port";
        return NULL;
    }
    if (ncolons >= 2)
        return parse_entry_v6(s, len, e) ? NULL : "invalid IPv6 literal";
    if ((colon = memchr(s, ':', len)) != NULL) {
        hlen = (size_t)(colon - s);
        if (!parse_entry_port(colon + 1, len - hlen - 1, &e->port))
            return "invalid port";
    }

    /* URL hosts never carry a trailing dot (call/url.c strips it), so neither do entries */
    if (hlen > 1 && host[hlen - 1] == '.')
        --hlen;
    if (hlen == 0 || (hlen == 1 && host[0] == '.'))
        return "empty host";
    if (hlen > SB_URL_MAX_HOST)
        return "host is too long";
    if (hlen >= 2 && host[0] == '*' && host[1] == '.') {
        e->wildcard = 1;
        host += 2;
        hlen -= 2;
        if (hlen == 0)
            return "empty wildcard suffix";
    }
    for (i = 0; i != hlen; ++i) {
        if (host[i] == '*')
            return "'*' is only allowed as a leading \"*.\"";
        if (host[i] == '[' || host[i] == ']')
            return "invalid host";
        e->host[i] = ascii_lower(host[i]);
    }
    e->host[hlen] = '\0';
    e->host_len = hlen;
    return NULL;
}

/* a method list: uppercase HTTP tokens */
static int is_method_token(const char *s, size_t len)
{
    if (len == 0 || len > SB_MAX_FETCH_METHOD)
        return 0;
    for (size_t i = 0; i != len; ++i) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.'))
            return 0;
    }
    return 1;
}

/* a path glob: absolute, visible ASCII only (the strict parser sends nothing else) */
static int is_path_glob(const char *s, size_t len)
{
    if (len == 0 || s[0] != '/')
        return 0;
    for (size_t i = 0; i != len; ++i)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
            return 0;
    return 1;
}

static sb_status_t parse_rule_list(const json_t *v, const char *path, int methods, char ***out, size_t *n, char *err, size_t errsz)
{
    sb_status_t st;
    size_t i, cnt;

    if ((st = check_array(v, path, err, errsz)) != SB_OK)
        return st;
    if ((cnt = json_array_size(v)) == 0)
        return fail(err, errsz, "%s: must not be empty (omit it to allow any)", path);
    if ((*out = sb_mem_try_calloc(cnt, sizeof(**out))) == NULL)
        return SB_E_NOMEM;
    for (i = 0; i != cnt; ++i) {
        const char *s;
        size_t len;
        char *c;
        if ((st = array_string(v, i, path, &s, &len, err, errsz)) != SB_OK)
            return st;
        if (methods ? !is_method_token(s, len) : !is_path_glob(s, len))
            return fail(err, errsz,
                        methods ? "%s[%zu]: expected an uppercase HTTP method" : "%s[%zu]: expected a glob starting with '/'", path,
                        i);
        if ((c = sb_mem_try_alloc(len + 1)) == NULL)
            return SB_E_NOMEM;
        memcpy(c, s, len);
        c[len] = '\0';
        (*out)[(*n)++] = c;
    }
    return SB_OK;
}

sb_status_t sb_manifest__parse_rules(const json_t *methods, const json_t *paths, const char *path, sb_http_rules_t *r, char *err,
                                     size_t errsz)
{
    char sub[256];
    sb_status_t st;

    if (methods != NULL) {
        snprintf(sub, sizeof(sub), "%s.methods", path);
        if ((st = parse_rule_list(methods, sub, 1, &r->methods, &r->nmethods, err, errsz)) != SB_OK)
            return st;
    }
    if (paths != NULL) {
        snprintf(sub, sizeof(sub), "%s.paths", path);
        if ((st = parse_rule_list(paths, sub, 0, &r->paths, &r->npaths, err, errsz)) != SB_OK)
            return st;
    }
    return SB_OK;
}

void sb_manifest__free_rules(sb_http_rules_t *r)
{
    for (size_t i = 0; i != r->nmethods; ++i)
        sb_mem_free(r->methods[i]);
    sb_mem_free(r->methods);
    for (size_t i = 0; i != r->npaths; ++i)
        sb_mem_free(r->paths[i]);
    sb_mem_free(r->paths);
    memset(r, 0, sizeof(*r));
}

void sb_manifest__free_net(sb_net_entry_t *v, size_t n)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i != n; ++i)
        sb_manifest__free_rules(&v[i].rules);
    sb_mem_free(v);
}

/* {"host": entry, "methods"?: [...], "paths"?: [...]} */
static sb_status_t parse_net_object(const json_t *o, const char *path, net_entry_t *e, char *err, size_t errsz)
{
    const char *key, *why;
    size_t klen;
    json_t *val, *host = NULL, *methods = NULL, *paths = NULL;
    char q[MAX_QUOTE + 1];

    json_object_keylen_foreach((json_t *)o, key, klen, val)
    {
        if (key_is(key, klen, "host"))
            host = val;
        else if (key_is(key, klen, "methods"))
            methods = val;
        else if (key_is(key, klen, "paths"))
            paths = val;
        else
            return fail(err, errsz, "%s.%s: unknown key", path, quote(key, klen, q, sizeof(q)));
    }
    if (!json_is_string(host) || json_string_length(host) > SB_MAX_MANIFEST_STRING)
        return fail(err, errsz, "%s.host: must be a string", path);
    if ((why = parse_net_entry(json_string_value(host), json_string_length(host), e)) != NULL)
        return fail(err, errsz, "%s.host: %s", path, why);
    return sb_manifest__parse_rules(methods, paths, path, &e->rules, err, errsz);
}

sb_status_t sb_manifest__parse_net(const json_t *v, const char *path, int objects, sb_net_entry_t **out, size_t *nout, char *err,
                                   size_t errsz)
{
    size_t i, n;
    sb_status_t st;
    char epath[128];

    *out = NULL;
    *nout = 0;
    if ((st = check_array(v, path, err, errsz)) != SB_OK)
        return st;
    if ((n = json_array_size(v)) == 0)
        return SB_OK;
    if ((*out = sb_mem_try_calloc(n, sizeof(**out))) == NULL)
        return SB_E_NOMEM;
    for (i = 0; i != n; ++i) {
        const json_t *el = json_array_get(v, i);
        const char *s, *why;
        size_t len;
        if (objects && json_is_object(el)) {
            snprintf(epath, sizeof(epath), "%s[%zu]", path, i);
            /* counted first: the entry's rules are freed with the list whatever happens */
            ++*nout;
            if ((st = parse_net_object(el, epath, &(*out)[i], err, errsz)) != SB_OK)
                return st;
            continue;
        }
        if ((st = array_string(v, i, path, &s, &len, err, errsz)) != SB_OK)
            return objects && !json_is_string(el) ? fail(err, errsz, "%s[%zu]: must be a string or an object", path, i) : st;
        if ((why = parse_net_entry(s, len, &(*out)[i])) != NULL)
            return fail(err, errsz, "%s[%zu]: %s", path, i, why);
        ++*nout;
    }
    return SB_OK;
}

static sb_status_t parse_netlist(const json_t *v, const char *path, int objects, netlist_t *out, char *err, size_t errsz)
{
    return sb_manifest__parse_net(v, path, objects, &out->v, &out->n, err, errsz);
}

/* ---- decide -------------------------------------------------------------------------------------------------------- */

/*
 * capabilities.decide: {"methods"?: [pattern...], "fetch"?: [net entry...]}.
 * The rules only name calls that need the decider's allow on top of the
 * grant (PROTOCOL.md section 5a); they grant nothing themselves.
 */
static sb_status_t parse_decide(const json_t *v, mtree_t *m, char *err, size_t errsz)
{
    const char *key;
    size_t klen;
    json_t *val;
    sb_status_t st;
    char q[MAX_QUOTE + 1];

    if (!json_is_object(v))
        return fail(err, errsz, "capabilities.decide: must be an object");
    json_object_keylen_foreach((json_t *)v, key, klen, val)
    {
        if (key_is(key, klen, "methods"))
            st = parse_list(val, "capabilities.decide.methods", LIST_METHOD_PATTERNS, &m->decide_methods, err, errsz);
        else if (key_is(key, klen, "fetch"))
            st = parse_netlist(val, "capabilities.decide.fetch", 1, &m->decide_fetch, err, errsz);
        else
            st = fail(err, errsz, "capabilities.decide.%s: unknown key", quote(key, klen, q, sizeof(q)));
        if (st != SB_OK)
            return st;
    }
    return SB_OK;
}

/* ---- files and data ------------------------------------------------------------------------------------------------ */

static sb_status_t parse_files(const json_t *v, mtree_t *m, char *err, size_t errsz)
{
    const char *key;
    size_t klen;
    json_t *val;
    sb_status_t st;
    char q[MAX_QUOTE + 1];

    if (!json_is_object(v))
        return fail(err, errsz, "capabilities.files: must be an object");
    json_object_keylen_foreach((json_t *)v, key, klen, val)
    {
        if (key_is(key, klen, "read"))
            st = parse_list(val, "capabilities.files.read", LIST_FILE_GLOBS, &m->files_read, err, errsz);
        else if (key_is(key, klen, "write"))
            st = parse_list(val, "capabilities.files.write", LIST_FILE_GLOBS, &m->files_write, err, errsz);
        else
            st = fail(err, errsz, "capabilities.files.%s: unknown key", quote(key, klen, q, sizeof(q)));
        if (st != SB_OK)
            return st;
    }
    return SB_OK;
}

/* the verbs of data.collections, and (rw) those of data.globals and data.stores */
static const struct {
    const char *name;
    sb_method_op_t op;
    int rw;
} verb_table[] = {
    {"read", SB_OP_READ, 1},     {"create", SB_OP_CREATE, 0}, {"update", SB_OP_UPDATE, 0},
    {"delete", SB_OP_DELETE, 0}, {"write", SB_OP_WRITE, 1},
};

static int lookup_verb(const char *s, size_t len, int collection, unsigned *bits)
{
    size_t j;

    for (j = 0; j != sizeof(verb_table) / sizeof(verb_table[0]); ++j) {
        /* read is both; create/update/delete are collection verbs; write is a global/store verb */
        int allowed = verb_table[j].op == SB_OP_READ || (collection ? !verb_table[j].rw : verb_table[j].rw);
        if (allowed && key_is(s, len, verb_table[j].name)) {
            *bits |= VERB_BIT(verb_table[j].op);
            return 1;
        }
    }
    return 0;
}

/* {name: [verb, ...]}: collection verbs when `collection`, else read/write */
static sb_status_t parse_grants(const json_t *v, const char *path, int collection, grants_t *out, char *err, size_t errsz)
{
    const char *key;
    size_t klen, n;
    json_t *val;
    sb_status_t st;
    char q[MAX_QUOTE + 1], epath[64 + MAX_NAME_LEN];

    if (!json_is_object(v))
        return fail(err, errsz, "%s: must be an object", path);
    if ((n = json_object_size(v)) > SB_MAX_MANIFEST_ENTRIES)
        return fail(err, errsz, "%s: too many entries (max %u)", path, SB_MAX_MANIFEST_ENTRIES);
    if (n == 0)
        return SB_OK;
    if ((out->v = sb_mem_try_calloc(n, sizeof(*out->v))) == NULL)
        return SB_E_NOMEM;
    json_object_keylen_foreach((json_t *)v, key, klen, val)
    {
        grant_t *g = &out->v[out->n];
        size_t i;
        if (!is_name(key, klen))
            return fail(err, errsz, "%s: invalid name \"%s\"", path, quote(key, klen, q, sizeof(q)));
        snprintf(epath, sizeof(epath), "%s.%.*s", path, (int)klen, key);
        if ((st = check_array(val, epath, err, errsz)) != SB_OK)
            return st;
        for (i = 0; i != json_array_size(val); ++i) {
            const char *s;
            size_t len;
            if ((st = array_string(val, i, epath, &s, &len, err, errsz)) != SB_OK)
                return st;
            if (!lookup_verb(s, len, collection, &g->verbs))
                return fail(err, errsz, "%s[%zu]: unknown verb \"%s\"", epath, i, quote(s, len, q, sizeof(q)));
        }
        if ((st = copy_str(&g->name, key, klen)) != SB_OK)
            return st;
        ++out->n;
    }
    return SB_OK;
}

static sb_status_t parse_data(const json_t *v, mtree_t *m, char *err, size_t errsz)
{
    const char *key;
    size_t klen;
    json_t *val;
    sb_status_t st;
    char q[MAX_QUOTE + 1];

    if (!json_is_object(v))
        return fail(err, errsz, "capabilities.data: must be an object");
    json_object_keylen_foreach((json_t *)v, key, klen, val)
    {
        if (key_is(key, klen, "collections"))
            st = parse_grants(val, "capabilities.data.collections", 1, &m->collections, err, errsz);
        else if (key_is(key, klen, "globals"))
            st = parse_grants(val, "capabilities.data.globals", 0, &m->globals, err, errsz);
        else if (key_is(key, klen, "stores"))
            st = parse_grants(val, "capabilities.data.stores", 0, &m->stores, err, errsz);
        else
            st = fail(err, errsz, "capabilities.data.%s: unknown key", quote(key, klen, q, sizeof(q)));
        if (st != SB_OK)
            return st;
    }
    return SB_OK;
}

static sb_status_t parse_int(const json_t *v, const char *path, json_int_t lo, json_int_t hi, int64_t *out, char *err, size_t errsz)
{
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return fail(err, errsz, "%s: must be an integer from %lld to %lld", path, (long long)lo, (long long)hi);
    *out = (int64_t)json_integer_value(v);
    return SB_OK;
}

/* ---- the packed form ----------------------------------------------------------------------------------------------- */

/*
 * A parsed manifest is one allocation: a small header, then the body, which
 * holds everything the check reads. The body has no pointers: entries name
 * their strings by offset from the body's start, and every byte (padding
 * included) is written by pack(), so two manifests that grant the same things
 * in the same order have identical bodies. That makes the body the canonical
 * form the intern table compares: identical manifests are one object, shared
 * by every token that names it, and freed when the last one goes.
 *
 * Adding an axis: a value in axis_t, a field in mtree_t filled by the parse,
 * a case in pack() (an existing entry type when one fits, else a new
 * fixed-size struct of uint32_t/uint16_t/uint8_t fields with explicit
 * padding), and an accessor reading the span.
 */
typedef enum en_axis_t {
    AX_NET,            /* mnet_t */
    AX_IMPORT,         /* mnet_t */
    AX_FILES_READ,     /* mref_t, normalised globs */
    AX_FILES_WRITE,    /* mref_t, normalised globs */
    AX_COLLECTIONS,    /* mgrant_t */
    AX_GLOBALS,        /* mgrant_t */
    AX_STORES,         /* mgrant_t */
    AX_SERVICES,       /* mref_t */
    AX_JOBS,           /* mref_t */
    AX_WORKFLOWS,      /* mref_t */
    AX_TOOLS,          /* mref_t, globs over tool names */
    AX_SECRETS,        /* mref_t, target secret names */
    AX_DECIDE_METHODS, /* mref_t, method patterns */
    AX_DECIDE_FETCH,   /* mnet_t */
    AX_COUNT_
} axis_t;

/* `n` entries of the axis' type starting `off` bytes into the body */
typedef struct st_mspan_t {
    uint32_t off, n;
} mspan_t;

/* a string: `len` bytes at `off`, followed by a NUL */
typedef struct st_mref_t {
    uint32_t off, len;
} mref_t;

typedef struct st_mgrant_t {
    uint32_t off;   /* the name, NUL-terminated */
    uint16_t len;   /* <= MAX_NAME_LEN */
    uint16_t verbs; /* VERB_BIT(SB_OP_READ) | ... */
} mgrant_t;

enum { NET_NAME, NET_WILDCARD, NET_V6 };

typedef struct st_mnet_t {
    uint32_t off;  /* NET_V6: the 16 address bytes; else the lowercase host (for a wildcard the suffix), NUL-terminated */
    uint16_t len;  /* host bytes (16 for NET_V6) */
    uint16_t port; /* 0: any port */
    uint8_t kind;  /* NET_NAME, NET_WILDCARD, NET_V6 */
    uint8_t _pad[3];
    uint32_t rules;            /* nmethods then npaths mref_t entries at this offset (0 when both are 0) */
    uint16_t nmethods, npaths; /* <= SB_MAX_MANIFEST_ENTRIES; 0: any method, any path */
} mnet_t;

typedef struct st_mbody_t {
    int64_t timeout_ms, memory_mb; /* -1 when absent */
    /* the method families (bit sb_method_kind_t) some decide rule may name: a call of another family needs no look */
    uint32_t decide_kinds;
    uint32_t _pad0;
    mspan_t axis[AX_COUNT_];
} mbody_t;

struct st_sb_manifest_t {
    _Atomic uint32_t refcnt;
    uint32_t hash;                    /* of the body */
    uint32_t size;                    /* body bytes */
    int interned;                     /* 1 while the intern table holds it */
    sb_manifest_t *next;              /* the intern table's chain */
    _Alignas(8) unsigned char body[]; /* starts with an mbody_t */
};

_Static_assert(SB_OP_COUNT_ <= 16, "verb bits fit mgrant_t.verbs");
_Static_assert(sizeof(mbody_t) % 8 == 0 && sizeof(mnet_t) == 20 && sizeof(mgrant_t) == 8 && sizeof(mref_t) == 8,
               "the body has no implicit padding");
_Static_assert(MAX_NAME_LEN <= UINT16_MAX && SB_URL_MAX_HOST <= UINT16_MAX && SB_MAX_MANIFEST_ENTRIES <= UINT16_MAX,
               "lengths and rule counts fit 16 bits");

static const mbody_t *body_of(const sb_manifest_t *m)
{
    return (const mbody_t *)(const void *)m->body;
}

static const void *entries(const sb_manifest_t *m, axis_t a, size_t *n)
{
    const mspan_t *sp = &body_of(m)->axis[a];
    *n = sp->n;
    return m->body + sp->off;
}

static const char *str_at(const sb_manifest_t *m, uint32_t off)
{
    return (const char *)m->body + off;
}

/* the bytes the tree's strings take in the body (each with its NUL) */
static size_t list_bytes(const mlist_t *l)
{
    size_t n = 0;
    for (size_t i = 0; i != l->n; ++i)
        n += l->v[i].len + 1;
    return n;
}

static size_t grants_bytes(const grants_t *g)
{
    size_t n = 0;
    for (size_t i = 0; i != g->n; ++i)
        n += g->v[i].name.len + 1;
    return n;
}

static size_t net_bytes(const netlist_t *l)
{
    size_t n = 0;
    for (size_t i = 0; i != l->n; ++i) {
        const sb_http_rules_t *r = &l->v[i].rules;
        n += l->v[i].is_v6 ? sizeof(l->v[i].v6) : l->v[i].host_len + 1;
        for (size_t j = 0; j != r->nmethods; ++j)
            n += strlen(r->methods[j]) + 1;
        for (size_t j = 0; j != r->npaths; ++j)
            n += strlen(r->paths[j]) + 1;
    }
    return n;
}

/* the entry bytes of a net list: its entries, then the mref_t of every rule */
static size_t net_entry_bytes(const netlist_t *l)
{
    size_t n = l->n * sizeof(mnet_t);
    for (size_t i = 0; i != l->n; ++i)
        n += (l->v[i].rules.nmethods + l->v[i].rules.npaths) * sizeof(mref_t);
    return n;
}

typedef struct st_packer_t {
    unsigned char *body;
    size_t ent; /* next entry byte */
    size_t str; /* next string byte */
} packer_t;

static uint32_t put_bytes(packer_t *p, const void *s, size_t len, int nul)
{
    uint32_t off = (uint32_t)p->str;
    memcpy(p->body + p->str, s, len);
    p->str += len;
    if (nul)
        p->body[p->str++] = '\0';
    return off;
}

static void pack_list(packer_t *p, mbody_t *b, axis_t a, const mlist_t *l)
{
    mref_t *e = (mref_t *)(void *)(p->body + p->ent);

    b->axis[a].off = l->n != 0 ? (uint32_t)p->ent : 0;
    b->axis[a].n = (uint32_t)l->n;
    for (size_t i = 0; i != l->n; ++i) {
        e[i].len = (uint32_t)l->v[i].len;
        e[i].off = put_bytes(p, l->v[i].p, l->v[i].len, 1);
    }
    p->ent += l->n * sizeof(*e);
}

static void pack_grants(packer_t *p, mbody_t *b, axis_t a, const grants_t *g)
{
    mgrant_t *e = (mgrant_t *)(void *)(p->body + p->ent);

    b->axis[a].off = g->n != 0 ? (uint32_t)p->ent : 0;
    b->axis[a].n = (uint32_t)g->n;
    for (size_t i = 0; i != g->n; ++i) {
        e[i].len = (uint16_t)g->v[i].name.len;
        e[i].verbs = (uint16_t)g->v[i].verbs;
        e[i].off = put_bytes(p, g->v[i].name.p, g->v[i].name.len, 1);
    }
    p->ent += g->n * sizeof(*e);
}

static void pack_net(packer_t *p, mbody_t *b, axis_t a, const netlist_t *l)
{
    mnet_t *e = (mnet_t *)(void *)(p->body + p->ent);

    b->axis[a].off = l->n != 0 ? (uint32_t)p->ent : 0;
    b->axis[a].n = (uint32_t)l->n;
    for (size_t i = 0; i != l->n; ++i) {
        const net_entry_t *ne = &l->v[i];
        e[i].port = ne->port;
        if (ne->is_v6) {
            e[i].kind = NET_V6;
            e[i].len = (uint16_t)sizeof(ne->v6);
            e[i].off = put_bytes(p, &ne->v6, sizeof(ne->v6), 0);
        } else {
            e[i].kind = ne->wildcard ? NET_WILDCARD : NET_NAME;
            e[i].len = (uint16_t)ne->host_len;
            e[i].off = put_bytes(p, ne->host, ne->host_len, 1);
        }
    }
    p->ent += l->n * sizeof(*e);
    /* the rules of every entry follow the entries, methods first */
    for (size_t i = 0; i != l->n; ++i) {
        const sb_http_rules_t *r = &l->v[i].rules;
        mref_t *rr = (mref_t *)(void *)(p->body + p->ent);
        if (r->nmethods + r->npaths == 0)
            continue;
        e[i].rules = (uint32_t)p->ent;
        e[i].nmethods = (uint16_t)r->nmethods;
        e[i].npaths = (uint16_t)r->npaths;
        for (size_t j = 0; j != r->nmethods; ++j) {
            rr[j].len = (uint32_t)strlen(r->methods[j]);
            rr[j].off = put_bytes(p, r->methods[j], rr[j].len, 1);
        }
        for (size_t j = 0; j != r->npaths; ++j) {
            rr[r->nmethods + j].len = (uint32_t)strlen(r->paths[j]);
            rr[r->nmethods + j].off = put_bytes(p, r->paths[j], rr[r->nmethods + j].len, 1);
        }
        p->ent += (r->nmethods + r->npaths) * sizeof(*rr);
    }
}

/* FNV-1a: manifests come from the host's mint, not from the guest */
static uint32_t body_hash(const unsigned char *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i != n; ++i)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

/*
 * The families the decide rules may name. The document store answers under
 * two names (collections.document_store.<op> and store.<ns>.<op>), so a rule
 * in either family marks both.
 */
static uint32_t decide_kinds(const mtree_t *t)
{
    uint32_t bits = 0;

    for (size_t i = 0; i != t->decide_methods.n; ++i) {
        const char *p = t->decide_methods.v[i].p, *dot = strchr(p, '.');
        size_t flen = dot != NULL ? (size_t)(dot - p) : strlen(p);
        for (int k = 0; k != SB_MK_COUNT_; ++k) {
            const char *name = sb_method_kind_name((sb_method_kind_t)k);
            if (strlen(name) == flen && memcmp(name, p, flen) == 0)
                bits |= 1u << k;
        }
    }
    if (bits & ((1u << SB_MK_COLLECTIONS) | (1u << SB_MK_STORE)))
        bits |= (1u << SB_MK_COLLECTIONS) | (1u << SB_MK_STORE);
    if (t->decide_fetch.n != 0)
        bits |= 1u << SB_MK_HTTP;
    return bits;
}

/* the tree in one allocation (refcount 1, not interned); NULL when allocation fails */
static sb_manifest_t *pack(const mtree_t *t)
{
    const mlist_t *lists[] = {&t->files_read, &t->files_write, &t->services, &t->jobs,
                              &t->workflows,  &t->tools,       &t->secrets,  &t->decide_methods};
    const grants_t *grants[] = {&t->collections, &t->globals, &t->stores};
    size_t nent = 0, nstr = 0, size;
    sb_manifest_t *m;
    mbody_t *b;
    packer_t p;

    /* entry counts are capped at SB_MAX_MANIFEST_ENTRIES and strings at SB_MAX_MANIFEST_STRING by the parse */
    nent += net_entry_bytes(&t->net) + net_entry_bytes(&t->import) + net_entry_bytes(&t->decide_fetch);
    nstr += net_bytes(&t->net) + net_bytes(&t->import) + net_bytes(&t->decide_fetch);
    for (size_t i = 0; i != sizeof(lists) / sizeof(lists[0]); ++i) {
        nent += lists[i]->n * sizeof(mref_t);
        nstr += list_bytes(lists[i]);
    }
    for (size_t i = 0; i != sizeof(grants) / sizeof(grants[0]); ++i) {
        nent += grants[i]->n * sizeof(mgrant_t);
        nstr += grants_bytes(grants[i]);
    }
    size = sizeof(mbody_t) + nent + nstr;
    if (size > UINT32_MAX || (m = sb_mem_try_calloc(1, sizeof(*m) + size)) == NULL)
        return NULL;
    atomic_init(&m->refcnt, 1);
    m->size = (uint32_t)size;
    b = (mbody_t *)(void *)m->body;
    b->timeout_ms = t->timeout_ms;
    b->memory_mb = t->memory_mb;
    b->decide_kinds = decide_kinds(t);
    p.body = m->body;
    p.ent = sizeof(mbody_t);
    p.str = sizeof(mbody_t) + nent;
    /* a fixed order, whatever the order of the keys in the JSON text */
    pack_net(&p, b, AX_NET, &t->net);
    pack_net(&p, b, AX_IMPORT, &t->import);
    pack_list(&p, b, AX_FILES_READ, &t->files_read);
    pack_list(&p, b, AX_FILES_WRITE, &t->files_write);
    pack_grants(&p, b, AX_COLLECTIONS, &t->collections);
    pack_grants(&p, b, AX_GLOBALS, &t->globals);
    pack_grants(&p, b, AX_STORES, &t->stores);
    pack_list(&p, b, AX_SERVICES, &t->services);
    pack_list(&p, b, AX_JOBS, &t->jobs);
    pack_list(&p, b, AX_WORKFLOWS, &t->workflows);
    pack_list(&p, b, AX_TOOLS, &t->tools);
    pack_list(&p, b, AX_SECRETS, &t->secrets);
    pack_list(&p, b, AX_DECIDE_METHODS, &t->decide_methods);
    pack_net(&p, b, AX_DECIDE_FETCH, &t->decide_fetch);
    m->hash = body_hash(m->body, size);
    return m;
}

/* ---- the intern table ---------------------------------------------------------------------------------------------- */

/*
 * Process-wide, behind one mutex taken at parse and when a manifest's last
 * reference goes (never on the call path of the memory store, where tokens
 * hold their manifest). A reference count only drops to 0 under the mutex, so
 * a manifest found in the table is always alive.
 */
#define INTERN_MIN_BUCKETS 64
/* past this many references a parse gets a private copy: the count never wraps */
#define INTERN_MAX_REFS (UINT32_MAX / 2)

static struct {
    pthread_mutex_t mu;
    sb_manifest_t **buckets;
    size_t nbuckets; /* a power of two, or 0 before the first parse */
    size_t count;
} intern = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

/* doubles the table when it is full (load factor 1); called with the lock held */
static void intern_grow_locked(void)
{
    size_t n = intern.nbuckets != 0 ? intern.nbuckets * 2 : INTERN_MIN_BUCKETS;
    sb_manifest_t **nb;

    if (intern.count < intern.nbuckets || (nb = sb_mem_try_calloc(n, sizeof(*nb))) == NULL)
        return; /* a table that cannot grow still works, with longer chains */
    for (size_t i = 0; i != intern.nbuckets; ++i) {
        sb_manifest_t *m = intern.buckets[i];
        while (m != NULL) {
            sb_manifest_t *next = m->next;
            m->next = nb[m->hash & (n - 1)];
            nb[m->hash & (n - 1)] = m;
            m = next;
        }
    }
    sb_mem_free(intern.buckets);
    intern.buckets = nb;
    intern.nbuckets = n;
}

/* the interned manifest equal to `m` (and `m` freed), or `m` itself, now interned */
static sb_manifest_t *intern_manifest(sb_manifest_t *m)
{
    pthread_mutex_lock(&intern.mu);
    intern_grow_locked();
    if (intern.nbuckets == 0) {
        pthread_mutex_unlock(&intern.mu);
        return m; /* no table at all: an unshared manifest */
    }
    for (sb_manifest_t *e = intern.buckets[m->hash & (intern.nbuckets - 1)]; e != NULL; e = e->next) {
        if (e->hash == m->hash && e->size == m->size && memcmp(e->body, m->body, m->size) == 0 &&
            atomic_load_explicit(&e->refcnt, memory_order_relaxed) < INTERN_MAX_REFS) {
            atomic_fetch_add_explicit(&e->refcnt, 1, memory_order_relaxed);
            pthread_mutex_unlock(&intern.mu);
            sb_mem_free(m);
            return e;
        }
    }
    {
        size_t b = m->hash & (intern.nbuckets - 1);
        m->interned = 1;
        m->next = intern.buckets[b];
        intern.buckets[b] = m;
        ++intern.count;
    }
    pthread_mutex_unlock(&intern.mu);
    return m;
}

static void intern_unlink_locked(sb_manifest_t *m)
{
    for (sb_manifest_t **pp = &intern.buckets[m->hash & (intern.nbuckets - 1)]; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == m) {
            *pp = m->next;
            --intern.count;
            return;
        }
    }
}

size_t sb_manifest_interned_count(void)
{
    size_t n;
    pthread_mutex_lock(&intern.mu);
    n = intern.count;
    pthread_mutex_unlock(&intern.mu);
    return n;
}

/* ---- public API ---------------------------------------------------------------------------------------------------- */

static void free_list(mlist_t *l)
{
    size_t i;

    for (i = 0; i != l->n; ++i)
        sb_mem_free(l->v[i].p);
    sb_mem_free(l->v);
}

static void free_grants(grants_t *g)
{
    size_t i;

    /* a grant whose array was allocated but not yet named has a NULL name, which sb_mem_free takes */
    for (i = 0; i != g->n; ++i)
        sb_mem_free(g->v[i].name.p);
    sb_mem_free(g->v);
}

static void tree_free(mtree_t *m)
{
    sb_manifest__free_net(m->net.v, m->net.n);
    sb_manifest__free_net(m->import.v, m->import.n);
    free_list(&m->files_read);
    free_list(&m->files_write);
    free_grants(&m->collections);
    free_grants(&m->globals);
    free_grants(&m->stores);
    free_list(&m->services);
    free_list(&m->jobs);
    free_list(&m->workflows);
    free_list(&m->tools);
    free_list(&m->secrets);
    free_list(&m->decide_methods);
    sb_manifest__free_net(m->decide_fetch.v, m->decide_fetch.n);
}

sb_status_t sb_manifest_parse(const json_t *caps, sb_manifest_t **out, char *err, size_t errsz)
{
    mtree_t tree, *m = &tree;
    const char *key;
    size_t klen;
    json_t *val;
    sb_status_t st = SB_OK;
    char q[MAX_QUOTE + 1];

    *out = NULL;
    if (err != NULL && errsz != 0)
        err[0] = '\0';
    memset(m, 0, sizeof(*m));
    m->timeout_ms = -1;
    m->memory_mb = -1;

    if (caps == NULL || json_is_null(caps))
        goto Done;
    if (!json_is_object(caps)) {
        st = fail(err, errsz, "capabilities: must be an object");
        goto Exit;
    }
    json_object_keylen_foreach((json_t *)caps, key, klen, val)
    {
        if (key_is(key, klen, "net"))
            st = parse_netlist(val, "capabilities.net", 1, &m->net, err, errsz);
        else if (key_is(key, klen, "import"))
            st = parse_netlist(val, "capabilities.import", 0, &m->import, err, errsz);
        else if (key_is(key, klen, "files"))
            st = parse_files(val, m, err, errsz);
        else if (key_is(key, klen, "data"))
            st = parse_data(val, m, err, errsz);
        else if (key_is(key, klen, "services"))
            st = parse_list(val, "capabilities.services", LIST_NAMES, &m->services, err, errsz);
        else if (key_is(key, klen, "jobs"))
            st = parse_list(val, "capabilities.jobs", LIST_NAMES, &m->jobs, err, errsz);
        else if (key_is(key, klen, "workflows"))
            st = parse_list(val, "capabilities.workflows", LIST_NAMES, &m->workflows, err, errsz);
        else if (key_is(key, klen, "tools"))
            st = parse_list(val, "capabilities.tools", LIST_TOOL_GLOBS, &m->tools, err, errsz);
        else if (key_is(key, klen, "secrets"))
            st = parse_list(val, "capabilities.secrets", LIST_SECRET_NAMES, &m->secrets, err, errsz);
        else if (key_is(key, klen, "decide"))
            st = parse_decide(val, m, err, errsz);
        else if (key_is(key, klen, "timeoutMs"))
            st = parse_int(val, "capabilities.timeoutMs", 1, MAX_TIMEOUT_MS, &m->timeout_ms, err, errsz);
        else if (key_is(key, klen, "memoryMb"))
            st = parse_int(val, "capabilities.memoryMb", MIN_MEMORY_MB, MAX_MEMORY_MB, &m->memory_mb, err, errsz);
        else
            st = fail(err, errsz, "capabilities.%s: unknown key", quote(key, klen, q, sizeof(q)));
        if (st != SB_OK)
            goto Exit;
    }

Done : {
    sb_manifest_t *packed = pack(m);
    if (packed == NULL) {
        st = SB_E_NOMEM;
        goto Exit;
    }
    tree_free(m);
    *out = intern_manifest(packed);
    return SB_OK;
}
Exit:
    if (st == SB_E_NOMEM && err != NULL && errsz != 0)
        snprintf(err, errsz, "capabilities: out of memory");
    tree_free(m);
    return st;
}

void sb_manifest_free(sb_manifest_t *m)
{
    uint32_t c;

    if (m == NULL)
        return;
    /* the common case, another reference remains: no lock */
    c = atomic_load_explicit(&m->refcnt, memory_order_relaxed);
    while (c > 1)
        if (atomic_compare_exchange_weak_explicit(&m->refcnt, &c, c - 1, memory_order_release, memory_order_relaxed))
            return;
    if (!m->interned) {
        if (atomic_fetch_sub_explicit(&m->refcnt, 1, memory_order_acq_rel) == 1)
            sb_mem_free(m);
        return;
    }
    /* maybe the last one: decide under the lock, so that no parse finds it in between */
    pthread_mutex_lock(&intern.mu);
    if (atomic_fetch_sub_explicit(&m->refcnt, 1, memory_order_acq_rel) != 1) {
        pthread_mutex_unlock(&intern.mu);
        return;
    }
    intern_unlink_locked(m);
    pthread_mutex_unlock(&intern.mu);
    sb_mem_free(m);
}

int64_t sb_manifest_timeout_ms(const sb_manifest_t *m)
{
    return body_of(m)->timeout_ms;
}

/* ---- the parsed form, written back (sb_manifest_to_json) ---------------------------------------------------------- */

static json_t *checked(json_t *v)
{
    if (v == NULL)
        sb_fatal(__FILE__, __LINE__, "out of memory");
    return v;
}

static void put(json_t *obj, const char *key, json_t *v)
{
    if (json_object_set_new(obj, key, checked(v)) != 0)
        sb_fatal(__FILE__, __LINE__, "out of memory");
}

static void append(json_t *arr, json_t *v)
{
    if (json_array_append_new(arr, checked(v)) != 0)
        sb_fatal(__FILE__, __LINE__, "out of memory");
}

static void put_list(json_t *obj, const char *key, const sb_manifest_t *m, axis_t ax)
{
    size_t n;
    const mref_t *l = entries(m, ax, &n);
    json_t *a;

    if (n == 0)
        return;
    a = checked(json_array());
    for (size_t i = 0; i != n; ++i)
        append(a, json_stringn(str_at(m, l[i].off), l[i].len));
    put(obj, key, a);
}

static void put_netlist(json_t *obj, const char *key, const sb_manifest_t *m, axis_t ax)
{
    size_t n;
    const mnet_t *l = entries(m, ax, &n);
    json_t *a;

    if (n == 0)
        return;
    a = checked(json_array());
    for (size_t i = 0; i != n; ++i) {
        const mnet_t *e = &l[i];
        char host[INET6_ADDRSTRLEN], text[SB_URL_MAX_HOST + 16];
        const char *h = str_at(m, e->off), *pre = "", *post = "";
        if (e->kind == NET_V6) {
            if (inet_ntop(AF_INET6, h, host, sizeof(host)) == NULL)
                sb_fatal(__FILE__, __LINE__, "inet_ntop failed on a parsed IPv6 entry");
            h = host;
            pre = "[";
            post = "]";
        } else if (e->kind == NET_WILDCARD) {
            pre = "*.";
        }
        if (e->port != 0)
            snprintf(text, sizeof(text), "%s%s%s:%u", pre, h, post, (unsigned)e->port);
        else
            snprintf(text, sizeof(text), "%s%s%s", pre, h, post);
        if (e->nmethods + e->npaths == 0) {
            append(a, json_string(text));
        } else {
            /* an entry with rules is written as the object form it was minted as */
            const mref_t *rr = (const mref_t *)(const void *)(m->body + e->rules);
            json_t *eo = checked(json_object());
            put(eo, "host", json_string(text));
            if (e->nmethods != 0) {
                json_t *ma = checked(json_array());
                for (size_t j = 0; j != e->nmethods; ++j)
                    append(ma, json_stringn(str_at(m, rr[j].off), rr[j].len));
                put(eo, "methods", ma);
            }
            if (e->npaths != 0) {
                json_t *pa = checked(json_array());
                for (size_t j = 0; j != e->npaths; ++j)
                    append(pa, json_stringn(str_at(m, rr[e->nmethods + j].off), rr[e->nmethods + j].len));
                put(eo, "paths", pa);
            }
            append(a, eo);
        }
    }
    put(obj, key, a);
}

static void put_grants(json_t *obj, const char *key, const sb_manifest_t *m, axis_t ax)
{
    size_t n;
    const mgrant_t *g = entries(m, ax, &n);
    json_t *o;

    if (n == 0)
        return;
    o = checked(json_object());
    for (size_t i = 0; i != n; ++i) {
        json_t *verbs = checked(json_array());
        for (size_t j = 0; j != sizeof(verb_table) / sizeof(verb_table[0]); ++j)
            if (g[i].verbs & VERB_BIT(verb_table[j].op))
                append(verbs, json_string(verb_table[j].name));
        put(o, str_at(m, g[i].off), verbs);
    }
    put(obj, key, o);
}

json_t *sb_manifest_to_json(const sb_manifest_t *m)
{
    const mbody_t *b = body_of(m);
    json_t *o = checked(json_object()), *files = checked(json_object()), *data = checked(json_object());

    put_netlist(o, "net", m, AX_NET);
    put_netlist(o, "import", m, AX_IMPORT);
    put_list(files, "read", m, AX_FILES_READ);
    put_list(files, "write", m, AX_FILES_WRITE);
    if (json_object_size(files) != 0)
        put(o, "files", json_incref(files));
    json_decref(files);
    put_grants(data, "collections", m, AX_COLLECTIONS);
    put_grants(data, "globals", m, AX_GLOBALS);
    put_grants(data, "stores", m, AX_STORES);
    if (json_object_size(data) != 0)
        put(o, "data", json_incref(data));
    json_decref(data);
    put_list(o, "services", m, AX_SERVICES);
    put_list(o, "jobs", m, AX_JOBS);
    put_list(o, "workflows", m, AX_WORKFLOWS);
    put_list(o, "tools", m, AX_TOOLS);
    put_list(o, "secrets", m, AX_SECRETS);
    {
        json_t *decide = checked(json_object());
        put_list(decide, "methods", m, AX_DECIDE_METHODS);
        put_netlist(decide, "fetch", m, AX_DECIDE_FETCH);
        if (json_object_size(decide) != 0)
            put(o, "decide", json_incref(decide));
        json_decref(decide);
    }
    if (b->timeout_ms >= 0)
        put(o, "timeoutMs", json_integer((json_int_t)b->timeout_ms));
    if (b->memory_mb >= 0)
        put(o, "memoryMb", json_integer((json_int_t)b->memory_mb));
    return o;
}

/* ---- accessors for check.c (manifest_int.h) ------------------------------------------------------------------------ */

static unsigned grant_verbs(const sb_manifest_t *m, axis_t a, const char *name, size_t len)
{
    size_t n;
    const mgrant_t *g = entries(m, a, &n);

    for (size_t i = 0; i != n; ++i)
        if (g[i].len == len && memcmp(str_at(m, g[i].off), name, len) == 0)
            return g[i].verbs;
    return 0;
}

static int list_has(const sb_manifest_t *m, axis_t a, const char *name, size_t len)
{
    size_t n;
    const mref_t *l = entries(m, a, &n);

    for (size_t i = 0; i != n; ++i)
        if (l[i].len == len && memcmp(str_at(m, l[i].off), name, len) == 0)
            return 1;
    return 0;
}

static int list_glob_any(const sb_manifest_t *m, axis_t a, const char *s, size_t len)
{
    size_t n;
    const mref_t *l = entries(m, a, &n);

    for (size_t i = 0; i != n; ++i)
        if (sb_glob_match(str_at(m, l[i].off), l[i].len, s, len))
            return 1;
    return 0;
}

unsigned sb_manifest__collection_verbs(const sb_manifest_t *m, const char *name, size_t len)
{
    return grant_verbs(m, AX_COLLECTIONS, name, len);
}

unsigned sb_manifest__global_verbs(const sb_manifest_t *m, const char *name, size_t len)
{
    return grant_verbs(m, AX_GLOBALS, name, len);
}

unsigned sb_manifest__store_verbs(const sb_manifest_t *m, const char *name, size_t len)
{
    return grant_verbs(m, AX_STORES, name, len);
}

int sb_manifest__has_service(const sb_manifest_t *m, const char *name, size_t len)
{
    return list_has(m, AX_SERVICES, name, len);
}

int sb_manifest__has_job(const sb_manifest_t *m, const char *name, size_t len)
{
    return list_has(m, AX_JOBS, name, len);
}

int sb_manifest__has_workflow(const sb_manifest_t *m, const char *name, size_t len)
{
    return list_has(m, AX_WORKFLOWS, name, len);
}

size_t sb_manifest__files_read_count(const sb_manifest_t *m)
{
    return body_of(m)->axis[AX_FILES_READ].n;
}

int sb_manifest__files_read_match(const sb_manifest_t *m, const char *path, size_t len)
{
    return list_glob_any(m, AX_FILES_READ, path, len);
}

int sb_manifest__files_write_match(const sb_manifest_t *m, const char *path, size_t len)
{
    return list_glob_any(m, AX_FILES_WRITE, path, len);
}

/* upstream's files.list rule: some read glob, as a string, starts with dir + "/" */
int sb_manifest__files_read_under(const sb_manifest_t *m, const char *dir, size_t len)
{
    size_t n;
    const mref_t *l = entries(m, AX_FILES_READ, &n);

    for (size_t i = 0; i != n; ++i) {
        const char *g = str_at(m, l[i].off);
        if (l[i].len > len && memcmp(g, dir, len) == 0 && g[len] == '/')
            return 1;
    }
    return 0;
}

size_t sb_manifest__tools_count(const sb_manifest_t *m)
{
    return body_of(m)->axis[AX_TOOLS].n;
}

int sb_manifest__tools_match(const sb_manifest_t *m, const char *name, size_t len)
{
    return list_glob_any(m, AX_TOOLS, name, len);
}

size_t sb_manifest__net_count(const sb_manifest_t *m)
{
    return body_of(m)->axis[AX_NET].n;
}

static int ieq_n(const char *a, const char *b, size_t n)
{
    size_t i;

    for (i = 0; i != n; ++i)
        if (ascii_lower(a[i]) != ascii_lower(b[i]))
            return 0;
    return 1;
}

size_t sb_manifest_secret_count(const sb_manifest_t *m)
{
    return m != NULL ? body_of(m)->axis[AX_SECRETS].n : 0;
}

const char *sb_manifest_secret_name(const sb_manifest_t *m, size_t i)
{
    size_t n;
    const mref_t *l;

    if (m == NULL)
        return NULL;
    l = entries(m, AX_SECRETS, &n);
    return i < n ? str_at(m, l[i].off) : NULL;
}

int sb_manifest__is_secret_name(const char *s, size_t len)
{
    if (len == 0 || len > 64)
        return 0;
    for (size_t i = 0; i != len; ++i)
        if (!(is_name_char((unsigned char)s[i]) || s[i] == '.'))
            return 0;
    return 1;
}

/*
 * Section 6.1, with the upstream IPv6 quirk fixed: an entry port must equal the
 * effective port; IPv6 entries match IPv6 URL hosts by address (numerically,
 * so "[0:0::1]" and "[::1]" are the same entry); "*.suffix" matches names that
 * end in ".suffix" and are longer (subdomains only, never the apex, never an
 * address); anything else is a case-insensitive exact comparison with the
 * canonical host. `host` is the 16 address bytes for NET_V6.
 */
static int host_matches(int kind, const char *host, size_t len, uint16_t port, const sb_url_t *u)
{
    if (port != 0 && port != u->port)
        return 0;
    switch (kind) {
    case NET_V6:
        return u->host_kind == SB_URL_HOST_IPV6 && memcmp(host, &u->addr.v6, sizeof(u->addr.v6)) == 0;
    case NET_WILDCARD:
        return u->host_kind == SB_URL_HOST_NAME && u->host_len > len + 1 && u->host[u->host_len - len - 1] == '.' &&
               ieq_n(u->host + u->host_len - len, host, len);
    default:
        return u->host_kind != SB_URL_HOST_IPV6 && u->host_len == len && ieq_n(u->host, host, len);
    }
}

static int tree_kind(const sb_net_entry_t *e)
{
    return e->is_v6 ? NET_V6 : e->wildcard ? NET_WILDCARD : NET_NAME;
}

int sb_manifest__entry_host_matches(const sb_net_entry_t *e, const sb_url_t *u)
{
    return e->is_v6 ? host_matches(NET_V6, (const char *)&e->v6, sizeof(e->v6), e->port, u)
                    : host_matches(tree_kind(e), e->host, e->host_len, e->port, u);
}

/* the request path: the origin-form target up to its query */
static size_t path_len(const sb_url_t *u)
{
    const char *q = memchr(u->target, '?', u->target_len);
    return q != NULL ? (size_t)(q - u->target) : u->target_len;
}

/*
 * A path a rule checks must mean one thing to every parser between us and the
 * application: an encoded '/', '\\' or '.' (which a server may decode before
 * routing), an encoded '%' (which a second decoding turns into one of those),
 * a ';' (path parameters, which servlet containers strip before resolving
 * "..;") or a dot segment (which it may resolve) would let one path pass a
 * rule written for another, so such paths are refused outright.
 */
static int path_is_ambiguous(const char *p, size_t n)
{
    if (memchr(p, ';', n) != NULL)
        return 1;
    for (size_t i = 0; i + 2 < n; ++i) {
        if (p[i] == '%' && (p[i + 1] == '2' || p[i + 1] == '5')) {
            char c = ascii_lower(p[i + 2]);
            if ((p[i + 1] == '2' && (c == 'f' || c == 'e' || c == '5')) || (p[i + 1] == '5' && c == 'c'))
                return 1;
        }
    }
    for (size_t i = 0; i < n; ++i) {
        size_t j;
        if (p[i] != '/')
            continue;
        for (j = i + 1; j < n && p[j] != '/'; ++j)
            ;
        if ((j - i - 1 == 1 && p[i + 1] == '.') || (j - i - 1 == 2 && p[i + 1] == '.' && p[i + 2] == '.'))
            return 1;
    }
    return 0;
}

/* the verdict of a paths rule (npaths != 0) whose i-th glob path_at gives */
typedef const char *(*rule_at_t)(const void *ctx, size_t i, size_t *len);

static sb_net_verdict_t rules_verdict(const void *ctx, rule_at_t method_at, size_t nmethods, rule_at_t path_at, size_t npaths,
                                      const sb_url_t *u, const char *method)
{
    size_t i, plen, mlen = strlen(method);

    if (nmethods != 0) {
        for (i = 0; i != nmethods; ++i) {
            size_t len;
            const char *s = method_at(ctx, i, &len);
            if (len == mlen && memcmp(s, method, mlen) == 0)
                break;
        }
        if (i == nmethods)
            return SB_NET_METHOD;
    }
    if (npaths != 0) {
        plen = path_len(u);
        if (path_is_ambiguous(u->target, plen))
            return SB_NET_PATH_ENCODING;
        for (i = 0; i != npaths; ++i) {
            size_t len;
            const char *g = path_at(ctx, i, &len);
            if (sb_glob_match(g, len, u->target, plen))
                return SB_NET_OK;
        }
        return SB_NET_PATH;
    }
    return SB_NET_OK;
}

static const char *tree_method_at(const void *ctx, size_t i, size_t *len)
{
    const char *s = ((const sb_http_rules_t *)ctx)->methods[i];
    *len = strlen(s);
    return s;
}

static const char *tree_path_at(const void *ctx, size_t i, size_t *len)
{
    const char *s = ((const sb_http_rules_t *)ctx)->paths[i];
    *len = strlen(s);
    return s;
}

sb_net_verdict_t sb_manifest__rules_verdict(const sb_http_rules_t *r, const sb_url_t *u, const char *method)
{
    return rules_verdict(r, tree_method_at, r->nmethods, tree_path_at, r->npaths, u, method);
}

/* a packed entry's rules: the manifest and the entry */
typedef struct st_packed_rules_t {
    const sb_manifest_t *m;
    const mnet_t *e;
} packed_rules_t;

static const char *packed_method_at(const void *ctx, size_t i, size_t *len)
{
    const packed_rules_t *pr = ctx;
    const mref_t *rr = (const mref_t *)(const void *)(pr->m->body + pr->e->rules);
    *len = rr[i].len;
    return str_at(pr->m, rr[i].off);
}

static const char *packed_path_at(const void *ctx, size_t i, size_t *len)
{
    const packed_rules_t *pr = ctx;
    return packed_method_at(ctx, pr->e->nmethods + i, len);
}

sb_net_verdict_t sb_manifest__net_verdict(const sb_manifest_t *m, const sb_url_t *u, const char *method)
{
    sb_net_verdict_t first = SB_NET_NO_HOST;
    size_t n;
    const mnet_t *l = entries(m, AX_NET, &n);

    /* any entry that admits the host and the request grants it; else the first host entry's refusal is the reason */
    for (size_t i = 0; i != n; ++i) {
        const mnet_t *e = &l[i];
        packed_rules_t pr = {m, e};
        sb_net_verdict_t v;
        if (!host_matches(e->kind, str_at(m, e->off), e->len, e->port, u))
            continue;
        if ((v = rules_verdict(&pr, packed_method_at, e->nmethods, packed_path_at, e->npaths, u, method)) == SB_NET_OK)
            return SB_NET_OK;
        if (first == SB_NET_NO_HOST)
            first = v;
    }
    return first;
}

/* 1 when the packed entry `n` admits every host and port the tree entry `e` admits */
static int entry_covers(const sb_manifest_t *m, const mnet_t *n, const sb_net_entry_t *e)
{
    const char *h = str_at(m, n->off);

    if (n->port != 0 && n->port != e->port)
        return 0;
    if (n->kind == NET_V6 || e->is_v6)
        return n->kind == NET_V6 && e->is_v6 && memcmp(h, &e->v6, sizeof(e->v6)) == 0;
    if (n->kind != NET_WILDCARD)
        return !e->wildcard && n->len == e->host_len && memcmp(h, e->host, n->len) == 0;
    /* *.suffix covers *.suffix, *.x.suffix and x.suffix */
    if (e->wildcard && e->host_len == n->len && memcmp(e->host, h, n->len) == 0)
        return 1;
    return e->host_len > (size_t)n->len + 1 && e->host[e->host_len - n->len - 1] == '.' &&
           memcmp(e->host + e->host_len - n->len, h, n->len) == 0;
}

int sb_manifest__net_covers(const sb_manifest_t *m, const sb_net_entry_t *e)
{
    size_t n;
    const mnet_t *l = entries(m, AX_NET, &n);

    for (size_t i = 0; i != n; ++i)
        if (entry_covers(m, &l[i], e))
            return 1;
    return 0;
}

/* ---- decide rules (authz.h, sb_authz_needs_decision) ---------------------------------------------------------------- */

int sb_manifest__decide_any(const sb_manifest_t *m)
{
    return body_of(m)->decide_kinds != 0;
}

int sb_manifest__decide_kind(const sb_manifest_t *m, int kind)
{
    return kind >= 0 && kind < SB_MK_COUNT_ && (body_of(m)->decide_kinds & (1u << (unsigned)kind)) != 0;
}

/* segment by segment: "*" matches any one segment, anything else itself */
static int pattern_match(const char *p, size_t plen, const char *s, size_t slen)
{
    size_t i = 0, j = 0;

    for (;;) {
        size_t pe = i, se = j;
        while (pe != plen && p[pe] != '.')
            ++pe;
        while (se != slen && s[se] != '.')
            ++se;
        if (!(pe - i == 1 && p[i] == '*') && !(pe - i == se - j && memcmp(p + i, s + j, pe - i) == 0))
            return 0;
        if (se - j == 0)
            return 0;
        if (pe == plen || se == slen)
            return pe == plen && se == slen;
        i = pe + 1;
        j = se + 1;
    }
}

int sb_manifest__decide_method_match(const sb_manifest_t *m, const char *method, size_t len)
{
    size_t n;
    const mref_t *l = entries(m, AX_DECIDE_METHODS, &n);

    for (size_t i = 0; i != n; ++i)
        if (pattern_match(str_at(m, l[i].off), l[i].len, method, len))
            return 1;
    return 0;
}

int sb_manifest__decide_fetch_match(const sb_manifest_t *m, const sb_url_t *u, const char *method)
{
    size_t n;
    const mnet_t *l = entries(m, AX_DECIDE_FETCH, &n);

    /* an entry whose host, method and path rules all admit the request names it */
    for (size_t i = 0; i != n; ++i) {
        const mnet_t *e = &l[i];
        packed_rules_t pr = {m, e};
        if (!host_matches(e->kind, str_at(m, e->off), e->len, e->port, u))
            continue;
        /* an ambiguous path under a paths rule cannot be told apart from the ones the rule names: it needs the decider */
        switch (rules_verdict(&pr, packed_method_at, e->nmethods, packed_path_at, e->npaths, u, method)) {
        case SB_NET_OK:
        case SB_NET_PATH_ENCODING:
            return 1;
        default:
            break;
        }
    }
    return 0;
}
