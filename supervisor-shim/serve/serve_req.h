/*
 * sandbox-shim serve: the POST /run request, from body bytes to a typed run.
 *
 * No I/O and no service state, so that fuzz/fuzz_serve_request.c runs exactly
 * what serve.c runs. The body is decoded once (sb_serve_req_decode), its mode
 * read (sb_serve_req_is_host: serve then checks the admission header), then
 * checked against the strict schema of supervisor-shim/README.md ("POST /run")
 * into a sb_serve_run_t whose pointers borrow from the decoded tree; the init
 * frame the guest gets is packed from that same typed run.
 */
#ifndef SB_SERVE_REQ_H
#define SB_SERVE_REQ_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <msgpack.h>
#include "sb/status.h"
#include "relay/modules.h"

/* the request body (upstream: 2 MiB) */
#define SB_SERVE_MAX_BODY (2u * 1024u * 1024u)
/* schema limits (upstream's /run wire) */
#define SB_SERVE_MAX_SOURCE (1024u * 1024u)
#define SB_SERVE_MAX_HOSTS 32u     /* per list (net, import) and in all */
#define SB_SERVE_MAX_HOST_LEN 253u /* UTF-16 code units, as JavaScript counts them */
#define SB_SERVE_MIN_TIMEOUT_MS 1
#define SB_SERVE_MAX_TIMEOUT_MS 30000
#define SB_SERVE_DEFAULT_TIMEOUT_MS 5000
#define SB_SERVE_MIN_MEMORY_MB 16
#define SB_SERVE_MAX_MEMORY_MB 1024
#define SB_SERVE_DEFAULT_MEMORY_MB 128
#define SB_SERVE_MAX_SECRETS 64u
#define SB_SERVE_MAX_SECRET_VALUE 65536u
#define SB_SERVE_MAX_SECRETS_TOTAL 262144u /* names and values */
#define SB_SERVE_MAX_INPUT_DEPTH 32u       /* the input is depth 0; no node below depth 32 */
#define SB_SERVE_MAX_INPUT_NODES 10000u
#define SB_SERVE_MAX_INPUT_BYTES (1024u * 1024u) /* upstream's estimate, see serve_req.c */
#define SB_SERVE_MAX_URL 2048u
#define SB_SERVE_MAX_TOKEN 8192u

/** a /run request that passed the schema; every pointer borrows from the decoded tree */
typedef struct st_sb_serve_run_t {
    const char *source; /* UTF-8, may hold NUL */
    size_t source_len;
    const json_t *input;   /* JSON null when absent */
    const json_t *net;     /* array of strings, or NULL when absent */
    const json_t *imports; /* array of strings, or NULL when absent */
    int64_t timeout_ms;
    unsigned memory_mb;
    const json_t *secrets; /* object of strings, or NULL */
    int has_bindings;
    const char *url; /* bindings.url (NUL-terminated, no NUL inside) */
    size_t url_len;
    const char *token; /* bindings.token */
    size_t token_len;
} sb_serve_run_t;

/**
 * Decodes the body as JSON, once: strict UTF-8, duplicate keys refused, any
 * top-level value. Numbers become doubles, as JavaScript's JSON.parse makes
 * them. Nesting and value count are bounded by a scan of the text before
 * jansson allocates anything.
 * @param out receives the tree (new reference) on SB_OK
 * @return SB_OK; SB_E_BAD_ARGS (not JSON: "invalid JSON body"); SB_E_TOO_LARGE (valid or not,
 *         too deep or too many values for any valid request)
 */
SB_WARN_UNUSED sb_status_t sb_serve_req_decode(const char *body, size_t len, json_t **out);

/** 1 when the decoded body is an object whose "mode" is the string "host" */
int sb_serve_req_is_host(const json_t *root);

/**
 * Checks the strict schema (README.md, "POST /run").
 * @param why on failure, a static description of the first violation (for tests and
 *        the fuzzer; the client only ever sees "invalid sandbox request")
 * @return SB_OK (out filled) or SB_E_BAD_ARGS
 */
SB_WARN_UNUSED sb_status_t sb_serve_req_validate(const json_t *root, sb_serve_run_t *out, const char **why);

/**
 * Packs the guest's init frame (PROTOCOL.md section 2), header included:
 * {t:"init", source, input, bindings, fetch, secrets, imports?} (secrets an empty map when there are none).
 * @param bindings 1: the guest gets `questpie`
 * @param fetch 1: the guest's fetch is relayed as http.fetch
 * @param imports the run's import origins, or NULL: with some, the frame's `imports` names them
 * @return SB_OK or SB_E_TOO_LARGE (above SB_MAX_FRAME: cannot happen within the schema's caps)
 */
SB_WARN_UNUSED sb_status_t sb_serve_req_pack_init(const sb_serve_run_t *run, int bindings, int fetch,
                                                  const sb_shim_imports_t *imports, msgpack_sbuffer *frame);

/** 1 when the token can travel in an HTTP header: 1..8192 visible ASCII bytes */
int sb_serve_token_ok(const char *token, size_t len);

#endif
