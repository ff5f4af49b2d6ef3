// hopper.cuh: the Hopper (sm_90a) instructions the wgmma GEMM kernels are made of, as small
// inline wrappers: mbarriers, TMA (cp.async.bulk.tensor) loads and stores, named barriers,
// setmaxnreg, wgmma (fence, commit, wait, shared-memory matrix descriptors, m64nNk32 e4m3 x e4m3
// with N = 64, 96, 128) and stmatrix; on the host, the TMA tensor maps. Included by fp8_hopper.cu and the kernel versions in
// dev/cuda/. The bodies exist only in the sm_90a target (FP8_SM90A); elsewhere they compile
// empty and the host never launches the kernels that use them (fp8_hopper.cu probes the build).
// PTX: https://docs.nvidia.com/cuda/parallel-thread-execution (sections on mbarrier, cp.async.bulk,
// wgmma). Why these kernels exist at all: on sm_90 the FP8 mma.sync of the portable kernel is
// emulated (widened to f16), and the FP8 tensor-core rate is reached only through wgmma.
#ifndef HOPPER_CUH
#define HOPPER_CUH

#include <cudaTypedefs.h>  // cuda.h's CUtensorMap (the type only: no -lcuda)

#include "cuda/cuda_common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FP8_SM90A 1  // wgmma and setmaxnreg exist only in the sm_90a target
#endif

#define WG_BK 128  // a K step: 128 FP8 codes = one 128-byte row of a tile = one scale block

__device__ __forceinline__ void mbar_init(uint64_t *bar, int count) {
#ifdef FP8_SM90A
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
#endif
}
// make the initialised barriers visible to the async proxy (TMA) before first use
__device__ __forceinline__ void mbar_fence_init() {
#ifdef FP8_SM90A
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// arrive once and announce that `bytes` of TMA data will complete this phase
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
#ifdef FP8_SM90A
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
#ifdef FP8_SM90A
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#endif
}
// wait until the phase of parity `parity` has completed
__device__ __forceinline__ void mbar_wait(uint64_t *bar, int parity) {
#ifdef FP8_SM90A
    uint32_t done = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    } while (!done);
#endif
}
// TMA: box at (c0 = column, c1 = row) of the tensor map -> shared memory, completing on bar
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1) {
#ifdef FP8_SM90A
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
                 ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1) : "memory");
#endif
}
// TMA: shared memory -> box at (c0, c1); OOB parts of the box are not written
__device__ __forceinline__ void tma_store_2d(const CUtensorMap *map, const void *src, int c0, int c1) {
#ifdef FP8_SM90A
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
                 ::"l"(map), "r"(smem_u32(src)), "r"(c0), "r"(c1) : "memory");
#endif
}
__device__ __forceinline__ void bulk_commit() {
#ifdef FP8_SM90A
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulk_wait_read0() {  // earlier stores have read their shared memory
#ifdef FP8_SM90A
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulk_wait0() {  // earlier stores are complete
#ifdef FP8_SM90A
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}
// ordinary shared-memory writes -> visible to the async proxy (the TMA store)
__device__ __forceinline__ void fence_proxy_async() {
#ifdef FP8_SM90A
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {  // arrive without waiting
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifdef FP8_SM90A
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifdef FP8_SM90A
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
__device__ __forceinline__ void wgmma_fence() {  // order earlier register accesses before the next wgmma
#ifdef FP8_SM90A
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef FP8_SM90A
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {  // at most N committed groups still in flight
#ifdef FP8_SM90A
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// stmatrix: four 8 x 8 b16 matrices from a warp's registers (mma fragment layout) to shared memory
__device__ __forceinline__ void stsm_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
#ifdef FP8_SM90A
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1), "r"(r2),
                 "r"(r3)
                 : "memory");
#endif
}
// keep the compiler from moving accesses of the accumulators across wgmma_wait
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// wgmma shared-memory matrix descriptor of a K-major tile stored as TMA's 128-byte swizzle
// writes it: rows of 128 bytes (one K step of FP8 codes), 16-byte chunk j of row r at chunk
// j ^ (r % 8), 8-row groups of 1024 bytes (the stride-dimension offset); the tile starts on
// a 1024-byte boundary. The leading-dimension offset is unused for swizzled K-major tiles.
// Bits: [0,14) address >> 4, [16,30) LBO >> 4, [32,46) SBO >> 4, [62,64) swizzle (1 = 128 B).
// The k-th 32-wide slice of the K step starts 32 bytes further: descriptor + 2 * k.
__device__ __forceinline__ uint64_t wg_desc(const void *tile) {
    uint64_t d = (uint64_t)((smem_u32(tile) & 0x3FFFF) >> 4);
    d |= (uint64_t)1 << 16;
    d |= (uint64_t)(1024 >> 4) << 32;
    d |= (uint64_t)1 << 62;
    return d;
}

// D (64 x 128 fp32, per thread 64 values) (+)= A (64 x 32 e4m3, descriptor) B (128 x 32 e4m3)^T.
// accumulate = 0 overwrites D. Thread t of the warpgroup holds, for i = 0..15,
//   d[4i + 0/1] at row 16 (t / 32) + (t % 32) / 4,     columns 8i + 2 (t % 4) + 0/1
//   d[4i + 2/3] at that row + 8,                        the same columns.
#define WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
#ifdef FP8_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "
        "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1;\n}\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
        : "l"(da), "l"(db), "r"(accumulate));
#endif
}

// 64 and 96 columns: the halves of 128- and 192-wide tiles (the split promotion of versions 6 and 7)
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
#ifdef FP8_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1;\n}\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
        : "l"(da), "l"(db), "r"(accumulate));
#endif
}
__device__ __forceinline__ void wgmma_m64n96k32_e4m3(float (&d)[48], uint64_t da, uint64_t db, int accumulate) {
#ifdef FP8_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
        "%48, %49, p, 1, 1;\n}\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40)
        : "l"(da), "l"(db), "r"(accumulate));
#endif
}
#undef WG_D8
template <int BN>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[BN / 2], uint64_t da, uint64_t db, int accumulate) {
    if constexpr (BN == 128) wgmma_m64n128k32_e4m3(d, da, db, accumulate);
    else if constexpr (BN == 96) wgmma_m64n96k32_e4m3(d, da, db, accumulate);
    else wgmma_m64n64k32_e4m3(d, da, db, accumulate);
}

// the 4 wgmmas (k = 32 each) of one 128-wide K step of a warpgroup's 64 x BN tile into the fresh
// accumulator part (the first overwrites it), as one commit group (after a wgmma_fence)
template <int BN>
__device__ __forceinline__ void wg_issue(float (&part)[BN / 2], uint64_t da, uint64_t db) {
#pragma unroll
    for (int k = 0; k < WG_BK / 32; k++) wgmma_e4m3<BN>(part, da + 2 * k, db + 2 * k, k);
    wgmma_commit();
}
// one K step, issued and waited for
template <int BN>
__device__ __forceinline__ void wg_kstep(float (&part)[BN / 2], uint64_t da, uint64_t db) {
    wgmma_fence();
    wg_issue<BN>(part, da, db);
    wgmma_wait<0>();
    fence_regs(part);
}

// ---- BF16 (the training attention, attention.cu) ----

// the descriptor of an MN-major tile (the operand's N, or M, dimension contiguous: e.g. V as rows of
// head-dim values when the product reduces over the keys), stored as TMA's 128-byte swizzle writes
// it in panels of 64 bf16 columns: rows of 128 bytes, 8-row groups of 1024 bytes (the stride-
// dimension offset), panels `panel_bytes` apart (the leading-dimension offset, the N step of 64).
// A k16 step (16 rows) starts 2048 bytes further.
__device__ __forceinline__ uint64_t wg_desc_mn(const void *tile, uint32_t panel_bytes) {
    uint64_t d = (uint64_t)((smem_u32(tile) & 0x3FFFF) >> 4);
    d |= (uint64_t)(panel_bytes >> 4) << 16;
    d |= (uint64_t)(1024 >> 4) << 32;
    d |= (uint64_t)1 << 62;
    return d;
}

#define WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
// D (64 x 64 fp32) (+)= A (64 x 16 bf16, K-major descriptor) B (64 x 16 bf16, K-major descriptor)^T
__device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
#ifdef FP8_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
        : "l"(da), "l"(db), "r"(accumulate));
#endif
}
// D (64 x N fp32) += A (64 x 16 bf16 in registers: the mma.sync A fragment of each warp's 16 rows)
// B (16 x N bf16, MN-major descriptor: wg_desc_mn), N = 64 or 128
__device__ __forceinline__ void wgmma_m64n128k16_bf16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
#ifdef FP8_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "
        "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
#endif
}
__device__ __forceinline__ void wgmma_m64n64k16_bf16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
#ifdef FP8_SM90A
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
#endif
}
#undef WG_D8

// 1 once fp8_cuda_init found an sm_90a GPU and an sm_90a build (fp8_hopper.cu's probe): the wgmma
// kernels may be launched
int hopper_enabled(void);

// ---- host side: TMA tensor maps ----

// the driver's cuTensorMapEncodeTiled, found at run time (no -lcuda); NULL if the driver has none
static inline PFN_cuTensorMapEncodeTiled_v12000 tma_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn;
    static int looked;
    if (!looked) {
        looked = 1;
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
        cudaGetLastError();
    }
    return fn;
}

// a 2-D row-major tensor (rows, cols) of esz-byte elements read or written by TMA in boxes of
// (box_rows, box_cols), with the 128-byte swizzle the wgmma descriptors (wg_desc) expect;
// out-of-bounds reads give zeros, out-of-bounds writes are dropped
static inline CUtensorMap tma_map_2d(const void *base, CUtensorMapDataType dt, int esz, int rows, int cols, int box_rows,
                                     int box_cols) {
    CUtensorMap m;
    cuuint64_t dim[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, stride[1] = {(cuuint64_t)cols * esz};
    cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows}, estride[2] = {1, 1};
    PFN_cuTensorMapEncodeTiled_v12000 enc = tma_encoder();
    if (!enc) die("TMA: the driver has no cuTensorMapEncodeTiled");
    CUresult r = enc(&m, dt, 2, (void *)base, dim, stride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) die("cuTensorMapEncodeTiled failed (CUresult %d) for a %d x %d tensor at %p", (int)r, rows, cols, base);
    return m;
}

#endif  // HOPPER_CUH
