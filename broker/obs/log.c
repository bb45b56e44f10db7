#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/stat.h>
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

/*
 * 1 while descriptor 2 is a regular file: Linux writes to one whole under the file's lock, so a
 * thread's batch goes in one write() and lines of other threads still never land inside it. A pipe
 * (or anything else) keeps the PIPE_BUF pieces. -1: not looked at yet.
 */
static _Atomic int whole_writes = -1;

static void look_at_stderr(void)
{
    struct stat st;
    atomic_store(&whole_writes, fstat(2, &st) == 0 && S_ISREG(st.st_mode) ? 1 : 0);
}

void sb_log_flush(void)
{
    size_t off = 0;
    if (tl_len == 0)
        return;
    if (atomic_load(&whole_writes) < 0)
        look_at_stderr();
    if (atomic_load(&whole_writes) == 1) {
        write_all(tl_buf, tl_len);
        tl_len = 0;
        return;
    }
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

/* 1 for the bytes copied as they are: printable ASCII other than '"' and '\\' */
/* clang-format off */
static const unsigned char plain_byte[256] = {
    /* 0x00..0x7f, sixteen a row; 0x80..0xff are 0: UTF-8 is checked unit by unit */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0,
};
/* clang-format on */
#define PLAIN(c) (plain_byte[(unsigned char)(c)] != 0)

/*
 * The end of the run of plain bytes from i: eight bytes at a time while none of them needs a look
 * (no byte below 0x20, none at or above 0x7f, no '"' or '\\'), then byte by byte. Every field of
 * every log line passes here.
 */
static size_t plain_run(const unsigned char *u, size_t i, size_t n)
{
    const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
    while (n - i >= 8) {
        uint64_t x, q, b, del;
        memcpy(&x, u + i, 8);
        q = x ^ (ones * '"');
        b = x ^ (ones * '\\');
        del = x ^ (ones * 0x7f);
        /* each term is nonzero iff some byte is: >= 0x80, < 0x20, '"', '\\', 0x7f (a zero byte in q, b or del) */
        if (((x & highs) | ((x - ones * 0x20) & ~x & highs) | ((q - ones) & ~q & highs) | ((b - ones) & ~b & highs) |
             ((del - ones) & ~del & highs)) != 0)
            break;
        i += 8;
    }
    while (i < n && PLAIN(u[i]))
        ++i;
    return i;
}

static void escaped(sb_logline_t *l, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n && !l->truncated) {
        /* copy the run of ASCII that needs no escape at once (each byte is a whole unit) */
        size_t start = i, limit = sizeof(l->buf) - LINE_RESERVE, room = l->len < limit ? limit - l->len : 0;
        i = plain_run(u, i, n);
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

/* the decimal digits of v (at most 20), written backwards from end; returns where they start */
static char *put_u64(char *end, uint64_t v)
{
    do {
        *--end = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    return end;
}

static void put2(char *p, int v)
{
    p[0] = (char)('0' + v / 10 % 10);
    p[1] = (char)('0' + v % 10);
}

/*
 * `{"ts":"YYYY-MM-DDTHH:MM:SS.mmmZ"` of now: the part up to the second is formatted once per second
 * per thread, the milliseconds by hand (no stdio on the call path)
 */
#define STAMP_LEN 32 /* {"ts":" (7), the second (19), .mmmZ" (6) */
static void put_stamp(char out[STAMP_LEN])
{
    static __thread time_t cached_sec = -1;
    static __thread char cached[STAMP_LEN];
    struct timespec ts;
    int ms;

    clock_gettime(CLOCK_REALTIME, &ts);
    if (ts.tv_sec != cached_sec) {
        struct tm tm;
        int y;
        gmtime_r(&ts.tv_sec, &tm);
        y = tm.tm_year + 1900;
        if (y < 0 || y > 9999)
            y = 0; /* a clock this far off still gives a well-formed line */
        memcpy(cached, "{\"ts\":\"", 7);
        put2(cached + 7, y / 100);
        put2(cached + 9, y % 100);
        cached[11] = '-';
        put2(cached + 12, tm.tm_mon + 1);
        cached[14] = '-';
        put2(cached + 15, tm.tm_mday);
        cached[17] = 'T';
        put2(cached + 18, tm.tm_hour);
        cached[20] = ':';
        put2(cached + 21, tm.tm_min);
        cached[23] = ':';
        put2(cached + 24, tm.tm_sec);
        memcpy(cached + 26, ".000Z\"", 6);
        cached_sec = ts.tv_sec;
    }
    memcpy(out, cached, STAMP_LEN);
    ms = (int)(ts.tv_nsec / 1000000);
    out[27] = (char)('0' + ms / 100);
    put2(out + 28, ms % 100);
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
    static const char lv[] = ",\"level\":\"", ev[] = "\",\"event\":\"";

    l->len = 0;
    l->truncated = 0;
    l->enabled = always || (int)level >= atomic_load(&min_level);
    if (!l->enabled)
        return;
    /* the head always fits an empty line: no bound checks until the event */
    put_stamp(l->buf);
    l->len = STAMP_LEN;
    memcpy(l->buf + l->len, lv, sizeof(lv) - 1);
    l->len += sizeof(lv) - 1;
    memcpy(l->buf + l->len, names[level], strlen(names[level]));
    l->len += strlen(names[level]);
    memcpy(l->buf + l->len, ev, sizeof(ev) - 1);
    l->len += sizeof(ev) - 1;
    escaped(l, event, strlen(event));
    close_quote(l);
}

/* ,"key": for a new field; on a line that cannot take it whole, nothing (and 0) */
static int field_key(sb_logline_t *l, const char *key, size_t klen, const char *after, size_t after_len)
{
    size_t start = l->len, limit = sizeof(l->buf) - LINE_RESERVE;
    if (!l->enabled || l->truncated)
        return 0;
    /* the keys are the broker's own names: one copy when the key needs no escape and the field head fits */
    if (l->len <= limit && klen + after_len + 2 <= limit - l->len && plain_run((const unsigned char *)key, 0, klen) == klen) {
        char *p = l->buf + l->len;
        p[0] = ',', p[1] = '"';
        memcpy(p + 2, key, klen);
        memcpy(p + 2 + klen, after, after_len);
        l->len += klen + after_len + 2;
        return 1;
    }
    raw(l, ",\"", 2);
    escaped(l, key, klen);
    raw(l, after, after_len);
    if (l->truncated) {
        l->len = start;
        return 0;
    }
    return 1;
}

/*
 * The head of a field whose key is a literal, `,"key":"` or `,"key":` put together when compiled (log.h):
 * copied as it is. On a line that cannot take it whole, nothing (and 0), as field_key.
 */
static int field_head(sb_logline_t *l, const char *head, size_t hlen)
{
    size_t limit = sizeof(l->buf) - LINE_RESERVE;
    if (!l->enabled || l->truncated)
        return 0;
    if (l->len > limit || hlen > limit - l->len) {
        l->truncated = 1;
        return 0;
    }
    memcpy(l->buf + l->len, head, hlen);
    l->len += hlen;
    return 1;
}

/* a string value after its field's head, and the closing quote */
static void str_value(sb_logline_t *l, const char *val, size_t len)
{
    size_t limit = sizeof(l->buf) - LINE_RESERVE;
    /* most values (ids, names, codes) need no escape: one copy when the whole value fits */
    if (len == 0) {
        /* nothing to copy (val may be NULL) */
    } else if (l->len <= limit && len <= limit - l->len && plain_run((const unsigned char *)val, 0, len) == len) {
        memcpy(l->buf + l->len, val, len);
        l->len += len;
    } else {
        escaped(l, val, len);
    }
    close_quote(l);
}

/* a number after its field's head, which started at `start`: a number is never cut, the field goes */
static void int_value(sb_logline_t *l, long long v, size_t start)
{
    char num[24], *end = num + sizeof(num), *p;
    /* the magnitude as unsigned: LLONG_MIN has none as a long long */
    p = put_u64(end, v < 0 ? 0u - (uint64_t)v : (uint64_t)v);
    if (v < 0)
        *--p = '-';
    raw(l, p, (size_t)(end - p));
    if (l->truncated)
        l->len = start;
}

void sb_log__hstr(sb_logline_t *l, const char *head, size_t hlen, const char *val, size_t len)
{
    if (field_head(l, head, hlen))
        str_value(l, val, len);
}

void sb_log__hcstr(sb_logline_t *l, const char *head, size_t hlen, const char *val)
{
    if (field_head(l, head, hlen))
        str_value(l, val, strlen(val));
}

void sb_log__hint(sb_logline_t *l, const char *head, size_t hlen, long long v)
{
    size_t start = l->len;
    if (field_head(l, head, hlen))
        int_value(l, v, start);
}

void sb_log__str(sb_logline_t *l, const char *key, size_t klen, const char *val, size_t len)
{
    if (field_key(l, key, klen, "\":\"", 3))
        str_value(l, val, len);
}

void sb_log__int(sb_logline_t *l, const char *key, size_t klen, long long v)
{
    size_t start = l->len;
    if (field_key(l, key, klen, "\":", 2))
        int_value(l, v, start);
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
    sb_log_begin_always_as(l, event, NULL);
}

void sb_log_begin_always_as(sb_logline_t *l, const char *event, const sb_logline_t *as)
{
    /* the level check and field are the only differences: build the line as a log line would be */
    static const char ev[] = ",\"event\":\"";
    l->truncated = 0;
    l->enabled = 1;
    if (as != NULL && as->enabled && as->len >= STAMP_LEN && memcmp(as->buf, "{\"ts\":\"", 7) == 0)
        memcpy(l->buf, as->buf, STAMP_LEN); /* the same moment: no clock read, no formatting */
    else
        put_stamp(l->buf);
    l->len = STAMP_LEN;
    memcpy(l->buf + l->len, ev, sizeof(ev) - 1);
    l->len += sizeof(ev) - 1;
    escaped(l, event, strlen(event));
    close_quote(l);
}

int sb_log_copy_fields(sb_logline_t *dst, const sb_logline_t *src, size_t from)
{
    size_t n, limit = sizeof(dst->buf) - LINE_RESERVE;

    if (!src->enabled || src->truncated || from > src->len || !dst->enabled || dst->truncated)
        return 0;
    n = src->len - from;
    if (dst->len > limit || n > limit - dst->len)
        return 0;
    memcpy(dst->buf + dst->len, src->buf + from, n);
    dst->len += n;
    return 1;
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
    look_at_stderr();
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
    look_at_stderr();
    return SB_OK;
}

const char *sb_log_file(void)
{
    return log_path != NULL ? log_path : "stderr";
}
