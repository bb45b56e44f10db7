#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "obs/audit.h"
#include "obs/log.h"
#include "util/util.h"

static struct {
    int fd;
    int enabled;
    pthread_t tid;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_mutex_t io_mu; /* held while the writer writes, so a reopen never splits a batch of lines */
    char *path;            /* the audit file, NULL for stderr */
    char *buf;             /* lines, newline-terminated, [0, len) */
    size_t len;
    int stopping;
    _Atomic uint64_t dropped;
} A = {.fd = -1, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .io_mu = PTHREAD_MUTEX_INITIALIZER};

static void write_all(const char *p, size_t n)
{
    while (n != 0) {
        ssize_t r = write(A.fd, p, n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return; /* the sink failed: the lines are lost, the broker goes on */
        }
        p += r;
        n -= (size_t)r;
    }
}

static void *writer(void *arg)
{
    char *out = sb_mem_alloc(SB_AUDIT_BUFFER);
    for (;;) {
        size_t n;
        int stop;
        pthread_mutex_lock(&A.mu);
        while (A.len == 0 && !A.stopping)
            pthread_cond_wait(&A.cv, &A.mu);
        n = A.len;
        memcpy(out, A.buf, n);
        A.len = 0;
        stop = A.stopping;
        pthread_mutex_unlock(&A.mu);
        pthread_mutex_lock(&A.io_mu);
        write_all(out, n);
        pthread_mutex_unlock(&A.io_mu);
        if (stop && n == 0)
            break;
    }
    sb_mem_free(out);
    return NULL;
}

sb_status_t sb_audit_check(const char *target, char *err, size_t errsz)
{
    int fd;
    if (target == NULL || strcmp(target, "off") == 0 || strcmp(target, "stderr") == 0)
        return SB_OK;
    if ((fd = sb_log_open_append("audit", target, err, errsz)) < 0)
        return SB_E_BAD_ARGS;
    close(fd);
    return SB_OK;
}

sb_status_t sb_audit_open(const char *target, char *err, size_t errsz)
{
    if (target == NULL || strcmp(target, "off") == 0)
        return SB_OK;
    if (strcmp(target, "stderr") == 0) {
        A.fd = 2;
    } else {
        if ((A.fd = sb_log_open_append("audit", target, err, errsz)) < 0)
            return SB_E_BAD_ARGS;
        A.path = sb_mem_strdup(target);
    }
    A.buf = sb_mem_alloc(SB_AUDIT_BUFFER);
    A.enabled = 1;
    pthread_create(&A.tid, NULL, writer, NULL);
    return SB_OK;
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
    if (A.fd > 2)
        close(A.fd);
    sb_mem_free(A.buf);
    A.buf = NULL;
    sb_mem_free(A.path);
    A.path = NULL;
    A.enabled = 0;
}

sb_status_t sb_audit_reopen(char *err, size_t errsz)
{
    int fd;
    if (!A.enabled || A.path == NULL)
        return SB_OK;
    if ((fd = sb_log_open_append("audit", A.path, err, errsz)) < 0)
        return SB_E_UNAVAILABLE;
    /*
     * The descriptor number stays, the file under it changes: lines the writer
     * holds are written to the old file before the swap or to the new one
     * after it, whole, since the writer holds io_mu for a batch.
     */
    pthread_mutex_lock(&A.io_mu);
    dup3(fd, A.fd, O_CLOEXEC);
    pthread_mutex_unlock(&A.io_mu);
    close(fd);
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
        pthread_mutex_unlock(&A.mu);
        atomic_fetch_add_explicit(&A.dropped, 1, memory_order_relaxed);
        return;
    }
    memcpy(A.buf + A.len, line, len);
    A.buf[A.len + len] = '\n';
    A.len += len + 1;
    pthread_cond_signal(&A.cv);
    pthread_mutex_unlock(&A.mu);
}

uint64_t sb_audit_dropped(void)
{
    return atomic_load_explicit(&A.dropped, memory_order_relaxed);
}
