// kernel_trace: every kernel's GPU start and end, including the kernels of CUDA graphs, for machines
// without Nsight Systems. A CUPTI injection library: the driver loads it and calls InitializeInjection.
//   make -C dev ../build/kernel_trace.so
//   CUDA_INJECTION64_PATH=$PWD/build/kernel_trace.so KERNEL_TRACE=trace.csv ./build/bench_rollout ...
//   python3 dev/kernel_trace_sum.py trace.csv      # the decode steps: each kernel's share, the gaps
// writes start_ns,end_ns,name per kernel (CSV) at exit. Tracing slows the step (~10% at 0.6B) and
// changes the gaps between kernels: compare shares and kernel times, take step times untraced.
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *out;

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *size = 8 << 20;
    *buf = (uint8_t *)aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS)
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            CUpti_ActivityKernel10 *k = (CUpti_ActivityKernel10 *)r;
            fprintf(out, "%llu,%llu,\"%s\"\n", (unsigned long long)k->start, (unsigned long long)k->end, k->name);
        }
    free(buf);
}

static void flush(void) {
    cuptiActivityFlushAll(1);
    fclose(out);
}

int InitializeInjection(void) {
    const char *path = getenv("KERNEL_TRACE");
    out = fopen(path ? path : "kernel_trace.csv", "w");
    if (!out) return 0;
    fprintf(out, "start_ns,end_ns,name\n");
    cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    atexit(flush);
    return 1;
}
