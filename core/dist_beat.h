/* A rank's heartbeat (core/dist.h): while it works on a request it tells rank
 * 0 every DIST_BEAT_S that it is alive, so rank 0's distributed_timeout bounds
 * the silence of a dead rank, not the length of a step. */
#ifndef DRAY_CORE_DIST_BEAT_H
#define DRAY_CORE_DIST_BEAT_H

#include "dray/dist.h"

struct dist_beat;

/* Start the beat thread (idle); sends give up after timeout_s (distributed_timeout),
 * and beats come at least 4 times within it. */
int dist_beat_start(struct dray_dist *t, double timeout_s, struct dist_beat **out);
/* A request came: beat until dist_beat_idle. */
void dist_beat_busy(struct dist_beat *b);
/* Stop beating; returns after any beat in flight was sent, so every beat
 * reaches rank 0 before the answer that follows. */
void dist_beat_idle(struct dist_beat *b);
void dist_beat_stop(struct dist_beat *b);

#endif
