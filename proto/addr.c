/*
 * A listen address (sb/addr.h).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include "sb/addr.h"

int sb_parse_listen_addr(const char *s, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[64];
    const char *colon, *h = s, *p;
    size_t hlen;
    unsigned long port = 0;
    struct sockaddr_in *sin = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;

    memset(ss, 0, sizeof(*ss));
    if (*s == '[') {
        const char *rb = strchr(s, ']');
        if (rb == NULL || rb[1] != ':')
            return -1;
        h = s + 1;
        hlen = (size_t)(rb - h);
        colon = rb + 1;
    } else {
        if ((colon = strrchr(s, ':')) == NULL)
            return -1;
        hlen = (size_t)(colon - s);
    }
    if (hlen == 0 || hlen >= sizeof(host) || colon[1] == '\0' || strlen(colon + 1) > 5)
        return -1;
    for (p = colon + 1; *p != '\0'; ++p) {
        if (*p < '0' || *p > '9')
            return -1;
        port = port * 10 + (unsigned long)(*p - '0');
    }
    if (port > 65535)
        return -1;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    if (*s != '[' && strcmp(host, "localhost") == 0)
        memcpy(host, "127.0.0.1", sizeof("127.0.0.1"));
    if (*s != '[' && inet_pton(AF_INET, host, &sin->sin_addr) == 1) {
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)port);
        *len = sizeof(*sin);
        return 0;
    }
    if (*s == '[' && inet_pton(AF_INET6, host, &sin6->sin6_addr) == 1) {
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t)port);
        *len = sizeof(*sin6);
        return 0;
    }
    return -1;
}
