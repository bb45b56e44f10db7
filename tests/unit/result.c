/*
 * Unit tests for broker/call/result.c: an error answer's status and message, formatted or fixed, cut on a
 * UTF-8 code point boundary when longer than the message buffer, and the answer given before the call returns.
 */
#include <string.h>
#include "tap.h"
#include "call/result.h"

static struct {
    int calls;
    sb_status_t status;
    char message[SB_RESULT_MAX_MESSAGE];
    size_t value_len;
} got;

static void on_answer(void *arg, sb_result_t *res)
{
    (void)arg;
    ++got.calls;
    got.status = res->status;
    memcpy(got.message, res->message, sizeof(got.message));
    got.value_len = res->value.size;
}

static void test_fixed_and_formatted(void)
{
    memset(&got, 0, sizeof(got));
    sb_answer_error_str(on_answer, NULL, SB_E_NOT_IMPLEMENTED, "services dispatch is not implemented");
    is_int(got.calls, 1, "answered before returning");
    is_int((int)got.status, (int)SB_E_NOT_IMPLEMENTED, "the status");
    is_str(got.message, "services dispatch is not implemented", "the message as given");
    is_int((int)got.value_len, 0, "no value");

    sb_answer_error(on_answer, NULL, SB_E_NOT_FOUND, "%s %d", "row", 7);
    is_int(got.calls, 2, "formatted: answered");
    is_str(got.message, "row 7", "formatted: the message");
}

/* a message longer than the buffer, whose last code point would be cut, loses that code point whole */
static void test_cut(void)
{
    static char msg[SB_RESULT_MAX_MESSAGE + 8];
    size_t n = SB_RESULT_MAX_MESSAGE - 2; /* room for the first byte of a 3-byte character only */
    memset(msg, 'a', n);
    memcpy(msg + n, "\xe2\x82\xac tail", 8);
    sb_answer_error_str(on_answer, NULL, SB_E_BAD_ARGS, msg);
    is_int((int)strlen(got.message), (int)n, "fixed: cut before the character that does not fit");
    sb_answer_error(on_answer, NULL, SB_E_BAD_ARGS, "%s", msg);
    is_int((int)strlen(got.message), (int)n, "formatted: cut the same way");
    is_int(memcmp(got.message, msg, n), 0, "the bytes before the cut are kept");
}

int main(void)
{
    test_fixed_and_formatted();
    test_cut();
    return done_testing();
}
