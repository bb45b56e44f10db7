/*
 * sandbox-broker: allocation helpers, the one OOM policy (STYLE rule 8).
 *
 * Two kinds of allocation, and a helper for each:
 *  - fixed-size bookkeeping (a struct, a small table whose size the code
 *    chooses): sb_mem_alloc, sb_mem_calloc, sb_mem_strdup. These never return
 *    NULL: on failure they end the process through sb_fatal with the file and
 *    line, as h2o_mem_alloc and Redis' zmalloc do.
 *  - anything whose size derives from input (a body, a count from the wire, a
 *    row set): first bounded by a named cap (sb/limits.h), then allocated with
 *    a sb_mem_try_* helper, which returns NULL on failure (and on a size whose
 *    computation overflows) so the caller answers SB_E_NOMEM.
 * The sb_mem_try_* helpers take the arguments of their libc namesakes, so a
 * module converts by renaming calls: malloc -> sb_mem_try_alloc, calloc ->
 * sb_mem_try_calloc, realloc -> sb_mem_try_realloc, free -> sb_mem_free.
 * Everything returned by any helper here is released with sb_mem_free (or
 * sb_mem_free_secret for memory that held a secret); a block a library made
 * with malloc for its caller to free() goes back through sb_mem_free_foreign.
 * No other file calls malloc, calloc, realloc, free, strdup or strndup
 * (scripts/checksrc).
 *
 * Failure injection: sb_mem_fail_nth(n) makes the n-th sb_mem_try_* call from
 * now on, in the calling thread, fail once, the way curl's torture tests and
 * c-ares' SetAllocFail do; sb_mem_try_count() says how many were made, so a
 * test can fail each allocation of an operation in turn. It is compiled into
 * every build type, so the plain and the sanitizer suites run the same
 * out-of-memory tests; when disarmed it costs one thread-local compare per
 * try-allocation, and nothing outside tests arms it.
 *
 * Thread safety: every function may be called from any thread; the failure
 * injection state is per thread.
 */
#ifndef SB_MEM_H
#define SB_MEM_H

#include <stddef.h>
#include <stdint.h>
#include "sb/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** allocates `sz` bytes (at least 1) or ends the process; never NULL. For fixed-size allocations only. */
#define sb_mem_alloc(sz) sb_mem__alloc((sz), __FILE__, __LINE__)
/** allocates `n` zeroed elements of `sz` bytes or ends the process (also when n * sz overflows); never NULL */
#define sb_mem_calloc(n, sz) sb_mem__calloc((n), (sz), __FILE__, __LINE__)
/** copies a NUL-terminated string or ends the process; never NULL */
#define sb_mem_strdup(s) sb_mem__strdup((s), __FILE__, __LINE__)
/** resizes `p` to `sz` bytes (at least 1) or ends the process; never NULL */
#define sb_mem_realloc(p, sz) sb_mem__realloc((p), (sz), __FILE__, __LINE__)

void *sb_mem__alloc(size_t sz, const char *file, int line);
void *sb_mem__calloc(size_t n, size_t sz, const char *file, int line);
char *sb_mem__strdup(const char *s, const char *file, int line);
void *sb_mem__realloc(void *p, size_t sz, const char *file, int line);

/**
 * Writes one "fatal" log line with `msg`, the file and the line to stderr and
 * aborts. `msg` must be a constant string (it is not escaped) and never holds
 * input or a secret.
 */
__attribute__((noreturn)) void sb_fatal(const char *file, int line, const char *msg);

/**
 * Allocates `sz` bytes for an input-derived size (bounded by a cap first).
 * @return the memory (owned by the caller, release with sb_mem_free), or NULL
 *         when allocation fails; a size of 0 returns a unique 1-byte block
 */
SB_WARN_UNUSED void *sb_mem_try_alloc(size_t sz);
/**
 * Allocates `n` zeroed elements of `sz` bytes.
 * @return the memory, or NULL when n * sz overflows or allocation fails
 */
SB_WARN_UNUSED void *sb_mem_try_calloc(size_t n, size_t sz);
/**
 * Allocates `n` elements of `sz` bytes, not zeroed (c-ares' ares_malloc_array).
 * @return the memory, or NULL when n * sz overflows or allocation fails
 */
SB_WARN_UNUSED void *sb_mem_try_alloc_array(size_t n, size_t sz);
/**
 * Resizes `p` (NULL: allocates) to `sz` bytes.
 * @return the new block, or NULL when allocation fails; `p` is then still
 *         valid and still owned by the caller (unlike `p = realloc(p, n)`)
 */
SB_WARN_UNUSED void *sb_mem_try_realloc(void *p, size_t sz);
/**
 * Resizes `p` to `n` elements of `sz` bytes.
 * @return as sb_mem_try_realloc; NULL (and `p` untouched) when n * sz overflows
 */
SB_WARN_UNUSED void *sb_mem_try_realloc_array(void *p, size_t n, size_t sz);
/**
 * Copies `n` bytes of `s` (which need not be NUL-terminated and may hold NUL)
 * and appends a NUL.
 * @return the copy (n + 1 bytes), or NULL when allocation fails
 */
SB_WARN_UNUSED char *sb_mem_try_strndup(const char *s, size_t n);
/**
 * Copies a NUL-terminated string.
 * @return the copy, or NULL when allocation fails
 */
SB_WARN_UNUSED char *sb_mem_try_strdup(const char *s);

/** releases memory from any helper here (NULL is fine) */
void sb_mem_free(void *p);
/** zeroes `n` bytes at `p` (in a way the compiler keeps), then releases it: for keys, tokens, passwords */
void sb_mem_free_secret(void *p, size_t n);
/**
 * Releases a block that a library allocated with the C library's malloc and
 * whose documentation tells the caller to free() it: today jansson's
 * json_dumps text (the broker's jansson hooks, broker/main.c, allocate with
 * sb_mem_try_alloc, which is malloc, and wipe what jansson frees itself) and
 * the buffer of open_memstream. Memory of a library that has its
 * own release function goes back through that function (PQfreemem,
 * freeReplyObject, ares_free_data, msgpack_sbuffer_destroy), never here.
 * Kept apart from sb_mem_free so that scripts/checksrc and a reader can tell
 * the two kinds of block apart. NULL is fine.
 */
void sb_mem_free_foreign(void *p);

/**
 * Failure injection (see the top of this file): the n-th sb_mem_try_* call
 * made by this thread from now on fails once (n = 1: the next one); 0 disarms.
 */
void sb_mem_fail_nth(unsigned long n);
/** how many sb_mem_try_* calls this thread has made (failed ones included) */
unsigned long sb_mem_try_count(void);

/** *out = a * b; returns 1, or 0 (and *out untouched) when the product overflows */
static inline int sb_size_mul(size_t a, size_t b, size_t *out);
/** *out = a + b; returns 1, or 0 (and *out untouched) when the sum overflows */
static inline int sb_size_add(size_t a, size_t b, size_t *out);

/* inline definitions */

static inline int sb_size_mul(size_t a, size_t b, size_t *out)
{
    size_t r;
    if (__builtin_mul_overflow(a, b, &r))
        return 0;
    *out = r;
    return 1;
}

static inline int sb_size_add(size_t a, size_t b, size_t *out)
{
    size_t r;
    if (__builtin_add_overflow(a, b, &r))
        return 0;
    *out = r;
    return 1;
}

#ifdef __cplusplus
}
#endif
#endif
