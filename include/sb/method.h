/*
 * sandbox-broker: the RPC method grammar (proto/PROTOCOL.md, "Methods").
 *
 * Shared by the broker (dispatch, capability check) and the shim (per-method
 * frame caps), so both sides agree on what a method string means.
 */
#ifndef SB_METHOD_H
#define SB_METHOD_H

#include <stddef.h>
#include "sb/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum en_sb_method_kind_t {
    SB_MK_FILES = 0,   /* files.(read|write|list) */
    SB_MK_COLLECTIONS, /* collections.<name>.(find|findOne|create|update|delete) */
    SB_MK_STORE,       /* store.<ns>.(find|findOne|create|update|delete) */
    SB_MK_GLOBALS,     /* globals.<name>.(get|set) */
    SB_MK_SERVICES,    /* services.<name>.<fn> */
    SB_MK_JOBS,        /* jobs.enqueue.<name> */
    SB_MK_WORKFLOWS,   /* workflows.trigger.<name> */
    SB_MK_EMAIL,       /* email.send */
    SB_MK_HTTP,        /* http.fetch */
    SB_MK_TOOLS,       /* tools.(list|call) */
    SB_MK_IMPORT,      /* import.fetch: one ES module of the run's import hosts (PROTOCOL.md section 6c) */
    SB_MK_COUNT_
} sb_method_kind_t;

typedef enum en_sb_method_op_t {
    SB_OP_READ = 0,
    SB_OP_WRITE,
    SB_OP_LIST,
    SB_OP_FIND,
    SB_OP_FIND_ONE,
    SB_OP_CREATE,
    SB_OP_UPDATE,
    SB_OP_DELETE,
    SB_OP_GET,
    SB_OP_SET,
    SB_OP_CALL,    /* services.<n>.<fn>, tools.call */
    SB_OP_ENQUEUE, /* jobs.enqueue */
    SB_OP_TRIGGER, /* workflows.trigger */
    SB_OP_SEND,    /* email.send */
    SB_OP_FETCH,   /* http.fetch, import.fetch */
    SB_OP_COUNT_
} sb_method_op_t;

/**
 * A parsed method. name and fn point into the caller's method string (not
 * NUL-terminated); they live as long as that string.
 */
typedef struct st_sb_method_t {
    sb_method_kind_t kind;
    sb_method_op_t op;
    /* collection, store namespace, global, service, job or workflow name; empty otherwise */
    const char *name;
    size_t name_len;
    /* service function; empty otherwise */
    const char *fn;
    size_t fn_len;
} sb_method_t;

/**
 * Parses a method string. Segments are separated by '.', names are
 * [A-Za-z0-9_-]{1,128}; anything else is not a method.
 * @param s the method bytes (need not be NUL-terminated)
 * @param len their length; more than SB_MAX_METHOD_LEN is refused
 * @param out filled on success
 * @return SB_OK, or SB_E_BAD_METHOD
 */
SB_WARN_UNUSED sb_status_t sb_method_parse(const char *s, size_t len, sb_method_t *out);

/** the largest whole RPC request (wire bytes) this method may send; NULL: a method that does not parse (the native cap) */
size_t sb_method_request_cap(const sb_method_t *m);
/** the largest whole RPC response (wire bytes) this method may receive */
size_t sb_method_response_cap(const sb_method_t *m);
/** the largest request for a method string that may not parse (the shim's frame cap) */
size_t sb_method_request_cap_str(const char *s, size_t len);

/** "read", "findOne", ... */
const char *sb_method_op_name(sb_method_op_t op);
/** "files", "collections", ... */
const char *sb_method_kind_name(sb_method_kind_t kind);

#ifdef __cplusplus
}
#endif
#endif
