/*
 * broker/obs/log: structured JSON log lines on stderr, one write() each.
 *
 *   sb_logline_t l;
 *   sb_log_begin(&l, SB_LOG_INFO, "token.minted");
 *   sb_log_str(&l, "runId", run_id, strlen(run_id));
 *   sb_log_end(&l);
 *
 * Lines are built in a fixed buffer; a value that does not fit is cut and the
 * line gets "truncated":true, so a hostile string can never grow a line
 * without bound. Tokens are never logged: log sb_log_token_ref() instead.
 */
#ifndef SB_LOG_H
#define SB_LOG_H

#include <stddef.h>
#include <stdint.h>
#include "sb/limits.h"
#include "sb/status.h"

typedef enum en_sb_log_level_t { SB_LOG_DEBUG = 0, SB_LOG_INFO, SB_LOG_WARN, SB_LOG_ERROR } sb_log_level_t;

typedef struct st_sb_logline_t {
    char buf[SB_LOGLINE_MAX];
    size_t len;
    int truncated;
    int enabled;
} sb_logline_t;

/** sets the lowest level written (default SB_LOG_INFO) */
void sb_log_set_level(sb_log_level_t level);
/** parses "debug", "info", "warn" or "error"; returns -1 for anything else */
int sb_log_parse_level(const char *s);
void sb_log_begin(sb_logline_t *l, sb_log_level_t level, const char *event);
/** starts a line of that level whatever the log level: for the outcome of an operator's action (a reload) */
void sb_log_begin_level_always(sb_logline_t *l, sb_log_level_t level, const char *event);
/*
 * Fields. Keys are string literals (the broker's own names: a variable does
 * not compile) of letters, digits, '_' and '.', which scripts/checksrc
 * checks: the field's head (`,"key":"` or `,"key":`) is put together when
 * compiled and copied as it is. Values are escaped as needed. sb_log__str and
 * sb_log__int take a key of any bytes with its length, and escape it.
 */
#define SB_LOG__HEAD(s) (s), sizeof(s) - 1
#define sb_log_str(l, key, ...) sb_log__hstr((l), SB_LOG__HEAD(",\"" key "\":\""), __VA_ARGS__) /* val, len */
#define sb_log_cstr(l, key, val) sb_log__hcstr((l), SB_LOG__HEAD(",\"" key "\":\""), (val))
#define sb_log_int(l, key, v) sb_log__hint((l), SB_LOG__HEAD(",\"" key "\":"), (v))
void sb_log__hstr(sb_logline_t *l, const char *head, size_t hlen, const char *val, size_t len);
void sb_log__hcstr(sb_logline_t *l, const char *head, size_t hlen, const char *val);
void sb_log__hint(sb_logline_t *l, const char *head, size_t hlen, long long v);
void sb_log__str(sb_logline_t *l, const char *key, size_t klen, const char *val, size_t len);
void sb_log__int(sb_logline_t *l, const char *key, size_t klen, long long v);
void sb_log_end(sb_logline_t *l);
/** closes the line like sb_log_end but hands it to the audit stream instead of stderr */
void sb_log_end_audit(sb_logline_t *l);
/** starts a line regardless of the log level (audit lines are not logs) */
void sb_log_begin_always(sb_logline_t *l, const char *event);
/** sb_log_begin_always with the time of `as`, a line begun before (NULL, or a line not begun: now) */
void sb_log_begin_always_as(sb_logline_t *l, const char *event, const sb_logline_t *as);
/**
 * Appends to `dst` the fields `src` holds from byte `from` on (an offset `src->len` had after its
 * begin), as they were written: one line's fields given to another without formatting them again.
 * @return 1, or 0 when `src` was cut short or `dst` cannot take them (then nothing is appended)
 */
int sb_log_copy_fields(sb_logline_t *dst, const sb_logline_t *src, size_t from);
/**
 * Worker threads collect their lines and write them once per loop pass: one
 * write() per call was the largest single cost of a call. Lines are written
 * whole, so lines of different threads never interleave: to a regular file
 * the batch goes in one write() (Linux writes it under the file's lock),
 * to anything else in pieces of at most PIPE_BUF bytes (atomic on a pipe).
 * Call sb_log_flush after every h2o_evloop_run.
 */
void sb_log_thread_buffered(int on);
void sb_log_flush(void);
/**
 * Opens path for appending (created 0600), as the log and audit files are.
 * @param what names the file in the message ("log_file", "audit")
 * @param err receives "<what>: cannot open <path>: <reason>" on failure
 * @return the descriptor (close-on-exec), or -1
 */
int sb_log_open_append(const char *what, const char *path, char *err, size_t errsz);
/**
 * Sends the log to a file instead of stderr: the file becomes descriptor 2,
 * so whatever else writes to stderr lands there too.
 * @param path "stderr" (nothing changes) or a file path
 * @return SB_OK, or SB_E_BAD_ARGS with err naming the path and the reason
 */
SB_WARN_UNUSED sb_status_t sb_log_open_file(const char *path, char *err, size_t errsz);
/** what --check-config does: opens the file as sb_log_open_file would, and closes it */
SB_WARN_UNUSED sb_status_t sb_log_check_file(const char *path, char *err, size_t errsz);
/**
 * Opens the log file's path again and makes it descriptor 2, for rotation:
 * once the old file has been renamed, new lines go to a new file at the
 * path. A line is written with one write(), so each lands whole in one of the
 * two files. Does nothing when the log goes to stderr. On failure the old
 * file stays in use.
 * @return SB_OK, or SB_E_UNAVAILABLE with err naming the path and the reason
 */
SB_WARN_UNUSED sb_status_t sb_log_reopen(char *err, size_t errsz);
/** the log file's path, or "stderr" */
const char *sb_log_file(void);
/** one-line helper: {"level", "event", "msg"} */
void sb_log_msg(sb_log_level_t level, const char *event, const char *msg);

#endif
