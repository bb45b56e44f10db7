/*
 * sandbox-shim: the module path's origins, import map and request parser (modules.h).
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include "relay/modules.h"

#define HTTPS "https://"

static int ascii_lower(int c)
{
    return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c;
}

static int ascii_digit(int c)
{
    return c >= '0' && c <= '9';
}

static int name_char(int c)
{
    c = ascii_lower(c);
    return (c >= 'a' && c <= 'z') || ascii_digit(c) || c == '-' || c == '.' || c == '_';
}

static int v6_char(int c)
{
    c = ascii_lower(c);
    return ascii_digit(c) || (c >= 'a' && c <= 'f') || c == ':' || c == '.';
}

/* an authority "host[:port]" or "[v6][:port]": the host's extent and the effective port (443 when none); 0 or -1 */
static int split_authority(const char *p, size_t len, size_t *host_len, unsigned *port)
{
    size_t h, i;

    if (len == 0)
        return -1;
    if (p[0] == '[') {
        for (h = 1; h < len && p[h] != ']'; ++h)
            if (!v6_char((unsigned char)p[h]))
                return -1;
        if (h == len || h < 3)
            return -1;
        ++h; /* the ']' */
    } else {
        for (h = 0; h < len && p[h] != ':'; ++h)
            if (!name_char((unsigned char)p[h]) || (h > 0 && p[h] == '.' && p[h - 1] == '.'))
                return -1;
        if (h == 0 || h > 253 || p[0] == '.' || p[0] == '-')
            return -1;
    }
    *host_len = h;
    if (h == len) {
        *port = 443;
        return 0;
    }
    if (p[h] != ':' || len - h - 1 == 0 || len - h - 1 > 5)
        return -1;
    *port = 0;
    for (i = h + 1; i < len; ++i) {
        if (!ascii_digit((unsigned char)p[i]))
            return -1;
        *port = *port * 10 + (unsigned)(p[i] - '0');
    }
    return *port >= 1 && *port <= 65535 ? 0 : -1;
}

int sb_shim_imports_add(sb_shim_imports_t *im, const char *entry, size_t len, const char **why)
{
    char origin[SB_SHIM_MAX_ORIGIN];
    size_t host_len, o;
    unsigned port;

    if (len == 0 || len > SB_SHIM_MAX_ORIGIN - sizeof(HTTPS) - 8 || memchr(entry, '\0', len) != NULL ||
        split_authority(entry, len, &host_len, &port) != 0) {
        *why = "an import entry must be a host name, an IPv4 address or a bracketed IPv6 address, with an optional :port";
        return -1;
    }
    memcpy(origin, HTTPS, sizeof(HTTPS) - 1);
    o = sizeof(HTTPS) - 1;
    /* the host as the broker's URL parser writes it back (its canonical form), or every module of it would
     * come back under another URL: IPv6 as inet_ntop prints it, a name without its trailing dot, lower case */
    if (entry[0] == '[') {
        char text[64];
        struct in6_addr a;
        if (host_len - 2 >= sizeof(text)) {
            *why = "an import entry must be a host name, an IPv4 address or a bracketed IPv6 address, with an optional :port";
            return -1;
        }
        memcpy(text, entry + 1, host_len - 2);
        text[host_len - 2] = '\0';
        if (inet_pton(AF_INET6, text, &a) != 1 || inet_ntop(AF_INET6, &a, text, sizeof(text)) == NULL) {
            *why = "an import entry must be a host name, an IPv4 address or a bracketed IPv6 address, with an optional :port";
            return -1;
        }
        o += (size_t)snprintf(origin + o, sizeof(origin) - o, "[%s]", text);
    } else {
        if (host_len > 1 && entry[host_len - 1] == '.')
            --host_len;
        for (size_t i = 0; i < host_len; ++i)
            origin[o++] = (char)ascii_lower((unsigned char)entry[i]);
    }
    if (port != 443)
        o += (size_t)snprintf(origin + o, sizeof(origin) - o, ":%u", port);
    origin[o] = '\0';
    for (unsigned i = 0; i < im->n; ++i)
        if (strcmp(im->origin[i], origin) == 0)
            return 0;
    if (im->n >= SB_SHIM_MAX_IMPORT_ORIGINS) {
        *why = "too many import origins";
        return -1;
    }
    memcpy(im->origin[im->n++], origin, o + 1);
    return 0;
}

uint16_t sb_shim_import_port(unsigned i)
{
    return (uint16_t)(SB_SHIM_IMPORT_PORT_BASE + i);
}

sb_status_t sb_shim_imports_map(const sb_shim_imports_t *im, sb_buf_t *out)
{
    /* the origins hold only name characters, digits, brackets and colons: nothing to escape in JSON */
    sb_status_t st = sb_buf_append_str(out, "{\"imports\":{");
    for (unsigned i = 0; i < im->n && st == SB_OK; ++i)
        st = sb_buf_printf(out, "%s\"%s/\":\"http://127.0.0.1:%u/\"", i != 0 ? "," : "", im->origin[i],
                           (unsigned)sb_shim_import_port(i));
    return st == SB_OK ? sb_buf_append_str(out, "}}") : st;
}

void sb_shim_imports_pack(const sb_shim_imports_t *im, msgpack_packer *pk)
{
    (void)msgpack_pack_map(pk, im->n);
    for (unsigned i = 0; i < im->n; ++i) {
        char prefix[32];
        int n = snprintf(prefix, sizeof(prefix), "http://127.0.0.1:%u", (unsigned)sb_shim_import_port(i));
        size_t olen = strlen(im->origin[i]);
        (void)msgpack_pack_str(pk, (size_t)n);
        (void)msgpack_pack_str_body(pk, prefix, (size_t)n);
        (void)msgpack_pack_str(pk, olen);
        (void)msgpack_pack_str_body(pk, im->origin[i], olen);
    }
}

sb_status_t sb_shim_imports_allow(const sb_shim_imports_t *im, sb_buf_t *out)
{
    sb_status_t st = SB_OK;
    for (unsigned i = 0; i < im->n && st == SB_OK; ++i)
        st = sb_buf_printf(out, "%s127.0.0.1:%u", i != 0 ? "," : "", (unsigned)sb_shim_import_port(i));
    return st;
}

int sb_shim_imports_find(const sb_shim_imports_t *im, const char *url, size_t len, size_t *path_off)
{
    size_t a = sizeof(HTTPS) - 1, end, host_len;
    unsigned port;

    if (len < a || strncmp(url, HTTPS, a) != 0)
        return -1;
    for (end = a; end < len && url[end] != '/' && url[end] != '?' && url[end] != '#'; ++end)
        ;
    if (split_authority(url + a, end - a, &host_len, &port) != 0)
        return -1;
    for (unsigned i = 0; i < im->n; ++i) {
        const char *o = im->origin[i] + a;
        size_t olen = strlen(o), ohost;
        unsigned oport;
        if (split_authority(o, olen, &ohost, &oport) != 0 || ohost != host_len || oport != port)
            continue;
        size_t k = 0;
        while (k < host_len && ascii_lower((unsigned char)url[a + k]) == o[k])
            ++k;
        if (k == host_len) {
            *path_off = end;
            return (int)i;
        }
    }
    return -1;
}

/* 1 when the header line (without its CRLF) is one a bodiless GET may carry */
static int header_ok(const uint8_t *p, size_t len)
{
    static const char cl[] = "content-length", te[] = "transfer-encoding";
    size_t colon = 0, v;

    while (colon < len && p[colon] != ':')
        ++colon;
    if (colon == 0 || colon == len)
        return 0;
    for (size_t i = 0; i < len; ++i)
        if ((p[i] < 0x20 && p[i] != '\t') || p[i] == 0x7f)
            return 0;
    if (colon == sizeof(te) - 1) {
        size_t k = 0;
        while (k < colon && ascii_lower(p[k]) == te[k])
            ++k;
        if (k == colon)
            return 0;
    }
    if (colon == sizeof(cl) - 1) {
        size_t k = 0;
        while (k < colon && ascii_lower(p[k]) == cl[k])
            ++k;
        if (k == colon) {
            for (v = colon + 1; v < len && (p[v] == ' ' || p[v] == '\t'); ++v)
                ;
            while (len > v && (p[len - 1] == ' ' || p[len - 1] == '\t'))
                --len;
            return len - v == 1 && p[v] == '0';
        }
    }
    return 1;
}

sb_status_t sb_shim_module_parse_request(const uint8_t *p, size_t len, size_t *head_len, char *target, const char **why)
{
    size_t end = 0, i, t;
    int found = 0;

    for (i = 0; i + 3 < len && i + 4 <= SB_SHIM_MODULE_MAX_HEAD; ++i) {
        if (p[i] == '\r' && p[i + 1] == '\n' && p[i + 2] == '\r' && p[i + 3] == '\n') {
            end = i + 4;
            found = 1;
            break;
        }
    }
    if (!found) {
        if (len >= SB_SHIM_MODULE_MAX_HEAD) {
            *why = "module request head too large";
            return SB_E_TOO_LARGE;
        }
        return SB_E_AGAIN;
    }
    if (end < 4 + 1 + 11 || memcmp(p, "GET /", 5) != 0) {
        *why = "a module request must be GET of a path";
        return SB_E_BAD_ARGS;
    }
    for (t = 4; t < end && p[t] != ' '; ++t) {
        if (p[t] <= 0x20 || p[t] >= 0x7f) {
            *why = "module request target holds a byte that is not visible ASCII";
            return SB_E_BAD_ARGS;
        }
    }
    if (t - 4 > SB_SHIM_MODULE_MAX_TARGET) {
        *why = "module request target too long";
        return SB_E_TOO_LARGE;
    }
    if (t + 11 > end || (memcmp(p + t, " HTTP/1.1\r\n", 11) != 0 && memcmp(p + t, " HTTP/1.0\r\n", 11) != 0)) {
        *why = "module request line is not GET <path> HTTP/1.x";
        return SB_E_BAD_ARGS;
    }
    memcpy(target, p + 4, t - 4);
    target[t - 4] = '\0';
    /* the header lines: each ends with CRLF, none announces a body */
    for (i = t + 11; i + 2 < end;) {
        size_t e = i;
        while (e + 1 < end && !(p[e] == '\r' && p[e + 1] == '\n'))
            ++e;
        if (!header_ok(p + i, e - i)) {
            *why = "module request header is malformed or announces a body";
            return SB_E_BAD_ARGS;
        }
        i = e + 2;
    }
    *head_len = end;
    return SB_OK;
}
