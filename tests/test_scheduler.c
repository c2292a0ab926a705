/* The scheduler (dray.h): many requests over one engine, continuously batched,
 * on tiny random-weight Gemma models through the CPU plugin. The specification
 * these tests pin down: a request's greedy tokens do not depend on what else runs
 * beside it, on chunked prefill, or on being preempted; cancelled and finished
 * requests give every KV block back; bad requests are refused with a reason. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "dray/dray.h"
#include "testutil.h"
#include "tiny_gemma.h"

#define N_REQ 6

struct opts {
    uint32_t max_seqs, chunk;
    uint64_t kv_budget;
    uint64_t host_cache;  /* 0: the default (1 GiB) */
    bool no_host, no_cache;
    const char *kv_dtype; /* NULL: the default (int8) */
    const char *chat_template; /* NULL: the model's (gemma); "chatml" also puts ChatML's
                                * markers in the tiny vocabulary */
};

static struct dray_engine *open_with(const struct opts *o)
{
    static int n_model;
    char name[64], err[1024];
    struct tiny_gemma t;
    tiny_gemma_defaults(&t);
    t.chatml = o->chat_template && !strcmp(o->chat_template, "chatml");
    snprintf(name, sizeof(name), "tiny_sched_%d.gguf", n_model++);
    const char *path = dray_test_path(name);
    assert_int_equal(tiny_gemma_write(&t, path), 0);
    struct dray_config c;
    dray_config_defaults(&c);
    snprintf(c.model, sizeof(c.model), "%s", path);
    snprintf(c.backend, sizeof(c.backend), "cpu");
    c.context = 96;
    c.max_seqs = o->max_seqs;
    c.chunk = o->chunk;
    c.kv_block = 4;
    c.threads = 2;
    c.kv_budget = o->kv_budget;
    c.prefix_cache = !o->no_cache;
    if (o->host_cache || o->no_host)
        c.host_cache = o->host_cache;
    if (o->kv_dtype)
        assert_int_equal(dray_config_set(&c, "kv_dtype", o->kv_dtype, err, sizeof(err)), 0);
    if (o->chat_template)
        assert_int_equal(dray_config_set(&c, "chat_template", o->chat_template, err, sizeof(err)), 0);
    struct dray_engine *e = NULL;
    if (dray_engine_open(&c, &e, err, sizeof(err)))
        fail_msg("engine: %s", err);
    return e;
}

static struct dray_engine *open_tiny(uint32_t max_seqs, uint32_t chunk, uint64_t kv_budget)
{
    struct opts o = {.max_seqs = max_seqs, .chunk = chunk, .kv_budget = kv_budget};
    return open_with(&o);
}

/* Request k: a prompt of its own length and content. */
static size_t prompt_for(int k, int32_t *ids)
{
    size_t n = 5 + (size_t)k * 7;
    ids[0] = 2; /* <bos> */
    for (size_t i = 1; i < n; i++)
        ids[i] = (int32_t)(6 + (i * 31 + (size_t)k * 57) % (TINY_GEMMA_VOCAB - 6));
    return n;
}

struct collected {
    int32_t ids[128];
    size_t n;
};

static int collect(void *user, const char *text, size_t len, int32_t id)
{
    (void)text;
    (void)len;
    struct collected *c = user;
    if (id >= 0 && c->n < 128)
        c->ids[c->n++] = id;
    return 0;
}

static void greedy(struct dray_gen_params *g, uint32_t max_tokens)
{
    memset(g, 0, sizeof(*g));
    g->repeat_penalty = 1;
    g->top_p = 1;
    g->max_tokens = max_tokens;
}

/* The same request run alone through a session: the tokens to expect. */
static void run_alone(struct dray_engine *e, const int32_t *ids, size_t n, uint32_t max_tokens,
                      struct collected *out)
{
    char err[512];
    struct dray_session *s;
    struct dray_gen_params g;
    struct dray_gen_stats st;
    greedy(&g, max_tokens);
    out->n = 0;
    assert_int_equal(dray_session_new(e, &s, err, sizeof(err)), 0);
    if (dray_session_generate(s, ids, n, &g, collect, out, &st, err, sizeof(err)))
        fail_msg("generate: %s", err);
    dray_session_free(s);
}

/* Poll r to the end; returns the final output (ids gathered into got). */
static struct dray_request_output drain_request(struct dray_request *r, struct collected *got)
{
    struct dray_request_output o;
    got->n = 0;
    do {
        assert_int_equal(dray_request_poll(r, &o, -1), 1);
        for (size_t i = 0; i < o.n_ids && got->n < 128; i++)
            got->ids[got->n++] = o.ids[i];
    } while (!o.done);
    return o;
}

static void submit_all(struct dray_sched *s, struct dray_request **r, uint32_t max_tokens)
{
    char err[512];
    for (int k = 0; k < N_REQ; k++) {
        int32_t ids[64];
        struct dray_request_params p = {.ids = ids, .n_ids = prompt_for(k, ids)};
        greedy(&p.gen, max_tokens);
        if (dray_sched_submit(s, &p, &r[k], err, sizeof(err)))
            fail_msg("submit %d: %s", k, err);
    }
}

/* Solo runs first (sessions and a scheduler never share the engine at once). */
static void solo_runs(struct dray_engine *e, uint32_t max_tokens, struct collected *alone)
{
    for (int k = 0; k < N_REQ; k++) {
        int32_t ids[64];
        size_t n = prompt_for(k, ids);
        run_alone(e, ids, n, max_tokens, &alone[k]);
    }
}

static void expect_same_as_alone(struct dray_request **r, const struct collected *alone,
                                 uint32_t max_tokens)
{
    struct collected got;
    for (int k = 0; k < N_REQ; k++) {
        int32_t ids[64];
        struct dray_request_output o = drain_request(r[k], &got);
        assert_int_equal(o.rc, 0);
        assert_string_equal(o.finish_reason, "length");
        assert_int_equal(o.n_generated, max_tokens);
        assert_int_equal(o.n_prompt, prompt_for(k, ids));
        assert_true(o.ttft_s > 0 && o.total_s >= o.ttft_s);
        assert_int_equal(got.n, alone[k].n);
        assert_memory_equal(got.ids, alone[k].ids, got.n * sizeof(int32_t));
        dray_request_free(r[k]);
    }
}

/* A finished request's last sampled token is fed into the KV after its response
 * (then the sequence goes into the prefix cache): wait for that, up to 20 s. */
static void wait_finishers(struct dray_sched *s, struct dray_sched_stats *st)
{
    for (int i = 0; i < 20000; i++) {
        dray_sched_get_stats(s, st);
        if (!st->finishing)
            return;
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
    fail_msg("the scheduler still feeds %u finished requests after 20 s", st->finishing);
}

/* Idle: nothing runs, and every block still in use is one the prefix cache keeps
 * (a window block may sit in two checkpoints, so blocks <= references). */
static void expect_idle(struct dray_sched *s, uint64_t done)
{
    struct dray_sched_stats st;
    wait_finishers(s, &st);
    assert_int_equal(st.requests_done, done);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, 0);
    assert_true(st.kv_blocks_used <= st.cache_blocks);
    assert_true(st.kv_blocks_used > 0 || st.cache_blocks == 0);
}

/* Six requests of different lengths over four sequence slots and 16-token steps:
 * prefill chunks interleave with other sequences' decoding, and the last two wait
 * for a free slot. Each still gets exactly the tokens it gets alone, the decode
 * steps are shared, and every block comes back. */
static void test_batched_requests_match_running_alone(void **state)
{
    (void)state;
    struct dray_engine *e = open_tiny(4, 16, 0);
    char err[512];
    struct dray_sched *s;
    struct dray_request *r[N_REQ];
    struct collected alone[N_REQ];
    solo_runs(e, 20, alone);
    assert_int_equal(dray_sched_create(e, 0, &s, err, sizeof(err)), 0);
    submit_all(s, r, 20);
    expect_same_as_alone(r, alone, 20);
    struct dray_sched_stats st;
    dray_sched_get_stats(s, &st);
    assert_true(st.steps < (uint64_t)N_REQ * 20);
    assert_int_equal(st.completion_tokens, N_REQ * 20);
    expect_idle(s, N_REQ);
    dray_sched_destroy(s);
    dray_engine_close(e);
}

/* A burst admits max_seqs running plus max_waiting waiting, exactly, however far
 * the loop has got with moving the first ones to running; the rest get EBUSY
 * with a reason. */
static void test_a_burst_admits_exactly_the_running_and_waiting_slots(void **state)
{
    (void)state;
    struct dray_engine *e = open_tiny(2, 16, 0);
    char err[512];
    struct dray_sched *s;
    assert_int_equal(dray_sched_create(e, 3, &s, err, sizeof(err)), 0);
    struct dray_request *r[12] = {0};
    int admitted = 0, busy = 0;
    for (int k = 0; k < 12; k++) {
        int32_t ids[64];
        struct dray_request_params p = {.ids = ids, .n_ids = prompt_for(k % N_REQ, ids)};
        greedy(&p.gen, 200);
        p.gen.ignore_eos = true; /* none finishes during the burst */
        int rc = dray_sched_submit(s, &p, &r[k], err, sizeof(err));
        if (rc == 0)
            admitted++;
        else if (rc == DRAY_EBUSY && strstr(err, "try again later"))
            busy++;
        else
            fail_msg("submit %d: %d %s", k, rc, err);
    }
    assert_int_equal(admitted, 2 + 3);
    assert_int_equal(busy, 12 - 5);
    for (int k = 0; k < 12; k++)
        if (r[k]) {
            dray_request_cancel(r[k]);
            dray_request_free(r[k]);
        }
    dray_sched_destroy(s);
    dray_engine_close(e);
}

/* A KV pool far too small for six growing sequences: the newest is preempted
 * (blocks freed, recomputed later) and every request still completes with the
 * tokens it gets alone. */
static void test_preempted_requests_complete_with_the_same_tokens(void **state)
{
    (void)state;
    struct dray_engine *probe = open_tiny(4, 16, 0);
    const struct dray_engine_info *in = dray_engine_get_info(probe);
    /* room for the window layers of 4 sequences and ~1.3 contexts of global KV */
    uint64_t budget = 4 * in->kv_bytes_per_seq_fixed + in->kv_bytes_per_token * 128;
    dray_engine_close(probe);
    struct dray_engine *e = open_tiny(4, 16, budget);
    char err[512];
    struct dray_sched *s;
    struct dray_request *r[N_REQ];
    struct collected alone[N_REQ];
    solo_runs(e, 40, alone);
    assert_int_equal(dray_sched_create(e, 0, &s, err, sizeof(err)), 0);
    submit_all(s, r, 40);
    expect_same_as_alone(r, alone, 40);
    struct dray_sched_stats st;
    dray_sched_get_stats(s, &st);
    assert_true(st.preemptions > 0);
    expect_idle(s, N_REQ);
    /* each fed its last token once, when it finished; a preemption feeds nothing */
    wait_finishers(s, &st);
    assert_int_equal(st.cache_fed_tokens, N_REQ);
    dray_sched_destroy(s);
    dray_engine_close(e);
}

/* A cancelled request ends with "cancelled" and gives its blocks back; the
 * others are not disturbed. A request freed while running is cancelled too. */
static void test_cancel_frees_the_request_blocks(void **state)
{
    (void)state;
    struct dray_engine *e = open_tiny(4, 16, 0);
    char err[512];
    struct dray_sched *s;
    struct dray_request *r[N_REQ];
    assert_int_equal(dray_sched_create(e, 0, &s, err, sizeof(err)), 0);
    submit_all(s, r, 80);
    dray_request_cancel(r[0]);
    dray_request_free(r[1]);
    struct collected got;
    struct dray_request_output o = drain_request(r[0], &got);
    assert_string_equal(o.finish_reason, "cancelled");
    assert_int_equal(o.rc, DRAY_ECANCELED);
    dray_request_free(r[0]);
    for (int k = 2; k < N_REQ; k++) {
        o = drain_request(r[k], &got);
        assert_int_equal(o.rc, 0);
        dray_request_free(r[k]);
    }
    struct dray_sched_stats st;
    wait_finishers(s, &st);
    assert_int_equal(st.requests_cancelled, 2);
    assert_true(st.kv_blocks_used <= st.cache_blocks);
    dray_sched_destroy(s);
    dray_engine_close(e);
}

/* Stop strings end a request with "stop" and are not part of its text. */
static void test_stop_string_ends_the_request(void **state)
{
    (void)state;
    struct dray_engine *e = open_tiny(4, 16, 0);
    char err[512];
    int32_t ids[64];
    size_t n = prompt_for(2, ids);
    /* find what the model says, then stop at a piece of it */
    struct dray_sched *s;
    struct dray_request *r;
    struct dray_request_params p = {.ids = ids, .n_ids = n};
    greedy(&p.gen, 30);
    assert_int_equal(dray_sched_create(e, 0, &s, err, sizeof(err)), 0);
    assert_int_equal(dray_sched_submit(s, &p, &r, err, sizeof(err)), 0);
    char full[4096] = "";
    struct dray_request_output o;
    do {
        assert_int_equal(dray_request_poll(r, &o, -1), 1);
        strncat(full, o.text, sizeof(full) - strlen(full) - 1);
    } while (!o.done);
    dray_request_free(r);
    size_t len = strlen(full);
    if (len < 4)
        skip(); /* the tiny model said too little to cut */
    char stop[3] = {full[len / 2], full[len / 2 + 1], 0};
    const char *stops[1] = {stop};
    p.gen.stop = stops;
    p.gen.n_stop = 1;
    assert_int_equal(dray_sched_submit(s, &p, &r, err, sizeof(err)), 0);
    char cut[4096] = "";
    do {
        assert_int_equal(dray_request_poll(r, &o, -1), 1);
        strncat(cut, o.text, sizeof(cut) - strlen(cut) - 1);
    } while (!o.done);
    assert_string_equal(o.finish_reason, "stop");
    assert_null(strstr(cut, stop));
    assert_memory_equal(cut, full, strlen(cut));
    assert_true(strlen(cut) <= len / 2);
    dray_request_free(r);
    dray_sched_destroy(s);
    dray_engine_close(e);
}

/* Bad requests are refused at submit with a reason; a draining scheduler takes
 * no new work; destroying a busy scheduler ends its requests as cancelled. */
static void test_bad_requests_and_shutdown(void **state)
{
    (void)state;
    struct dray_engine *e = open_tiny(2, 16, 0);
    char err[512];
    struct dray_sched *s;
    struct dray_request *r = NULL, *busy[2];
    int32_t ids[128] = {2};
    struct dray_request_params p = {.ids = ids, .n_ids = 0};
    greedy(&p.gen, 8);
    assert_int_equal(dray_sched_create(e, 0, &s, err, sizeof(err)), 0);
    assert_int_equal(dray_sched_submit(s, &p, &r, err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "empty"));
    p.n_ids = 96; /* the whole context: no room for a reply */
    for (int i = 1; i < 96; i++)
        ids[i] = 7;
    assert_int_equal(dray_sched_submit(s, &p, &r, err, sizeof(err)), DRAY_ERANGE);
    assert_non_null(strstr(err, "context"));
    p.n_ids = 3;
    ids[1] = TINY_GEMMA_VOCAB;
    assert_int_equal(dray_sched_submit(s, &p, &r, err, sizeof(err)), DRAY_EINVAL);
    assert_non_null(strstr(err, "vocabulary"));
    ids[1] = 7;
    p.gen.temperature = -1;
    assert_int_equal(dray_sched_submit(s, &p, &r, err, sizeof(err)), DRAY_EINVAL);
    p.gen.temperature = 0;
    p.gen.max_tokens = 0; /* until the context is full */
    assert_int_equal(dray_sched_submit(s, &p, &busy[0], err, sizeof(err)), 0);
    assert_int_equal(dray_sched_submit(s, &p, &busy[1], err, sizeof(err)), 0);
    dray_sched_drain(s);
    assert_int_equal(dray_sched_submit(s, &p, &r, err, sizeof(err)), DRAY_ECANCELED);
    dray_sched_destroy(s);
    for (int k = 0; k < 2; k++) {
        struct collected got;
        struct dray_request_output o = drain_request(busy[k], &got);
        assert_true(o.done);
        /* either it filled the context before the shutdown, or it was cancelled */
        assert_true(!strcmp(o.finish_reason, "cancelled") || !strcmp(o.finish_reason, "length"));
        dray_request_free(busy[k]);
    }
    dray_engine_close(e);
}

/* ----------------------------------------------------------- prefix cache */

/* Run one request through s to the end; its tokens go to got. */
static struct dray_request_output run_one(struct dray_sched *s, const int32_t *ids, size_t n,
                                          uint32_t max_tokens, const char *salt,
                                          struct collected *got)
{
    char err[512];
    struct dray_request *r;
    struct dray_request_params p = {.ids = ids, .n_ids = n, .cache_salt = salt};
    greedy(&p.gen, max_tokens);
    if (dray_sched_submit(s, &p, &r, err, sizeof(err)))
        fail_msg("submit: %s", err);
    struct dray_request_output o = drain_request(r, got);
    assert_int_equal(o.rc, 0);
    dray_request_free(r);
    return o;
}

/* Turn 2 of a chat: turn 1's prompt, its reply, and a new message. The window
 * (8 tokens) has slid far past turn 1's start, so a hit must restore the window
 * layers' blocks from the checkpoint at turn 1's end. */
static size_t second_turn(const int32_t *t1, size_t n1, const struct collected *reply, int32_t *t2)
{
    memcpy(t2, t1, n1 * sizeof(int32_t));
    memcpy(t2 + n1, reply->ids, reply->n * sizeof(int32_t));
    size_t n = n1 + reply->n;
    for (int i = 0; i < 9; i++)
        t2[n++] = (int32_t)(40 + i * 13);
    return n;
}

static void cache_hit_equals_cold(const char *kv_dtype)
{
    struct opts o = {.max_seqs = 4, .chunk = 16, .kv_dtype = kv_dtype};
    struct dray_engine *e = open_with(&o);
    char err[512];
    int32_t t1[64], t2[128];
    size_t n1 = prompt_for(3, t1);
    struct collected reply, cold, warm;
    run_alone(e, t1, n1, 20, &reply);
    size_t n2 = second_turn(t1, n1, &reply, t2);
    run_alone(e, t2, n2, 16, &cold);

    struct dray_sched *s;
    assert_int_equal(dray_sched_create(e, 0, &s, err, sizeof(err)), 0);
    struct dray_request_output a = run_one(s, t1, n1, 20, NULL, &warm);
    assert_int_equal(a.n_cached, 0);
    assert_int_equal(warm.n, reply.n);
    assert_memory_equal(warm.ids, reply.ids, reply.n * sizeof(int32_t));
    struct dray_request_output b = run_one(s, t2, n2, 16, NULL, &warm);
    /* all of turn 1 comes from the cache, its partial last block included, and
     * the reply's last token too: sampled on max_tokens, it was fed into the KV
     * after turn 1's response */
    assert_string_equal(a.finish_reason, "length");
    size_t in_kv = n1 + reply.n;
    assert_int_not_equal(in_kv % 4, 0);
    assert_int_equal(b.n_cached, in_kv);
    assert_int_equal(warm.n, cold.n);
    assert_memory_equal(warm.ids, cold.ids, cold.n * sizeof(int32_t));
    struct dray_sched_stats st;
    wait_finishers(s, &st);
    assert_int_equal(st.prompt_tokens_cached, b.n_cached);
    assert_int_equal(st.cache_fed_tokens, 2);
    assert_true(st.cache_checkpoints >= 2);
    dray_sched_destroy(s);
    dray_engine_close(e);
}

/* The partial last block of a cached prefix is shared with the requests that
 * extend it, and each gets its own copy before writing (copy on write). Turn 1
 * ends inside a block; request Z diverges inside that block and reuses turn 1 up
 * to the divergence, then writes its own tokens where turn 1's last ones are.
 * Turn 2 afterwards still gets all of turn 1 from the cache and the cold run's
 * tokens: Z's writes went to Z's copy. Twice, so the second turn 2 reads the
 * block after a request that had it attached as well. */
static void partial_block_copy_on_write(const char *kv_dtype)
{
    struct opts o = {.max_seqs = 4, .chunk = 16, .kv_dtype = kv_dtype};
    struct dray_engine *e = open_with(&o);
    char err[512];
    int32_t t1[64], t2[128], z[128];
    size_t n1 = prompt_for(3, t1);
    struct collected reply, cold2, coldz, got;
    run_alone(e, t1, n1, 21, &reply);
    size_t n2 = second_turn(t1, n1, &reply, t2);
    size_t in_kv = n1 + reply.n - 1;
    assert_true(in_kv % 4 >= 2); /* a divergence point inside turn 1's last block */
    size_t nz = in_kv - 1;
    memcpy(z, t2, nz * sizeof(int32_t));
    for (int i = 0; i < 7; i++)
        z[nz++] = (int32_t)(77 + i * 5);
    assert_int_not_equal(z[in_kv - 1], t2[in_kv - 1]);
    run_alone(e, t2, n2, 16, &cold2);
    run_alone(e, z, nz, 16, &coldz);

    struct dray_sched *s;
    assert_int_equal(dray_sched_create(e, 0, &s, err, sizeof(err)), 0);
    run_one(s, t1, n1, 21, NULL, &got);
    for (int round = 0; round < 2; round++) {
        struct dray_request_output a = run_one(s, z, nz, 16, NULL, &got);
        if (round == 0)
            assert_int_equal(a.n_cached, in_kv - 1); /* up to the divergence */
        assert_int_equal(got.n, coldz.n);
        assert_memory_equal(got.ids, coldz.ids, coldz.n * sizeof(int32_t));
        run_one(s, t2, n2 - 5, 16, NULL, &got);
        /* the full turn 2: turn 1's tail block was not touched by Z or by the
         * shorter request that extended it */
        struct dray_request_output c = run_one(s, t2, n2, 16, NULL, &got);
        assert_true(c.n_cached >= in_kv);
        assert_int_equal(got.n, cold2.n);
        assert_memory_equal(got.ids, cold2.ids, cold2.n * sizeof(int32_t));
    }
    dray_sched_destroy(s);
    dray_engine_close(e);
}

static void test_cache_partial_block_copy_on_write_int8_kv(void **state)
{
    (void)state;
    partial_block_copy_on_write("int8");
}

static void test_cache_partial_block_copy_on_write_f16_kv(void **state)
{
    (void)state;
    partial_block_copy_on_write("f16");
}

static void test_cache_hit_gives_the_cold_tokens_int8_kv(void **state)
{
    (void)state;
    cache_hit_equals_cold("int8");
}

static void test_cache_hit_gives_the_cold_tokens_f16_kv(void **state)
{
    (void)state;
    cache_hit_equals_cold("f16");
}

/* Tokens of text (no <bos>), appended to v at *n. */
static void add_text(struct dray_engine *e, const char *text, int32_t *v, size_t *n)
{
    char err[512];
    int32_t *ids;
    size_t k;
    if (dray_engine_tokenize(e, text, false, false, &ids, &k, err, sizeof(err)))
        fail_msg("tokenize: %s", err);
    memcpy(v + *n, ids, k * sizeof(int32_t));
    *n += k;
    free(ids);
}

/* A chat's next turn, rendered as the server renders it (the whole conversation
 * again, the reply included), finds in the cache everything before the new user
 * message's text: turn 1's prompt, the reply, and what the template writes
 * between the reply and the message (the turn end, "\n", the next turn's start,
 * "user\n"), which the scheduler feeds after turn 1's response. A request that
 * continues the reply some other way still hits up to the reply's end, its last
 * token included: the window layers' blocks come from the checkpoints before
 * and after the fed tokens. Both hits give the cold run's tokens. */
static void chat_next_turn_is_cached(const char *tmpl, int32_t start, int32_t end)
{
    struct opts o = {.max_seqs = 4, .chunk = 16, .chat_template = tmpl};
    struct dray_engine *e = open_with(&o);
    char err[512];
    struct dray_chat_message conv[3] = {{"user", "hello world"}, {"assistant", "hello"},
                                        {"user", "the end"}};
    int32_t *t1, *full2, t2[128], z[128], head[16];
    size_t n1, n_full2, n2 = 0, nz = 0, n_head = 0;
    assert_int_equal(dray_engine_chat_tokenize(e, conv, 1, true, &t1, &n1, err, sizeof(err)), 0);
    assert_int_equal(dray_engine_chat_tokenize(e, conv, 3, true, &full2, &n_full2, err, sizeof(err)), 0);
    struct collected reply, cold2, coldz, got;
    run_alone(e, t1, n1, 10, &reply);
    assert_int_equal(reply.n, 10); /* cut by max_tokens */

    /* turn 2: the full render with the reply's own tokens where "hello" is (a
     * reply the server sends back renders to them again) */
    assert_memory_equal(full2, t1, n1 * sizeof(int32_t));
    size_t at = n1;
    while (full2[at] != end)
        at++;
    memcpy(t2, t1, n1 * sizeof(int32_t));
    memcpy(t2 + n1, reply.ids, reply.n * sizeof(int32_t));
    n2 = n1 + reply.n;
    memcpy(t2 + n2, full2 + at, (n_full2 - at) * sizeof(int32_t));
    n2 += n_full2 - at;
    head[n_head++] = end;
    add_text(e, "\n", head, &n_head);
    head[n_head++] = start;
    add_text(e, "user\n", head, &n_head);
    assert_memory_equal(t2 + n1 + reply.n, head, n_head * sizeof(int32_t));
    /* z: the reply continued as plain text */
    memcpy(z, t2, (n1 + reply.n) * sizeof(int32_t));
    nz = n1 + reply.n;
    for (int i = 0; i < 6; i++)
        z[nz++] = (int32_t)(40 + i * 13);
    run_alone(e, t2, n2, 8, &cold2);
    run_alone(e, z, nz, 8, &coldz);

    struct dray_sched *s;
    assert_int_equal(dray_sched_create(e, 0, &s, err, sizeof(err)), 0);
    char why[512];
    struct dray_request *r;
    struct dray_request_params p = {.ids = t1, .n_ids = n1, .chat = true};
    greedy(&p.gen, 10);
    if (dray_sched_submit(s, &p, &r, why, sizeof(why)))
        fail_msg("submit: %s", why);
    struct dray_request_output a = drain_request(r, &got);
    dray_request_free(r);
    assert_string_equal(a.finish_reason, "length");
    assert_memory_equal(got.ids, reply.ids, reply.n * sizeof(int32_t));
    struct dray_sched_stats st;
    wait_finishers(s, &st);
    /* the reply's last token, then the turn end and the next user header */
    assert_int_equal(st.cache_fed_tokens, 1 + n_head);

    struct dray_request_output b = run_one(s, z, nz, 8, NULL, &got);
    assert_int_equal(b.n_cached, n1 + reply.n);
    assert_int_equal(got.n, coldz.n);
    assert_memory_equal(got.ids, coldz.ids, coldz.n * sizeof(int32_t));

    p = (struct dray_request_params){.ids = t2, .n_ids = n2, .chat = true};
    greedy(&p.gen, 8);
    if (dray_sched_submit(s, &p, &r, why, sizeof(why)))
        fail_msg("submit: %s", why);
    struct dray_request_output c = drain_request(r, &got);
    dray_request_free(r);
    assert_int_equal(c.n_cached, n1 + reply.n + n_head);
    assert_int_equal(got.n, cold2.n);
    assert_memory_equal(got.ids, cold2.ids, cold2.n * sizeof(int32_t));
    wait_finishers(s, &st);
    assert_int_equal(st.cache_fed_tokens, 2 * (1 + n_head) + 1);
    free(t1);
    free(full2);
    dray_sched_destroy(s);
    dray_engine_close(e);
}

static void test_chat_next_turn_is_cached_gemma(void **state)
{
    (void)state;
    chat_next_turn_is_cached(NULL, 4, 5); /* <start_of_turn>, <end_of_turn> */
}

static void test_chat_next_turn_is_cached_chatml(void **state)
{
    (void)state;
    chat_next_turn_is_cached("chatml", 298, 299); /* <|im_start|>, <|im_end|> */
}

/* A request that diverges inside a cached prefix, in a block where no
 * checkpoint ends, reuses everything before the divergence: the window layers'
 * blocks there come from the checkpoints before and after it. Three short
 * turns (a 12-token prompt, then 5 new tokens per turn, 2-token replies) leave
 * checkpoints at 14, 21 and 28, closer than the window of 8 but more than a
 * block of 4 apart. Q edits turn 2's message after its 18th token, Q2 turn 3's
 * after its 25th. No single checkpoint serves 18 or 25 (14 and 21 would be the
 * hits), yet both reuse all they share with the cache, so only their own new
 * tokens are computed, and both give the cold run's tokens. With pressure, a
 * KV pool of 128 tokens and six longer requests in between push the
 * checkpoints to the host tier first: they come back for the hit. */
static void divergence_between_checkpoints(bool pressure)
{
    uint64_t budget = 0;
    if (pressure) {
        struct dray_engine *probe = open_tiny(4, 16, 0);
        const struct dray_engine_info *in = dray_engine_get_info(probe);
        budget = 4 * in->kv_bytes_per_seq_fixed + in->kv_bytes_per_token * 128;
        dray_engine_close(probe);
    }
    struct opts o = {.max_seqs = 4, .chunk = 16, .kv_budget = budget};
    struct dray_engine *e = open_with(&o);
    char err[512];
    int32_t t[3][64], q[2][64];
    size_t nt[3], nq[2], at[2] = {18, 25};
    struct collected reply[3], cold[2], got;
    nt[0] = prompt_for(1, t[0]);
    assert_int_equal(nt[0], 12);
    run_alone(e, t[0], nt[0], 2, &reply[0]);
    for (int i = 1; i < 3; i++) {
        memcpy(t[i], t[i - 1], nt[i - 1] * sizeof(int32_t));
        memcpy(t[i] + nt[i - 1], reply[i - 1].ids, 2 * sizeof(int32_t));
        nt[i] = nt[i - 1] + 2;
        for (int j = 0; j < 5; j++)
            t[i][nt[i]++] = (int32_t)(50 + i * 20 + j * 7);
        run_alone(e, t[i], nt[i], 2, &reply[i]);
    }
    assert_int_equal(nt[2], 26);
    for (int k = 0; k < 2; k++) {
        memcpy(q[k], t[k + 1], at[k] * sizeof(int32_t));
        nq[k] = at[k];
        for (int j = 0; j < 5; j++)
            q[k][nq[k]++] = (int32_t)(120 + k * 10 + j * 3);
        assert_int_not_equal(q[k][at[k]], t[k + 1][at[k]]);
        run_alone(e, q[k], nq[k], 8, &cold[k]);
    }

    struct dray_sched *s;
    assert_int_equal(dray_sched_create(e, 0, &s, err, sizeof(err)), 0);
    struct dray_sched_stats st;
    for (int i = 0; i < 3; i++) {
        struct dray_request_output a = run_one(s, t[i], nt[i], 2, NULL, &got);
        assert_memory_equal(got.ids, reply[i].ids, 2 * sizeof(int32_t));
        assert_int_equal(a.n_cached, i ? nt[i - 1] + 2 : 0);
        wait_finishers(s, &st);
    }
    if (pressure) {
        struct dray_request *r[N_REQ];
        submit_all(s, r, 40);
        for (int k = 0; k < N_REQ; k++) {
            drain_request(r[k], &got);
            dray_request_free(r[k]);
        }
        wait_finishers(s, &st);
        assert_true(st.cache_spills > 0);
    }
    uint64_t assembled = st.cache_assembled;
    for (int k = 0; k < 2; k++) {
        struct dray_request_output a = run_one(s, q[k], nq[k], 8, NULL, &got);
        assert_int_equal(a.n_cached, at[k]);
        assert_int_equal(got.n, cold[k].n);
        assert_memory_equal(got.ids, cold[k].ids, cold[k].n * sizeof(int32_t));
    }
    wait_finishers(s, &st);
    assert_int_equal(st.cache_assembled - assembled, 2); /* both divergences, counted for /metrics */
    if (pressure)
        assert_true(st.cache_restores > 0);
    dray_sched_destroy(s);
    dray_engine_close(e);
}

static void test_cache_divergence_between_checkpoints(void **state)
{
    (void)state;
    divergence_between_checkpoints(false);
}

static void test_cache_divergence_between_checkpoints_host_tier(void **state)
{
    (void)state;
    divergence_between_checkpoints(true);
}

/* A sequence longer than the window leaves checkpoints as it runs, so that a
 * later request diverging anywhere inside it reuses it up to the divergence.
 * A 40-token prompt fed 4 tokens a step (window 8): Q shares its first 13
 * tokens. Only the end of the request (44) is kept otherwise, and the window
 * blocks around 13 were recycled long before: Q would start from 0. */
static void test_cache_long_sequence_leaves_checkpoints(void **state)
{
    (void)state;
    struct opts o = {.max_seqs = 4, .chunk = 4};
    struct dray_engine *e = open_with(&o);
    char err[512];
    int32_t t[64], q[64];
    size_t n = prompt_for(5, t), nq = 13;
    assert_int_equal(n, 40);
    memcpy(q, t, nq * sizeof(int32_t));
    for (int j = 0; j < 5; j++)
        q[nq++] = (int32_t)(140 + j * 3);
    assert_int_not_equal(q[13], t[13]);
    struct collected cold, got;
    run_alone(e, q, nq, 8, &cold);
    struct dray_sched *s;
    assert_int_equal(dray_sched_create(e, 0, &s, err, sizeof(err)), 0);
    run_one(s, t, n, 4, NULL, &got);
    struct dray_sched_stats st;
    wait_finishers(s, &st);
    assert_true(st.cache_checkpoints > 2);
    struct dray_request_output a = run_one(s, q, nq, 8, NULL, &got);
    assert_int_equal(a.n_cached, 13);
    assert_int_equal(got.n, cold.n);
    assert_memory_equal(got.ids, cold.ids, cold.n * sizeof(int32_t));
    dray_sched_destroy(s);
    dray_engine_close(e);
}

/* One tenant's prefixes never serve another's; the same tenant hits. */
static void test_cache_tenants_are_isolated(void **state)
{
    (void)state;
    struct dray_engine *e = open_tiny(4, 16, 0);
    char err[512];
    int32_t t1[64], t2[128];
    size_t n1 = prompt_for(1, t1);
    struct collected reply, got;
    struct dray_sched *s;
    assert_int_equal(dray_sched_create(e, 0, &s, err, sizeof(err)), 0);
    run_one(s, t1, n1, 12, "alice", &reply);
    size_t n2 = second_turn(t1, n1, &reply, t2);
    assert_int_equal(run_one(s, t2, n2, 4, "bob", &got).n_cached, 0);
    assert_int_equal(run_one(s, t2, n2, 4, NULL, &got).n_cached, 0);
    assert_true(run_one(s, t2, n2, 4, "alice", &got).n_cached > 0);
    dray_sched_destroy(s);
    dray_engine_close(e);
}

/* A KV pool that holds little more than the running sequences: other requests
 * push turn 1's blocks out of the device. With a host tier they are spilled
 * there and restored for turn 2 (same tokens as a cold run); without one they
 * are gone. */
static void host_tier_case(bool host, struct dray_sched_stats *st, uint32_t *cached)
{
    struct dray_engine *probe = open_tiny(4, 16, 0);
    const struct dray_engine_info *in = dray_engine_get_info(probe);
    uint64_t budget = 4 * in->kv_bytes_per_seq_fixed + in->kv_bytes_per_token * 128;
    dray_engine_close(probe);
    struct opts o = {.max_seqs = 4, .chunk = 16, .kv_budget = budget, .no_host = !host};
    struct dray_engine *e = open_with(&o);
    char err[512];
    int32_t t1[64], t2[128];
    size_t n1 = prompt_for(3, t1);
    struct collected reply, cold, got;
    struct dray_request *r[N_REQ];
    run_alone(e, t1, n1, 20, &reply);
    size_t n2 = second_turn(t1, n1, &reply, t2);
    run_alone(e, t2, n2, 16, &cold);
    struct dray_sched *s;
    assert_int_equal(dray_sched_create(e, 0, &s, err, sizeof(err)), 0);
    run_one(s, t1, n1, 20, NULL, &got);
    submit_all(s, r, 40); /* the pressure */
    for (int k = 0; k < N_REQ; k++) {
        drain_request(r[k], &got);
        dray_request_free(r[k]);
    }
    struct dray_request_output b = run_one(s, t2, n2, 16, NULL, &got);
    assert_int_equal(got.n, cold.n);
    assert_memory_equal(got.ids, cold.ids, cold.n * sizeof(int32_t));
    *cached = b.n_cached;
    dray_sched_get_stats(s, st);
    dray_sched_destroy(s);
    dray_engine_close(e);
}

static void test_cache_host_tier_spills_and_restores(void **state)
{
    (void)state;
    struct dray_sched_stats st;
    uint32_t cached;
    host_tier_case(true, &st, &cached);
    assert_true(st.cache_spills > 0);
    assert_true(st.cache_restores > 0);
    assert_true(cached >= 40); /* turn 1 (about 50 tokens) came back from the host */
    host_tier_case(false, &st, &cached);
    assert_int_equal(st.cache_spills, 0);
    assert_int_equal(st.cache_host_bytes, 0);
    assert_true(cached < 40);
}

/* Only a request that finishes feeds its last sampled token: a cancelled one
 * feeds nothing (it may be cut off anywhere, and its client gets no reply to
 * send back), the same request run to its end feeds one. */
static void test_cancelled_request_feeds_nothing(void **state)
{
    (void)state;
    struct dray_engine *e = open_tiny(4, 16, 0);
    char err[512];
    struct dray_sched *s;
    assert_int_equal(dray_sched_create(e, 0, &s, err, sizeof(err)), 0);
    int32_t ids[64];
    size_t n = prompt_for(0, ids);
    struct dray_request *r;
    struct dray_request_params p = {.ids = ids, .n_ids = n};
    greedy(&p.gen, 60); /* 5 + 60 tokens fit the context: it would feed if it finished */
    assert_int_equal(dray_sched_submit(s, &p, &r, err, sizeof(err)), 0);
    dray_request_cancel(r);
    struct collected got;
    struct dray_request_output o = drain_request(r, &got);
    assert_string_equal(o.finish_reason, "cancelled");
    dray_request_free(r);
    struct dray_sched_stats st;
    wait_finishers(s, &st);
    assert_int_equal(st.cache_fed_tokens, 0);
    o = run_one(s, ids, n, 4, NULL, &got);
    assert_string_equal(o.finish_reason, "length");
    wait_finishers(s, &st);
    assert_int_equal(st.cache_fed_tokens, 1);
    dray_sched_destroy(s);
    dray_engine_close(e);
}

/* prefix_cache: false: nothing is kept, nothing is reused. */
static void test_cache_off_reuses_nothing(void **state)
{
    (void)state;
    struct opts o = {.max_seqs = 4, .chunk = 16, .no_cache = true};
    struct dray_engine *e = open_with(&o);
    char err[512];
    int32_t t1[64];
    size_t n1 = prompt_for(1, t1);
    struct collected got;
    struct dray_sched *s;
    assert_int_equal(dray_sched_create(e, 0, &s, err, sizeof(err)), 0);
    run_one(s, t1, n1, 12, NULL, &got);
    assert_int_equal(run_one(s, t1, n1, 12, NULL, &got).n_cached, 0);
    struct dray_sched_stats st;
    dray_sched_get_stats(s, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.cache_blocks, 0);
    dray_sched_destroy(s);
    dray_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_requests_match_running_alone),
        cmocka_unit_test(test_a_burst_admits_exactly_the_running_and_waiting_slots),
        cmocka_unit_test(test_preempted_requests_complete_with_the_same_tokens),
        cmocka_unit_test(test_cancel_frees_the_request_blocks),
        cmocka_unit_test(test_cancelled_request_feeds_nothing),
        cmocka_unit_test(test_stop_string_ends_the_request),
        cmocka_unit_test(test_bad_requests_and_shutdown),
        cmocka_unit_test(test_cache_hit_gives_the_cold_tokens_int8_kv),
        cmocka_unit_test(test_cache_hit_gives_the_cold_tokens_f16_kv),
        cmocka_unit_test(test_cache_partial_block_copy_on_write_int8_kv),
        cmocka_unit_test(test_cache_partial_block_copy_on_write_f16_kv),
        cmocka_unit_test(test_chat_next_turn_is_cached_gemma),
        cmocka_unit_test(test_chat_next_turn_is_cached_chatml),
        cmocka_unit_test(test_cache_divergence_between_checkpoints),
        cmocka_unit_test(test_cache_divergence_between_checkpoints_host_tier),
        cmocka_unit_test(test_cache_long_sequence_leaves_checkpoints),
        cmocka_unit_test(test_cache_tenants_are_isolated),
        cmocka_unit_test(test_cache_off_reuses_nothing),
        cmocka_unit_test(test_cache_host_tier_spills_and_restores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
