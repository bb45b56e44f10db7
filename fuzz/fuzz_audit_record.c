/*
 * libFuzzer driver for broker/obs/audit_chain.c (sb_audit_record_parse) and
 * broker/obs/audit_verify.c (the verifier line by line): what
 * `sandbox-broker audit-verify` reads from files anyone may have edited.
 *
 * Input: bytes, split at '\n' into lines, all fed to one verifier (with and
 * without a pinned key), then the end of the file and of the input.
 *
 * Properties:
 *  - every line that parses writes its chain prefix back byte for byte:
 *    {"seq":<seq>,"inst":"<inst>","prev":"<hex of prev>","ts":" (one value,
 *    one spelling: no leading zero, lowercase hex only);
 *  - a parsed genesis has seq 0; a signed record's signature is the last
 *    139 bytes and signed_len is what precedes them; only a genesis or a
 *    checkpoint carries one; the kind agrees with the event name;
 *  - a rejected line has a static, non-empty reason;
 *  - the verifier, once failed, stays failed (every later call is -1), and
 *    a verification without a pinned key never fails where one with a key
 *    succeeded (a key only adds rules).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "fuzz.h"
#include "obs/audit_chain.h"
#include "obs/audit_verify.h"
#include "util/util.h"

static void check_line(const char *line, size_t len)
{
    sb_audit_record_t r;
    const char *why = NULL;
    char prefix[160], prevhex[65];
    int n;

    if (sb_audit_record_parse(line, len, &r, &why) != SB_OK) {
        SB_FUZZ_ASSERT(why != NULL && why[0] != '\0', "a refusal without a reason");
        return;
    }
    sb_hex(r.prev, 32, prevhex);
    n = snprintf(prefix, sizeof(prefix), "{\"seq\":%llu,\"inst\":\"%s\",\"prev\":\"%s\",\"ts\":\"", (unsigned long long)r.seq,
                 r.inst, prevhex);
    SB_FUZZ_ASSERT((size_t)n <= len && memcmp(prefix, line, (size_t)n) == 0, "the prefix does not write back: %.*s", n, prefix);
    SB_FUZZ_ASSERT(r.kind != SB_AUDIT_REC_GENESIS || r.seq == 0, "a genesis with seq %llu", (unsigned long long)r.seq);
    SB_FUZZ_ASSERT((r.kind == SB_AUDIT_REC_GENESIS) == (strcmp(r.event, "audit.genesis") == 0), "kind and event disagree");
    SB_FUZZ_ASSERT((r.kind == SB_AUDIT_REC_CHECKPOINT) == (strcmp(r.event, "audit.checkpoint") == 0), "kind and event disagree");
    SB_FUZZ_ASSERT((r.kind == SB_AUDIT_REC_GAP) == (strcmp(r.event, "audit.gap") == 0), "kind and event disagree");
    if (r.has_sig) {
        SB_FUZZ_ASSERT(r.kind == SB_AUDIT_REC_GENESIS || r.kind == SB_AUDIT_REC_CHECKPOINT, "a signed call record");
        SB_FUZZ_ASSERT(r.signed_len + 8 + 2 * SB_AUDIT_SIG_LEN + 2 == len, "signed_len %zu of %zu", r.signed_len, len);
        SB_FUZZ_ASSERT(memcmp(line + r.signed_len, ",\"sig\":\"", 8) == 0, "the signature is not the last field");
    }
}

static int run(const uint8_t *data, size_t size, const uint8_t *key)
{
    sb_audit_verifier_t *v = sb_audit_verifier_new(key, 0, NULL);
    size_t start = 0;
    uint64_t lineno = 0;
    int failed = 0, rc;

    while (start < size) {
        const uint8_t *nl = memchr(data + start, '\n', size - start);
        size_t end = nl != NULL ? (size_t)(nl - data) : size;
        if (nl == NULL)
            break;
        if (key == NULL)
            check_line((const char *)data + start, end - start);
        rc = sb_audit_verifier_line(v, "in", ++lineno, (const char *)data + start, end - start);
        SB_FUZZ_ASSERT(!failed || rc == -1, "a failed verifier accepted a line");
        failed |= rc != 0;
        start = end + 1;
    }
    rc = sb_audit_verifier_end_file(v, "in", lineno + 1, start < size);
    SB_FUZZ_ASSERT(!failed || rc == -1, "a failed verifier accepted the end of the file");
    failed |= rc != 0;
    rc = sb_audit_verifier_finish(v);
    SB_FUZZ_ASSERT(!failed || rc == -1, "a failed verifier accepted the end of the input");
    sb_audit_verifier_free(v);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a key no input can sign with: every signature fails against it */
    static const uint8_t key[32] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                                    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
    int unpinned = run(data, size, NULL), pinned = run(data, size, key);
    SB_FUZZ_ASSERT(pinned != 0 || unpinned == 0, "a pinned key accepted what the genesis key refused");
    return 0;
}
