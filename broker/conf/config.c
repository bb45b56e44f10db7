#include <arpa/inet.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>
#include "sb/addr.h"
#include "conf/config.h"
#include "authz/secrets.h"
#include "obs/log.h"
#include "util/util.h"

enum kind { K_STR, K_UINT, K_INT, K_BOOL, K_OBJ };

static const struct key {
    const char *name;
    enum kind kind;
    size_t off;
    int64_t min, max;
} keys[] = {
    {"listen", K_STR, offsetof(sb_config_t, listen), 0, 0},
    {"admin_listen", K_STR, offsetof(sb_config_t, admin_listen), 0, 0},
    {"admin_secret_file", K_STR, offsetof(sb_config_t, admin_secret_file), 0, 0},
    {"admin_net_mint_secret_file", K_STR, offsetof(sb_config_t, admin_net_mint_secret_file), 0, 0},
    {"rpc_path", K_STR, offsetof(sb_config_t, rpc_path), 0, 0},
    {"token_store", K_STR, offsetof(sb_config_t, token_store), 0, 0},
    {"redis_prefix", K_STR, offsetof(sb_config_t, redis_prefix), 0, 0},
    {"redis_password", K_STR, offsetof(sb_config_t, redis_password), 0, 0},
    {"redis_password_file", K_STR, offsetof(sb_config_t, redis_password_file), 0, 0},
    {"redis_sentinel_password", K_STR, offsetof(sb_config_t, redis_sentinel_password), 0, 0},
    {"redis_sentinel_password_file", K_STR, offsetof(sb_config_t, redis_sentinel_password_file), 0, 0},
    {"threads", K_UINT, offsetof(sb_config_t, threads), 1, 64},
    {"max_connections", K_UINT, offsetof(sb_config_t, max_connections), 1, 1000000},
    {"max_ttl_ms", K_INT, offsetof(sb_config_t, max_ttl_ms), 1000, 7 * 86400000LL},
    {"default_ttl_ms", K_INT, offsetof(sb_config_t, default_ttl_ms), 1000, 7 * 86400000LL},
    {"max_tokens", K_UINT, offsetof(sb_config_t, max_tokens), 1, 10000000},
    {"store_timeout_ms", K_UINT, offsetof(sb_config_t, store_timeout_ms), 10, 60000},
    {"drain_timeout_ms", K_UINT, offsetof(sb_config_t, drain_timeout_ms), 0, 600000},
    {"quota_calls", K_INT, offsetof(sb_config_t, quota_calls), 1, 1000000},
    {"quota_concurrent", K_INT, offsetof(sb_config_t, quota_concurrent), 1, 1024},
    {"quota_fetch_bytes", K_INT, offsetof(sb_config_t, quota_fetch_bytes), 1, 1LL << 40},
    {"log_level", K_STR, offsetof(sb_config_t, log_level), 0, 0},
    {"log_calls", K_BOOL, offsetof(sb_config_t, log_calls), 0, 0},
    {"log_file", K_STR, offsetof(sb_config_t, log_file), 0, 0},
    {"audit", K_STR, offsetof(sb_config_t, audit), 0, 0},
    {"audit_key_file", K_STR, offsetof(sb_config_t, audit_key_file), 0, 0},
    {"audit_checkpoint_records", K_UINT, offsetof(sb_config_t, audit_checkpoint_records), 1, 1000000},
    {"timeline_max_events", K_UINT, offsetof(sb_config_t, timeline_max_events), 0, 100000},
    {"timeline_retention_ms", K_UINT, offsetof(sb_config_t, timeline_retention_ms), 0, 90 * 86400000LL},
    {"targets", K_OBJ, offsetof(sb_config_t, targets), 0, 0},
    {"database_url", K_STR, offsetof(sb_config_t, database_url), 0, 0},
    {"database_pool_size", K_UINT, offsetof(sb_config_t, database_pool_size), 1, 64},
    {"egress", K_OBJ, offsetof(sb_config_t, egress), 0, 0},
    {"decider", K_OBJ, offsetof(sb_config_t, decider), 0, 0},
    {"secrets_key_file", K_STR, offsetof(sb_config_t, secrets_key_file), 0, 0},
};
#define NKEYS (sizeof(keys) / sizeof(keys[0]))
_Static_assert(NKEYS <= 64, "sb_config_t records each key's source in a 64-bit mask");

#define ENV_PREFIX "SANDBOX_BROKER_"
#define ENV_PREFIX_LEN (sizeof(ENV_PREFIX) - 1)
/* the variables that are not keys: the secrets themselves never go into the file */
#define ENV_SECRET ENV_PREFIX "ADMIN_SECRET"
#define ENV_NET_MINT_SECRET ENV_PREFIX "ADMIN_NET_MINT_SECRET"

typedef struct st_errs_t {
    char *buf;
    size_t sz, len;
    int count;
} errs_t;

__attribute__((format(printf, 2, 3))) static void fail(errs_t *e, const char *fmt, ...)
{
    va_list ap;
    int n;
    ++e->count;
    if (e->len + 1 >= e->sz)
        return;
    va_start(ap, fmt);
    n = vsnprintf(e->buf + e->len, e->sz - e->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        e->len = e->len + (size_t)n < e->sz ? e->len + (size_t)n : e->sz - 1;
    if (e->len + 1 < e->sz) {
        e->buf[e->len++] = '\n';
        e->buf[e->len] = '\0';
    }
}

static void set_from_json(sb_config_t *c, const struct key *k, json_t *v, const char *origin, errs_t *e)
{
    char *base = (char *)c + k->off;
    switch (k->kind) {
    case K_STR:
        if (!json_is_string(v) || json_string_length(v) == 0 || strlen(json_string_value(v)) != json_string_length(v)) {
            fail(e, "%s: %s: expected a non-empty string", origin, k->name);
            return;
        }
        sb_mem_free(*(char **)base);
        *(char **)base = sb_mem_strdup(json_string_value(v));
        return;
    case K_UINT:
    case K_INT: {
        json_int_t n;
        if (!json_is_integer(v) || (n = json_integer_value(v)) < k->min || n > k->max) {
            fail(e, "%s: %s: expected an integer from %lld to %lld", origin, k->name, (long long)k->min, (long long)k->max);
            return;
        }
        if (k->kind == K_INT)
            *(int64_t *)base = (int64_t)n;
        else if (strcmp(k->name, "threads") == 0 || strcmp(k->name, "database_pool_size") == 0)
            *(unsigned *)base = (unsigned)n;
        else if (strcmp(k->name, "max_tokens") == 0 || strcmp(k->name, "max_connections") == 0)
            *(size_t *)base = (size_t)n;
        else
            *(uint64_t *)base = (uint64_t)n;
        return;
    }
    case K_BOOL:
        if (!json_is_boolean(v)) {
            fail(e, "%s: %s: expected true or false", origin, k->name);
            return;
        }
        *(int *)base = json_is_true(v);
        return;
    case K_OBJ:
        if (!json_is_object(v)) {
            fail(e, "%s: %s: expected an object", origin, k->name);
            return;
        }
        json_decref(*(json_t **)base);
        *(json_t **)base = json_incref(v);
        return;
    }
}

void sb_config_env_name(const char *key, char *buf, size_t bufsz)
{
    size_t n = (size_t)snprintf(buf, bufsz, ENV_PREFIX "%s", key);
    if (n >= bufsz)
        n = bufsz - 1;
    for (size_t j = ENV_PREFIX_LEN; j < n; ++j)
        if (buf[j] >= 'a' && buf[j] <= 'z')
            buf[j] = (char)(buf[j] - 'a' + 'A');
}

/* SANDBOX_BROKER_<KEY>: strings are taken as they are, everything else as JSON text */
static void apply_env(sb_config_t *c, errs_t *e)
{
    for (size_t i = 0; i < NKEYS; ++i) {
        char name[64], origin[80];
        const char *val;
        json_t *v;
        sb_config_env_name(keys[i].name, name, sizeof(name));
        if ((val = getenv(name)) == NULL)
            continue;
        c->_from_env |= UINT64_C(1) << i;
        snprintf(origin, sizeof(origin), "env %s", name);
        if (keys[i].kind == K_STR) {
            v = json_string(val);
        } else {
            v = json_loads(val, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
            if (v == NULL) {
                fail(e, "%s: not valid JSON", origin);
                continue;
            }
        }
        if (v == NULL) {
            fail(e, "%s: not valid UTF-8", origin);
            continue;
        }
        set_from_json(c, &keys[i], v, origin, e);
        json_decref(v);
    }
}

static int name_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

static char ascii_upper(char c)
{
    return c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c;
}

/* Levenshtein distance of two short ASCII strings, ignoring case (names are cut at 63 bytes) */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strnlen(a, 63), lb = strnlen(b, 63), row[64], i, j;
    for (j = 0; j <= lb; ++j)
        row[j] = j;
    for (i = 1; i <= la; ++i) {
        size_t diag = row[0];
        row[0] = i;
        for (j = 1; j <= lb; ++j) {
            size_t up = row[j], best = diag + (ascii_upper(a[i - 1]) != ascii_upper(b[j - 1]));
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/*
 * A SANDBOX_BROKER_* variable that names no key is a typo that would
 * otherwise be silent: SANDBOX_BROKER_TOKENSTORE=redis://... left the memory
 * store in place, and two instances stopped sharing tokens. Refuse it, and
 * name the closest known variable. Only names are printed, never values.
 */
static void check_unknown_env(errs_t *e)
{
    extern char **environ;
    for (char **ep = environ; ep != NULL && *ep != NULL; ++ep) {
        const char *var = *ep, *eq = strchr(var, '=');
        char name[64], best[64] = ENV_SECRET, cand[64];
        size_t nlen = eq != NULL ? (size_t)(eq - var) : strlen(var), bestd, i;
        if (nlen < ENV_PREFIX_LEN || memcmp(var, ENV_PREFIX, ENV_PREFIX_LEN) != 0)
            continue;
        if ((nlen == sizeof(ENV_SECRET) - 1 && memcmp(var, ENV_SECRET, nlen) == 0) ||
            (nlen == sizeof(ENV_NET_MINT_SECRET) - 1 && memcmp(var, ENV_NET_MINT_SECRET, nlen) == 0))
            continue;
        for (i = 0; i < NKEYS; ++i) {
            sb_config_env_name(keys[i].name, cand, sizeof(cand));
            if (strlen(cand) == nlen && memcmp(cand, var, nlen) == 0)
                break;
        }
        if (i != NKEYS)
            continue;
        /* quote the name safely: at most 63 bytes, anything but [A-Za-z0-9_] shown as '?' */
        for (i = 0; i < nlen && i < sizeof(name) - 1; ++i)
            name[i] = name_char(var[i]) ? var[i] : '?';
        name[i] = '\0';
        bestd = edit_distance(name + ENV_PREFIX_LEN, best + ENV_PREFIX_LEN);
        for (i = 0; i < NKEYS; ++i) {
            size_t d;
            sb_config_env_name(keys[i].name, cand, sizeof(cand));
            if ((d = edit_distance(name + ENV_PREFIX_LEN, cand + ENV_PREFIX_LEN)) < bestd) {
                bestd = d;
                memcpy(best, cand, sizeof(best));
            }
        }
        fail(e, "env %s%s: not a configuration variable; did you mean %s?", name, nlen >= sizeof(name) ? "..." : "", best);
    }
}

int sb_config_parse_addr(const char *s, struct sockaddr_storage *ss, socklen_t *len)
{
    return sb_parse_listen_addr(s, ss, len);
}

static char *read_secret_file(const char *key, const char *path, errs_t *e)
{
    FILE *fp = fopen(path, "r");
    char buf[1024];
    size_t n;

    if (fp == NULL) {
        fail(e, "%s: cannot open %s: %s", key, path, strerror(errno));
        return NULL;
    }
    n = fread(buf, 1, sizeof(buf) - 1, fp);
    if (!feof(fp)) {
        fail(e, "%s: %s is larger than %zu bytes", key, path, sizeof(buf) - 1);
        fclose(fp);
        return NULL;
    }
    fclose(fp);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        --n;
    buf[n] = '\0';
    {
        char *out = sb_mem_strdup(buf);
        explicit_bzero(buf, sizeof(buf));
        return out;
    }
}

static void validate_targets(const json_t *targets, errs_t *e)
{
    const char *name;
    json_t *t;
    json_object_foreach((json_t *)targets, name, t)
    {
        size_t n = strlen(name);
        int okname = n > 0 && n <= 128;
        for (size_t i = 0; okname && i < n; ++i)
            okname = (name[i] >= 'a' && name[i] <= 'z') || (name[i] >= 'A' && name[i] <= 'Z') ||
                     (name[i] >= '0' && name[i] <= '9') || name[i] == '_' || name[i] == '-';
        if (!okname)
            fail(e, "targets.%s: target names are [A-Za-z0-9_-]{1,128}", name);
        if (!json_is_object(t))
            fail(e, "targets.%s: expected an object", name);
    }
}

sb_status_t sb_config_load(const char *path, int require_secret, sb_config_t **out, char *err, size_t errsz)
{
    sb_config_t *c = sb_mem_calloc(1, sizeof(*c));
    errs_t e = {err, errsz, 0, 0};
    const char *env_secret;

    err[0] = '\0';
    c->listen = sb_mem_strdup("127.0.0.1:8080");
    c->admin_listen = sb_mem_strdup("127.0.0.1:8081");
    c->rpc_path = sb_mem_strdup("/api/sandbox/rpc");
    c->token_store = sb_mem_strdup("memory");
    c->redis_prefix = sb_mem_strdup("sb:");
    c->threads = 2;
    c->max_connections = 4096;
    c->database_pool_size = 4;
    c->max_ttl_ms = 3600000;
    c->default_ttl_ms = 300000;
    c->max_tokens = 100000;
    c->store_timeout_ms = 1000;
    c->drain_timeout_ms = 10000;
    c->quota_calls = 1024;
    c->quota_concurrent = 16;
    c->quota_fetch_bytes = 64LL * 1024 * 1024;
    c->log_level = sb_mem_strdup("info");
    c->log_calls = 1;
    c->audit = sb_mem_strdup("off");
    c->audit_checkpoint_records = 1000;
    c->timeline_max_events = 1000;
    c->timeline_retention_ms = 86400000;
    c->log_file = sb_mem_strdup("stderr");
    c->targets = json_object();
    c->egress = json_object();
    c->decider = json_object();

    if (path != NULL) {
        json_error_t jerr;
        json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
        if (root == NULL) {
            fail(&e, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
        } else if (!json_is_object(root)) {
            fail(&e, "%s: expected a JSON object", path);
            json_decref(root);
        } else {
            const char *k;
            json_t *v;
            json_object_foreach(root, k, v)
            {
                size_t i = 0;
                while (i < NKEYS && strcmp(keys[i].name, k) != 0)
                    ++i;
                if (i == NKEYS) {
                    fail(&e, "%s: %s: unknown key", path, k);
                    continue;
                }
                c->_from_file |= UINT64_C(1) << i;
                set_from_json(c, &keys[i], v, path, &e);
            }
            json_decref(root);
        }
    }
    apply_env(c, &e);
    check_unknown_env(&e);

    if (sb_config_parse_addr(c->listen, &c->listen_addr, &c->listen_addrlen) != 0)
        fail(&e, "listen: expected host:port with a numeric host, got \"%s\"", c->listen);
    if (sb_config_parse_addr(c->admin_listen, &c->admin_addr, &c->admin_addrlen) != 0)
        fail(&e, "admin_listen: expected host:port with a numeric host, got \"%s\"", c->admin_listen);
    if (c->rpc_path[0] != '/' || strlen(c->rpc_path) > 256 || strncmp(c->rpc_path, "/admin", 6) == 0 ||
        strcmp(c->rpc_path, "/healthz") == 0 || strcmp(c->rpc_path, "/readyz") == 0)
        fail(&e, "rpc_path: expected an absolute path outside /admin, /healthz and /readyz");
    if (sb_log_parse_level(c->log_level) < 0)
        fail(&e, "log_level: expected debug, info, warn or error");
    if (c->default_ttl_ms > c->max_ttl_ms)
        fail(&e, "default_ttl_ms: larger than max_ttl_ms");
    validate_targets(c->targets, &e);
    if (c->database_url != NULL) {
        /* syntax only, without connecting; libpq's message is not quoted: it may repeat part of a password */
        char *perr = NULL;
        PQconninfoOption *opts = PQconninfoParse(c->database_url, &perr);
        if (opts == NULL)
            fail(&e, "database_url: not a valid PostgreSQL connection string (a URI or key=value pairs)");
        PQconninfoFree(opts);
        PQfreemem(perr);
    }

    if ((env_secret = getenv(ENV_SECRET)) != NULL && env_secret[0] != '\0') {
        c->admin_secret = sb_mem_strdup(env_secret);
        c->_secret_from_env = 1;
    } else if (c->admin_secret_file != NULL)
        c->admin_secret = read_secret_file("admin_secret_file", c->admin_secret_file, &e);
    if (c->admin_secret != NULL && strlen(c->admin_secret) < 16)
        fail(&e, "admin secret: shorter than 16 bytes");
    if (require_secret && c->admin_secret == NULL)
        fail(&e, "admin secret: none given; set SANDBOX_BROKER_ADMIN_SECRET or admin_secret_file");
    /* the net-mint credential (http/admin_netmint.h): optional, long, and never the admin secret */
    if ((env_secret = getenv(ENV_NET_MINT_SECRET)) != NULL && env_secret[0] != '\0') {
        c->admin_net_mint_secret = sb_mem_strdup(env_secret);
        c->_net_mint_secret_from_env = 1;
    } else if (c->admin_net_mint_secret_file != NULL)
        c->admin_net_mint_secret = read_secret_file("admin_net_mint_secret_file", c->admin_net_mint_secret_file, &e);
    if (c->admin_net_mint_secret != NULL && strlen(c->admin_net_mint_secret) < 32)
        fail(&e, "net-mint secret: shorter than 32 bytes");
    if (c->admin_net_mint_secret != NULL && c->admin_secret != NULL && strcmp(c->admin_net_mint_secret, c->admin_secret) == 0)
        fail(&e, "net-mint secret: must differ from the admin secret");

    if (c->secrets_key_file != NULL) {
        char kerr[512];
        if (sb_secrets_read_key(c->secrets_key_file, c->secrets_key, kerr, sizeof(kerr)) == SB_OK)
            c->has_secrets_key = 1;
        else
            fail(&e, "%s", kerr);
    }

    if (e.count != 0) {
        sb_config_free(c);
        return SB_E_BAD_ARGS;
    }
    *out = c;
    return SB_OK;
}

void sb_config_free(sb_config_t *c)
{
    if (c == NULL)
        return;
    sb_mem_free(c->listen);
    sb_mem_free(c->admin_listen);
    sb_mem_free(c->admin_secret_file);
    if (c->admin_secret != NULL) {
        explicit_bzero(c->admin_secret, strlen(c->admin_secret));
        sb_mem_free(c->admin_secret);
    }
    sb_mem_free(c->admin_net_mint_secret_file);
    sb_mem_free(c->secrets_key_file);
    sb_mem_free(c->audit_key_file);
    explicit_bzero(c->secrets_key, sizeof(c->secrets_key));
    if (c->admin_net_mint_secret != NULL) {
        explicit_bzero(c->admin_net_mint_secret, strlen(c->admin_net_mint_secret));
        sb_mem_free(c->admin_net_mint_secret);
    }
    sb_mem_free(c->rpc_path);
    sb_mem_free(c->token_store);
    sb_mem_free(c->redis_prefix);
    if (c->redis_password != NULL)
        explicit_bzero(c->redis_password, strlen(c->redis_password));
    sb_mem_free(c->redis_password);
    sb_mem_free(c->redis_password_file);
    if (c->redis_sentinel_password != NULL)
        explicit_bzero(c->redis_sentinel_password, strlen(c->redis_sentinel_password));
    sb_mem_free(c->redis_sentinel_password);
    sb_mem_free(c->redis_sentinel_password_file);
    sb_mem_free(c->log_level);
    sb_mem_free(c->audit);
    sb_mem_free(c->log_file);
    sb_mem_free(c->database_url);
    json_decref(c->targets);
    json_decref(c->egress);
    json_decref(c->decider);
    sb_mem_free(c);
}

void sb_config_print_keys(FILE *fp)
{
    char env[64];
    for (size_t i = 0; i < NKEYS; ++i) {
        sb_config_env_name(keys[i].name, env, sizeof(env));
        fprintf(fp, "%s %s\n", keys[i].name, env);
    }
    fprintf(fp, "- %s\n", ENV_SECRET);
    fprintf(fp, "- %s\n", ENV_NET_MINT_SECRET);
}

static void append_word(char *buf, size_t sz, size_t *len, const char *w)
{
    int n = snprintf(buf + *len, sz - *len, "%s%s", *len != 0 ? " " : "", w);
    if (n > 0)
        *len = *len + (size_t)n < sz ? *len + (size_t)n : sz - 1;
}

void sb_config_sources(const sb_config_t *c, char *env, size_t envsz, char *overridden, size_t osz)
{
    size_t elen = 0, olen = 0;
    char name[64];
    env[0] = overridden[0] = '\0';
    for (size_t i = 0; i < NKEYS; ++i) {
        if ((c->_from_env & (UINT64_C(1) << i)) == 0)
            continue;
        sb_config_env_name(keys[i].name, name, sizeof(name));
        append_word(env, envsz, &elen, name);
        if (c->_from_file & (UINT64_C(1) << i))
            append_word(overridden, osz, &olen, keys[i].name);
    }
    if (c->_secret_from_env)
        append_word(env, envsz, &elen, ENV_SECRET);
    if (c->_net_mint_secret_from_env)
        append_word(env, envsz, &elen, ENV_NET_MINT_SECRET);
}
