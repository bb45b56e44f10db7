/*
 * broker/authz: the capability manifest and the per-call check.
 *
 * A manifest is parsed once, strictly, when a token is minted (or when a
 * stored token record is loaded) and is immutable afterwards, so it may be
 * shared between threads. sb_authz_check runs on every call: deny by default,
 * own-key lookups only, an omitted axis grants nothing.
 */
#ifndef SB_AUTHZ_H
#define SB_AUTHZ_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "sb/status.h"
#include "sb/method.h"
#include "call/call.h"
#include "call/url.h"

typedef struct st_sb_manifest_t sb_manifest_t;

/**
 * Parses and validates a capability manifest (proto/PROTOCOL.md, "Manifest").
 * Unknown keys, wrong types, bad verbs, unsafe globs, malformed net entries and
 * oversized lists are errors. Thread-safe.
 * @param caps the JSON object (NULL or JSON null means the empty manifest)
 * @param out receives a reference the caller owns (release with
 *        sb_manifest_free). Manifests are interned: a parse that yields
 *        what an earlier, still referenced parse yielded returns that same
 *        object, so identical manifests take memory once.
 * @param err receives a message naming the offending path, e.g.
 *        "capabilities.data.collections.posts[1]: unknown verb \"drop\""
 * @return SB_OK, SB_E_BAD_ARGS (err filled) or SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_manifest_parse(const json_t *caps, sb_manifest_t **out, char *err, size_t errsz);
/** releases a reference from sb_manifest_parse (NULL is fine); the last one frees the manifest */
void sb_manifest_free(sb_manifest_t *m);
/**
 * The manifest as the broker enforces it, for the admin inspection routes:
 * the parsed form written back as a manifest that parses to the same grants
 * (globs normalised, hosts lowercased, IPv6 entries in their canonical form,
 * verbs in a fixed order, empty axes left out).
 * @return a new JSON object owned by the caller; aborts when out of memory
 */
json_t *sb_manifest_to_json(const sb_manifest_t *m);
/** how many distinct manifests are alive (tests and the token benchmark) */
size_t sb_manifest_interned_count(void);
/** capabilities.timeoutMs, or -1 when absent */
int64_t sb_manifest_timeout_ms(const sb_manifest_t *m);
/** capabilities.secrets: how many target secrets the run receives, and the i-th name (NUL-terminated, owned by m) */
size_t sb_manifest_secret_count(const sb_manifest_t *m);
const char *sb_manifest_secret_name(const sb_manifest_t *m, size_t i);

/**
 * The per-call check (PROTOCOL.md section 6), on the typed call: the check
 * reads the call and never changes it, so the handler receives exactly what
 * was granted.
 * @param m the run's manifest
 * @param call the decoded call (call/call.h); an error in the argument the
 *        check decides on (the call's SB_CALL_ERR_SUBJECT) is returned here,
 *        after any axis the check tests first
 * @param reason receives a human-readable reason on denial (NUL-terminated, truncated to reasonsz)
 * @return SB_OK when granted; SB_E_FORBIDDEN when denied; SB_E_BAD_ARGS when the
 *         argument needed for the decision is malformed (http.fetch url, a duplicate key)
 */
SB_WARN_UNUSED sb_status_t sb_authz_check(const sb_manifest_t *m, const sb_call_t *call, char *reason, size_t reasonsz);

/*
 * The questions a handler asks of the manifest after the check granted its
 * call (the check itself is sb_authz_check): every one is deny by default.
 */

/**
 * What files.list shows: an entry whose path matches a read glob, or a
 * directory some read glob lives under (the rule the check applies to the
 * listed path itself).
 * @param path a normalised path (call/path.h)
 */
int sb_authz_files_visible(const sb_manifest_t *m, const char *path, size_t len, int is_dir);
/** 1 when a tools glob grants the tool name (tools.list shows only those) */
int sb_authz_tool_granted(const sb_manifest_t *m, const char *name, size_t len);
/** what the net allowlist says of one request (PROTOCOL.md section 6.1) */
typedef enum en_sb_net_verdict_t {
    SB_NET_OK = 0,
    SB_NET_NO_HOST,      /* no entry admits the host and port */
    SB_NET_METHOD,       /* entries admit the host, none the method */
    SB_NET_PATH,         /* entries admit the host and method, none the path */
    SB_NET_PATH_ENCODING /* a paths rule applies and the path has %2F, %5C, %2E or a dot segment */
} sb_net_verdict_t;

/**
 * 1 when the net allowlist admits a request (PROTOCOL.md section 6): an entry
 * admits the URL's host and effective port, and its methods and paths rules
 * (when it has them) admit the method and the path. A redirect hop must pass
 * it as the first URL did.
 */
int sb_authz_fetch_allows(const sb_manifest_t *m, const sb_url_t *url, const char *method);
/** the same question, with the verdict (SB_NET_NO_HOST for a NULL manifest) */
sb_net_verdict_t sb_authz_fetch_verdict(const sb_manifest_t *m, const sb_url_t *url, const char *method);
/**
 * The reason of a refusal, naming the host and the rule that failed, never the
 * path (it is the guest's): e.g. http.fetch method "POST" is not allowed for
 * host "api.test:443" (net methods rule). `redirect` words it for a redirect hop.
 * @return the length written (NUL-terminated, truncated to bufsz)
 */
size_t sb_authz_fetch_reason(sb_net_verdict_t v, const sb_url_t *url, const char *method, int redirect, char *buf, size_t bufsz);

/*
 * Decide rules (capabilities.decide, PROTOCOL.md section 5a): calls the
 * manifest grants that also need the decider's allow. Asked only after
 * sb_authz_check granted the call, so a rule never widens a grant.
 */

/** 1 when the manifest has any decide rule (the RPC route skips everything else when it has none) */
int sb_authz_has_decide(const sb_manifest_t *m);
/**
 * 1 when a granted call needs a decision: a decide.methods pattern matches the
 * method (for the document store, under either of its names), or, for
 * http.fetch, a decide.fetch entry names the request's host, method and path.
 */
int sb_authz_needs_decision(const sb_manifest_t *m, const sb_call_t *call);
/** the same question for one http.fetch hop (a redirect must not reach, undecided, what a rule holds) */
int sb_authz_fetch_needs_decision(const sb_manifest_t *m, const sb_url_t *url, const char *method);

/**
 * Anchored glob match: "**" any run of characters including '/', "*" any run
 * without '/', "?" one character other than '/', everything else literal.
 * Runs in O(len(glob) * len(s)) time without recursion.
 * @return 1 on match, 0 otherwise
 */
int sb_glob_match(const char *glob, size_t glen, const char *s, size_t slen);

#endif
