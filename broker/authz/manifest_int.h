/*
 * broker/authz: the parsed manifest's accessors, for the check (check.c).
 * manifest.c owns the parsed form and defines these; nothing outside
 * broker/authz includes this header (handlers ask authz.h's questions).
 * Lookups are own-key byte comparisons; a NULL or empty axis grants nothing.
 */
#ifndef SB_MANIFEST_INT_H
#define SB_MANIFEST_INT_H

#include <stddef.h>
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
/** net entries: how many, whether one admits the URL's host and effective port */
size_t sb_manifest__net_count(const sb_manifest_t *m);
int sb_manifest__net_allows(const sb_manifest_t *m, const sb_url_t *u);

#endif
