/*
 * The audit writer. Workers only copy their line into a bounded buffer
 * (sb_audit_write); everything the chain costs (numbering, SHA-256, the
 * checkpoints' signatures, the write) is paid by the one writer thread, so a
 * call never waits for a hash, a signature or the disk.
 *
 * The chain's state (the next seq and the previous record's hash) is the
 * state of what was written: the writer builds a chunk of records, writes it,
 * and when the write fails part-way it rolls the state back to the last
 * record that landed whole. The records after it are lost and counted
 * (sb_audit_dropped), and the next record written is a gap record saying how
 * many, so a reader of the file sees the loss in the chain itself. A record
 * cut short by the failure is closed with a newline and the gap record says
 * "torn". docs/audit.md describes the format and the rules.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "obs/audit.h"
#include "obs/audit_chain.h"
#include "obs/log.h"
#include "sb_build_info.h"
#include "util/util.h"

/* one chunk the writer writes at once; a record never exceeds SB_AUDIT_RECORD_MAX */
#define OUT_CAP (1024u * 1024u)
#define MAX_ENDS (OUT_CAP / 64u)
/* how long the writer lets lines gather once one has woken it */
#define COALESCE_NS 2000000

typedef struct st_rec_end_t {
    uint32_t end;     /* offset just past the record's newline */
    uint8_t kind;     /* sb_audit_rec_kind_t */
    uint8_t torn;     /* a gap record that says a record was torn */
    uint64_t carried; /* a gap record: the lost count it carries */
} rec_end_t;

static struct {
    int fd;
    int enabled;
    pthread_t tid;
    pthread_mutex_t mu;
    pthread_cond_t cv, done_cv;
    char *path; /* the audit file, NULL for stderr */
    char *buf;  /* lines, newline-terminated, [0, len) */
    size_t len;
    int stopping;
    int idle;                 /* under mu: the writer waits for lines (only then does a worker wake it) */
    _Atomic uint64_t dropped; /* every line lost: the buffer was full, or the write failed */
    uint64_t overflow;        /* under mu: lines refused since the writer last looked */
    /* a request to the writer (under mu): a checkpoint, then the descriptor swapped for req_fd (-1: none) */
    uint64_t req_gen, done_gen;
    int req_fd;
    const char *req_reason;
    /* the chain: the writer thread's alone once it runs */
    char inst[SB_AUDIT_INST_LEN + 1];
    uint64_t seq;
    uint8_t prev[32];
    EVP_PKEY *key;
    uint8_t pub[32];
    uint64_t every, since_cp, lost, lost_total;
    int torn;      /* the next gap record says a record was torn */
    int torn_open; /* the file ends with a torn record: the next chunk starts with a newline */
    int need_genesis;
    int chunk_nl; /* the chunk starts with that newline */
    /* the chunk being built */
    char *out;
    size_t olen;
    rec_end_t *ends;
    size_t nends;
    uint64_t chunk_seq;
    uint8_t chunk_prev[32];
} A = {
    .fd = -1, .req_fd = -1, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .done_cv = PTHREAD_COND_INITIALIZER};

/* how many bytes went out before the sink failed (n when all did) */
static size_t write_all(const char *p, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = write(A.fd, p + done, n - done);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return done;
}

static void flush_chunk(void)
{
    size_t w, k = 0, whole = 0;

    if (A.olen == 0)
        return;
    w = write_all(A.out, A.olen);
    if (w == A.olen) {
        A.olen = 0;
        A.nends = 0;
        return;
    }
    /* the sink failed part-way: the state goes back to the last record that landed whole */
    while (k < A.nends && A.ends[k].end <= w)
        ++k;
    if (k > 0)
        whole = A.ends[k - 1].end;
    A.seq = A.chunk_seq + k;
    if (k == 0) {
        memcpy(A.prev, A.chunk_prev, 32);
    } else {
        /* the record before ends[k - 1].end, without its newline */
        size_t start = k >= 2 ? A.ends[k - 2].end : 0;
        if (start < whole && A.out[start] == '\n')
            ++start; /* the newline that closed a torn record before the chunk's first */
        sb_audit_hash(A.out + start, whole - 1 - start, A.prev);
    }
    for (size_t i = k; i < A.nends; ++i) {
        if (A.ends[i].kind == SB_AUDIT_REC_CALL) {
            ++A.lost;
            atomic_fetch_add_explicit(&A.dropped, 1, memory_order_relaxed);
        } else if (A.ends[i].kind == SB_AUDIT_REC_GAP) {
            A.lost += A.ends[i].carried;
            A.lost_total -= A.ends[i].carried;
            A.torn |= A.ends[i].torn;
        } else if (A.ends[i].kind == SB_AUDIT_REC_GENESIS) {
            A.need_genesis = 1;
        }
    }
    if (w > whole)
        A.torn = A.torn_open = 1;
    else if (w == 0 && A.chunk_nl)
        A.torn_open = 1;
    A.olen = 0;
    A.nends = 0;
}

/* the time as log.c writes it: 24 characters */
static void ts_now(char out[25])
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(out, 25, "%04u-%02u-%02uT%02u:%02u:%02u.%03uZ", (unsigned)(tm.tm_year + 1900) % 10000u,
             (unsigned)(tm.tm_mon + 1) % 100u, (unsigned)tm.tm_mday % 100u, (unsigned)tm.tm_hour % 100u, (unsigned)tm.tm_min % 100u,
             (unsigned)tm.tm_sec % 100u, (unsigned)(ts.tv_nsec / 1000000) % 1000u);
}

/*
 * Appends one record: the chain prefix, then `rest` (what follows the
 * prefix, with the closing brace unless `sign`), then the signature when
 * `sign`, then the newline. The hash covers the record without the newline.
 */
static void append(const char *rest, size_t rlen, sb_audit_rec_kind_t kind, uint64_t carried, int sign)
{
    char prevhex[65], *rec;
    size_t start;
    int n;

    if (A.olen + 192 + rlen + 2 * SB_AUDIT_SIG_LEN + 16 > OUT_CAP || A.nends == MAX_ENDS)
        flush_chunk();
    if (A.olen == 0) {
        A.chunk_seq = A.seq;
        memcpy(A.chunk_prev, A.prev, 32);
        A.chunk_nl = A.torn_open;
        if (A.torn_open)
            A.out[A.olen++] = '\n'; /* closes what a failed write left of a record */
        A.torn_open = 0;
    }
    start = A.olen;
    rec = A.out + start;
    /* {"seq":<n>,"inst":"<id>","prev":"<hex>", by hand: this runs once per record */
    {
        char num[24], *d = num + sizeof(num), *p = rec;
        uint64_t v = A.seq;
        do {
            *--d = (char)('0' + v % 10);
            v /= 10;
        } while (v != 0);
        memcpy(p, "{\"seq\":", 7);
        p += 7;
        memcpy(p, d, (size_t)(num + sizeof(num) - d));
        p += num + sizeof(num) - d;
        memcpy(p, ",\"inst\":\"", 9);
        p += 9;
        memcpy(p, A.inst, SB_AUDIT_INST_LEN);
        p += SB_AUDIT_INST_LEN;
        memcpy(p, "\",\"prev\":\"", 10);
        p += 10;
        sb_hex(A.prev, 32, prevhex);
        memcpy(p, prevhex, 64);
        p += 64;
        memcpy(p, "\",", 2);
        p += 2;
        n = (int)(p - rec);
    }
    memcpy(rec + n, rest, rlen);
    A.olen += (size_t)n + rlen;
    if (sign) {
        uint8_t sig[SB_AUDIT_SIG_LEN];
        char hex[2 * SB_AUDIT_SIG_LEN + 1];
        if (sb_audit_sign(A.key, rec, A.olen - start, sig) != 0)
            sb_fatal(__FILE__, __LINE__, "Ed25519 signing failed");
        sb_hex(sig, sizeof(sig), hex);
        A.olen += (size_t)snprintf(A.out + A.olen, OUT_CAP - A.olen, ",\"sig\":\"%s\"}", hex);
    }
    sb_audit_hash(rec, A.olen - start, A.prev);
    A.out[A.olen++] = '\n';
    A.ends[A.nends].end = (uint32_t)A.olen;
    A.ends[A.nends].kind = (uint8_t)kind;
    A.ends[A.nends].carried = carried;
    A.ends[A.nends].torn = 0;
    ++A.nends;
    ++A.seq;
}

static void checkpoint(const char *reason)
{
    char rest[256], ts[25];
    int n;
    ts_now(ts);
    n = snprintf(rest, sizeof(rest), "\"ts\":\"%s\",\"event\":\"audit.checkpoint\",\"reason\":\"%s\",\"lost\":%llu%s", ts, reason,
                 (unsigned long long)A.lost_total, A.key != NULL ? "" : "}");
    append(rest, (size_t)n, SB_AUDIT_REC_CHECKPOINT, 0, A.key != NULL);
    A.since_cp = 0;
}

/* the genesis, and a gap record when lines were lost since the last one */
static void pending(void)
{
    char rest[256], ts[25];
    int n;
    if (A.need_genesis) {
        char pubhex[65] = "";
        A.need_genesis = 0;
        if (A.key != NULL)
            sb_hex(A.pub, 32, pubhex);
        ts_now(ts);
        n = snprintf(rest, sizeof(rest), "\"ts\":\"%s\",\"event\":\"audit.genesis\",\"key\":\"%s\",\"version\":\"%s\"%s", ts,
                     pubhex, SB_VERSION, A.key != NULL ? "" : "}");
        append(rest, (size_t)n, SB_AUDIT_REC_GENESIS, 0, A.key != NULL);
    }
    if (A.lost != 0 || A.torn) {
        uint64_t lost = A.lost;
        int torn = A.torn;
        ts_now(ts);
        n = snprintf(rest, sizeof(rest), "\"ts\":\"%s\",\"event\":\"audit.gap\",\"lost\":%llu%s}", ts, (unsigned long long)lost,
                     A.torn ? ",\"torn\":true" : "");
        A.lost_total += lost;
        A.lost = 0;
        A.torn = 0;
        append(rest, (size_t)n, SB_AUDIT_REC_GAP, lost, 0);
        A.ends[A.nends - 1].torn = (uint8_t)torn;
    }
}

static void call_record(const char *line, size_t len)
{
    pending();
    /* the line is a JSON object from log.c: its fields follow the chain prefix */
    if (len < 2 || line[0] != '{' || len > SB_AUDIT_RECORD_MAX - 256)
        return;
    append(line + 1, len - 1, SB_AUDIT_REC_CALL, 0, 0);
    if (++A.since_cp >= A.every)
        checkpoint("every");
}

static void *writer(void *arg)
{
    char *in = sb_mem_alloc(SB_AUDIT_BUFFER);
    (void)arg;
    pending();
    flush_chunk();
    for (;;) {
        size_t n;
        uint64_t over, gen = 0;
        int stop, fd = -1;
        const char *reason = NULL;

        pthread_mutex_lock(&A.mu);
        if (A.len == 0 && !A.stopping && A.req_gen == A.done_gen) {
            A.idle = 1;
            while (A.len == 0 && !A.stopping && A.req_gen == A.done_gen)
                pthread_cond_wait(&A.cv, &A.mu);
            A.idle = 0;
            if (!A.stopping && A.req_gen == A.done_gen) {
                /*
                 * Woken by one line: let more come before taking the batch, so
                 * that under load a wake-up, a chunk and a write serve many
                 * calls instead of one (the workers do not wait for this).
                 */
                pthread_mutex_unlock(&A.mu);
                nanosleep(&(struct timespec){0, COALESCE_NS}, NULL);
                pthread_mutex_lock(&A.mu);
            }
        }
        n = A.len;
        memcpy(in, A.buf, n);
        A.len = 0;
        over = A.overflow;
        A.overflow = 0;
        stop = A.stopping;
        if (A.req_gen != A.done_gen) {
            gen = A.req_gen;
            fd = A.req_fd;
            reason = A.req_reason;
            A.req_fd = -1;
        }
        pthread_mutex_unlock(&A.mu);

        for (size_t i = 0; i < n;) {
            const char *nl = memchr(in + i, '\n', n - i);
            size_t end = (size_t)(nl - in);
            call_record(in + i, end - i);
            i = end + 1;
        }
        /* lines refused while this batch waited: the chain says so after it */
        A.lost += over;
        pending();
        if (reason != NULL) {
            /* rotation or reload: a checkpoint closes the old file, the chain goes on in the new one */
            checkpoint(reason);
            flush_chunk();
            if (fd >= 0) {
                dup3(fd, A.fd, O_CLOEXEC);
                close(fd);
                /* and one opens the new file, so each file can be verified from its own start (retention drops old ones) */
                checkpoint("reopen");
                pending();
                flush_chunk();
            }
            pthread_mutex_lock(&A.mu);
            A.done_gen = gen;
            pthread_cond_broadcast(&A.done_cv);
            pthread_mutex_unlock(&A.mu);
            continue;
        }
        if (stop && n == 0) {
            checkpoint("shutdown");
            flush_chunk();
            break;
        }
        flush_chunk();
    }
    sb_mem_free(in);
    return NULL;
}

static sb_status_t load_key(const char *key_file, char *err, size_t errsz, EVP_PKEY **out)
{
    char kerr[384];
    *out = NULL;
    if (key_file == NULL)
        return SB_OK;
    if ((*out = sb_audit_key_read_private(key_file, kerr, sizeof(kerr))) == NULL) {
        snprintf(err, errsz, "audit_key_file: %s", kerr);
        return SB_E_BAD_ARGS;
    }
    return SB_OK;
}

sb_status_t sb_audit_check(const char *target, const char *key_file, char *err, size_t errsz)
{
    EVP_PKEY *key;
    int fd;
    if (load_key(key_file, err, errsz, &key) != SB_OK)
        return SB_E_BAD_ARGS;
    EVP_PKEY_free(key);
    if (target == NULL || strcmp(target, "off") == 0 || strcmp(target, "stderr") == 0)
        return SB_OK;
    if ((fd = sb_log_open_append("audit", target, err, errsz)) < 0)
        return SB_E_BAD_ARGS;
    close(fd);
    return SB_OK;
}

sb_status_t sb_audit_open(const char *target, const char *key_file, uint64_t checkpoint_every, char *err, size_t errsz)
{
    uint8_t id[SB_AUDIT_INST_LEN / 2];

    if (target == NULL || strcmp(target, "off") == 0)
        return SB_OK;
    if (load_key(key_file, err, errsz, &A.key) != SB_OK)
        return SB_E_BAD_ARGS;
    if (A.key != NULL && sb_audit_key_raw(A.key, A.pub) != 0)
        sb_fatal(__FILE__, __LINE__, "the audit key has no raw public key");
    if (sb_random(id, sizeof(id)) != SB_OK) {
        snprintf(err, errsz, "audit: no random bytes for the stream's instance id");
        goto Fail;
    }
    if (strcmp(target, "stderr") == 0) {
        A.fd = 2;
    } else {
        if ((A.fd = sb_log_open_append("audit", target, err, errsz)) < 0)
            goto Fail;
        A.path = sb_mem_strdup(target);
    }
    sb_hex(id, sizeof(id), A.inst);
    A.seq = 0;
    memset(A.prev, 0, sizeof(A.prev));
    A.every = checkpoint_every != 0 ? checkpoint_every : 1000;
    A.need_genesis = 1;
    A.buf = sb_mem_alloc(SB_AUDIT_BUFFER);
    A.out = sb_mem_alloc(OUT_CAP);
    A.ends = sb_mem_calloc(MAX_ENDS, sizeof(*A.ends));
    A.enabled = 1;
    pthread_create(&A.tid, NULL, writer, NULL);
    return SB_OK;
Fail:
    EVP_PKEY_free(A.key);
    A.key = NULL;
    return SB_E_BAD_ARGS;
}

void sb_audit_close(void)
{
    if (!A.enabled)
        return;
    pthread_mutex_lock(&A.mu);
    A.stopping = 1;
    pthread_cond_signal(&A.cv);
    pthread_mutex_unlock(&A.mu);
    pthread_join(A.tid, NULL);
    pthread_mutex_lock(&A.mu);
    A.enabled = 0;
    if (A.req_fd >= 0)
        close(A.req_fd);
    A.req_fd = -1;
    A.done_gen = A.req_gen;
    pthread_cond_broadcast(&A.done_cv);
    pthread_mutex_unlock(&A.mu);
    if (A.fd > 2)
        close(A.fd);
    sb_mem_free(A.buf);
    A.buf = NULL;
    sb_mem_free(A.out);
    A.out = NULL;
    sb_mem_free(A.ends);
    A.ends = NULL;
    sb_mem_free(A.path);
    A.path = NULL;
    EVP_PKEY_free(A.key);
    A.key = NULL;
}

sb_status_t sb_audit_reopen(const char *reason, char *err, size_t errsz)
{
    int fd = -1;
    uint64_t gen;
    if (!A.enabled)
        return SB_OK;
    if (A.path != NULL && (fd = sb_log_open_append("audit", A.path, err, errsz)) < 0)
        return SB_E_UNAVAILABLE;
    /*
     * The writer does the swap between two chunks: the old file ends with a
     * checkpoint and the new one goes on from it. The descriptor number
     * stays, the file under it changes.
     */
    pthread_mutex_lock(&A.mu);
    if (A.req_fd >= 0)
        close(A.req_fd); /* an earlier request the writer has not taken yet: this one supersedes it */
    A.req_fd = fd;
    A.req_reason = reason;
    gen = ++A.req_gen;
    pthread_cond_signal(&A.cv);
    while (A.done_gen < gen && A.enabled)
        pthread_cond_wait(&A.done_cv, &A.mu);
    pthread_mutex_unlock(&A.mu);
    return SB_OK;
}

int sb_audit_enabled(void)
{
    return A.enabled;
}

void sb_audit_write(const char *line, size_t len)
{
    if (!A.enabled)
        return;
    pthread_mutex_lock(&A.mu);
    if (A.len + len + 1 > SB_AUDIT_BUFFER) {
        ++A.overflow;
        pthread_mutex_unlock(&A.mu);
        atomic_fetch_add_explicit(&A.dropped, 1, memory_order_relaxed);
        return;
    }
    memcpy(A.buf + A.len, line, len);
    A.buf[A.len + len] = '\n';
    A.len += len + 1;
    if (A.idle)
        pthread_cond_signal(&A.cv);
    pthread_mutex_unlock(&A.mu);
}

uint64_t sb_audit_dropped(void)
{
    return atomic_load_explicit(&A.dropped, memory_order_relaxed);
}

const char *sb_audit_instance(void)
{
    return A.enabled ? A.inst : NULL;
}
