// sample.cu: the CUDA backend's sampler (backend.h sample): temperature, top-k, top-p, per-sequence
// seeded RNG, and the sampled token's logprob, as ops_cpu.c's sample_cpu defines them.
//   defines: cu_sample (backend_cuda.cuh)
#include <cub/cub.cuh>

#include "cuda/backend_cuda.cuh"

// sampling, as sample_cpu defines it (fp64; see ops_cpu.c). One block of 256
// threads per row. Sums run in a fixed order (per-thread runs of consecutive elements,
// then a fixed tree), so the result repeats; it differs from the CPU's sequential sums
// only by rounding (~1e-16 relative), which can change the token only when the draw
// falls within that distance of a boundary.

#define SB 256  // threads per sampling block
#define SITEMS 8  // consecutive elements per thread in a scan chunk

struct SampleRow {  // per-row state between the kernels
    double mx, lse, u, T, sum;
    int arg, pad;
};

__device__ __forceinline__ uint64_t splitmix64_dev(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// block-wide inclusive scan of one double per thread (fixed tree: warp shuffles, then warps)
__device__ double block_scan_incl(double v, double *total) {
    __shared__ double ws[SB / 32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        double t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    __syncthreads();
    if (lane == 31) ws[warp] = v;
    __syncthreads();
    double before = 0, all = 0;
    for (int w = 0; w < SB / 32; w++) {
        if (w < warp) before += ws[w];
        all += ws[w];
    }
    *total = all;
    return v + before;
}
__device__ int block_min_int(int v) {
    __shared__ int wm[SB / 32];
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) wm[threadIdx.x >> 5] = v;
    __syncthreads();
    v = wm[0];
    for (int w = 1; w < SB / 32; w++) v = min(v, wm[w]);
    return v;
}

// The first index j < n whose running sum of w(j) exceeds target (or -1), and the total,
// in the fixed chunk order: chunk of SB*SITEMS, thread runs of SITEMS, block scan.
// With target = +inf it only returns the total.
template <typename W>
__device__ int scan_find(W w, int n, double target, double *total_out) {
    double run = 0;
    for (int base = 0; base < n; base += SB * SITEMS) {
        int j0 = base + threadIdx.x * SITEMS;
        double part = 0;
        for (int i = 0; i < SITEMS; i++)
            if (j0 + i < n) part += w(j0 + i);
        double tot, incl = block_scan_incl(part, &tot);
        double c = run + (incl - part);
        int found = n;
        for (int i = 0; i < SITEMS; i++)
            if (j0 + i < n && found == n) {
                c += w(j0 + i);
                if (c > target) found = j0 + i;
            }
        found = block_min_int(found);
        if (found < n) return found;
        run += tot;
    }
    *total_out = run;
    return -1;
}

// The row is cut into NSEG segments so that S rows keep S * NSEG blocks busy (one block
// per row leaves most of the GPU idle at S = 64 and walks 151,936 logits serially).
#define NSEG 16

// (value, index) max with the lowest index on ties; index V means "none yet"
__device__ __forceinline__ void argmax_merge(float &best, int &bidx, float b2, int i2, int V) {
    if (i2 != V && (bidx == V || b2 > best || (b2 == best && i2 < bidx))) {
        best = b2;
        bidx = i2;
    }
}
__device__ void block_argmax(float &best, int &bidx, int V) {
    __shared__ float bv[SB / 32];
    __shared__ int bi[SB / 32];
    for (int o = 16; o > 0; o >>= 1)
        argmax_merge(best, bidx, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bidx, o), V);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        bv[threadIdx.x >> 5] = best;
        bi[threadIdx.x >> 5] = bidx;
    }
    __syncthreads();
    best = bv[0];
    bidx = bi[0];
    for (int w = 1; w < SB / 32; w++) argmax_merge(best, bidx, bv[w], bi[w], V);
}
__device__ __forceinline__ void seg_range(int seg, int V, int *j0, int *j1) {
    int len = (V + NSEG - 1) / NSEG;
    *j0 = min(V, seg * len);
    *j1 = min(V, *j0 + len);
}

// pass 1, grid (NSEG, S): each segment's argmax (lowest index on ties)
__global__ void sample_segmax_kernel(float *segv, int *segi, const float *logits, int V) {
    int seg = blockIdx.x, s = blockIdx.y, j0, j1;
    seg_range(seg, V, &j0, &j1);
    const float *z = logits + (size_t)s * V;
    float best = -INFINITY;
    int bidx = V;
    for (int j = j0 + threadIdx.x; j < j1; j += SB) argmax_merge(best, bidx, z[j], j, V);
    block_argmax(best, bidx, V);
    if (threadIdx.x == 0) {
        segv[s * NSEG + seg] = best;
        segi[s * NSEG + seg] = bidx;
    }
}

// the row's argmax from its segments, in segment order (so ties go to the lowest index)
__device__ __forceinline__ int row_argmax(const float *segv, const int *segi, int s, int V) {
    float best = -INFINITY;
    int bidx = V;
    for (int k = 0; k < NSEG; k++) argmax_merge(best, bidx, segv[s * NSEG + k], segi[s * NSEG + k], V);
    return bidx;
}

// pass 2, grid (NSEG, S): each segment's sum of exp(z/T - mx), mx = max z / T; a fixed order
// (SITEMS-runs per thread, then block_scan_incl's fixed tree), so the result repeats
__global__ void sample_segsum_kernel(double *segsum, const float *segv, const int *segi, const float *logits, int V,
                                     double T) {
    int seg = blockIdx.x, s = blockIdx.y, j0, j1;
    seg_range(seg, V, &j0, &j1);
    const float *z = logits + (size_t)s * V;
    double mx = (double)z[row_argmax(segv, segi, s, V)] / T, total;
    scan_find([&](int j) { return exp((double)z[j0 + j] / T - mx); }, j1 - j0, INFINITY, &total);
    if (threadIdx.x == 0) segsum[s * NSEG + seg] = total;
}

// pass 3, grid S: lse and the draw u; without truncation also the token: the segment where
// the running sum (segments in order) passes u * sum, then the index within it
__global__ void sample_finish_kernel(SampleRow *st, int32_t *tokens, float *logp, const double *segsum,
                                     const float *segv, const int *segi, const float *logits, uint64_t *rng, int V,
                                     float temperature, int pick) {
    int s = blockIdx.x;
    const float *z = logits + (size_t)s * V;
    double T = temperature > 0 ? (double)temperature : 1.0, total = 0;
    int arg = row_argmax(segv, segi, s, V);
    double mx = (double)z[arg] / T;
    for (int k = 0; k < NSEG; k++) total += segsum[s * NSEG + k];
    SampleRow r;
    r.mx = mx;
    r.sum = total;
    r.lse = mx + log(total);
    r.T = T;
    r.arg = arg;
    r.u = 0;
    if (temperature > 0) {
        uint64_t x = rng[s];  // every thread draws the same u; thread 0 stores the state
        r.u = (double)(splitmix64_dev(&x) >> 11) * (1.0 / 9007199254740992.0);
        __syncthreads();
        if (threadIdx.x == 0) rng[s] = x;
    }
    if (threadIdx.x == 0) st[s] = r;
    if (!pick) return;
    int tok = arg;
    if (temperature > 0) {
        double target = r.u * total, before = 0;
        int k = 0;
        while (k < NSEG - 1 && before + segsum[s * NSEG + k] <= target) before += segsum[s * NSEG + k++];
        int j0, j1;
        seg_range(k, V, &j0, &j1);
        double dummy;
        int f = scan_find([&](int j) { return exp((double)z[j0 + j] / T - mx); }, j1 - j0, target - before, &dummy);
        // not found: rounding put the target at the segment's very end
        tok = f >= 0 ? j0 + f : j1 - 1;
    }
    if (threadIdx.x == 0) {
        tokens[s] = tok;
        logp[s] = (float)((double)z[tok] / T - r.lse);
    }
}

// pass 2 (top-k / top-p) over the row sorted by logit, descending, ties by id (a stable
// sort of ids 0..V-1 keeps the CPU's id order)
__global__ void sample_trunc_kernel(int32_t *tokens, float *logp, const SampleRow *st, const float *logits,
                                    const float *skeys, const int32_t *sids, int V, int top_k, float top_p,
                                    double top_p_below) {
    int s = blockIdx.x;
    const float *z = logits + (size_t)s * V, *k = skeys + (size_t)s * V;
    const int32_t *ids = sids + (size_t)s * V;
    SampleRow r = st[s];
    auto p = [&](int j) { return exp((double)k[j] / r.T - r.lse); };
    int keep = (top_k > 0 && top_k < V) ? top_k : V;
    double kept_mass, m;
    scan_find(p, keep, INFINITY, &kept_mass);
    if (top_p < 1.0f) {
        // the smallest prefix whose renormalised mass reaches top_p (c >= top_p, at least one);
        // top_p_below is the double just under top_p, so c > top_p_below is c >= top_p
        double dummy;
        int f = scan_find([&](int j) { return p(j) / kept_mass; }, keep, top_p_below, &dummy);
        keep = f >= 0 ? f + 1 : keep;
    }
    scan_find(p, keep, INFINITY, &m);
    double dummy;
    int f = scan_find(p, keep, r.u * m, &dummy);
    int tok = ids[f >= 0 ? f : keep - 1];
    if (threadIdx.x == 0) {
        tokens[s] = tok;
        logp[s] = (float)((double)z[tok] / r.T - r.lse);
    }
}

__global__ void iota_rows_kernel(int32_t *ids, int32_t *offsets, int S, int V) {
    size_t n = (size_t)S * V;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        ids[i] = (int32_t)(i % V);
    if (blockIdx.x == 0)
        for (int i = threadIdx.x; i <= S; i += blockDim.x) offsets[i] = i * V;
}

void cu_sample(int32_t *tokens, void *logp, const void *logits, uint64_t *rng, int S, int V, float temperature,
                      int top_k, float top_p) {
    if (S <= 0) return;
    size_t off_seg = ((size_t)S * sizeof(SampleRow) + (size_t)(S + 1) * 4 + 255) / 256 * 256;
    char *small = (char *)cu_scratch(SC_SMALL, off_seg + (size_t)S * NSEG * (8 + 4 + 4) + 256);
    SampleRow *st = (SampleRow *)small;
    int32_t *offsets = (int32_t *)(small + ((size_t)S * sizeof(SampleRow) + 255) / 256 * 256);
    double *segsum = (double *)(small + off_seg);
    float *segv = (float *)(segsum + (size_t)S * NSEG);
    int *segi = (int *)(segv + (size_t)S * NSEG);
    const float *z = (const float *)logits;
    double T = temperature > 0 ? (double)temperature : 1.0;
    int plain = !(temperature > 0) || (top_k <= 0 && top_p >= 1.0f);
    sample_segmax_kernel<<<dim3(NSEG, S), SB, 0, cu_stream()>>>(segv, segi, z, V);
    launchCheck();
    sample_segsum_kernel<<<dim3(NSEG, S), SB, 0, cu_stream()>>>(segsum, segv, segi, z, V, T);
    launchCheck();
    sample_finish_kernel<<<S, SB, 0, cu_stream()>>>(st, tokens, (float *)logp, segsum, segv, segi, z, rng, V, temperature,
                                                 plain);
    launchCheck();
    if (plain) return;
    // sort each row by logit (descending, stable, so equal logits keep ascending ids)
    size_t n = (size_t)S * V, temp = 0;
    cudaCheck(cub::DeviceSegmentedRadixSort::SortPairsDescending(NULL, temp, z, (float *)NULL, (int32_t *)NULL,
                                                                 (int32_t *)NULL, (int)n, S, offsets, offsets + 1, 0,
                                                                 32, cu_stream()));
    size_t al = 256, off_keys = 0, off_ids_in = (n * 4 + al - 1) / al * al, off_ids = off_ids_in * 2,
           off_tmp = off_ids + off_ids_in;
    char *buf = (char *)cu_scratch(SC_SORT, off_tmp + temp);
    float *skeys = (float *)(buf + off_keys);
    int32_t *ids_in = (int32_t *)(buf + off_ids_in), *sids = (int32_t *)(buf + off_ids);
    iota_rows_kernel<<<grid_for(n), 256, 0, cu_stream()>>>(ids_in, offsets, S, V);
    launchCheck();
    cudaCheck(cub::DeviceSegmentedRadixSort::SortPairsDescending(buf + off_tmp, temp, z, skeys, ids_in, sids, (int)n, S,
                                                                 offsets, offsets + 1, 0, 32, cu_stream()));
    sample_trunc_kernel<<<S, SB, 0, cu_stream()>>>(tokens, (float *)logp, st, z, skeys, sids, V, top_k, top_p,
                                                    nextafter((double)top_p, -INFINITY));
    launchCheck();
}

