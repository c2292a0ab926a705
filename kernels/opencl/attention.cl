/* Paged attention over a mixed prefill/decode batch (contract: backend.h,
 * struct dray_attention_args). One work-group per (query row, query head); grid
 * (DRAY_WG, n_tok, n_head). The group finds the row's sequence in seqs (n_seq is
 * small), then walks the visible positions in chunks of DRAY_WG keys with an
 * online softmax (running max m and sum l, f32):
 *   1. item i scores key c0+i: scale * sum_e q[e] * k[e] (k dequantized per
 *      element, summed in order, like the reference), soft-capped to
 *      softcap * tanh(s / softcap) when softcap > 0 (v4, Gemma 2);
 *   2. the chunk max updates m, item i stores p_i = exp(s_i - m);
 *   3. item i owns output dims i, i+DRAY_WG, ...: acc = acc*alpha + sum p_j v_j.
 * Keys whose block-table entry is -1 (or lies outside the table / the pool)
 * count as masked, so a malformed table cannot make the kernel read out of bounds.
 * The K/V cache is int8 (with per-row scales) or f16 (vload_half). */

inline float dray_kv_load(__global const char *c, ulong off, uint is_i8, float scale)
{
    if (is_i8)
        return (float)c[off] * scale;
    return vload_half(off, (__global const half *)c);
}

__kernel __attribute__((reqd_work_group_size(DRAY_WG, 1, 1)))
void attention(__global const float *q, ulong q_off, uint stride_q,
               __global float *out, ulong out_off, uint stride_out,
               __global const int *seqs, ulong seqs_off, uint n_seq,
               __global const int *bt, ulong bt_off, ulong bt_len,
               __global const char *kc, ulong kc_off, __global const char *vc, ulong vc_off,
               __global const float *ks, ulong ks_off, __global const float *vs, ulong vs_off,
               uint is_i8, uint n_head, uint n_kv_head, uint head_dim, uint block_size,
               uint n_slots, uint window, float scale, float softcap)
{
    __local float qv[DRAY_HD_MAX];
    __local float sc[DRAY_WG];
    __local float pr[DRAY_WG];
    __local int sl[DRAY_WG];
    uint lid = get_local_id(0);
    long r = (long)get_group_id(1);
    uint h = get_group_id(2);

    /* the sequence that owns query row r */
    __global const int *sq = 0;
    seqs += seqs_off;
    for (uint s = 0; s < n_seq; s++)
        if (r >= seqs[4 * s] && r < (long)seqs[4 * s] + seqs[4 * s + 1]) {
            sq = seqs + 4 * s;
            break;
        }
    if (!sq)
        return; /* a row outside every sequence is left alone (whole group) */
    long pos = (long)sq[2] - sq[1] + (r - sq[0]);
    if (pos < 0)
        return;
    long bt_start = sq[3];
    uint g = h / (n_head / n_kv_head); /* kv head read by query head h */

    for (uint e = lid; e < head_dim; e += DRAY_WG)
        qv[e] = q[q_off + r * stride_q + h * head_dim + e];
    barrier(CLK_LOCAL_MEM_FENCE);

    long lo = (window > 0 && pos + 1 > (long)window) ? pos + 1 - window : 0;
    float m = -INFINITY, l = 0.0f;
    float acc[DRAY_HD_PER_ITEM];
    for (uint i = 0; i < DRAY_HD_PER_ITEM; i++)
        acc[i] = 0.0f;

    for (long c0 = lo; c0 <= pos; c0 += DRAY_WG) {
        /* 1. score one key */
        long j = c0 + lid;
        float s = -INFINITY;
        int slot = -1;
        if (j <= pos) {
            long bi = bt_start + j / block_size;
            int b = (bi >= 0 && bi < (long)bt_len) ? bt[bt_off + bi] : -1;
            long sj = b >= 0 ? (long)b * block_size + j % block_size : -1;
            if (sj >= 0 && sj < (long)n_slots) {
                slot = (int)sj;
                size_t row = (size_t)slot * n_kv_head + g;
                float ksc = is_i8 ? ks[ks_off + row] : 0.0f;
                ulong base = kc_off + row * head_dim;
                float d = 0.0f;
                for (uint e = 0; e < head_dim; e++)
                    d += qv[e] * dray_kv_load(kc, base + e, is_i8, ksc);
                s = d * scale;
                if (softcap > 0.0f)
                    s = softcap * tanh(s / softcap);
            }
        }
        sc[lid] = s;
        sl[lid] = slot;
        barrier(CLK_LOCAL_MEM_FENCE);

        /* 2. chunk max, rescale factor, this item's probability */
        float cm = m;
        for (uint i = 0; i < DRAY_WG; i++)
            cm = fmax(cm, sc[i]);
        float alpha = m == -INFINITY ? 0.0f : exp(m - cm);
        pr[lid] = slot >= 0 ? exp(s - cm) : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);

        /* 3. accumulate V over the chunk for the dims this item owns */
        float psum = 0.0f;
        for (uint i = 0; i < DRAY_WG; i++)
            psum += pr[i];
        l = l * alpha + psum;
        for (uint k = 0; k < DRAY_HD_PER_ITEM; k++) {
            uint e = lid + k * DRAY_WG;
            if (e >= head_dim)
                break;
            float a = acc[k] * alpha;
            for (uint i = 0; i < DRAY_WG; i++) {
                if (pr[i] == 0.0f)
                    continue;
                size_t row = (size_t)sl[i] * n_kv_head + g;
                float vsc = is_i8 ? vs[vs_off + row] : 0.0f;
                a += pr[i] * dray_kv_load(vc, vc_off + row * head_dim + e, is_i8, vsc);
            }
            acc[k] = a;
        }
        m = cm;
        barrier(CLK_LOCAL_MEM_FENCE); /* sc/pr/sl are rewritten by the next chunk */
    }

    __global float *o = out + out_off + r * stride_out + h * head_dim;
    for (uint k = 0; k < DRAY_HD_PER_ITEM; k++) {
        uint e = lid + k * DRAY_WG;
        if (e < head_dim)
            o[e] = l > 0.0f ? acc[k] / l : 0.0f;
    }
}
