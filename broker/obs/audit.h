/*
 * broker/obs/audit: the audit stream, one JSON line per RPC (time, correlation
 * id, run id, token hash prefix, method, decision, reason, latency, bytes in
 * and out), to stderr or a file, hash-chained and checkpointed (signed with
 * Ed25519 when a key is configured) so that an edit, a removal, an insertion,
 * a reordering or a truncation can be found by `sandbox-broker audit-verify`
 * (docs/audit.md; the format is in audit_chain.h).
 *
 * Writers never block on the sink: lines go into a bounded in-memory buffer
 * that one thread drains; when the buffer is full a line is dropped and
 * counted (sb_audit_dropped, exported as sb_audit_dropped_total), so a slow
 * disk costs audit lines, never call latency. Lost lines are also written
 * into the chain as a gap record, so the file itself says how many are missing.
 */
#ifndef SB_AUDIT_H
#define SB_AUDIT_H

#include <stddef.h>
#include <stdint.h>
#include "sb/status.h"

/* the buffer between the workers and the writer thread */
#define SB_AUDIT_BUFFER (4u * 1024u * 1024u)

/**
 * Opens the sink and starts the writer thread, which writes the stream's
 * genesis record first.
 * @param target "stderr", "off", or a file path (opened for append, created 0600)
 * @param key_file an Ed25519 private key (PEM) that signs the genesis and the checkpoints, or NULL
 * @param checkpoint_every records between two checkpoints (0: the default, 1000)
 * @param err receives "audit: cannot open <path>: <reason>" or "audit_key_file: <path>: <reason>" on failure
 * @return SB_OK or SB_E_BAD_ARGS
 */
SB_WARN_UNUSED sb_status_t sb_audit_open(const char *target, const char *key_file, uint64_t checkpoint_every, char *err,
                                         size_t errsz);
/**
 * What --check-config does: opens the file as sb_audit_open would (creating
 * it when it does not exist) and closes it again.
 * @return SB_OK or SB_E_BAD_ARGS with err as for sb_audit_open
 */
SB_WARN_UNUSED sb_status_t sb_audit_check(const char *target, const char *key_file, char *err, size_t errsz);
/**
 * Writes a checkpoint and opens the audit file's path again, for rotation:
 * the old file ends with the checkpoint, lines written from now on go to the
 * file now at the path and go on with the chain; every line lands whole in
 * one of the two files and none is lost. For "stderr" only the checkpoint is
 * written. On failure the old file stays in use (and no checkpoint is
 * written). Waits until the writer has done it; called from the signal thread.
 * @param reason the checkpoint's reason, a static string: "rotate" or "reload"
 * @return SB_OK, or SB_E_UNAVAILABLE with err naming the path and the reason
 */
SB_WARN_UNUSED sb_status_t sb_audit_reopen(const char *reason, char *err, size_t errsz);
/** flushes what is buffered, writes the "shutdown" checkpoint and stops the writer */
void sb_audit_close(void);
/** 1 when an audit sink is open */
int sb_audit_enabled(void);
/** queues one line (without its newline); never blocks on I/O */
void sb_audit_write(const char *line, size_t len);
/** lines lost: the buffer was full, or the sink failed to take them */
uint64_t sb_audit_dropped(void);
/** the stream's instance id (16 hex digits, fixed while it is open), or NULL when no sink is open */
const char *sb_audit_instance(void);

#endif
