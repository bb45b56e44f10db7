/*
 * broker/authz/secrets: credentials a run's http.fetch may use and never read
 * (PROTOCOL.md section 5, "Secrets"; docs/config.md, targets.<t>.secrets).
 *
 * A run's secrets come from the mint body (`secrets`) and from its target's
 * configured secrets named in the manifest's `secrets` axis. Each one has a
 * value and the rules under which the broker puts it on the wire: schemes,
 * hosts (net entries, each also in the run's net), header names, methods and
 * path globs. The guest writes {{secret:NAME}} in a header value
 * (call/placeholder.h); on every hop the fetch machine asks
 * sb_secrets_decide whether the value may replace it there, and every answer
 * is redacted back to placeholders (sb_secrets_redact) before the guest sees
 * it.
 *
 * A set is immutable once built, so threads share it with the token record
 * that owns it. Values (and every form of them kept for redaction) are zeroed
 * when the set is freed. No function here puts a value into an error message.
 */
#ifndef SB_AUTHZ_SECRETS_H
#define SB_AUTHZ_SECRETS_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "sb/status.h"
#include "authz/authz.h"
#include "call/url.h"

typedef struct st_sb_secret_t sb_secret_t;
typedef struct st_sb_secrets_t sb_secrets_t;

/**
 * Parses the mint body's `secrets` object: {NAME: {value, hosts, headers?,
 * methods?, paths?, schemes?}}. Every host must be admitted by the manifest's
 * net.
 * @param err receives a message naming the offending path ("secrets.gh.hosts[0]: ...")
 * @return SB_OK (*out NULL for an empty object), SB_E_BAD_ARGS or SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_secrets_parse(const json_t *obj, const sb_manifest_t *m, sb_secrets_t **out, char *err, size_t errsz);
/**
 * Parses a target's configured secrets, targets.<t>.secrets: value_file or
 * value_env instead of value, read now (a file that cannot be read, or an
 * unset variable, is an error: fail closed).
 * @param path the object's path, for messages ("targets.app.secrets")
 */
SB_WARN_UNUSED sb_status_t sb_secrets_parse_config(const json_t *obj, const char *path, sb_secrets_t **out, char *err,
                                                   size_t errsz);
/**
 * Adds a copy of the secret named `name` of `from` (a target's) to *to (a
 * run's, created when NULL), checking its hosts against the run's net.
 * @param path where the name came from, for messages ("capabilities.secrets[0]")
 */
SB_WARN_UNUSED sb_status_t sb_secrets_add_from(sb_secrets_t **to, const sb_secrets_t *from, const char *name,
                                               const sb_manifest_t *m, const char *path, char *err, size_t errsz);
void sb_secrets_free(sb_secrets_t *s);
/** how many secrets (0 for NULL) */
size_t sb_secrets_count(const sb_secrets_t *s);
/** the i-th secret's name */
const char *sb_secrets_name(const sb_secrets_t *s, size_t i);

/**
 * Decides one placeholder on one hop: the run has the secret, and the hop's
 * scheme, host and port, header, method and path are within its rules.
 * @param s the run's secrets (may be NULL)
 * @param reason on refusal: names the secret and the rule, never the value
 * @return SB_OK with *out set, or SB_E_FORBIDDEN
 */
SB_WARN_UNUSED sb_status_t sb_secrets_decide(const sb_secrets_t *s, const char *name, size_t len, const char *header,
                                             const sb_url_t *u, const char *method, const sb_secret_t **out, char *reason,
                                             size_t reasonsz);
/** the value of a secret sb_secrets_decide granted (owned by the set) */
void sb_secret_value(const sb_secret_t *sec, const char **value, size_t *len);

/**
 * Replaces every occurrence of every secret's value, raw, lowercased, base64
 * (standard and URL-safe, at every byte alignment) and percent-encoded, by
 * its placeholder.
 * @param cap the largest output allowed
 * @param out NULL when nothing was found (the input stands), else a new buffer owned by the caller
 * @return SB_OK, SB_E_TOO_LARGE (the redacted text would exceed cap) or SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_secrets_redact(const sb_secrets_t *s, const char *in, size_t len, size_t cap, char **out,
                                             size_t *outlen);

/*
 * At rest (the Redis store): every value sealed with AES-256-GCM under the
 * process key, a random 96-bit nonce per value, the token hash and the
 * secret's name as associated data.
 */
/** sets the process key (NULL forgets it); call before the workers start */
void sb_secrets_set_key(const uint8_t key[32]);
/** 1 when a key is set */
int sb_secrets_have_key(void);
/**
 * Reads a key file: exactly 32 raw bytes, or 64 hex digits (a trailing newline allowed).
 * @return SB_OK or SB_E_BAD_ARGS with err naming the file (never its content)
 */
SB_WARN_UNUSED sb_status_t sb_secrets_read_key(const char *path, uint8_t key[32], char *err, size_t errsz);
/** the set as a JSON object for a stored record, values sealed; NULL without a key or randomness */
json_t *sb_secrets_seal(const sb_secrets_t *s, const uint8_t hash[32]);
/** the set from a stored record; SB_E_UNAVAILABLE when it cannot be opened or read (fail closed) */
SB_WARN_UNUSED sb_status_t sb_secrets_unseal(const json_t *o, const uint8_t hash[32], const sb_manifest_t *m, sb_secrets_t **out);

#endif
