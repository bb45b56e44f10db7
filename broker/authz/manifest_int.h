/*
 * broker/authz: the parsed manifest's accessors, for the check (check.c).
 * manifest.c owns the parsed form and defines these; nothing outside
 * broker/authz includes this header (handlers ask authz.h's questions).
 * Lookups are own-key byte comparisons; a NULL or empty axis grants nothing.
 */
#ifndef SB_MANIFEST_INT_H
#define SB_MANIFEST_INT_H

#include <stddef.h>
#include <netinet/in.h>
#include <jansson.h>
#include "authz/authz.h"
#include "call/url.h"

/* verbs as bits, positioned by the sb_method_op_t of the same name */
#define SB_MANIFEST_VERB_BIT(op) (1u << (unsigned)(op))

/** the verbs data.collections / data.globals / data.stores grant a name (SB_MANIFEST_VERB_BIT of read, create, ...) */
unsigned sb_manifest__collection_verbs(const sb_manifest_t *m, const char *name, size_t len);
unsigned sb_manifest__global_verbs(const sb_manifest_t *m, const char *name, size_t len);
unsigned sb_manifest__store_verbs(const sb_manifest_t *m, const char *name, size_t len);
/** 1 when services / jobs / workflows list the name */
int sb_manifest__has_service(const sb_manifest_t *m, const char *name, size_t len);
int sb_manifest__has_job(const sb_manifest_t *m, const char *name, size_t len);
int sb_manifest__has_workflow(const sb_manifest_t *m, const char *name, size_t len);
/** files.read globs: how many, whether one matches `path`, whether one lives under the directory `dir` */
size_t sb_manifest__files_read_count(const sb_manifest_t *m);
int sb_manifest__files_read_match(const sb_manifest_t *m, const char *path, size_t len);
int sb_manifest__files_write_match(const sb_manifest_t *m, const char *path, size_t len);
int sb_manifest__files_read_under(const sb_manifest_t *m, const char *dir, size_t len);
/** tools globs: how many, whether one matches the name */
size_t sb_manifest__tools_count(const sb_manifest_t *m);
int sb_manifest__tools_match(const sb_manifest_t *m, const char *name, size_t len);
/** net entries: how many */
size_t sb_manifest__net_count(const sb_manifest_t *m);
/** the net verdict on a request (authz.h, sb_authz_fetch_verdict) */
sb_net_verdict_t sb_manifest__net_verdict(const sb_manifest_t *m, const sb_url_t *u, const char *method);
/** 1 when the manifest has any decide rule */
int sb_manifest__decide_any(const sb_manifest_t *m);
/** 1 when some decide rule may name a call of this family (sb_method_kind_t) */
int sb_manifest__decide_kind(const sb_manifest_t *m, int kind);
/** 1 when a decide.methods pattern matches the method string */
int sb_manifest__decide_method_match(const sb_manifest_t *m, const char *method, size_t len);
/** 1 when a decide.fetch entry names the request (host and port, then its methods and paths rules) */
int sb_manifest__decide_fetch_match(const sb_manifest_t *m, const sb_url_t *u, const char *method);
/** 1 when s is a secret name, [A-Za-z0-9_.-]{1,64} */
int sb_manifest__is_secret_name(const char *s, size_t len);

/*
 * Method and path rules, shared by net entries and secrets (PROTOCOL.md
 * section 5): an empty list admits anything. Methods are uppercase HTTP
 * tokens; paths are globs (sb_glob_match) over the request path.
 */
typedef struct st_sb_http_rules_t {
    char **methods;
    size_t nmethods;
    char **paths;
    size_t npaths;
} sb_http_rules_t;

/* one net (or import) allowlist entry: host[:port], *.suffix[:port], [v6][:port] or bare v6, with its rules */
typedef struct st_sb_net_entry_t {
    char host[SB_URL_MAX_HOST + 1]; /* lowercase; for a wildcard the suffix without "*."; for v6 the inet_ntop form */
    size_t host_len;
    int wildcard;
    int is_v6;
    struct in6_addr v6;
    uint16_t port; /* 0: any port */
    sb_http_rules_t rules;
} sb_net_entry_t;

/**
 * Parses an array of net entries at `path` ("capabilities.net", "secrets.x.hosts"):
 * strings, and (objects) {host, methods?, paths?} objects too.
 * @return SB_OK, SB_E_BAD_ARGS (err names the entry) or SB_E_NOMEM; *out is owned by the caller either way
 */
SB_WARN_UNUSED sb_status_t sb_manifest__parse_net(const json_t *v, const char *path, int objects, sb_net_entry_t **out, size_t *n,
                                                  char *err, size_t errsz);
void sb_manifest__free_net(sb_net_entry_t *v, size_t n);
/** parses "methods" and "paths" (either may be NULL) at `path` */
SB_WARN_UNUSED sb_status_t sb_manifest__parse_rules(const json_t *methods, const json_t *paths, const char *path,
                                                    sb_http_rules_t *r, char *err, size_t errsz);
void sb_manifest__free_rules(sb_http_rules_t *r);
/** 1 when the entry admits the URL's host and effective port (rules aside) */
int sb_manifest__entry_host_matches(const sb_net_entry_t *e, const sb_url_t *u);
/** SB_NET_OK, or the rule (SB_NET_METHOD, SB_NET_PATH, SB_NET_PATH_ENCODING) that refuses the request */
sb_net_verdict_t sb_manifest__rules_verdict(const sb_http_rules_t *r, const sb_url_t *u, const char *method);
/** 1 when every host and port `e` admits is admitted by some net entry of the manifest */
int sb_manifest__net_covers(const sb_manifest_t *m, const sb_net_entry_t *e);

#endif
