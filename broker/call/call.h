/*
 * broker/call: the typed call.
 *
 * A call's args are decoded once, straight after the method grammar, into
 * the struct of the method's family: the files path in the normal form the
 * capability check matches and the handler opens, the parsed http.fetch URL,
 * the collection operation with its where tree, the tool name and its
 * arguments. authz/ decides on this struct and the handler consumes the same
 * struct; neither reads the raw msgpack args again for anything decoded
 * here, so what is checked is exactly what is used (no second parser with
 * rules of its own).
 *
 * A bad argument is refused by the decoder with its exact error, which the
 * call carries. Where that error is answered follows the wire's validation
 * order (PROTOCOL.md section 3), which decodes first and answers in order:
 *  - SB_CALL_ERR_NOW: before the check (no memory to decode with);
 *  - SB_CALL_ERR_SUBJECT: an error in the argument the capability check
 *    decides on (files path, http.fetch url, tools.call name, document-store
 *    namespace); the check answers it at the point where it needs that
 *    argument, after any axis it checks first ("http.fetch requires a net
 *    allowlist" comes before "url is invalid");
 *  - SB_CALL_ERR_ARGS: any other argument error; answered once the call is
 *    granted and its handler is known to exist (not_implemented first),
 *    never handed to a handler.
 *
 * Lifetime: the family structs and everything they point to live in the
 * zone given to sb_call_decode and in the args object; the call is valid as
 * long as both are. The RPC route keeps them until the handler has answered.
 */
#ifndef SB_CALL_H
#define SB_CALL_H

#include <stddef.h>
#include <stdint.h>
#include <msgpack.h>
#include "sb/limits.h"
#include "sb/method.h"
#include "sb/status.h"
#include "call/placeholder.h"
#include "call/url.h"
#include "call/where.h"

#define SB_CALL_MAX_REASON 512u
/* tools.call: names, as upstream's custom-tools handler bounds them, and arguments as packed msgpack */
#define SB_CALL_MAX_TOOL_NAME SB_MAX_TOOL_NAME
#define SB_CALL_MAX_TOOL_ARGUMENTS 64512u
/* http.fetch request: method token, header entries and bytes */
#define SB_CALL_MAX_FETCH_METHOD SB_MAX_FETCH_METHOD
#define SB_CALL_MAX_FETCH_HEADERS SB_MAX_FETCH_HEADERS
#define SB_CALL_MAX_FETCH_HEADER_BYTES 65536u
/* secret placeholders in one http.fetch request's header values, at most */
#define SB_CALL_MAX_FETCH_PLACEHOLDERS SB_MAX_FETCH_PLACEHOLDERS
/* collections: sort fields, and the largest offset */
#define SB_CALL_MAX_SORT 8u
#define SB_CALL_MAX_OFFSET 100000u
/* how much of a guest key an error message echoes (cut on a code point boundary) */
#define SB_CALL_ECHO_KEY 32u

typedef enum en_sb_call_err_stage_t {
    SB_CALL_ERR_NONE = 0,
    SB_CALL_ERR_NOW,     /* answered before the capability check */
    SB_CALL_ERR_SUBJECT, /* answered by the capability check, where it needs the argument */
    SB_CALL_ERR_ARGS     /* answered after the grant, before any handler */
} sb_call_err_stage_t;

/** a field name and its value (collections data, a document's fields) */
typedef struct st_sb_call_field_t {
    const char *name; /* not NUL-terminated */
    size_t len;
    const msgpack_object *value;
} sb_call_field_t;

/** one sort key: a field name, descending when the guest wrote "-name" */
typedef struct st_sb_call_sort_t {
    const char *name; /* without the "-"; may be empty ("-" alone names no field) */
    size_t len;
    int desc;
} sb_call_sort_t;

/** one select entry: a field name, and whether it is wanted ({field: true}; an array entry always is) */
typedef struct st_sb_call_select_t {
    const char *name;
    size_t len;
    int wanted;
} sb_call_select_t;

/** files.read / files.write / files.list */
typedef struct st_sb_call_files_t {
    int has_path; /* files.list may name no path (the root) */
    /* the path in the check's normal form (call/path.h), NUL-terminated: the bytes the globs match and the handler opens */
    char path[SB_MAX_PATH + 1];
    size_t path_len;
    /* files.write: the bytes to write (decoded from base64 for contentBase64) */
    const uint8_t *content;
    size_t content_len;
} sb_call_files_t;

/** collections.<name>.*, store.<ns>.*, collections.document_store.* */
typedef struct st_sb_call_data_t {
    int docstore; /* the document store (store.<ns>.* or collections.document_store.*) */
    /* the document-store namespace, NUL-terminated: the method's <ns>, or where.store / the top-level store of the args */
    const char *ns;
    size_t ns_len;
    const sb_where_t *where; /* NULL: no where */
    /* create / update: the fields to write (create: may be empty) */
    const sb_call_field_t *data;
    size_t ndata;
    /* find: the page; has_limit 0 means the collection's default */
    int has_limit;
    uint64_t limit; /* not yet clamped to the collection's max_limit */
    uint64_t offset;
    /* find, findOne */
    const sb_call_sort_t *sort;
    size_t nsort;
    int has_select;
    const sb_call_select_t *select;
    size_t nselect;
} sb_call_data_t;

/** tools.list / tools.call */
typedef struct st_sb_call_tools_t {
    const char *name; /* tools.call: 1-256 bytes, not NUL-terminated */
    size_t name_len;
    const msgpack_object *arguments; /* tools.call: a map representable as JSON, at most 63 KiB packed; NULL when absent */
} sb_call_tools_t;

/**
 * One request header of http.fetch, with the secret placeholders found in its
 * value (call/placeholder.h), which the fetch hop machine fills in or refuses
 * on every hop.
 */
typedef struct st_sb_call_header_t {
    const char *name; /* lowercased HTTP token, NUL-terminated */
    size_t name_len;
    const char *value; /* no control characters; not NUL-terminated */
    size_t value_len;
    const sb_placeholder_t *ph; /* in value order; NULL when nph is 0 */
    size_t nph;
} sb_call_header_t;

/** a secret name a call's placeholders use (not NUL-terminated; grammar-checked) */
typedef struct st_sb_call_name_t {
    const char *name;
    size_t len;
} sb_call_name_t;

/**
 * http.fetch. The check decides on the whole request (today the URL's host
 * and port against net; a net entry may later also restrict the method and
 * the path, which are here already), and the handler sends this request.
 */
typedef struct st_sb_call_fetch_t {
    sb_url_t url;                              /* parsed once by the strict parser */
    char method[SB_CALL_MAX_FETCH_METHOD + 1]; /* uppercased token, "GET" when absent */
    const sb_call_header_t *headers;           /* the broker-owned and hop-by-hop names already dropped */
    size_t nheaders;
    const sb_call_name_t *secrets; /* the distinct secret names the placeholders use (the audit line lists them) */
    size_t nsecrets;
    const uint8_t *body; /* decoded bytes, at most SB_MAX_HTTP_BODY */
    size_t body_len;
} sb_call_fetch_t;

typedef struct st_sb_call_t {
    sb_method_t m;      /* the grammar's reading of the method */
    const char *method; /* the method as sent (for messages), not NUL-terminated */
    size_t method_len;
    int binary;      /* msgpack request: binary values arrive as bin, and replies carry bin */
    const char *cid; /* the correlation id of the call (set by the route; NULL elsewhere) */
    /*
     * The request came on the supervisor's module path (PROTOCOL.md section
     * 6c: the x-sandbox-module-fetch header, which a supervisor never relays
     * for a guest), set by the route; import.fetch is refused without it.
     */
    int module_path;
    /* the first argument error, if any (see the header comment) */
    sb_call_err_stage_t err_stage;
    sb_status_t err_status;
    char err[SB_CALL_MAX_REASON];
    /* the family's decoded args: exactly one is set, matching m.kind (files, collections and store, tools, http) */
    sb_call_files_t *files;
    sb_call_data_t *data;
    sb_call_tools_t *tools;
    sb_call_fetch_t *fetch; /* http.fetch, and import.fetch (GET, no headers, no body) */
} sb_call_t;

/**
 * Decodes a call's args for its method.
 * @param call filled (everything, errors included)
 * @param m the parsed method; `method` the string it was parsed from (both must outlive the call)
 * @param args the args object, or NULL when the request had none
 * @param binary the request was msgpack
 * @param zone what the decoded parts are allocated from
 * @return SB_OK, or the status of the error the call now carries (call->err_stage says when it is answered)
 */
sb_status_t sb_call_decode(sb_call_t *call, const sb_method_t *m, const char *method, size_t method_len, const msgpack_object *args,
                           int binary, msgpack_zone *zone);

#endif
