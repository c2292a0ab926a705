/* KV store into the paged pool (layout in backend.h, struct dray_kv_pool):
 *   cache  [n_slots][n_kv_head][head_dim]   int8 or f16
 *   scales [n_slots][n_kv_head]             f32 (int8 only)
 * Grids are given at each kernel.
 * A slot < 0 is padding (not stored). A slot >= n_slots cannot be checked on the
 * host without reading the slots back, so the kernel skips it rather than write
 * out of bounds. */

/* int8, per token per head: scale = max|x|/127, q = rint(x/scale) clamped.
 * One work-item per row (token, kv head, K or V); grid (2*n_kv_head, n_tok).
 * No work-group reduction on purpose: a group-per-row form (absmax through local
 * memory and barriers) gave wrong codes and wrote out of bounds under PoCL 3.1
 * when head_dim < DRAY_WG, nondeterministically, with no fault found in the
 * source. The rows are short (head_dim) and few (n_tok * n_kv_head * 2). */
__kernel void kv_store_i8(__global const float *k, ulong k_off, uint stride_k,
                          __global const float *v, ulong v_off, uint stride_v,
                          __global const int *slots, ulong slots_off,
                          __global char *kc, ulong kc_off, __global char *vc, ulong vc_off,
                          __global float *ks, ulong ks_off, __global float *vs, ulong vs_off,
                          uint n_kv_head, uint head_dim, uint n_slots, uint n_tok)
{
    size_t hh = get_global_id(0), t = get_global_id(1);
    if (hh >= 2 * (size_t)n_kv_head || t >= n_tok)
        return;
    int slot = slots[slots_off + t];
    if (slot < 0 || (uint)slot >= n_slots)
        return;
    bool is_v = hh >= n_kv_head;
    size_t h = is_v ? hh - n_kv_head : hh;
    size_t row = (size_t)slot * n_kv_head + h;
    __global const float *src = is_v ? v + v_off + t * stride_v + h * head_dim
                                     : k + k_off + t * stride_k + h * head_dim;
    __global char *dst = (is_v ? vc + vc_off : kc + kc_off) + row * head_dim;
    float amax = 0.0f;
    for (uint i = 0; i < head_dim; i++)
        amax = fmax(amax, fabs(src[i]));
    float s = amax / 127.0f;
    if (is_v)
        vs[vs_off + row] = s;
    else
        ks[ks_off + row] = s;
    for (uint i = 0; i < head_dim; i++)
        dst[i] = dray_q8(src[i], s);
}

/* f16: round to nearest even (vstore_half_rte needs no cl_khr_fp16). */
__kernel __attribute__((reqd_work_group_size(DRAY_WG, 1, 1)))
void kv_store_f16(__global const float *k, ulong k_off, uint stride_k,
                  __global const float *v, ulong v_off, uint stride_v,
                  __global const int *slots, ulong slots_off,
                  __global half *kc, ulong kc_off, __global half *vc, ulong vc_off,
                  uint n_kv_head, uint head_dim, uint n_slots)
{
    size_t h = get_group_id(1), t = get_group_id(2);
    int slot = slots[slots_off + t];
    if (slot < 0 || (uint)slot >= n_slots)
        return;
    size_t row = (size_t)slot * n_kv_head + h;
    __global const float *ksrc = k + k_off + t * stride_k + h * head_dim;
    __global const float *vsrc = v + v_off + t * stride_v + h * head_dim;
    for (uint i = get_local_id(0); i < head_dim; i += DRAY_WG) {
        vstore_half_rte(ksrc[i], kc_off + row * head_dim + i, kc);
        vstore_half_rte(vsrc[i], vc_off + row * head_dim + i, vc);
    }
}
