/* AVX-512 paged attention: kernels/cpu/avx2_attention.c built again with
 * 16-lane dot products (scores) and 64-dimension P.V blocks (DRAY_ATT_512), in
 * the AVX-512 library with its flags, exported as dray_cpu_avx512_attention.
 * The work split, the online softmax and the masking are that file's. */
#define DRAY_ATT_512 1
#define DRAY_ATT_ENTRY dray_cpu_avx512_attention
#include "avx2_attention.c"
