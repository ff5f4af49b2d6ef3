// dist_cuda.cu: the GPU side of dist.h: which GPU a local rank uses, and NCCL for the collectives
// on device buffers (HAVE_NCCL: the Makefile found nccl.h and libnccl from a package; without it
// only the device choice is here, and dist.c sends device buffers through the host).
//
// Why a wait loop instead of a plain cudaStreamSynchronize: NCCL waits for its peers on the GPU,
// and a peer that died never arrives, so a synchronize would hang forever. Here the host polls the
// stream, NCCL's own error state, and the TCP ring that dist.c keeps open beside NCCL (a dead
// rank's sockets close at once); on any of them it aborts the communicator and stops with one line.
#include <cuda_runtime.h>
#include <unistd.h>

#include "dist/dist.h"

extern "C" void dist_cuda_set_device(int local_rank) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        return;  // no GPU: the CPU backend will say so
    }
    // local_rank % n: with CUDA_VISIBLE_DEVICES narrowed to one GPU a process (srun --gpus-per-task)
    // every rank sees its own GPU as device 0
    if (cudaSetDevice(local_rank % n) != cudaSuccess) {
        cudaGetLastError();
        die("LOCAL_RANK %d: cannot use GPU %d of %d (%s)", local_rank, local_rank % n, n, "cudaSetDevice failed");
    }
}

#ifdef HAVE_NCCL
#include <nccl.h>
#include <pthread.h>

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
} Nccl;

// ncclCommInitRank waits for every rank and cannot be aborted before it returns: a rank that dies
// in that moment would leave the others there forever. A thread watches the TCP ring meanwhile and
// ends the process with one line when a neighbour goes (or after FP8GRPO_DIST_TIMEOUT).
typedef struct {
    Dist *d;
    volatile int done;
} InitWatch;

static void *init_watch(void *arg) {
    InitWatch *w = (InitWatch *)arg;
    char msg[512];
    double t0 = now_sec();
    while (!w->done) {
        if (dist_peer_lost(w->d, msg, sizeof msg)) {
            fprintf(stderr, "error: %s (while NCCL started)\n", msg);
            _exit(1);
        }
        if (now_sec() - t0 > dist_timeout(w->d)) {
            fprintf(stderr, "error: rank %d of %d: NCCL did not start within %.0f s (FP8GRPO_DIST_TIMEOUT): run with NCCL_DEBUG=WARN "
                            "to see why\n", dist_rank(w->d), dist_world(w->d), dist_timeout(w->d));
            _exit(1);
        }
        usleep(10000);
    }
    return NULL;
}

extern "C" void *dist_nccl_init(Dist *d, char *why, size_t cap) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        snprintf(why, cap, "no GPU");
        return NULL;
    }
    // NVLink multicast (NVLS) stays off whatever the environment says: it reserves memory on every GPU
    // and on the machines this was written for its setup fails or hangs
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    ncclUniqueId id;
    if (dist_rank(d) == 0 && ncclGetUniqueId(&id) != ncclSuccess)
        die("rank 0: ncclGetUniqueId failed: check NCCL_SOCKET_IFNAME / the network");
    dist_broadcast_host(d, &id, sizeof id, 0);  // round the TCP ring
    Nccl *c = (Nccl *)calloc(1, sizeof(Nccl));
    InitWatch w = {d, 0};
    pthread_t th;
    int watching = pthread_create(&th, NULL, init_watch, &w) == 0;
    ncclResult_t r = ncclCommInitRank(&c->comm, dist_world(d), id, dist_rank(d));
    w.done = 1;
    if (watching) pthread_join(th, NULL);
    if (r != ncclSuccess)
        die("rank %d: ncclCommInitRank failed (%s): run with NCCL_DEBUG=WARN for NCCL's reason", dist_rank(d), ncclGetErrorString(r));
    if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess)
        die("rank %d: cannot create a CUDA stream", dist_rank(d));
    int v = 0;
    ncclGetVersion(&v);
    if (dist_rank(d) == 0)
        fprintf(stderr, "NCCL %d.%d.%d over %d ranks (NCCL_NVLS_ENABLE=0)\n", v / 10000, v / 100 % 100, v % 100, dist_world(d));
    return c;
}

extern "C" void dist_nccl_run(Dist *d, void *comm, int op, void *x, size_t n, int root) {
    Nccl *c = (Nccl *)comm;
    int W = dist_world(d), me = dist_rank(d);
    float *f = (float *)x;
    ncclResult_t r;
    switch (op) {
    case 0: r = ncclAllReduce(f, f, n, ncclFloat32, ncclSum, c->comm, c->stream); break;
    // rank r's block of the (W, n) buffer receives the sum of everyone's block r
    case 1: r = ncclReduceScatter(f, f + (size_t)me * n, n, ncclFloat32, ncclSum, c->comm, c->stream); break;
    case 2: r = ncclAllGather((char *)x + (size_t)me * n, x, n, ncclInt8, c->comm, c->stream); break;  // n bytes a rank
    case 4: r = ncclAllReduce(x, x, n, ncclFloat64, ncclSum, c->comm, c->stream); break;
    case 5: r = ncclAllReduce(x, x, n, ncclFloat64, ncclMax, c->comm, c->stream); break;
    case 6: r = ncclReduce(f, f, n, ncclFloat32, ncclSum, root, c->comm, c->stream); break;
    default: r = ncclBroadcast(x, x, n, ncclInt8, root, c->comm, c->stream); break;  // n bytes
    }
    if (r != ncclSuccess) die("rank %d of %d: NCCL collective failed (%s)", me, W, ncclGetErrorString(r));
    double t0 = now_sec(), said = t0;
    char msg[512];
    for (;;) {
        cudaError_t e = cudaStreamQuery(c->stream);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) die("rank %d of %d: CUDA error during an NCCL collective (%s)", me, W, cudaGetErrorString(e));
        ncclResult_t ae;
        if (ncclCommGetAsyncError(c->comm, &ae) == ncclSuccess && ae != ncclSuccess && ae != ncclInProgress) {
            ncclCommAbort(c->comm);
            die("rank %d of %d: NCCL reports %s: every rank stops; rerun with --resume", me, W, ncclGetErrorString(ae));
        }
        if (dist_peer_lost(d, msg, sizeof msg)) {
            ncclCommAbort(c->comm);  // frees the GPU from the collective that will never complete
            die("%s", msg);
        }
        if (now_sec() - said > 1) {
            said = now_sec();
            if (said - t0 > dist_timeout(d)) {  // FP8GRPO_DIST_TIMEOUT: a peer alive but stuck
                ncclCommAbort(c->comm);
                die("rank %d of %d: an NCCL collective waited %.0f s: a rank hangs; every rank stops, rerun with --resume", me, W,
                    said - t0);
            }
        }
        usleep(50);
    }
}

extern "C" void dist_nccl_free(void *comm) {
    Nccl *c = (Nccl *)comm;
    ncclCommDestroy(c->comm);
    cudaStreamDestroy(c->stream);
    free(c);
}

#else  // a CUDA build without NCCL

extern "C" void *dist_nccl_init(Dist *d, char *why, size_t cap) {
    (void)d;
    snprintf(why, cap, "this build found no NCCL: see the README's \"Several GPUs\" for how to get it, then make again");
    return NULL;
}
extern "C" void dist_nccl_run(Dist *d, void *comm, int op, void *x, size_t n, int root) {
    die("dist_nccl_run: this build has no NCCL");
}
extern "C" void dist_nccl_free(void *comm) {}
#endif
