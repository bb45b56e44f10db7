/*
 * Unit tests for proto/base64.c: RFC 4648 section 4 base64, padded, strict on
 * input (non-canonical padding bits, whitespace and the URL-safe alphabet are
 * refused).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "tap.h"
#include "sb/value.h"

/* RFC 4648 section 10 */
static const struct {
    const char *raw, *b64;
} rfc[] = {
    {"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"},
};

static sb_status_t dec(const char *s, uint8_t *out, size_t *outlen)
{
    return sb_b64_decode(s, strlen(s), out, outlen);
}

static void test_rfc_vectors(void)
{
    for (size_t i = 0; i < sizeof(rfc) / sizeof(rfc[0]); ++i) {
        char enc[16];
        uint8_t out[16];
        size_t n = strlen(rfc[i].raw), outlen = 999;

        is_int(sb_b64_encoded_len(n), strlen(rfc[i].b64), "encoded_len(\"%s\")", rfc[i].raw);
        memset(enc, 'X', sizeof(enc));
        sb_b64_encode((const uint8_t *)rfc[i].raw, n, enc);
        is_str(enc, rfc[i].b64, "encode(\"%s\")", rfc[i].raw);
        is_int(dec(rfc[i].b64, out, &outlen), SB_OK, "decode(\"%s\")", rfc[i].b64);
        ok(outlen == n && memcmp(out, rfc[i].raw, n) == 0, "decode(\"%s\") == \"%s\"", rfc[i].b64, rfc[i].raw);
    }
}

static void test_all_bytes(void)
{
    uint8_t raw[256], out[256];
    char enc[4 * 86 + 1];
    int bad = 0;

    for (int i = 0; i < 256; ++i)
        raw[i] = (uint8_t)i;
    /* every length 0..256 of the byte ramp (all three tail shapes, every alphabet symbol) */
    for (size_t n = 0; n <= 256; ++n) {
        size_t outlen = 0;
        sb_b64_encode(raw, n, enc);
        if (strlen(enc) != sb_b64_encoded_len(n) || sb_b64_decode(enc, strlen(enc), out, &outlen) != SB_OK || outlen != n ||
            memcmp(out, raw, n) != 0)
            ++bad;
    }
    is_int(bad, 0, "encode/decode round trip for every prefix of 00..ff");
    sb_b64_encode(raw + 0xf8, 8, enc);
    is_str(enc, "+Pn6+/z9/v8=", "the '+' and '/' symbols");

    /* every single byte and every byte pair */
    bad = 0;
    for (unsigned v = 0; v < 65536; ++v) {
        uint8_t in[2] = {(uint8_t)(v >> 8), (uint8_t)v};
        size_t outlen = 0;
        sb_b64_encode(in, 2, enc);
        if (sb_b64_decode(enc, 4, out, &outlen) != SB_OK || outlen != 2 || memcmp(out, in, 2) != 0)
            ++bad;
        if (v < 256) {
            sb_b64_encode(in + 1, 1, enc);
            if (sb_b64_decode(enc, 4, out, &outlen) != SB_OK || outlen != 1 || out[0] != in[1])
                ++bad;
        }
    }
    is_int(bad, 0, "every 1- and 2-byte input round trips");
}

static void test_refusals(void)
{
    static const char *const bad[] = {
        "Zg",       /* missing padding */
        "Zg=",      /* short padding */
        "Zm9",      /* length not a multiple of 4 */
        "Z",        /* one symbol */
        "Zg===",    /* too much padding */
        "====",     /* padding only */
        "Z===",     /* three pads */
        "=Zg=",     /* leading pad */
        "Z=g=",     /* pad in the middle of a quantum */
        "Zm=8",     /* data after a pad */
        "Zg==Zg==", /* padding before the end */
        "Zm8=Zm9v", /* padding before the end */
        "Zm9v\n",   /* whitespace */
        "Zm 9v",    /* whitespace */
        " Zm9",     /* whitespace */
        "Zm9-",     /* URL-safe alphabet */
        "Zm9_",     /* URL-safe alphabet */
        "Zm9.",     /* not in the alphabet */
        "Zm9\x80",  /* high byte */
        "Zm9\xff",  /* high byte */
        /* non-canonical: the bits that padding drops must be zero (RFC 4648 section 3.5) */
        "Zh==", /* 'f' is Zg== */
        "Zv==",
        "Z/==",
        "Zm9=", /* "fo" is Zm8= */
        "Zm+=",
        "Zm/=",
        "Zm9vYh==",
        "Zm9vYmF=",
        "AB==", /* 00 with a stray bit */
        "AAB=",
    };
    uint8_t out[16];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        size_t outlen = 12345;
        is_int(dec(bad[i], out, &outlen), SB_E_BAD_ARGS, "refused: bad[%zu] (\"%s\")", i, i >= 12 && i <= 14 ? "ws" : bad[i]);
        is_int(outlen, 12345, "refused: bad[%zu]: outlen untouched", i);
    }
    {
        size_t outlen;
        uint8_t z[4];
        is_int(sb_b64_decode("Zg==\0", 5, out, &outlen), SB_E_BAD_ARGS, "embedded NUL (length 5)");
        is_int(sb_b64_decode("Zm\0v", 4, z, &outlen), SB_E_BAD_ARGS, "NUL inside a quantum");
        is_int(sb_b64_decode("", 0, out, &outlen), SB_OK, "empty input");
        is_int(outlen, 0, "empty input decodes to nothing");
        is_int(dec("AA==", out, &outlen), SB_OK, "canonical AA==");
        ok(outlen == 1 && out[0] == 0, "AA== is one zero byte");
        is_int(dec("AAA=", out, &outlen), SB_OK, "canonical AAA=");
        ok(outlen == 2 && out[0] == 0 && out[1] == 0, "AAA= is two zero bytes");
        is_int(dec("////", out, &outlen), SB_OK, "//// decodes");
        ok(outlen == 3 && out[0] == 0xff && out[1] == 0xff && out[2] == 0xff, "//// is ff ff ff");
    }
    /* every 4-symbol quantum with two pads: exactly 64 * 4 = 256 canonical ones */
    {
        static const char alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        unsigned accepted2 = 0, accepted1 = 0;
        for (int a = 0; a < 64; ++a) {
            for (int b = 0; b < 64; ++b) {
                char q[5] = {alpha[a], alpha[b], '=', '=', 0};
                size_t outlen;
                if (dec(q, out, &outlen) == SB_OK)
                    ++accepted2;
                for (int c = 0; c < 64; ++c) {
                    char r[5] = {alpha[a], alpha[b], alpha[c], '=', 0};
                    if (dec(r, out, &outlen) == SB_OK)
                        ++accepted1;
                }
            }
        }
        is_int(accepted2, 256, "xx==: exactly the 256 canonical quanta are accepted");
        is_int(accepted1, 65536, "xxx=: exactly the 65536 canonical quanta are accepted");
    }
}

int main(void)
{
    test_rfc_vectors();
    test_all_bytes();
    test_refusals();
    return done_testing();
}
