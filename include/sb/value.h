/*
 * sandbox-broker: decoding and encoding of untrusted values.
 *
 * Inside the project a request or reply value is a msgpack_object tree (it
 * is also our native wire encoding). JSON arrives through sb_json_parse and
 * leaves through sb_json_write, straight between JSON text and that tree;
 * jansson trees (the manifest, admin bodies) convert with sb_mp_pack_json and
 * sb_json_from_mp. Both directions are bounded: nesting at most SB_MAX_DEPTH
 * containers, at most SB_MAX_NODES nodes, strict UTF-8, string map keys, no
 * duplicate keys, no msgpack ext types, no non-finite floats (PROTOCOL.md,
 * "Values").
 */
#ifndef SB_VALUE_H
#define SB_VALUE_H

#include <stddef.h>
#include <stdint.h>
#include <msgpack.h>
#include <jansson.h>
#include "sb/buf.h"
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
 * Decodes JSON text (RFC 8259) in one pass into a msgpack_object tree, the
 * form the rest of the broker reads; no jansson, no packed intermediate.
 *
 * The rules (PROTOCOL.md, "Values"), each refused with SB_E_BAD_ARGS unless
 * said otherwise:
 *  - the RFC 8259 grammar exactly: one value, optionally surrounded by
 *    whitespace (space, tab, LF, CR; nothing else, no byte order mark), no
 *    trailing bytes, no comments, no single quotes, no trailing commas;
 *  - strings: strict UTF-8 (no overlongs, no surrogates, nothing above
 *    U+10FFFF), no raw control characters, only the RFC's escapes, UTF-16
 *    surrogate escapes only as a high-low pair; \u0000 is allowed in values
 *    and refused in object keys;
 *  - objects: string keys, no duplicate keys (compared after unescaping);
 *  - numbers: an integer (no fraction, no exponent) becomes
 *    MSGPACK_OBJECT_POSITIVE_INTEGER (0 and above, "-0" included) or
 *    MSGPACK_OBJECT_NEGATIVE_INTEGER, and must fit int64 (as jansson's
 *    json_int_t, which the old route used); anything else becomes
 *    MSGPACK_OBJECT_FLOAT64, rounded correctly; a number whose magnitude
 *    overflows a double is refused, one that underflows becomes 0 or a
 *    subnormal, as strtod gives it;
 *  - at most SB_MAX_DEPTH - 1 nested containers and SB_MAX_NODES values
 *    (object keys are not values, as sb_mp_check counts them): SB_E_TOO_LARGE.
 *    Both are checked as each value starts, before the zone or the scratch
 *    stack grows for it.
 * Memory: container arrays and unescaped copies of strings that hold escapes
 * live in `zone`; a string without escapes points into `text`. So the tree
 * lives as long as both `text` and `zone` (the same contract as sb_mp_decode
 * with its buffer). Empty strings point at a valid address, never NULL.
 * Besides the zone, a scratch stack is allocated (sb/mem.h) for objects and
 * arrays with more than 64 pending values, and freed before returning.
 * @param text the JSON bytes (need not be NUL-terminated)
 * @param out on SB_OK, the root value; untouched otherwise
 * @param why on failure, a static description of the first problem (may be NULL)
 * @return SB_OK, SB_E_BAD_ARGS, SB_E_TOO_LARGE or SB_E_NOMEM. On failure the
 *         zone may hold memory from the attempt; destroy or reuse it.
 */
SB_WARN_UNUSED sb_status_t sb_json_parse(const char *text, size_t len, msgpack_zone *zone, msgpack_object *out, const char **why);

/**
 * Writes a msgpack_object tree as compact JSON text at the end of `buf`.
 *
 * The output is byte for byte what sb_json_from_mp followed by
 * json_dumps(JSON_COMPACT | JSON_ENCODE_ANY) produced, so replies do not
 * change: nil, booleans; integers in decimal; floats as "%.17g" (which reads
 * back to the same double), with ".0" added when that has no '.' or exponent
 * and the exponent written without '+' or leading zeros (-0.0 is "-0.0",
 * 1e300 is "1.0000000000000001e300"); strings escaped as
 * sb_buf_append_json_str does; bin as base64 text (RFC 4648, padded);
 * arrays and maps in their order, and a map that repeats a key keeps the
 * key's first position with its last value (as a jansson object did).
 * The text is always valid JSON and valid UTF-8.
 *
 * Refused, with SB_E_BAD_ARGS: a str (value or key) that is not valid UTF-8,
 * a map key that is not a str or holds NUL, an ext, a non-finite float, a
 * positive integer above INT64_MAX, a value nested deeper than SB_MAX_DEPTH
 * containers or with more than SB_MAX_NODES values.
 * The buffer's cap is enforced as the text is written: the writer stops at
 * the first append that would pass it (SB_E_TOO_LARGE); it never builds the
 * whole text first.
 * @param why on failure, a static description (may be NULL)
 * @return SB_OK, SB_E_BAD_ARGS, SB_E_TOO_LARGE (the buffer's cap) or
 *         SB_E_NOMEM; on failure `buf` is as it was before the call
 */
SB_WARN_UNUSED sb_status_t sb_json_write(sb_buf_t *buf, const msgpack_object *o, const char **why);

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
