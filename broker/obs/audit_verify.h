/*
 * broker/obs/audit_verify: the audit chain's verifier, line by line, so that
 * the command (audit-verify), its tests and its fuzzer drive the same code.
 * The rules and the messages are in docs/audit.md.
 */
#ifndef SB_AUDIT_VERIFY_H
#define SB_AUDIT_VERIFY_H

#include <stdint.h>
#include <stdio.h>

typedef struct st_sb_audit_verifier_t sb_audit_verifier_t;

/**
 * A verifier; free it with sb_audit_verifier_free.
 * @param key the raw Ed25519 public key every stream must be signed with, or NULL (each genesis's own key is used)
 * @param allow_open 1 to accept a stream without its shutdown checkpoint, and a file that ends inside a record
 * @param out where the failure, the notes and the summary are printed, or NULL for none
 */
sb_audit_verifier_t *sb_audit_verifier_new(const uint8_t *key, int allow_open, FILE *out);
void sb_audit_verifier_free(sb_audit_verifier_t *v);
/**
 * One line of `file` (without its newline); `file` must outlive the verifier.
 * @return 0, or -1 once a rule is broken (every later call returns -1 too)
 */
int sb_audit_verifier_line(sb_audit_verifier_t *v, const char *file, uint64_t lineno, const char *line, size_t len);
/** the end of a file: `partial` when its last line has no newline. @return 0 or -1 */
int sb_audit_verifier_end_file(sb_audit_verifier_t *v, const char *file, uint64_t lineno, int partial);
/** the end of the input: every stream must be closed (unless allow_open). @return 0 or -1 */
int sb_audit_verifier_finish(sb_audit_verifier_t *v);

#endif
