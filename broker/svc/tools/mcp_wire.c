/*
 * The MCP response body reader: an event-stream parser and the JSON-RPC 2.0
 * response picker (mcp_wire.h).
 *
 * The event-stream rules are WHATWG HTML section 9.2.6, "Interpreting an
 * event stream", which MCP's Streamable HTTP transport uses unchanged. The
 * parser is a byte-level state machine rather than a line splitter: a line
 * is never buffered, only the data buffer grows, so a hostile stream cannot
 * make us hold more than one event's data (capped) however long its lines or
 * comments are.
 *
 * Every upstream message goes through the project's one bounded JSON decoder
 * (sb_json_parse: strict UTF-8, depth and node caps, duplicate keys refused)
 * before anything looks at it: the upstream is operator configuration, but a
 * compromised or buggy tool server must not be able to do more than fail the
 * call.
 */
#include <stdio.h>
#include <string.h>
#include "sb/value.h"
#include "svc/tools/mcp_wire.h"

enum { ST_LINE_START = 0, ST_NAME, ST_VALUE_START, ST_VALUE, ST_IGNORE };
enum { FIELD_OTHER = 0, FIELD_DATA, FIELD_EVENT };

static const unsigned char bom_bytes[3] = {0xef, 0xbb, 0xbf};

/* ---- the event-stream parser ---------------------------------------------------------------------------------------- */

void sb_sse_init(sb_sse_t *p, size_t max_data)
{
    memset(p, 0, sizeof(*p));
    /* the data and the LF its last line ends with; max_data is a message cap, far below SIZE_MAX */
    sb_buf_init(&p->data, max_data < SB_BUF_MAX_CAP ? max_data + 1 : SB_BUF_MAX_CAP);
}

void sb_sse_dispose(sb_sse_t *p)
{
    sb_buf_free(&p->data);
}

/* appends to the data buffer: the buffer's cap makes an event over max_data SB_E_TOO_LARGE before it grows */
static sb_status_t data_append(sb_sse_t *p, const char *s, size_t n)
{
    return sb_buf_append(&p->data, s, n);
}

static void begin_field(sb_sse_t *p)
{
    if (p->name_len == 4 && memcmp(p->name, "data", 4) == 0) {
        p->field = FIELD_DATA;
    } else if (p->name_len == 5 && memcmp(p->name, "event", 5) == 0) {
        /* "set the event type buffer to the field value": an event field replaces any earlier one */
        p->field = FIELD_EVENT;
        p->type_len = 0;
        p->type_overflow = 0;
    } else {
        /* "id" and "retry" steer reconnection, which a one-shot POST never does; unknown fields are ignored */
        p->field = FIELD_OTHER;
    }
}

/* a blank line: dispatch the event if its data buffer is not empty, then reset the buffers */
static int dispatch(sb_sse_t *p, sb_sse_event_cb cb, void *arg)
{
    int stop = 0;

    if (p->data.len != 0) {
        const char *type = p->type_len != 0 ? p->type : "message";
        size_t type_len = p->type_len != 0 ? p->type_len : 7;
        /* "if the data buffer's last character is a U+000A LINE FEED, remove it" */
        stop = cb(arg, type, type_len, p->data.base, p->data.len - 1);
    }
    sb_buf_reset(&p->data);
    p->type_len = 0;
    p->type_overflow = 0;
    return stop;
}

static sb_status_t end_line(sb_sse_t *p, sb_sse_event_cb cb, void *arg, int *stop)
{
    sb_status_t st = SB_OK;

    switch (p->state) {
    case ST_LINE_START:
        *stop = dispatch(p, cb, arg);
        break;
    case ST_NAME:
        /* a line without a colon is a field name with an empty value */
        begin_field(p);
        /* fallthrough */
    case ST_VALUE_START:
    case ST_VALUE:
        if (p->field == FIELD_DATA)
            st = data_append(p, "\n", 1);
        break;
    default:
        break;
    }
    p->state = ST_LINE_START;
    return st;
}

static sb_status_t value_byte(sb_sse_t *p, char c)
{
    switch (p->field) {
    case FIELD_DATA:
        return data_append(p, &c, 1);
    case FIELD_EVENT:
        if (p->type_len < sizeof(p->type))
            p->type[p->type_len++] = c;
        else
            p->type_overflow = 1; /* the kept prefix is 64 bytes, so it can never read as "message" */
        return SB_OK;
    default:
        return SB_OK;
    }
}

static sb_status_t one_byte(sb_sse_t *p, char c, sb_sse_event_cb cb, void *arg, int *stop)
{
    if (p->after_cr) {
        p->after_cr = 0;
        if (c == '\n')
            return SB_OK; /* the LF of a CRLF pair */
    }
    if (c == '\r' || c == '\n') {
        p->after_cr = c == '\r';
        return end_line(p, cb, arg, stop);
    }
    switch (p->state) {
    case ST_LINE_START:
        if (c == ':') {
            p->state = ST_IGNORE; /* a comment line */
            return SB_OK;
        }
        p->name_len = 0;
        p->state = ST_NAME;
        /* fallthrough */
    case ST_NAME:
        if (c == ':') {
            begin_field(p);
            p->state = ST_VALUE_START;
        } else if (p->name_len < sizeof(p->name)) {
            p->name[p->name_len++] = c;
        } else {
            p->name_len = sizeof(p->name); /* longer than any field we know: stays unknown */
        }
        return SB_OK;
    case ST_VALUE_START:
        p->state = ST_VALUE;
        if (c == ' ')
            return SB_OK; /* "if value starts with a U+0020 SPACE character, remove it" */
        return value_byte(p, c);
    case ST_VALUE:
        return value_byte(p, c);
    default:
        return SB_OK;
    }
}

sb_status_t sb_sse_feed(sb_sse_t *p, const char *bytes, size_t len, sb_sse_event_cb cb, void *arg, int *stopped)
{
    size_t i = 0;
    int stop = 0;
    sb_status_t st;

    if (stopped != NULL)
        *stopped = 0;
    while (i < len) {
        char c = bytes[i];
        if (p->bom < 3) {
            /* "one leading U+FEFF BYTE ORDER MARK character must be ignored if any are present" */
            if ((unsigned char)c == bom_bytes[p->bom]) {
                ++p->bom;
                ++i;
                continue;
            }
            /* not a BOM after all: the bytes held back are stream bytes */
            for (int k = 0, n = p->bom; k < n; ++k)
                if ((st = one_byte(p, (char)bom_bytes[k], cb, arg, &stop)) != SB_OK || stop)
                    goto Exit;
            p->bom = 3;
        }
        if (p->state == ST_VALUE && p->field == FIELD_DATA && !p->after_cr) {
            /* the common case, a long data value: copy the run up to the line end at once */
            size_t j = i;
            while (j < len && bytes[j] != '\r' && bytes[j] != '\n')
                ++j;
            if (j != i) {
                if ((st = data_append(p, bytes + i, j - i)) != SB_OK)
                    return st;
                i = j;
                continue;
            }
        }
        if ((st = one_byte(p, c, cb, arg, &stop)) != SB_OK)
            return st;
        ++i;
        if (stop)
            break;
    }
    st = SB_OK;
Exit:
    if (stop && stopped != NULL)
        *stopped = 1;
    return st;
}

/* ---- text helpers --------------------------------------------------------------------------------------------------- */

static char ascii_lower(char c)
{
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

static int ieq(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    if (alen != blen)
        return 0;
    for (size_t i = 0; i < alen; ++i)
        if (ascii_lower(a[i]) != b[i])
            return 0;
    return 1;
}

sb_mcp_body_t sb_mcp_body_kind(const char *ctype, size_t len)
{
    size_t start = 0, end;

    if (ctype == NULL)
        return SB_MCP_BODY_OTHER;
    /* RFC 9110 section 8.3.1: media-type = type "/" subtype parameters; OWS around */
    end = 0;
    while (end < len && ctype[end] != ';')
        ++end;
    while (start < end && (ctype[start] == ' ' || ctype[start] == '\t'))
        ++start;
    while (end > start && (ctype[end - 1] == ' ' || ctype[end - 1] == '\t'))
        --end;
    if (ieq(ctype + start, end - start, "application/json"))
        return SB_MCP_BODY_JSON;
    if (ieq(ctype + start, end - start, "text/event-stream"))
        return SB_MCP_BODY_SSE;
    return SB_MCP_BODY_OTHER;
}

size_t sb_mcp_sanitize(const char *s, size_t len, size_t max, char *out, size_t outsz)
{
    size_t n = len, o;
    int cut = 0;

    if (outsz == 0)
        return 0;
    if (max > outsz - 1)
        max = outsz - 1;
    if (n > max) {
        /* leave room for "...", and never end inside a UTF-8 sequence */
        n = max > 3 ? max - 3 : 0;
        while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
            --n;
        cut = 1;
    }
    for (o = 0; o < n; ++o) {
        unsigned char c = (unsigned char)s[o];
        out[o] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    if (cut)
        for (int k = 0; k < 3 && o < outsz - 1; ++k)
            out[o++] = '.';
    out[o] = '\0';
    return o;
}

/* ---- the request ------------------------------------------------------------------------------------------------------ */

sb_status_t sb_mcp_build_request(sb_buf_t *out, const char *target, const char *host_header, const char *user_agent,
                                 const char *sid, const char *version, const char *body, size_t body_len)
{
    size_t start = out->len;
    sb_status_t st;

    if ((st = sb_buf_printf(out,
                            "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                            "Accept: application/json, text/event-stream\r\nUser-Agent: %s\r\n"
                            "Content-Length: %zu\r\nConnection: close\r\n",
                            target, host_header, user_agent, body_len)) != SB_OK ||
        (sid != NULL && (st = sb_buf_printf(out, "Mcp-Session-Id: %s\r\n", sid)) != SB_OK) ||
        (version != NULL && (st = sb_buf_printf(out, "MCP-Protocol-Version: %s\r\n", version)) != SB_OK) ||
        (st = sb_buf_append(out, "\r\n", 2)) != SB_OK || (st = sb_buf_append(out, body, body_len)) != SB_OK) {
        sb_buf_truncate(out, start);
        return st;
    }
    return SB_OK;
}

/* ---- the JSON-RPC response picker ------------------------------------------------------------------------------------ */

typedef struct st_pick_t {
    int64_t id;
    size_t max_msg;
    msgpack_sbuffer *out;
    char *err;
    size_t errsz;
    sb_status_t st;
    int done; /* the response was found (st tells how it went) or the body is unusable */
} pick_t;

static void pick_fail(pick_t *pk, sb_status_t st, const char *fmt, const char *a, size_t alen)
{
    snprintf(pk->err, pk->errsz, fmt, (int)alen, a);
    pk->st = st;
    pk->done = 1;
}

static int id_matches(const msgpack_object *v, int64_t id)
{
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        return id >= 0 && v->via.u64 == (uint64_t)id;
    if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return v->via.i64 == id;
    return 0;
}

/* describes a JSON-RPC error object (JSON-RPC 2.0 section 5.1: code is an integer, message a string) */
static sb_status_t describe_error(const msgpack_object *e, char *out, size_t outsz)
{
    const msgpack_object *code = sb_mp_get(e, "code"), *msg = sb_mp_get(e, "message");
    char text[256];
    long long c;

    if (code == NULL || msg == NULL || msg->type != MSGPACK_OBJECT_STR)
        return SB_E_BAD_ARGS;
    if (code->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        c = (long long)code->via.i64;
    else if (code->type == MSGPACK_OBJECT_POSITIVE_INTEGER && code->via.u64 <= INT64_MAX)
        c = (long long)code->via.u64;
    else
        return SB_E_BAD_ARGS;
    sb_mcp_sanitize(msg->via.str.ptr, msg->via.str.size, 200, text, sizeof(text));
    snprintf(out, outsz, "JSON-RPC error %lld: %s", c, text);
    return SB_OK;
}

/*
 * One decoded message. JSON-RPC 2.0 section 5: a response has the request's
 * id and exactly one of result and error. Anything with a method is a
 * request or notification from the server (MCP allows those before the
 * response on an SSE stream); we offer no client features, so they are
 * skipped, as are responses to other ids.
 */
static void pick_message(pick_t *pk, const msgpack_object *msg)
{
    const msgpack_object *id, *jsonrpc, *result, *error;

    if (msg->type != MSGPACK_OBJECT_MAP) {
        pick_fail(pk, SB_E_BAD_ARGS, "%.*s", "upstream message is not a JSON object", 36);
        return;
    }
    if (sb_mp_get(msg, "method") != NULL)
        return;
    if ((id = sb_mp_get(msg, "id")) == NULL || !id_matches(id, pk->id))
        return;
    jsonrpc = sb_mp_get(msg, "jsonrpc");
    if (jsonrpc == NULL || !sb_mp_str_is(jsonrpc, "2.0")) {
        pick_fail(pk, SB_E_BAD_ARGS, "%.*s", "upstream response is not JSON-RPC 2.0", 37);
        return;
    }
    result = sb_mp_get(msg, "result");
    error = sb_mp_get(msg, "error");
    if ((result == NULL) == (error == NULL)) {
        pick_fail(pk, SB_E_BAD_ARGS, "%.*s", "upstream response has both or neither of result and error", 57);
        return;
    }
    if (error != NULL) {
        if (error->type != MSGPACK_OBJECT_MAP || describe_error(error, pk->err, pk->errsz) != SB_OK) {
            pick_fail(pk, SB_E_BAD_ARGS, "%.*s", "upstream response has a malformed JSON-RPC error", 48);
            return;
        }
        pk->st = SB_E_EXECUTION;
        pk->done = 1;
        return;
    }
    if (result->type != MSGPACK_OBJECT_MAP) {
        pick_fail(pk, SB_E_BAD_ARGS, "%.*s", "upstream result is not an object", 32);
        return;
    }
    {
        msgpack_packer packer;
        msgpack_packer_init(&packer, pk->out, msgpack_sbuffer_write);
        sb_mp_pack_object(&packer, result);
    }
    pk->st = SB_OK;
    pk->done = 1;
}

/* decodes one message's JSON text with the bounded decoder, then picks from it (or from each batch element) */
static void pick_text(pick_t *pk, const char *text, size_t len, int allow_batch)
{
    msgpack_zone zone;
    msgpack_object root;
    const char *why = NULL;
    sb_status_t st;

    if (len > pk->max_msg) {
        char n[32];
        snprintf(n, sizeof(n), "%zu", pk->max_msg);
        pick_fail(pk, SB_E_TOO_LARGE, "upstream message exceeds %.*s bytes", n, strlen(n));
        return;
    }
    msgpack_zone_init(&zone, 4096);
    /* the tree points into `text`, which outlives it: what is picked is packed into pk->out */
    if ((st = sb_json_parse(text, len, &zone, &root, &why)) != SB_OK) {
        if (st == SB_E_NOMEM)
            pick_fail(pk, SB_E_NOMEM, "%.*s", "out of memory decoding an upstream message", 42);
        else if (st == SB_E_TOO_LARGE)
            pick_fail(pk, SB_E_TOO_LARGE, "%.*s", "upstream message exceeds the nesting or node limits", 51);
        else
            pick_fail(pk, SB_E_BAD_ARGS, "upstream message is not valid JSON (%.*s)", why != NULL ? why : "?",
                      why != NULL ? strlen(why) : 1);
        goto Exit;
    }
    if (root.type == MSGPACK_OBJECT_ARRAY && allow_batch) {
        for (uint32_t i = 0; i < root.via.array.size && !pk->done; ++i)
            pick_message(pk, &root.via.array.ptr[i]);
    } else {
        pick_message(pk, &root);
    }
Exit:
    msgpack_zone_destroy(&zone);
}

static int on_event(void *arg, const char *type, size_t type_len, const char *data, size_t data_len)
{
    pick_t *pk = arg;

    /* MCP sends JSON-RPC messages as default ("message") events; an empty data buffer is a priming event */
    if (type_len != 7 || memcmp(type, "message", 7) != 0 || data_len == 0)
        return 0;
    pick_text(pk, data, data_len, 0);
    return pk->done;
}

sb_status_t sb_mcp_pick_response(sb_mcp_body_t kind, const char *body, size_t len, int64_t id, size_t max_msg, msgpack_sbuffer *out,
                                 char *err, size_t errsz)
{
    pick_t pk = {.id = id, .max_msg = max_msg, .out = out, .err = err, .errsz = errsz, .st = SB_E_BAD_ARGS};

    if (errsz != 0)
        err[0] = '\0';
    switch (kind) {
    case SB_MCP_BODY_JSON:
        pick_text(&pk, body, len, 1);
        break;
    case SB_MCP_BODY_SSE: {
        sb_sse_t sse;
        sb_status_t st;
        sb_sse_init(&sse, max_msg);
        st = sb_sse_feed(&sse, body, len, on_event, &pk, NULL);
        /* an event not closed by a blank line when the stream ends is discarded (WHATWG: "once the end of the file is
         * reached, any pending data must be discarded") */
        sb_sse_dispose(&sse);
        if (st != SB_OK && !pk.done) {
            char n[32];
            snprintf(n, sizeof(n), "%zu", max_msg);
            if (st == SB_E_TOO_LARGE)
                pick_fail(&pk, SB_E_TOO_LARGE, "upstream message exceeds %.*s bytes", n, strlen(n));
            else
                pick_fail(&pk, SB_E_NOMEM, "%.*s", "out of memory reading the event stream", 38);
        }
        break;
    }
    default:
        snprintf(err, errsz, "upstream answered neither application/json nor text/event-stream");
        return SB_E_BAD_ARGS;
    }
    if (!pk.done) {
        snprintf(err, errsz, "upstream answered no JSON-RPC response to request %lld", (long long)id);
        return SB_E_BAD_ARGS;
    }
    return pk.st;
}

size_t sb_mcp_error_hint(const char *body, size_t len, char *out, size_t outsz)
{
    msgpack_zone zone;
    msgpack_object root;
    const msgpack_object *e;
    const char *why = NULL;
    size_t n = 0;

    if (outsz == 0)
        return 0;
    out[0] = '\0';
    if (len == 0 || len > 65536)
        return 0;
    msgpack_zone_init(&zone, 1024);
    if (sb_json_parse(body, len, &zone, &root, &why) == SB_OK && (e = sb_mp_get(&root, "error")) != NULL &&
        e->type == MSGPACK_OBJECT_MAP && describe_error(e, out, outsz) == SB_OK)
        n = strlen(out);
    else
        out[0] = '\0';
    msgpack_zone_destroy(&zone);
    return n;
}
