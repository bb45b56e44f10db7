/*
 * broker/http/reqid (reqid.h). The charset leaves out every byte that a log
 * line, a header or a shell would treat specially (quotes, backslash,
 * whitespace, control bytes, '%', non-ASCII), so the id needs no escaping
 * anywhere it is written, and a hostile one cannot forge a second log field
 * or a second header.
 */
#include <string.h>
#include "http/reqid.h"

static int is_id_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':' ||
           c == '-';
}

int sb_http_request_id(h2o_req_t *req, char out[SB_MAX_REQUEST_ID + 1])
{
    ssize_t i = h2o_find_header_by_str(&req->headers, H2O_STRLIT("x-request-id"), -1);
    h2o_iovec_t v;

    out[0] = '\0';
    /* two ids are ambiguous: the proxy and the broker could each log another */
    if (i < 0 || h2o_find_header_by_str(&req->headers, H2O_STRLIT("x-request-id"), i) >= 0)
        return 0;
    v = req->headers.entries[i].value;
    if (v.len == 0 || v.len > SB_MAX_REQUEST_ID)
        return 0;
    for (size_t k = 0; k < v.len; ++k)
        if (!is_id_char((unsigned char)v.base[k]))
            return 0;
    memcpy(out, v.base, v.len);
    out[v.len] = '\0';
    return 1;
}

void sb_http_echo_request_id(h2o_req_t *req)
{
    char id[SB_MAX_REQUEST_ID + 1];

    if (sb_http_request_id(req, id)) {
        size_t len = strlen(id);
        h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-request-id"), 0, NULL,
                              h2o_strdup(&req->pool, id, len).base, len);
    }
}
