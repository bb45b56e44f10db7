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

#endif
