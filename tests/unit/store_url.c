/*
 * Unit tests for broker/store: the token_store URL forms (redis://, unix://,
 * redis-sentinel://), the password options, and the parser of Sentinel's
 * +switch-master messages. Nothing here connects anywhere.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tap.h"
#include "store/store_int.h"

static sb_store_t *create(const char *url, const char **err)
{
    sb_store_config_t c = {url, "sb:", 16, 1000, NULL, NULL, NULL, NULL, 0, 0};
    sb_store_t *s = NULL;
    *err = NULL;
    if (sb_store_create(&c, &s, err) != SB_OK)
        return NULL;
    return s;
}

static void accepted(void)
{
    const char *err;
    sb_store_t *s;

    s = create("redis://127.0.0.1:6405/3", &err);
    ok(s != NULL, "redis:// with a db");
    if (s != NULL) {
        is_str(s->addr.host, "127.0.0.1", "host");
        is_int(s->addr.port, 6405, "port");
        is_int(s->db, 3, "db");
        ok(s->password == NULL, "no password");
        is_str(sb_store_kind(s), "redis", "kind");
        sb_store_destroy(s);
    }
    s = create("redis://:s3cret@localhost", &err);
    ok(s != NULL && strcmp(s->password, "s3cret") == 0 && s->addr.port == 6379 && strcmp(s->addr.host, "127.0.0.1") == 0,
       "redis:// with a password, localhost and the default port");
    sb_store_destroy(s);
    s = create("redis://[::1]:7000/", &err);
    ok(s != NULL && strcmp(s->addr.host, "::1") == 0 && s->addr.port == 7000 && s->db == 0, "redis:// with an IPv6 literal");
    sb_store_destroy(s);
    s = create("unix:///run/redis.sock?db=2", &err);
    ok(s != NULL && strcmp(s->unix_path, "/run/redis.sock") == 0 && s->db == 2, "unix:// with a db");
    sb_store_destroy(s);

    s = create("redis-sentinel://127.0.0.1:26379,[::1]:26380,localhost/mymaster/4", &err);
    ok(s != NULL, "redis-sentinel:// with three sentinels and a db");
    if (s != NULL) {
        is_int(s->nsentinels, 3, "three sentinels");
        is_str(s->sentinels[0].host, "127.0.0.1", "first");
        is_int(s->sentinels[0].port, 26379, "first port");
        is_str(s->sentinels[1].host, "::1", "second, IPv6");
        is_int(s->sentinels[1].port, 26380, "second port");
        is_str(s->sentinels[2].host, "127.0.0.1", "third, localhost");
        is_int(s->sentinels[2].port, 26379, "third: the default sentinel port");
        is_str(s->master, "mymaster", "master name");
        is_int(s->db, 4, "db");
        is_str(sb_store_kind(s), "redis-sentinel", "kind");
        sb_store_destroy(s);
    }
    s = create("redis-sentinel://10.0.0.1:5000/a.b_c-D", &err);
    ok(s != NULL && s->nsentinels == 1 && s->db == 0 && strcmp(s->master, "a.b_c-D") == 0, "one sentinel, no db");
    sb_store_destroy(s);
}

static void refused(void)
{
    static const struct {
        const char *url, *err;
    } cases[] = {
        {"redis://example.com:6379", "token_store: the redis host must be an IP literal or localhost"},
        {"redis://127.0.0.1:0", "token_store: bad host or port"},
        {"redis://127.0.0.1:65536", "token_store: bad host or port"},
        {"redis://127.0.0.1:6379/256", "token_store: bad database number"},
        {"redis://127.0.0.1:6379/x", "token_store: bad database number"},
        {"redis://127.0.0.1:6379x", "token_store: trailing characters after the port"},
        {"redis://[::1", "token_store: bad host or port"},
        {"unix://relative.sock", "token_store: unix:// needs an absolute socket path"},
        {"unix:///r.sock?db=x", "token_store: unix:// accepts only ?db=N (0-255)"},
        {"unix:///r.sock?foo=1", "token_store: unix:// accepts only ?db=N (0-255)"},
        {"rediss://127.0.0.1", "token_store: expected \"memory\", redis://host:port[/db] or unix:///path, or "
                               "redis-sentinel://host:port[,host:port...]/<master-name>[/db]"},
        {"redis-sentinel://sentinel.internal:26379/m", "token_store: a sentinel host must be an IP literal or localhost"},
        {"redis-sentinel://127.0.0.1:26379", "token_store: redis-sentinel:// needs /<master-name> after the sentinels"},
        {"redis-sentinel://127.0.0.1:26379/", "token_store: the master name must be 1-64 characters of [A-Za-z0-9._-]"},
        {"redis-sentinel://127.0.0.1:26379/my master", "token_store: the master name must be 1-64 characters of [A-Za-z0-9._-]"},
        {"redis-sentinel://127.0.0.1:26379/m/", "token_store: bad database number (0-255) after the master name"},
        {"redis-sentinel://127.0.0.1:26379/m/300", "token_store: bad database number (0-255) after the master name"},
        {"redis-sentinel://127.0.0.1:26379/m/1/2", "token_store: bad database number (0-255) after the master name"},
        {"redis-sentinel://127.0.0.1:26379,/m",
         "token_store: expected redis-sentinel://host:port[,host:port...]/<master-name>[/db]"},
        {"redis-sentinel://127.0.0.1:99999/m",
         "token_store: expected redis-sentinel://host:port[,host:port...]/<master-name>[/db]"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        const char *err;
        sb_store_t *s = create(cases[i].url, &err);
        ok(s == NULL, "refused: %s", cases[i].url);
        is_str(err != NULL ? err : "", cases[i].err, "  with: %s", cases[i].err);
        sb_store_destroy(s);
    }
    {
        char url[512] = "redis-sentinel://";
        const char *err;
        sb_store_t *s;
        for (int i = 0; i < 17; ++i)
            snprintf(url + strlen(url), sizeof(url) - strlen(url), "%s127.0.0.1:%d", i == 0 ? "" : ",", 26000 + i);
        snprintf(url + strlen(url), sizeof(url) - strlen(url), "/m");
        s = create(url, &err);
        ok(s == NULL && err != NULL && strcmp(err, "token_store: at most 16 sentinels") == 0, "17 sentinels are refused");
        sb_store_destroy(s);
    }
}

static void passwords(void)
{
    char path[] = "/tmp/sb-unit-store-XXXXXX";
    int fd = mkstemp(path);
    sb_store_t *s = NULL;
    const char *err = NULL;

    ok(fd >= 0 && write(fd, "from-a-file\n", 12) == 12, "a password file");
    close(fd);
    {
        sb_store_config_t c = {"redis://127.0.0.1:1", "sb:", 16, 1000, NULL, path, NULL, NULL, 0, 0};
        ok(sb_store_create(&c, &s, &err) == SB_OK && strcmp(s->password, "from-a-file") == 0,
           "redis_password_file: read, trailing newline dropped");
        sb_store_destroy(s);
    }
    {
        sb_store_config_t c = {"redis-sentinel://127.0.0.1:1/m", "sb:", 16, 1000, "data", NULL, NULL, path, 0, 0};
        ok(sb_store_create(&c, &s, &err) == SB_OK && strcmp(s->password, "data") == 0 &&
               strcmp(s->sentinel_password, "from-a-file") == 0,
           "sentinel: an inline data password, the sentinel password from a file");
        sb_store_destroy(s);
    }
    {
        sb_store_config_t c = {"redis://:inurl@127.0.0.1:1", "sb:", 16, 1000, "again", NULL, NULL, NULL, 0, 0};
        s = NULL;
        ok(sb_store_create(&c, &s, &err) != SB_OK &&
               strcmp(err, "token_store: a password in the URL and in redis_password: give one of the two") == 0,
           "a password in the URL and in the option is refused");
    }
    {
        sb_store_config_t c = {"redis://127.0.0.1:1", "sb:", 16, 1000, "inline", path, NULL, NULL, 0, 0};
        ok(sb_store_create(&c, &s, &err) != SB_OK &&
               strcmp(err, "redis_password and redis_password_file: give one of the two") == 0,
           "inline and file together are refused");
    }
    {
        sb_store_config_t c = {"redis://127.0.0.1:1", "sb:", 16, 1000, NULL, NULL, "x", NULL, 0, 0};
        ok(sb_store_create(&c, &s, &err) != SB_OK &&
               strcmp(err, "redis_sentinel_password: token_store is not a redis-sentinel:// URL") == 0,
           "a sentinel password without Sentinel is refused");
    }
    {
        sb_store_config_t c = {"memory", "sb:", 16, 1000, "x", NULL, NULL, NULL, 0, 0};
        ok(sb_store_create(&c, &s, &err) != SB_OK &&
               strcmp(err, "redis_password and redis_sentinel_password need a Redis token_store") == 0,
           "a password with the memory store is refused");
    }
    unlink(path);
    {
        sb_store_config_t c = {"redis://127.0.0.1:1", "sb:", 16, 1000, NULL, path, NULL, NULL, 0, 0};
        char want[256];
        snprintf(want, sizeof(want), "redis_password_file: cannot open %s: No such file or directory", path);
        ok(sb_store_create(&c, &s, &err) != SB_OK && strcmp(err, want) == 0, "a missing file names the file and why");
    }
    fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    ok(fd >= 0 && write(fd, "\n", 1) == 1, "an empty password file");
    close(fd);
    {
        sb_store_config_t c = {"redis://127.0.0.1:1", "sb:", 16, 1000, NULL, path, NULL, NULL, 0, 0};
        char want[256];
        snprintf(want, sizeof(want), "redis_password_file: %s is empty", path);
        ok(sb_store_create(&c, &s, &err) != SB_OK && strcmp(err, want) == 0, "an empty password file is refused");
    }
    unlink(path);
}

static void switch_master(void)
{
    sb_store_addr_t to;
#define MSG(s) s, sizeof(s) - 1
    memset(&to, 0, sizeof(to));
    is_int(sb_store__parse_switch_master(MSG("mymaster 127.0.0.1 6401 127.0.0.1 6402"), "mymaster", &to), 1, "ours");
    is_str(to.host, "127.0.0.1", "new host");
    is_int(to.port, 6402, "new port");
    is_int(sb_store__parse_switch_master(MSG("m ::1 1 fd00::2 26379"), "m", &to), 1, "IPv6");
    is_str(to.host, "fd00::2", "IPv6 host");
    is_int(sb_store__parse_switch_master(MSG("other 127.0.0.1 6401 127.0.0.1 6402"), "mymaster", &to), 0, "another master");
    is_int(sb_store__parse_switch_master(MSG("mymasterX 127.0.0.1 6401 127.0.0.1 6402"), "mymaster", &to), 0,
           "a longer name is another master");
    is_int(sb_store__parse_switch_master(MSG("mymaster 127.0.0.1 6401 redis-b.internal 6402"), "mymaster", &to), -1,
           "a hostname is refused");
    is_int(sb_store__parse_switch_master(MSG("mymaster 127.0.0.1 6401 127.0.0.1 0"), "mymaster", &to), -1, "port 0");
    is_int(sb_store__parse_switch_master(MSG("mymaster 127.0.0.1 6401 127.0.0.1 65536"), "mymaster", &to), -1, "port too big");
    is_int(sb_store__parse_switch_master(MSG("mymaster 127.0.0.1 6401 127.0.0.1 64x"), "mymaster", &to), -1, "port not a number");
    is_int(sb_store__parse_switch_master(MSG("mymaster 127.0.0.1 6401 127.0.0.1"), "mymaster", &to), -1, "four fields");
    is_int(sb_store__parse_switch_master(MSG("mymaster 127.0.0.1 6401 127.0.0.1 6402 x"), "mymaster", &to), -1, "six fields");
    is_int(sb_store__parse_switch_master(MSG("mymaster  127.0.0.1 6401 127.0.0.1 6402"), "mymaster", &to), -1, "two spaces");
    is_int(sb_store__parse_switch_master(MSG("mymaster 127.0.0.1 6401 127.0.0.1 6402 "), "mymaster", &to), -1, "trailing space");
    is_int(sb_store__parse_switch_master(MSG(""), "mymaster", &to), -1, "empty");
    is_int(sb_store__parse_switch_master(MSG("mymaster 1 2 "
                                             "1111111111111111111111111111111111111111111111111111111111111111111111111 3"),
                                         "mymaster", &to),
           -1, "a host longer than any address");
#undef MSG
}

int main(void)
{
    accepted();
    refused();
    passwords();
    switch_master();
    return done_testing();
}
