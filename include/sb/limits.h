/*
 * sandbox-broker: the size caps that cross a boundary, in one place.
 *
 * What is here: every cap of the wire (requests, responses, frames, values:
 * the caps of proto/PROTOCOL.md section 8), and every cap that more than one
 * module or component enforces or sizes a buffer by (the shim, proto/ and the
 * broker's modules read them from here, never from a copy). Values marked
 * "upstream" are the wire budgets of the upstream broker that we are a drop-in
 * for; the rest are ours.
 *
 * What is not here: a cap that one module alone checks lives beside the code
 * that checks it, named after the module, in its header when tests or other
 * files of the module need it, else in its .c. Today: broker/call/call.h
 * (SB_CALL_MAX_*: reasons, tool arguments, fetch header bytes, sort, offset),
 * call/where.h (SB_WHERE_MAX_*: where depth, conditions, IN lists),
 * call/url.c (raw host, label), svc/pg/pg_query.h (SB_PG_MAX_*: SQL,
 * parameters), svc/pg/pg_int.h (queue), svc/tools/tools.c (SB_TOOLS_MAX_*:
 * MCP list and result sizes, pages, cursor), svc/tools/mcp_client.h and
 * mcp_wire.h (session id, event type, request), svc/files/files.c, files_fs.c and
 * files_path.h (listing, write depth, queue, scope key), http/reply.h (error
 * bodies), fetch/client.h (SB_MAX_RESPONSE_HEAD), fetch/ipclass.h (CIDR
 * entries), authz/manifest.c (timeout, memory),
 * obs/audit.h (SB_AUDIT_BUFFER), obs/metrics.h and .c, and the shim's own
 * SB_SHIM_MAX_* in the headers of supervisor-shim/ (shared by its rooms). scripts/checksrc refuses
 * a cap a header defines and a file outside its folder uses, unless it is
 * defined here or from a cap here.
 *
 * Every size that comes from the guest, the network, the database or DNS is
 * checked against one of these caps before anything is allocated for it.
 */
#ifndef SB_LIMITS_H
#define SB_LIMITS_H

#include <stdint.h>

/* upstream: decoded http.fetch body */
#define SB_MAX_HTTP_BODY 5242880u
/* upstream: base64 of the above, 4 * ceil(cap / 3) */
#define SB_MAX_HTTP_BODY_B64 6990508u
/* upstream: the largest RPC request or response on the wire */
#define SB_MAX_RPC_WIRE 7121580u
/* upstream: request cap for every method but http.fetch and tools.* */
#define SB_MAX_NATIVE_REQUEST 65536u
/* upstream: request cap of tools.call and tools.list */
#define SB_MAX_TOOLS_CALL_REQUEST 68608u
#define SB_MAX_TOOLS_LIST_REQUEST 4096u
/* upstream: response wire cap of everything but http.fetch */
#define SB_MAX_NATIVE_RESPONSE 790528u
/* upstream: result value caps */
#define SB_MAX_NATIVE_RESULT 786432u
#define SB_MAX_HTTP_RESULT 7117484u
/* upstream: one stdio frame, RPC wire cap + 1024 */
#define SB_MAX_FRAME 7122604u

/* h2o refuses (plain 413) anything above this before our handler sees it */
#define SB_MAX_HTTP_ENTITY (8u * 1024u * 1024u)
/* method string, in bytes (upstream) */
#define SB_MAX_METHOD_LEN 256u
/* nesting of any decoded value (msgpack-c cannot go deeper) */
#define SB_MAX_DEPTH 32u
/* "and"/"or" levels of a collection's where (broker/call/where.h checks it; the decider's call
 * description, broker/svc/decide, writes a where back within it) */
#define SB_MAX_WHERE_DEPTH 8u
/* nodes (scalars + containers) of any decoded request value */
#define SB_MAX_NODES 100000u
/* correlation ids: ^[\w-]{1,128}$ */
#define SB_MAX_CORRELATION_ID 128u
/* an X-Request-Id the broker logs and echoes: 1-128 bytes of [A-Za-z0-9._:-] */
#define SB_MAX_REQUEST_ID 128u
/* live tokens one run inspection lists (GET /admin/v1/runs/<runId>) */
#define SB_MAX_INSPECT_TOKENS 100u

/* manifests: entries per list or map, and bytes per string */
#define SB_MAX_MANIFEST_ENTRIES 256u
#define SB_MAX_MANIFEST_STRING 512u
/* a serialised manifest (admin request body cap is derived from it) */
#define SB_MAX_MANIFEST_BYTES 65536u
/* a run's secrets (PROTOCOL.md section 5, "Secrets"): how many, name and value bytes, and the mint-body room they take
   (a value's JSON text may be up to twice its bytes, plus its rules) */
#define SB_MAX_SECRETS 32u
#define SB_MAX_SECRET_NAME 64u
#define SB_MAX_SECRET_VALUE 8192u
/* secret placeholders in one http.fetch request's header values (the typed call bounds them, the audit line lists their names) */
#define SB_MAX_FETCH_PLACEHOLDERS 64u
#define SB_MAX_SECRETS_BODY (SB_MAX_SECRETS * (2u * SB_MAX_SECRET_VALUE + 4096u))
#define SB_MAX_ADMIN_BODY (SB_MAX_MANIFEST_BYTES + 8192u + SB_MAX_SECRETS_BODY)
/* a stored token record: the manifest, the rest of the record, and the sealed secrets (base64 of nonce, value, tag) */
#define SB_MAX_TOKEN_RECORD (SB_MAX_MANIFEST_BYTES + 8192u + SB_MAX_SECRETS * (SB_MAX_SECRET_VALUE * 4u / 3u + 4096u))
/* run ids, target names and scope values */
#define SB_MAX_RUN_ID 256u
#define SB_MAX_TARGET_NAME 128u
#define SB_MAX_SCOPE_ENTRIES 16u
#define SB_MAX_SCOPE_VALUE 256u
/* file paths handed to the files axis */
#define SB_MAX_PATH 4096u
/* a URL handed to http.fetch */
#define SB_MAX_URL 8192u
/* a host name: a DNS name is at most 253 bytes without the trailing dot (RFC 1035 section 2.3.4); the URL
   parser's output (call/url.h), the manifest's net entries and the MCP client's upstream all hold one */
#define SB_MAX_HOST 253u
/* a name segment of a method and a name in a manifest list: [A-Za-z0-9_-]{1,128} (proto/method.c, authz/) */
#define SB_MAX_NAME 128u
/* a tool name, as the typed call (call/call.c) and the tools handler (svc/tools/tools.c) bound it */
#define SB_MAX_TOOL_NAME 256u
/* an http.fetch request's method token and header entries: the typed call (call/call.c) bounds them,
   the handler (svc/fetch/fetch.c) writes them */
#define SB_MAX_FETCH_METHOD 32u
#define SB_MAX_FETCH_HEADERS 64u
/* a handler's error message (call/result.h), which the tools handler (svc/tools/tools.c) composes */
#define SB_MAX_RESULT_MESSAGE 512u
/* headers of an upstream HTTP response: the reader (fetch/http1.c) refuses more, the http.fetch handler
   (svc/fetch/fetch.c) copies them */
#define SB_MAX_RESPONSE_HEADERS 100u
/* DNS answers per family that are read and validated (fetch/resolver.c); a reply with more is refused; the
   http.fetch handler (svc/fetch/) pins what they give */
#define SB_MAX_DNS_ANSWERS 32
/* the decider (svc/decide/, PROTOCOL.md section 5a): the call description sent, the answer read (the
   parser and its fuzz harness bound it), the deny reason passed back to the guest, decisions kept per
   worker for reuse, and the per-instance bound on calls waiting for a decision (the config's
   decider.max_pending default) */
#define SB_MAX_DECIDE_REQUEST 16384u
#define SB_MAX_DECIDE_ANSWER 4096u
#define SB_MAX_DECIDE_REASON 256u
#define SB_MAX_DECIDE_CACHE 1024u
#define SB_MAX_DECIDE_PENDING 4096u

/* a log, audit or timeline line (obs/log.h writes them); the run timeline (store/timeline.c,
   store_redis_timeline.c) keeps events of at most this size and refuses longer ones read back */
#define SB_LOGLINE_MAX 2048

/* the largest cap an sb_buf_t takes (buf.h; proto/buf.c): room for the NUL, and no sum or doubling
 * of sizes below it overflows */
#define SB_BUF_MAX_CAP (SIZE_MAX / 4)

#endif
