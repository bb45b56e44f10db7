/*
 * broker/http/reqid: the X-Request-Id a proxy in front of the broker sends
 * (nginx's $request_id in deploy/nginx/sandbox-broker.conf), so that the
 * proxy's log and the broker's can be joined. The id is the client's or the
 * proxy's text: it is taken only when it is safe to write into a JSON log line
 * and a response header as it is, and it is only ever logged next to the
 * broker's own correlation id (PROTOCOL.md section 7), never in its place.
 */
#ifndef SB_HTTP_REQID_H
#define SB_HTTP_REQID_H

#include <h2o.h>
#include "sb/limits.h"

/**
 * The request's X-Request-Id when there is exactly one such header and its
 * value is 1 to SB_MAX_REQUEST_ID bytes of [A-Za-z0-9._:-]. Anything else (no
 * header, two of them, empty, too long, another byte) is dropped: the request
 * then has no request id, and none is echoed.
 * @param out receives the id, NUL-terminated
 * @return 1 when `out` holds an id, 0 when the request has none
 */
int sb_http_request_id(h2o_req_t *req, char out[SB_MAX_REQUEST_ID + 1]);

/** Adds the request's id (sb_http_request_id), when it has one, to the response headers. */
void sb_http_echo_request_id(h2o_req_t *req);

#endif
