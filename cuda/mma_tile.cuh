// mma_tile.cuh: the tensor cores' m16n8k16 product through mma.sync (sm_80+: bf16 in, fp32 accumulation) as the
// attention kernels use it: the PTX wrappers, the swizzled shared-memory tile of rows of HD bf16, where each
// lane's fragments lie, and the two products built from them. Included by attention.cu (training) and
// attention_decode.cu (the decode step's tensor-core kernel).
#ifndef MMA_TILE_CUH
#define MMA_TILE_CUH

#include "cuda/cuda_common.cuh"

__device__ __forceinline__ void ldsm4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm4t(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
// c (16x8 f32) += a (16x16, row) * b (16x8, col), a and b of type TY ("bf16", or "f16")
#define MMA16816(TY)                                                                                       \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, " \
                 "{%8,%9}, {%0,%1,%2,%3};\n"                                                               \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                           \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) { MMA16816("bf16"); }
// the same product in f16 (attention_decode.cu's FP8 cache: E4M3 codes are f16 values)
__device__ __forceinline__ void mma16816_f16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) { MMA16816("f16"); }
#undef MMA16816
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

// A shared-memory tile of rows of HD bf16: chunk c (8 elements) of row r is stored at
// chunk c ^ (r mod min(8, HD/8)). Element offset of the chunk's start:
template <int HD>
__device__ __forceinline__ int toff(int row, int chunk) {
    constexpr int CH = HD / 8, SW = (CH < 8 ? CH : 8) - 1;
    return row * HD + ((chunk ^ (row & SW)) << 3);
}
// The fragment addressing used throughout (lane = 0..31):
//   A operand (16 rows x 16 k) from a row-major tile:    row = m0 + (lane & 15), chunk = 2 kk + (lane >> 4)
//   B operand, two n-tiles of 8, from a tile holding B^T rows (n rows, k contiguous):
//                                  row = n0 + (lane & 7) + ((lane >> 4) << 3), chunk = 2 kk + ((lane >> 3) & 1)
//     -> b0, b1 of n-tile n0 and b0, b1 of n-tile n0 + 8
//   B operand, two n-tiles, from a tile holding B rows (k rows, n contiguous), transposed load:
//                                  row = k0 + (lane & 7) + ((lane >> 3) & 1) * 8, chunk = 2 np + (lane >> 4)
//   C fragment c[4]: rows g = lane / 4 (c0, c1) and g + 8 (c2, c3), columns 2 (lane % 4) + {0, 1};
//   two C n-tiles (2kk, 2kk+1) re-packed to bf16 are the A operand of k-step kk.
#define A_ROW(m0) ((m0) + (lane & 15))
#define A_CH(kk) (2 * (kk) + (lane >> 4))
#define BN_ROW(n0) ((n0) + (lane & 7) + ((lane >> 4) << 3))
#define BN_CH(kk) (2 * (kk) + ((lane >> 3) & 1))
#define BT_ROW(k0) ((k0) + (lane & 7) + ((lane >> 3) & 1) * 8)
#define BT_CH(np) (2 * (np) + (lane >> 4))

__device__ __forceinline__ void c_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = pack_bf16(c0[0], c0[1]);
    a[1] = pack_bf16(c0[2], c0[3]);
    a[2] = pack_bf16(c1[0], c1[1]);
    a[3] = pack_bf16(c1[2], c1[3]);
}

// acc (16 x HD, as HD / 8 n-tiles) += A B: A one k step's operand (16 x 16: c_to_a of two C n-tiles),
// B the 16 rows from k0 of a tile of rows of HD, read transposed (P V, dS K, P^T dO, dS^T Q)
template <int HD>
__device__ __forceinline__ void mma_ab_rows(float (&acc)[HD / 8][4], const uint32_t (&a)[4], const bf16 *B, int k0) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int np = 0; np < HD / 16; np++) {
        uint32_t bb[4];
        ldsm4t(bb, B + toff<HD>(BT_ROW(k0), BT_CH(np)));
        mma16816(acc[2 * np], a, bb[0], bb[1]);
        mma16816(acc[2 * np + 1], a, bb[2], bb[3]);
    }
}

#endif  // MMA_TILE_CUH
