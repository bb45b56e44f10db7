/*
 * sandbox-broker audit-verify [--key PUBKEY] [--allow-open] FILE...
 * sandbox-broker audit-pubkey KEYFILE
 *
 * The verifier reads the files in the order given (oldest first, as rotation
 * made them) and follows each instance's stream through them: every record
 * must carry the next seq and the hash of the one before it, every genesis and
 * checkpoint must carry a good signature, and every stream must end with its
 * "shutdown" checkpoint. The first record that breaks a rule is named with its
 * file and line and what most likely happened to it (docs/audit.md lists the
 * messages). A chain without a key is only as good as SHA-256 is against
 * someone who can rewrite the whole file: the signatures are what make a
 * rewrite detectable, so --key (the public key an operator keeps apart from
 * the logs) is what an audit should use.
 */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <openssl/pem.h>
#include "obs/audit_chain.h"
#include "obs/audit_verify.h"
#include "util/util.h"

#define MAX_STREAMS 65536
#define READ_CHUNK (1024u * 1024u)

typedef struct st_where_t {
    const char *file;
    uint64_t line;
} where_t;

typedef struct st_stream_t {
    char inst[SB_AUDIT_INST_LEN + 1];
    uint64_t next;         /* the seq expected next */
    uint8_t last[32];      /* the hash of the last record */
    uint8_t last_prev[32]; /* the prev field of the last record */
    uint64_t last_seq;
    where_t last_at;
    int has_key; /* the stream is signed by `key` */
    uint8_t key[32];
    int key_checked;   /* the signatures were checked (against --key or the genesis) */
    int sig_unchecked; /* it carries signatures that no key was there to check */
    int from_genesis;
    where_t cp_at; /* the last checkpoint */
    uint64_t cp_seq;
    int have_cp, closed;
    uint64_t records, checkpoints, gaps, lost, since_cp, first_seq;
    where_t first_at;
    /* a seq that jumped ahead: a removal, or the first of a reordered pair (the next record tells) */
    int jumped;
    where_t jump_at;
    uint64_t jump_seq, jump_expected;
} stream_t;

struct st_sb_audit_verifier_t {
    int have_key, allow_open;
    uint8_t key[32];
    stream_t *streams;
    size_t nstreams;
    /* a line that is not a record, waiting for the gap record that says "torn" */
    int bad_pending, bad_partial;
    where_t bad_at;
    const char *bad_why;
    const char *last_file; /* the file read last: only there may a stream stay open (--allow-open) */
    FILE *out;
    int failed;
    uint64_t records;
};

static void hexs(const uint8_t *p, size_t n, char *out)
{
    sb_hex(p, n, out);
}

__attribute__((format(printf, 3, 4))) static int fail(sb_audit_verifier_t *v, where_t at, const char *fmt, ...)
{
    va_list ap;
    if (v->failed)
        return -1;
    v->failed = 1;
    if (v->out != NULL) {
        fprintf(v->out, "audit-verify: FAILED: %s:%llu: ", at.file, (unsigned long long)at.line);
        va_start(ap, fmt);
        vfprintf(v->out, fmt, ap);
        va_end(ap);
        fputc('\n', v->out);
    }
    return -1;
}

sb_audit_verifier_t *sb_audit_verifier_new(const uint8_t *key, int allow_open, FILE *out)
{
    sb_audit_verifier_t *v = sb_mem_calloc(1, sizeof(*v));
    if (key != NULL) {
        v->have_key = 1;
        memcpy(v->key, key, 32);
    }
    v->allow_open = allow_open;
    v->out = out;
    return v;
}

void sb_audit_verifier_free(sb_audit_verifier_t *v)
{
    if (v == NULL)
        return;
    sb_mem_free(v->streams);
    sb_mem_free(v);
}

static stream_t *find_stream(sb_audit_verifier_t *v, const char *inst)
{
    for (size_t i = 0; i < v->nstreams; ++i)
        if (memcmp(v->streams[i].inst, inst, SB_AUDIT_INST_LEN) == 0)
            return &v->streams[i];
    return NULL;
}

static int check_sig(sb_audit_verifier_t *v, stream_t *s, where_t at, const sb_audit_record_t *r, const char *line)
{
    const uint8_t *pub = v->have_key ? v->key : s->has_key ? s->key : NULL;
    if (pub == NULL) {
        /* a stream whose genesis is not in the files given, and no --key: said, never called checked */
        if (r->has_sig)
            s->sig_unchecked = 1;
        return 0;
    }
    if (!r->has_sig)
        return fail(v, at, "%s seq %llu of instance %s has no signature in a signed stream (edited)",
                    r->kind == SB_AUDIT_REC_GENESIS ? "genesis" : "checkpoint", (unsigned long long)r->seq, r->inst);
    if (!sb_audit_sig_ok(pub, line, r->signed_len, r->sig)) {
        if (r->kind == SB_AUDIT_REC_GENESIS)
            return fail(v, at, "genesis of instance %s: the signature does not match (edited or forged)", r->inst);
        if (s->have_cp)
            return fail(v, at,
                        "checkpoint seq %llu of instance %s: the signature does not match: the records since the %s at "
                        "%s:%llu (seq %llu) were rewritten, or this checkpoint was edited",
                        (unsigned long long)r->seq, r->inst, s->cp_seq == 0 && s->from_genesis ? "genesis" : "checkpoint",
                        s->cp_at.file, (unsigned long long)s->cp_at.line, (unsigned long long)s->cp_seq);
        return fail(v, at,
                    "checkpoint seq %llu of instance %s: the signature does not match: the records before it were rewritten, "
                    "or this checkpoint was edited",
                    (unsigned long long)r->seq, r->inst);
    }
    s->key_checked = 1;
    return 0;
}

/* the next record of a stream whose seq jumped: a reordering when it is the one expected, else a removal */
static int resolve_jump(sb_audit_verifier_t *v, stream_t *s, const sb_audit_record_t *r, where_t at)
{
    if (r != NULL && r->seq == s->jump_expected)
        return fail(
            v, s->jump_at, "record seq %llu of instance %s is out of order (reordered): seq %llu comes after it, at %s:%llu",
            (unsigned long long)s->jump_seq, s->inst, (unsigned long long)s->jump_expected, at.file, (unsigned long long)at.line);
    return fail(v, s->jump_at, "records seq %llu..%llu of instance %s are missing before this one (seq %llu): removed",
                (unsigned long long)s->jump_expected, (unsigned long long)s->jump_seq - 1, s->inst,
                (unsigned long long)s->jump_seq);
}

static int record(sb_audit_verifier_t *v, where_t at, const char *line, size_t len, const sb_audit_record_t *r)
{
    stream_t *s = find_stream(v, r->inst);
    uint8_t h[32];

    if (s == NULL) {
        /*
         * A stream starts at its genesis, or (its older files dropped by retention) at the "reopen"
         * checkpoint the writer puts first in every new file; any other record first means the
         * records before it were removed.
         */
        if (r->kind != SB_AUDIT_REC_GENESIS && !(r->kind == SB_AUDIT_REC_CHECKPOINT && strcmp(r->reason, "reopen") == 0))
            return fail(v, at,
                        "record seq %llu of instance %s comes before any genesis or reopen checkpoint of its stream: the "
                        "records before it were removed, or it was inserted",
                        (unsigned long long)r->seq, r->inst);
        if (r->kind == SB_AUDIT_REC_GENESIS) {
            static const uint8_t zero[32];
            if (memcmp(r->prev, zero, 32) != 0)
                return fail(v, at, "genesis of instance %s does not start a chain (edited)", r->inst);
        }
        if (v->nstreams == MAX_STREAMS)
            return fail(v, at, "more than %u streams", MAX_STREAMS);
        v->streams = sb_mem_realloc(v->streams, (v->nstreams + 1) * sizeof(*v->streams));
        s = &v->streams[v->nstreams++];
        memset(s, 0, sizeof(*s));
        memcpy(s->inst, r->inst, sizeof(s->inst));
        s->next = r->seq;
        s->first_seq = r->seq;
        s->first_at = at;
        memcpy(s->last, r->prev, 32);
        s->from_genesis = r->kind == SB_AUDIT_REC_GENESIS;
        if (r->kind == SB_AUDIT_REC_GENESIS && r->has_key) {
            s->has_key = 1;
            memcpy(s->key, r->key, 32);
        }
        if (v->have_key && r->kind == SB_AUDIT_REC_GENESIS && (!r->has_key || memcmp(r->key, v->key, 32) != 0))
            return fail(v, at, "instance %s's genesis %s", r->inst,
                        r->has_key ? "names another key than --key" : "names no key: the stream is not signed");
    } else if (s->jumped) {
        return resolve_jump(v, s, r, at);
    } else if (s->closed) {
        return fail(v, at, "record seq %llu of instance %s comes after the stream's shutdown checkpoint at %s:%llu (inserted)",
                    (unsigned long long)r->seq, r->inst, s->cp_at.file, (unsigned long long)s->cp_at.line);
    }
    if (r->seq > s->next) {
        s->jumped = 1;
        s->jump_at = at;
        s->jump_seq = r->seq;
        s->jump_expected = s->next;
        return 0;
    }
    if (r->seq < s->next) {
        if (s->records != 0 && r->seq == s->last_seq && memcmp(r->prev, s->last_prev, 32) == 0)
            return fail(v, s->last_at,
                        "record seq %llu of instance %s was inserted: the record after it (%s:%llu) has the same seq and "
                        "follows the record before it",
                        (unsigned long long)s->last_seq, r->inst, at.file, (unsigned long long)at.line);
        return fail(v, at, "record seq %llu of instance %s is out of order (reordered or inserted): seq %llu was expected",
                    (unsigned long long)r->seq, r->inst, (unsigned long long)s->next);
    }
    if (memcmp(r->prev, s->last, 32) != 0) {
        if (s->records == 0)
            return fail(v, at, "record seq %llu of instance %s does not chain (edited)", (unsigned long long)r->seq, r->inst);
        return fail(v, s->last_at, "record seq %llu of instance %s was edited: the record after it (%s:%llu) chains to other bytes",
                    (unsigned long long)s->last_seq, r->inst, at.file, (unsigned long long)at.line);
    }
    if ((r->kind == SB_AUDIT_REC_GENESIS || r->kind == SB_AUDIT_REC_CHECKPOINT) && check_sig(v, s, at, r, line) != 0)
        return -1;
    if (r->kind == SB_AUDIT_REC_GENESIS && s->records != 0)
        return fail(v, at, "a second genesis for instance %s (inserted)", r->inst);
    sb_audit_hash(line, len, h);
    memcpy(s->last, h, 32);
    memcpy(s->last_prev, r->prev, 32);
    s->last_seq = r->seq;
    s->last_at = at;
    s->next = r->seq + 1;
    ++s->records;
    ++v->records;
    if (r->kind == SB_AUDIT_REC_GENESIS) {
        /* the genesis anchors the stream as a checkpoint does */
        s->have_cp = 1;
        s->cp_at = at;
        s->cp_seq = 0;
    } else if (r->kind == SB_AUDIT_REC_CHECKPOINT) {
        s->have_cp = 1;
        s->cp_at = at;
        s->cp_seq = r->seq;
        s->since_cp = 0;
        ++s->checkpoints;
        if (strcmp(r->reason, "shutdown") == 0)
            s->closed = 1;
    } else {
        ++s->since_cp;
    }
    if (r->kind == SB_AUDIT_REC_GAP) {
        ++s->gaps;
        s->lost += r->lost;
        if (v->out != NULL)
            fprintf(v->out,
                    "audit-verify: note: %s:%llu: instance %s lost %llu record%s here%s (the writer could not write them)\n",
                    at.file, (unsigned long long)at.line, r->inst, (unsigned long long)r->lost, r->lost == 1 ? "" : "s",
                    r->torn ? ", one of them torn" : "");
    }
    return 0;
}

static int bad_line(sb_audit_verifier_t *v)
{
    if (v->bad_partial)
        return fail(v, v->bad_at, "the file ends inside a record (truncated)");
    return fail(v, v->bad_at, "not an audit chain record (inserted, or edited): %s", v->bad_why);
}

int sb_audit_verifier_line(sb_audit_verifier_t *v, const char *file, uint64_t lineno, const char *line, size_t len)
{
    sb_audit_record_t r;
    const char *why;
    where_t at = {file, lineno};

    if (v->failed)
        return -1;
    if (sb_audit_record_parse(line, len, &r, &why) != SB_OK) {
        /* the newline that closes a record torn at the end of the file before: not a second bad line */
        if (v->bad_pending && v->bad_partial && lineno == 1 && len == 0)
            return 0;
        /* one line is held back: a write that failed part-way leaves one torn record, and a gap record says so */
        if (v->bad_pending)
            return bad_line(v);
        v->bad_pending = 1;
        v->bad_partial = 0;
        v->bad_at = at;
        v->bad_why = why;
        return 0;
    }
    /*
     * A line that is not a record must be followed by the gap record that says "torn", the
     * writer's own account of a write that failed part-way, before any other record: only a
     * "reopen" checkpoint (the next file's first record) may come between them. Anything else
     * next, or a second such line, and the line was inserted or edited.
     */
    if (v->bad_pending) {
        if (r.kind == SB_AUDIT_REC_GAP && r.torn)
            v->bad_pending = 0;
        else if (!(r.kind == SB_AUDIT_REC_CHECKPOINT && strcmp(r.reason, "reopen") == 0))
            return bad_line(v);
    }
    return record(v, at, line, len, &r);
}

int sb_audit_verifier_end_file(sb_audit_verifier_t *v, const char *file, uint64_t lineno, int partial)
{
    where_t at = {file, lineno};
    if (v->failed)
        return -1;
    v->last_file = file;
    /* a torn record (a write that failed part-way) is closed by the gap record in the next file */
    if (partial && v->bad_pending)
        return bad_line(v);
    if (partial) {
        v->bad_pending = 1;
        v->bad_partial = 1;
        v->bad_at = at;
        v->bad_why = "the file ends inside a record";
    }
    return 0;
}

int sb_audit_verifier_finish(sb_audit_verifier_t *v)
{
    if (v->failed)
        return -1;
    /* --allow-open is for the file a live broker still writes: the last one given, never an older one */
    if (v->bad_pending && !(v->bad_partial && v->allow_open && v->bad_at.file == v->last_file))
        return bad_line(v);
    for (size_t i = 0; i < v->nstreams; ++i) {
        stream_t *s = &v->streams[i];
        if (s->jumped)
            return resolve_jump(v, s, NULL, s->jump_at);
        if (!s->closed && !(v->allow_open && s->last_at.file == v->last_file))
            return fail(v, s->last_at,
                        "the stream of instance %s ends at seq %llu without its shutdown checkpoint: the records after it were "
                        "truncated (or the broker is still running, or crashed: --allow-open accepts a stream left open in the "
                        "last file given)",
                        s->inst, (unsigned long long)s->last_seq);
    }
    if (v->out != NULL) {
        for (size_t i = 0; i < v->nstreams; ++i) {
            stream_t *s = &v->streams[i];
            char key[65] = "";
            if (s->has_key || v->have_key)
                hexs(v->have_key ? v->key : s->key, 32, key);
            fprintf(v->out, "stream %s: seq %llu..%llu, %llu records, %llu checkpoints, %llu gaps (%llu records lost), %s%s%s, %s",
                    s->inst, (unsigned long long)s->first_seq, (unsigned long long)s->last_seq, (unsigned long long)s->records,
                    (unsigned long long)s->checkpoints, (unsigned long long)s->gaps, (unsigned long long)s->lost,
                    s->key_checked     ? "signed by "
                    : s->has_key       ? "signature not checked "
                    : s->sig_unchecked ? "signed, but not checked (its genesis is not in the files given: give --key)"
                                       : "unsigned",
                    s->key_checked ? key : "", s->key_checked && !v->have_key ? " (the genesis's key: give --key to pin it)" : "",
                    s->closed ? "closed" : "open");
            if (!s->closed)
                fprintf(v->out, " (%llu records after the last checkpoint are not covered by a signature)",
                        (unsigned long long)s->since_cp);
            if (!s->from_genesis)
                fprintf(v->out, "; starts at checkpoint seq %llu at %s:%llu: the records before it are not in the files given",
                        (unsigned long long)s->first_seq, s->first_at.file, (unsigned long long)s->first_at.line);
            fputc('\n', v->out);
        }
        fprintf(v->out, "audit-verify: OK: %llu records in %zu streams\n", (unsigned long long)v->records, v->nstreams);
    }
    return 0;
}

static int verify_file(sb_audit_verifier_t *v, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    char *buf;
    size_t have = 0;
    uint64_t lineno = 0;
    int rc = 0;

    if (fd < 0) {
        fprintf(stderr, "audit-verify: %s: %s\n", path, strerror(errno));
        return 2;
    }
    buf = sb_mem_alloc(READ_CHUNK + SB_AUDIT_RECORD_MAX + 2);
    for (;;) {
        ssize_t n = read(fd, buf + have, READ_CHUNK + SB_AUDIT_RECORD_MAX + 2 - have);
        size_t start = 0;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "audit-verify: %s: %s\n", path, strerror(errno));
            rc = 2;
            break;
        }
        have += (size_t)n;
        for (;;) {
            char *nl = memchr(buf + start, '\n', have - start);
            if (nl == NULL)
                break;
            if (sb_audit_verifier_line(v, path, ++lineno, buf + start, (size_t)(nl - buf - start)) != 0) {
                rc = 1;
                goto Exit;
            }
            start = (size_t)(nl - buf) + 1;
        }
        memmove(buf, buf + start, have - start);
        have -= start;
        if (n == 0)
            break;
        if (have > SB_AUDIT_RECORD_MAX) {
            /* longer than any record: one bad line, read past it */
            if (sb_audit_verifier_line(v, path, ++lineno, buf, have) != 0) {
                rc = 1;
                goto Exit;
            }
            have = 0;
            for (;;) {
                char c;
                ssize_t m = read(fd, &c, 1);
                if (m <= 0 || c == '\n')
                    break;
            }
        }
    }
    if (rc == 0 && sb_audit_verifier_end_file(v, path, lineno + 1, have != 0) != 0)
        rc = 1;
Exit:
    sb_mem_free(buf);
    close(fd);
    return rc;
}

int sb_audit_verify_main(int argc, char **argv)
{
    const char *key_path = NULL;
    int allow_open = 0, i = 0, rc = 0;
    uint8_t key[32];
    sb_audit_verifier_t *v;

    for (; i < argc; ++i) {
        if (strcmp(argv[i], "--key") == 0 && i + 1 < argc)
            key_path = argv[++i];
        else if (strcmp(argv[i], "--allow-open") == 0)
            allow_open = 1;
        else if (strcmp(argv[i], "--") == 0 && ++i)
            break;
        else if (argv[i][0] == '-')
            goto Usage;
        else
            break;
    }
    if (i == argc)
        goto Usage;
    if (key_path != NULL) {
        char err[512];
        EVP_PKEY *k = sb_audit_key_read_public(key_path, err, sizeof(err));
        if (k == NULL) {
            fprintf(stderr, "audit-verify: --key %s\n", err);
            return 2;
        }
        if (sb_audit_key_raw(k, key) != 0)
            sb_fatal(__FILE__, __LINE__, "an Ed25519 key without its raw public key");
        EVP_PKEY_free(k);
    }
    v = sb_audit_verifier_new(key_path != NULL ? key : NULL, allow_open, stdout);
    for (; i < argc && rc == 0; ++i)
        rc = verify_file(v, argv[i]);
    if (rc == 0 && sb_audit_verifier_finish(v) != 0)
        rc = 1;
    sb_audit_verifier_free(v);
    fflush(stdout);
    return rc;
Usage:
    fprintf(stderr, "usage: sandbox-broker audit-verify [--key PUBKEY] [--allow-open] FILE...\n"
                    "  FILE...       the audit files, oldest first (audit.log.2 audit.log.1 audit.log)\n"
                    "  --key PUBKEY  the Ed25519 public key (PEM) the checkpoints must be signed with\n"
                    "  --allow-open  accept streams without their shutdown checkpoint (a running broker's file)\n"
                    "exit status: 0 verified, 1 a record was edited, removed, inserted, reordered or truncated, 2 usage or I/O\n");
    return 2;
}

int sb_audit_pubkey_main(int argc, char **argv)
{
    char err[512], hex[65];
    uint8_t raw[32];
    EVP_PKEY *k;

    if (argc != 1 || argv[0][0] == '-') {
        fprintf(stderr, "usage: sandbox-broker audit-pubkey KEYFILE\n"
                        "  prints the public key of the audit_key_file KEYFILE (PEM, for audit-verify --key) and its hex form\n"
                        "  (as the genesis record names it)\n");
        return 2;
    }
    if ((k = sb_audit_key_read_private(argv[0], err, sizeof(err))) == NULL) {
        fprintf(stderr, "audit-pubkey: %s\n", err);
        return 1;
    }
    if (sb_audit_key_raw(k, raw) != 0 || PEM_write_PUBKEY(stdout, k) != 1) {
        fprintf(stderr, "audit-pubkey: cannot write the public key\n");
        EVP_PKEY_free(k);
        return 1;
    }
    EVP_PKEY_free(k);
    sb_hex(raw, 32, hex);
    printf("# raw: %s\n", hex);
    return 0;
}
