/*
 * broker/svc/tools/mcp_wire: the bytes an MCP Streamable HTTP server answers with.
 *
 * An MCP server answers a POSTed JSON-RPC request either with one JSON object
 * (Content-Type: application/json) or with a Server-Sent Events stream
 * (Content-Type: text/event-stream) whose events each carry one JSON-RPC
 * message; notifications and server requests may come before the response
 * (MCP 2025-06-18, basic/transports, "Sending Messages to the Server").
 * This module finds the response to one request id in such a body and checks
 * it against JSON-RPC 2.0 (section 5, "Response object").
 *
 * Everything here is pure (no sockets, no loop), so it is unit-tested and
 * fuzzed on its own (tests/unit/mcp_wire.c, fuzz/fuzz_sse.c). Every buffer is
 * an sb_buf_t bounded by a cap the caller gives, checked before it grows.
 */
#ifndef SB_MCP_WIRE_H
#define SB_MCP_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <msgpack.h>
#include "sb/buf.h"
#include "sb/limits.h"
#include "sb/status.h"

/* the longest SSE event type we keep; longer ones are not "message" and are ignored */
#define SB_SSE_MAX_EVENT_TYPE 64u
/* slack for the JSON-RPC envelope around a result ({"jsonrpc":"2.0","id":N,"result":...}) */
#define SB_MCP_ENVELOPE_SLACK 1024u
/*
 * the largest POST we send an MCP server: the JSON text of the largest tools.call request (at most six
 * bytes of JSON per byte of msgpack, a control character in a string written as \u00XX) and the head
 * (target, host, session id, version)
 */
#define SB_MCP_MAX_REQUEST (6u * SB_MAX_TOOLS_CALL_REQUEST + SB_MAX_URL + 4096u)

/**
 * Called once per dispatched SSE event.
 * @param type the event type ("message" when the stream named none); not NUL-terminated
 * @param data the event's data lines joined with LF; not NUL-terminated
 * @return 0 to go on, non-zero to stop parsing (sb_sse_feed then returns SB_OK with *stopped set)
 */
typedef int (*sb_sse_event_cb)(void *arg, const char *type, size_t type_len, const char *data, size_t data_len);

/**
 * An incremental event-stream parser (WHATWG HTML, "Interpreting an event
 * stream"): lines end in CRLF, LF or CR (a CRLF split across two feeds is one
 * line end), one leading BOM is ignored, ':' lines are comments, "data"
 * fields append their value and LF to the data buffer, "event" sets the type,
 * other fields ("id", "retry", unknown) are ignored, and a blank line
 * dispatches the event when its data buffer is not empty. Bytes are never
 * held as lines: the data buffer grows with the value bytes and stops at the
 * cap. Plain value type; sb_sse_dispose frees its buffer.
 */
typedef struct st_sb_sse_t {
    sb_buf_t data; /* the event's data buffer, capped at max_data + 1 (the data and its last line's LF) */
    char type[SB_SSE_MAX_EVENT_TYPE];
    size_t type_len;
    int type_overflow; /* the event field was longer than SB_SSE_MAX_EVENT_TYPE */
    char name[8];      /* the field name so far (only "data" and "event" matter) */
    size_t name_len;
    int state;
    int field;
    int after_cr; /* the previous byte was CR: a LF right after it ends nothing */
    int bom;      /* BOM bytes matched so far; 3 once the stream start is past */
    int have_data;
} sb_sse_t;

/** prepares a parser whose data buffer never exceeds max_data bytes */
void sb_sse_init(sb_sse_t *p, size_t max_data);
void sb_sse_dispose(sb_sse_t *p);

/**
 * Parses more bytes, calling cb for each event they complete.
 * @param stopped set to 1 when cb asked to stop (the rest of the bytes is not parsed); may be NULL
 * @return SB_OK, SB_E_TOO_LARGE (an event's data exceeds the cap), SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_sse_feed(sb_sse_t *p, const char *bytes, size_t len, sb_sse_event_cb cb, void *arg, int *stopped);

/**
 * Appends the HTTP/1.1 POST that carries one JSON-RPC message to an MCP
 * server (MCP 2025-06-18, basic/transports, "Sending Messages to the
 * Server"): Content-Type application/json, an Accept listing both
 * application/json and text/event-stream, Connection: close (every exchange
 * uses a fresh connection), then the body. The strings are header values the
 * caller has checked (a parsed URL, a session id of visible characters).
 * @param sid the Mcp-Session-Id to send ("Session Management"), or NULL for none
 * @param version the MCP-Protocol-Version to send ("Protocol Version Header"), or NULL for none
 * @return SB_OK, SB_E_TOO_LARGE (the request would pass out's cap) or
 *         SB_E_NOMEM; on failure `out` holds exactly what it held before
 */
SB_WARN_UNUSED sb_status_t sb_mcp_build_request(sb_buf_t *out, const char *target, const char *host_header, const char *user_agent,
                                                const char *sid, const char *version, const char *body, size_t body_len);

/** the body kinds an MCP server may answer a request with */
typedef enum en_sb_mcp_body_t { SB_MCP_BODY_OTHER = 0, SB_MCP_BODY_JSON, SB_MCP_BODY_SSE } sb_mcp_body_t;

/** classifies a Content-Type value (media type compared without case, parameters ignored) */
sb_mcp_body_t sb_mcp_body_kind(const char *ctype, size_t len);

/**
 * Finds the JSON-RPC response to request `id` in a response body and checks
 * it: an object with "jsonrpc":"2.0", the same integer id, and exactly one of
 * "result" (an object) and "error" ({code: integer, message: string}).
 * Other messages (notifications, server requests, responses to other ids, and
 * SSE events of other types or with empty data) are skipped. A JSON body may
 * also be a batch array (MCP 2025-03-26).
 * @param kind how the body is encoded (sb_mcp_body_kind)
 * @param max_msg the largest one message may be, in bytes of JSON text
 * @param out receives the result object, packed as msgpack (appended)
 * @param err receives a description of any failure (upstream text is cut and sanitised)
 * @return SB_OK; SB_E_EXECUTION for a JSON-RPC error response; SB_E_TOO_LARGE when a
 *         message exceeds max_msg; SB_E_BAD_ARGS when the body is malformed or holds no
 *         response to `id`; SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_mcp_pick_response(sb_mcp_body_t kind, const char *body, size_t len, int64_t id, size_t max_msg,
                                                msgpack_sbuffer *out, char *err, size_t errsz);

/**
 * Best effort for an HTTP error answer: writes "JSON-RPC error <code>: <message>"
 * when `body` is a JSON object with such an error (as MCP servers send with 4xx),
 * else nothing.
 * @return the length written (0 when the body says nothing useful)
 */
size_t sb_mcp_error_hint(const char *body, size_t len, char *out, size_t outsz);

/**
 * Copies at most `max` bytes of untrusted text into out (NUL-terminated),
 * replacing control characters with '?' and never cutting a UTF-8 sequence.
 * @return the length written
 */
size_t sb_mcp_sanitize(const char *s, size_t len, size_t max, char *out, size_t outsz);

#endif
