/*
 * broker/http: the admin routes' answers, shared by admin.c and the net-mint
 * credential's routes (admin_netmint.c). Each logs first (admin events reach
 * the log before the host sees the answer), counts the answer in the admin
 * metric, and sends it through sb_reply_send with its status from the table
 * in proto/status.c.
 */
#ifndef SB_ADMIN_INT_H
#define SB_ADMIN_INT_H

#include <h2o.h>
#include <jansson.h>
#include "sb/status.h"

/** Sends `body` (JSON, or nothing when len is 0) with the status `st`; `op` names the admin metric's op. */
void sb_admin_send(h2o_req_t *req, const char *op, sb_status_t st, const char *body, size_t len);

/** Sends `body` as compact JSON and releases it. */
void sb_admin_send_json(h2o_req_t *req, const char *op, sb_status_t st, json_t *body);

/** Sends {"ok":false,"error":{"code","message"}}, the code from the status table, the message valid UTF-8. */
void sb_admin_send_error(h2o_req_t *req, const char *op, sb_status_t st, const char *message);

/** Answers a token store failure: rate_limited when it is full, else unavailable. */
void sb_admin_send_store_error(h2o_req_t *req, const char *op, sb_status_t st);

/**
 * Answers a refusal (401 or 403) through sb_admin_send_error, after one
 * "admin.refused" log line: the op, the HTTP method, the remote address, the
 * request id (reqid.h), the status and `why`. Never the credential, nor the
 * path (it may hold a token).
 * @param message what the caller is told
 * @param why what the log says (may say more than the caller is told); NULL for `message`
 * @param credential "net-mint" when the net-mint credential was presented and refused, else NULL
 */
void sb_admin_refuse(h2o_req_t *req, const char *op, sb_status_t st, const char *message, const char *why, const char *credential);

/**
 * The admin op a request asks for, from its method and path (query dropped):
 * "mint", "revoke_token", "revoke_run", "inspect_token", "inspect_run", or
 * "other" for anything else. Decided before the credential is checked, so a
 * refusal is counted and logged under the op that was refused.
 */
const char *sb_admin_op_of(h2o_req_t *req, h2o_iovec_t path);

#endif
