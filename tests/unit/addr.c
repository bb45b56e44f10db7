/*
 * Unit tests for proto/addr.c: the listen address the broker (listen, admin_listen) and
 * sandbox-shim serve (--listen, PORT) take.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include "sb/addr.h"
#include "tap.h"

static void accepted(const char *in, int family, const char *host, unsigned port)
{
    struct sockaddr_storage ss;
    socklen_t len = 0;
    char text[64] = "";

    if (!ok(sb_parse_listen_addr(in, &ss, &len) == 0, "accepted: %s", in))
        return;
    is_int(ss.ss_family, family, "family of %s", in);
    if (family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &sin->sin_addr, text, sizeof(text));
        is_int(ntohs(sin->sin_port), port, "port of %s", in);
        is_int(len, sizeof(*sin), "length of %s", in);
    } else {
        const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &sin6->sin6_addr, text, sizeof(text));
        is_int(ntohs(sin6->sin6_port), port, "port of %s", in);
        is_int(len, sizeof(*sin6), "length of %s", in);
    }
    is_str(text, host, "host of %s", in);
}

int main(void)
{
    static const char *const refused[] = {"",
                                          "8080",
                                          ":8080",
                                          "127.0.0.1",
                                          "127.0.0.1:",
                                          "127.0.0.1:+80",
                                          "127.0.0.1: 80",
                                          "127.0.0.1:80 ",
                                          "127.0.0.1:65536",
                                          "127.0.0.1:000080",
                                          "::1:8080",
                                          "[::1]",
                                          "[::1]8080",
                                          "[127.0.0.1]:80",
                                          "[localhost]:80",
                                          "host.example:80",
                                          "[::1:80",
                                          "127.0.0.1:-1",
                                          "1.2.3:80",
                                          "[::1]:0x50"};
    struct sockaddr_storage ss;
    socklen_t len;

    accepted("127.0.0.1:8080", AF_INET, "127.0.0.1", 8080);
    accepted("0.0.0.0:0", AF_INET, "0.0.0.0", 0);
    accepted("localhost:65535", AF_INET, "127.0.0.1", 65535);
    accepted("[::1]:9", AF_INET6, "::1", 9);
    accepted("[::]:80", AF_INET6, "::", 80);
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); ++i)
        ok(sb_parse_listen_addr(refused[i], &ss, &len) == -1, "refused: \"%s\"", refused[i]);
    return done_testing();
}
