/*
 * sandbox-broker: the one status enum, and its mapping to the wire.
 *
 * Every fallible function in the project returns sb_status_t. The table in
 * proto/status.c maps each status to the RPC error code and HTTP status that
 * proto/PROTOCOL.md specifies, so no handler ever picks a code by hand.
 */
#ifndef SB_STATUS_H
#define SB_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

#define SB_WARN_UNUSED __attribute__((warn_unused_result))

typedef enum en_sb_status_t {
    SB_OK = 0,
    /** method string is missing, too long or not in the grammar: bad_method / 400 */
    SB_E_BAD_METHOD,
    /** malformed request or arguments: bad_args / 400 */
    SB_E_BAD_ARGS,
    /** a size from the input exceeds a named cap: bad_args / 413 */
    SB_E_TOO_LARGE,
    /** token missing, unknown, expired or revoked: unauthorized / 401 */
    SB_E_UNAUTHORIZED,
    /** the manifest (or a policy) denies the call: forbidden / 403 */
    SB_E_FORBIDDEN,
    /** allowed, but the run's target wires no handler: not_implemented / 501 */
    SB_E_NOT_IMPLEMENTED,
    /** a handler or upstream failed: execution_error / 500 (with a correlation id) */
    SB_E_EXECUTION,
    /** a per-run quota is exhausted: rate_limited / 429 */
    SB_E_RATE_LIMITED,
    /** a backend the decision depends on is down (fail closed): unavailable / 503 */
    SB_E_UNAVAILABLE,
    /** more input is needed (incremental decoders only; never on the wire) */
    SB_E_AGAIN,
    /** allocation failed for an input-derived size: execution_error / 500 */
    SB_E_NOMEM,
    SB_STATUS_COUNT_
} sb_status_t;

/** the stable wire code for a status ("bad_args", ...); never NULL */
const char *sb_status_code(sb_status_t st);
/** the HTTP status the RPC route answers with for a status */
int sb_status_http(sb_status_t st);
/** the upstream-compatible default message for a status; never NULL */
const char *sb_status_message(sb_status_t st);
/**
 * looks a wire code up ("forbidden" -> SB_E_FORBIDDEN).
 * @return the status, or SB_E_EXECUTION for an unknown code (as the upstream supervisor does)
 */
sb_status_t sb_status_from_code(const char *code, size_t len);

#ifdef __cplusplus
}
#endif
#endif
