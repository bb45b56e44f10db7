/*
 * sandbox-broker: the one status enum, and its mapping to the wire.
 *
 * Every fallible function in the project returns sb_status_t. The table in
 * proto/status.c maps each status to everything a reply needs: the wire
 * code, the HTTP status and its reason phrase, the default message, and
 * whether the message is redacted (PROTOCOL.md section 7). Every reply of the
 * broker, RPC and admin, is sent with a status from this table, so no route
 * and no handler picks a code, a status or a phrase by hand.
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
    /** admin: the record already exists (a registered token): conflict / 409 */
    SB_E_CONFLICT,
    /** admin: no such endpoint: not_found / 404 */
    SB_E_NOT_FOUND,
    /** the route exists, the HTTP method does not: bad_method / 405 */
    SB_E_METHOD_NOT_ALLOWED,
    /** replies only, never returned by a function: 201 Created (a minted token) */
    SB_OK_CREATED,
    /** replies only, never returned by a function: 204 No Content (a revocation) */
    SB_OK_NO_CONTENT,
    SB_STATUS_COUNT_
} sb_status_t;

/** the stable wire code for a status ("bad_args", ...); never NULL */
const char *sb_status_code(sb_status_t st);
/** the HTTP status the RPC route answers with for a status */
int sb_status_http(sb_status_t st);
/** the upstream-compatible default message for a status; never NULL */
const char *sb_status_message(sb_status_t st);
/** the HTTP reason phrase of the status's HTTP status ("Forbidden"); never NULL */
const char *sb_status_phrase(sb_status_t st);
/**
 * 1 when a reply must not carry the status's own message: the wire gets the
 * fixed default message and a correlation id, the detail goes to the log
 * (execution_error and the internal statuses that fail as one)
 */
int sb_status_redacted(sb_status_t st);
/** the status a reply reports: the internal SB_E_NOMEM and SB_E_AGAIN as SB_E_EXECUTION, others as themselves */
sb_status_t sb_status_on_wire(sb_status_t st);
/**
 * looks a wire code up ("forbidden" -> SB_E_FORBIDDEN).
 * @return the status, or SB_E_EXECUTION for an unknown code (as the upstream supervisor does)
 */
sb_status_t sb_status_from_code(const char *code, size_t len);

#ifdef __cplusplus
}
#endif
#endif
