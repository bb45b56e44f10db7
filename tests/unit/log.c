/*
 * Unit tests for broker/obs/log.c, its escaping path: whatever bytes a field carries, every log and
 * audit line is one JSON object (RFC 8259) of well-formed UTF-8 (RFC 3629): ill-formed subparts become
 * U+FFFD, controls are escaped, and a line cut at SB_LOGLINE_MAX is cut between characters, with its
 * string closed and "truncated":true.
 *
 * Lines go to stderr (and the audit stream to "stderr"), so each check captures fd 2 through a pipe.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>
#include "tap.h"
#include "obs/audit.h"
#include "obs/log.h"

#define S(s) s, sizeof(s) - 1
#define FFFD "\xef\xbf\xbd"

static int cap_pipe[2] = {-1, -1}, saved_stderr = -1;
static char captured[65536];
static size_t captured_len;

static void capture_begin(void)
{
    fflush(stderr);
    if (pipe(cap_pipe) != 0 || (saved_stderr = dup(2)) < 0 || dup2(cap_pipe[1], 2) < 0)
        abort();
}

static void capture_end(void)
{
    ssize_t r;
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    close(cap_pipe[1]);
    captured_len = 0;
    while ((r = read(cap_pipe[0], captured + captured_len, sizeof(captured) - 1 - captured_len)) > 0)
        captured_len += (size_t)r;
    captured[captured_len] = '\0';
    close(cap_pipe[0]);
}

/* an independent RFC 3629 check: decode every scalar value and test its range */
static int utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned cp, need, k;
        if (s[i] < 0x80) {
            ++i;
            continue;
        }
        if ((s[i] & 0xe0) == 0xc0)
            cp = s[i] & 0x1f, need = 1;
        else if ((s[i] & 0xf0) == 0xe0)
            cp = s[i] & 0x0f, need = 2;
        else if ((s[i] & 0xf8) == 0xf0)
            cp = s[i] & 0x07, need = 3;
        else
            return 0;
        for (k = 1; k <= need; ++k) {
            if (i + k >= n || (s[i + k] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((need == 1 && cp < 0x80) || (need == 2 && cp < 0x800) || (need == 3 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += need + 1;
    }
    return 1;
}

/* one captured line: valid UTF-8, one newline at its end, one JSON object; returns it or NULL */
static json_t *one_line(const char *what)
{
    json_error_t jerr;
    json_t *o;
    const char *nl = memchr(captured, '\n', captured_len);

    if (!ok(nl != NULL && (size_t)(nl - captured) == captured_len - 1, "%s: exactly one line", what))
        return NULL;
    if (!ok(utf8_valid((const unsigned char *)captured, captured_len), "%s: valid UTF-8", what))
        return NULL;
    ok(captured_len <= SB_LOGLINE_MAX, "%s: at most SB_LOGLINE_MAX bytes (%zu)", what, captured_len);
    o = json_loadb(captured, captured_len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (!ok(json_is_object(o), "%s: one JSON object", what)) {
        printf("#   %s at %d: %.300s\n", jerr.text, jerr.position, captured);
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *log_one(const char *key, const char *val, size_t len, const char *what)
{
    sb_logline_t l;
    capture_begin();
    sb_log_begin(&l, SB_LOG_ERROR, "test.line");
    sb_log__str(&l, key, strlen(key), val, len);
    sb_log_end(&l);
    capture_end();
    return one_line(what);
}

static int str_is(const json_t *v, const char *want, size_t want_len)
{
    return json_is_string(v) && json_string_length(v) == want_len && memcmp(json_string_value(v), want, want_len) == 0;
}

static void test_well_formed_passes(void)
{
    static const struct {
        const char *in;
        size_t len;
    } cases[] = {
        {S("plain ascii ~ !")},
        {S("\xc2\x80 U+0080, \xdf\xbf U+07FF")},
        {S("\xe0\xa0\x80 U+0800, \xed\x9f\xbf U+D7FF, \xee\x80\x80 U+E000, \xef\xbf\xbf U+FFFF")},
        {S("\xf0\x90\x80\x80 U+10000, \xf4\x8f\xbf\xbf U+10FFFF")},
        {S("\xf0\x9f\x98\x80 \xc3\xbcn\xc3\xaf"
           "c\xc3\xb6"
           "d\xc3\xa9")},
        {S(FFFD " an actual U+FFFD stays")},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        json_t *o = log_one("v", cases[i].in, cases[i].len, "well-formed");
        if (o != NULL) {
            ok(str_is(json_object_get(o, "v"), cases[i].in, cases[i].len), "well-formed case %zu comes back byte for byte", i);
            ok(json_object_get(o, "truncated") == NULL, "well-formed case %zu is not truncated", i);
        }
        json_decref(o);
    }
}

static void test_ill_formed_is_replaced(void)
{
    /* one U+FFFD per maximal ill-formed subpart (Unicode 15.0 section 3.9, table 3-8 and its neighbours) */
    static const struct {
        const char *in, *want;
        size_t in_len, want_len;
    } cases[] = {
#define C(in, want) {in, want, sizeof(in) - 1, sizeof(want) - 1}
        C("\xff", FFFD),
        C("a\x80z", "a" FFFD "z"),
        C("\xbf\xbf", FFFD FFFD),
        C("\xc0\xaf", FFFD FFFD),                                   /* overlong '/' */
        C("\xc1\xbf", FFFD FFFD),                                   /* overlong */
        C("\xe0\x80\xaf", FFFD FFFD FFFD),                          /* overlong, three bytes */
        C("\xf0\x80\x80\xaf", FFFD FFFD FFFD FFFD),                 /* overlong, four bytes */
        C("\xed\xa0\x80", FFFD FFFD FFFD),                          /* U+D800, a surrogate */
        C("\xed\xbf\xbf", FFFD FFFD FFFD),                          /* U+DFFF */
        C("\xf4\x90\x80\x80", FFFD FFFD FFFD FFFD),                 /* above U+10FFFF */
        C("\xf5\x80\x80\x80", FFFD FFFD FFFD FFFD),                 /* F5 is never a lead */
        C("\xe2\x82", FFFD),                                        /* cut at the end */
        C("\xe2\x82z", FFFD "z"),                                   /* cut before ASCII */
        C("\xf0\x9f\x98", FFFD),                                    /* a cut emoji */
        C("\xf0\x9f\x98\xf0\x9f\x98\x80", FFFD "\xf0\x9f\x98\x80"), /* a cut emoji, then a whole one */
        C("\xe1\x80\xe2\xf0\x91\x92\xf1\xbf\x41", FFFD FFFD FFFD FFFD "A"),
        C("\xc2\"", FFFD "\""), /* a cut sequence before an escape */
#undef C
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        json_t *o = log_one("v", cases[i].in, cases[i].in_len, "ill-formed");
        if (o != NULL) {
            json_t *v = json_object_get(o, "v");
            if (!ok(str_is(v, cases[i].want, cases[i].want_len), "ill-formed case %zu: one U+FFFD per maximal subpart", i))
                printf("#   got \"%s\"\n", json_is_string(v) ? json_string_value(v) : "(not a string)");
        }
        json_decref(o);
    }
}

static void test_controls_are_escaped(void)
{
    static const char in[] = "a\x00"
                             "b\x01\x1f\x7f\"\\\n\r\t/";
    json_t *o = log_one("v", in, sizeof(in) - 1, "controls");
    if (o != NULL)
        ok(str_is(json_object_get(o, "v"), in, sizeof(in) - 1), "NUL, C0, DEL, quote and backslash come back exactly");
    ok(memchr(captured, '\x7f', captured_len) == NULL && memchr(captured, '\x01', captured_len) == NULL,
       "no raw control byte on the line");
    json_decref(o);
    /* keys are escaped the same way */
    o = log_one("k\"\xff", S("v"), "odd key");
    if (o != NULL)
        ok(json_object_get(o, "k\"" FFFD) != NULL, "a key is escaped and replaced like a value");
    json_decref(o);
}

/* the string value of `key` is a prefix of `full`, cut between two characters */
static int is_char_prefix(const json_t *v, const char *full, size_t full_len, size_t unit)
{
    size_t n = json_is_string(v) ? json_string_length(v) : (size_t)-1;
    return n != (size_t)-1 && n <= full_len && n % unit == 0 && memcmp(json_string_value(v), full, n) == 0;
}

static void test_truncation(void)
{
    static const struct {
        const char *unit;
        size_t len;
    } units[] = {{S("x")}, {S("\xc3\xa9")}, {S("\xe2\x82\xac")}, {S("\xf0\x9f\x98\x80")}, {S("\x01")}, {S("\"")}};
    static char full[3 * SB_LOGLINE_MAX];

    for (size_t u = 0; u < sizeof(units) / sizeof(units[0]); ++u) {
        size_t n = 0;
        sb_logline_t l;
        json_t *o;
        while (n + units[u].len <= sizeof(full)) {
            memcpy(full + n, units[u].unit, units[u].len);
            n += units[u].len;
        }
        capture_begin();
        sb_log_begin(&l, SB_LOG_ERROR, "test.long");
        sb_log_str(&l, "a", S("first"));
        sb_log_str(&l, "long", full, n);
        sb_log_str(&l, "after", S("dropped"));
        sb_log_int(&l, "n", 42);
        sb_log_end(&l);
        capture_end();
        if ((o = one_line("truncated line")) == NULL)
            continue;
        ok(json_is_true(json_object_get(o, "truncated")), "unit %zu: truncated:true", u);
        ok(str_is(json_object_get(o, "a"), S("first")), "unit %zu: the field before is whole", u);
        ok(is_char_prefix(json_object_get(o, "long"), full, n, units[u].len), "unit %zu: the value is cut between characters", u);
        ok(json_object_get(o, "after") == NULL && json_object_get(o, "n") == NULL, "unit %zu: nothing after the cut", u);
        json_decref(o);
    }
}

/* every length around the end of the buffer: the line stays valid, whatever field meets the end */
static void test_every_cut_point(void)
{
    static char pad[SB_LOGLINE_MAX];
    int bad = 0, truncated = 0, checked = 0;

    memset(pad, 'p', sizeof(pad));
    for (size_t n = SB_LOGLINE_MAX - 140; n < SB_LOGLINE_MAX; ++n) {
        for (int tail = 0; tail < 3; ++tail) {
            sb_logline_t l;
            json_error_t jerr;
            json_t *o;
            capture_begin();
            sb_log_begin(&l, SB_LOG_ERROR, "test.cut");
            sb_log_str(&l, "pad", pad, n - (SB_LOGLINE_MAX - 140));
            sb_log_str(&l, "pad2", pad, SB_LOGLINE_MAX - 240);
            if (tail == 0)
                sb_log_int(&l, "number", -1234567890123LL);
            else if (tail == 1)
                sb_log_str(&l, "utf8", S("\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac"));
            else
                sb_log_str(&l, "esc", S("\x01\x02\x03\x04\x05\x06\x07\x08\x0b"));
            sb_log_end(&l);
            capture_end();
            ++checked;
            o = json_loadb(captured, captured_len, JSON_REJECT_DUPLICATES, &jerr);
            if (!json_is_object(o) || !utf8_valid((const unsigned char *)captured, captured_len) || captured_len > SB_LOGLINE_MAX ||
                captured[captured_len - 1] != '\n') {
                if (bad++ == 0)
                    printf("#   first bad line (pad %zu, tail %d): %s\n", n, tail, captured + captured_len - 80);
            } else if (json_object_get(o, "truncated") != NULL) {
                ++truncated;
                /* a number is never cut: present whole or absent */
                json_t *num = json_object_get(o, "number");
                if (num != NULL && json_integer_value(num) != -1234567890123LL)
                    ++bad;
            }
            json_decref(o);
        }
    }
    is_int(bad, 0, "every cut point of %d lines gives one valid JSON object of valid UTF-8", checked);
    ok(truncated > 0 && truncated < checked, "the sweep covers lines that fit and lines that do not (%d truncated)", truncated);
}

static void test_audit_lines(void)
{
    char err[256];
    sb_logline_t l;
    json_t *o;

    capture_begin();
    if (sb_audit_open("stderr", NULL, 0, err, sizeof(err)) != SB_OK)
        abort();
    sb_log_begin_always(&l, "rpc");
    sb_log_str(&l, "method", S("collections.\xff\xfe.find"));
    sb_log_str(&l, "reason", S("unknown field \"ab\xe2\x82\""));
    sb_log_end_audit(&l);
    sb_audit_close();
    capture_end();
    {
        /* the stream is the genesis, the line, and the shutdown checkpoint: keep the line */
        const char *a = memchr(captured, '\n', captured_len),
                   *b = a != NULL ? memchr(a + 1, '\n', captured_len - (size_t)(a + 1 - captured)) : NULL;
        ok(b != NULL && memchr(b + 1, '\n', captured_len - (size_t)(b + 1 - captured)) == captured + captured_len - 1,
           "audit: three records (genesis, the line, the checkpoint)");
        if (b == NULL)
            return;
        memmove(captured, a + 1, (size_t)(b + 1 - (a + 1)));
        captured_len = (size_t)(b + 1 - (a + 1));
    }
    if ((o = one_line("audit line")) != NULL) {
        ok(str_is(json_object_get(o, "method"), S("collections." FFFD FFFD ".find")), "audit: method replaced");
        ok(str_is(json_object_get(o, "reason"), S("unknown field \"ab" FFFD "\"")), "audit: a cut code point replaced");
    }
    json_decref(o);
}

/* one line's fields given to another: copied as written, or refused whole */
static void test_copy_fields(void)
{
    static char big[SB_LOGLINE_MAX];
    sb_logline_t src, dst;
    size_t from, before;
    json_t *o;

    sb_log_begin(&src, SB_LOG_ERROR, "rpc");
    from = src.len;
    sb_log_str(&src, "method", S("files.\xffread"));
    sb_log_int(&src, "us", 1234);
    capture_begin();
    sb_log_begin(&dst, SB_LOG_ERROR, "audit");
    is_int(sb_log_copy_fields(&dst, &src, from), 1, "copy: the fields of a whole line are taken");
    sb_log_cstr(&dst, "decision", "allow");
    sb_log_end(&dst);
    capture_end();
    if ((o = one_line("copied line")) != NULL) {
        ok(str_is(json_object_get(o, "event"), S("audit")), "copy: the line keeps its own event");
        ok(str_is(json_object_get(o, "method"), S("files." FFFD "read")), "copy: a string field as it was written");
        is_int(json_integer_value(json_object_get(o, "us")), 1234, "copy: a number as it was written");
        ok(str_is(json_object_get(o, "decision"), S("allow")), "copy: fields added after the copy follow it");
    }
    json_decref(o);

    /* a source cut short is never copied: its marker belongs to its own end */
    memset(big, 'a', sizeof(big));
    sb_log_str(&src, "big", big, sizeof(big));
    ok(src.truncated, "copy: the source was cut");
    sb_log_begin(&dst, SB_LOG_ERROR, "audit");
    before = dst.len;
    is_int(sb_log_copy_fields(&dst, &src, from), 0, "copy: a truncated source is refused");
    is_int((long long)dst.len, (long long)before, "copy: nothing was appended");

    /* a destination without room takes nothing (not a part of the fields) */
    sb_log_begin(&src, SB_LOG_ERROR, "rpc");
    from = src.len;
    sb_log_str(&src, "big", big, SB_LOGLINE_MAX / 2);
    sb_log_begin(&dst, SB_LOG_ERROR, "audit");
    sb_log_str(&dst, "other", big, SB_LOGLINE_MAX / 2);
    before = dst.len;
    ok(!src.truncated && !dst.truncated, "copy: both halves fit their own lines");
    is_int(sb_log_copy_fields(&dst, &src, from), 0, "copy: a destination without room refuses");
    is_int((long long)dst.len, (long long)before, "copy: and stays as it was");
    ok(!dst.truncated, "copy: a refusal does not mark the destination");

    /* an offset past the source's end is refused */
    is_int(sb_log_copy_fields(&dst, &src, src.len + 1), 0, "copy: an offset past the end is refused");
}

int main(void)
{
    test_well_formed_passes();
    test_ill_formed_is_replaced();
    test_controls_are_escaped();
    test_truncation();
    test_every_cut_point();
    test_audit_lines();
    test_copy_fields();
    return done_testing();
}
