/*
 * libFuzzer driver for broker/svc/decide/answer.c (sb_decide_parse_answer):
 * the decider's answer, bytes from the network that decide whether a held
 * call runs (PROTOCOL.md section 5a).
 *
 * Input: the raw answer body.
 *
 * Properties:
 *  - never crashes (ASan/UBSan), never leaks;
 *  - a body above SB_MAX_DECIDE_ANSWER bytes is refused, whatever it holds;
 *  - a refusal comes with a non-empty reason and leaves the answer zeroed
 *    (never an allow);
 *  - the verdict is deterministic: a second parse gives the same result;
 *  - an accepted answer is the schema exactly, as an independent parser
 *    (jansson, duplicate keys rejected) reads the same bytes: an object whose
 *    keys are among v, decision and reason, v the integer 1, decision "allow"
 *    or "deny" matching the parsed verdict, and reason, when present, a
 *    string equal to the parsed reason;
 *  - an accepted reason is NUL-terminated, at most SB_MAX_DECIDE_REASON
 *    bytes, without control characters, and valid UTF-8;
 *  - an allow is accepted only when the input contains the bytes "allow"
 *    (no allow out of nothing).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "sb/limits.h"
#include "sb/value.h"
#include "svc/decide/decide.h"
#include "fuzz.h"

static int has_bytes(const uint8_t *p, size_t n, const char *lit)
{
    size_t l = strlen(lit);
    for (size_t i = 0; i + l <= n; ++i)
        if (memcmp(p + i, lit, l) == 0)
            return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sb_decide_answer_t a, b, zero;
    const char *why = NULL, *why2 = NULL;
    sb_status_t st, st2;

    memset(&zero, 0, sizeof(zero));
    st = sb_decide_parse_answer((const char *)data, size, &a, &why);
    st2 = sb_decide_parse_answer((const char *)data, size, &b, &why2);
    SB_FUZZ_ASSERT(st == st2 && memcmp(&a, &b, sizeof(a)) == 0, "the verdict is deterministic");
    SB_FUZZ_ASSERT(st == SB_OK || st == SB_E_BAD_ARGS, "status %d", (int)st);
    if (size > SB_MAX_DECIDE_ANSWER)
        SB_FUZZ_ASSERT(st != SB_OK, "an answer of %zu bytes was accepted", size);
    if (st != SB_OK) {
        SB_FUZZ_ASSERT(why != NULL && why[0] != '\0', "a refusal names its reason");
        SB_FUZZ_ASSERT(memcmp(&a, &zero, sizeof(a)) == 0, "a refused answer is zeroed");
        return 0;
    }
    {
        size_t rl = strnlen(a.reason, sizeof(a.reason));
        SB_FUZZ_ASSERT(rl <= SB_MAX_DECIDE_REASON, "the reason is NUL-terminated within its cap");
        for (size_t i = 0; i < rl; ++i)
            SB_FUZZ_ASSERT((unsigned char)a.reason[i] >= 0x20 && (unsigned char)a.reason[i] != 0x7f, "control character in reason");
        SB_FUZZ_ASSERT(sb_utf8_valid((const uint8_t *)a.reason, rl), "the reason is UTF-8");
    }
    if (a.allow)
        SB_FUZZ_ASSERT(has_bytes(data, size, "allow"), "an allow from bytes without \"allow\"");
    {
        json_error_t jerr;
        json_t *o = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &jerr), *v, *d, *r;
        const char *key;
        json_t *val;
        SB_FUZZ_ASSERT(o != NULL && json_is_object(o), "jansson reads an accepted answer as an object: %s", o ? "" : jerr.text);
        json_object_foreach(o, key, val)
        {
            SB_FUZZ_ASSERT(strcmp(key, "v") == 0 || strcmp(key, "decision") == 0 || strcmp(key, "reason") == 0, "key %s", key);
        }
        v = json_object_get(o, "v");
        d = json_object_get(o, "decision");
        r = json_object_get(o, "reason");
        SB_FUZZ_ASSERT(json_is_integer(v) && json_integer_value(v) == 1, "v is 1");
        SB_FUZZ_ASSERT(json_is_string(d) && strcmp(json_string_value(d), a.allow ? "allow" : "deny") == 0, "decision matches");
        if (r != NULL)
            SB_FUZZ_ASSERT(json_is_string(r) && json_string_length(r) == strlen(a.reason) &&
                               memcmp(json_string_value(r), a.reason, json_string_length(r)) == 0,
                           "reason matches");
        else
            SB_FUZZ_ASSERT(a.reason[0] == '\0', "no reason given, none parsed");
        json_decref(o);
    }
    return 0;
}
