/*
 * sandbox-broker: decoding and encoding of untrusted values.
 *
 * Inside the project a request or reply value is a msgpack_object tree (it
 * is also our native wire encoding). JSON arrives and leaves through jansson.
 * Both directions are bounded: nesting at most SB_MAX_DEPTH containers, at
 * most SB_MAX_NODES nodes, strict UTF-8, string map keys, no duplicate keys,
 * no msgpack ext types, no non-finite floats (PROTOCOL.md, "Values").
 */
#ifndef SB_VALUE_H
#define SB_VALUE_H

#include <stddef.h>
#include <stdint.h>
#include <msgpack.h>
#include <jansson.h>
#include "sb/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * The msgpack pre-check: walks exactly one msgpack object at `p` without
 * allocating for it, and refuses any declared array/map/str/bin size that
 * exceeds the bytes left, nesting deeper than SB_MAX_DEPTH, more than
 * SB_MAX_NODES nodes, invalid UTF-8 in str, non-str map keys, duplicate keys,
 * ext types, the reserved byte 0xc1 and non-finite floats. Run it before
 * handing bytes to msgpack-c, which sizes containers from their headers.
 * @param obj_len receives the encoded length of the object
 * @param why receives a static description of the first problem
 * @return SB_OK, SB_E_BAD_ARGS (malformed), SB_E_TOO_LARGE (depth or node cap), SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_mp_check(const uint8_t *p, size_t len, size_t *obj_len, const char **why);

/**
 * Pre-checks and unpacks a buffer that must hold exactly one msgpack object.
 * The object lives in `zone` and references `p`: both must outlive it.
 * @return as sb_mp_check; trailing bytes are SB_E_BAD_ARGS
 */
SB_WARN_UNUSED sb_status_t sb_mp_decode(const uint8_t *p, size_t len, msgpack_zone *zone, msgpack_object *out, const char **why);

/**
 * Unpacks a buffer this process packed itself (sb_mp_pack_json, a handler's
 * packer), skipping the pre-check: those bytes already obey every rule the
 * pre-check enforces, since the code that packed them did. Never for bytes
 * that came from outside: use sb_mp_decode.
 * @return SB_OK, SB_E_BAD_ARGS or SB_E_NOMEM (msgpack-c's own refusal)
 */
SB_WARN_UNUSED sb_status_t sb_mp_decode_packed(const uint8_t *p, size_t len, msgpack_zone *zone, msgpack_object *out);

/**
 * Parses JSON text (strict UTF-8, duplicate keys refused, NUL allowed inside
 * strings) and packs it as msgpack into `packed`. The text is scanned for
 * nesting and node count before jansson allocates anything.
 * @return SB_OK, SB_E_BAD_ARGS (not JSON), SB_E_TOO_LARGE (depth or node cap), SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_json_decode(const char *text, size_t len, msgpack_sbuffer *packed, const char **why);

/** packs a jansson value as msgpack (depth- and node-capped) */
SB_WARN_UNUSED sb_status_t sb_mp_pack_json(msgpack_packer *pk, const json_t *v, const char **why);

/**
 * Converts a msgpack object to a new jansson value (bin becomes base64 text).
 * @param out receives a new reference owned by the caller
 * @return SB_OK, SB_E_BAD_ARGS (non-str key, ext, non-finite float, integer out of range), SB_E_NOMEM
 */
SB_WARN_UNUSED sb_status_t sb_json_from_mp(const msgpack_object *o, json_t **out);

/** packs a msgpack object again (used to copy values between zones and buffers) */
void sb_mp_pack_object(msgpack_packer *pk, const msgpack_object *o);

/**
 * Own-key lookup in a msgpack map.
 * @return the value for `key`, or NULL when `map` is not a map or has no such key
 */
const msgpack_object *sb_mp_get(const msgpack_object *map, const char *key);
/** 1 if `o` is a str equal to the NUL-terminated `s` */
int sb_mp_str_is(const msgpack_object *o, const char *s);

/** 1 if the bytes are valid UTF-8 (no overlongs, surrogates or code points above U+10FFFF) */
int sb_utf8_valid(const uint8_t *p, size_t len);

/** base64 (RFC 4648, with padding) of `len` bytes into `out`, which must hold sb_b64_encoded_len(len) + 1 bytes */
size_t sb_b64_encoded_len(size_t len);
void sb_b64_encode(const uint8_t *in, size_t len, char *out);
/**
 * Strict base64 decode (RFC 4648 alphabet, padding required, no whitespace).
 * @param out must hold at least len / 4 * 3 bytes
 * @return SB_OK or SB_E_BAD_ARGS
 */
SB_WARN_UNUSED sb_status_t sb_b64_decode(const char *in, size_t len, uint8_t *out, size_t *outlen);

#ifdef __cplusplus
}
#endif
#endif
