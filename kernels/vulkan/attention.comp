#version 450
// Paged attention, one group of 64 invocations per (query head = group x,
// query row = group y + t_base). The row's sequence is looked up in seqs
// ({q_start, n_q, kv_len, bt_start}); a row that belongs to no sequence is
// left untouched. Keys are visited in tiles of 64 (one per invocation) with
// an online softmax in f32: running max m, running sum l, and the output
// accumulators (head_dim / 64 per invocation) rescaled by exp(m_old - m_new).
// Mask: j <= p and, with window > 0, p - j < window. Block-table entries the
// mask never reaches may be -1; any key whose slot is out of range is skipped.
#include "common.glsl"
#define HD_MAX 512u
#define NO (HD_MAX / 64u)
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer Qb { float qv[]; };
layout(binding = 1) writeonly buffer Ob { float ov[]; };
layout(binding = 2) readonly buffer SQ { int seqs[]; };
layout(binding = 3) readonly buffer BT { int bt[]; };
#ifdef KV_I8
layout(binding = 4) readonly buffer KP { int8_t kp[]; };
layout(binding = 5) readonly buffer VP { int8_t vp[]; };
layout(binding = 6) readonly buffer KS { float ks[]; };
layout(binding = 7) readonly buffer VS { float vs[]; };
#define KVAL(i) float(int(kp[i]))
#define VVAL(i) float(int(vp[i]))
#else
layout(binding = 4) readonly buffer KP { uint16_t kp[]; };
layout(binding = 5) readonly buffer VP { uint16_t vp[]; };
layout(binding = 6) readonly buffer KS { float ks_unused[]; };
layout(binding = 7) readonly buffer VS { float vs_unused[]; };
#define KVAL(i) dray_h2f(uint(kp[i]))
#define VVAL(i) dray_h2f(uint(vp[i]))
#endif
layout(push_constant) uniform P {
    uint boff[8];
    uint n_seq, n_head, n_kv_head, head_dim, stride_q, stride_o;
    uint window, block_size, n_slots, n_bt, t_base;
    float scale;
    float softcap; // v4 (Gemma 2): scores become softcap * tanh(s / softcap); 0 = none
} pc;

shared float qs[HD_MAX];
shared float red[64];
shared float pj[64];
shared int slot_j[64];

void main()
{
    uint lid = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x;
    uint tl = gl_WorkGroupID.y;
    int tg = int(pc.t_base + tl);
    int sq = -1;
    for (uint s = 0u; s < pc.n_seq; s++) {
        int qs0 = seqs[pc.boff[2] + 4u * s], nq = seqs[pc.boff[2] + 4u * s + 1u];
        if (tg >= qs0 && tg < qs0 + nq) {
            sq = int(s);
            break;
        }
    }
    if (sq < 0)
        return; // uniform across the group
    uint sb = pc.boff[2] + 4u * uint(sq);
    int kv_len = seqs[sb + 2u], bt0 = seqs[sb + 3u];
    int p = kv_len - seqs[sb + 1u] + (tg - seqs[sb]);
    int lo = 0, hi = min(p, kv_len - 1);
    if (pc.window > 0u)
        lo = max(0, p - int(pc.window) + 1);
    uint kvh = h / (pc.n_head / pc.n_kv_head);
    uint qb = pc.boff[0] + tl * pc.stride_q + h * pc.head_dim;
    for (uint d = lid; d < pc.head_dim; d += 64u)
        qs[d] = qv[qb + d];
    barrier();

    float m = -1.0 / 0.0, l = 0.0;
    float acc[NO];
    for (uint r = 0u; r < NO; r++)
        acc[r] = 0.0;
    for (int jb = lo; jb <= hi; jb += 64) {
        int j = jb + int(lid);
        float s = -1.0 / 0.0;
        int slot = -1;
        if (j <= hi) {
            int bi = bt0 + j / int(pc.block_size);
            int blk = (bi >= 0 && uint(bi) < pc.n_bt) ? bt[pc.boff[3] + uint(bi)] : -1;
            int sl = blk * int(pc.block_size) + j % int(pc.block_size);
            if (blk >= 0 && sl >= 0 && uint(sl) < pc.n_slots) {
                slot = sl;
                uint row = uint(sl) * pc.n_kv_head + kvh;
                uint kb = pc.boff[4] + row * pc.head_dim;
                float dot_ = 0.0;
                for (uint d = 0u; d < pc.head_dim; d++)
                    dot_ += qs[d] * KVAL(kb + d);
#ifdef KV_I8
                dot_ *= ks[pc.boff[6] + row];
#endif
                s = pc.scale * dot_;
                if (pc.softcap > 0.0)
                    s = pc.softcap * tanh(s / pc.softcap);
            }
        }
        red[lid] = s;
        barrier();
        for (uint st = 32u; st > 0u; st >>= 1) {
            if (lid < st)
                red[lid] = max(red[lid], red[lid + st]);
            barrier();
        }
        float mn = max(m, red[0]);
        barrier();
        float e = (slot >= 0 && mn > -1.0 / 0.0) ? exp(s - mn) : 0.0;
        pj[lid] = e;
        slot_j[lid] = slot;
        red[lid] = e;
        barrier();
        for (uint st = 32u; st > 0u; st >>= 1) {
            if (lid < st)
                red[lid] += red[lid + st];
            barrier();
        }
        float corr = (m > -1.0 / 0.0) ? exp(m - mn) : 0.0;
        l = l * corr + red[0];
        m = mn;
        int nj = min(64, hi - jb + 1);
        for (uint r = 0u; r < NO; r++) {
            uint d = lid + 64u * r;
            if (d >= pc.head_dim)
                break;
            float a = acc[r] * corr;
            for (int jj = 0; jj < nj; jj++) {
                int sl = slot_j[jj];
                if (sl < 0)
                    continue;
                uint row = uint(sl) * pc.n_kv_head + kvh;
                float v = VVAL(pc.boff[5] + row * pc.head_dim + d);
#ifdef KV_I8
                v *= vs[pc.boff[7] + row];
#endif
                a += pj[jj] * v;
            }
            acc[r] = a;
        }
        barrier();
    }
    uint ob = pc.boff[1] + tl * pc.stride_o + h * pc.head_dim;
    for (uint r = 0u; r < NO; r++) {
        uint d = lid + 64u * r;
        if (d < pc.head_dim)
            ov[ob + d] = l > 0.0 ? acc[r] / l : 0.0;
    }
}
