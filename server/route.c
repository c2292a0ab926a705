/* Rendezvous hashing: each replica scores hash(key, replica) and the highest
 * wins. Unlike `hash mod n` it keeps a conversation on its replica when
 * another replica is added or removed, and unlike a ring it needs no virtual
 * nodes to spread evenly. The hash is FNV-1a (64-bit) over the key, then the
 * replica index mixed in with SplitMix64's finaliser, which spreads keys that
 * differ in one byte over all 64 bits. Stable across runs and machines: no
 * seed, no pointer values. */
#include "route.h"

static uint64_t fnv1a(const char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint32_t dray_srv_pick_replica(const char *key, size_t len, uint32_t n)
{
    if (n <= 1)
        return 0;
    uint64_t h = fnv1a(key, len), best = 0;
    uint32_t pick = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t score = mix(h ^ mix(i));
        if (i == 0 || score > best) {
            best = score;
            pick = i;
        }
    }
    return pick;
}

enum dray_srv_key_source dray_srv_route_key(const char *session, const char *user,
                                            const char *address, const char **key)
{
    if (session && session[0]) {
        *key = session;
        return DRAY_SRV_KEY_SESSION;
    }
    if (user && user[0]) {
        *key = user;
        return DRAY_SRV_KEY_USER;
    }
    *key = address ? address : "";
    return DRAY_SRV_KEY_ADDRESS;
}
