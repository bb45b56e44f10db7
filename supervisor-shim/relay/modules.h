/*
 * sandbox-shim: the guest's module path (capabilities.import; proto/PROTOCOL.md section 2,
 * "Modules", and section 6c).
 *
 * Deno has no socket that leaves the jail. Each import origin of the run ("https://host[:port]")
 * gets a port of its own on 127.0.0.1 inside the guest's private network namespace (the jail makes
 * the listeners there before the guest starts: jail/child.c), and an import map sends every module
 * URL of that origin to its port. The relay answers those requests (relay.c) by fetching each
 * module through the broker's import.fetch, under the run's token: every byte comes through the
 * broker's egress, authorized by the run's import list and by nothing else.
 *
 * This file holds the pieces that only read and write bytes: the origins, the import map and
 * --allow-import value handed to Deno, and the parser of a module request.
 */
#ifndef SB_SHIM_MODULES_H
#define SB_SHIM_MODULES_H

#include <stddef.h>
#include <stdint.h>
#include <msgpack.h>
#include "sb/buf.h"
#include "sb/status.h"

/* serve takes at most 32 hosts for net and import together (upstream's schema) */
#define SB_SHIM_MAX_IMPORT_ORIGINS 32u
/* origin i listens on 127.0.0.1:(SB_SHIM_IMPORT_PORT_BASE + i) in the guest's network namespace */
#define SB_SHIM_IMPORT_PORT_BASE 41000u
/* "https://" + a 253-byte name or a bracketed IPv6 address + ":65535" */
#define SB_SHIM_MAX_ORIGIN 300u
/* a module request's head (Deno sends about 150 bytes) and its target */
#define SB_SHIM_MODULE_MAX_HEAD 8192u
#define SB_SHIM_MODULE_MAX_TARGET 4096u

typedef struct st_sb_shim_imports_t {
    unsigned n;
    char origin[SB_SHIM_MAX_IMPORT_ORIGINS][SB_SHIM_MAX_ORIGIN]; /* "https://host" or "https://host:port", lower case */
} sb_shim_imports_t;

/**
 * Adds one entry of capabilities.import, as upstream's schema takes it: a host name, an IPv4
 * address or a bracketed IPv6 address, optionally with ":port". Its modules are https URLs of that
 * host (port 443 when none is named). The same origin twice is kept once.
 * @param why on failure, a static reason
 * @return 0, or -1 (not a host, too many origins)
 */
int sb_shim_imports_add(sb_shim_imports_t *im, const char *entry, size_t len, const char **why);

/** the loopback port of origin i */
uint16_t sb_shim_import_port(unsigned i);

/** the import map Deno gets: {"imports":{"https://host/":"http://127.0.0.1:41000/",...}} */
SB_WARN_UNUSED sb_status_t sb_shim_imports_map(const sb_shim_imports_t *im, sb_buf_t *out);

/** the value of Deno's --allow-import: "127.0.0.1:41000,127.0.0.1:41001,..." */
SB_WARN_UNUSED sb_status_t sb_shim_imports_allow(const sb_shim_imports_t *im, sb_buf_t *out);

/**
 * Packs the init frame's `imports` value (PROTOCOL.md section 2): a map from each listener's URL prefix
 * ("http://127.0.0.1:41000") to its origin, with which the guest's runtime names the origin, never the
 * loopback, in the errors it reports.
 */
void sb_shim_imports_pack(const sb_shim_imports_t *im, msgpack_packer *pk);

/**
 * Which origin a module URL (the broker's canonical form) belongs to: same host, same effective
 * port, https.
 * @param path_off where its path (and query) starts in `url`
 * @return the origin's index, or -1
 */
int sb_shim_imports_find(const sb_shim_imports_t *im, const char *url, size_t len, size_t *path_off);

/**
 * Parses a module request from Deno: "GET <target> HTTP/1.1", header lines, a blank line; no body.
 * The target must be origin-form ("/" then visible ASCII) of at most SB_SHIM_MODULE_MAX_TARGET
 * bytes. A head longer than SB_SHIM_MODULE_MAX_HEAD is refused.
 * @param head_len the bytes of the head, blank line included
 * @param target receives the target, NUL-terminated (SB_SHIM_MODULE_MAX_TARGET + 1 bytes)
 * @return SB_OK, SB_E_AGAIN (more bytes needed), SB_E_BAD_ARGS (with `why`), SB_E_TOO_LARGE
 */
SB_WARN_UNUSED sb_status_t sb_shim_module_parse_request(const uint8_t *p, size_t len, size_t *head_len, char *target,
                                                        const char **why);

#endif
