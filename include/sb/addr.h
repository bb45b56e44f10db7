/*
 * A listen address as the broker and the shim's service take it from their configuration:
 * "host:port" with a numeric IPv4 host, "[v6]:port", or "localhost:port" (127.0.0.1). One parser
 * for both, so that the two services read the same spelling the same way.
 */
#ifndef SB_ADDR_H
#define SB_ADDR_H

#include <sys/socket.h>

/**
 * @param s NUL-terminated; the port is 0..65535 in plain decimal digits (no sign, no space)
 * @return 0 with `ss` and `len` filled, or -1
 */
int sb_parse_listen_addr(const char *s, struct sockaddr_storage *ss, socklen_t *len);

#endif
