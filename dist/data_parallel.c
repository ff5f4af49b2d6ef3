// data_parallel.c: data parallelism for the trainers (data_parallel.h says how GRPO's step is split and why its gradient
// equals one process's).
#include <signal.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "dist/data_parallel.h"
#include "io/safetensors.h"  // read_file, file_exists

Dist *dist_from_env(void) {
    DistEnv e;
    char err[512];
    if (dist_env_parse((DistGetenv)getenv, &e, err, sizeof err)) die("%s", err);
    if (e.world > 1) setenv("NCCL_NVLS_ENABLE", "0", 1);  // NVLink multicast stays off (dist_cuda.cu)
    if (e.local_rank > 0) dist_cuda_set_device(e.local_rank);  // before the CUDA backend starts (on device 0, local rank 0's)
    Dist *d = dist_init(&e);
    dist_quiet_others(d);
    if (e.world > 1)
        printf("data parallel: %d ranks (started by %s), rank 0 at %s:%d; %d on this machine\n", e.world, e.source, e.addr, e.port,
               e.local_world);
    return d;
}

DpBatch dp_batch(const Dist *d, int per_device, int G) {
    DpBatch b;
    b.world = dist_world(d), b.rank = dist_rank(d);
    b.S = per_device, b.P = per_device / G;
    b.S_all = b.S * b.world, b.P_all = b.P * b.world;
    b.q0 = b.S * b.rank, b.p0 = b.P * b.rank;
    return b;
}

int dp_resume_batch_check(int train_batch_size, int per_device, int accum, int world, int G, char *err, size_t cap) {
    long tbs = train_batch_size, unit = (long)world * accum * (G > 0 ? G : 1);
    const char *what = G > 0 ? "completions" : "examples";
    if ((long)per_device * accum * world == tbs) return 0;
    if (tbs % unit) {
        if (G > 0)
            return error_msg(err, cap, "the checkpoint was trained with %ld %s a step, which %d ranks cannot split into whole groups "
                                       "of num_generations %d: resume on a number of ranks that divides %ld prompts",
                             tbs, what, world, G, tbs / G);
        return error_msg(err, cap, "the checkpoint was trained with %ld %s a step, which %d ranks x gradient_accumulation_steps %d "
                                   "cannot split: resume on a number of ranks that divides %ld",
                         tbs, what, world, accum, tbs / accum);
    }
    return error_msg(err, cap, "the checkpoint was trained with %ld %s a step; on %d rank%s that is --per_device_train_batch_size %ld "
                               "(not %d)%s",
                     tbs, what, world, world > 1 ? "s" : "", tbs / ((long)world * accum), per_device,
                     accum > 1 ? " with the same --gradient_accumulation_steps" : "");
}

int dp_checkpoint_batch(const char *dir) {
    char state[4200];
    path_join(state, sizeof state, dir, "trainer_state.json");
    if (!file_exists(state)) return -1;
    char *text = read_file(state, NULL);
    cJSON *st = cJSON_Parse(text);
    cJSON *tbs = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(st, "run"), "train_batch_size");
    int n = cJSON_IsNumber(tbs) ? tbs->valueint : -1;
    cJSON_Delete(st);
    free(text);
    return n;
}

GrpoNorm dp_norm(Dist *d, GrpoNorm local, int S_all) {
    double c[2] = {local.active_tokens, local.num_items_in_batch};
    dist_all_reduce_sum_f64_host(d, c, 2);
    local.B = S_all;
    local.active_tokens = c[0], local.num_items_in_batch = c[1];
    return local;
}

void dp_stats(Dist *d, GrpoStats *st) {
    if (dist_world(d) == 1) return;
    double s[13] = {st->tokens, st->kl_sum, st->clip_n, st->clip_low, st->clip_high, st->clip_region, st->delta_sum,
                    st->delta_n, st->is_sum, st->is_n, st->loss, st->has_kl, st->has_is};
    double x[3] = {st->delta_max, st->is_max, -st->is_min};  // a min is the max of the negatives
    dist_all_reduce_sum_f64_host(d, s, 13);
    dist_all_reduce_max_f64_host(d, x, 3);
    st->tokens = s[0], st->kl_sum = s[1], st->clip_n = s[2], st->clip_low = s[3], st->clip_high = s[4], st->clip_region = s[5];
    st->delta_sum = s[6], st->delta_n = s[7], st->is_sum = s[8], st->is_n = s[9], st->loss = s[10];
    st->has_kl = s[11] > 0, st->has_is = s[12] > 0;
    st->delta_max = x[0], st->is_max = x[1], st->is_min = -x[2];
}

double dp_all_reduce_grads(Dist *d, const Backend *be, void *grads, size_t n) {
    if (dist_world(d) == 1) return 0;
    be->sync();  // this rank's backward finishes first: its time is work, not waiting
    double t0 = now_sec();
    size_t es = dtype_size(be->hp);
    if (es != sizeof(float)) die("data parallel needs fp32 gradients (backend %s has %zu-byte ones)", be->name, es);
    for (size_t off = 0; off < n; off += DP_BUCKET_VALUES) {
        size_t k = n - off < DP_BUCKET_VALUES ? n - off : DP_BUCKET_VALUES;
        dist_all_reduce_sum(d, be, (char *)grads + off * es, k);
    }
    return now_sec() - t0;
}

DpShard dp_shard(size_t n, int world, int rank) {
    DpShard s = {n, n / world, 0, 0};
    s.lo = s.shard * rank;
    s.hi = rank == world - 1 ? n : s.lo + s.shard;
    return s;
}

void dp_test_kill(const Dist *d, int step) {
    const char *v = getenv("FP8GRPO_TEST_KILL");
    int rank, at;
    if (v && sscanf(v, "%d:%d", &rank, &at) == 2 && rank == dist_rank(d) && at == step) {
        fprintf(stderr, "rank %d: FP8GRPO_TEST_KILL: killing myself at step %d\n", rank, step);
        raise(SIGKILL);
    }
}
