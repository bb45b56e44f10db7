#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <pthread.h>
#include <sys/random.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include "util/util.h"

int64_t sb_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint64_t sb_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

sb_status_t sb_random(void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len != 0) {
        ssize_t r = getrandom(p, len, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return SB_E_UNAVAILABLE;
        }
        p += r;
        len -= (size_t)r;
    }
    return SB_OK;
}

/*
 * Correlation ids need uniqueness, not secrecy beyond the CSPRNG's: they come
 * from a per-thread pool refilled by one getrandom per 256 ids, instead of a
 * system call per call.
 */
static __thread uint8_t uuid_pool[4096];
static __thread size_t uuid_pool_left;

sb_status_t sb_uuid4(char out[37])
{
    uint8_t b[16];
    char hex[33];
    sb_status_t st;

    if (uuid_pool_left < sizeof(b)) {
        if ((st = sb_random(uuid_pool, sizeof(uuid_pool))) != SB_OK)
            return st;
        uuid_pool_left = sizeof(uuid_pool);
    }
    memcpy(b, uuid_pool + sizeof(uuid_pool) - uuid_pool_left, sizeof(b));
    /* a used id never stays in memory to be handed out again */
    explicit_bzero(uuid_pool + sizeof(uuid_pool) - uuid_pool_left, sizeof(b));
    uuid_pool_left -= sizeof(b);
    b[6] = (uint8_t)((b[6] & 0x0f) | 0x40);
    b[8] = (uint8_t)((b[8] & 0x3f) | 0x80);
    sb_hex(b, sizeof(b), hex);
    memcpy(out, hex, 8);
    out[8] = '-';
    memcpy(out + 9, hex + 8, 4);
    out[13] = '-';
    memcpy(out + 14, hex + 12, 4);
    out[18] = '-';
    memcpy(out + 19, hex + 16, 4);
    out[23] = '-';
    memcpy(out + 24, hex + 20, 12);
    out[36] = '\0';
    return SB_OK;
}

void sb_hex(const uint8_t *in, size_t len, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; ++i) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * len] = '\0';
}

int sb_hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/*
 * OpenSSL 3 looks the algorithm up on every EVP_Digest with the implicit
 * EVP_sha256(); fetching it once and keeping one context per thread makes the
 * per-call token hash about three times cheaper.
 */
static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static pthread_key_t sha256_key; /* the thread's EVP_MD_CTX, freed when the thread exits */

static void free_ctx(void *p)
{
    EVP_MD_CTX_free(p);
}

static void sha256_init(void)
{
    if ((sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL)) == NULL || pthread_key_create(&sha256_key, free_ctx) != 0)
        sb_fatal(__FILE__, __LINE__, "SHA-256 is not available");
}

void sb_sha256(const void *in, size_t len, uint8_t out[32])
{
    unsigned int n = 32;
    EVP_MD_CTX *sha256_ctx;

    pthread_once(&sha256_once, sha256_init);
    if ((sha256_ctx = pthread_getspecific(sha256_key)) == NULL) {
        if ((sha256_ctx = EVP_MD_CTX_new()) == NULL || pthread_setspecific(sha256_key, sha256_ctx) != 0)
            sb_fatal(__FILE__, __LINE__, "out of memory");
    }
    if (EVP_DigestInit_ex(sha256_ctx, sha256_md, NULL) != 1 || EVP_DigestUpdate(sha256_ctx, in, len) != 1 ||
        EVP_DigestFinal_ex(sha256_ctx, out, &n) != 1)
        sb_fatal(__FILE__, __LINE__, "SHA-256 failed");
}

int sb_ct_equal(const void *a, const void *b, size_t len)
{
    return CRYPTO_memcmp(a, b, len) == 0;
}

void sb_format_error(char *err, size_t errsz, const char *fmt, ...)
{
    va_list ap;

    if (err != NULL && errsz != 0) {
        va_start(ap, fmt);
        vsnprintf(err, errsz, fmt, ap);
        va_end(ap);
    }
}

const char *sb_quote_printable(const char *s, size_t len, size_t max, char *buf, size_t bufsz)
{
    size_t i, n = len < max ? len : max;

    if (n >= bufsz)
        n = bufsz - 1;
    for (i = 0; i != n; ++i) {
        unsigned char c = (unsigned char)s[i];
        buf[i] = c >= 0x20 && c < 0x7f && c != '"' ? (char)c : '?';
    }
    buf[n] = '\0';
    return buf;
}

size_t sb_utf8_cut(const char *s, size_t len, size_t max)
{
    size_t n = len < max ? len : max;

    if (n == len)
        return n;
    /* s[n] is the first byte left out: while it continues a sequence, the sequence started inside the prefix */
    for (unsigned k = 0; k < 3 && n != 0 && ((unsigned char)s[n] & 0xc0) == 0x80; ++k)
        --n;
    if (((unsigned char)s[n] & 0xc0) == 0x80)
        n = 0; /* not UTF-8 at all: echo nothing rather than a broken byte */
    return n;
}

size_t sb_utf8_trim_tail(const char *s, size_t len)
{
    size_t i = len;
    unsigned need;

    /* find the lead byte of the last sequence (at most 3 continuation bytes back) */
    while (i != 0 && len - i < 4 && ((unsigned char)s[i - 1] & 0xc0) == 0x80)
        --i;
    if (i == 0)
        return 0; /* nothing but continuation bytes: no complete code point to keep */
    {
        unsigned char lead = (unsigned char)s[i - 1];
        need = lead < 0x80 ? 1 : lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
    }
    /* the sequence starting at i - 1 holds len - (i - 1) bytes: complete, or cut off */
    return len - (i - 1) >= need ? len : i - 1;
}

int sb_is_name(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n > max)
        return 0;
    for (size_t i = 0; i < n; ++i) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

int sb_is_token_format(const char *s, size_t len)
{
    /* every call's token passes here: one table look-up a byte, and one test for the whole token */
    static const unsigned char lower_hex[256] = {
        ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1,
        ['8'] = 1, ['9'] = 1, ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1};
    unsigned char all = 1;
    if (len != 64)
        return 0;
    for (size_t i = 0; i < 64; ++i)
        all &= lower_hex[(unsigned char)s[i]];
    return all;
}
