/*
 * The redis token-store backend: hiredis 0.14 async on a worker's h2o loop.
 *
 * One round trip per call. The call path runs one script (EVALSHA) that reads
 * the token record and, when there is one, counts the call against its run
 * and takes a concurrency slot; the slot goes back with a second script sent
 * after the reply, which nobody waits for (its answer is still checked: a
 * failed release is logged and counted). Scripts are loaded once per
 * connection (SCRIPT LOAD); a NOSCRIPT answer (SCRIPT FLUSH, a restarted or
 * replaced primary) resends that one command as EVAL, which runs and caches
 * the script again, so callers never see it.
 *
 * There is no cache of grants: every call asks Redis, so a revocation made
 * through any instance is refused by every instance on its next call. What is
 * kept per worker is the parsed form of record bytes already seen (a record
 * never changes once written): the bytes Redis returns are compared in full
 * before the parsed record is reused.
 *
 * The primary is a fixed address (redis://, unix://) or the one Redis
 * Sentinel names (redis-sentinel://). With Sentinel each worker keeps two
 * links to one sentinel: a query link asking for the primary every second,
 * and a subscription to +switch-master. A node is used only after ROLE says
 * "master", and ROLE is asked again every second. Any doubt makes every call
 * answer SB_E_UNAVAILABLE until a verified primary is back: no sentinel has
 * confirmed the primary for a while, the node says it is a replica, a command
 * answers READONLY. Scripts carry a "#!lua" line without flags, so a replica
 * refuses them outright (READONLY) instead of reading stale records.
 *
 * hiredis ships no h2o adapter, so this file provides its five event hooks
 * over an h2o socket that wraps a dup() of the hiredis fd (hiredis closes its
 * own fd; we close only the wrapper). hiredis 0.14 has no timeouts, so a
 * 50 ms tick enforces them: a command older than store_timeout_ms, or a
 * connect that takes longer, tears the connection down, which fails every
 * pending command with SB_E_UNAVAILABLE. While the store is not usable, calls
 * fail at once (fail closed). Reconnects back off from 100 ms to a cap of
 * 250 ms while the node refuses connections or does not answer (so its return
 * is noticed within a few hundred milliseconds however long it was away), and
 * to 3.2 s when it answers with an error an operator must fix (a refused
 * AUTH or SELECT).
 *
 * hiredis would resolve a host name with a blocking getaddrinfo: only IP
 * literals are ever passed to it, including the addresses Sentinel reports.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <openssl/evp.h>
#include "obs/log.h"
#include "obs/metrics.h"
#include "store/store_int.h"
#include "util/util.h"

#define TICK_MS 50
#define HEARTBEAT_MS 1000
#define SENTINEL_QUERY_MS 1000
#define RECONNECT_FIRST_MS 100
#define RECONNECT_CAP_MS 250       /* refused or silent: probe often */
#define RECONNECT_SLOW_CAP_MS 3200 /* answered with an error that needs an operator */
#define REL_MAX 16                 /* distinct runs whose slots wait to go back, and the most one command carries */
#define CMD_MAX_ARGS (9 + 2 * REL_MAX)
#define RCACHE_SLOTS 256
/* prefix (at most 256) + "q:inflight:" + run id (at most SB_MAX_RUN_ID): never truncated, or the C and Lua keys would differ */
#define KEY_MAX (256 + 16 + SB_MAX_RUN_ID + 1)
#define RCACHE_MAX_RECORD 8192

/* ---- scripts ----------------------------------------------------------------------------------------------------------- */

enum { SC_LOOKUP = 0, SC_RELEASE, SC_FETCH_ADD, SC_MINT, SC_REVOKE_RUN, SC_INSPECT_RUN, SC_TOOL_CALL, SC_MODULES };

/*
 * Slots given back (KEYS[first..], ARGV[same index + off] = how many):
 * DECRBY, then a counter that went below zero is put back to 0, or deleted
 * when DECRBY created it (the run's counters had already expired). `failed`
 * is a bit mask of the keys that could not be decremented, for the caller to
 * log.
 */
#define RELEASE_LUA(first, off)                                                                                                    \
    "local failed = 0\n"                                                                                                           \
    "for i = " #first ", #KEYS do\n"                                                                                               \
    "  local r = redis.pcall('DECRBY', KEYS[i], ARGV[i + " #off "])\n"                                                             \
    "  if type(r) ~= 'number' then failed = failed + 2 ^ (i - " #first ")\n"                                                       \
    "  elseif r < 0 then\n"                                                                                                        \
    "    if redis.call('PTTL', KEYS[i]) < 0 then redis.call('DEL', KEYS[i]) else redis.call('SET', KEYS[i], '0', 'KEEPTTL') end\n" \
    "  end\n"                                                                                                                      \
    "end\n"

/*
 * The call path. KEYS[1] the token record, KEYS[2..] slots to give back first
 * (releases of earlier calls carried along, counts in ARGV[8..]). ARGV[1] the
 * key prefix; ARGV[2..7] what the worker knows of a record it parsed before
 * (mint id, length, runId, expiresAt, calls, concurrent), or empty.
 *
 * Returns {failed, 0} no record; {failed, 3} a record it cannot read; else
 * {failed, code} when the record is the one the worker knows (same mint id at
 * its fixed offset and same length: records never change once written, and
 * each write gets a fresh id), or {failed, code, record, runId}; code is 1
 * calls per run exceeded, 2 concurrent calls exceeded, 4 counted and a slot
 * taken. A record the worker does not know is read with one anchored match
 * (token.c writes runId, expiresAt and the call quotas first), or decoded in
 * full when written in another order. The mint creates the run's counters
 * with the run's latest expiry; a counter not there yet (a record from an
 * older version) gets the token's.
 */
static const char script_lookup[] = "#!lua\n" RELEASE_LUA(
    2, 6) "local rec = redis.call('GET', KEYS[1])\n"
          "if not rec then return {failed, 0} end\n"
          "local run, exp, calls, conc\n"
          "local known = ARGV[2] ~= '' and #rec == tonumber(ARGV[3]) and string.sub(rec, 16, 47) == ARGV[2]\n"
          "if known then\n"
          "  run, exp, calls, conc = ARGV[4], ARGV[5], ARGV[6], ARGV[7]\n"
          "else\n"
          "  run, exp, calls, conc = string.match(rec, '^{\"v\":1,\"mint\":\"%x+\",\"runId\":\"([^\"\\\\]+)\",\"expiresAt\":(%d+),"
          "\"quota\":{\"calls\":(%d+),\"concurrent\":(%d+),')\n"
          "end\n"
          "if not run then\n"
          "  local ok, o = pcall(cjson.decode, rec)\n"
          "  if not ok or type(o) ~= 'table' or type(o.runId) ~= 'string' or type(o.expiresAt) ~= 'number' or\n"
          "     type(o.quota) ~= 'table' or type(o.quota.calls) ~= 'number' or type(o.quota.concurrent) ~= 'number' then\n"
          "    return {failed, 3}\n"
          "  end\n"
          "  run = o.runId\n"
          "  exp = string.format('%.0f', o.expiresAt)\n"
          "  calls = o.quota.calls\n"
          "  conc = o.quota.concurrent\n"
          "end\n"
          "local function answer(code) if known then return {failed, code} end return {failed, code, rec, run} end\n"
          "local ck = ARGV[1] .. 'q:calls:' .. run\n"
          "local n = redis.call('INCR', ck)\n"
          "if n == 1 and redis.call('PEXPIRETIME', ck) < tonumber(exp) then redis.call('PEXPIREAT', ck, exp) end\n"
          "if n > tonumber(calls) then return answer(1) end\n"
          "local ik = ARGV[1] .. 'q:inflight:' .. run\n"
          "local f = redis.call('INCR', ik)\n"
          "if f == 1 and redis.call('PEXPIRETIME', ik) < tonumber(exp) then redis.call('PEXPIREAT', ik, exp) end\n"
          "if f > tonumber(conc) then redis.call('DECR', ik) return answer(2) end\n"
          "return answer(4)\n";
/* releases on their own (no call followed within the loop pass): KEYS[1..] slots, ARGV counts; returns the failed mask */
static const char script_release[] = "#!lua\n" RELEASE_LUA(1, 0) "return failed\n";
/* KEYS[1] the run's fetched-bytes counter, ARGV[1] bytes, ARGV[2] the token's expiry */
static const char script_fetch_add[] = "#!lua\n"
                                       "redis.call('INCRBY', KEYS[1], ARGV[1])\n"
                                       "if redis.call('PEXPIRETIME', KEYS[1]) < tonumber(ARGV[2]) then\n"
                                       "  redis.call('PEXPIREAT', KEYS[1], ARGV[2]) end\n"
                                       "return 0\n";
/*
 * mint: SET NX with expiry, index the token under its run, and make sure the
 * run's call counters (KEYS[3], KEYS[4]) live as long as its latest token
 * (ARGV[4], absolute), so the call path never has to look at their expiry
 */
static const char script_mint[] = "#!lua\n"
                                  "if not redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX') then return 0 end\n"
                                  "redis.call('SADD', KEYS[2], ARGV[3])\n"
                                  "if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then\n"
                                  "  redis.call('PEXPIRE', KEYS[2], ARGV[2]) end\n"
                                  "for i = 3, 4 do\n"
                                  "  if not redis.call('SET', KEYS[i], '0', 'NX', 'PXAT', ARGV[4]) and\n"
                                  "     redis.call('PEXPIRETIME', KEYS[i]) < tonumber(ARGV[4]) then\n"
                                  "    redis.call('PEXPIREAT', KEYS[i], ARGV[4]) end\n"
                                  "end\n"
                                  "return 1\n";
/* revoke a run: every token indexed under it, then the index */
static const char script_revoke_run[] = "#!lua\n"
                                        "local m = redis.call('SMEMBERS', KEYS[1])\n"
                                        "for _, h in ipairs(m) do redis.call('DEL', ARGV[1] .. h) end\n"
                                        "redis.call('DEL', KEYS[1]) return #m\n";
/*
 * inspect a run, reading only: KEYS[1] its token index, KEYS[2..4] its calls,
 * in-flight and fetched-bytes counters; ARGV[1] the token key prefix, ARGV[2]
 * the most records to return. Returns {calls, inflight, bytes, live, hash,
 * record, ...}: the index also holds revoked tokens (a token revocation
 * deletes only the record), which have no record and are not counted.
 */
static const char script_inspect_run[] = "#!lua\n"
                                         "local out = {redis.call('GET', KEYS[2]) or '0', redis.call('GET', KEYS[3]) or '0',\n"
                                         "             redis.call('GET', KEYS[4]) or '0', 0}\n"
                                         "local live, max = 0, tonumber(ARGV[2])\n"
                                         "for _, h in ipairs(redis.call('SMEMBERS', KEYS[1])) do\n"
                                         "  local r = redis.call('GET', ARGV[1] .. h)\n"
                                         "  if r then\n"
                                         "    live = live + 1\n"
                                         "    if live <= max then out[#out + 1] = h out[#out + 1] = r end\n"
                                         "  end\n"
                                         "end\n"
                                         "out[4] = live return out\n";

/*
 * One tools.call of a run: KEYS[1] the run's tools.call counter, KEYS[2] its
 * call counter (which the mint keeps alive as long as the run's latest token),
 * ARGV[1] the calling token's expiry. Counts, then makes the counter live as
 * long as the later of the two, so it cannot expire, and start again from 0,
 * while the run still has a token. Returns the count, this call included.
 */
static const char script_tool_call[] =
    "#!lua\n"
    "local n = redis.call('INCR', KEYS[1])\n"
    "local exp = tonumber(ARGV[1])\n"
    "local run = redis.call('PEXPIRETIME', KEYS[2])\n"
    "if run > exp then exp = run end\n"
    "if redis.call('PEXPIRETIME', KEYS[1]) < exp then redis.call('PEXPIREAT', KEYS[1], exp) end\n"
    "return n\n";

/*
 * A run's import.fetch counters: KEYS[1] its modules, KEYS[2] its module
 * bytes, KEYS[3] its call counter (alive as long as the run's latest token),
 * ARGV[1] the calling token's expiry, ARGV[2] and ARGV[3] what to add. Both
 * counters live as long as the later of the two expiries, as the tools.call
 * counter does. Returns {modules, bytes}, this call included.
 */
static const char script_modules[] =
    "#!lua\n"
    "local m = redis.call('INCRBY', KEYS[1], ARGV[2])\n"
    "local b = redis.call('INCRBY', KEYS[2], ARGV[3])\n"
    "local exp = tonumber(ARGV[1])\n"
    "local run = redis.call('PEXPIRETIME', KEYS[3])\n"
    "if run > exp then exp = run end\n"
    "for i = 1, 2 do if redis.call('PEXPIRETIME', KEYS[i]) < exp then redis.call('PEXPIREAT', KEYS[i], exp) end end\n"
    "return {m, b}\n";

static const struct {
    const char *body;
    size_t len;
} scripts[SB_STORE_NSCRIPTS] = {
    {script_lookup, sizeof(script_lookup) - 1},         {script_release, sizeof(script_release) - 1},
    {script_fetch_add, sizeof(script_fetch_add) - 1},   {script_mint, sizeof(script_mint) - 1},
    {script_revoke_run, sizeof(script_revoke_run) - 1}, {script_inspect_run, sizeof(script_inspect_run) - 1},
    {script_tool_call, sizeof(script_tool_call) - 1},   {script_modules, sizeof(script_modules) - 1},
};

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
        if (EVP_Digest(scripts[i].body, scripts[i].len, md, &mdlen, EVP_sha1(), NULL) != 1 || mdlen != 20)
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

static void format_addr(const sb_store_addr_t *a, char *out, size_t outsz)
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
static int addr_from(const char *host, size_t hlen, const char *port, size_t plen, sb_store_addr_t *out)
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
    return addr_from(f[3], flen[3], f[4], flen[4], to) == 0 ? 1 : -1;
}

/* ---- the h2o adapter for hiredis --------------------------------------------------------------------------------------- */

enum { L_DOWN = 0, L_CONNECTING, L_SETUP, L_UP };

typedef struct st_redis_conn_t redis_conn_t;

/* one hiredis connection: the data link, or one of the two sentinel links */
typedef struct st_link_t {
    redis_conn_t *rc;
    redisAsyncContext *ac; /* NULL once hiredis has let go of it */
    h2o_socket_t *sock;
    int reading, want_write, write_armed, freeing, in_flush;
    int state; /* L_DOWN means we are done with it: hiredis (or a deferred free) cleans up */
    h2o_loop_t *loop;
    h2o_timeout_t *flush_timeout; /* 0 ms, the worker's */
    h2o_timeout_entry_t wflush;   /* writes what the loop pass queued, once its I/O is handled */
    int64_t since;
    char addr[80]; /* "host:port" or the socket path, for the log */
} link_t;

static void on_sock_read(h2o_socket_t *sock, const char *err)
{
    link_t *l = sock->data;
    if (l->ac != NULL)
        redisAsyncHandleRead(l->ac);
}

static void on_sock_write(h2o_socket_t *sock, const char *err)
{
    link_t *l = sock->data;
    l->write_armed = 0;
    if (l->want_write && l->ac != NULL)
        redisAsyncHandleWrite(l->ac);
}

static void ev_add_read(void *d)
{
    link_t *l = d;
    if (!l->reading && l->sock != NULL) {
        l->reading = 1;
        h2o_socket_read_start(l->sock, on_sock_read);
    }
}

static void ev_del_read(void *d)
{
    link_t *l = d;
    if (l->reading && l->sock != NULL) {
        l->reading = 0;
        h2o_socket_read_stop(l->sock);
    }
}

static void on_wflush(h2o_timeout_entry_t *entry)
{
    link_t *l = H2O_STRUCT_FROM_MEMBER(link_t, wflush, entry);
    if (l->want_write && l->ac != NULL) {
        l->in_flush = 1;
        redisAsyncHandleWrite(l->ac);
        l->in_flush = 0;
    }
}

static void ev_add_write(void *d)
{
    link_t *l = d;
    l->want_write = 1;
    if (l->sock == NULL)
        return;
    /*
     * Connected: the commands queued during this loop pass go out in one
     * write at its end (a socket to Redis is almost always writable, so
     * waiting for epoll to say so costs two epoll_ctl calls and a loop pass).
     * Still connecting, or the socket was full: wait until it is writable
     * (hiredis learns that the connect completed from the first writable
     * event).
     */
    if (l->state != L_CONNECTING && !l->in_flush) {
        if (!h2o_timeout_is_linked(&l->wflush))
            h2o_timeout_link(l->loop, l->flush_timeout, &l->wflush);
        return;
    }
    /* h2o asserts if notify_write is armed twice */
    if (!l->write_armed) {
        l->write_armed = 1;
        h2o_socket_notify_write(l->sock, on_sock_write);
    }
}

static void ev_del_write(void *d)
{
    link_t *l = d;
    l->want_write = 0;
}

static void ev_cleanup(void *d)
{
    link_t *l = d;
    if (h2o_timeout_is_linked(&l->wflush))
        h2o_timeout_unlink(&l->wflush);
    if (l->sock != NULL) {
        h2o_socket_close(l->sock);
        l->sock = NULL;
    }
    l->reading = l->want_write = l->write_armed = l->freeing = 0;
    l->ac = NULL;
}

/* opens a connection (unix path, or a numeric address); NULL, or why it could not even start */
static const char *link_open(link_t *l, h2o_loop_t *loop, const sb_store_addr_t *to, const char *path,
                             redisConnectCallback *on_connect, redisDisconnectCallback *on_disconnect, char *why, size_t whysz)
{
    redisAsyncContext *ac;
    int fd;

    if (path != NULL)
        snprintf(l->addr, sizeof(l->addr), "%s", path);
    else
        format_addr(to, l->addr, sizeof(l->addr));
    ac = path != NULL ? redisAsyncConnectUnix(path) : redisAsyncConnect(to->host, to->port);
    if (ac == NULL)
        return "out of memory";
    if (ac->err) {
        snprintf(why, whysz, "connect failed: %s", ac->errstr);
        redisAsyncFree(ac);
        return why;
    }
    if ((fd = dup(ac->c.fd)) < 0) {
        snprintf(why, whysz, "dup failed: %s", strerror(errno));
        redisAsyncFree(ac);
        return why;
    }
    l->ac = ac;
    ac->data = l;
    /* before the hooks: hiredis asks to write at once, and nothing may be written before the connect completes */
    l->state = L_CONNECTING;
    l->since = (int64_t)(sb_mono_us() / 1000);
    l->sock = h2o_evloop_socket_create(loop, fd, H2O_SOCKET_FLAG_DONT_READ);
    l->sock->data = l;
    ac->ev.data = l;
    ac->ev.addRead = ev_add_read;
    ac->ev.delRead = ev_del_read;
    ac->ev.addWrite = ev_add_write;
    ac->ev.delWrite = ev_del_write;
    ac->ev.cleanup = ev_cleanup;
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    /* the connect callback fires on the first writable event */
    ev_add_write(l);
    return NULL;
}

/*
 * Lets go of a link. Pending commands are answered with NULL replies. From
 * inside one of the link's own reply callbacks hiredis defers the free until
 * the callback returns; the link is only reopened once ac is NULL again.
 */
static void link_release(link_t *l)
{
    l->state = L_DOWN;
    if (l->ac != NULL && !l->freeing) {
        l->freeing = 1;
        redisAsyncFree(l->ac);
    }
}

/* as link_release, for a link not already given up (one hiredis is freeing itself is left alone) */
static void link_close(link_t *l)
{
    if (l->state != L_DOWN)
        link_release(l);
}

/* ---- one worker's connection ------------------------------------------------------------------------------------------- */

/* a record this worker parsed: known by its token hash, mint id and length */
typedef struct st_rcache_t {
    uint8_t hash[32];
    char mint[32];
    size_t len;
    sb_token_t *tok;
    /* what the call-path script is told about it, formatted once: length, expiresAt, calls, concurrent */
    char num[4][21];
    size_t numlen[4];
} rcache_t;

struct st_redis_conn_t {
    sb_store_t *store;
    h2o_loop_t *loop;
    h2o_timeout_t tick_timeout;
    h2o_timeout_entry_t tick;
    /* the data link */
    link_t data;
    h2o_linklist_t pending; /* its commands, oldest first */
    int setup_left;
    int64_t next_attempt, last_heartbeat;
    unsigned failures;
    /* what the log last said, so one event is one line */
    int logged_up;
    char last_down[192];
    _Atomic int usable;
    /* Sentinel: the query and subscription links to sentinels[sidx] */
    link_t sq, ss;
    size_t sidx;
    unsigned s_failures;
    int64_t s_next_attempt, query_sent, last_query, ss_sent;
    int ss_subscribed, s_logged_down;
    char s_last_down[192];
    sb_store_addr_t primary;
    int have_primary;
    int64_t confirmed_at; /* when a sentinel last named the primary in use */
    rcache_t cache[RCACHE_SLOTS];
    /* slots to give back: carried by the next call's script, or sent on their own at the end of the loop pass */
    struct {
        char run_id[SB_MAX_RUN_ID + 1];
        unsigned n;
    } rel[REL_MAX];
    size_t nrel;
    h2o_timeout_t flush_timeout; /* 0 ms: runs once the loop pass's I/O is handled */
    h2o_timeout_entry_t flush;
};

static int64_t mono_ms(void)
{
    return (int64_t)(sb_mono_us() / 1000);
}

static int is_sentinel(const redis_conn_t *rc)
{
    return rc->store->nsentinels != 0;
}

/* how long the primary stays in use without a sentinel confirming it */
static int64_t sentinel_grace_ms(const redis_conn_t *rc)
{
    return 2 * SENTINEL_QUERY_MS + (int64_t)rc->store->timeout_ms;
}

static int usable_now(const redis_conn_t *rc, int64_t now)
{
    if (rc->data.state != L_UP)
        return 0;
    return !is_sentinel(rc) || now - rc->confirmed_at <= sentinel_grace_ms(rc);
}

static const char *data_addr(const redis_conn_t *rc, char *buf, size_t sz)
{
    if (rc->store->unix_path != NULL)
        return rc->store->unix_path;
    if (!is_sentinel(rc)) {
        format_addr(&rc->store->addr, buf, sz);
    } else if (rc->have_primary) {
        format_addr(&rc->primary, buf, sz);
    } else {
        snprintf(buf, sz, "%s (no primary known yet)", rc->store->master);
    }
    return buf;
}

/*
 * Publishes whether calls may use the store and logs the change: redis.up
 * when it becomes usable, redis.down when it stops being usable or the
 * reason changes. Retries that fail the same way stay silent.
 */
static void update_usable(redis_conn_t *rc, const char *why)
{
    int64_t now = mono_ms();
    int u = usable_now(rc, now);
    char addr[96], reason[192];
    sb_logline_t l;

    atomic_store_explicit(&rc->usable, u, memory_order_relaxed);
    if (u) {
        if (!rc->logged_up) {
            rc->logged_up = 1;
            rc->last_down[0] = '\0';
            sb_log_begin(&l, SB_LOG_INFO, "redis.up");
            sb_log_cstr(&l, "addr", data_addr(rc, addr, sizeof(addr)));
            if (is_sentinel(rc))
                sb_log_cstr(&l, "master", rc->store->master);
            sb_log_cstr(&l, "msg", "token store connected");
            sb_log_end(&l);
        }
        return;
    }
    if (why == NULL) {
        /* every other change comes with its reason: the one left is a sentinel confirmation that is overdue */
        if (rc->data.state != L_UP)
            return;
        snprintf(reason, sizeof(reason), "no sentinel has confirmed this primary within %lld ms", (long long)sentinel_grace_ms(rc));
        why = reason;
    }
    if (!rc->logged_up && strcmp(rc->last_down, why) == 0)
        return;
    rc->logged_up = 0;
    snprintf(rc->last_down, sizeof(rc->last_down), "%s", why);
    sb_log_begin(&l, SB_LOG_WARN, "redis.down");
    sb_log_cstr(&l, "addr", data_addr(rc, addr, sizeof(addr)));
    sb_log_cstr(&l, "reason", why);
    sb_log_end(&l);
}

/* ---- commands on the data link ---------------------------------------------------------------------------------------- */

typedef struct st_cmd_t cmd_t;
typedef void (*cmd_done_fn)(cmd_t *cmd, redisReply *reply);

struct st_cmd_t {
    h2o_linklist_t link;
    redis_conn_t *rc;
    int64_t deadline;
    const char *what; /* for the log */
    cmd_done_fn done;
    int script;       /* SC_*: sent as EVALSHA (EVAL once resent); -1 for a plain command */
    int setup_script; /* SCRIPT LOAD of this script: the digest its answer must be */
    int resent;
    int nrel; /* releases carried: their keys are the arguments at rel_first.. */
    uint32_t rel_key_off[REL_MAX], rel_key_len[REL_MAX];
    sb_token_t *known; /* the parsed record the lookup told the script about, or NULL */
    union {
        sb_store_get_cb get;
        sb_store_lookup_cb lookup;
        sb_store_done_cb done;
        sb_quota_cb quota;
        sb_store_inspect_cb inspect;
    } cb;
    void *arg;
    uint8_t hash[32];
    int64_t limit;
    int64_t limit2;       /* import.fetch: the module bytes cap (limit: the module count cap) */
    unsigned add_modules; /* import.fetch: what this call adds */
    uint64_t add_bytes;
    char run_id[SB_MAX_RUN_ID + 1];
    /*
     * The command as RESP, written once (hiredis copies it into its output
     * buffer): "*N", then EVALSHA and the digest for a script, then the
     * arguments, which start at `args` so NOSCRIPT can resend them after EVAL
     * and the script's text.
     */
    size_t len, args;
    char resp[];
};

static void on_cmd_reply(redisAsyncContext *ac, void *r, void *privdata);

static void cmd_finish(cmd_t *cmd, redisReply *reply)
{
    h2o_linklist_unlink(&cmd->link);
    cmd->done(cmd, reply);
    sb_token_release(cmd->known);
    sb_mem_free(cmd);
}

/* decimal digits of v at p; returns the end */
static char *put_u64(char *p, uint64_t v)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n > 0)
        *p++ = tmp[--n];
    return p;
}

/* the room one bulk string of `len` bytes takes: "$<len>\r\n<bytes>\r\n" */
static size_t bulk_size(size_t len)
{
    return 1 + 20 + 2 + len + 2;
}

static char *put_bulk(char *p, const char *s, size_t len)
{
    *p++ = '$';
    p = put_u64(p, len);
    *p++ = '\r';
    *p++ = '\n';
    memcpy(p, s, len);
    p += len;
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

static void cmd_send(cmd_t *cmd)
{
    redis_conn_t *rc = cmd->rc;
    redisAsyncContext *ac = rc->data.freeing ? NULL : rc->data.ac;
    int ok;

    if (ac == NULL) {
        cmd_finish(cmd, NULL); /* hiredis is freeing or disconnecting the context: answer now */
        return;
    }
    if (!cmd->resent) {
        ok = redisAsyncFormattedCommand(ac, on_cmd_reply, cmd, cmd->resp, cmd->len) == REDIS_OK;
    } else {
        /* the same count and arguments after EVAL and the script's text */
        size_t hdr = (size_t)((const char *)memchr(cmd->resp, '\n', cmd->len) - cmd->resp) + 1, rest = cmd->len - cmd->args;
        char *buf = sb_mem_alloc(hdr + bulk_size(4) + bulk_size(scripts[cmd->script].len) + rest), *p = buf;
        memcpy(p, cmd->resp, hdr);
        p = put_bulk(p + hdr, "EVAL", 4);
        p = put_bulk(p, scripts[cmd->script].body, scripts[cmd->script].len);
        memcpy(p, cmd->resp + cmd->args, rest);
        p += rest;
        ok = redisAsyncFormattedCommand(ac, on_cmd_reply, cmd, buf, (size_t)(p - buf)) == REDIS_OK;
        sb_mem_free(buf);
    }
    if (!ok)
        cmd_finish(cmd, NULL);
}

/*
 * A command with its arguments written as RESP; queued in the pending list,
 * not sent yet. `rel_first` and `nrel` name the arguments that are release
 * keys (for the log, should they fail).
 */
static cmd_t *cmd_new_rel(redis_conn_t *rc, const char *what, cmd_done_fn done, int script, int argc, const char **argv,
                          const size_t *lens, int rel_first, int nrel)
{
    size_t total = 1 + 20 + 2 + (script >= 0 ? bulk_size(7) + bulk_size(40) : 0);
    cmd_t *cmd;
    char *p;

    for (int i = 0; i < argc; ++i)
        total += bulk_size(lens[i]);
    cmd = sb_mem_alloc(offsetof(cmd_t, resp) + total);
    memset(cmd, 0, offsetof(cmd_t, resp));
    cmd->rc = rc;
    cmd->what = what;
    cmd->done = done;
    cmd->script = script;
    cmd->deadline = mono_ms() + (int64_t)rc->store->timeout_ms;
    p = cmd->resp;
    *p++ = '*';
    p = put_u64(p, (uint64_t)argc + (script >= 0 ? 2 : 0));
    *p++ = '\r';
    *p++ = '\n';
    if (script >= 0) {
        p = put_bulk(p, "EVALSHA", 7);
        p = put_bulk(p, rc->store->sha[script], 40);
    }
    cmd->args = (size_t)(p - cmd->resp);
    for (int i = 0; i < argc; ++i) {
        p = put_bulk(p, argv[i], lens[i]);
        if (i >= rel_first && i < rel_first + nrel) {
            /* where the key's bytes are: just before the closing CRLF */
            cmd->rel_key_off[i - rel_first] = (uint32_t)(p - 2 - lens[i] - cmd->resp);
            cmd->rel_key_len[i - rel_first] = (uint32_t)lens[i];
        }
    }
    cmd->nrel = nrel;
    cmd->len = (size_t)(p - cmd->resp);
    h2o_linklist_insert(&rc->pending, &cmd->link);
    return cmd;
}

static cmd_t *cmd_new(redis_conn_t *rc, const char *what, cmd_done_fn done, int script, int argc, const char **argv,
                      const size_t *lens)
{
    return cmd_new_rel(rc, what, done, script, argc, argv, lens, 0, 0);
}

static int reply_is_error(const redisReply *r, const char *prefix)
{
    size_t n = strlen(prefix);
    return r != NULL && r->type == REDIS_REPLY_ERROR && r->len >= n && memcmp(r->str, prefix, n) == 0;
}

static void data_teardown(redis_conn_t *rc, const char *why, int slow);
static void sentinel_query(redis_conn_t *rc);

static void on_cmd_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply *reply = r;
    cmd_t *cmd = privdata;
    redis_conn_t *rc = cmd->rc;

    if (cmd->script >= 0 && !cmd->resent && reply_is_error(reply, "NOSCRIPT")) {
        /* the script cache was emptied (SCRIPT FLUSH, a restart): EVAL runs the script and caches it again */
        cmd->resent = 1;
        sb_metrics_store_event(SB_STORE_EV_SCRIPT_RELOAD);
        cmd_send(cmd);
        return;
    }
    if (reply_is_error(reply, "READONLY") && rc->data.state != L_DOWN) {
        /* a replica: nothing it says can be trusted to be current */
        data_teardown(rc, "the node answered READONLY: it is a replica", 0);
        if (is_sentinel(rc))
            sentinel_query(rc);
    }
    cmd_finish(cmd, reply);
}

/* ---- the data link's life cycle ---------------------------------------------------------------------------------------- */

static void data_failed(redis_conn_t *rc, const char *why, int slow)
{
    unsigned cap = slow ? RECONNECT_SLOW_CAP_MS : RECONNECT_CAP_MS;
    uint64_t backoff = (uint64_t)RECONNECT_FIRST_MS << (rc->failures < 6 ? rc->failures : 6);

    rc->data.state = L_DOWN;
    rc->next_attempt = mono_ms() + (int64_t)(backoff < cap ? backoff : cap);
    ++rc->failures;
    update_usable(rc, why);
}

/* tears the data link down; every pending command is answered SB_E_UNAVAILABLE */
static void data_teardown(redis_conn_t *rc, const char *why, int slow)
{
    if (rc->data.state == L_DOWN)
        return;
    data_failed(rc, why, slow);
    link_release(&rc->data);
}

/* errors that say "not now" rather than "wrong configuration" */
static int is_transient(const redisReply *r)
{
    return reply_is_error(r, "LOADING") || reply_is_error(r, "BUSY") || reply_is_error(r, "MASTERDOWN") ||
           reply_is_error(r, "TRYAGAIN");
}

static void on_setup(cmd_t *cmd, redisReply *reply)
{
    redis_conn_t *rc = cmd->rc;
    char why[192];
    int ok, slow = 0;

    if (reply == NULL || rc->data.state == L_DOWN)
        return; /* the link is already going down, for a reason logged elsewhere */
    if (strcmp(cmd->what, "SCRIPT LOAD") == 0) {
        ok =
            reply->type == REDIS_REPLY_STRING && reply->len == 40 && memcmp(reply->str, rc->store->sha[cmd->setup_script], 40) == 0;
    } else if (strcmp(cmd->what, "ROLE") == 0) {
        ok = reply->type == REDIS_REPLY_ARRAY && reply->elements >= 1 && reply->element[0]->type == REDIS_REPLY_STRING &&
             strcmp(reply->element[0]->str, "master") == 0;
        if (!ok && reply->type == REDIS_REPLY_ARRAY && reply->elements >= 1 && reply->element[0]->type == REDIS_REPLY_STRING) {
            snprintf(why, sizeof(why), "the node is not a primary (ROLE: %.32s)", reply->element[0]->str);
            data_teardown(rc, why, 0);
            if (is_sentinel(rc))
                sentinel_query(rc);
            return;
        }
    } else {
        ok = reply->type == REDIS_REPLY_STATUS && strcmp(reply->str, "OK") == 0;
    }
    if (!ok) {
        if (reply->type == REDIS_REPLY_ERROR) {
            slow = !is_transient(reply);
            snprintf(why, sizeof(why), "%s refused: %.140s", cmd->what, reply->str);
        } else {
            slow = 1;
            snprintf(why, sizeof(why), "%s: unexpected answer", cmd->what);
        }
        data_teardown(rc, why, slow);
        return;
    }
    if (--rc->setup_left == 0) {
        rc->data.state = L_UP;
        rc->failures = 0;
        rc->last_heartbeat = mono_ms();
        update_usable(rc, NULL);
    }
}

static void on_data_connect(const redisAsyncContext *ac, int status)
{
    link_t *l = ac->data;
    redis_conn_t *rc = l->rc;
    char why[192];

    if (status != REDIS_OK) {
        /* hiredis frees the context after this callback */
        snprintf(why, sizeof(why), "connect failed: %s", ac->errstr[0] != '\0' ? ac->errstr : "unknown error");
        if (l->state != L_DOWN)
            data_failed(rc, why, 0);
        if (is_sentinel(rc))
            sentinel_query(rc);
        return;
    }
    if (l->state == L_CONNECTING)
        l->state = L_SETUP;
}

static void on_data_disconnect(const redisAsyncContext *ac, int status)
{
    link_t *l = ac->data;
    redis_conn_t *rc = l->rc;
    char why[192];

    if (l->state == L_DOWN)
        return; /* we tore it down ourselves */
    snprintf(why, sizeof(why), "connection lost: %s",
             status == REDIS_OK ? "closed by the server" : (ac->errstr[0] != '\0' ? ac->errstr : "unknown error"));
    data_failed(rc, why, 0);
    if (is_sentinel(rc))
        sentinel_query(rc);
}

static void setup_cmd(redis_conn_t *rc, const char *what, int setup_script, int argc, const char **argv, const size_t *lens)
{
    cmd_t *cmd = cmd_new(rc, what, on_setup, -1, argc, argv, lens);
    cmd->setup_script = setup_script;
    ++rc->setup_left;
    cmd_send(cmd);
}

static void data_connect(redis_conn_t *rc)
{
    sb_store_t *s = rc->store;
    char why[192], db[8];
    const char *err;

    err = link_open(&rc->data, rc->loop,
                    s->unix_path != NULL ? NULL
                    : is_sentinel(rc)    ? &rc->primary
                                         : &s->addr,
                    s->unix_path, on_data_connect, on_data_disconnect, why, sizeof(why));
    if (err != NULL) {
        data_failed(rc, err, 0);
        return;
    }
    /* never HELLO 3: hiredis 0.14 cannot parse RESP3. The commands wait in hiredis until the connect completes */
    rc->setup_left = 0;
    if (s->password != NULL) {
        const char *argv[] = {"AUTH", s->password};
        size_t lens[] = {4, strlen(s->password)};
        setup_cmd(rc, "AUTH", -1, 2, argv, lens);
    }
    if (s->db != 0) {
        const char *argv[] = {"SELECT", db};
        size_t lens[] = {6, (size_t)snprintf(db, sizeof(db), "%d", s->db)};
        setup_cmd(rc, "SELECT", -1, 2, argv, lens);
    }
    for (int i = 0; i < SB_STORE_NSCRIPTS; ++i) {
        const char *argv[] = {"SCRIPT", "LOAD", scripts[i].body};
        size_t lens[] = {6, 4, scripts[i].len};
        setup_cmd(rc, "SCRIPT LOAD", i, 3, argv, lens);
    }
    {
        const char *argv[] = {"ROLE"};
        size_t lens[] = {4};
        setup_cmd(rc, "ROLE", -1, 1, argv, lens);
    }
}

static void on_heartbeat(cmd_t *cmd, redisReply *reply)
{
    redis_conn_t *rc = cmd->rc;
    char why[192];

    if (reply == NULL || rc->data.state != L_UP)
        return;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements >= 1 && reply->element[0]->type == REDIS_REPLY_STRING &&
        strcmp(reply->element[0]->str, "master") == 0)
        return;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements >= 1 && reply->element[0]->type == REDIS_REPLY_STRING)
        snprintf(why, sizeof(why), "the node is no longer a primary (ROLE: %.32s)", reply->element[0]->str);
    else
        snprintf(why, sizeof(why), "ROLE: %.140s", reply->type == REDIS_REPLY_ERROR ? reply->str : "unexpected answer");
    data_teardown(rc, why, 0);
    if (is_sentinel(rc))
        sentinel_query(rc);
}

/* ---- Sentinel ---------------------------------------------------------------------------------------------------------- */

static void sentinel_log_down(redis_conn_t *rc, const char *why)
{
    sb_logline_t l;
    if (rc->s_logged_down && strcmp(rc->s_last_down, why) == 0)
        return;
    rc->s_logged_down = 1;
    snprintf(rc->s_last_down, sizeof(rc->s_last_down), "%s", why);
    sb_log_begin(&l, SB_LOG_WARN, "redis.sentinel_down");
    sb_log_cstr(&l, "addr", rc->sq.addr);
    sb_log_cstr(&l, "reason", why);
    sb_log_end(&l);
}

/* drops both links to the current sentinel and moves on to the next one */
static void sentinel_fail(redis_conn_t *rc, const char *why)
{
    int64_t now = mono_ms();

    sentinel_log_down(rc, why);
    link_close(&rc->sq);
    link_close(&rc->ss);
    rc->query_sent = 0;
    rc->ss_subscribed = 0;
    rc->sidx = (rc->sidx + 1) % rc->store->nsentinels;
    ++rc->s_failures;
    /* the next sentinel at once; after a round of failures, probe at the reconnect cap */
    rc->s_next_attempt = now + (rc->s_failures % rc->store->nsentinels == 0 ? RECONNECT_CAP_MS : 0);
}

/* a sentinel named `to` as the primary (via its answer or +switch-master) */
static void primary_named(redis_conn_t *rc, const sb_store_addr_t *to, const char *via)
{
    char from[96], dest[96], why[256];
    sb_logline_t l;

    if (rc->have_primary && strcmp(rc->primary.host, to->host) == 0 && rc->primary.port == to->port) {
        rc->confirmed_at = mono_ms();
        update_usable(rc, NULL);
        return;
    }
    format_addr(to, dest, sizeof(dest));
    if (rc->have_primary) {
        format_addr(&rc->primary, from, sizeof(from));
        sb_metrics_store_event(SB_STORE_EV_PRIMARY_SWITCH);
        sb_log_begin(&l, SB_LOG_WARN, "redis.switch");
        sb_log_cstr(&l, "from", from);
        sb_log_cstr(&l, "to", dest);
        sb_log_cstr(&l, "via", via);
        sb_log_cstr(&l, "sentinel", rc->sq.addr);
        sb_log_end(&l);
    }
    rc->primary = *to;
    rc->have_primary = 1;
    rc->confirmed_at = mono_ms();
    if (rc->data.state != L_DOWN) {
        snprintf(why, sizeof(why), "the primary moved to %s", dest);
        data_teardown(rc, why, 0);
    }
    /* not inside one of the data link's callbacks here, so it is gone already: connect to the new primary now */
    rc->failures = 0;
    rc->next_attempt = 0;
    if (rc->data.ac == NULL)
        data_connect(rc);
}

static void on_sentinel_query(redisAsyncContext *ac, void *r, void *privdata)
{
    redis_conn_t *rc = privdata;
    redisReply *reply = r;
    sb_store_addr_t to;
    char why[192];

    if (reply == NULL || rc->sq.state == L_DOWN)
        return;
    rc->query_sent = 0;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 && reply->element[0]->type == REDIS_REPLY_STRING &&
        reply->element[1]->type == REDIS_REPLY_STRING) {
        if (addr_from(reply->element[0]->str, reply->element[0]->len, reply->element[1]->str, reply->element[1]->len, &to) != 0) {
            snprintf(why, sizeof(why), "the sentinel named the primary \"%.64s\" port \"%.8s\": only IP addresses are used",
                     reply->element[0]->str, reply->element[1]->str);
            sentinel_fail(rc, why);
            return;
        }
        if (rc->s_logged_down) {
            sb_logline_t l;
            rc->s_logged_down = 0;
            rc->s_last_down[0] = '\0';
            sb_log_begin(&l, SB_LOG_INFO, "redis.sentinel_up");
            sb_log_cstr(&l, "addr", rc->sq.addr);
            sb_log_end(&l);
        }
        rc->s_failures = 0;
        primary_named(rc, &to, "sentinel answer");
        return;
    }
    if (reply->type == REDIS_REPLY_NIL)
        snprintf(why, sizeof(why), "the sentinel does not know master \"%s\"", rc->store->master);
    else if (reply->type == REDIS_REPLY_ERROR)
        snprintf(why, sizeof(why), "the sentinel refused the query: %.140s", reply->str);
    else
        snprintf(why, sizeof(why), "the sentinel gave an unexpected answer");
    sentinel_fail(rc, why);
}

/* asks for the primary now, unless the query link is not up or a question is already out */
static void sentinel_query(redis_conn_t *rc)
{
    const char *argv[] = {"SENTINEL", "get-master-addr-by-name", rc->store->master};
    size_t lens[] = {8, 23, strlen(rc->store->master)};

    if (rc->sq.state != L_UP || rc->query_sent != 0 || rc->sq.ac == NULL)
        return;
    if (redisAsyncCommandArgv(rc->sq.ac, on_sentinel_query, rc, 3, argv, lens) != REDIS_OK)
        return;
    rc->query_sent = rc->last_query = mono_ms();
}

static void on_sentinel_auth(redisAsyncContext *ac, void *r, void *privdata)
{
    link_t *l = privdata;
    redisReply *reply = r;
    char why[192];

    if (reply == NULL || l->state == L_DOWN)
        return;
    if (reply->type == REDIS_REPLY_STATUS && strcmp(reply->str, "OK") == 0)
        return;
    snprintf(why, sizeof(why), "AUTH refused: %.140s", reply->type == REDIS_REPLY_ERROR ? reply->str : "unexpected answer");
    sentinel_fail(l->rc, why);
}

static void on_switch_message(redisAsyncContext *ac, void *r, void *privdata)
{
    redis_conn_t *rc = privdata;
    redisReply *reply = r;
    sb_store_addr_t to;

    if (reply == NULL || rc->ss.state == L_DOWN || reply->type != REDIS_REPLY_ARRAY || reply->elements != 3 ||
        reply->element[0]->type != REDIS_REPLY_STRING)
        return;
    if (strcmp(reply->element[0]->str, "subscribe") == 0) {
        rc->ss_subscribed = 1;
        rc->ss.state = L_UP;
        return;
    }
    if (strcmp(reply->element[0]->str, "message") != 0 || reply->element[2]->type != REDIS_REPLY_STRING)
        return;
    switch (sb_store__parse_switch_master(reply->element[2]->str, reply->element[2]->len, rc->store->master, &to)) {
    case 1:
        primary_named(rc, &to, "+switch-master");
        break;
    case 0:
        break; /* another master this sentinel watches */
    default:
        sentinel_fail(rc, "malformed +switch-master message (or a primary named by a hostname)");
        break;
    }
}

static void on_sentinel_connect(const redisAsyncContext *ac, int status)
{
    link_t *l = ac->data;
    char why[192];

    if (status != REDIS_OK) {
        /* hiredis frees this context after the callback: only the other link is closed here */
        snprintf(why, sizeof(why), "connect failed: %s", ac->errstr[0] != '\0' ? ac->errstr : "unknown error");
        if (l->state != L_DOWN) {
            l->state = L_DOWN;
            sentinel_fail(l->rc, why);
        }
        return;
    }
    if (l == &l->rc->sq && l->state == L_CONNECTING) {
        l->state = L_UP;
        sentinel_query(l->rc);
    }
}

static void on_sentinel_disconnect(const redisAsyncContext *ac, int status)
{
    link_t *l = ac->data;
    char why[192];

    if (l->state == L_DOWN)
        return;
    l->state = L_DOWN;
    snprintf(why, sizeof(why), "connection lost: %s",
             status == REDIS_OK ? "closed by the sentinel" : (ac->errstr[0] != '\0' ? ac->errstr : "unknown error"));
    sentinel_fail(l->rc, why);
}

static void sentinel_open(redis_conn_t *rc)
{
    sb_store_t *s = rc->store;
    const sb_store_addr_t *to = &s->sentinels[rc->sidx];
    const char *pw = s->sentinel_password;
    char why[192];
    const char *err;

    rc->query_sent = 0;
    rc->ss_subscribed = 0;
    if ((err = link_open(&rc->sq, rc->loop, to, NULL, on_sentinel_connect, on_sentinel_disconnect, why, sizeof(why))) != NULL ||
        (err = link_open(&rc->ss, rc->loop, to, NULL, on_sentinel_connect, on_sentinel_disconnect, why, sizeof(why))) != NULL) {
        format_addr(to, rc->sq.addr, sizeof(rc->sq.addr));
        sentinel_fail(rc, err);
        return;
    }
    if (pw != NULL) {
        const char *argv[] = {"AUTH", pw};
        size_t lens[] = {4, strlen(pw)};
        redisAsyncCommandArgv(rc->sq.ac, on_sentinel_auth, &rc->sq, 2, argv, lens);
        redisAsyncCommandArgv(rc->ss.ac, on_sentinel_auth, &rc->ss, 2, argv, lens);
    }
    {
        const char *argv[] = {"SUBSCRIBE", "+switch-master"};
        size_t lens[] = {9, 14};
        redisAsyncCommandArgv(rc->ss.ac, on_switch_message, rc, 2, argv, lens);
        rc->ss_sent = mono_ms();
    }
    /* the query goes out once the query link is connected (on_sentinel_connect) */
}

static void sentinel_tick(redis_conn_t *rc, int64_t now)
{
    int64_t timeout = (int64_t)rc->store->timeout_ms;
    char why[128];

    if (rc->sq.state == L_CONNECTING && now - rc->sq.since > timeout) {
        snprintf(why, sizeof(why), "connect timed out after %lld ms", (long long)timeout);
        sentinel_fail(rc, why);
    } else if (rc->query_sent != 0 && now - rc->query_sent > timeout) {
        snprintf(why, sizeof(why), "no answer to SENTINEL get-master-addr-by-name within %lld ms", (long long)timeout);
        sentinel_fail(rc, why);
    } else if (rc->ss.state != L_DOWN && !rc->ss_subscribed && now - rc->ss_sent > timeout) {
        snprintf(why, sizeof(why), "SUBSCRIBE +switch-master not confirmed within %lld ms", (long long)timeout);
        sentinel_fail(rc, why);
    }
    if (rc->sq.state == L_UP && rc->query_sent == 0 && now - rc->last_query >= SENTINEL_QUERY_MS)
        sentinel_query(rc);
    if (rc->sq.state == L_DOWN && rc->ss.state == L_DOWN && rc->sq.ac == NULL && rc->ss.ac == NULL && now >= rc->s_next_attempt)
        sentinel_open(rc);
}

/* ---- the tick ---------------------------------------------------------------------------------------------------------- */

static void on_flush(h2o_timeout_entry_t *entry);
static void update_failed(const char *update, const char *run_id, const char *why);

static void on_tick(h2o_timeout_entry_t *entry)
{
    redis_conn_t *rc = H2O_STRUCT_FROM_MEMBER(redis_conn_t, tick, entry);
    int64_t now = mono_ms(), timeout = (int64_t)rc->store->timeout_ms;
    char why[192];

    h2o_timeout_link(rc->loop, &rc->tick_timeout, &rc->tick);
    if (rc->data.state == L_CONNECTING && now - rc->data.since > timeout) {
        snprintf(why, sizeof(why), "connect timed out after %lld ms", (long long)timeout);
        data_teardown(rc, why, 0);
    } else if (!h2o_linklist_is_empty(&rc->pending)) {
        cmd_t *oldest = H2O_STRUCT_FROM_MEMBER(cmd_t, link, rc->pending.next);
        if (oldest->deadline <= now) {
            snprintf(why, sizeof(why), "no answer to %s within %lld ms", oldest->what, (long long)timeout);
            data_teardown(rc, why, 0);
        }
    }
    if (rc->data.state == L_UP && now - rc->last_heartbeat >= HEARTBEAT_MS) {
        /* a heartbeat that also notices a primary turned replica, so /readyz follows within a second */
        const char *argv[] = {"ROLE"};
        size_t lens[] = {4};
        rc->last_heartbeat = now;
        cmd_send(cmd_new(rc, "ROLE", on_heartbeat, -1, 1, argv, lens));
    }
    if (is_sentinel(rc))
        sentinel_tick(rc, now);
    if (rc->data.state == L_DOWN && rc->data.ac == NULL && now >= rc->next_attempt && (!is_sentinel(rc) || rc->have_primary))
        data_connect(rc);
    update_usable(rc, NULL);
}

void *sb_store__redis_conn_create(sb_store_t *s, h2o_loop_t *loop)
{
    redis_conn_t *rc = sb_mem_calloc(1, sizeof(*rc));
    rc->store = s;
    rc->loop = loop;
    rc->data.rc = rc->sq.rc = rc->ss.rc = rc;
    rc->data.flush_timeout = rc->sq.flush_timeout = rc->ss.flush_timeout = &rc->flush_timeout;
    rc->data.loop = rc->sq.loop = rc->ss.loop = loop;
    rc->data.wflush.cb = rc->sq.wflush.cb = rc->ss.wflush.cb = on_wflush;
    h2o_linklist_init_anchor(&rc->pending);
    h2o_timeout_init(loop, &rc->tick_timeout, TICK_MS);
    h2o_timeout_init(loop, &rc->flush_timeout, 0);
    rc->flush.cb = on_flush;
    rc->tick.cb = on_tick;
    h2o_timeout_link(loop, &rc->tick_timeout, &rc->tick);
    if (is_sentinel(rc))
        sentinel_open(rc);
    else
        data_connect(rc);
    return rc;
}

void sb_store__redis_conn_destroy(void *p)
{
    redis_conn_t *rc = p;
    link_t *links[] = {&rc->data, &rc->sq, &rc->ss};

    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); ++i) {
        links[i]->state = L_DOWN;
        if (links[i]->ac != NULL)
            redisAsyncFree(links[i]->ac);
    }
    for (size_t i = 0; i < rc->nrel; ++i)
        update_failed("release", rc->rel[i].run_id, "the worker stopped before it was sent");
    if (h2o_timeout_is_linked(&rc->tick))
        h2o_timeout_unlink(&rc->tick);
    if (h2o_timeout_is_linked(&rc->flush))
        h2o_timeout_unlink(&rc->flush);
    h2o_timeout_dispose(rc->loop, &rc->tick_timeout);
    h2o_timeout_dispose(rc->loop, &rc->flush_timeout);
    for (size_t i = 0; i < RCACHE_SLOTS; ++i)
        sb_token_release(rc->cache[i].tok);
    sb_mem_free(rc);
}

int sb_store__redis_healthy(void *p)
{
    redis_conn_t *rc = p;
    return atomic_load_explicit(&rc->usable, memory_order_relaxed);
}

/* ---- records ----------------------------------------------------------------------------------------------------------- */

/* the mint id token.c writes at a fixed offset, or NULL (a record from an older version) */
static const char *mint_of(const char *rec, size_t len)
{
    static const char head[] = "{\"v\":1,\"mint\":\"";
    if (len < sizeof(head) - 1 + 33 || memcmp(rec, head, sizeof(head) - 1) != 0 || rec[sizeof(head) - 1 + 32] != '"')
        return NULL;
    for (size_t i = 0; i < 32; ++i) {
        char ch = rec[sizeof(head) - 1 + i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
            return NULL;
    }
    return rec + sizeof(head) - 1;
}

/*
 * The record for `hash` from the bytes Redis returned: the parsed form this
 * worker already holds for the same record (same mint id and length), else a
 * fresh parse, kept for next time. A reference the caller must release, or
 * NULL (unreadable).
 */
static sb_token_t *record_token(redis_conn_t *rc, const uint8_t hash[32], const char *rec, size_t len)
{
    rcache_t *e = &rc->cache[hash[31] % RCACHE_SLOTS];
    const char *mint = mint_of(rec, len);
    sb_token_t *tok;

    if (mint != NULL && e->tok != NULL && e->len == len && memcmp(e->hash, hash, 32) == 0 && memcmp(e->mint, mint, 32) == 0) {
        sb_token_addref(e->tok);
        return e->tok;
    }
    if (sb_token_deserialize(hash, rec, len, &tok) != SB_OK)
        return NULL;
    if (mint != NULL) {
        uint64_t v[4] = {len, (uint64_t)tok->expires_at_ms, (uint64_t)tok->quota.calls, (uint64_t)tok->quota.concurrent};
        sb_token_release(e->tok);
        memcpy(e->hash, hash, 32);
        memcpy(e->mint, mint, 32);
        e->len = len;
        sb_token_addref(tok);
        e->tok = tok;
        for (int i = 0; i < 4; ++i)
            e->numlen[i] = (size_t)(put_u64(e->num[i], v[i]) - e->num[i]);
    }
    return tok;
}

/* the parsed record this worker holds for `hash`, or NULL */
static rcache_t *known_record(redis_conn_t *rc, const uint8_t hash[32])
{
    rcache_t *e = &rc->cache[hash[31] % RCACHE_SLOTS];
    return e->tok != NULL && memcmp(e->hash, hash, 32) == 0 ? e : NULL;
}

static void forget_record(redis_conn_t *rc, const uint8_t hash[32])
{
    rcache_t *e = known_record(rc, hash);
    if (e != NULL) {
        sb_token_release(e->tok);
        memset(e, 0, sizeof(*e));
    }
}

static size_t key_for(const sb_store_t *s, const char *kind, const char *id, size_t idlen, char *out, size_t outsz)
{
    int n = snprintf(out, outsz, "%s%s:%.*s", s->prefix, kind, (int)idlen, id);
    return (size_t)n < outsz ? (size_t)n : outsz - 1;
}

/* "<prefix>tok:<64 hex>" into out (the prefix is at most a few hundred bytes: checked at create) */
static size_t tok_key(const sb_store_t *s, const uint8_t hash[32], char *out)
{
    size_t plen = strlen(s->prefix);
    memcpy(out, s->prefix, plen);
    memcpy(out + plen, "tok:", 4);
    sb_hex(hash, 32, out + plen + 4);
    return plen + 4 + 64;
}

static size_t quota_key(const sb_store_t *s, const char *what, const char *run_id, size_t rlen, char *out, size_t outsz)
{
    int n = snprintf(out, outsz, "%sq:%s:%.*s", s->prefix, what, (int)rlen, run_id);
    return (size_t)n < outsz ? (size_t)n : outsz - 1;
}

/* a command may go out only while the store is usable; otherwise the caller answers SB_E_UNAVAILABLE at once */
static int usable(redis_conn_t *rc)
{
    return usable_now(rc, mono_ms());
}

/* ---- quota updates nobody waits for ------------------------------------------------------------------------------------ */

static void update_failed(const char *update, const char *run_id, const char *why)
{
    sb_logline_t l;
    sb_metrics_store_event(strcmp(update, "release") == 0 ? SB_STORE_EV_RELEASE_FAILED : SB_STORE_EV_FETCH_ADD_FAILED);
    sb_log_begin(&l, SB_LOG_WARN, "redis.quota_update_failed");
    sb_log_cstr(&l, "update", update);
    sb_log_cstr(&l, "runId", run_id);
    sb_log_cstr(&l, "reason", why);
    sb_log_end(&l);
}

/* the run id of an in-flight counter key a command carried */
static void run_of_key(const redis_conn_t *rc, const char *key, size_t klen, char *out)
{
    size_t skip = strlen(rc->store->prefix) + sizeof("q:inflight:") - 1, n = klen > skip ? klen - skip : 0;
    if (n > SB_MAX_RUN_ID)
        n = SB_MAX_RUN_ID;
    memcpy(out, key + skip, n);
    out[n] = '\0';
}

/*
 * Checks what became of the releases a command carried: `reply` is the
 * script's mask of counters it could not decrement, or NULL when the command
 * got no usable answer (then none of them is known to have happened).
 */
static void check_releases(cmd_t *cmd, const redisReply *mask, const char *why)
{
    char run[SB_MAX_RUN_ID + 1], buf[192];

    for (int i = 0; i < cmd->nrel; ++i) {
        if (mask != NULL && (mask->type != REDIS_REPLY_INTEGER || (mask->integer & (1LL << i)) == 0))
            continue;
        run_of_key(cmd->rc, cmd->resp + cmd->rel_key_off[i], cmd->rel_key_len[i], run);
        snprintf(buf, sizeof(buf), "%s", mask != NULL ? "the in-flight counter is not a number" : why);
        update_failed("release", run, buf);
    }
}

/* moves the queued releases into a command: their keys appended at argv[*argc..], their counts formatted into counts[] */
static size_t take_releases(redis_conn_t *rc, char keys[][KEY_MAX], char counts[][12], const char **argv, size_t *lens, int *argc)
{
    size_t n = rc->nrel;
    for (size_t i = 0; i < n; ++i) {
        argv[*argc] = keys[i];
        lens[(*argc)++] = quota_key(rc->store, "inflight", rc->rel[i].run_id, strlen(rc->rel[i].run_id), keys[i], sizeof(keys[i]));
        *put_u64(counts[i], rc->rel[i].n) = '\0';
    }
    rc->nrel = 0;
    return n;
}

static void why_of(const redisReply *reply, char *why, size_t sz)
{
    if (reply == NULL)
        snprintf(why, sz, "the connection went down before the answer");
    else
        snprintf(why, sz, "%.180s", reply->type == REDIS_REPLY_ERROR ? reply->str : "unexpected answer");
}

static void on_release(cmd_t *cmd, redisReply *reply)
{
    char why[192];
    if (reply != NULL && reply->type == REDIS_REPLY_INTEGER) {
        check_releases(cmd, reply, NULL);
        return;
    }
    why_of(reply, why, sizeof(why));
    check_releases(cmd, NULL, why);
}

/* sends the queued releases on their own */
static void flush_releases(redis_conn_t *rc)
{
    char keys[REL_MAX][KEY_MAX], counts[REL_MAX][12];
    const char *argv[1 + 2 * REL_MAX];
    size_t lens[1 + 2 * REL_MAX], n;
    char nk[8];
    int argc = 1;
    cmd_t *cmd;

    if (h2o_timeout_is_linked(&rc->flush))
        h2o_timeout_unlink(&rc->flush);
    if (rc->nrel == 0)
        return;
    if (!usable(rc)) {
        /* the slots expire with the runs' tokens */
        for (size_t i = 0; i < rc->nrel; ++i)
            update_failed("release", rc->rel[i].run_id, "the token store is unavailable");
        rc->nrel = 0;
        return;
    }
    n = take_releases(rc, keys, counts, argv, lens, &argc);
    argv[0] = nk;
    lens[0] = (size_t)snprintf(nk, sizeof(nk), "%zu", n);
    for (size_t i = 0; i < n; ++i) {
        argv[argc] = counts[i];
        lens[argc++] = strlen(counts[i]);
    }
    cmd = cmd_new_rel(rc, "the release", on_release, SC_RELEASE, argc, argv, lens, 1, (int)n);
    cmd_send(cmd);
}

static void on_flush(h2o_timeout_entry_t *entry)
{
    flush_releases(H2O_STRUCT_FROM_MEMBER(redis_conn_t, flush, entry));
}

/*
 * Queues one slot to go back. It rides on the next call's script when one
 * follows within this loop pass (one command per call), else it goes on its
 * own once the pass's I/O is handled: never later than a separate command
 * would have been written.
 */
static void release_run(redis_conn_t *rc, const char *run_id, size_t rlen)
{
    size_t n = rlen < SB_MAX_RUN_ID ? rlen : SB_MAX_RUN_ID, i;

    for (i = 0; i < rc->nrel; ++i)
        if (strlen(rc->rel[i].run_id) == n && memcmp(rc->rel[i].run_id, run_id, n) == 0)
            break;
    if (i == rc->nrel) {
        if (rc->nrel == REL_MAX)
            flush_releases(rc);
        i = rc->nrel++;
        memcpy(rc->rel[i].run_id, run_id, n);
        rc->rel[i].run_id[n] = '\0';
        rc->rel[i].n = 0;
    }
    ++rc->rel[i].n;
    if (!h2o_timeout_is_linked(&rc->flush))
        h2o_timeout_link(rc->loop, &rc->flush_timeout, &rc->flush);
}

void sb_store__redis_quota_release(void *rcp, const sb_token_t *tok)
{
    redis_conn_t *rc = rcp;
    if (!usable(rc)) {
        /* the slot expires with the run's tokens */
        update_failed("release", tok->run_id, "the token store is unavailable");
        return;
    }
    release_run(rc, tok->run_id, strlen(tok->run_id));
}

static void on_update(cmd_t *cmd, redisReply *reply)
{
    char why[192];

    if (reply != NULL && reply->type == REDIS_REPLY_INTEGER)
        return;
    why_of(reply, why, sizeof(why));
    update_failed("fetch_bytes", cmd->run_id, why);
}

void sb_store__redis_quota_fetch_add(void *rcp, const sb_token_t *tok, uint64_t bytes)
{
    redis_conn_t *rc = rcp;
    char bk[KEY_MAX], n[32], exp[32];
    const char *argv[4] = {"1", bk, n, exp};
    size_t lens[4];
    cmd_t *cmd;

    if (!usable(rc)) {
        update_failed("fetch_bytes", tok->run_id, "the token store is unavailable");
        return;
    }
    lens[0] = 1;
    lens[1] = quota_key(rc->store, "bytes", tok->run_id, strlen(tok->run_id), bk, sizeof(bk));
    lens[2] = (size_t)snprintf(n, sizeof(n), "%llu", (unsigned long long)bytes);
    lens[3] = (size_t)snprintf(exp, sizeof(exp), "%lld", (long long)tok->expires_at_ms);
    cmd = cmd_new(rc, "fetch_add", on_update, SC_FETCH_ADD, 4, argv, lens);
    memcpy(cmd->run_id, tok->run_id, strlen(tok->run_id) + 1);
    cmd_send(cmd);
}

/* ---- the call path ----------------------------------------------------------------------------------------------------- */

static void on_lookup(cmd_t *cmd, redisReply *reply)
{
    redis_conn_t *rc = cmd->rc;
    sb_token_t *tok = NULL;
    sb_status_t st = SB_E_UNAVAILABLE;
    const char *why = NULL;
    long long code;
    redisReply *rec, *run;
    const char *run_id;
    size_t run_len;

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY || reply->elements < 2 ||
        reply->element[0]->type != REDIS_REPLY_INTEGER || reply->element[1]->type != REDIS_REPLY_INTEGER) {
        char lost[192];
        why_of(reply, lost, sizeof(lost));
        check_releases(cmd, NULL, lost);
        goto Done;
    }
    check_releases(cmd, reply->element[0], NULL);
    code = reply->element[1]->integer;
    if (code == 0) {
        forget_record(rc, cmd->hash);
        st = SB_E_UNAUTHORIZED;
        goto Done;
    }
    if (code != 1 && code != 2 && code != 4)
        goto Done; /* 3: a record the script cannot read */
    if (reply->elements == 2 && cmd->known != NULL) {
        /* the record the lookup named: counted against the run id it sent */
        tok = cmd->known;
        cmd->known = NULL;
        run_id = tok->run_id;
        run_len = strlen(run_id);
    } else if (reply->elements == 4 && (rec = reply->element[2])->type == REDIS_REPLY_STRING &&
               (run = reply->element[3])->type == REDIS_REPLY_STRING) {
        tok = record_token(rc, cmd->hash, rec->str, rec->len);
        run_id = run->str;
        run_len = run->len;
    } else {
        goto Done;
    }
    /* the script counted against the run it read; the record must agree */
    if (tok == NULL || strlen(tok->run_id) != run_len || memcmp(tok->run_id, run_id, run_len) != 0) {
        st = SB_E_UNAVAILABLE;
    } else if (tok->expires_at_ms <= sb_now_ms()) {
        /* Redis expiry and our clock disagree: believe the stricter one */
        st = SB_E_UNAUTHORIZED;
    } else if (code == 4) {
        st = SB_OK;
    } else {
        st = SB_E_RATE_LIMITED;
        why = code == 1 ? "calls per run" : "concurrent calls per run";
    }
    if (st != SB_OK && code == 4)
        release_run(rc, run_id, run_len); /* a slot taken for a call that does not go ahead */
    if (st != SB_OK && st != SB_E_RATE_LIMITED) {
        sb_token_release(tok);
        tok = NULL;
    }
Done:
    if (st == SB_E_UNAVAILABLE)
        why = "the token store is unavailable";
    cmd->cb.lookup(cmd->arg, st, tok, why);
}

void sb_store__redis_lookup_acquire(void *rcp, const uint8_t hash[32], sb_store_lookup_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char key[KEY_MAX], nk[8], keys[REL_MAX][KEY_MAX], counts[REL_MAX][12];
    const char *argv[CMD_MAX_ARGS];
    size_t lens[CMD_MAX_ARGS], nrel;
    int argc = 2;
    rcache_t *known = known_record(rc, hash);
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE, NULL, "the token store is unavailable");
        return;
    }
    argv[1] = key;
    lens[1] = tok_key(rc->store, hash, key);
    /* the slots queued since the last command go back first, in the same script */
    nrel = take_releases(rc, keys, counts, argv, lens, &argc);
    argv[0] = nk;
    lens[0] = (size_t)(put_u64(nk, 1 + nrel) - nk);
    argv[argc] = rc->store->prefix;
    lens[argc++] = strlen(rc->store->prefix);
    if (known != NULL) {
        const sb_token_t *t = known->tok;
        argv[argc] = known->mint;
        lens[argc++] = 32;
        argv[argc] = known->num[0];
        lens[argc++] = known->numlen[0];
        argv[argc] = t->run_id;
        lens[argc++] = strlen(t->run_id);
        for (int i = 1; i < 4; ++i) {
            argv[argc] = known->num[i];
            lens[argc++] = known->numlen[i];
        }
    } else {
        for (int i = 0; i < 6; ++i) {
            argv[argc] = "";
            lens[argc++] = 0;
        }
    }
    for (size_t i = 0; i < nrel; ++i) {
        argv[argc] = counts[i];
        lens[argc++] = strlen(counts[i]);
    }
    if (h2o_timeout_is_linked(&rc->flush))
        h2o_timeout_unlink(&rc->flush);
    cmd = cmd_new_rel(rc, "the call lookup", on_lookup, SC_LOOKUP, argc, argv, lens, 2, (int)nrel);
    if (known != NULL) {
        sb_token_addref(known->tok);
        cmd->known = known->tok;
    }
    cmd->cb.lookup = cb;
    cmd->arg = arg;
    memcpy(cmd->hash, hash, 32);
    cmd_send(cmd);
}

static void on_get(cmd_t *cmd, redisReply *reply)
{
    sb_token_t *tok = NULL;
    sb_status_t st = SB_E_UNAVAILABLE;

    if (reply != NULL && reply->type == REDIS_REPLY_NIL) {
        forget_record(cmd->rc, cmd->hash);
        st = SB_E_UNAUTHORIZED;
    } else if (reply != NULL && reply->type == REDIS_REPLY_STRING &&
               (tok = record_token(cmd->rc, cmd->hash, reply->str, reply->len)) != NULL) {
        st = SB_OK;
        if (tok->expires_at_ms <= sb_now_ms()) {
            sb_token_release(tok);
            tok = NULL;
            st = SB_E_UNAUTHORIZED;
        }
    }
    cmd->cb.get(cmd->arg, st, tok);
}

void sb_store__redis_get(void *rcp, const uint8_t hash[32], sb_store_get_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char hex[65], key[KEY_MAX];
    const char *argv[2] = {"GET", key};
    size_t lens[2];
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE, NULL);
        return;
    }
    sb_hex(hash, 32, hex);
    lens[0] = 3;
    lens[1] = key_for(rc->store, "tok", hex, 64, key, sizeof(key));
    cmd = cmd_new(rc, "GET", on_get, -1, 2, argv, lens);
    cmd->cb.get = cb;
    cmd->arg = arg;
    memcpy(cmd->hash, hash, 32);
    cmd_send(cmd);
}

/* ---- admin writes ------------------------------------------------------------------------------------------------------ */

static void on_put(cmd_t *cmd, redisReply *reply)
{
    sb_status_t st = SB_E_UNAVAILABLE;
    if (reply != NULL && reply->type == REDIS_REPLY_INTEGER)
        st = reply->integer == 1 ? SB_OK : SB_E_BAD_ARGS;
    cmd->cb.done(cmd->arg, st);
}

void sb_store__redis_put(void *rcp, sb_token_t *tok, const json_t *caps, sb_store_done_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char hex[65], tkey[KEY_MAX], rkey[1024], ttl[32], ck[KEY_MAX], ik[KEY_MAX], exp[32];
    int64_t ttl_ms = tok->expires_at_ms - sb_now_ms();
    const char *argv[9];
    size_t lens[9];
    cmd_t *cmd;
    char *rec;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE);
        return;
    }
    sb_hex(tok->hash, 32, hex);
    if ((rec = sb_token_serialize(tok, caps)) == NULL) {
        cb(arg, SB_E_UNAVAILABLE);
        return;
    }
    argv[0] = "4";
    lens[0] = 1;
    argv[1] = tkey;
    lens[1] = key_for(rc->store, "tok", hex, 64, tkey, sizeof(tkey));
    argv[2] = rkey;
    lens[2] = key_for(rc->store, "run", tok->run_id, strlen(tok->run_id), rkey, sizeof(rkey));
    argv[3] = ck;
    lens[3] = quota_key(rc->store, "calls", tok->run_id, strlen(tok->run_id), ck, sizeof(ck));
    argv[4] = ik;
    lens[4] = quota_key(rc->store, "inflight", tok->run_id, strlen(tok->run_id), ik, sizeof(ik));
    argv[5] = rec;
    lens[5] = strlen(rec);
    argv[6] = ttl;
    lens[6] = (size_t)snprintf(ttl, sizeof(ttl), "%lld", (long long)(ttl_ms > 0 ? ttl_ms : 1));
    argv[7] = hex;
    lens[7] = 64;
    argv[8] = exp;
    lens[8] = (size_t)snprintf(exp, sizeof(exp), "%lld", (long long)tok->expires_at_ms);
    cmd = cmd_new(rc, "the mint", on_put, SC_MINT, 9, argv, lens);
    sb_mem_free_foreign(rec); /* json_dumps text */
    cmd->cb.done = cb;
    cmd->arg = arg;
    cmd_send(cmd);
}

static void on_done(cmd_t *cmd, redisReply *reply)
{
    cmd->cb.done(cmd->arg, reply != NULL && reply->type == REDIS_REPLY_INTEGER ? SB_OK : SB_E_UNAVAILABLE);
}

void sb_store__redis_revoke_token(void *rcp, const uint8_t hash[32], sb_store_done_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char hex[65], key[KEY_MAX];
    const char *argv[2] = {"DEL", key};
    size_t lens[2];
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE);
        return;
    }
    sb_hex(hash, 32, hex);
    forget_record(rc, hash);
    lens[0] = 3;
    lens[1] = key_for(rc->store, "tok", hex, 64, key, sizeof(key));
    cmd = cmd_new(rc, "DEL", on_done, -1, 2, argv, lens);
    cmd->cb.done = cb;
    cmd->arg = arg;
    cmd_send(cmd);
}

void sb_store__redis_revoke_run(void *rcp, const char *run_id, sb_store_done_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char rkey[1024], tprefix[KEY_MAX];
    const char *argv[3] = {"1", rkey, tprefix};
    size_t lens[3];
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE);
        return;
    }
    lens[0] = 1;
    lens[1] = key_for(rc->store, "run", run_id, strlen(run_id), rkey, sizeof(rkey));
    lens[2] = (size_t)snprintf(tprefix, sizeof(tprefix), "%stok:", rc->store->prefix);
    cmd = cmd_new(rc, "the run revocation", on_done, SC_REVOKE_RUN, 3, argv, lens);
    cmd->cb.done = cb;
    cmd->arg = arg;
    cmd_send(cmd);
}

/* ---- admin inspection ------------------------------------------------------------------------------------------------ */

/* a counter as the script returned it: the decimal text Redis holds ("0" when absent) */
static int counter_of(const redisReply *r, int64_t *out)
{
    char *end;
    long long v;

    if (r->type != REDIS_REPLY_STRING || r->len == 0 || r->len > 20)
        return 0;
    v = strtoll(r->str, &end, 10);
    if (end != r->str + r->len || v < 0)
        return 0;
    *out = (int64_t)v;
    return 1;
}

static int unhex32(const char *s, size_t len, uint8_t out[32])
{
    if (len != 64 || !sb_is_token_format(s, len))
        return 0;
    for (size_t i = 0; i < 32; ++i) {
        int hi = s[2 * i] <= '9' ? s[2 * i] - '0' : s[2 * i] - 'a' + 10,
            lo = s[2 * i + 1] <= '9' ? s[2 * i + 1] - '0' : s[2 * i + 1] - 'a' + 10;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 1;
}

static void on_inspect_run(cmd_t *cmd, redisReply *reply)
{
    sb_token_t *toks[SB_MAX_INSPECT_TOKENS];
    sb_store_usage_t usage = {0, 0, 0};
    size_t ntoks = 0, nlive = 0, npairs;
    int64_t now = sb_now_ms();
    sb_status_t st = SB_E_UNAVAILABLE;

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY || reply->elements < 4 || (reply->elements - 4) % 2 != 0 ||
        !counter_of(reply->element[0], &usage.calls) || !counter_of(reply->element[1], &usage.inflight) ||
        !counter_of(reply->element[2], &usage.fetched_bytes) || reply->element[3]->type != REDIS_REPLY_INTEGER ||
        reply->element[3]->integer < 0)
        goto Done;
    nlive = (size_t)reply->element[3]->integer;
    npairs = (reply->elements - 4) / 2;
    if (npairs > (size_t)cmd->limit || npairs > nlive)
        goto Done;
    for (size_t i = 0; i < npairs; ++i) {
        const redisReply *h = reply->element[4 + 2 * i], *rec = reply->element[5 + 2 * i];
        uint8_t hash[32];
        sb_token_t *tok;
        /* a record under the run's index that is not the run's, or that we cannot read: no answer rather than a wrong one */
        if (h->type != REDIS_REPLY_STRING || rec->type != REDIS_REPLY_STRING || !unhex32(h->str, h->len, hash) ||
            sb_token_deserialize(hash, rec->str, rec->len, &tok) != SB_OK)
            goto Done;
        toks[ntoks++] = tok;
        if (strcmp(tok->run_id, cmd->run_id) != 0)
            goto Done;
        if (tok->expires_at_ms <= now) {
            /* Redis expiry and our clock disagree: believe the stricter one */
            sb_token_release(toks[--ntoks]);
            --nlive;
        }
    }
    st = SB_OK;
Done:
    if (st == SB_OK) {
        cmd->cb.inspect(cmd->arg, SB_OK, toks, ntoks, nlive, &usage);
    } else {
        cmd->cb.inspect(cmd->arg, SB_E_UNAVAILABLE, NULL, 0, 0, NULL);
    }
    for (size_t i = 0; i < ntoks; ++i)
        sb_token_release(toks[i]);
}

void sb_store__redis_inspect_run(void *rcp, const char *run_id, size_t max, sb_store_inspect_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    size_t rlen = strlen(run_id);
    char rkey[1024], ck[KEY_MAX], ik[KEY_MAX], bk[KEY_MAX], tprefix[KEY_MAX], maxs[24];
    const char *argv[7] = {"4", rkey, ck, ik, bk, tprefix, maxs};
    size_t lens[7];
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE, NULL, 0, 0, NULL);
        return;
    }
    lens[0] = 1;
    lens[1] = key_for(rc->store, "run", run_id, rlen, rkey, sizeof(rkey));
    lens[2] = quota_key(rc->store, "calls", run_id, rlen, ck, sizeof(ck));
    lens[3] = quota_key(rc->store, "inflight", run_id, rlen, ik, sizeof(ik));
    lens[4] = quota_key(rc->store, "bytes", run_id, rlen, bk, sizeof(bk));
    lens[5] = (size_t)snprintf(tprefix, sizeof(tprefix), "%stok:", rc->store->prefix);
    lens[6] = (size_t)snprintf(maxs, sizeof(maxs), "%zu", max);
    cmd = cmd_new(rc, "the run inspection", on_inspect_run, SC_INSPECT_RUN, 7, argv, lens);
    cmd->cb.inspect = cb;
    cmd->arg = arg;
    cmd->limit = (int64_t)max;
    memcpy(cmd->run_id, run_id, rlen + 1);
    cmd_send(cmd);
}

/* ---- fetched bytes ----------------------------------------------------------------------------------------------------- */

static void on_fetch_check(cmd_t *cmd, redisReply *reply)
{
    sb_status_t st = SB_E_UNAVAILABLE;
    const char *why = "the token store is unavailable";

    if (reply != NULL && (reply->type == REDIS_REPLY_NIL || reply->type == REDIS_REPLY_STRING)) {
        long long have = 0;
        if (reply->type == REDIS_REPLY_STRING) {
            char *end;
            have = strtoll(reply->str, &end, 10);
            if (end == reply->str || *end != '\0')
                goto Done;
        }
        st = have >= cmd->limit ? SB_E_RATE_LIMITED : SB_OK;
        why = st == SB_OK ? NULL : "fetched bytes per run";
    }
Done:
    cmd->cb.quota(cmd->arg, st, why);
}

void sb_store__redis_quota_fetch_check(void *rcp, const sb_token_t *tok, sb_quota_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char bk[KEY_MAX];
    const char *argv[2] = {"GET", bk};
    size_t lens[2];
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE, "the token store is unavailable");
        return;
    }
    lens[0] = 3;
    lens[1] = quota_key(rc->store, "bytes", tok->run_id, strlen(tok->run_id), bk, sizeof(bk));
    cmd = cmd_new(rc, "the fetched-bytes check", on_fetch_check, -1, 2, argv, lens);
    cmd->cb.quota = cb;
    cmd->arg = arg;
    cmd->limit = tok->quota.fetch_bytes;
    cmd_send(cmd);
}

/* ---- tools.call per run ------------------------------------------------------------------------------------------------- */

static void on_tool_call(cmd_t *cmd, redisReply *reply)
{
    if (reply == NULL || reply->type != REDIS_REPLY_INTEGER) {
        cmd->cb.quota(cmd->arg, SB_E_UNAVAILABLE, "the token store is unavailable");
        return;
    }
    if (reply->integer > cmd->limit)
        cmd->cb.quota(cmd->arg, SB_E_RATE_LIMITED, "tools.call per run");
    else
        cmd->cb.quota(cmd->arg, SB_OK, NULL);
}

void sb_store__redis_quota_tool_call(void *rcp, const sb_token_t *tok, unsigned max_calls, sb_quota_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char tk[KEY_MAX], ck[KEY_MAX], exp[32];
    const char *argv[4] = {"2", tk, ck, exp};
    size_t lens[4];
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE, "the token store is unavailable");
        return;
    }
    lens[0] = 1;
    lens[1] = quota_key(rc->store, "tools", tok->run_id, strlen(tok->run_id), tk, sizeof(tk));
    lens[2] = quota_key(rc->store, "calls", tok->run_id, strlen(tok->run_id), ck, sizeof(ck));
    lens[3] = (size_t)snprintf(exp, sizeof(exp), "%lld", (long long)tok->expires_at_ms);
    cmd = cmd_new(rc, "the tools.call count", on_tool_call, SC_TOOL_CALL, 4, argv, lens);
    cmd->cb.quota = cb;
    cmd->arg = arg;
    cmd->limit = max_calls;
    cmd_send(cmd);
}

/* ---- import.fetch per run ---------------------------------------------------------------------------------------------- */

static void on_modules(cmd_t *cmd, redisReply *reply)
{
    const char *why;

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
        reply->element[0]->type != REDIS_REPLY_INTEGER || reply->element[1]->type != REDIS_REPLY_INTEGER) {
        cmd->cb.quota(cmd->arg, SB_E_UNAVAILABLE, "the token store is unavailable");
        return;
    }
    why = sb_store__modules_verdict(reply->element[0]->integer, reply->element[1]->integer, cmd->add_modules, cmd->add_bytes,
                                    cmd->limit, cmd->limit2);
    cmd->cb.quota(cmd->arg, why != NULL ? SB_E_RATE_LIMITED : SB_OK, why);
}

void sb_store__redis_quota_modules(void *rcp, const sb_token_t *tok, unsigned add_modules, uint64_t add_bytes, int64_t max_modules,
                                   int64_t max_bytes, sb_quota_cb cb, void *arg)
{
    redis_conn_t *rc = rcp;
    char mk[KEY_MAX], bk[KEY_MAX], ck[KEY_MAX], exp[32], am[16], ab[32];
    const char *argv[7] = {"3", mk, bk, ck, exp, am, ab};
    size_t lens[7];
    cmd_t *cmd;

    if (!usable(rc)) {
        cb(arg, SB_E_UNAVAILABLE, "the token store is unavailable");
        return;
    }
    lens[0] = 1;
    lens[1] = quota_key(rc->store, "modules", tok->run_id, strlen(tok->run_id), mk, sizeof(mk));
    lens[2] = quota_key(rc->store, "modbytes", tok->run_id, strlen(tok->run_id), bk, sizeof(bk));
    lens[3] = quota_key(rc->store, "calls", tok->run_id, strlen(tok->run_id), ck, sizeof(ck));
    lens[4] = (size_t)snprintf(exp, sizeof(exp), "%lld", (long long)tok->expires_at_ms);
    lens[5] = (size_t)snprintf(am, sizeof(am), "%u", add_modules);
    lens[6] = (size_t)snprintf(ab, sizeof(ab), "%llu", (unsigned long long)add_bytes);
    cmd = cmd_new(rc, "the import.fetch count", on_modules, SC_MODULES, 7, argv, lens);
    cmd->cb.quota = cb;
    cmd->arg = arg;
    cmd->limit = max_modules;
    cmd->limit2 = max_bytes;
    cmd->add_modules = add_modules;
    cmd->add_bytes = add_bytes;
    cmd_send(cmd);
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

static int check_primary(const sb_store_t *s, const sb_store_addr_t *to, char *err, size_t errsz)
{
    char where[96], db[8];
    redisContext *c;
    redisReply *r;
    int ok = -1;

    if (s->unix_path != NULL)
        snprintf(where, sizeof(where), "%s", s->unix_path);
    else
        format_addr(to, where, sizeof(where));
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
        const char *argv[] = {"SCRIPT", "LOAD", scripts[i].body};
        size_t lens[] = {6, 4, scripts[i].len};
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

    format_addr(sent, a, sizeof(a));
    snprintf(where, sizeof(where), "%s (sentinel)", a);
    if ((c = check_connect(s, sent, NULL, where, err, errsz)) == NULL)
        return -1;
    if (s->sentinel_password != NULL && check_auth(c, where, s->sentinel_password, err, errsz) != 0)
        goto Exit;
    if ((r = check_cmd(c, where, "SENTINEL get-master-addr-by-name", 3, argv, lens, err, errsz)) == NULL)
        goto Exit;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[0]->type == REDIS_REPLY_STRING &&
        r->element[1]->type == REDIS_REPLY_STRING &&
        addr_from(r->element[0]->str, r->element[0]->len, r->element[1]->str, r->element[1]->len, primary) == 0)
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
        if (check_kind(one) != SB_E_UNAVAILABLE)
            worst = check_kind(one);
        if (used + 3 < errsz) {
            int n = snprintf(err + used, errsz - used, "%s%s", used == 0 ? "no sentinel named the primary: " : "; ", one);
            used = n > 0 && (size_t)n < errsz - used ? used + (size_t)n : errsz - 1;
        }
    }
    return worst;
}
