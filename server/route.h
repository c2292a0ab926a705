/* server/route.h — which replica serves a request. A conversation's key (the
 * X-Session-Id header, else the OpenAI `user` field, else the client's address)
 * is hashed with rendezvous (highest random weight) hashing over the replicas,
 * so every turn of a conversation lands on the replica that holds its cached
 * KV, and changing the number of replicas moves only the conversations whose
 * replica went away or that the new one wins (about 1/N of them). */
#ifndef DRAY_SERVER_ROUTE_H
#define DRAY_SERVER_ROUTE_H

#include <stddef.h>
#include <stdint.h>

/* The replica in 0..n-1 for key (len bytes; any bytes). n = 0 or 1: 0. */
uint32_t dray_srv_pick_replica(const char *key, size_t len, uint32_t n);

/* Where the key came from, for the log and the X-Dray-Route header. */
enum dray_srv_key_source { DRAY_SRV_KEY_SESSION, DRAY_SRV_KEY_USER, DRAY_SRV_KEY_ADDRESS };

/* Choose the key: session (the X-Session-Id header) when non-empty, else user
 * when non-empty, else address (the client's IP without its port: one
 * client's connections differ in port only). NULL arguments count as empty. */
enum dray_srv_key_source dray_srv_route_key(const char *session, const char *user,
                                            const char *address, const char **key);

#endif
