/* The prefix cache's memory (prefix_cache.h, "Memory"): what the KV manager
 * asks back, oldest first, moves to the host tier or is dropped; a hit brings
 * spilled blocks back. */
#include "prefix_cache_internal.h"

#include <stdlib.h>

static uint64_t ckpt_host_bytes(const struct dray_pcache *pc, const struct pc_entry *e)
{
    uint64_t n = 0;
    FOR_CKPT(pc, e, g, k, i)
        n += pc->wblock_bytes[g];
    return n;
}

static void host_release(struct dray_pcache *pc, unsigned char **p, uint64_t bytes)
{
    if (!*p)
        return;
    free(*p);
    *p = NULL;
    pc->st.host_bytes -= bytes;
}

static void drop_ckpt(struct dray_pcache *pc, struct pc_entry *e)
{
    if (e->ckpt) {
        FOR_CKPT(pc, e, g, k, i)
            dray_kv_block_unref(pc->kv, g, (uint32_t)e->ckpt[i]);
        pc->st.blocks -= e->n_ckpt;
        free(e->ckpt);
        e->ckpt = NULL;
    }
    host_release(pc, &e->host_ckpt, ckpt_host_bytes(pc, e));
    e->n_ckpt = 0;
    pc->st.checkpoints--;
}

void pc_drop_entry(struct dray_pcache *pc, struct pc_entry *e)
{
    if (has_ckpt(e))
        drop_ckpt(pc, e);
    if (e->host_g) {
        host_release(pc, &e->host_g, pc->g_bytes);
    } else {
        for (uint32_t g = 0; g < pc->n_group; g++)
            if (!pc->window[g]) {
                dray_kv_block_unref(pc->kv, g, (uint32_t)e->gblock[g]);
                pc->st.blocks--;
            }
    }
    struct pc_entry **p = slot_of(pc, e->hash);
    while (*p != e)
        p = &(*p)->next;
    *p = e->next;
    for (p = children_of(pc, e->parent); *p != e;)
        p = &(*p)->sibling;
    *p = e->sibling;
    lru_unlink(pc, e);
    if (e->parent)
        e->parent->n_children--;
    pc->st.entries--;
    free(e);
}

/* Room for `bytes` more in the host tier: host checkpoints go first, then
 * leaf entries that live only on the host, oldest first. */
static bool host_room(struct dray_pcache *pc, uint64_t bytes)
{
    if (bytes > pc->host_budget)
        return false;
    for (struct pc_entry *e = pc->oldest, *newer; e && pc->st.host_bytes + bytes > pc->host_budget;
         e = newer) {
        newer = e->newer;
        if (e->pinned)
            continue;
        if (e->host_ckpt) {
            drop_ckpt(pc, e);
            pc->st.evictions++;
        }
        if (e->host_g && !e->n_children && !has_ckpt(e)) {
            pc_drop_entry(pc, e);
            pc->st.evictions++;
        }
    }
    return pc->st.host_bytes + bytes <= pc->host_budget;
}

/* Device -> host: download e's global blocks, then give the device blocks back. */
static bool spill_global(struct dray_pcache *pc, struct pc_entry *e)
{
    if (!host_room(pc, pc->g_bytes))
        return false;
    unsigned char *buf = malloc(pc->g_bytes), *p = buf;
    for (uint32_t g = 0; buf && g < pc->n_group; g++) {
        if (pc->window[g])
            continue;
        if (dray_kv_block_download(pc->kv, g, (uint32_t)e->gblock[g], p)) {
            free(buf);
            return false;
        }
        p += pc->wblock_bytes[g];
    }
    if (!buf)
        return false;
    for (uint32_t g = 0; g < pc->n_group; g++)
        if (!pc->window[g]) {
            dray_kv_block_unref(pc->kv, g, (uint32_t)e->gblock[g]);
            e->gblock[g] = -1;
            pc->st.blocks--;
        }
    e->host_g = buf;
    pc->st.host_bytes += pc->g_bytes;
    pc->st.spills++;
    return true;
}

static bool spill_ckpt(struct dray_pcache *pc, struct pc_entry *e)
{
    uint64_t bytes = ckpt_host_bytes(pc, e);
    if (!host_room(pc, bytes))
        return false;
    unsigned char *buf = malloc(bytes ? bytes : 1), *p = buf;
    if (!buf)
        return false;
    FOR_CKPT(pc, e, g, k, i) {
        if (dray_kv_block_download(pc->kv, g, (uint32_t)e->ckpt[i], p)) {
            free(buf);
            return false;
        }
        p += pc->wblock_bytes[g];
    }
    FOR_CKPT(pc, e, g, k, i)
        dray_kv_block_unref(pc->kv, g, (uint32_t)e->ckpt[i]);
    pc->st.blocks -= e->n_ckpt;
    free(e->ckpt);
    e->ckpt = NULL;
    e->host_ckpt = buf;
    pc->st.host_bytes += bytes;
    pc->st.spills++;
    return true;
}

/* Host -> device: fresh blocks (the path being attached is pinned, so the
 * reclaim these allocations may trigger leaves it alone), then upload. */
bool pc_restore_global(struct dray_pcache *pc, struct pc_entry *e)
{
    uint32_t got[DRAY_KV_MAX_GROUPS];
    const unsigned char *p = e->host_g;
    uint32_t g = 0;
    for (; g < pc->n_group; g++) {
        if (pc->window[g])
            continue;
        if (dray_kv_block_alloc(pc->kv, g, &got[g]))
            break;
        if (dray_kv_block_upload(pc->kv, g, got[g], p)) {
            dray_kv_block_unref(pc->kv, g, got[g]);
            break;
        }
        p += pc->wblock_bytes[g];
    }
    if (g < pc->n_group) {
        while (g-- > 0)
            if (!pc->window[g])
                dray_kv_block_unref(pc->kv, g, got[g]);
        return false;
    }
    for (g = 0; g < pc->n_group; g++)
        if (!pc->window[g]) {
            e->gblock[g] = (int32_t)got[g];
            pc->st.blocks++;
        }
    host_release(pc, &e->host_g, pc->g_bytes);
    pc->st.restores++;
    return true;
}

bool pc_restore_ckpt(struct dray_pcache *pc, struct pc_entry *e)
{
    int32_t *ck = malloc((e->n_ckpt ? e->n_ckpt : 1) * sizeof(int32_t));
    const unsigned char *p = e->host_ckpt;
    uint32_t done = 0;
    bool ok = ck != NULL;
    FOR_CKPT(pc, e, g, k, i) {
        uint32_t b;
        if (!ok || dray_kv_block_alloc(pc->kv, g, &b)) {
            ok = false;
            break;
        }
        ck[i] = (int32_t)b;
        done = i + 1;
        if (dray_kv_block_upload(pc->kv, g, b, p)) {
            ok = false;
            break;
        }
        p += pc->wblock_bytes[g];
    }
    if (!ok) {
        FOR_CKPT(pc, e, g, k, i)
            if (i < done)
                dray_kv_block_unref(pc->kv, g, (uint32_t)ck[i]);
        free(ck);
        return false;
    }
    e->ckpt = ck;
    pc->st.blocks += e->n_ckpt;
    host_release(pc, &e->host_ckpt, ckpt_host_bytes(pc, e));
    pc->st.restores++;
    return true;
}

/* Does e hold a device block in group g that only the cache uses? */
static bool sole_holder(struct dray_pcache *pc, struct pc_entry *e, uint32_t g)
{
    if (!pc->window[g])
        return !e->host_g && dray_kv_block_refs(pc->kv, g, (uint32_t)e->gblock[g]) == 1;
    if (!e->ckpt)
        return false;
    FOR_CKPT(pc, e, gg, k, i)
        if (gg == g && dray_kv_block_refs(pc->kv, g, (uint32_t)e->ckpt[i]) == 1)
            return true;
    return false;
}

/* The KV manager needs `need` more free blocks in group g. Oldest first, blocks
 * only the cache holds move to the host tier (checkpoints for a window group,
 * global blocks for a global group); what the host cannot take is dropped
 * (a global block only with its entry, and only from a leaf). */
void pc_reclaim(void *user, uint32_t g, uint32_t need)
{
    struct dray_pcache *pc = user;
    uint32_t want = dray_kv_group_free_blocks(pc->kv, g) + need;
    for (struct pc_entry *e = pc->oldest, *newer; e && dray_kv_group_free_blocks(pc->kv, g) < want;
         e = newer) {
        newer = e->newer;
        if (e->pinned || !sole_holder(pc, e, g))
            continue;
        if (pc->window[g]) {
            if (!spill_ckpt(pc, e)) {
                drop_ckpt(pc, e);
                pc->st.evictions++;
            }
        } else if (!spill_global(pc, e) && !e->n_children) {
            pc_drop_entry(pc, e);
            pc->st.evictions++;
        }
    }
}
