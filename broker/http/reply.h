/*
 * broker/http: answering a request (reply.c). Every answer of the broker's
 * own routes goes out through sb_reply_send.
 */
#ifndef SB_REPLY_H
#define SB_REPLY_H

#include <stddef.h>
#include <h2o.h>

void sb_send_bytes(h2o_req_t *req, int status, const char *reason, const char *ctype, const char *body, size_t len);

#endif
