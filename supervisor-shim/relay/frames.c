/*
 * Guest frames to validated messages (see frames.h and proto/PROTOCOL.md section 2).
 *
 * Everything here treats the payload as hostile: proto's frame reader caps
 * the length before anything is buffered, sb_mp_decode pre-checks the bytes
 * (sizes against the bytes left, depth, node count, UTF-8, duplicate keys)
 * before msgpack-c allocates for them, and only then are the maps inspected.
 */
#include <string.h>
#include "sb/limits.h"
#include "sb/method.h"
#include "sb/value.h"
#include "relay/frames.h"

static void msg_reset(sb_shim_msg_t *msg)
{
    memset(msg, 0, sizeof(*msg));
}

void sb_shim_msg_dispose(sb_shim_msg_t *msg)
{
    json_decref(msg->output);
    json_decref(msg->error);
    json_decref(msg->logs);
    if (msg->_zone_live)
        msgpack_zone_destroy(&msg->_zone);
    msg_reset(msg);
}

/* 1 if every key of `map` is one of `allowed` (guest -> shim frames admit no others) */
static int keys_within(const msgpack_object *map, const char *const *allowed)
{
    for (uint32_t i = 0; i < map->via.map.size; ++i) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        int found = 0;
        for (const char *const *a = allowed; *a != NULL && !found; ++a)
            found = sb_mp_str_is(k, *a);
        if (!found)
            return 0;
    }
    return 1;
}

/* call: {t, id: uint, method: str(1..256) without NUL, args?}, payload within the method's cap */
static sb_status_t decode_call(const msgpack_object *o, size_t len, sb_shim_msg_t *msg, const char **why)
{
    static const char *const keys[] = {"t", "id", "method", "args", NULL};
    const msgpack_object *id = sb_mp_get(o, "id"), *method = sb_mp_get(o, "method");

    if (!keys_within(o, keys) || id == NULL || id->type != MSGPACK_OBJECT_POSITIVE_INTEGER || method == NULL ||
        method->type != MSGPACK_OBJECT_STR || method->via.str.size == 0 || method->via.str.size > SB_MAX_METHOD_LEN) {
        *why = "malformed call frame (want {t, id: uint, method: str(1..256), args?})";
        return SB_E_BAD_ARGS;
    }
    if (memchr(method->via.str.ptr, '\0', method->via.str.size) != NULL) {
        *why = "call method contains NUL";
        return SB_E_BAD_ARGS;
    }
    if (len > sb_method_request_cap_str(method->via.str.ptr, method->via.str.size) + SB_SHIM_CALL_FRAME_SLACK) {
        *why = "call frame above the method's request cap";
        return SB_E_BAD_ARGS;
    }
    msg->id = id->via.u64;
    msg->method = method->via.str.ptr;
    msg->method_len = method->via.str.size;
    msg->args = sb_mp_get(o, "args");
    return SB_OK;
}

/*
 * result: {t, ok: bool, logs: [str], output?: any (only when ok), error?: str
 * (required when not ok)}, with the budgets of PROTOCOL.md section 2 rule 6.
 * The values are converted to JSON here, because the run's outcome is JSON and
 * a value that cannot be represented makes the result invalid.
 */
static sb_status_t decode_result(const msgpack_object *o, sb_shim_msg_t *msg, const char **why)
{
    static const char *const keys[] = {"t", "ok", "output", "error", "logs", NULL};
    const msgpack_object *ok = sb_mp_get(o, "ok"), *output = sb_mp_get(o, "output"), *err = sb_mp_get(o, "error"),
                         *logs = sb_mp_get(o, "logs");
    const char *bad = NULL;

    if (!keys_within(o, keys) || ok == NULL || ok->type != MSGPACK_OBJECT_BOOLEAN)
        bad = "want {t, ok: bool, output?, error?, logs: [str]}";
    else if (logs == NULL || logs->type != MSGPACK_OBJECT_ARRAY || logs->via.array.size > SB_SHIM_MAX_LOGS)
        bad = "logs must be an array of at most 1000 strings";
    else if (ok->via.boolean && err != NULL)
        bad = "ok:true must not carry error";
    else if (!ok->via.boolean && (err == NULL || err->type != MSGPACK_OBJECT_STR || output != NULL))
        bad = "ok:false must carry a string error and no output";
    else if (err != NULL && err->via.str.size > SB_SHIM_MAX_ERROR_BYTES)
        bad = "error is too long";
    for (uint32_t i = 0, total = 0; bad == NULL && i < logs->via.array.size; ++i) {
        const msgpack_object *e = &logs->via.array.ptr[i];
        if (e->type != MSGPACK_OBJECT_STR || e->via.str.size > SB_SHIM_MAX_LOG_BYTES)
            bad = "each log entry must be a string of at most 4000 bytes";
        else if ((total += e->via.str.size) > SB_SHIM_MAX_LOG_TOTAL)
            bad = "logs must total at most 1 MiB";
    }
    if (bad == NULL && output != NULL) {
        msgpack_sbuffer sb;
        msgpack_packer pk;
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        sb_mp_pack_object(&pk, output);
        if (sb.size > SB_SHIM_MAX_OUTPUT)
            bad = "output is larger than 1 MiB";
        msgpack_sbuffer_destroy(&sb);
        if (bad == NULL && sb_json_from_mp(output, &msg->output) != SB_OK)
            bad = "output cannot be represented as JSON";
    }
    if (bad == NULL && sb_json_from_mp(logs, &msg->logs) != SB_OK)
        bad = "logs cannot be represented as JSON";
    if (bad == NULL && err != NULL && (msg->error = json_stringn(err->via.str.ptr, err->via.str.size)) == NULL)
        bad = "error is not valid UTF-8";
    if (bad != NULL) {
        json_decref(msg->output);
        json_decref(msg->logs);
        json_decref(msg->error);
        msg->output = msg->logs = msg->error = NULL;
        *why = bad;
        return SB_E_BAD_ARGS;
    }
    msg->ok = ok->via.boolean;
    return SB_OK;
}

sb_status_t sb_shim_msg_decode(const uint8_t *p, size_t len, sb_shim_msg_t *msg, const char **why, const char **detail)
{
    msgpack_object o;
    const msgpack_object *t;
    const char *mp_why = NULL;

    msg_reset(msg);
    *detail = NULL;
    if (!msgpack_zone_init(&msg->_zone, 4096)) {
        *why = "out of memory decoding a frame";
        return SB_E_BAD_ARGS;
    }
    msg->_zone_live = 1;
    if (sb_mp_decode(p, len, &msg->_zone, &o, &mp_why) != SB_OK) {
        *why = "bad msgpack in frame";
        *detail = mp_why != NULL ? mp_why : "invalid";
        return SB_E_BAD_ARGS;
    }
    if (o.type != MSGPACK_OBJECT_MAP || (t = sb_mp_get(&o, "t")) == NULL || t->type != MSGPACK_OBJECT_STR) {
        *why = "frame is not a map with a string \"t\"";
        return SB_E_BAD_ARGS;
    }
    if (sb_mp_str_is(t, "call")) {
        msg->kind = SB_SHIM_MSG_CALL;
        return decode_call(&o, len, msg, why);
    }
    if (sb_mp_str_is(t, "result")) {
        msg->kind = SB_SHIM_MSG_RESULT;
        return decode_result(&o, msg, why);
    }
    /* init and reply travel shim -> guest only; anything else is unknown */
    *why = "unknown frame kind";
    return SB_E_BAD_ARGS;
}

sb_status_t sb_shim_frames_next(sb_frame_reader_t *rd, const uint8_t *in, size_t len, size_t *used, sb_shim_msg_t *msg,
                                const char **why, const char **detail)
{
    const uint8_t *payload = NULL;
    size_t plen = 0;
    sb_status_t st;

    msg_reset(msg);
    *detail = NULL;
    *used = 0;
    st = sb_frame_feed(rd, in, len, used, &payload, &plen);
    switch (st) {
    case SB_OK:
        return sb_shim_msg_decode(payload, plen, msg, why, detail);
    case SB_E_AGAIN:
        return SB_E_AGAIN;
    case SB_E_TOO_LARGE:
        *why = "frame length above the frame cap";
        return SB_E_BAD_ARGS;
    case SB_E_BAD_ARGS:
        *why = "zero-length frame";
        return SB_E_BAD_ARGS;
    default:
        *why = "out of memory reading a frame";
        return SB_E_NOMEM;
    }
}

sb_status_t sb_shim_call_body(const sb_shim_msg_t *msg, msgpack_sbuffer *body)
{
    msgpack_packer pk;

    if (msg->kind != SB_SHIM_MSG_CALL || msg->method == NULL)
        return SB_E_BAD_ARGS;
    msgpack_packer_init(&pk, body, msgpack_sbuffer_write);
    if (msgpack_pack_map(&pk, msg->args != NULL ? 2 : 1) != 0 || msgpack_pack_str_with_body(&pk, "method", 6) != 0 ||
        msgpack_pack_str_with_body(&pk, msg->method, msg->method_len) != 0)
        return SB_E_NOMEM;
    if (msg->args != NULL) {
        if (msgpack_pack_str_with_body(&pk, "args", 4) != 0)
            return SB_E_NOMEM;
        sb_mp_pack_object(&pk, msg->args);
    }
    return body->data != NULL ? SB_OK : SB_E_NOMEM;
}
