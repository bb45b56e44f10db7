/*
 * libFuzzer driver for broker/obs/log.c, the escaping path every log and audit line goes through: field
 * values are arbitrary bytes (a guest's method, path, key or reason text reaches them as it came).
 *
 * Input: byte 0 picks the line kind: bits 0-1 the level (debug lines are below the default level and
 * must write nothing), bit 2 an audit-style line (sb_log_begin_always: no "level" key). Then fields,
 * each [type][len lo][len hi][bytes...]: type bit 0 clear is a string of min(len, rest) bytes, set is
 * an integer of the next 8 bytes; at most 64 fields, keyed "f0", "f1", ...
 *
 * Properties (the line is captured from fd 2):
 *  - a disabled line writes nothing; any other writes exactly one line, '\n'-terminated, of at most
 *    SB_LOGLINE_MAX bytes, with no raw C0 control or DEL byte;
 *  - the line is well-formed UTF-8 (checked here against RFC 3629 table of well-formed sequences,
 *    Unicode 15.0 table 3-7) and parses as exactly one JSON object with no duplicate key;
 *  - its keys are exactly "ts", "level" (log lines only), "event", then "f0".."f(k-1)" for some k, and
 *    "truncated" (true) when k is short of the number of fields or the last value was cut;
 *  - every string value but a cut last one equals the input with each maximal ill-formed subpart
 *    replaced by U+FFFD (a reference replacement written from table 3-7, not from log.c); a cut one is
 *    a prefix of that; integers come back equal;
 *  - a line whose fields surely fit (every byte escaped to 6, plus the keys) is never truncated.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>
#include "obs/log.h"
#include "fuzz.h"

#define MAX_FIELDS 64

/* Unicode 15.0 table 3-7: the well-formed UTF-8 byte sequences, as byte ranges */
static const struct {
    uint8_t n, lo[4], hi[4];
} wellformed[] = {
    {1, {0x00}, {0x7f}},
    {2, {0xc2, 0x80}, {0xdf, 0xbf}},
    {3, {0xe0, 0xa0, 0x80}, {0xe0, 0xbf, 0xbf}},
    {3, {0xe1, 0x80, 0x80}, {0xec, 0xbf, 0xbf}},
    {3, {0xed, 0x80, 0x80}, {0xed, 0x9f, 0xbf}},
    {3, {0xee, 0x80, 0x80}, {0xef, 0xbf, 0xbf}},
    {4, {0xf0, 0x90, 0x80, 0x80}, {0xf0, 0xbf, 0xbf, 0xbf}},
    {4, {0xf1, 0x80, 0x80, 0x80}, {0xf3, 0xbf, 0xbf, 0xbf}},
    {4, {0xf4, 0x80, 0x80, 0x80}, {0xf4, 0x8f, 0xbf, 0xbf}},
};

/* the unit at s[0]: its length, and whether it is a well-formed sequence or a maximal ill-formed subpart */
static size_t ref_unit(const uint8_t *s, size_t n, int *valid)
{
    for (size_t r = 0; r < sizeof(wellformed) / sizeof(wellformed[0]); ++r) {
        size_t m = 0;
        if (s[0] < wellformed[r].lo[0] || s[0] > wellformed[r].hi[0])
            continue;
        while (m < wellformed[r].n && m < n && s[m] >= wellformed[r].lo[m] && s[m] <= wellformed[r].hi[m])
            ++m;
        *valid = m == wellformed[r].n;
        return m;
    }
    *valid = 0;
    return 1;
}

static int ref_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        int valid;
        i += ref_unit(s + i, n - i, &valid);
        if (!valid)
            return 0;
    }
    return 1;
}

/* the input with every maximal ill-formed subpart replaced by U+FFFD; out holds 3 * n bytes */
static size_t ref_replace(const uint8_t *s, size_t n, uint8_t *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        int valid;
        size_t k = ref_unit(s + i, n - i, &valid);
        if (valid) {
            memcpy(out + o, s + i, k);
            o += k;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
        }
        i += k;
    }
    return o;
}

typedef struct st_field_t {
    int is_int;
    const uint8_t *p;
    size_t len;
    long long v;
} field_t;

static int pipe_r = -1, pipe_w = -1;
static uint8_t line[4 * SB_LOGLINE_MAX];
static uint8_t want[3 * 65536];

/* the bytes written to fd 2 while `l` is ended */
static size_t capture_end(sb_logline_t *l)
{
    int saved = dup(2);
    ssize_t r;
    size_t n = 0;

    if (pipe_r < 0) {
        int fds[2];
        if (pipe(fds) != 0 || fcntl(fds[0], F_SETFL, O_NONBLOCK) != 0)
            abort();
        pipe_r = fds[0], pipe_w = fds[1];
    }
    if (saved < 0 || dup2(pipe_w, 2) < 0)
        abort();
    sb_log_end(l);
    dup2(saved, 2);
    close(saved);
    while ((r = read(pipe_r, line + n, sizeof(line) - n)) > 0)
        n += (size_t)r;
    SB_FUZZ_ASSERT(r < 0 && errno == EAGAIN, "reading the captured line failed");
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    field_t f[MAX_FIELDS];
    size_t nf = 0, off = 1, n, bound = 0;
    int level, audit, truncated;
    sb_logline_t l;
    json_t *o;
    json_error_t jerr;
    char key[16];

    if (size == 0)
        return 0;
    level = data[0] & 3;
    audit = (data[0] >> 2) & 1;
    while (off < size && nf < MAX_FIELDS) {
        uint8_t type = data[off++];
        if (type & 1) {
            uint64_t v = 0;
            for (int i = 0; i < 8 && off < size; ++i)
                v = (v << 8) | data[off++];
            f[nf].is_int = 1, f[nf].v = (long long)v, f[nf].p = NULL, f[nf].len = 0;
        } else {
            size_t len = 0;
            if (off < size)
                len = data[off++];
            if (off < size)
                len |= (size_t)data[off++] << 8;
            if (len > size - off)
                len = size - off;
            f[nf].is_int = 0, f[nf].p = data + off, f[nf].len = len;
            off += len;
        }
        ++nf;
    }

    if (audit)
        sb_log_begin_always(&l, "fuzz.audit");
    else
        sb_log_begin(&l, (sb_log_level_t)level, "fuzz.line");
    for (size_t i = 0; i < nf; ++i) {
        snprintf(key, sizeof(key), "f%zu", i);
        if (f[i].is_int)
            sb_log__int(&l, key, strlen(key), f[i].v);
        else
            sb_log__str(&l, key, strlen(key), (const char *)f[i].p, f[i].len);
        bound += 8 + strlen(key) + (f[i].is_int ? 20 : 6 * f[i].len);
    }
    n = capture_end(&l);

    if (!audit && level == SB_LOG_DEBUG) {
        SB_FUZZ_ASSERT(n == 0, "a debug line below the level wrote %zu bytes", n);
        return 0;
    }
    SB_FUZZ_ASSERT(n > 0 && n <= SB_LOGLINE_MAX, "line of %zu bytes", n);
    SB_FUZZ_ASSERT(line[n - 1] == '\n' && memchr(line, '\n', n - 1) == NULL, "not exactly one line");
    for (size_t i = 0; i < n - 1; ++i)
        SB_FUZZ_ASSERT(line[i] >= 0x20 && line[i] != 0x7f, "raw control byte 0x%02x at %zu", line[i], i);
    SB_FUZZ_ASSERT(ref_valid(line, n), "the line is not well-formed UTF-8: %.*s", (int)n, (const char *)line);
    o = json_loadb((const char *)line, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    SB_FUZZ_ASSERT(json_is_object(o), "not one JSON object (%s at %d): %.*s", jerr.text, jerr.position, (int)n, (const char *)line);

    truncated = json_object_get(o, "truncated") != NULL;
    SB_FUZZ_ASSERT(!truncated || json_is_true(json_object_get(o, "truncated")), "truncated is not true");
    SB_FUZZ_ASSERT(json_is_string(json_object_get(o, "ts")) && json_is_string(json_object_get(o, "event")), "ts or event missing");
    SB_FUZZ_ASSERT(audit ? json_object_get(o, "level") == NULL : json_is_string(json_object_get(o, "level")), "level key");
    {
        size_t k = 0, keys = json_object_size(o);
        while (k < nf) {
            snprintf(key, sizeof(key), "f%u", (unsigned)k); /* k < nf, a handful of fields */
            if (json_object_get(o, key) == NULL)
                break;
            ++k;
        }
        SB_FUZZ_ASSERT(keys == (audit ? 2u : 3u) + k + (size_t)truncated, "%zu keys for %zu fields present of %zu", keys, k, nf);
        SB_FUZZ_ASSERT(k == nf || truncated, "field f%zu missing on a line not marked truncated", k);
        SB_FUZZ_ASSERT(!truncated || bound + 200 > SB_LOGLINE_MAX - 64, "truncated although %zu bytes surely fit", bound);
        for (size_t i = 0; i < k; ++i) {
            json_t *v;
            snprintf(key, sizeof(key), "f%zu", i);
            v = json_object_get(o, key);
            if (f[i].is_int) {
                SB_FUZZ_ASSERT(json_is_integer(v) && json_integer_value(v) == f[i].v, "integer f%zu", i);
            } else {
                size_t wn = ref_replace(f[i].p, f[i].len, want), got;
                SB_FUZZ_ASSERT(json_is_string(v), "f%zu is not a string", i);
                got = json_string_length(v);
                if (truncated && i == k - 1)
                    SB_FUZZ_ASSERT(got <= wn && memcmp(json_string_value(v), want, got) == 0, "cut f%zu is not a prefix", i);
                else
                    SB_FUZZ_ASSERT(got == wn && memcmp(json_string_value(v), want, wn) == 0,
                                   "f%zu differs from the reference replacement (%zu bytes, want %zu)", i, got, wn);
            }
        }
    }
    json_decref(o);
    return 0;
}
