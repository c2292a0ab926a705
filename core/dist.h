/* One model over several processes (config `distributed: mpi`, launched by
 * mpirun): rank 0 runs everything a single dray runs (server, tokenizer,
 * scheduler, prefix cache, KV block structure, the embedding and the head) and
 * each other rank holds a range of layers on its own plugin and device.
 *
 * To rank 0 another rank is one more stage of a split (core/split.h): its
 * device is a proxy whose memory ops (the KV's pools and step metadata, copy
 * on write, host-tier spills) run on the rank, and its stage task sends the
 * micro-batch's hidden states, positions and KV views there and gets the next
 * hidden states back. So batching, micro-batch pipelining, the prefix cache and
 * the host tier work across ranks as across devices. The other ranks run
 * dray_dist_worker until rank 0 says goodbye.
 *
 * The messages go over a transport module (dray/dist.h, transports/mpi), loaded
 * only when asked for: a plain dray needs no MPI at run time. */
#ifndef DRAY_CORE_DIST_H
#define DRAY_CORE_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dray/dist.h"
#include "dray/dray.h"
#include "dray/plugins.h"
#include "kv.h"
#include "model.h"

/* The process's transport: opened once (the module named by cfg->distributed,
 * found on $DRAY_TRANSPORT_PATH, then beside the plugins) and kept until exit. */
int dray_dist_open(const struct dray_config *cfg, struct dray_dist **out, char *err, size_t errlen);
/* Use t as the process's transport (tests: an in-process one). */
void dray_dist_use(struct dray_dist *t);
/* The open transport, or NULL. */
struct dray_dist *dray_dist_get(void);
/* Rank 0: tell rank r it is done (once; it leaves dray_dist_worker). */
void dray_dist_bye(struct dray_dist *t, uint32_t r);
/* Rank 0: rank r stopped answering (dead, or cut off): it is not said goodbye
 * to, and the job is left without the runtime's finalize, which would wait for it. */
void dray_dist_lost(uint32_t r);
/* Rank 0: say goodbye to every rank not yet told, then leave the job
 * (MPI_Finalize waits for every rank). At exit, whatever failed before. */
void dray_dist_close(void);

/* ---------------------------------------------------------------- rank 0 */

struct dray_remote;

/* Greet rank `rank`: *dev becomes its proxy device (plugin named "<plugin>@rank<r>",
 * the rank's device properties and caps, ops that run there). */
int dray_remote_open(struct dray_dist *t, uint32_t rank, struct dray_remote **out, struct dray_device *dev,
                     char *err, size_t errlen);
/* Longest wait for the rank's answer, seconds (0: for ever); past it the call
 * fails naming the rank (config distributed_timeout). */
void dray_remote_set_timeout(struct dray_remote *r, uint32_t seconds);
/* Whether the rank stopped answering (a failed or timed-out message); why into why. */
bool dray_remote_lost(struct dray_remote *r, char *why, size_t whylen);
/* Tell the rank it is done (it leaves dray_dist_worker) and free r. */
void dray_remote_close(struct dray_remote *r);

/* Load layers [mo->layer_begin, mo->layer_end) of the model file at path on the
 * rank (the same file must be there); the weights' bytes and parameters it holds. */
int dray_remote_load(struct dray_remote *r, const char *path, const struct dray_model_opts *mo,
                     uint64_t *weight_bytes, uint64_t *step_weight_bytes, uint64_t *n_params, char *err,
                     size_t errlen);
/* Drop the loaded part (before a load with other options). */
void dray_remote_unload(struct dray_remote *r);

/* Run b->part's layers for micro-batch mb of kv's current step on the rank:
 * b->part->x_in in, b->part->x_out out (n_embd floats per token); *compute_s:
 * the rank's time in the forward pass (the rest of the call is the wire's). */
int dray_remote_forward(struct dray_remote *r, const struct dray_kv *kv, uint32_t n_embd,
                        const struct dray_batch *b, double *compute_s, char *err, size_t errlen);

/* Tensor parallel: start b->part's layers on the rank (its slice of them) from
 * b->part->x_in, their KV views being kv's layers il + kv_offset, and return
 * once sent; dray_remote_forward_wait then takes the rank's answer (no hidden
 * states come back: every rank ends with the same ones). Between the two, the
 * rank is held for this call: run this process's slice meanwhile, since the
 * ranks meet in the all-reduces of every layer. */
int dray_remote_forward_send(struct dray_remote *r, const struct dray_kv *kv, uint32_t kv_offset,
                             uint32_t n_embd, const struct dray_batch *b, char *err, size_t errlen);
int dray_remote_forward_wait(struct dray_remote *r, double *compute_s, char *err, size_t errlen);

/* The calibration steps (dray_model_calib_begin/end/scores) on the rank's part;
 * scores: *n floats, malloc'd. */
int dray_remote_calib_begin(struct dray_remote *r, uint32_t n, uint32_t n_outlier, bool smooth_k, char *err,
                            size_t errlen);
int dray_remote_calib_end(struct dray_remote *r, bool ok, char *err, size_t errlen);
int dray_remote_calib_scores(struct dray_remote *r, float **scores, size_t *n, char *err, size_t errlen);

/* ------------------------------------------------------------ other ranks */

/* Open this rank's device (cfg's backend and device) and answer rank 0 until it
 * says goodbye. Returns 0 then, or the error that ended it. */
int dray_dist_worker(struct dray_dist *t, const struct dray_config *cfg, char *err, size_t errlen);

#endif
