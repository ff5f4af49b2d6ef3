// backend_cuda_stub.c: stands in for backend_cuda.cu when the build has no nvcc,
// so the program still links and says why it runs on the CPU.
#include "core/backend.h"

const Backend *backend_cuda(char *why, size_t why_cap) {
    snprintf(why, why_cap, "this build has no CUDA backend (nvcc was not found by make)");
    return NULL;
}
