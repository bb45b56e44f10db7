/* secret placeholders in header values (placeholder.h) */
#include <string.h>
#include "call/placeholder.h"

int sb_placeholder_is_name(const char *s, size_t len)
{
    if (len == 0 || len > SB_PLACEHOLDER_MAX_NAME)
        return 0;
    for (size_t i = 0; i != len; ++i) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
            return 0;
    }
    return 1;
}

int sb_placeholder_next(const char *s, size_t len, size_t from, sb_placeholder_t *p)
{
    const char *open;
    size_t at, name, end;

    if (from >= len || len - from < SB_PLACEHOLDER_OPEN_LEN)
        return 0;
    if ((open = memmem(s + from, len - from, SB_PLACEHOLDER_OPEN, SB_PLACEHOLDER_OPEN_LEN)) == NULL)
        return 0;
    at = (size_t)(open - s);
    name = at + SB_PLACEHOLDER_OPEN_LEN;
    for (end = name; end < len && end - name <= SB_PLACEHOLDER_MAX_NAME && s[end] != '}'; ++end)
        ;
    if (end + 1 >= len || s[end] != '}' || s[end + 1] != '}' || !sb_placeholder_is_name(s + name, end - name))
        return -1;
    p->start = at;
    p->len = end + 2 - at;
    p->name = name;
    p->name_len = end - name;
    return 1;
}
