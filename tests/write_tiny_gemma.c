/* Writes one tiny random-weight Gemma 3 GGUF (tiny_gemma.h) for script tests:
 *   write_tiny_gemma OUT.gguf [LOUD]
 * LOUD > 0 makes three input channels that much louder (activation outliers). */
#include <stdio.h>
#include <stdlib.h>

#include "tiny_gemma.h"

int main(int argc, char **argv)
{
    struct tiny_gemma t;
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: write_tiny_gemma OUT.gguf [LOUD]\n");
        return 2;
    }
    tiny_gemma_defaults(&t);
    if (argc == 3) {
        char *end;
        t.loud = strtof(argv[2], &end);
        if (*end || t.loud < 0) {
            fprintf(stderr, "write_tiny_gemma: LOUD must be a number >= 0, not '%s'\n", argv[2]);
            return 2;
        }
    }
    if (tiny_gemma_write(&t, argv[1])) {
        fprintf(stderr, "write_tiny_gemma: cannot write %s\n", argv[1]);
        return 1;
    }
    return 0;
}
