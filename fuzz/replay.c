/*
 * A stand-in for libFuzzer when the compiler has none (gcc): runs a driver's
 * LLVMFuzzerTestOneInput once over every file named on the command line, or
 * every regular file in a named directory. Used to replay corpora and crash
 * reproducers in gcc and valgrind builds; it does not fuzz.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "fuzz.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0, n;

    if (f == NULL) {
        perror(path);
        return 1;
    }
    do {
        if (len == cap) {
            cap = cap != 0 ? cap * 2 : 4096;
            if ((buf = realloc(buf, cap)) == NULL)
                abort();
        }
        n = fread(buf + len, 1, cap - len, f);
        len += n;
    } while (n != 0);
    fclose(f);
    /* an exact-size copy, as libFuzzer hands it over */
    {
        uint8_t *exact = calloc(1, len != 0 ? len : 1);
        if (exact == NULL)
            abort();
        if (len != 0)
            memcpy(exact, buf, len);
        (void)LLVMFuzzerTestOneInput(exact, len);
        free(exact);
    }
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int bad = 0, runs = 0;

    for (int i = 1; i < argc; ++i) {
        struct stat st;
        if (argv[i][0] == '-')
            continue; /* libFuzzer flags are accepted and ignored */
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            ++bad;
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            DIR *d = opendir(argv[i]);
            struct dirent *e;
            if (d == NULL) {
                perror(argv[i]);
                ++bad;
                continue;
            }
            while ((e = readdir(d)) != NULL) {
                char path[4096];
                struct stat fst;
                if (e->d_name[0] == '.')
                    continue;
                snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
                if (stat(path, &fst) == 0 && S_ISREG(fst.st_mode)) {
                    bad += run_file(path);
                    ++runs;
                }
            }
            closedir(d);
        } else {
            bad += run_file(argv[i]);
            ++runs;
        }
    }
    fprintf(stderr, "replayed %d inputs\n", runs);
    return bad != 0;
}
