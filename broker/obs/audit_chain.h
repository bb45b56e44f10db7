/*
 * broker/obs/audit_chain: the audit stream's chain, shared by the writer
 * (audit.c) and the verifier (audit_verify.c). docs/audit.md is the
 * reference for the format; this header is its one implementation.
 *
 * Every record is one line that starts with a fixed prefix
 *
 *   {"seq":<n>,"inst":"<16 hex>","prev":"<64 hex>","ts":"<24 chars>","event":"<name>"
 *
 * where prev is the SHA-256 of the previous record of the same instance's
 * stream, over its exact bytes without the newline (64 zeros for the
 * genesis, seq 0). The chain's own records have a fixed layout after the
 * event:
 *
 *   audit.genesis     ,"key":"<64 hex raw Ed25519 public key, or empty>"
 *   audit.checkpoint  ,"reason":"<every|rotate|reload|shutdown>"
 *   audit.gap         ,"lost":<n>[,"torn":true]
 *
 * and a genesis or checkpoint written with a key ends with
 * ,"sig":"<128 hex>"} where the Ed25519 signature covers every byte before
 * ,"sig". Everything else in a line is the call's audit fields (log.c).
 */
#ifndef SB_AUDIT_CHAIN_H
#define SB_AUDIT_CHAIN_H

#include <stddef.h>
#include <stdint.h>
#include <openssl/evp.h>
#include "sb/status.h"

/* the longest record: a log line (SB_LOGLINE_MAX) and the chain's prefix, with room to spare */
#define SB_AUDIT_RECORD_MAX 4096
#define SB_AUDIT_INST_LEN 16
#define SB_AUDIT_SIG_LEN 64

typedef enum { SB_AUDIT_REC_CALL = 0, SB_AUDIT_REC_GENESIS, SB_AUDIT_REC_CHECKPOINT, SB_AUDIT_REC_GAP } sb_audit_rec_kind_t;

/** one record as sb_audit_record_parse read it; the views point into the line */
typedef struct st_sb_audit_record_t {
    uint64_t seq;
    char inst[SB_AUDIT_INST_LEN + 1];
    uint8_t prev[32];
    sb_audit_rec_kind_t kind;
    char event[33];
    /* genesis: the key (has_key), checkpoint: the reason, gap: lost and torn */
    int has_key;
    uint8_t key[32];
    char reason[16];
    uint64_t lost;
    int torn;
    /* a signed genesis or checkpoint: the signature and how many leading bytes it covers */
    int has_sig;
    uint8_t sig[SB_AUDIT_SIG_LEN];
    size_t signed_len;
} sb_audit_record_t;

/**
 * Reads one record (a line without its newline) strictly by the layout above.
 * @param why receives a static phrase naming what is wrong on failure
 * @return SB_OK, or SB_E_BAD_ARGS when the line is not a chain record
 */
SB_WARN_UNUSED sb_status_t sb_audit_record_parse(const char *line, size_t len, sb_audit_record_t *out, const char **why);

/** SHA-256 of `len` bytes into out */
void sb_audit_hash(const void *p, size_t len, uint8_t out[32]);

/**
 * Reads an Ed25519 private key (PEM, as `openssl genpkey -algorithm ed25519`
 * writes it). The caller owns the key (EVP_PKEY_free).
 * @param err receives "<path>: <reason>" on failure
 * @return the key, or NULL
 */
EVP_PKEY *sb_audit_key_read_private(const char *path, char *err, size_t errsz);
/** as sb_audit_key_read_private for a PEM public key (or a private key, whose public half is used) */
EVP_PKEY *sb_audit_key_read_public(const char *path, char *err, size_t errsz);
/** the key's raw 32-byte public key; 0, or -1 when it is not an Ed25519 key */
SB_WARN_UNUSED int sb_audit_key_raw(EVP_PKEY *key, uint8_t out[32]);
/** signs `len` bytes; 0, or -1 */
SB_WARN_UNUSED int sb_audit_sign(EVP_PKEY *key, const void *p, size_t len, uint8_t sig[SB_AUDIT_SIG_LEN]);
/** 1 when `sig` is the signature of the bytes by the raw public key `pub`, else 0 */
int sb_audit_sig_ok(const uint8_t pub[32], const void *p, size_t len, const uint8_t sig[SB_AUDIT_SIG_LEN]);

/* the command-line entry points (audit_verify.c): argc/argv after the subcommand's name; the exit status */
int sb_audit_verify_main(int argc, char **argv);
int sb_audit_pubkey_main(int argc, char **argv);

#endif
