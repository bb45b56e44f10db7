/*
 * libFuzzer driver for sb_store__parse_switch_master (broker/store/
 * store_redis_conf.c): the parser of Redis Sentinel's "+switch-master" messages,
 * "<name> <old-ip> <old-port> <new-ip> <new-port>", which decide where every
 * worker's token store connects next.
 *
 * Input: the master name, a NUL, the message (no NUL: the whole input when
 * there is none, with the name "m").
 *
 * Properties, against a reference that splits on single spaces:
 *  - the verdict is -1 unless the message is exactly five non-empty fields;
 *  - with five fields, 0 exactly when the first is not the master name;
 *  - 1 exactly when, besides, the fourth field is an IPv4 or IPv6 literal (at
 *    most 63 bytes) and the fifth is 1-7 decimal digits with a value in
 *    1..65535; then `to` holds that field and that value, and nothing else is
 *    ever handed to hiredis (no name is resolved).
 */
#include <arpa/inet.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "store/store_int.h"
#include "fuzz.h"

static int reference(const char *msg, size_t len, const char *master, sb_store_addr_t *want)
{
    const char *f[6];
    size_t fl[6], n = 0, start = 0;
    char host[64];
    struct in_addr a4;
    struct in6_addr a6;
    long port = 0;

    for (size_t i = 0; i <= len; ++i) {
        if (i == len || msg[i] == ' ') {
            if (n == 6)
                return -1;
            f[n] = msg + start;
            fl[n++] = i - start;
            start = i + 1;
        }
    }
    if (n != 5)
        return -1;
    for (size_t i = 0; i < 5; ++i)
        if (fl[i] == 0)
            return -1;
    if (fl[0] != strlen(master) || memcmp(f[0], master, fl[0]) != 0)
        return 0;
    if (fl[3] >= sizeof(host) || fl[4] > 7)
        return -1;
    memcpy(host, f[3], fl[3]);
    host[fl[3]] = '\0';
    if (memchr(host, '\0', fl[3]) != NULL || (inet_pton(AF_INET, host, &a4) != 1 && inet_pton(AF_INET6, host, &a6) != 1))
        return -1;
    for (size_t i = 0; i < fl[4]; ++i) {
        if (f[4][i] < '0' || f[4][i] > '9')
            return -1;
        port = port * 10 + (f[4][i] - '0');
    }
    if (port < 1 || port > 65535)
        return -1;
    memcpy(want->host, host, fl[3] + 1);
    want->port = (int)port;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *in = (const char *)data, *nul = memchr(in, '\0', size), *msg;
    char master[SB_STORE_MAX_MASTER_NAME + 1] = "m";
    size_t len;
    sb_store_addr_t got, want;
    int r, ref;

    if (nul != NULL) {
        size_t mlen = (size_t)(nul - in);
        if (mlen == 0 || mlen > SB_STORE_MAX_MASTER_NAME)
            return 0;
        memcpy(master, in, mlen);
        master[mlen] = '\0';
        msg = nul + 1;
        len = size - mlen - 1;
    } else {
        msg = in;
        len = size;
    }
    /* an owned copy, so a read past the message faults under ASan */
    {
        char *copy = malloc(len != 0 ? len : 1);
        memcpy(copy, msg, len);
        memset(&got, 0, sizeof(got));
        memset(&want, 0, sizeof(want));
        r = sb_store__parse_switch_master(copy, len, master, &got);
        ref = reference(copy, len, master, &want);
        free(copy);
    }
    SB_FUZZ_ASSERT(r == ref, "verdict %d, reference %d", r, ref);
    if (r == 1) {
        SB_FUZZ_ASSERT(strcmp(got.host, want.host) == 0, "host \"%s\", reference \"%s\"", got.host, want.host);
        SB_FUZZ_ASSERT(got.port == want.port, "port %d, reference %d", got.port, want.port);
    }
    return 0;
}
