/*
 * The Redis backend's configuration: the token_store URL (redis://,
 * unix://, redis-sentinel://), the passwords, the scripts' digests, and what
 * --check-config does with them: the same steps as a worker, blocking.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
#include <openssl/evp.h>
#include "obs/log.h"
#include "store/store_redis_int.h"
#include "util/util.h"

/* ---- configuration ----------------------------------------------------------------------------------------------------- */

static char create_err[512];

/* "localhost" or an IP literal; *p is moved past the host, its port and nothing more */
static int parse_hostport(const char **pp, const char *end, int default_port, sb_store_addr_t *out)
{
    const char *p = *pp, *host, *hend;
    char tmp[64];
    struct in6_addr a6;
    struct in_addr a4;
    long port = default_port;

    if (p < end && *p == '[') {
        host = p + 1;
        if ((hend = memchr(host, ']', (size_t)(end - host))) == NULL)
            return -1;
        p = hend + 1;
    } else {
        host = p;
        while (p < end && *p != ':' && *p != ',' && *p != '/')
            ++p;
        hend = p;
    }
    if (hend == host || (size_t)(hend - host) >= sizeof(tmp))
        return -1;
    memcpy(tmp, host, (size_t)(hend - host));
    tmp[hend - host] = '\0';
    if (p < end && *p == ':') {
        char *pend;
        const char *ps = ++p;
        while (p < end && *p >= '0' && *p <= '9')
            ++p;
        if (p == ps || p - ps > 5)
            return -1;
        port = strtol(ps, &pend, 10);
        if (pend != p || port < 1 || port > 65535)
            return -1;
    }
    if (strcmp(tmp, "localhost") == 0)
        memcpy(tmp, "127.0.0.1", sizeof("127.0.0.1"));
    if (inet_pton(AF_INET, tmp, &a4) != 1 && inet_pton(AF_INET6, tmp, &a6) != 1)
        return -2;
    memcpy(out->host, tmp, strlen(tmp) + 1);
    out->port = (int)port;
    *pp = p;
    return 0;
}

static int parse_db(const char *p, int *db)
{
    char *end;
    long v;
    if (*p < '0' || *p > '9')
        return -1;
    v = strtol(p, &end, 10);
    if (*end != '\0' || v < 0 || v > 255)
        return -1;
    *db = (int)v;
    return 0;
}

static sb_status_t parse_sentinel_url(sb_store_t *s, const char *url, const char **err)
{
    const char *p = url + sizeof("redis-sentinel://") - 1, *end = p + strlen(p), *name;
    size_t nlen;

    for (;;) {
        int r;
        if (s->nsentinels == SB_STORE_MAX_SENTINELS) {
            *err = "token_store: at most 16 sentinels";
            return SB_E_BAD_ARGS;
        }
        if ((r = parse_hostport(&p, end, 26379, &s->sentinels[s->nsentinels])) != 0) {
            *err = r == -2 ? "token_store: a sentinel host must be an IP literal or localhost"
                           : "token_store: expected redis-sentinel://host:port[,host:port...]/<master-name>[/db]";
            return SB_E_BAD_ARGS;
        }
        ++s->nsentinels;
        if (p < end && *p == ',') {
            ++p;
            continue;
        }
        break;
    }
    if (p == end || *p != '/') {
        *err = "token_store: redis-sentinel:// needs /<master-name> after the sentinels";
        return SB_E_BAD_ARGS;
    }
    name = ++p;
    while (p < end && *p != '/')
        ++p;
    nlen = (size_t)(p - name);
    if (nlen == 0 || nlen > SB_STORE_MAX_MASTER_NAME) {
        *err = "token_store: the master name must be 1-64 characters of [A-Za-z0-9._-]";
        return SB_E_BAD_ARGS;
    }
    for (size_t i = 0; i < nlen; ++i) {
        char ch = name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' ||
              ch == '-')) {
            *err = "token_store: the master name must be 1-64 characters of [A-Za-z0-9._-]";
            return SB_E_BAD_ARGS;
        }
    }
    memcpy(s->master, name, nlen);
    s->master[nlen] = '\0';
    if (p < end && (p + 1 == end || parse_db(p + 1, &s->db) != 0)) {
        *err = "token_store: bad database number (0-255) after the master name";
        return SB_E_BAD_ARGS;
    }
    return SB_OK;
}

sb_status_t sb_store__redis_parse_url(sb_store_t *s, const char *url, const char **err)
{
    const char *p, *at, *end;
    int r;

    if (strncmp(url, "redis-sentinel://", 17) == 0)
        return parse_sentinel_url(s, url, err);
    if (strncmp(url, "unix://", 7) == 0) {
        const char *q = strchr(url + 7, '?');
        size_t n = q != NULL ? (size_t)(q - (url + 7)) : strlen(url + 7);
        if (n == 0 || url[7] != '/') {
            *err = "token_store: unix:// needs an absolute socket path";
            return SB_E_BAD_ARGS;
        }
        s->unix_path = sb_mem_alloc(n + 1);
        memcpy(s->unix_path, url + 7, n);
        s->unix_path[n] = '\0';
        if (q != NULL && (strncmp(q, "?db=", 4) != 0 || parse_db(q + 4, &s->db) != 0)) {
            *err = "token_store: unix:// accepts only ?db=N (0-255)";
            return SB_E_BAD_ARGS;
        }
        return SB_OK;
    }
    if (strncmp(url, "redis://", 8) != 0) {
        *err = "token_store: expected \"memory\", redis://host:port[/db] or unix:///path, or "
               "redis-sentinel://host:port[,host:port...]/<master-name>[/db]";
        return SB_E_BAD_ARGS;
    }
    p = url + 8;
    if ((at = strrchr(p, '@')) != NULL) {
        const char *pw = *p == ':' ? p + 1 : p;
        s->password = sb_mem_alloc((size_t)(at - pw) + 1);
        memcpy(s->password, pw, (size_t)(at - pw));
        s->password[at - pw] = '\0';
        p = at + 1;
    }
    end = p + strlen(p);
    if ((r = parse_hostport(&p, end, 6379, &s->addr)) != 0) {
        *err = r == -2 ? "token_store: the redis host must be an IP literal or localhost" : "token_store: bad host or port";
        return SB_E_BAD_ARGS;
    }
    if (*p == '/' && p[1] != '\0') {
        if (parse_db(p + 1, &s->db) != 0) {
            *err = "token_store: bad database number";
            return SB_E_BAD_ARGS;
        }
    } else if (*p != '\0' && !(p[0] == '/' && p[1] == '\0')) {
        *err = "token_store: trailing characters after the port";
        return SB_E_BAD_ARGS;
    }
    return SB_OK;
}

/* a password inline or from a file (trailing newlines dropped, at most 1023 bytes); NULL with *err set on failure */
static int resolve_secret(const char *key, const char *inline_value, const char *file, char **out, const char **err)
{
    FILE *fp;
    char buf[1024];
    size_t n;

    if (inline_value != NULL && file != NULL) {
        snprintf(create_err, sizeof(create_err), "%s and %s_file: give one of the two", key, key);
        *err = create_err;
        return -1;
    }
    if (inline_value != NULL) {
        *out = sb_mem_strdup(inline_value);
        return 0;
    }
    if (file == NULL)
        return 0;
    if ((fp = fopen(file, "r")) == NULL) {
        snprintf(create_err, sizeof(create_err), "%s_file: cannot open %s: %s", key, file, strerror(errno));
        *err = create_err;
        return -1;
    }
    n = fread(buf, 1, sizeof(buf) - 1, fp);
    if (!feof(fp)) {
        fclose(fp);
        snprintf(create_err, sizeof(create_err), "%s_file: %s is larger than %zu bytes", key, file, sizeof(buf) - 1);
        *err = create_err;
        return -1;
    }
    fclose(fp);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        --n;
    if (n == 0) {
        snprintf(create_err, sizeof(create_err), "%s_file: %s is empty", key, file);
        *err = create_err;
        return -1;
    }
    buf[n] = '\0';
    *out = sb_mem_strdup(buf);
    explicit_bzero(buf, sizeof(buf));
    return 0;
}

sb_status_t sb_store__redis_init(sb_store_t *s, const sb_store_config_t *conf, const char **err)
{
    sb_status_t st;

    if (strlen(s->prefix) > 256) {
        *err = "redis_prefix: at most 256 bytes";
        return SB_E_BAD_ARGS;
    }
    if ((st = sb_store__redis_parse_url(s, conf->url, err)) != SB_OK)
        return st;
    if (s->password != NULL && (conf->password != NULL || conf->password_file != NULL)) {
        *err = "token_store: a password in the URL and in redis_password: give one of the two";
        return SB_E_BAD_ARGS;
    }
    if (s->password == NULL && resolve_secret("redis_password", conf->password, conf->password_file, &s->password, err) != 0)
        return SB_E_BAD_ARGS;
    if (s->nsentinels == 0 && (conf->sentinel_password != NULL || conf->sentinel_password_file != NULL)) {
        *err = "redis_sentinel_password: token_store is not a redis-sentinel:// URL";
        return SB_E_BAD_ARGS;
    }
    if (resolve_secret("redis_sentinel_password", conf->sentinel_password, conf->sentinel_password_file, &s->sentinel_password,
                       err) != 0)
        return SB_E_BAD_ARGS;
    for (size_t i = 0; i < SB_STORE_NSCRIPTS; ++i) {
        unsigned char md[20];
        unsigned int mdlen = 0;
        if (EVP_Digest(sb_store__redis_scripts[i].body, sb_store__redis_scripts[i].len, md, &mdlen, EVP_sha1(), NULL) != 1 ||
            mdlen != 20)
            sb_fatal(__FILE__, __LINE__, "SHA-1 is not available");
        sb_hex(md, 20, s->sha[i]);
    }
    return SB_OK;
}

static void free_secret(char *p)
{
    if (p != NULL) {
        explicit_bzero(p, strlen(p));
        sb_mem_free(p);
    }
}

void sb_store__redis_free(sb_store_t *s)
{
    sb_mem_free(s->unix_path);
    free_secret(s->password);
    free_secret(s->sentinel_password);
}

void sb_store__redis_format_addr(const sb_store_addr_t *a, char *out, size_t outsz)
{
    snprintf(out, outsz, strchr(a->host, ':') != NULL ? "[%s]:%d" : "%s:%d", a->host, a->port);
}

static int is_ip_literal(const char *s)
{
    struct in6_addr a6;
    struct in_addr a4;
    return inet_pton(AF_INET, s, &a4) == 1 || inet_pton(AF_INET6, s, &a6) == 1;
}

/* "<ip> <port>" pieces of a sentinel answer into an address; 0, or -1 when either is not numeric */
int sb_store__redis_addr_from(const char *host, size_t hlen, const char *port, size_t plen, sb_store_addr_t *out)
{
    char pbuf[8];
    char *end;
    long v;

    if (hlen == 0 || hlen >= sizeof(out->host) || plen == 0 || plen >= sizeof(pbuf) || memchr(host, '\0', hlen) != NULL ||
        memchr(port, '\0', plen) != NULL)
        return -1;
    memcpy(out->host, host, hlen);
    out->host[hlen] = '\0';
    memcpy(pbuf, port, plen);
    pbuf[plen] = '\0';
    if (pbuf[0] < '0' || pbuf[0] > '9')
        return -1;
    v = strtol(pbuf, &end, 10);
    if (*end != '\0' || v < 1 || v > 65535 || !is_ip_literal(out->host))
        return -1;
    out->port = (int)v;
    return 0;
}

int sb_store__parse_switch_master(const char *msg, size_t len, const char *master, sb_store_addr_t *to)
{
    const char *f[5];
    size_t flen[5], n = 0, i = 0;

    /* exactly five fields separated by single spaces (Sentinel's own format) */
    for (;;) {
        size_t start = i;
        while (i < len && msg[i] != ' ')
            ++i;
        if (i == start || n == 5)
            return -1;
        f[n] = msg + start;
        flen[n++] = i - start;
        if (i == len)
            break;
        ++i; /* the space */
    }
    if (n != 5)
        return -1;
    if (flen[0] != strlen(master) || memcmp(f[0], master, flen[0]) != 0)
        return 0;
    return sb_store__redis_addr_from(f[3], flen[3], f[4], flen[4], to) == 0 ? 1 : -1;
}

/* ---- --check-config: the same steps, blocking ------------------------------------------------------------------------- */

static redisContext *check_connect(const sb_store_t *s, const sb_store_addr_t *to, const char *path, const char *where, char *err,
                                   size_t errsz)
{
    struct timeval tv = {(time_t)(s->timeout_ms / 1000), (suseconds_t)((s->timeout_ms % 1000) * 1000)};
    redisContext *c = path != NULL ? redisConnectUnixWithTimeout(path, tv) : redisConnectWithTimeout(to->host, to->port, tv);

    if (c == NULL || c->err) {
        snprintf(err, errsz, "%s: connect failed: %s", where, c != NULL ? c->errstr : "out of memory");
        redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    return c;
}

/* one command; NULL with err filled when it did not answer, or answered an error */
static redisReply *check_cmd(redisContext *c, const char *where, const char *what, int argc, const char **argv, const size_t *lens,
                             char *err, size_t errsz)
{
    redisReply *r = redisCommandArgv(c, argc, argv, lens);
    if (r == NULL) {
        snprintf(err, errsz, "%s: %s: %s", where, what, c->err ? c->errstr : "no answer");
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        snprintf(err, errsz, "%s: %s refused: %s", where, what, r->str);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

static int check_auth(redisContext *c, const char *where, const char *pw, char *err, size_t errsz)
{
    const char *argv[] = {"AUTH", pw};
    size_t lens[] = {4, strlen(pw)};
    redisReply *r = check_cmd(c, where, "AUTH", 2, argv, lens, err, errsz);
    if (r == NULL)
        return -1;
    freeReplyObject(r);
    return 0;
}

/* a command whose answer is only checked for being no error */
static int check_ok(redisContext *c, const char *where, const char *what, int argc, const char **argv, const size_t *lens,
                    char *err, size_t errsz)
{
    redisReply *r = check_cmd(c, where, what, argc, argv, lens, err, errsz);
    if (r == NULL)
        return -1;
    freeReplyObject(r);
    return 0;
}

/*
 * What a worker's invalidation link needs, end to end (store_redis_conn.c): a
 * second connection subscribed to __redis__:invalidate, tracking on the data
 * connection redirected there, and a heartbeat key written on the data
 * connection whose invalidation must arrive within the timeout. Tracking is
 * turned off again before the connections close.
 */
static int check_tracking(const sb_store_t *s, redisContext *data, const sb_store_addr_t *to, const char *where, char *err,
                          size_t errsz)
{
    char id[24], tprefix[KEY_MAX], hb[KEY_MAX], salt[8], hex[17];
    redisContext *inv;
    redisReply *r;
    int ok = -1;

    if ((inv = check_connect(s, to, s->unix_path, where, err, errsz)) == NULL)
        return -1;
    if (s->password != NULL && check_auth(inv, where, s->password, err, errsz) != 0)
        goto Exit;
    {
        const char *argv[] = {"CLIENT", "ID"};
        size_t lens[] = {6, 2};
        if ((r = check_cmd(inv, where, "CLIENT ID", 2, argv, lens, err, errsz)) == NULL)
            goto Exit;
        snprintf(id, sizeof(id), "%lld", r->type == REDIS_REPLY_INTEGER ? r->integer : -1LL);
        freeReplyObject(r);
    }
    {
        const char *argv[] = {"SUBSCRIBE", "__redis__:invalidate"};
        size_t lens[] = {9, 20};
        if ((r = check_cmd(inv, where, "SUBSCRIBE __redis__:invalidate", 2, argv, lens, err, errsz)) == NULL)
            goto Exit;
        freeReplyObject(r);
    }
    if (sb_random(salt, sizeof(salt)) != SB_OK) {
        snprintf(err, errsz, "no randomness for the heartbeat key");
        goto Exit;
    }
    sb_hex((const uint8_t *)salt, sizeof(salt), hex);
    snprintf(tprefix, sizeof(tprefix), "%stok:", s->prefix);
    snprintf(hb, sizeof(hb), "%shb:check.%s", s->prefix, hex);
    {
        const char *argv[] = {"CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST", "PREFIX", tprefix, "PREFIX", hb};
        size_t lens[] = {6, 8, 2, 8, strlen(id), 5, 6, strlen(tprefix), 6, strlen(hb)};
        if (check_ok(data, where, "CLIENT TRACKING", 10, argv, lens, err, errsz) != 0)
            goto Exit;
    }
    {
        const char *argv[] = {"SET", hb, "1", "PX", "10000"};
        size_t lens[] = {3, strlen(hb), 1, 2, 5};
        if (check_ok(data, where, "SET of the heartbeat key", 5, argv, lens, err, errsz) != 0)
            goto Exit;
    }
    /* the invalidation of the heartbeat key, within the timeout (redisSetTimeout); tokens minted meanwhile may come first */
    for (int i = 0; i < 64 && ok != 0; ++i) {
        if (redisGetReply(inv, (void **)&r) != REDIS_OK) {
            snprintf(err, errsz, "%s: no invalidation came back for the heartbeat key: %s", where,
                     inv->err ? inv->errstr : "no answer");
            goto Exit;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 || r->element[2]->type != REDIS_REPLY_ARRAY) {
            snprintf(err, errsz, "%s: the invalidation link got something other than an invalidation", where);
            freeReplyObject(r);
            goto Exit;
        }
        for (size_t k = 0; k < r->element[2]->elements; ++k)
            if (r->element[2]->element[k]->type == REDIS_REPLY_STRING && strcmp(r->element[2]->element[k]->str, hb) == 0)
                ok = 0;
        freeReplyObject(r);
    }
    if (ok != 0)
        snprintf(err, errsz, "%s: no invalidation came back for the heartbeat key", where);
Exit : {
    const char *argv[] = {"CLIENT", "TRACKING", "OFF"};
    size_t lens[] = {6, 8, 3};
    redisReply *off = redisCommandArgv(data, 3, argv, lens);
    if (off != NULL)
        freeReplyObject(off);
}
    redisFree(inv);
    return ok;
}

static int check_primary(const sb_store_t *s, const sb_store_addr_t *to, char *err, size_t errsz)
{
    char where[96], db[8];
    redisContext *c;
    redisReply *r;
    int ok = -1;

    if (s->unix_path != NULL)
        snprintf(where, sizeof(where), "%s", s->unix_path);
    else
        sb_store__redis_format_addr(to, where, sizeof(where));
    if ((c = check_connect(s, to, s->unix_path, where, err, errsz)) == NULL)
        return -1;
    if (s->password != NULL && check_auth(c, where, s->password, err, errsz) != 0)
        goto Exit;
    if (s->db != 0) {
        const char *argv[] = {"SELECT", db};
        size_t lens[] = {6, (size_t)snprintf(db, sizeof(db), "%d", s->db)};
        if ((r = check_cmd(c, where, "SELECT", 2, argv, lens, err, errsz)) == NULL)
            goto Exit;
        freeReplyObject(r);
    }
    for (int i = 0; i < SB_STORE_NSCRIPTS; ++i) {
        const char *argv[] = {"SCRIPT", "LOAD", sb_store__redis_scripts[i].body};
        size_t lens[] = {6, 4, sb_store__redis_scripts[i].len};
        if ((r = check_cmd(c, where, "SCRIPT LOAD", 3, argv, lens, err, errsz)) == NULL)
            goto Exit;
        if (r->type != REDIS_REPLY_STRING || r->len != 40 || memcmp(r->str, s->sha[i], 40) != 0) {
            snprintf(err, errsz, "%s: SCRIPT LOAD: unexpected answer", where);
            freeReplyObject(r);
            goto Exit;
        }
        freeReplyObject(r);
    }
    {
        const char *argv[] = {"ROLE"};
        size_t lens[] = {4};
        if ((r = check_cmd(c, where, "ROLE", 1, argv, lens, err, errsz)) == NULL)
            goto Exit;
        if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 || r->element[0]->type != REDIS_REPLY_STRING ||
            strcmp(r->element[0]->str, "master") != 0) {
            snprintf(err, errsz, "%s: the node is not a primary (ROLE: %.32s)", where,
                     r->type == REDIS_REPLY_ARRAY && r->elements >= 1 && r->element[0]->type == REDIS_REPLY_STRING
                         ? r->element[0]->str
                         : "?");
            freeReplyObject(r);
            goto Exit;
        }
        freeReplyObject(r);
    }
    if (check_tracking(s, c, to, where, err, errsz) != 0)
        goto Exit;
    ok = 0;
Exit:
    redisFree(c);
    return ok;
}

/* asks one sentinel for the primary */
static int check_sentinel(const sb_store_t *s, const sb_store_addr_t *sent, sb_store_addr_t *primary, char *err, size_t errsz)
{
    char where[112];
    redisContext *c;
    redisReply *r;
    int ok = -1;
    const char *argv[] = {"SENTINEL", "get-master-addr-by-name", s->master};
    size_t lens[] = {8, 23, strlen(s->master)};

    char a[96];

    sb_store__redis_format_addr(sent, a, sizeof(a));
    snprintf(where, sizeof(where), "%s (sentinel)", a);
    if ((c = check_connect(s, sent, NULL, where, err, errsz)) == NULL)
        return -1;
    if (s->sentinel_password != NULL && check_auth(c, where, s->sentinel_password, err, errsz) != 0)
        goto Exit;
    if ((r = check_cmd(c, where, "SENTINEL get-master-addr-by-name", 3, argv, lens, err, errsz)) == NULL)
        goto Exit;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[0]->type == REDIS_REPLY_STRING &&
        r->element[1]->type == REDIS_REPLY_STRING &&
        sb_store__redis_addr_from(r->element[0]->str, r->element[0]->len, r->element[1]->str, r->element[1]->len, primary) == 0)
        ok = 0;
    else if (r->type == REDIS_REPLY_NIL)
        snprintf(err, errsz, "%s: does not know master \"%s\"", where, s->master);
    else
        snprintf(err, errsz, "%s: no numeric primary address in its answer", where);
    freeReplyObject(r);
Exit:
    redisFree(c);
    return ok;
}

/*
 * What kind of failure a check's message (made above) reports: a node that refused our
 * credentials (AUTH refused, or a command refused with NOAUTH or WRONGPASS) is
 * SB_E_UNAUTHORIZED; one that did not answer (connect failed, no answer) SB_E_UNAVAILABLE; any
 * other refusal (SELECT of a database that does not exist, a replica, an unknown master name) is
 * the configuration's: SB_E_BAD_ARGS.
 */
static sb_status_t check_kind(const char *err)
{
    /* a node that is loading its data set, busy with a script, or without its primary: an outage, not the configuration */
    if (strstr(err, " refused: LOADING") != NULL || strstr(err, " refused: BUSY") != NULL ||
        strstr(err, " refused: MASTERDOWN") != NULL || strstr(err, " refused: TRYAGAIN") != NULL)
        return SB_E_UNAVAILABLE;
    if (strstr(err, ": AUTH refused: ") != NULL || strstr(err, " refused: NOAUTH") != NULL ||
        strstr(err, " refused: WRONGPASS") != NULL)
        return SB_E_UNAUTHORIZED;
    if (strstr(err, ": connect failed: ") != NULL || strstr(err, " refused: ") == NULL)
        return strstr(err, "the node is not a primary") != NULL || strstr(err, "does not know master") != NULL ||
                       strstr(err, "unexpected answer") != NULL || strstr(err, "no numeric primary address") != NULL
                   ? SB_E_BAD_ARGS
                   : SB_E_UNAVAILABLE;
    return SB_E_BAD_ARGS;
}

sb_status_t sb_store__redis_check(sb_store_t *s, char *err, size_t errsz)
{
    sb_store_addr_t primary;
    size_t used = 0;
    sb_status_t worst = SB_E_UNAVAILABLE;

    if (s->nsentinels == 0)
        return check_primary(s, &s->addr, err, errsz) == 0 ? SB_OK : check_kind(err);
    /* the first sentinel that answers names the primary; every refusal is reported when none does */
    for (size_t i = 0; i < s->nsentinels; ++i) {
        char one[384];
        if (check_sentinel(s, &s->sentinels[i], &primary, one, sizeof(one)) == 0)
            return check_primary(s, &primary, err, errsz) == 0 ? SB_OK : check_kind(err);
        /* the most telling of the sentinels' answers: a configuration error, then refused credentials, then an outage */
        if (check_kind(one) == SB_E_BAD_ARGS || (check_kind(one) == SB_E_UNAUTHORIZED && worst == SB_E_UNAVAILABLE))
            worst = check_kind(one);
        if (used + 3 < errsz) {
            int n = snprintf(err + used, errsz - used, "%s%s", used == 0 ? "no sentinel named the primary: " : "; ", one);
            used = n > 0 && (size_t)n < errsz - used ? used + (size_t)n : errsz - 1;
        }
    }
    return worst;
}
