/*
 * proto/ internal: byte classification shared by the UTF-8 validator, the
 * JSON string writer and the JSON decoder. Not installed, not for broker/.
 *
 * UTF-8 is checked as RFC 3629 section 4 defines it: no overlong forms, no
 * surrogates (U+D800..U+DFFF), nothing above U+10FFFF.
 */
#ifndef SB_PROTO_SCAN_H
#define SB_PROTO_SCAN_H

#include <locale.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SB__ONES 0x0101010101010101ull
#define SB__HIGHS 0x8080808080808080ull

/** 8 bytes at `p`, in memory order, without alignment requirements */
static inline uint64_t sb__load8(const uint8_t *p)
{
    uint64_t x;
    memcpy(&x, p, sizeof(x));
    return x;
}

/** 1 when none of the 8 bytes in `x` has its high bit set (all ASCII) */
static inline int sb__ascii8(uint64_t x)
{
    return (x & SB__HIGHS) == 0;
}

/*
 * 1 when all 8 bytes in `x` can stand in a JSON string as they are: ASCII,
 * none below 0x20, none '"' or '\\'. The "has a byte below n" test
 * ((x - n * ONES) & ~x & HIGHS) is exact as a yes/no answer for n <= 0x80.
 */
static inline int sb__json_plain8(uint64_t x)
{
    uint64_t q = x ^ (SB__ONES * '"'), s = x ^ (SB__ONES * '\\');
    uint64_t ctl = (x - SB__ONES * 0x20) & ~x;
    uint64_t hq = (q - SB__ONES) & ~q;
    uint64_t hs = (s - SB__ONES) & ~s;
    return ((ctl | hq | hs | x) & SB__HIGHS) == 0;
}

/**
 * The length (2..4) of the valid multi-byte UTF-8 sequence at `p`, which has
 * `left` bytes (at least 1, p[0] >= 0x80); 0 when it is not one.
 */
static inline size_t sb__utf8_seq(const uint8_t *p, size_t left)
{
    uint8_t b = p[0];

    if (b >= 0xc2 && b <= 0xdf) {
        return left >= 2 && (p[1] & 0xc0) == 0x80 ? 2 : 0;
    } else if (b >= 0xe0 && b <= 0xef) {
        if (left < 3 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80)
            return 0;
        /* E0 needs A0..BF (no overlongs), ED needs 80..9F (no surrogates) */
        if ((b == 0xe0 && p[1] < 0xa0) || (b == 0xed && p[1] > 0x9f))
            return 0;
        return 3;
    } else if (b >= 0xf0 && b <= 0xf4) {
        if (left < 4 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80 || (p[3] & 0xc0) != 0x80)
            return 0;
        /* F0 needs 90..BF (no overlongs), F4 needs 80..8F (nothing above U+10FFFF) */
        if ((b == 0xf0 && p[1] < 0x90) || (b == 0xf4 && p[1] > 0x8f))
            return 0;
        return 4;
    }
    return 0;
}

/**
 * The "C" locale, made once (json_parse.c): JSON numbers use '.' whatever
 * LC_NUMERIC the process has. (locale_t)0 if it could not be made.
 */
locale_t sb__c_locale(void);

#endif
