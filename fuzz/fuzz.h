/*
 * Shared helpers for the libFuzzer drivers in fuzz/ (STYLE.md rule 17).
 *
 * Drivers assert properties, not just "no crash": SB_FUZZ_ASSERT prints the
 * broken property and aborts, which libFuzzer reports as a crash and saves the
 * input. A property that fails because of a known, reported library bug is
 * written as `SB_FUZZ_ASSERT(cond || sb_fuzz_known("id"), ...)`; setting the
 * environment variable SB_FUZZ_KNOWN to a comma-separated list of ids (or
 * "all") tolerates those while the fix is pending, so a long run can look
 * past them. The default is strict. The ids are listed in fuzz/README.md.
 */
#ifndef SB_FUZZ_H
#define SB_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SB_FUZZ_ASSERT(cond, ...)                                                                                                  \
    do {                                                                                                                           \
        if (!(cond)) {                                                                                                             \
            fprintf(stderr, "\n*** property failed at %s:%d: %s\n*** ", __FILE__, __LINE__, #cond);                                \
            fprintf(stderr, __VA_ARGS__);                                                                                          \
            fputc('\n', stderr);                                                                                                   \
            abort();                                                                                                               \
        }                                                                                                                          \
    } while (0)

/* 1 when the environment tolerates the known bug `id` (SB_FUZZ_KNOWN=id1,id2 or SB_FUZZ_KNOWN=all) */
static inline int sb_fuzz_known(const char *id)
{
    static const char *known;
    static int loaded;
    size_t n = strlen(id);
    const char *p;

    if (!loaded) {
        known = getenv("SB_FUZZ_KNOWN");
        loaded = 1;
    }
    if (known == NULL)
        return 0;
    if (strcmp(known, "all") == 0)
        return 1;
    for (p = known; (p = strstr(p, id)) != NULL; p += n)
        if ((p == known || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
            return 1;
    return 0;
}

/* a small deterministic PRNG (xorshift64*), seeded from the input, for chunk sizes and the like */
typedef struct st_sb_fuzz_rng_t {
    uint64_t s;
} sb_fuzz_rng_t;

static inline void sb_fuzz_rng_seed(sb_fuzz_rng_t *r, const uint8_t *data, size_t size)
{
    uint64_t h = 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < size; ++i)
        h = (h ^ data[i]) * 0x100000001b3u;
    r->s = h != 0 ? h : 1;
}

static inline uint32_t sb_fuzz_rng_next(sb_fuzz_rng_t *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (uint32_t)((r->s * 0x2545f4914f6cdd1du) >> 32);
}

/* 1..max, biased towards small values */
static inline size_t sb_fuzz_rng_chunk(sb_fuzz_rng_t *r, size_t max)
{
    uint32_t v = sb_fuzz_rng_next(r);
    size_t lim = (v & 3) == 0 ? max : (v & 3) == 1 ? 16 : (v & 3) == 2 ? 4 : 1;
    if (lim > max)
        lim = max;
    return lim <= 1 ? 1 : 1 + (v >> 8) % lim;
}

#endif
