/*
 * broker/obs/audit: the audit stream, one JSON line per RPC (time, correlation
 * id, run id, token hash prefix, method, decision, reason, latency, bytes in
 * and out), to stderr or a file.
 *
 * Writers never block on the sink: lines go into a bounded in-memory buffer
 * that one thread drains; when the buffer is full a line is dropped and
 * counted (sb_audit_dropped, exported as sb_audit_dropped_total), so a slow
 * disk costs audit lines, never call latency.
 */
#ifndef SB_AUDIT_H
#define SB_AUDIT_H

#include <stddef.h>
#include <stdint.h>
#include "sb/status.h"

/* the buffer between the workers and the writer thread */
#define SB_AUDIT_BUFFER (4u * 1024u * 1024u)

/**
 * Opens the sink and starts the writer thread.
 * @param target "stderr", "off", or a file path (opened for append, created 0600)
 * @param err receives "audit: cannot open <path>: <reason>" on failure
 * @return SB_OK or SB_E_BAD_ARGS
 */
SB_WARN_UNUSED sb_status_t sb_audit_open(const char *target, char *err, size_t errsz);
/**
 * What --check-config does: opens the file as sb_audit_open would (creating
 * it when it does not exist) and closes it again.
 * @return SB_OK or SB_E_BAD_ARGS with err as for sb_audit_open
 */
SB_WARN_UNUSED sb_status_t sb_audit_check(const char *target, char *err, size_t errsz);
/**
 * Opens the audit file's path again, for rotation: lines written from now on
 * go to the file now at the path; every line lands whole in one of the two
 * files and none is lost. Nothing to do for "stderr" or "off". On failure the
 * old file stays in use.
 * @return SB_OK, or SB_E_UNAVAILABLE with err naming the path and the reason
 */
SB_WARN_UNUSED sb_status_t sb_audit_reopen(char *err, size_t errsz);
/** flushes what is buffered and stops the writer */
void sb_audit_close(void);
/** 1 when an audit sink is open */
int sb_audit_enabled(void);
/** queues one line (without its newline); never blocks on I/O */
void sb_audit_write(const char *line, size_t len);
/** lines dropped because the buffer was full */
uint64_t sb_audit_dropped(void);

#endif
