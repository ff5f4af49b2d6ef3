// data_parallel.h: data parallelism for the trainers, on dist.h's collectives.
//   defines: dist_from_env (the programs' start: environment, GPU, rendezvous), DpBatch and
//            dp_batch (which part of a GRPO step's batch this rank has), dp_resume_batch_check,
//            dp_norm (GRPO's normalizers over all ranks), dp_stats (GRPO's loss metrics merged),
//            dp_all_reduce_grads (the gradient all-reduce, in buckets), DpShard and dp_shard (ZeRO:
//            each rank's part of a flat parameter array), dp_test_kill (the tests' dying rank)
//
// GRPO data parallel, in one paragraph. A step's batch is world x per_device_train_batch_size
// completions (TRL's global batch): rank r rolls out prompts [r P, (r+1) P) of the step's world x P,
// with the same seeds one process would give those sequences, so its completions are the ones a
// single process would sample (each rollout row is computed alone). Groups never straddle ranks
// (per_device_train_batch_size is a multiple of num_generations), but the rewards are gathered
// anyway, so that --scale_rewards batch and every reward metric see the whole batch, as one process
// would. The loss of one process over the whole batch is a sum over sequences with weights that
// depend on the whole batch (1 / (B n_b) for grpo, 1 / tokens for bnpo and dapo, 1 / (B Tc) for
// dr_grpo): each rank computes its sequences' terms with those global weights (dp_norm), so the
// ranks' gradients add up to the single process's, and one all-reduce SUM gives every rank exactly
// that gradient (DDP averages instead, with per-rank weights W times larger: the same thing). Then
// every rank clips and steps its own copy of the optimizer with the same gradient, so the copies
// stay identical without sending the weights: the optimizer is replicated, the data is split.
// What differs from one process is the order of fp32 additions in the gradient: rank r sums its
// rows, then the ranks' sums are added, where one process adds row after row (test_dist bounds it).
#ifndef DP_H
#define DP_H

#include "grpo.h"
#include "dist/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

// the environment (dist_env_parse: one line and exit on a bad one), the GPU of the local rank, the
// rendezvous; ranks but 0 lose their stdout; rank 0 says how many ranks and where from
Dist *dist_from_env(void);

typedef struct {
    int world, rank;
    int S, P;             // this rank's sequences and prompts (per_device_train_batch_size, / num_generations)
    int S_all, P_all;     // the step's: world times those
    int q0, p0;           // this rank's first sequence and prompt among the step's
} DpBatch;
DpBatch dp_batch(const Dist *d, int per_device, int G);

// A checkpoint trained with train_batch_size sequences a step (GRPO's completions, in groups of
// G = num_generations; SFT's examples, G = 0, each rank's per_device x accum of them), resumed with
// per_device (x accum) on world ranks: 0 when that makes the same batch; else -1 and one line: the
// --per_device_train_batch_size that continues it on this many ranks, or that this world size does
// not divide the batch (into whole groups).
int dp_resume_batch_check(int train_batch_size, int per_device, int accum, int world, int G, char *err, size_t cap);
// the checkpoint's train_batch_size (trainer_state.json's "run"), or -1 when it has none (older runs)
int dp_checkpoint_batch(const char *checkpoint_dir);

// The normalizers of the whole batch from this rank's (grpo_prepare on its rows): the token counts
// summed over ranks, B the step's sequences.
GrpoNorm dp_norm(Dist *d, GrpoNorm local, int S_all);
// The loss metrics' accumulators of every rank merged into st (sums added, extremes kept), on every rank
void dp_stats(Dist *d, GrpoStats *st);

// grads (n hp values in backend memory) summed over ranks, bucket values at a time (DDP's 25 MiB
// buckets: they bound the host copy when the gradients go through the host; each bucket is also the
// unit an all-reduce overlapped with the backward would send, which this does not do, as it would
// not pay: Qwen3-8B's r-16 adapter on every projection is 43.6M values, 175 MB of fp32, which a ring
// all-reduce over NVLink (some 300 GB/s a GPU) moves in about a millisecond, against a GRPO step of
// seconds; dev/bench_dp measures the share). Returns the seconds spent in the collectives: this rank's
// own kernels still queued are waited for first and not counted, so the figure is the transfer and the
// wait for slower ranks.
double dp_all_reduce_grads(Dist *d, const Backend *be, void *grads, size_t n);
#define DP_BUCKET_VALUES ((size_t)25 << 18)  // 25 MiB of fp32

// ZeRO: n values split into world contiguous blocks of shard = floor(n / world) values, the last rank's
// also holding the tail of n - world x shard (< world) values: the blocks are what a reduce-scatter
// and an all-gather of shard values a rank move, the tail goes by a small all-reduce / broadcast
typedef struct {
    size_t n;       // values in all
    size_t shard;   // floor(n / world)
    size_t lo, hi;  // this rank's [lo, hi): [rank shard, (rank+1) shard), the last rank's up to n
} DpShard;
DpShard dp_shard(size_t n, int world, int rank);

// FP8GRPO_TEST_KILL=RANK:STEP: that rank kills itself (SIGKILL, as the OOM killer would) when step
// begins; what test_dist uses to check that every rank stops and the run resumes. Nothing otherwise.
void dp_test_kill(const Dist *d, int step);

#ifdef __cplusplus
}
#endif
#endif  // DP_H
