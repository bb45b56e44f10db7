/*
 * broker/util: time, randomness, hashing and text helpers.
 *
 * Memory comes from sb/mem.h (the one allocation API, STYLE rule 8), which
 * this header includes for the modules that reach it through here.
 */
#ifndef SB_UTIL_H
#define SB_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include "sb/mem.h"
#include "sb/status.h"

/** wall-clock milliseconds since the epoch (token expiry is wall-clock, as upstream) */
int64_t sb_now_ms(void);
/** monotonic microseconds (latency measurement) */
uint64_t sb_mono_us(void);

/**
 * Fills `buf` with `len` bytes from the kernel CSPRNG (getrandom).
 * @return SB_OK, or SB_E_UNAVAILABLE when the kernel refuses (callers fail closed)
 */
SB_WARN_UNUSED sb_status_t sb_random(void *buf, size_t len);
/** a random RFC 4122 version 4 UUID, 36 characters plus NUL, into `out` */
SB_WARN_UNUSED sb_status_t sb_uuid4(char out[37]);

/** lowercase hex of `len` bytes into `out` (2 * len + 1 bytes) */
void sb_hex(const uint8_t *in, size_t len, char *out);
/** the value of one hex digit (either case), or -1 */
int sb_hex_digit(char c);
/** SHA-256 of `len` bytes */
void sb_sha256(const void *in, size_t len, uint8_t out[32]);
/** constant-time comparison of two buffers of equal length; 1 if equal */
int sb_ct_equal(const void *a, const void *b, size_t len);
/** formats a message into err (when err is not NULL and errsz is not 0) */
__attribute__((format(printf, 3, 4))) void sb_format_error(char *err, size_t errsz, const char *fmt, ...);
/**
 * The parsers' error exit: formats a message into err and evaluates to SB_E_BAD_ARGS. A macro, so the
 * optimiser sees at every caller that this path never returns SB_OK (an out-param left unset on it is then
 * provably unused, instead of "maybe uninitialized" at -O2 and above).
 */
#define sb_fail_bad_args(err, errsz, ...) (sb_format_error((err), (errsz), __VA_ARGS__), SB_E_BAD_ARGS)
/** a printable, bounded copy of untrusted bytes for an error message ('?' for anything else); returns buf */
const char *sb_quote_printable(const char *s, size_t len, size_t max, char *buf, size_t bufsz);
/**
 * The longest prefix of at most `max` bytes of the UTF-8 text `s` that does
 * not end inside a code point: cutting a guest string for an error message
 * there keeps the message (and the JSON, msgpack str, log and audit line it
 * lands in) valid UTF-8.
 * @return the prefix length, at most min(len, max)
 */
size_t sb_utf8_cut(const char *s, size_t len, size_t max);
/** `len` minus an incomplete code point at the end of `s` (a buffer cut at a byte count) */
size_t sb_utf8_trim_tail(const char *s, size_t len);
/** 1 if `s` is a name of [A-Za-z0-9_-]{1,max} (targets, scope keys, globals, collections) */
int sb_is_name(const char *s, size_t max);
/** 1 if `s` is exactly 64 lowercase hex characters (the token format) */
int sb_is_token_format(const char *s, size_t len);

#endif
