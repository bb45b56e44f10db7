/*
 * One-pass strict JSON decoder (RFC 8259) into a msgpack_object tree (see
 * sb_json_parse in sb/value.h for the rules).
 *
 * Recursive descent over an sb_reader_t; recursion is bounded by
 * SB_MAX_DEPTH. A container's size is known only at its end, so its values
 * are kept on a scratch stack (elements; or key, value, key, value...) and
 * copied into one zone array when it closes; nested containers push above
 * their parent's pending values and pop back when they close. Every value is
 * counted against SB_MAX_NODES, and every container against SB_MAX_DEPTH,
 * before anything is parsed or allocated for it, so neither the stack (at
 * most two entries per value) nor the zone (one object per value, plus the
 * unescaped copies of strings, which are never longer than their text) can
 * grow past what the caps and the input's length allow.
 */
#include <errno.h>
#include <float.h>
#include <locale.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "sb/buf.h"
#include "sb/limits.h"
#include "sb/mem.h"
#include "sb/value.h"
#include "scan.h"

/* scratch entries kept in the parser itself before the stack moves to the heap */
#define SCRATCH_SMALL 64
/* objects with up to this many keys are checked for duplicates pairwise, larger ones by sorting */
#define DUP_PAIRWISE_MAX 16
/* a number token up to this long is converted from a copy on the C stack */
#define NUMBER_SMALL 64

static const char WHY_SYNTAX[] = "invalid JSON";
static const char WHY_NUMBER[] = "invalid JSON number";
static const char WHY_INT_RANGE[] = "JSON integer out of range";
static const char WHY_REAL_RANGE[] = "JSON number out of range";
static const char WHY_UNTERMINATED[] = "unterminated JSON string";
static const char WHY_CONTROL[] = "control character in a JSON string";
static const char WHY_UTF8[] = "invalid UTF-8 in a JSON string";
static const char WHY_ESCAPE[] = "invalid JSON string escape";
static const char WHY_SURROGATE[] = "unpaired UTF-16 surrogate escape in a JSON string";
static const char WHY_KEY_NUL[] = "NUL in a JSON object key";
static const char WHY_DUP[] = "duplicate JSON object key";
static const char WHY_TRAILING[] = "trailing bytes after the JSON value";
static const char WHY_DEPTH[] = "value nesting is too deep";
static const char WHY_NODES[] = "value has too many nodes";
static const char WHY_NOMEM[] = "out of memory";

_Static_assert(sizeof(msgpack_object_kv) == 2 * sizeof(msgpack_object), "a map's pairs are two objects each, back to back");
_Static_assert(2ull * SB_MAX_NODES < UINT32_MAX, "container sizes fit msgpack's uint32 sizes");

typedef struct st_parser_t {
    sb_reader_t r;
    msgpack_zone *zone;
    size_t nodes;
    msgpack_object *stack; /* small, or a heap block (sb/mem.h) */
    size_t top, alloc;
    const char *why;
    msgpack_object small[SCRATCH_SMALL];
} parser_t;

static sb_status_t fail(parser_t *ps, sb_status_t st, const char *why)
{
    ps->why = why;
    return st;
}

/* consumes n bytes the caller has already seen through sb_reader_rest (so it cannot run out) */
static inline void advance(parser_t *ps, size_t n)
{
    if (sb_reader_skip(&ps->r, n) != SB_OK)
        ps->why = WHY_SYNTAX;
}

/* RFC 8259 section 2: ws = *( %x20 / %x09 / %x0A / %x0D ) */
static inline void skip_ws(parser_t *ps)
{
    sb_view_t v = sb_reader_rest(&ps->r);
    size_t i = 0;

    while (i < v.len && (v.base[i] == ' ' || v.base[i] == '\n' || v.base[i] == '\r' || v.base[i] == '\t'))
        ++i;
    if (i != 0)
        advance(ps, i);
}

static inline int is_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

static sb_status_t push(parser_t *ps, const msgpack_object *o)
{
    if (ps->top == ps->alloc) {
        size_t na = ps->alloc * 2;
        msgpack_object *ns;
        if (ps->stack == ps->small) {
            if ((ns = sb_mem_try_alloc_array(na, sizeof(*ns))) != NULL)
                memcpy(ns, ps->small, ps->top * sizeof(*ns));
        } else {
            ns = sb_mem_try_realloc_array(ps->stack, na, sizeof(*ns));
        }
        if (ns == NULL)
            return fail(ps, SB_E_NOMEM, WHY_NOMEM);
        ps->stack = ns;
        ps->alloc = na;
    }
    ps->stack[ps->top++] = *o;
    return SB_OK;
}

/* ---- strings -------------------------------------------------------------------------------------------------------- */

static int hex4(const uint8_t *p, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
        uint8_t c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return 0;
    }
    *out = v;
    return 1;
}

static size_t put_utf8(uint8_t *d, uint32_t cp)
{
    if (cp < 0x80) {
        d[0] = (uint8_t)cp;
        return 1;
    } else if (cp < 0x800) {
        d[0] = (uint8_t)(0xc0 | cp >> 6);
        d[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    } else if (cp < 0x10000) {
        d[0] = (uint8_t)(0xe0 | cp >> 12);
        d[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        d[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    d[0] = (uint8_t)(0xf0 | cp >> 18);
    d[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    d[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    d[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/*
 * The string whose escapes start at s[i] (s[0] is the opening quote and
 * s[1..i) is already checked): find the closing quote, copy the unescaped
 * text into the zone, checking the rest as it goes (RFC 8259 section 7).
 */
static sb_status_t string_with_escapes(parser_t *ps, sb_view_t s, size_t i, int is_key, msgpack_object *out)
{
    size_t end = i, o;
    uint8_t *d;

    /* the closing quote is the first '"' not taken by a backslash */
    while (end < s.len && s.base[end] != '"')
        end += s.base[end] == '\\' ? 2 : 1;
    if (end >= s.len)
        return fail(ps, SB_E_BAD_ARGS, WHY_UNTERMINATED);
    /* unescaping never lengthens: the text between the quotes bounds the copy */
    if ((d = msgpack_zone_malloc_no_align(ps->zone, end - 1)) == NULL)
        return fail(ps, SB_E_NOMEM, WHY_NOMEM);
    o = i - 1;
    memcpy(d, s.base + 1, o);
    while (i < end) {
        uint8_t c = s.base[i];
        if (c == '\\') {
            uint32_t cp, lo;
            /* a backslash before `end` always has its escaped byte before `end` too */
            switch (s.base[i + 1]) {
            case '"':
            case '\\':
            case '/':
                d[o++] = s.base[i + 1];
                break;
            case 'b':
                d[o++] = '\b';
                break;
            case 'f':
                d[o++] = '\f';
                break;
            case 'n':
                d[o++] = '\n';
                break;
            case 'r':
                d[o++] = '\r';
                break;
            case 't':
                d[o++] = '\t';
                break;
            case 'u':
                if (end - i < 6 || !hex4(s.base + i + 2, &cp))
                    return fail(ps, SB_E_BAD_ARGS, WHY_ESCAPE);
                if (cp >= 0xdc00 && cp <= 0xdfff)
                    return fail(ps, SB_E_BAD_ARGS, WHY_SURROGATE);
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    /* RFC 8259 section 7: a high surrogate escape must be followed by a low one */
                    if (end - i < 12 || s.base[i + 6] != '\\' || s.base[i + 7] != 'u' || !hex4(s.base + i + 8, &lo) ||
                        lo < 0xdc00 || lo > 0xdfff)
                        return fail(ps, SB_E_BAD_ARGS, WHY_SURROGATE);
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    i += 6;
                }
                if (cp == 0 && is_key)
                    return fail(ps, SB_E_BAD_ARGS, WHY_KEY_NUL);
                o += put_utf8(d + o, cp);
                i += 4;
                break;
            default:
                return fail(ps, SB_E_BAD_ARGS, WHY_ESCAPE);
            }
            i += 2;
        } else if (c < 0x20) {
            return fail(ps, SB_E_BAD_ARGS, WHY_CONTROL);
        } else if (c < 0x80) {
            d[o++] = c;
            ++i;
        } else {
            size_t k = sb__utf8_seq(s.base + i, end - i);
            if (k == 0)
                return fail(ps, SB_E_BAD_ARGS, WHY_UTF8);
            memcpy(d + o, s.base + i, k);
            o += k;
            i += k;
        }
    }
    advance(ps, end + 1);
    out->type = MSGPACK_OBJECT_STR;
    out->via.str.ptr = (const char *)d;
    out->via.str.size = (uint32_t)o;
    return SB_OK;
}

static sb_status_t parse_string(parser_t *ps, int is_key, msgpack_object *out)
{
    sb_view_t s = sb_reader_rest(&ps->r); /* s.base[0] is the opening quote */
    size_t i = 1;

    /* the common case, a string without escapes, is checked in place and not copied */
    for (;;) {
        uint8_t c;
        size_t k;
        if (s.len - i >= 8 && sb__json_plain8(sb__load8(s.base + i))) {
            i += 8;
            continue;
        }
        if (i >= s.len)
            return fail(ps, SB_E_BAD_ARGS, WHY_UNTERMINATED);
        c = s.base[i];
        if (c == '"')
            break;
        if (c == '\\')
            return string_with_escapes(ps, s, i, is_key, out);
        if (c < 0x20)
            return fail(ps, SB_E_BAD_ARGS, WHY_CONTROL);
        if (c < 0x80) {
            ++i;
            continue;
        }
        if ((k = sb__utf8_seq(s.base + i, s.len - i)) == 0)
            return fail(ps, SB_E_BAD_ARGS, WHY_UTF8);
        i += k;
    }
    advance(ps, i + 1);
    out->type = MSGPACK_OBJECT_STR;
    out->via.str.ptr = (const char *)s.base + 1;
    out->via.str.size = (uint32_t)(i - 1);
    return SB_OK;
}

/* ---- numbers -------------------------------------------------------------------------------------------------------- */

/*
 * strtod and snprintf read the decimal point from LC_NUMERIC; JSON's is
 * always '.', whatever locale the process runs in. One "C" locale object,
 * made once, is used for both (strtod_l here, uselocale in json_write.c).
 */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void c_locale_init(void)
{
    c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
}

locale_t sb__c_locale(void)
{
    pthread_once(&c_locale_once, c_locale_init);
    return c_locale;
}

static const double pow10_exact[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                     1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/*
 * The token (already checked against the grammar) as a double, rounded
 * correctly. Clinger's fast path: when the digits form an integer m <= 2^53
 * and the decimal exponent e has |e| <= 22, m and 10^|e| are both exact
 * doubles, so the one multiplication or division rounds correctly (this
 * needs FLT_EVAL_METHOD 0, i.e. no extended-precision intermediates). Anything
 * else goes to strtod_l, which glibc rounds correctly.
 */
static sb_status_t to_double(parser_t *ps, const uint8_t *tok, size_t len, double *out)
{
    char small[NUMBER_SMALL + 1], *copy = small;
    int neg = tok[0] == '-';
    locale_t loc;
    double d;

#if FLT_EVAL_METHOD == 0
    {
        uint64_t m = 0;
        int digits = 0, frac = 0, exp = 0, exp_neg = 0, in_frac = 0, exact = 1;
        size_t i = (size_t)neg;
        for (; i < len; ++i) {
            uint8_t c = tok[i];
            if (c == '.') {
                in_frac = 1;
            } else if (is_digit(c)) {
                if (m != 0 || c != '0')
                    ++digits;
                if (digits > 19) {
                    exact = 0;
                    break;
                }
                m = m * 10 + (uint64_t)(c - '0');
                frac += in_frac;
            } else {
                break; /* 'e' or 'E' */
            }
        }
        if (exact && i < len) {
            ++i;
            if (tok[i] == '-' || tok[i] == '+')
                exp_neg = tok[i++] == '-';
            for (; i < len && exact; ++i) {
                exp = exp * 10 + (tok[i] - '0');
                if (exp > 400)
                    exact = 0;
            }
        }
        if (exact) {
            int e = (exp_neg ? -exp : exp) - frac;
            if (m <= (1ull << 53) && e >= -22 && e <= 22) {
                d = (double)m;
                d = e < 0 ? d / pow10_exact[-e] : d * pow10_exact[e];
                *out = neg ? -d : d;
                return SB_OK;
            }
        }
    }
#endif
    if (len > NUMBER_SMALL && (copy = sb_mem_try_alloc(len + 1)) == NULL)
        return fail(ps, SB_E_NOMEM, WHY_NOMEM);
    memcpy(copy, tok, len);
    copy[len] = '\0';
    errno = 0;
    loc = sb__c_locale();
    d = loc != (locale_t)0 ? strtod_l(copy, NULL, loc) : strtod(copy, NULL);
    if (copy != small)
        sb_mem_free(copy);
    /* overflow is refused (as jansson did: "real number overflow"); underflow gives 0 or a subnormal */
    if (errno == ERANGE && (d > DBL_MAX || d < -DBL_MAX))
        return fail(ps, SB_E_BAD_ARGS, WHY_REAL_RANGE);
    *out = d;
    return SB_OK;
}

/* RFC 8259 section 6: number = [ minus ] int [ frac ] [ exp ] */
static sb_status_t parse_number(parser_t *ps, msgpack_object *out)
{
    sb_view_t s = sb_reader_rest(&ps->r);
    size_t i = 0, int_start, int_end;
    int neg = 0, integral = 1;
    sb_status_t st;

    if (s.base[0] == '-')
        neg = 1, ++i;
    int_start = i;
    if (i >= s.len || !is_digit(s.base[i]))
        return fail(ps, SB_E_BAD_ARGS, WHY_NUMBER);
    if (s.base[i] == '0') {
        ++i;
        if (i < s.len && is_digit(s.base[i]))
            return fail(ps, SB_E_BAD_ARGS, WHY_NUMBER); /* no leading zeros */
    } else {
        while (i < s.len && is_digit(s.base[i]))
            ++i;
    }
    int_end = i;
    if (i < s.len && s.base[i] == '.') {
        integral = 0;
        if (++i >= s.len || !is_digit(s.base[i]))
            return fail(ps, SB_E_BAD_ARGS, WHY_NUMBER);
        while (i < s.len && is_digit(s.base[i]))
            ++i;
    }
    if (i < s.len && (s.base[i] == 'e' || s.base[i] == 'E')) {
        integral = 0;
        if (++i < s.len && (s.base[i] == '+' || s.base[i] == '-'))
            ++i;
        if (i >= s.len || !is_digit(s.base[i]))
            return fail(ps, SB_E_BAD_ARGS, WHY_NUMBER);
        while (i < s.len && is_digit(s.base[i]))
            ++i;
    }
    if (integral) {
        /* int64, as jansson's json_int_t: 0..INT64_MAX positive, down to INT64_MIN negative */
        uint64_t m = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        for (size_t k = int_start; k < int_end; ++k) {
            uint64_t dg = (uint64_t)(s.base[k] - '0');
            if (m > (limit - dg) / 10)
                return fail(ps, SB_E_BAD_ARGS, WHY_INT_RANGE);
            m = m * 10 + dg;
        }
        if (neg && m != 0) {
            out->type = MSGPACK_OBJECT_NEGATIVE_INTEGER;
            out->via.i64 = m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m;
        } else {
            out->type = MSGPACK_OBJECT_POSITIVE_INTEGER;
            out->via.u64 = m;
        }
    } else {
        out->type = MSGPACK_OBJECT_FLOAT64;
        if ((st = to_double(ps, s.base, i, &out->via.f64)) != SB_OK)
            return st;
    }
    advance(ps, i);
    return SB_OK;
}

/* ---- containers ----------------------------------------------------------------------------------------------------- */

static sb_status_t parse_value(parser_t *ps, unsigned depth, msgpack_object *out);

typedef struct st_keyref_t {
    const char *p;
    uint32_t len;
} keyref_t;

static int keyref_cmp(const void *a, const void *b)
{
    const keyref_t *x = a, *y = b;
    int r;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    r = x->len != 0 ? memcmp(x->p, y->p, x->len) : 0;
    return r;
}

static int key_eq(const msgpack_object *a, const msgpack_object *b)
{
    return a->via.str.size == b->via.str.size &&
           (a->via.str.size == 0 || memcmp(a->via.str.ptr, b->via.str.ptr, a->via.str.size) == 0);
}

/* the n keys at stack[base], stack[base + 2], ...: SB_OK when no two are equal */
static sb_status_t check_dup_keys(parser_t *ps, size_t base, size_t n)
{
    const msgpack_object *kv = ps->stack + base;
    keyref_t *keys;
    sb_status_t st = SB_OK;

    if (n <= DUP_PAIRWISE_MAX) {
        for (size_t i = 1; i < n; ++i)
            for (size_t j = 0; j < i; ++j)
                if (key_eq(&kv[2 * i], &kv[2 * j]))
                    return fail(ps, SB_E_BAD_ARGS, WHY_DUP);
        return SB_OK;
    }
    /* sorting keeps the worst case at n log n whatever keys a guest chooses (no hash to flood) */
    if ((keys = sb_mem_try_alloc_array(n, sizeof(*keys))) == NULL)
        return fail(ps, SB_E_NOMEM, WHY_NOMEM);
    for (size_t i = 0; i < n; ++i) {
        keys[i].p = kv[2 * i].via.str.ptr;
        keys[i].len = kv[2 * i].via.str.size;
    }
    qsort(keys, n, sizeof(*keys), keyref_cmp);
    for (size_t i = 1; i < n; ++i) {
        if (keyref_cmp(&keys[i - 1], &keys[i]) == 0) {
            st = fail(ps, SB_E_BAD_ARGS, WHY_DUP);
            break;
        }
    }
    sb_mem_free(keys);
    return st;
}

/* pops the `count` objects above `base` into one zone array */
static sb_status_t close_container(parser_t *ps, size_t base, void **ptr)
{
    size_t bytes = (ps->top - base) * sizeof(msgpack_object);

    if ((*ptr = msgpack_zone_malloc(ps->zone, bytes)) == NULL)
        return fail(ps, SB_E_NOMEM, WHY_NOMEM);
    if (bytes != 0)
        memcpy(*ptr, ps->stack + base, bytes);
    ps->top = base;
    return SB_OK;
}

static sb_status_t parse_array(parser_t *ps, unsigned depth, msgpack_object *out)
{
    size_t base = ps->top;
    uint8_t c;
    void *ptr;
    sb_status_t st;

    advance(ps, 1); /* '[' */
    skip_ws(ps);
    if (sb_reader_peek(&ps->r, &c) == SB_OK && c == ']') {
        advance(ps, 1);
    } else {
        for (;;) {
            msgpack_object v;
            if ((st = parse_value(ps, depth + 1, &v)) != SB_OK || (st = push(ps, &v)) != SB_OK)
                return st;
            skip_ws(ps);
            if (sb_reader_u8(&ps->r, &c) != SB_OK)
                return fail(ps, SB_E_BAD_ARGS, WHY_SYNTAX);
            if (c == ']')
                break;
            if (c != ',')
                return fail(ps, SB_E_BAD_ARGS, WHY_SYNTAX);
            skip_ws(ps);
        }
    }
    out->type = MSGPACK_OBJECT_ARRAY;
    out->via.array.size = (uint32_t)(ps->top - base);
    if ((st = close_container(ps, base, &ptr)) != SB_OK)
        return st;
    out->via.array.ptr = ptr;
    return SB_OK;
}

static sb_status_t parse_object(parser_t *ps, unsigned depth, msgpack_object *out)
{
    size_t base = ps->top, n;
    uint8_t c;
    void *ptr;
    sb_status_t st;

    advance(ps, 1); /* '{' */
    skip_ws(ps);
    if (sb_reader_peek(&ps->r, &c) == SB_OK && c == '}') {
        advance(ps, 1);
    } else {
        for (;;) {
            msgpack_object k, v;
            if (sb_reader_peek(&ps->r, &c) != SB_OK || c != '"')
                return fail(ps, SB_E_BAD_ARGS, WHY_SYNTAX);
            if ((st = parse_string(ps, 1, &k)) != SB_OK)
                return st;
            skip_ws(ps);
            if (sb_reader_u8(&ps->r, &c) != SB_OK || c != ':')
                return fail(ps, SB_E_BAD_ARGS, WHY_SYNTAX);
            skip_ws(ps);
            if ((st = parse_value(ps, depth + 1, &v)) != SB_OK || (st = push(ps, &k)) != SB_OK || (st = push(ps, &v)) != SB_OK)
                return st;
            skip_ws(ps);
            if (sb_reader_u8(&ps->r, &c) != SB_OK)
                return fail(ps, SB_E_BAD_ARGS, WHY_SYNTAX);
            if (c == '}')
                break;
            if (c != ',')
                return fail(ps, SB_E_BAD_ARGS, WHY_SYNTAX);
            skip_ws(ps);
        }
    }
    n = (ps->top - base) / 2;
    if (n > 1 && (st = check_dup_keys(ps, base, n)) != SB_OK)
        return st;
    out->type = MSGPACK_OBJECT_MAP;
    out->via.map.size = (uint32_t)n;
    if ((st = close_container(ps, base, &ptr)) != SB_OK)
        return st;
    out->via.map.ptr = ptr;
    return SB_OK;
}

static sb_status_t parse_value(parser_t *ps, unsigned depth, msgpack_object *out)
{
    uint8_t c;

    /* the caps come first: nothing is parsed or allocated for a value over them */
    if (++ps->nodes > SB_MAX_NODES)
        return fail(ps, SB_E_TOO_LARGE, WHY_NODES);
    if (sb_reader_peek(&ps->r, &c) != SB_OK)
        return fail(ps, SB_E_BAD_ARGS, WHY_SYNTAX);
    switch (c) {
    case '{':
    case '[':
        /* the same bound as sb_mp_check (and msgpack-c's unpack stack): SB_MAX_DEPTH - 1 nested containers */
        if (depth + 1 >= SB_MAX_DEPTH)
            return fail(ps, SB_E_TOO_LARGE, WHY_DEPTH);
        return c == '{' ? parse_object(ps, depth, out) : parse_array(ps, depth, out);
    case '"':
        return parse_string(ps, 0, out);
    case 't':
        if (!sb_reader_expect(&ps->r, "true", 4))
            return fail(ps, SB_E_BAD_ARGS, WHY_SYNTAX);
        out->type = MSGPACK_OBJECT_BOOLEAN;
        out->via.boolean = true;
        return SB_OK;
    case 'f':
        if (!sb_reader_expect(&ps->r, "false", 5))
            return fail(ps, SB_E_BAD_ARGS, WHY_SYNTAX);
        out->type = MSGPACK_OBJECT_BOOLEAN;
        out->via.boolean = false;
        return SB_OK;
    case 'n':
        if (!sb_reader_expect(&ps->r, "null", 4))
            return fail(ps, SB_E_BAD_ARGS, WHY_SYNTAX);
        out->type = MSGPACK_OBJECT_NIL;
        return SB_OK;
    default:
        if (c == '-' || is_digit(c))
            return parse_number(ps, out);
        return fail(ps, SB_E_BAD_ARGS, WHY_SYNTAX);
    }
}

sb_status_t sb_json_parse(const char *text, size_t len, msgpack_zone *zone, msgpack_object *out, const char **why)
{
    parser_t ps;
    msgpack_object root;
    sb_status_t st;

    sb_reader_init(&ps.r, text, len);
    ps.zone = zone;
    ps.nodes = 0;
    ps.stack = ps.small;
    ps.top = 0;
    ps.alloc = SCRATCH_SMALL;
    ps.why = WHY_SYNTAX;

    skip_ws(&ps);
    if ((st = parse_value(&ps, 0, &root)) == SB_OK) {
        skip_ws(&ps);
        if (sb_reader_remaining(&ps.r) != 0)
            st = fail(&ps, SB_E_BAD_ARGS, WHY_TRAILING);
    }
    if (ps.stack != ps.small)
        sb_mem_free(ps.stack);
    if (st != SB_OK) {
        if (why != NULL)
            *why = ps.why;
        return st;
    }
    *out = root;
    return SB_OK;
}
