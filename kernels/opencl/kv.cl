/* KV store into the paged pool (layout in backend.h, struct dray_kv_pool):
 *   cache  [n_slots][n_kv_head][head_dim]   int8 or f16
 *   scales [n_slots][n_kv_head]             f32 (int8 only)
 * One work-group per (token, kv head); grid (DRAY_WG, n_kv_head, n_tok).
 * A slot < 0 is padding (not stored). A slot >= n_slots cannot be checked on the
 * host without reading the slots back, so the kernel skips it rather than write
 * out of bounds. */

/* int8, per token per head: scale = max|x|/127, q = rint(x/scale) clamped. */
inline void dray_store_row_i8(__global const float *src, uint n, __global char *dst,
                              __global float *scale, __local float *part)
{
    float s = dray_wg_absmax(src, n, part) / 127.0f;
    if (get_local_id(0) == 0)
        *scale = s;
    for (uint i = get_local_id(0); i < n; i += DRAY_WG)
        dst[i] = dray_q8(src[i], s);
}

__kernel __attribute__((reqd_work_group_size(DRAY_WG, 1, 1)))
void kv_store_i8(__global const float *k, ulong k_off, uint stride_k,
                 __global const float *v, ulong v_off, uint stride_v,
                 __global const int *slots, ulong slots_off,
                 __global char *kc, ulong kc_off, __global char *vc, ulong vc_off,
                 __global float *ks, ulong ks_off, __global float *vs, ulong vs_off,
                 uint n_kv_head, uint head_dim, uint n_slots)
{
    __local float part[DRAY_WG];
    size_t h = get_group_id(1), t = get_group_id(2);
    int slot = slots[slots_off + t];
    if (slot < 0 || (uint)slot >= n_slots)
        return; /* uniform over the group: no barrier is skipped by only some items */
    size_t row = (size_t)slot * n_kv_head + h;
    dray_store_row_i8(k + k_off + t * stride_k + h * head_dim, head_dim,
                      kc + kc_off + row * head_dim, ks + ks_off + row, part);
    dray_store_row_i8(v + v_off + t * stride_v + h * head_dim, head_dim,
                      vc + vc_off + row * head_dim, vs + vs_off + row, part);
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
