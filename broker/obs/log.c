#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>
#include "obs/audit.h"
#include "obs/log.h"
#include "util/util.h"

static _Atomic int min_level = SB_LOG_INFO;

#define THREAD_LOG_BUFFER 65536
static __thread char *tl_buf; /* NULL: lines are written at once */
static __thread size_t tl_len;

static void write_all(const char *p, size_t n)
{
    while (n != 0) {
        ssize_t r = write(2, p, n);
        if (r <= 0)
            return; /* stderr is gone: nothing better to do with a log line */
        p += r;
        n -= (size_t)r;
    }
}

void sb_log_flush(void)
{
    size_t off = 0;
    while (off < tl_len) {
        size_t end = off;
        /* whole lines while they fit in PIPE_BUF bytes: such a write is atomic on a pipe */
        for (;;) {
            const char *nl = memchr(tl_buf + end, '\n', tl_len - end);
            size_t next = nl != NULL ? (size_t)(nl - tl_buf) + 1 : tl_len;
            if (next - off > PIPE_BUF && end != off)
                break;
            end = next;
            if (end == tl_len || end - off >= PIPE_BUF)
                break;
        }
        write_all(tl_buf + off, end - off);
        off = end;
    }
    tl_len = 0;
}

void sb_log_thread_buffered(int on)
{
    if (on && tl_buf == NULL) {
        tl_buf = malloc(THREAD_LOG_BUFFER);
        tl_len = 0;
    } else if (!on && tl_buf != NULL) {
        sb_log_flush();
        free(tl_buf);
        tl_buf = NULL;
    }
}
static const char *names[] = {"debug", "info", "warn", "error"};

void sb_log_set_level(sb_log_level_t level)
{
    atomic_store(&min_level, (int)level);
}

int sb_log_parse_level(const char *s)
{
    for (int i = 0; i < 4; ++i)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

static void raw(sb_logline_t *l, const char *s, size_t n)
{
    /* keep room for the closing "}\n" and a truncation marker */
    size_t room = sizeof(l->buf) - 32 - l->len;
    if (n > room) {
        n = room;
        l->truncated = 1;
    }
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static void escaped(sb_logline_t *l, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t i = 0;
    while (i < n && !l->truncated) {
        /* copy the run of bytes that need no escape at once */
        size_t start = i;
        while (i < n && (unsigned char)s[i] >= 0x20 && s[i] != '"' && s[i] != '\\' && s[i] != 0x7f)
            ++i;
        if (i != start)
            raw(l, s + start, i - start);
        if (i < n && !l->truncated) {
            unsigned char c = (unsigned char)s[i++];
            char e[6];
            if (c == '"' || c == '\\') {
                e[0] = '\\', e[1] = (char)c;
                raw(l, e, 2);
            } else {
                e[0] = '\\', e[1] = 'u', e[2] = '0', e[3] = '0', e[4] = hex[c >> 4], e[5] = hex[c & 15];
                raw(l, e, 6);
            }
        }
    }
}

/* "YYYY-MM-DDTHH:MM:SS" of the current second, formatted once per second per thread */
static const char *second_stamp(time_t sec)
{
    static __thread time_t cached_sec = -1;
    static __thread char cached[64];
    if (sec != cached_sec) {
        struct tm tm;
        gmtime_r(&sec, &tm);
        snprintf(cached, sizeof(cached), "%04d-%02d-%02dT%02d:%02d:%02d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                 tm.tm_hour, tm.tm_min, tm.tm_sec);
        cached_sec = sec;
    }
    return cached;
}

void sb_log_begin(sb_logline_t *l, sb_log_level_t level, const char *event)
{
    struct timespec ts;
    char head[96];
    int n;

    l->len = 0;
    l->truncated = 0;
    l->enabled = (int)level >= atomic_load(&min_level);
    if (!l->enabled)
        return;
    clock_gettime(CLOCK_REALTIME, &ts);
    n = snprintf(head, sizeof(head), "{\"ts\":\"%s.%03ldZ\",\"level\":\"%s\",\"event\":\"", second_stamp(ts.tv_sec),
                 ts.tv_nsec / 1000000, names[level]);
    raw(l, head, (size_t)n);
    escaped(l, event, strlen(event));
    raw(l, "\"", 1);
}

void sb_log_str(sb_logline_t *l, const char *key, const char *val, size_t len)
{
    if (!l->enabled)
        return;
    raw(l, ",\"", 2);
    escaped(l, key, strlen(key));
    raw(l, "\":\"", 3);
    escaped(l, val, len);
    raw(l, "\"", 1);
}

void sb_log_cstr(sb_logline_t *l, const char *key, const char *val)
{
    sb_log_str(l, key, val, strlen(val));
}

void sb_log_int(sb_logline_t *l, const char *key, long long v)
{
    char num[32];
    int n;
    if (!l->enabled)
        return;
    raw(l, ",\"", 2);
    escaped(l, key, strlen(key));
    raw(l, "\":", 2);
    n = snprintf(num, sizeof(num), "%lld", v);
    raw(l, num, (size_t)n);
}

void sb_log_end(sb_logline_t *l)
{
    ssize_t r;
    if (!l->enabled)
        return;
    if (l->truncated) {
        static const char mark[] = ",\"truncated\":true";
        memcpy(l->buf + l->len, mark, sizeof(mark) - 1);
        l->len += sizeof(mark) - 1;
    }
    l->buf[l->len++] = '}';
    l->buf[l->len++] = '\n';
    if (tl_buf != NULL) {
        if (tl_len + l->len > THREAD_LOG_BUFFER)
            sb_log_flush();
        memcpy(tl_buf + tl_len, l->buf, l->len);
        tl_len += l->len;
        return;
    }
    /* one write per line: lines from several threads never interleave */
    r = write(2, l->buf, l->len);
    (void)r;
}

void sb_log_begin_always(sb_logline_t *l, const char *event)
{
    /* the level check is the only difference: build the line as a log line would be */
    l->len = 0;
    l->truncated = 0;
    l->enabled = 1;
    {
        struct timespec ts;
        struct tm tm;
        char head[96];
        int n;
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        n = snprintf(head, sizeof(head), "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"event\":\"", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
        raw(l, head, (size_t)n);
        escaped(l, event, strlen(event));
        raw(l, "\"", 1);
    }
}

void sb_log_end_audit(sb_logline_t *l)
{
    if (!l->enabled)
        return;
    if (l->truncated) {
        static const char mark[] = ",\"truncated\":true";
        memcpy(l->buf + l->len, mark, sizeof(mark) - 1);
        l->len += sizeof(mark) - 1;
    }
    l->buf[l->len++] = '}';
    sb_audit_write(l->buf, l->len);
}

void sb_log_msg(sb_log_level_t level, const char *event, const char *msg)
{
    sb_logline_t l;
    sb_log_begin(&l, level, event);
    sb_log_cstr(&l, "msg", msg);
    sb_log_end(&l);
}

static char *log_path; /* NULL: the log is stderr as the process got it */

int sb_log_open_append(const char *what, const char *path, char *err, size_t errsz)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        char ebuf[128];
        snprintf(err, errsz, "%s: cannot open %s: %s", what, path, strerror_r(errno, ebuf, sizeof(ebuf)));
    }
    return fd;
}

sb_status_t sb_log_open_file(const char *path, char *err, size_t errsz)
{
    int fd;
    if (path == NULL || strcmp(path, "stderr") == 0)
        return SB_OK;
    if ((fd = sb_log_open_append("log_file", path, err, errsz)) < 0)
        return SB_E_BAD_ARGS;
    dup2(fd, 2);
    close(fd);
    free(log_path);
    log_path = sb_mem_strdup(path);
    return SB_OK;
}

sb_status_t sb_log_check_file(const char *path, char *err, size_t errsz)
{
    int fd;
    if (path == NULL || strcmp(path, "stderr") == 0)
        return SB_OK;
    if ((fd = sb_log_open_append("log_file", path, err, errsz)) < 0)
        return SB_E_BAD_ARGS;
    close(fd);
    return SB_OK;
}

sb_status_t sb_log_reopen(char *err, size_t errsz)
{
    int fd;
    if (log_path == NULL)
        return SB_OK;
    if ((fd = sb_log_open_append("log_file", log_path, err, errsz)) < 0)
        return SB_E_UNAVAILABLE;
    /* dup2 swaps the file under descriptor 2 at once: a write in progress finishes in the old file */
    dup2(fd, 2);
    close(fd);
    return SB_OK;
}

const char *sb_log_file(void)
{
    return log_path != NULL ? log_path : "stderr";
}
