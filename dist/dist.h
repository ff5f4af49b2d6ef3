// dist.h: several processes training as one (one process per GPU, or per CPU on the CPU backend).
//   defines: DistEnv, dist_env_parse (who am I: rank, world size, where rank 0 listens, from the
//            environment torchrun or Slurm sets), dist_launch (--nproc_per_node N: this program
//            starts its N local processes itself), Dist, dist_init / dist_finalize (the rendezvous
//            and the ring of TCP connections), the collectives on host memory (dist_*_host) and on
//            backend memory (dist_all_reduce_sum, dist_reduce_scatter_sum, dist_all_gather,
//            dist_broadcast: NCCL on the GPU when the build has it, else through the host).
// Implemented in dist.c (environment, launcher, sockets, the ring) and dist_cuda.cu (the GPU's
// device choice and NCCL; dist_cuda_stub.c in a build without nvcc).
//
// The model of a run on W processes ("ranks" 0..W-1): every rank runs the same program on its own
// data and holds its own copy of what it trains; the collectives below are the only way they talk.
// Each collective is called by every rank in the same order with the same sizes (the programs call
// them at the same points of the same loop): that is the whole contract, as with NCCL or MPI.
//
// The CPU transport is a ring: rank r keeps one TCP connection to rank r+1 (next) and one from rank
// r-1 (prev). An all-reduce of n values is a reduce-scatter then an all-gather around it (what
// NCCL's ring algorithm does): each value crosses each link twice, 2 (W-1)/W n values a rank, however
// many ranks there are. The ring is made at start-up through rank 0: it listens on MASTER_PORT,
// every other rank connects there and says where its own ring listener is, rank 0 sends everyone the
// table, and each rank connects to its next. The same TCP ring carries the NCCL unique id, and stays
// open beside NCCL so that a dead rank is noticed (below).
//
// A dead rank stops every rank, with one line each, never a hang: its sockets close when it dies
// (the kernel does that for a killed process too), so its neighbours read EOF, say so and exit, which
// closes their sockets in turn, around the ring. A rank that hangs without dying is caught by a
// timeout with no progress (FP8GRPO_DIST_TIMEOUT seconds, default 1800: evaluation and checkpoints
// on one rank may keep the others waiting). The run then continues from its last checkpoint with
// --resume.
#ifndef DIST_H
#define DIST_H

#include <stddef.h>

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// who am I

typedef struct {
    int rank, world;             // this process among all of them: 0 <= rank < world
    int local_rank, local_world; // among those on this machine (local_rank picks the GPU)
    char addr[256];              // MASTER_ADDR: where rank 0 listens (host name or IP)
    int port;                    // MASTER_PORT
    int master_fd;               // rank 0's socket already listening on MASTER_PORT, inherited from dist_launch
                                 // (FP8GRPO_MASTER_FD), so no other process can take the port first; else -1
    double timeout;              // seconds without progress before a collective gives up
    const char *source;          // "torchrun" (RANK, WORLD_SIZE, ...), "--nproc_per_node" (the same, set by dist_launch),
                                 // "slurm" (SLURM_PROCID, ...), "none" (one process)
} DistEnv;

// an environment lookup: getenv, or a table (the tests')
typedef const char *(*DistGetenv)(const char *name);

// Reads, in this order:
//   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT  (torchrun's; also what
//     --nproc_per_node sets): RANK and WORLD_SIZE together or neither; LOCAL_RANK defaults to
//     RANK % LOCAL_WORLD_SIZE (LOCAL_WORLD_SIZE to WORLD_SIZE: one machine); MASTER_PORT to 29500;
//     MASTER_ADDR to 127.0.0.1 on one machine, else required;
//   else SLURM_PROCID, SLURM_STEP_NUM_TASKS (or SLURM_NTASKS), SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE
//     (srun's), with MASTER_ADDR defaulting to the step's first node (SLURM_STEP_NODELIST or
//     SLURM_JOB_NODELIST, where task 0 runs) and MASTER_PORT to 20000 + SLURM_JOB_ID % 20000 (two
//     jobs on one node do not collide);
//   else one process (world 1).
// And FP8GRPO_MASTER_FD: rank 0's socket already listening on MASTER_PORT (dist_launch's), else -1.
// FP8GRPO_DIST_TIMEOUT: seconds (default 1800). Returns 0, or -1 with one line in err naming the
// variable, what it holds and what it must hold.
int dist_env_parse(DistGetenv get, DistEnv *e, char *err, size_t cap);
// the first host of a Slurm host list ("gpu[07-09,12],cpu1" -> "gpu07"); -1 when it cannot be read
int dist_slurm_first_host(const char *list, char *out, size_t cap);

// ----------------------------------------------------------------------------
// --nproc_per_node N: start the N local processes (torchrun's --standalone, in a few lines)

// When argv holds --nproc_per_node N (or --nproc-per-node=N) with N >= 1 and this process is not one
// of the started ones: forks N children that exec this program with the same arguments and RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT (a free one unless
// set) and NCCL_NVLS_ENABLE=0 set; waits for all of them; exits with the first non-zero status (a
// rank that dies takes the others with it: see above; they get SIGTERM after 60 s if they linger).
// Returns (and does nothing) otherwise. Dies with one line on a bad N or when RANK/WORLD_SIZE are
// already set (two launchers).
void dist_launch(int argc, char **argv);

// ----------------------------------------------------------------------------
// the group of processes

typedef struct Dist Dist;

// One process (world 1) needs no connection: dist_init returns a Dist whose collectives copy or
// return at once, so the programs call them unconditionally.
// Rendezvous (above) and, with world > 1, the ring. Dies with one line when a rank does not show
// up within the timeout, a rank's WORLD_SIZE differs, or MASTER_ADDR cannot be reached.
Dist *dist_init(const DistEnv *e);
// a last barrier (so that no rank reads the EOF of one that finished first as a death), then closes
void dist_finalize(Dist *d);
int dist_rank(const Dist *d);
int dist_world(const Dist *d);
double dist_timeout(const Dist *d);  // FP8GRPO_DIST_TIMEOUT's seconds
// Whether a neighbour's connection has closed or failed, without waiting: 1 with the message in msg.
// (NCCL's wait loop asks this, so that a dead rank stops a collective that NCCL would wait on forever.)
int dist_peer_lost(Dist *d, char *msg, size_t cap);
// stdout of ranks other than 0 goes to /dev/null: rank 0 prints the run; errors (stderr) stay
void dist_quiet_others(const Dist *d);

// ---- collectives on host memory (the TCP ring; once NCCL runs on the GPUs, NCCL through a device copy) ----
// x (n) = the sum over ranks of x (n), identical on every rank. Floating-point addition is not
// associative, so the result is the sum in one fixed order per element (the ring's), the same
// on every rank, but not bit-equal to a single process adding the same numbers in another order
// (NCCL's order: the same on every rank too).
void dist_all_reduce_sum_f32_host(Dist *d, float *x, size_t n);
void dist_all_reduce_sum_f64_host(Dist *d, double *x, size_t n);
// elementwise max over ranks, fp64 (metrics: the longest completion, the largest IS ratio)
void dist_all_reduce_max_f64_host(Dist *d, double *x, size_t n);
// FP8 delayed scaling's amaxes (n floats) reduced as Transformer Engine's reduce_amax does: the
// largest any rank saw, a NaN on any rank a NaN on every rank (it marks the step: fp8_recipe.h), so
// that every rank rolls the same history and quantizes with the same scales
void dist_reduce_amax(Dist *d, float *amax, size_t n);
// x (world * n): rank r's n values at [r n, (r+1) n) on entry; on return the sum over ranks of that
// block is there on rank r (the other blocks are scratch). The first half of an all-reduce.
void dist_reduce_scatter_sum_f32_host(Dist *d, float *x, size_t n);
// x (world * bytes): rank r's block at [r bytes, (r+1) bytes) on entry; every block everywhere on return
void dist_all_gather_host(Dist *d, void *x, size_t bytes);
// x (bytes) of rank root, to every rank
void dist_broadcast_host(Dist *d, void *x, size_t bytes, int root);
void dist_barrier(Dist *d);

// ---- collectives on backend memory (device memory on the GPU) ----
// The same operations on hp (fp32) values the backend holds: with NCCL (a GPU build that found
// it) the device buffers go to NCCL directly; otherwise they are downloaded, go round the TCP ring
// and are uploaded (slow on a GPU, said once at dist_init; the CPU backend's memory is the host's).
// be->sync() first: the buffers are what the backend's queued work leaves in them.
void dist_all_reduce_sum(Dist *d, const Backend *be, void *x, size_t n);
// x (n) of rank root = the sum over the ranks of x (n); the others' x is left as scratch
void dist_reduce_sum(Dist *d, const Backend *be, void *x, size_t n, int root);
void dist_reduce_scatter_sum(Dist *d, const Backend *be, void *x, size_t n);  // x (world * n), as the host's
void dist_all_gather(Dist *d, const Backend *be, void *x, size_t bytes);      // x (world * bytes), any type
void dist_broadcast(Dist *d, const Backend *be, void *x, size_t bytes, int root);
// "nccl" or "tcp": what dist_all_reduce_sum uses for backend be
const char *dist_transport(const Dist *d, const Backend *be);

// ---- the GPU part (dist_cuda.cu; dist_cuda_stub.c without CUDA) ----
// choose the GPU of local rank local_rank (local_rank % the GPUs this process sees), before the CUDA
// backend starts; nothing without CUDA or a GPU
void dist_cuda_set_device(int local_rank);
// NCCL over the ranks, its unique id sent round the ring: NULL (and the reason in why) when the
// build has no NCCL or the process no GPU
void *dist_nccl_init(Dist *d, char *why, size_t cap);
// op 0: all-reduce sum, 1: reduce-scatter sum (n fp32 values: their n), 2: all-gather, 3: broadcast
// from root (n bytes), 4: all-reduce sum, 5: all-reduce max (n fp64 values), 6: reduce sum to root (n
// fp32 values), on device buffers as the dist_* functions above take them (4 and 5: the host
// collectives' copies, once NCCL runs). Waits for the
// result, asking dist_peer_lost meanwhile: a dead rank aborts NCCL and dies.
void dist_nccl_run(Dist *d, void *comm, int op, void *x, size_t n, int root);
void dist_nccl_free(void *comm);

#ifdef __cplusplus
}
#endif
#endif  // DIST_H
