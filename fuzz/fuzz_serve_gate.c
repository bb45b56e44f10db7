/*
 * libFuzzer driver for supervisor-shim/serve/gate.c, sb_serve_gate_head: what serve decides on a
 * connection's first request head, from bytes as received, before h2o sees them.
 *
 * gate.c is compiled into this driver (#include below), so it gets the instrumentation.
 *
 * Input: the bytes a client sent first. Properties:
 *  1. the verdict is one of the enum's, deterministic, and every refusal has a reason;
 *  2. on a head that parses, the framing verdict agrees with the broker listener's
 *     (broker/http/framing.c, sb_http_framing_check): the gate refuses framing exactly when the
 *     broker does, with the same reason, and never on a head the broker accepts;
 *  3. nothing with a body passes without the admission header: PASS implies admitted or no body;
 *     a Content-Length above the cap is never PASS;
 *  4. once decided (not MORE), bytes after the head do not change the verdict.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/evp.h>
#include "http/framing.h"
#include "fuzz.h"
#include "../supervisor-shim/serve/gate.c"

#define CAP 16u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t hash[32];
    static int init;
    sb_serve_gate_head_t h1, h2;
    const char *why1 = NULL, *why2 = NULL, *broker;
    sb_serve_gate_t v1, v2;
    char *more;

    if (!init) {
        unsigned len = 32;
        if (EVP_Digest("secret-0123456789abcdef0123456789", 33, hash, &len, EVP_sha256(), NULL) != 1)
            abort();
        init = 1;
    }
    v1 = sb_serve_gate_head((const char *)data, size, hash, CAP, &h1, &why1);
    v2 = sb_serve_gate_head((const char *)data, size, hash, CAP, &h2, &why2);
    SB_FUZZ_ASSERT(v1 <= SB_GATE_TOO_LARGE, "verdict %d", (int)v1);
    SB_FUZZ_ASSERT(v1 == v2 && memcmp(&h1, &h2, sizeof(h1)) == 0, "not deterministic");
    SB_FUZZ_ASSERT(v1 == SB_GATE_MORE || v1 == SB_GATE_PASS || why1 != NULL, "a refusal without a reason");

    if (v1 != SB_GATE_MORE && v1 != SB_GATE_BAD_HEAD && size <= SB_SERVE_GATE_MAX_HEAD) {
        broker = sb_http_framing_check((const char *)data, size);
        if (v1 == SB_GATE_FRAMING)
            SB_FUZZ_ASSERT(broker != NULL && strcmp(broker, why1) == 0, "gate refused framing (%s), broker said %s", why1,
                           broker != NULL ? broker : "(accepted)");
        else
            SB_FUZZ_ASSERT(broker == NULL, "gate let through framing the broker refuses: %s", broker);
    }
    if (v1 == SB_GATE_PASS)
        SB_FUZZ_ASSERT(h1.admitted || !h1.has_body, "a body passed without the admission header");

    if (v1 != SB_GATE_MORE && size <= SB_SERVE_GATE_MAX_HEAD && (more = malloc(size + 7)) != NULL) {
        memcpy(more, data, size);
        memcpy(more + size, "XYZ\r\n\r\n", 7);
        v2 = sb_serve_gate_head(more, size + 7, hash, CAP, &h2, &why2);
        free(more);
        SB_FUZZ_ASSERT(v2 == v1 || (v1 == SB_GATE_BAD_HEAD && v2 == SB_GATE_BAD_HEAD),
                       "trailing bytes changed the verdict: %d -> %d", (int)v1, (int)v2);
    }
    return 0;
}
