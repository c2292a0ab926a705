/* The ggml tensor type table: block size in elements and bytes, the name, and
 * whether dray dequantizes it (dequant.c). The GGUF reader sizes tensors with it,
 * dequant.c walks blocks with it, `dray info` names types with it. */
#include <stdbool.h>
#include <stdint.h>

#include "dray/gguf.h"

struct type_info {
    const char *name;
    uint16_t block_elems; /* elements per block */
    uint16_t block_bytes; /* bytes per block */
    bool supported;       /* dray_dequant_row handles it */
};

/* Indexed by ggml type id. Sizes of the types dray does not dequantize are known
 * anyway so that the reader can bounds-check their data and `dray info` can name
 * them. Ids 4, 5, 31-33, 36-38 were removed from ggml and stay unknown. */
static const struct type_info types[] = {
    [0] = {"F32", 1, 4, true},          [1] = {"F16", 1, 2, true},
    [2] = {"Q4_0", 32, 18, true},       [3] = {"Q4_1", 32, 20, true},
    [6] = {"Q5_0", 32, 22, true},       [7] = {"Q5_1", 32, 24, true},
    [8] = {"Q8_0", 32, 34, true},       [9] = {"Q8_1", 32, 36, false},
    [10] = {"Q2_K", 256, 84, false},    [11] = {"Q3_K", 256, 110, false},
    [12] = {"Q4_K", 256, 144, true},    [13] = {"Q5_K", 256, 176, true},
    [14] = {"Q6_K", 256, 210, true},    [15] = {"Q8_K", 256, 292, false},
    [16] = {"IQ2_XXS", 256, 66, false}, [17] = {"IQ2_XS", 256, 74, false},
    [18] = {"IQ3_XXS", 256, 98, false}, [19] = {"IQ1_S", 256, 50, false},
    [20] = {"IQ4_NL", 32, 18, false},   [21] = {"IQ3_S", 256, 110, false},
    [22] = {"IQ2_S", 256, 82, false},   [23] = {"IQ4_XS", 256, 136, false},
    [24] = {"I8", 1, 1, false},         [25] = {"I16", 1, 2, false},
    [26] = {"I32", 1, 4, false},        [27] = {"I64", 1, 8, false},
    [28] = {"F64", 1, 8, false},        [29] = {"IQ1_M", 256, 56, false},
    [30] = {"BF16", 1, 2, true},        [34] = {"TQ1_0", 256, 54, false},
    [35] = {"TQ2_0", 256, 66, false},   [39] = {"MXFP4", 32, 17, false},
    [40] = {"NVFP4", 64, 36, false},    [41] = {"Q1_0", 128, 18, false},
};

static const struct type_info *type_info(uint32_t type)
{
    if (type >= sizeof(types) / sizeof(types[0]) || !types[type].name)
        return NULL;
    return &types[type];
}

uint32_t dray_ggml_block_elems(uint32_t type)
{
    const struct type_info *t = type_info(type);
    return t ? t->block_elems : 0;
}

uint32_t dray_ggml_block_bytes(uint32_t type)
{
    const struct type_info *t = type_info(type);
    return t ? t->block_bytes : 0;
}

const char *dray_ggml_type_name(uint32_t type)
{
    const struct type_info *t = type_info(type);
    return t ? t->name : NULL;
}

bool dray_ggml_type_supported(uint32_t type)
{
    const struct type_info *t = type_info(type);
    return t && t->supported;
}


bool dray_ggml_is_4bit(uint32_t type)
{
    return type == 2 || type == 3 || type == 12; /* Q4_0, Q4_1, Q4_K */
}

bool dray_ggml_is_5bit(uint32_t type)
{
    return type == DRAY_GGML_Q5_0 || type == DRAY_GGML_Q5_1;
}
