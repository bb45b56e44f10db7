/*
 * broker/call: secret placeholders in http.fetch header values
 * (PROTOCOL.md section 5, "Secrets").
 *
 * A placeholder is the text {{secret:NAME}} with NAME of [A-Za-z0-9_.-]{1,64}.
 * The decoder finds them once, here; the fetch hop machine decides on every
 * hop whether the named secret may replace each one. Any "{{secret:" that does
 * not start a well-formed placeholder makes the value malformed: it is never
 * sent as literal text.
 */
#ifndef SB_CALL_PLACEHOLDER_H
#define SB_CALL_PLACEHOLDER_H

#include <stddef.h>
#include "sb/limits.h"

#define SB_PLACEHOLDER_OPEN "{{secret:"
#define SB_PLACEHOLDER_OPEN_LEN 9u
#define SB_PLACEHOLDER_MAX_NAME SB_MAX_SECRET_NAME
/* the longest placeholder text: "{{secret:" NAME "}}" */
#define SB_PLACEHOLDER_MAX_LEN (SB_MAX_SECRET_NAME + 11u)

/** one placeholder inside a value: the whole text at [start, start + len), the name at [name, name + name_len) */
typedef struct st_sb_placeholder_t {
    size_t start, len;
    size_t name, name_len;
} sb_placeholder_t;

/**
 * Finds the next placeholder in s[from..len).
 * @return 1 with *p filled, 0 when there is none, -1 when a "{{secret:" there is malformed
 */
int sb_placeholder_next(const char *s, size_t len, size_t from, sb_placeholder_t *p);

/** 1 when s is a secret name ([A-Za-z0-9_.-]{1,64}) */
int sb_placeholder_is_name(const char *s, size_t len);

#endif
