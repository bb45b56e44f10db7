/*
 * broker/svc/tools/mcp_client: an MCP client over the Streamable HTTP transport
 * (MCP 2025-06-18, basic/transports and basic/lifecycle), one session per
 * upstream per worker loop.
 *
 * The session is created lazily by the first call: POST initialize, keep the
 * Mcp-Session-Id the server assigns (if any) and the negotiated protocol
 * version, POST notifications/initialized, then send the waiting calls. Every
 * message is its own POST on a fresh connection (broker/fetch/client), with
 * Accept: application/json, text/event-stream; the answer may be either
 * (mcp_wire). A call that gets 404 (or 400, see mcp_client.c) for a request
 * that carried the session id re-initialises the session and is sent again,
 * once.
 *
 * The upstream is operator configuration (targets.<t>.tools.upstream): an
 * http:// URL whose host is an IP literal or "localhost". Nothing is ever
 * resolved, and the egress policy of http.fetch does not apply (the operator
 * points it at a local tool server on purpose).
 *
 * Loop affinity: everything here runs on the loop given at creation.
 */
#ifndef SB_MCP_CLIENT_H
#define SB_MCP_CLIENT_H

#include <h2o.h>
#include <jansson.h>
#include "sb/status.h"

/* the protocol version we ask for; the server may answer another one we support (mcp_client.c) */
#define SB_MCP_PROTOCOL_VERSION "2025-06-18"
/* Mcp-Session-Id: visible ASCII (0x21-0x7E) per the transport spec; our bound on its length */
#define SB_MCP_MAX_SESSION_ID 256u

typedef struct st_sb_mcp_t sb_mcp_t;
typedef struct st_sb_mcp_call_t sb_mcp_call_t;

/**
 * The outcome of a call.
 * @param st SB_OK with the JSON-RPC result object packed as msgpack in (result, len); otherwise
 *           SB_E_EXECUTION (unreachable, timeout, HTTP or JSON-RPC error, malformed or oversized
 *           answer) with `detail` describing it
 * @param detail NUL-terminated, valid during the callback only; NULL on SB_OK
 * @param result valid during the callback only
 */
typedef void (*sb_mcp_cb)(void *arg, sb_status_t st, const char *detail, const char *result, size_t len);

/**
 * Creates the client for one upstream. Nothing is sent until the first call.
 * @param url the upstream endpoint, http://host[:port]/path with an IP literal or localhost host
 * @param timeout_ms bound of every HTTP exchange (connect to last byte)
 * @param why receives a static description when the URL is refused
 * @return SB_OK, or SB_E_BAD_ARGS for a URL we will not connect to
 */
SB_WARN_UNUSED sb_status_t sb_mcp_create(h2o_loop_t *loop, const char *url, uint64_t timeout_ms, sb_mcp_t **out, const char **why);

/**
 * Destroys the client: the session's exchanges are cancelled and every call
 * still pending completes with SB_E_EXECUTION ("shutting down") before this
 * returns. Never call it from inside a call's callback.
 */
void sb_mcp_destroy(sb_mcp_t *m);

/**
 * Sends one JSON-RPC request, initialising the session first when needed.
 * The callback never runs before this returns; it runs exactly once, on the
 * loop, unless the call is cancelled first.
 * @param method the JSON-RPC method (a string literal: it is not copied)
 * @param params the params object; the reference is stolen (NULL for none)
 * @param max_msg the largest answer message accepted, in bytes of JSON text
 * @return the call handle, owned by the client until the callback returns or sb_mcp_call_cancel
 */
sb_mcp_call_t *sb_mcp_call(sb_mcp_t *m, const char *method, json_t *params, size_t max_msg, sb_mcp_cb cb, void *arg);

/** abandons a call: its exchange is closed and its callback will not run */
void sb_mcp_call_cancel(sb_mcp_call_t *c);

/** the upstream URL as configured (for messages) */
const char *sb_mcp_url(const sb_mcp_t *m);

#endif
