/*
 * Allocation helpers (see sb/mem.h): the only file of the tree that calls the
 * C library's allocator (scripts/checksrc refuses it anywhere else).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sb/mem.h"

void sb_fatal(const char *file, int line, const char *msg)
{
    fprintf(stderr, "{\"level\":\"fatal\",\"msg\":\"%s\",\"file\":\"%s\",\"line\":%d}\n", msg, file, line);
    abort();
}

void *sb_mem__alloc(size_t sz, const char *file, int line)
{
    void *p = malloc(sz != 0 ? sz : 1);
    if (p == NULL)
        sb_fatal(file, line, "out of memory");
    return p;
}

void *sb_mem__calloc(size_t n, size_t sz, const char *file, int line)
{
    void *p = calloc(n != 0 ? n : 1, sz != 0 ? sz : 1);
    if (p == NULL)
        sb_fatal(file, line, "out of memory");
    return p;
}

char *sb_mem__strdup(const char *s, const char *file, int line)
{
    size_t n = strlen(s) + 1;
    char *p = sb_mem__alloc(n, file, line);
    memcpy(p, s, n);
    return p;
}

void *sb_mem__realloc(void *p, size_t sz, const char *file, int line)
{
    void *np = realloc(p, sz != 0 ? sz : 1);
    if (np == NULL)
        sb_fatal(file, line, "out of memory");
    return np;
}

/* failure injection: calls made, and the call number that fails (0: none) */
static _Thread_local unsigned long try_calls, fail_at;

/* counts one try-allocation; 1 when it is the one chosen to fail */
static int injected_failure(void)
{
    ++try_calls;
    if (__builtin_expect(fail_at != 0, 0) && try_calls == fail_at) {
        fail_at = 0;
        return 1;
    }
    return 0;
}

void sb_mem_fail_nth(unsigned long n)
{
    fail_at = n != 0 ? try_calls + n : 0;
}

unsigned long sb_mem_try_count(void)
{
    return try_calls;
}

void *sb_mem_try_alloc(size_t sz)
{
    if (injected_failure())
        return NULL;
    return malloc(sz != 0 ? sz : 1);
}

void *sb_mem_try_calloc(size_t n, size_t sz)
{
    size_t total;
    if (injected_failure() || !sb_size_mul(n, sz, &total))
        return NULL;
    return calloc(total != 0 ? total : 1, 1);
}

void *sb_mem_try_alloc_array(size_t n, size_t sz)
{
    size_t total;
    if (injected_failure() || !sb_size_mul(n, sz, &total))
        return NULL;
    return malloc(total != 0 ? total : 1);
}

void *sb_mem_try_realloc(void *p, size_t sz)
{
    if (injected_failure())
        return NULL;
    return realloc(p, sz != 0 ? sz : 1);
}

void *sb_mem_try_realloc_array(void *p, size_t n, size_t sz)
{
    size_t total;
    if (injected_failure() || !sb_size_mul(n, sz, &total))
        return NULL;
    return realloc(p, total != 0 ? total : 1);
}

char *sb_mem_try_strndup(const char *s, size_t n)
{
    char *p;
    size_t total;
    if (!sb_size_add(n, 1, &total) || (p = sb_mem_try_alloc(total)) == NULL)
        return NULL;
    if (n != 0)
        memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *sb_mem_try_strdup(const char *s)
{
    return sb_mem_try_strndup(s, strlen(s));
}

void sb_mem_free(void *p)
{
    free(p);
}

void sb_mem_free_foreign(void *p)
{
    free(p);
}

void sb_mem_free_secret(void *p, size_t n)
{
    if (p == NULL)
        return;
    explicit_bzero(p, n);
    free(p);
}
