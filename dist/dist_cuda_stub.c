// dist_cuda_stub.c: stands in for dist_cuda.cu in a build without nvcc: no GPU to choose, no NCCL,
// so dist.c's backend-memory collectives take the host's TCP ring.
#include "dist/dist.h"

void dist_cuda_set_device(int local_rank) { (void)local_rank; }
void *dist_nccl_init(Dist *d, char *why, size_t cap) {
    (void)d;
    snprintf(why, cap, "this build has no CUDA (nvcc was not found by make)");
    return NULL;
}
void dist_nccl_run(Dist *d, void *comm, int op, void *x, size_t n, int root) {
    (void)d, (void)comm, (void)op, (void)x, (void)n, (void)root;
    die("dist_nccl_run: this build has no NCCL");
}
void dist_nccl_free(void *comm) { (void)comm; }
