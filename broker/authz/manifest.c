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
 * The parsed form is plain C arrays holding our own copies (no jansson
 * reference survives the parse) and is immutable afterwards, so one manifest
 * may be read from every worker thread. Names are compared as exact bytes over
 * our own entries only: "__proto__", "constructor" or "toString" are ordinary
 * names that grant something only when the manifest literally lists them
 * (upstream needed hasOwnProperty for that; we have no prototype chain).
 *
 * check.c reads the parsed form through the sb_manifest__* accessors at the
 * bottom of this file (declared once, in manifest_int.h).
 */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sb/limits.h"
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

struct st_sb_manifest_t {
    netlist_t net, import;
    mlist_t files_read, files_write; /* normalised globs */
    grants_t collections, globals, stores;
    mlist_t services, jobs, workflows;
    mlist_t tools;   /* globs over tool names */
    mlist_t secrets; /* the target secrets the run receives, by name */
    int64_t timeout_ms, memory_mb;
};

typedef enum en_list_kind_t { LIST_NAMES, LIST_FILE_GLOBS, LIST_TOOL_GLOBS, LIST_SECRET_NAMES } list_kind_t;

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

static char ascii_lower(char c)
{
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

static sb_status_t copy_str(mstr_t *dst, const char *s, size_t len)
{
    if ((dst->p = malloc(len + 1)) == NULL)
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
    if ((out->v = calloc(n, sizeof(*out->v))) == NULL)
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
    if ((*out = calloc(cnt, sizeof(**out))) == NULL)
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
        if ((c = malloc(len + 1)) == NULL)
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
        free(r->methods[i]);
    free(r->methods);
    for (size_t i = 0; i != r->npaths; ++i)
        free(r->paths[i]);
    free(r->paths);
    memset(r, 0, sizeof(*r));
}

void sb_manifest__free_net(sb_net_entry_t *v, size_t n)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i != n; ++i)
        sb_manifest__free_rules(&v[i].rules);
    free(v);
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
    if ((*out = calloc(n, sizeof(**out))) == NULL)
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

/* ---- files and data ------------------------------------------------------------------------------------------------ */

static sb_status_t parse_files(const json_t *v, sb_manifest_t *m, char *err, size_t errsz)
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
    if ((out->v = calloc(n, sizeof(*out->v))) == NULL)
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

static sb_status_t parse_data(const json_t *v, sb_manifest_t *m, char *err, size_t errsz)
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

/* ---- public API ---------------------------------------------------------------------------------------------------- */

sb_status_t sb_manifest_parse(const json_t *caps, sb_manifest_t **out, char *err, size_t errsz)
{
    sb_manifest_t *m;
    const char *key;
    size_t klen;
    json_t *val;
    sb_status_t st = SB_OK;
    char q[MAX_QUOTE + 1];

    *out = NULL;
    if (err != NULL && errsz != 0)
        err[0] = '\0';
    if ((m = calloc(1, sizeof(*m))) == NULL)
        return SB_E_NOMEM;
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
        else if (key_is(key, klen, "timeoutMs"))
            st = parse_int(val, "capabilities.timeoutMs", 1, MAX_TIMEOUT_MS, &m->timeout_ms, err, errsz);
        else if (key_is(key, klen, "memoryMb"))
            st = parse_int(val, "capabilities.memoryMb", MIN_MEMORY_MB, MAX_MEMORY_MB, &m->memory_mb, err, errsz);
        else
            st = fail(err, errsz, "capabilities.%s: unknown key", quote(key, klen, q, sizeof(q)));
        if (st != SB_OK)
            goto Exit;
    }

Done:
    *out = m;
    return SB_OK;
Exit:
    if (st == SB_E_NOMEM && err != NULL && errsz != 0)
        snprintf(err, errsz, "capabilities: out of memory");
    sb_manifest_free(m);
    return st;
}

static void free_list(mlist_t *l)
{
    size_t i;

    for (i = 0; i != l->n; ++i)
        free(l->v[i].p);
    free(l->v);
}

static void free_grants(grants_t *g)
{
    size_t i;

    for (i = 0; i != g->n; ++i)
        free(g->v[i].name.p);
    free(g->v);
}

void sb_manifest_free(sb_manifest_t *m)
{
    if (m == NULL)
        return;
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
    free(m);
}

int64_t sb_manifest_timeout_ms(const sb_manifest_t *m)
{
    return m->timeout_ms;
}

/* ---- accessors for check.c (manifest_int.h) ------------------------------------------------------------------------ */

static unsigned grant_verbs(const grants_t *g, const char *name, size_t len)
{
    size_t i;

    for (i = 0; i != g->n; ++i)
        if (g->v[i].name.len == len && memcmp(g->v[i].name.p, name, len) == 0)
            return g->v[i].verbs;
    return 0;
}

static int list_has(const mlist_t *l, const char *name, size_t len)
{
    size_t i;

    for (i = 0; i != l->n; ++i)
        if (l->v[i].len == len && memcmp(l->v[i].p, name, len) == 0)
            return 1;
    return 0;
}

static int list_glob_any(const mlist_t *l, const char *s, size_t len)
{
    size_t i;

    for (i = 0; i != l->n; ++i)
        if (sb_glob_match(l->v[i].p, l->v[i].len, s, len))
            return 1;
    return 0;
}

unsigned sb_manifest__collection_verbs(const sb_manifest_t *m, const char *name, size_t len)
{
    return grant_verbs(&m->collections, name, len);
}

unsigned sb_manifest__global_verbs(const sb_manifest_t *m, const char *name, size_t len)
{
    return grant_verbs(&m->globals, name, len);
}

unsigned sb_manifest__store_verbs(const sb_manifest_t *m, const char *name, size_t len)
{
    return grant_verbs(&m->stores, name, len);
}

int sb_manifest__has_service(const sb_manifest_t *m, const char *name, size_t len)
{
    return list_has(&m->services, name, len);
}

int sb_manifest__has_job(const sb_manifest_t *m, const char *name, size_t len)
{
    return list_has(&m->jobs, name, len);
}

int sb_manifest__has_workflow(const sb_manifest_t *m, const char *name, size_t len)
{
    return list_has(&m->workflows, name, len);
}

size_t sb_manifest__files_read_count(const sb_manifest_t *m)
{
    return m->files_read.n;
}

int sb_manifest__files_read_match(const sb_manifest_t *m, const char *path, size_t len)
{
    return list_glob_any(&m->files_read, path, len);
}

int sb_manifest__files_write_match(const sb_manifest_t *m, const char *path, size_t len)
{
    return list_glob_any(&m->files_write, path, len);
}

/* upstream's files.list rule: some read glob, as a string, starts with dir + "/" */
int sb_manifest__files_read_under(const sb_manifest_t *m, const char *dir, size_t len)
{
    size_t i;

    for (i = 0; i != m->files_read.n; ++i) {
        const mstr_t *g = &m->files_read.v[i];
        if (g->len > len && memcmp(g->p, dir, len) == 0 && g->p[len] == '/')
            return 1;
    }
    return 0;
}

size_t sb_manifest__tools_count(const sb_manifest_t *m)
{
    return m->tools.n;
}

int sb_manifest__tools_match(const sb_manifest_t *m, const char *name, size_t len)
{
    return list_glob_any(&m->tools, name, len);
}

size_t sb_manifest__net_count(const sb_manifest_t *m)
{
    return m->net.n;
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
    return m != NULL ? m->secrets.n : 0;
}

const char *sb_manifest_secret_name(const sb_manifest_t *m, size_t i)
{
    return m != NULL && i < m->secrets.n ? m->secrets.v[i].p : NULL;
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
 * canonical host.
 */
int sb_manifest__entry_host_matches(const sb_net_entry_t *e, const sb_url_t *u)
{
    if (e->port != 0 && e->port != u->port)
        return 0;
    if (e->is_v6)
        return u->host_kind == SB_URL_HOST_IPV6 && memcmp(&e->v6, &u->addr.v6, sizeof(e->v6)) == 0;
    if (e->wildcard)
        return u->host_kind == SB_URL_HOST_NAME && u->host_len > e->host_len + 1 && u->host[u->host_len - e->host_len - 1] == '.' &&
               ieq_n(u->host + u->host_len - e->host_len, e->host, e->host_len);
    return u->host_kind != SB_URL_HOST_IPV6 && u->host_len == e->host_len && ieq_n(u->host, e->host, e->host_len);
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
 * routing) or a dot segment (which it may resolve) would let one path pass a
 * rule written for another, so such paths are refused outright.
 */
static int path_is_ambiguous(const char *p, size_t n)
{
    for (size_t i = 0; i + 2 < n; ++i) {
        if (p[i] == '%' && (p[i + 1] == '2' || p[i + 1] == '5')) {
            char c = ascii_lower(p[i + 2]);
            if ((p[i + 1] == '2' && (c == 'f' || c == 'e')) || (p[i + 1] == '5' && c == 'c'))
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

sb_net_verdict_t sb_manifest__rules_verdict(const sb_http_rules_t *r, const sb_url_t *u, const char *method)
{
    size_t i, plen;

    if (r->nmethods != 0) {
        for (i = 0; i != r->nmethods && strcmp(r->methods[i], method) != 0; ++i)
            ;
        if (i == r->nmethods)
            return SB_NET_METHOD;
    }
    if (r->npaths != 0) {
        plen = path_len(u);
        if (path_is_ambiguous(u->target, plen))
            return SB_NET_PATH_ENCODING;
        for (i = 0; i != r->npaths; ++i)
            if (sb_glob_match(r->paths[i], strlen(r->paths[i]), u->target, plen))
                return SB_NET_OK;
        return SB_NET_PATH;
    }
    return SB_NET_OK;
}

sb_net_verdict_t sb_manifest__net_verdict(const sb_manifest_t *m, const sb_url_t *u, const char *method)
{
    sb_net_verdict_t first = SB_NET_NO_HOST;
    size_t i;

    /* any entry that admits the host and the request grants it; else the first host entry's refusal is the reason */
    for (i = 0; i != m->net.n; ++i) {
        sb_net_verdict_t v;
        if (!sb_manifest__entry_host_matches(&m->net.v[i], u))
            continue;
        if ((v = sb_manifest__rules_verdict(&m->net.v[i].rules, u, method)) == SB_NET_OK)
            return SB_NET_OK;
        if (first == SB_NET_NO_HOST)
            first = v;
    }
    return first;
}

/* 1 when entry `n` admits every host and port entry `e` admits */
static int entry_covers(const net_entry_t *n, const net_entry_t *e)
{
    if (n->port != 0 && n->port != e->port)
        return 0;
    if (n->is_v6 || e->is_v6)
        return n->is_v6 && e->is_v6 && memcmp(&n->v6, &e->v6, sizeof(n->v6)) == 0;
    if (!n->wildcard)
        return !e->wildcard && n->host_len == e->host_len && memcmp(n->host, e->host, n->host_len) == 0;
    /* *.suffix covers *.suffix, *.x.suffix and x.suffix */
    if (e->wildcard && e->host_len == n->host_len && memcmp(e->host, n->host, n->host_len) == 0)
        return 1;
    return e->host_len > n->host_len + 1 && e->host[e->host_len - n->host_len - 1] == '.' &&
           memcmp(e->host + e->host_len - n->host_len, n->host, n->host_len) == 0;
}

int sb_manifest__net_covers(const sb_manifest_t *m, const sb_net_entry_t *e)
{
    for (size_t i = 0; i != m->net.n; ++i)
        if (entry_covers(&m->net.v[i], e))
            return 1;
    return 0;
}
