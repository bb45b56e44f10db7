/*
 * The guest of tests/bench/relay.sh: speaks the stdio frames of
 * proto/PROTOCOL.md section 2 behind `sandbox-shim relay ... -- relay_guest N WARMUP`.
 *
 * Reads the init frame, then makes WARMUP + N sequential calls
 * {t:"call", id, method:"services.svc.fn", args:{}}, each timed from just
 * before its frame is written to just after its whole reply frame has been
 * read (guest -> shim -> broker -> shim -> guest). Every reply must be the
 * broker's not_implemented error for that id (the shim runs with
 * --on-denial reply). Sends one result frame whose output is the summary of
 * the N timed calls in nanoseconds: {n, min_ns, p50_ns, p90_ns, p99_ns,
 * max_ns, mean_ns}; on any unexpected reply, ok:false with the reason.
 */
#include "relay_common.h"

#define MAX_REPLY (1u << 20)

static void put_str(msgpack_packer *pk, const char *s)
{
    (void)msgpack_pack_str_with_body(pk, s, strlen(s));
}

/* starts a frame: room for the 4-byte length, filled in by send_frame */
static void begin_frame(msgpack_sbuffer *sb, msgpack_packer *pk)
{
    msgpack_sbuffer_init(sb);
    (void)msgpack_sbuffer_write(sb, "\0\0\0\0", 4);
    msgpack_packer_init(pk, sb, msgpack_sbuffer_write);
}

/*
 * Writes one frame with a single write(), as the Deno runtime does: a header
 * written on its own would wake the shim twice per call and bill the relay
 * for a hop the real guest never makes.
 */
static int send_frame(msgpack_sbuffer *sb)
{
    size_t n = sb->size - 4;
    uint8_t *p = (uint8_t *)sb->data;
    p[0] = (uint8_t)(n >> 24);
    p[1] = (uint8_t)(n >> 16);
    p[2] = (uint8_t)(n >> 8);
    p[3] = (uint8_t)n;
    return relay_write_full(1, sb->data, sb->size);
}

/* reads one frame's payload into buf (at most MAX_REPLY bytes) */
static int read_frame(char *buf, size_t *len)
{
    uint8_t hdr[4];
    size_t n;
    if (relay_read_full(0, hdr, 4) != 0)
        return -1;
    n = (size_t)hdr[0] << 24 | (size_t)hdr[1] << 16 | (size_t)hdr[2] << 8 | hdr[3];
    if (n == 0 || n > MAX_REPLY || relay_read_full(0, buf, n) != 0)
        return -1;
    *len = n;
    return 0;
}

static int send_result(const relay_stats_t *st, const char *error)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    int rc;

    begin_frame(&sb, &pk);
    (void)msgpack_pack_map(&pk, 4);
    put_str(&pk, "t");
    put_str(&pk, "result");
    put_str(&pk, "ok");
    if (error != NULL) {
        (void)msgpack_pack_false(&pk);
        put_str(&pk, "error");
        put_str(&pk, error);
    } else {
        (void)msgpack_pack_true(&pk);
        put_str(&pk, "output");
        (void)msgpack_pack_map(&pk, 7);
        put_str(&pk, "n");
        (void)msgpack_pack_uint64(&pk, st->n);
        put_str(&pk, "min_ns");
        (void)msgpack_pack_uint64(&pk, st->min_ns);
        put_str(&pk, "p50_ns");
        (void)msgpack_pack_uint64(&pk, st->p50_ns);
        put_str(&pk, "p90_ns");
        (void)msgpack_pack_uint64(&pk, st->p90_ns);
        put_str(&pk, "p99_ns");
        (void)msgpack_pack_uint64(&pk, st->p99_ns);
        put_str(&pk, "max_ns");
        (void)msgpack_pack_uint64(&pk, st->max_ns);
        put_str(&pk, "mean_ns");
        (void)msgpack_pack_uint64(&pk, st->mean_ns);
    }
    put_str(&pk, "logs");
    (void)msgpack_pack_array(&pk, 0);
    rc = send_frame(&sb);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

int main(int argc, char **argv)
{
    unsigned long n, warm;
    uint64_t *samples;
    char *buf;
    size_t len;
    relay_stats_t st;
    const char *error = NULL;
    char why[128];

    if (argc != 3 || relay_parse_u(argv[1], 1, RELAY_MAX_N, &n) != 0 || relay_parse_u(argv[2], 0, RELAY_MAX_N, &warm) != 0) {
        fprintf(stderr, "usage: relay_guest N WARMUP (behind sandbox-shim relay)\n");
        return 2;
    }
    samples = calloc(n, sizeof(*samples));
    buf = malloc(MAX_REPLY);
    if (samples == NULL || buf == NULL || read_frame(buf, &len) != 0) {
        fprintf(stderr, "relay_guest: no init frame\n");
        return 1;
    }
    memset(&st, 0, sizeof(st));
    for (uint64_t id = 1; id <= n + warm && error == NULL; ++id) {
        msgpack_sbuffer sb;
        msgpack_packer pk;
        uint64_t t0, t1;

        begin_frame(&sb, &pk);
        (void)msgpack_pack_map(&pk, 4);
        put_str(&pk, "t");
        put_str(&pk, "call");
        put_str(&pk, "id");
        (void)msgpack_pack_uint64(&pk, id);
        put_str(&pk, "method");
        put_str(&pk, RELAY_METHOD);
        put_str(&pk, "args");
        (void)msgpack_pack_map(&pk, 0);
        t0 = relay_now_ns();
        if (send_frame(&sb) != 0 || read_frame(buf, &len) != 0) {
            error = "the shim closed the frame channel";
        } else {
            t1 = relay_now_ns();
            if (!relay_is_not_implemented(buf, len, &id)) {
                snprintf(why, sizeof(why), "call %llu: the reply is not the broker's not_implemented error",
                         (unsigned long long)id);
                error = why;
            } else if (id > warm) {
                samples[id - warm - 1] = t1 - t0;
            }
        }
        msgpack_sbuffer_destroy(&sb);
    }
    if (error == NULL)
        relay_summarise(samples, n, &st);
    (void)send_result(&st, error);
    free(samples);
    free(buf);
    return 0;
}
