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

typedef enum en_sb_log_level_t { SB_LOG_DEBUG = 0, SB_LOG_INFO, SB_LOG_WARN, SB_LOG_ERROR } sb_log_level_t;

#define SB_LOGLINE_MAX 2048

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
void sb_log_str(sb_logline_t *l, const char *key, const char *val, size_t len);
void sb_log_cstr(sb_logline_t *l, const char *key, const char *val);
void sb_log_int(sb_logline_t *l, const char *key, long long v);
void sb_log_end(sb_logline_t *l);
/** closes the line like sb_log_end but hands it to the audit stream instead of stderr */
void sb_log_end_audit(sb_logline_t *l);
/** starts a line regardless of the log level (audit lines are not logs) */
void sb_log_begin_always(sb_logline_t *l, const char *event);
/**
 * Worker threads collect their lines and write them once per loop pass: one
 * write() per call was the largest single cost of a call. Lines are written
 * whole, in pieces of at most PIPE_BUF bytes, so lines of different threads
 * never interleave. Call sb_log_flush after every h2o_evloop_run.
 */
void sb_log_thread_buffered(int on);
void sb_log_flush(void);
/** one-line helper: {"level", "event", "msg"} */
void sb_log_msg(sb_log_level_t level, const char *event, const char *msg);

#endif
