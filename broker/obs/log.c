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
        tl_buf = sb_mem_alloc(THREAD_LOG_BUFFER);
        tl_len = 0;
    } else if (!on && tl_buf != NULL) {
        sb_log_flush();
        sb_mem_free(tl_buf);
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

/*
 * Every line is one JSON object of valid UTF-8 (RFC 8259 sections 7 and 8.1), whatever bytes a caller
 * hands in: a guest's method, path or key reaches the log and the audit stream as it came.
 *
 *  - Bytes are appended in whole units (an ASCII character, an escape, a UTF-8 sequence), never cut
 *    inside one. A unit that does not fit before LINE_RESERVE marks the line truncated and nothing else
 *    is added to it, but the string in progress is still closed, and a field whose key does not fit is
 *    dropped whole; sb_log_end then adds "truncated":true and the closing brace in the reserve.
 *  - Well-formed UTF-8 (RFC 3629 section 4: no overlong forms, no surrogates, nothing above U+10FFFF)
 *    is copied as it is. Each maximal ill-formed subpart (Unicode 15.0 section 3.9, "U+FFFD
 *    Substitution of Maximal Subparts") becomes one U+FFFD, as WHATWG's decoder and Python's
 *    errors="replace" do.
 *  - '"', '\\', the C0 controls and DEL are escaped.
 */
#define LINE_RESERVE 32 /* a closing '"', ",\"truncated\":true" and "}\n", with room to spare */

static const char replacement[] = "\xef\xbf\xbd"; /* U+FFFD */

/* appends all n bytes or none: none marks the line truncated */
static void raw(sb_logline_t *l, const char *s, size_t n)
{
    size_t limit = sizeof(l->buf) - LINE_RESERVE;
    if (l->truncated || l->len > limit || n > limit - l->len) {
        l->truncated = 1;
        return;
    }
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

/* closes a string even on a truncated line: the reserve holds this one byte */
static void close_quote(sb_logline_t *l)
{
    l->buf[l->len++] = '"';
}

/*
 * The length of the UTF-8 unit at s[0] (n >= 1, s[0] >= 0x80): a well-formed sequence (*valid = 1), or
 * the maximal ill-formed subpart to replace (*valid = 0), at least one byte (RFC 3629 section 4)
 */
static size_t utf8_unit(const unsigned char *s, size_t n, int *valid)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xbf;
    size_t need, i;

    if (c >= 0xc2 && c <= 0xdf) {
        need = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        if (c == 0xe0)
            lo = 0xa0; /* no overlong form */
        else if (c == 0xed)
            hi = 0x9f; /* no surrogate */
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        if (c == 0xf0)
            lo = 0x90; /* no overlong form */
        else if (c == 0xf4)
            hi = 0x8f; /* nothing above U+10FFFF */
    } else {
        *valid = 0; /* a continuation byte, C0, C1 or F5..FF: never a lead */
        return 1;
    }
    for (i = 1; i < need; ++i) {
        if (i >= n || s[i] < lo || s[i] > hi) {
            *valid = 0;
            return i;
        }
        lo = 0x80, hi = 0xbf; /* only the second byte has a narrower range */
    }
    *valid = 1;
    return need;
}

static void escaped(sb_logline_t *l, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n && !l->truncated) {
        /* copy the run of ASCII that needs no escape at once (each byte is a whole unit) */
        size_t start = i, limit = sizeof(l->buf) - LINE_RESERVE, room = l->len < limit ? limit - l->len : 0;
        while (i < n && u[i] >= 0x20 && u[i] < 0x7f && u[i] != '"' && u[i] != '\\')
            ++i;
        if (i - start > room) {
            i = start + room;
            l->truncated = 1;
        }
        if (i != start) {
            memcpy(l->buf + l->len, s + start, i - start);
            l->len += i - start;
        }
        if (i < n && !l->truncated) {
            unsigned char c = u[i];
            char e[6];
            if (c == '"' || c == '\\') {
                e[0] = '\\', e[1] = (char)c;
                raw(l, e, 2);
                ++i;
            } else if (c < 0x20 || c == 0x7f) {
                e[0] = '\\', e[1] = 'u', e[2] = '0', e[3] = '0', e[4] = hex[c >> 4], e[5] = hex[c & 15];
                raw(l, e, 6);
                ++i;
            } else {
                int valid;
                size_t k = utf8_unit(u + i, n - i, &valid);
                if (valid)
                    raw(l, s + i, k);
                else
                    raw(l, replacement, sizeof(replacement) - 1);
                i += k;
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
        snprintf(cached, sizeof(cached), "%04d-%02d-%02dT%02d:%02d:%02d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                 tm.tm_min, tm.tm_sec);
        cached_sec = sec;
    }
    return cached;
}

static void begin(sb_logline_t *l, sb_log_level_t level, const char *event, int always);

void sb_log_begin(sb_logline_t *l, sb_log_level_t level, const char *event)
{
    begin(l, level, event, 0);
}

void sb_log_begin_level_always(sb_logline_t *l, sb_log_level_t level, const char *event)
{
    begin(l, level, event, 1);
}

static void begin(sb_logline_t *l, sb_log_level_t level, const char *event, int always)
{
    struct timespec ts;
    char head[96];
    int n;

    l->len = 0;
    l->truncated = 0;
    l->enabled = always || (int)level >= atomic_load(&min_level);
    if (!l->enabled)
        return;
    clock_gettime(CLOCK_REALTIME, &ts);
    n = snprintf(head, sizeof(head), "{\"ts\":\"%s.%03ldZ\",\"level\":\"%s\",\"event\":\"", second_stamp(ts.tv_sec),
                 ts.tv_nsec / 1000000, names[level]);
    raw(l, head, (size_t)n);
    escaped(l, event, strlen(event));
    close_quote(l);
}

/* ,"key": for a new field; on a line that cannot take it whole, nothing (and 0) */
static int field_key(sb_logline_t *l, const char *key, const char *after, size_t after_len)
{
    size_t start = l->len;
    if (!l->enabled || l->truncated)
        return 0;
    raw(l, ",\"", 2);
    escaped(l, key, strlen(key));
    raw(l, after, after_len);
    if (l->truncated) {
        l->len = start;
        return 0;
    }
    return 1;
}

void sb_log_str(sb_logline_t *l, const char *key, const char *val, size_t len)
{
    if (!field_key(l, key, "\":\"", 3))
        return;
    escaped(l, val, len);
    close_quote(l);
}

void sb_log_cstr(sb_logline_t *l, const char *key, const char *val)
{
    sb_log_str(l, key, val, strlen(val));
}

void sb_log_int(sb_logline_t *l, const char *key, long long v)
{
    char num[24], *p = num + sizeof(num);
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    size_t start = l->len;
    if (!field_key(l, key, "\":", 2))
        return;
    /* by hand: a call's log, audit and timeline lines carry several numbers each */
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u != 0);
    if (v < 0)
        *--p = '-';
    raw(l, p, (size_t)(num + sizeof(num) - p));
    if (l->truncated)
        l->len = start; /* a number is never cut: the field goes */
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
    struct timespec ts;
    char head[64];
    unsigned ms;

    l->len = 0;
    l->truncated = 0;
    l->enabled = 1;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* the second formatted once per second per thread, the milliseconds by hand: this runs once per call */
    ms = (unsigned)(ts.tv_nsec / 1000000) % 1000u;
    memcpy(head, "{\"ts\":\"", 7);
    memcpy(head + 7, second_stamp(ts.tv_sec), 19);
    head[26] = '.';
    head[27] = (char)('0' + ms / 100);
    head[28] = (char)('0' + ms / 10 % 10);
    head[29] = (char)('0' + ms % 10);
    memcpy(head + 30, "Z\",\"event\":\"", 12);
    raw(l, head, 42);
    escaped(l, event, strlen(event));
    close_quote(l);
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
    sb_mem_free(log_path);
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
