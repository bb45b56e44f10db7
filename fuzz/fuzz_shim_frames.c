/*
 * libFuzzer driver for supervisor-shim/relay/frames.c: the shim's guest-frame
 * reader, which turns the bytes a hostile guest writes to stdout into frames
 * (proto's capped frame reader) and validated call/result messages. relay.c
 * runs exactly this code; only the run's state rules (call after result,
 * duplicate in-flight id, --max-calls, result racing calls) stay in relay.c.
 *
 * frames.c is compiled into this driver (#include below, as tests/unit/ may
 * include the .c they test), so it gets the fuzzing instrumentation and the
 * driver needs nothing from fuzz/CMakeLists.txt beyond proto/.
 *
 * Input: byte 0 picks the mode.
 *  - even: the rest is a raw guest stdout stream. It is fed to
 *    sb_shim_frames_next the way relay.c feeds it (the unused rest of each
 *    read goes back in; the first error ends the stream), once whole and once
 *    in random chunks. Properties:
 *      1. the two runs produce the same messages (kind, status, reason, id,
 *         method), so chunking never changes a verdict;
 *      2. every frame agrees with an independent reference (its own framing
 *         walk, then msgpack-c over sb_mp_check-ed bytes): a call is accepted
 *         exactly when the frame contract says it is valid, so a rejected
 *         frame is never handed to the relay, and a frame the contract
 *         accepts is never refused;
 *      3. an accepted call is relayed faithfully: sb_shim_call_body yields
 *         {method, args?} with the frame's method and args (re-packed bytes equal);
 *      4. an accepted result is consistent (logs an array of at most 1000
 *         strings of at most 1 MiB in all, error exactly when not ok, no
 *         output when not ok);
 *      5. AGAIN consumes all input; nothing is used past the bytes given.
 *  - odd: the rest describes one call: a flags byte (see F_* below), an
 *    8-byte id, a method length byte and the method, then the args (a msgpack
 *    value if the bytes are one, else a bin; or a large bin, to reach the
 *    per-method caps). It is encoded as a frame (optionally followed by a
 *    copy, or mutated: extra key, negative id, wrong kind) and streamed in
 *    random chunks. Property: a valid call round-trips (id, method and args
 *    come back equal, and so does the relayed body); an invalid one (method
 *    empty, above 256 bytes, with NUL or bad UTF-8, frame above the method's
 *    cap, or a mutation) is refused with its reason.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <msgpack.h>
#include "sb/frame.h"
#include "sb/limits.h"
#include "sb/method.h"
#include "sb/value.h"
#include "fuzz.h"
#include "../supervisor-shim/relay/frames.c"

#define MAX_EVENTS 4096

typedef struct st_event_t {
    sb_status_t st;
    sb_shim_msg_kind_t kind;
    const char *why; /* static strings: compared by pointer */
    uint64_t id;
    size_t method_off, method_len; /* the method as an offset into the payload (calls) */
    int has_args;
} event_t;

/* ---- the reference: framing walk and frame contract, written independently of frames.c ---- */

typedef enum en_ref_class_t { REF_LEN_ZERO, REF_LEN_BIG, REF_BAD_FRAME, REF_CALL_OK, REF_CALL_BAD, REF_RESULT } ref_class_t;

static const msgpack_object *ref_key(const msgpack_object *map, const char *k)
{
    size_t n = strlen(k);
    for (uint32_t i = 0; i < map->via.map.size; ++i) {
        const msgpack_object *key = &map->via.map.ptr[i].key;
        if (key->type == MSGPACK_OBJECT_STR && key->via.str.size == n && memcmp(key->via.str.ptr, k, n) == 0)
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

/* PROTOCOL.md section 2: which kind of frame `p` is, and for a call whether it is valid */
static ref_class_t ref_classify(const uint8_t *p, size_t len, uint64_t *id, const msgpack_object **method_out, msgpack_unpacked *u)
{
    size_t obj_len = 0, off = 0;
    const char *why = NULL;
    const msgpack_object *t, *id_o, *method, *args;
    uint32_t known = 0;

    /* the value rules (UTF-8, unique keys, depth, nodes, ext, 0xc1, floats) are proto's, fuzzed by fuzz_mpcheck */
    if (sb_mp_check(p, len, &obj_len, &why) != SB_OK || obj_len != len)
        return REF_BAD_FRAME;
    /* safe now: every container count is bounded by the bytes that exist */
    if (msgpack_unpack_next(u, (const char *)p, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len)
        return REF_BAD_FRAME;
    if (u->data.type != MSGPACK_OBJECT_MAP || (t = ref_key(&u->data, "t")) == NULL || t->type != MSGPACK_OBJECT_STR)
        return REF_BAD_FRAME;
    if (t->via.str.size == 6 && memcmp(t->via.str.ptr, "result", 6) == 0)
        return REF_RESULT;
    if (!(t->via.str.size == 4 && memcmp(t->via.str.ptr, "call", 4) == 0))
        return REF_BAD_FRAME;
    id_o = ref_key(&u->data, "id");
    method = ref_key(&u->data, "method");
    args = ref_key(&u->data, "args");
    known = 1u + (id_o != NULL) + (method != NULL) + (args != NULL);
    if (u->data.via.map.size != known || id_o == NULL || id_o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || method == NULL ||
        method->type != MSGPACK_OBJECT_STR)
        return REF_CALL_BAD;
    if (method->via.str.size < 1 || method->via.str.size > 256)
        return REF_CALL_BAD;
    for (uint32_t i = 0; i < method->via.str.size; ++i)
        if (method->via.str.ptr[i] == '\0')
            return REF_CALL_BAD;
    if (len > sb_method_request_cap_str(method->via.str.ptr, method->via.str.size) + 1024)
        return REF_CALL_BAD;
    *id = id_o->via.u64;
    *method_out = method;
    return REF_CALL_OK;
}

/* re-packs a msgpack object (for byte comparisons) into `sb`, which the caller destroys */
static void repack(const msgpack_object *o, msgpack_sbuffer *sb)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    sb_mp_pack_object(&pk, o);
}

static int same_object(const msgpack_object *a, const msgpack_object *b)
{
    msgpack_sbuffer x, y;
    int same;
    repack(a, &x);
    repack(b, &y);
    same = x.size == y.size && (x.size == 0 || memcmp(x.data, y.data, x.size) == 0);
    msgpack_sbuffer_destroy(&x);
    msgpack_sbuffer_destroy(&y);
    return same;
}

/* property 3: the body the relay would POST is {method, args?} with the frame's values */
static void check_relayed(const sb_shim_msg_t *m, const msgpack_object *frame_args)
{
    msgpack_sbuffer body;
    msgpack_zone zone;
    msgpack_object o;
    const msgpack_object *method, *args;
    const char *why = NULL;

    msgpack_sbuffer_init(&body);
    SB_FUZZ_ASSERT(sb_shim_call_body(m, &body) == SB_OK, "cannot build the body of an accepted call");
    msgpack_zone_init(&zone, 1024);
    SB_FUZZ_ASSERT(sb_mp_decode((const uint8_t *)body.data, body.size, &zone, &o, &why) == SB_OK,
                   "the relayed body does not decode: %s", why != NULL ? why : "?");
    method = sb_mp_get(&o, "method");
    args = sb_mp_get(&o, "args");
    SB_FUZZ_ASSERT(o.type == MSGPACK_OBJECT_MAP && o.via.map.size == (frame_args != NULL ? 2u : 1u),
                   "the body must be exactly {method, args?}");
    SB_FUZZ_ASSERT(method != NULL && method->type == MSGPACK_OBJECT_STR && method->via.str.size == m->method_len &&
                       memcmp(method->via.str.ptr, m->method, m->method_len) == 0,
                   "the body's method differs from the frame's");
    SB_FUZZ_ASSERT((args != NULL) == (frame_args != NULL), "args present in one of frame and body only");
    if (args != NULL)
        SB_FUZZ_ASSERT(same_object(args, frame_args), "the body's args differ from the frame's");
    msgpack_zone_destroy(&zone);
    msgpack_sbuffer_destroy(&body);
}

/* properties 2-4 for the k-th message of the stream, whose payload (if complete) is `p` */
static void check_against_reference(const sb_shim_msg_t *m, sb_status_t st, const char *why, const uint8_t *p, size_t len,
                                    int len_error)
{
    msgpack_unpacked u;
    const msgpack_object *method = NULL;
    uint64_t id = 0;
    ref_class_t c;

    if (len_error) {
        SB_FUZZ_ASSERT(st == SB_E_BAD_ARGS && m->kind == SB_SHIM_MSG_NONE, "a bad length must be a violation");
        SB_FUZZ_ASSERT(strcmp(why, len_error == 1 ? "zero-length frame" : "frame length above the frame cap") == 0,
                       "bad length reported as \"%s\"", why);
        return;
    }
    msgpack_unpacked_init(&u);
    c = ref_classify(p, len, &id, &method, &u);
    switch (c) {
    case REF_BAD_FRAME:
        SB_FUZZ_ASSERT(st == SB_E_BAD_ARGS && m->kind == SB_SHIM_MSG_NONE,
                       "a frame that is not a call or result map was accepted (status %d, kind %d)", (int)st, (int)m->kind);
        break;
    case REF_CALL_BAD:
        SB_FUZZ_ASSERT(st == SB_E_BAD_ARGS && m->kind == SB_SHIM_MSG_CALL,
                       "an invalid call frame was accepted (status %d, kind %d)", (int)st, (int)m->kind);
        break;
    case REF_CALL_OK:
        SB_FUZZ_ASSERT(st == SB_OK && m->kind == SB_SHIM_MSG_CALL, "a valid call frame was refused: %s", why);
        SB_FUZZ_ASSERT(m->id == id, "call id %llu, the frame says %llu", (unsigned long long)m->id, (unsigned long long)id);
        SB_FUZZ_ASSERT(m->method_len == method->via.str.size && memcmp(m->method, method->via.str.ptr, m->method_len) == 0,
                       "call method differs from the frame's");
        SB_FUZZ_ASSERT((m->args != NULL) == (ref_key(&u.data, "args") != NULL), "args presence differs");
        if (m->args != NULL)
            SB_FUZZ_ASSERT(same_object(m->args, ref_key(&u.data, "args")), "call args differ from the frame's");
        check_relayed(m, ref_key(&u.data, "args"));
        break;
    case REF_RESULT:
        SB_FUZZ_ASSERT(m->kind == SB_SHIM_MSG_RESULT, "a result frame decoded as kind %d", (int)m->kind);
        if (st == SB_OK) {
            const msgpack_object *ok = ref_key(&u.data, "ok");
            SB_FUZZ_ASSERT(ok != NULL && ok->type == MSGPACK_OBJECT_BOOLEAN && m->ok == ok->via.boolean, "ok flag differs");
            SB_FUZZ_ASSERT(m->logs != NULL && json_is_array(m->logs) && json_array_size(m->logs) <= SB_SHIM_MAX_LOGS,
                           "accepted logs are not an array of at most 1000 entries");
            {
                size_t total = 0;
                for (size_t i = 0; i < json_array_size(m->logs); ++i) {
                    SB_FUZZ_ASSERT(json_is_string(json_array_get(m->logs, i)), "log entry %zu is not a string", i);
                    total += json_string_length(json_array_get(m->logs, i));
                }
                SB_FUZZ_ASSERT(total <= SB_SHIM_MAX_LOG_TOTAL, "accepted logs total %zu bytes", total);
            }
            SB_FUZZ_ASSERT((m->error != NULL) == !m->ok, "error must be present exactly when not ok");
            SB_FUZZ_ASSERT(m->ok || m->output == NULL, "not ok must carry no output");
        } else {
            SB_FUZZ_ASSERT(st == SB_E_BAD_ARGS && m->output == NULL && m->logs == NULL && m->error == NULL,
                           "a refused result holds values");
        }
        break;
    default:
        break;
    }
    msgpack_unpacked_destroy(&u);
}

/* ---- the stream, fed as relay.c feeds it ---- */

typedef struct st_stream_t {
    const uint8_t *s;
    size_t len;
    /* the reference framing, advanced as messages come out */
    size_t ref_pos;
    int check_reference;
    event_t *ev;
    size_t nev;
} stream_t;

/* the next frame of the reference walk: payload span, or a length error (1 zero, 2 too big) */
static int ref_next_frame(stream_t *t, const uint8_t **p, size_t *len)
{
    size_t need;
    SB_FUZZ_ASSERT(t->len - t->ref_pos >= 4, "a message came out before 4 header bytes arrived");
    need = (size_t)t->s[t->ref_pos] << 24 | (size_t)t->s[t->ref_pos + 1] << 16 | (size_t)t->s[t->ref_pos + 2] << 8 |
           t->s[t->ref_pos + 3];
    t->ref_pos += 4;
    if (need == 0)
        return 1;
    if (need > SB_MAX_FRAME)
        return 2;
    SB_FUZZ_ASSERT(t->len - t->ref_pos >= need, "a frame came out before its %zu payload bytes arrived", need);
    *p = t->s + t->ref_pos;
    *len = need;
    t->ref_pos += need;
    return 0;
}

static void on_message(stream_t *t, const sb_frame_reader_t *rd, const sb_shim_msg_t *m, sb_status_t st, const char *why,
                       size_t pos)
{
    const uint8_t *p = NULL;
    size_t plen = 0;
    int len_error = ref_next_frame(t, &p, &plen);
    event_t *e;

    SB_FUZZ_ASSERT(pos == t->ref_pos, "message ends at offset %zu, the reference at %zu", pos, t->ref_pos);
    SB_FUZZ_ASSERT(st == SB_OK || why != NULL, "an error without a reason");
    if (t->check_reference)
        check_against_reference(m, st, why, p, plen, len_error);
    SB_FUZZ_ASSERT(t->nev < MAX_EVENTS, "too many messages");
    e = &t->ev[t->nev++];
    memset(e, 0, sizeof(*e));
    e->st = st;
    e->kind = m->kind;
    e->why = st == SB_OK ? NULL : why;
    if (st == SB_OK && m->kind == SB_SHIM_MSG_CALL) {
        /* the message points into the reader's copy of the payload, which equals the stream's */
        SB_FUZZ_ASSERT(rd->payload.len == plen && memcmp(rd->payload.base, p, plen) == 0,
                       "the reader's payload differs from the stream's");
        SB_FUZZ_ASSERT((const uint8_t *)m->method >= (const uint8_t *)rd->payload.base &&
                           (const uint8_t *)m->method + m->method_len <= (const uint8_t *)rd->payload.base + plen,
                       "the method does not point into the frame's payload");
        e->id = m->id;
        e->method_off = (size_t)((const uint8_t *)m->method - (const uint8_t *)rd->payload.base);
        e->method_len = m->method_len;
        e->has_args = m->args != NULL;
    }
}

/* rng NULL: the whole stream as one read; else reads of random sizes */
static void run_stream(stream_t *t, sb_fuzz_rng_t *rng)
{
    sb_frame_reader_t rd;
    size_t pos = 0;
    int stop = 0;

    t->ref_pos = 0;
    t->nev = 0;
    sb_frame_reader_init(&rd, SB_MAX_FRAME);
    while (pos < t->len && !stop) {
        size_t chunk = rng != NULL ? sb_fuzz_rng_chunk(rng, t->len - pos) : t->len - pos, left = chunk;
        /* a fresh copy per read, so looking past what was read is an ASan error */
        uint8_t *copy = malloc(chunk), *p = copy;
        if (copy == NULL)
            abort();
        memcpy(copy, t->s + pos, chunk);
        while (left > 0 && !stop) {
            sb_shim_msg_t m;
            const char *why = NULL, *detail = NULL;
            size_t used = (size_t)-1;
            sb_status_t st = sb_shim_frames_next(&rd, p, left, &used, &m, &why, &detail);
            SB_FUZZ_ASSERT(used <= left, "used %zu of %zu bytes", used, left);
            p += used;
            left -= used;
            pos += used;
            if (st == SB_E_AGAIN) {
                SB_FUZZ_ASSERT(left == 0 && m.kind == SB_SHIM_MSG_NONE, "AGAIN with %zu bytes unused", left);
            } else {
                on_message(t, &rd, &m, st, why, pos);
                SB_FUZZ_ASSERT(detail == NULL || (st == SB_E_BAD_ARGS && strcmp(why, "bad msgpack in frame") == 0),
                               "a detail on \"%s\"", why);
                /* relay.c: the first violation or invalid result ends the run */
                stop = st != SB_OK;
            }
            sb_shim_msg_dispose(&m);
        }
        free(copy);
    }
    sb_frame_reader_dispose(&rd);
}

static void raw_mode(const uint8_t *data, size_t size)
{
    sb_fuzz_rng_t rng;
    stream_t whole, chunked;
    event_t *a = calloc(MAX_EVENTS, sizeof(*a)), *b = calloc(MAX_EVENTS, sizeof(*b));

    if (a == NULL || b == NULL)
        abort();
    sb_fuzz_rng_seed(&rng, data, size);
    memset(&whole, 0, sizeof(whole));
    whole.s = data;
    whole.len = size;
    whole.check_reference = 1;
    whole.ev = a;
    chunked = whole;
    chunked.check_reference = 0;
    chunked.ev = b;
    run_stream(&whole, NULL);
    run_stream(&chunked, &rng);
    /* property 1: chunking changes nothing */
    SB_FUZZ_ASSERT(whole.nev == chunked.nev, "%zu messages whole, %zu chunked", whole.nev, chunked.nev);
    for (size_t i = 0; i < whole.nev; ++i)
        SB_FUZZ_ASSERT(memcmp(&a[i], &b[i], sizeof(a[i])) == 0, "message %zu differs between whole and chunked reads", i);
    free(a);
    free(b);
}

/* ---- structured mode: build one call frame and stream it ---- */

enum {
    F_ARGS = 1,        /* the call carries args */
    F_REVERSE = 2,     /* keys in reverse order */
    F_EXTRA_KEY = 4,   /* an unknown key: a malformed call */
    F_NEG_ID = 8,      /* a negative id: a malformed call */
    F_WRONG_KIND = 16, /* t is "Call": an unknown kind */
    F_TWICE = 32,      /* the same frame twice (the decoder is stateless: both pass) */
    F_BIG_ARGS = 64,   /* args are a bin whose size comes from two input bytes (up to 128 KiB): the caps */
    F_LONG = 128       /* the method is 100 bytes longer: both sides of the 256-byte limit */
};

static void pack_key(msgpack_packer *pk, const char *k)
{
    (void)msgpack_pack_str_with_body(pk, k, strlen(k));
}

static void structured_mode(const uint8_t *data, size_t size)
{
    sb_fuzz_rng_t rng;
    msgpack_zone zone;
    msgpack_object args_o;
    msgpack_sbuffer args, frame;
    msgpack_packer pk;
    uint8_t method[400];
    const uint8_t *src, *rest;
    const char *why = NULL;
    unsigned flags;
    uint64_t id = 0;
    size_t method_len, n_src, rest_len, nkeys, frame_len;
    int valid, have_args, mp_ok;
    stream_t t;
    event_t *ev;

    if (size < 10)
        return;
    sb_fuzz_rng_seed(&rng, data, size);
    flags = data[0];
    for (int i = 0; i < 8; ++i)
        id = id << 8 | data[1 + i];
    /* the method: byte 9 gives its length (0..355), the bytes follow, repeated when the input is short */
    method_len = data[9] + (flags & F_LONG ? 100u : 0u);
    src = data + 10;
    n_src = size - 10 < method_len ? size - 10 : method_len;
    for (size_t i = 0; i < method_len; ++i)
        method[i] = n_src != 0 ? src[i % n_src] : (uint8_t)'a';
    rest = src + n_src;
    rest_len = size - 10 - n_src;

    /* args: the remaining bytes as a msgpack value when they are one, else as bin; packed canonically */
    msgpack_sbuffer_init(&args);
    msgpack_packer_init(&pk, &args, msgpack_sbuffer_write);
    if (flags & F_BIG_ARGS) {
        size_t big = rest_len >= 2 ? ((size_t)rest[0] << 8 | rest[1]) * 2 : 4096;
        uint8_t *fill = calloc(1, big + 1);
        if (fill == NULL)
            abort();
        (void)msgpack_pack_bin_with_body(&pk, fill, big);
        free(fill);
    } else {
        msgpack_zone_init(&zone, 1024);
        if (rest_len != 0 && sb_mp_decode(rest, rest_len, &zone, &args_o, &why) == SB_OK)
            sb_mp_pack_object(&pk, &args_o);
        else
            (void)msgpack_pack_bin_with_body(&pk, rest, rest_len);
        msgpack_zone_destroy(&zone);
    }
    have_args = (flags & F_ARGS) != 0;

    /* the frame */
    msgpack_sbuffer_init(&frame);
    (void)msgpack_sbuffer_write(&frame, "\0\0\0\0", 4);
    msgpack_packer_init(&pk, &frame, msgpack_sbuffer_write);
    nkeys = 3 + (have_args ? 1 : 0) + (flags & F_EXTRA_KEY ? 1 : 0);
    (void)msgpack_pack_map(&pk, nkeys);
    for (int pass = 0; pass < 2; ++pass) {
        /* forward: t, id, method, args, x; reverse: x, args, method, id, t (two passes keep it short) */
        int rev = (flags & F_REVERSE) != 0;
        if (pass == (rev ? 1 : 0)) {
            pack_key(&pk, "t");
            pack_key(&pk, flags & F_WRONG_KIND ? "Call" : "call");
            pack_key(&pk, "id");
            if (flags & F_NEG_ID)
                (void)msgpack_pack_int64(&pk, -1 - (int64_t)(id % 1000));
            else
                (void)msgpack_pack_uint64(&pk, id);
            pack_key(&pk, "method");
            (void)msgpack_pack_str_with_body(&pk, method, method_len);
        } else {
            if (have_args) {
                pack_key(&pk, "args");
                (void)msgpack_sbuffer_write(&frame, args.data, args.size);
            }
            if (flags & F_EXTRA_KEY) {
                pack_key(&pk, "x");
                (void)msgpack_pack_nil(&pk);
            }
        }
    }
    frame_len = frame.size - 4;
    SB_FUZZ_ASSERT(frame_len <= SB_MAX_FRAME, "frame too large for the test");
    sb_frame_header((uint32_t)frame_len, (uint8_t *)frame.data);
    if (flags & F_TWICE) {
        /* from a copy: the write may move the buffer it would read from */
        char *copy = malloc(frame.size);
        if (copy == NULL)
            abort();
        memcpy(copy, frame.data, frame.size);
        (void)msgpack_sbuffer_write(&frame, copy, frame.size);
        free(copy);
    }

    /* what the contract says, from the construction alone (the value rules are proto's) */
    {
        size_t obj_len = 0;
        const char *w = NULL;
        int nul = method_len != 0 && memchr(method, '\0', method_len) != NULL;
        mp_ok = sb_mp_check((const uint8_t *)frame.data + 4, frame_len, &obj_len, &w) == SB_OK;
        valid = mp_ok && method_len >= 1 && method_len <= 256 && !nul && !(flags & (F_EXTRA_KEY | F_NEG_ID | F_WRONG_KIND)) &&
                frame_len <= sb_method_request_cap_str((const char *)method, method_len) + 1024;
    }

    ev = calloc(MAX_EVENTS, sizeof(*ev));
    if (ev == NULL)
        abort();
    memset(&t, 0, sizeof(t));
    t.s = (const uint8_t *)frame.data;
    t.len = frame.size;
    t.check_reference = 1;
    t.ev = ev;
    run_stream(&t, &rng);
    if (valid) {
        SB_FUZZ_ASSERT(t.nev == (flags & F_TWICE ? 2u : 1u), "a valid call gave %zu messages", t.nev);
        for (size_t i = 0; i < t.nev; ++i) {
            const uint8_t *payload = (const uint8_t *)frame.data + 4 + i * (frame_len + 4);
            SB_FUZZ_ASSERT(ev[i].st == SB_OK && ev[i].kind == SB_SHIM_MSG_CALL, "a valid call was refused: %s",
                           ev[i].why != NULL ? ev[i].why : "?");
            SB_FUZZ_ASSERT(ev[i].id == id, "id %llu came back as %llu", (unsigned long long)id, (unsigned long long)ev[i].id);
            SB_FUZZ_ASSERT(ev[i].method_len == method_len && memcmp(payload + ev[i].method_off, method, method_len) == 0,
                           "the method did not come back equal");
            SB_FUZZ_ASSERT(ev[i].has_args == have_args, "args presence did not round-trip");
        }
    } else {
        SB_FUZZ_ASSERT(t.nev == 1 && ev[0].st != SB_OK, "an invalid call was accepted (flags 0x%x, method %zu bytes)", flags,
                       method_len);
        if (!mp_ok)
            SB_FUZZ_ASSERT(ev[0].kind == SB_SHIM_MSG_NONE && strcmp(ev[0].why, "bad msgpack in frame") == 0,
                           "a frame that fails the msgpack pre-check reported as \"%s\"", ev[0].why);
        else if (flags & F_WRONG_KIND)
            SB_FUZZ_ASSERT(ev[0].kind == SB_SHIM_MSG_NONE && strcmp(ev[0].why, "unknown frame kind") == 0,
                           "t:\"Call\" reported as \"%s\"", ev[0].why);
        else if (flags & (F_EXTRA_KEY | F_NEG_ID))
            SB_FUZZ_ASSERT(ev[0].kind == SB_SHIM_MSG_CALL && strncmp(ev[0].why, "malformed call frame", 20) == 0,
                           "a malformed call reported as \"%s\"", ev[0].why);
    }
    free(ev);
    msgpack_sbuffer_destroy(&frame);
    msgpack_sbuffer_destroy(&args);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (data[0] & 1)
        structured_mode(data + 1, size - 1);
    else
        raw_mode(data + 1, size - 1);
    return 0;
}
