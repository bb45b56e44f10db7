/* base64 (RFC 4648 section 4), strict on input: the JSON edge carries binary this way. */
#include "sb/value.h"

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t sb_b64_encoded_len(size_t len)
{
    return (len + 2) / 3 * 4;
}

void sb_b64_encode(const uint8_t *in, size_t len, char *out)
{
    size_t i = 0, o = 0;

    for (; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[o++] = alphabet[v >> 18];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = alphabet[(v >> 6) & 63];
        out[o++] = alphabet[v & 63];
    }
    if (len - i == 1) {
        uint32_t v = (uint32_t)in[i] << 16;
        out[o++] = alphabet[v >> 18];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = '=';
        out[o++] = '=';
    } else if (len - i == 2) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
        out[o++] = alphabet[v >> 18];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = alphabet[(v >> 6) & 63];
        out[o++] = '=';
    }
    out[o] = '\0';
}

static int value_of(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

sb_status_t sb_b64_decode(const char *in, size_t len, uint8_t *out, size_t *outlen)
{
    size_t o = 0;

    if (len % 4 != 0)
        return SB_E_BAD_ARGS;
    for (size_t i = 0; i < len; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; ++k) {
            if (in[i + k] == '=' && i + 4 == len && k >= 2) {
                v[k] = 0;
                ++pad;
            } else if (pad != 0 || (v[k] = value_of(in[i + k])) < 0) {
                return SB_E_BAD_ARGS;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        /* canonical: the bits dropped by padding must be zero */
        if ((pad == 2 && (w & 0xffff) != 0) || (pad == 1 && (w & 0xff) != 0))
            return SB_E_BAD_ARGS;
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2)
            out[o++] = (uint8_t)(w >> 8);
        if (pad < 1)
            out[o++] = (uint8_t)w;
    }
    *outlen = o;
    return SB_OK;
}
