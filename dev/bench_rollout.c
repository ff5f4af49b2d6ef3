// dev/bench_rollout.c: rollout throughput of the engine (rollout.c) on the CUDA backend (or, with
// --device cpu, the CPU's), Qwen3-shaped random models (Qwen3-30B-A3B's experts among them; and SmolLM2-135M's
// Llama shape), prompt 128 + 256 new tokens at fixed length (no EOS), sampling at temperature 1 as
// transformers' generate in dev/peers.py does.
// Reports tokens/s (new tokens over prefill + decode), the decode step time against the
// floor of BENCHMARKS.md (bytes read per step / 3.0 TB/s), and memory (the process's peak so far beyond the
// CUDA context: run one row per process for a row's own). With --startup,
// also the time from a bf16 safetensors checkpoint on disk to the first sampled token.
//
//   make bench-rollout && ./build/bench_rollout --model 0.6b --fp8 block,off --batch 64,256
//   ./build/bench_rollout --model 8b --fp8 block,off --batch 64 --startup /tmp/q8b
// --kv auto,fp8 adds rows with the FP8 KV cache (--kv_cache_dtype fp8 of train_grpo).
// --decode_attn mma|fp32 runs every decode attention on the tensor-core kernel (where it can) or the fp32
// one, instead of attention_decode.cu's rule (auto): where the rule's crossover is measured.
// --fp8_embeddings: the FP8 rows hold the embedding table and LM head in E4M3 too (train_grpo's option).
// With --profile, one more rollout per row runs without graphs, every op timed by CUDA
// events (dev/op_profile.h): the GPU time per op category per decode step.
// Prints one summary table last.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <math.h>
#include <unistd.h>

#include "lora.h"
#include "model.h"
#include "op_profile.h"
#include "rollout.h"
#include "shapes.h"
#include "cuda/attention_cuda.h"
#include "cuda/fp8_cuda.h"
#include "io/safetensors.h"
#include "io/options.h"  // backend_select


static double gib(size_t b) { return b / 1073741824.0; }

typedef struct {
    const char *gran;
    int batch, G, graphs;
    int same_as_no_graphs;  // -1 not checked
    double tok_s, prefill_s, decode_s, step_ms, floor_ms, peak_gib, kv_gib, weights_gib;
} Row;

static double weight_bytes(const QWeight *w) { return (double)w->rows * w->cols * (w->gran == FP8_OFF ? 2 : 1); }

// bytes one decode step reads: linear weights, the lm head, and the KV cache at the mean context. Qwen3 MoE:
// a sparse layer's router and the experts its S tokens choose, each read once (cuda/moe.cu): E (1 - (1 - K/E)^S)
// of them expected where the choices are uniform (random weights route near uniformly)
static double decode_floor_ms(const Config *c, const Model *m, int S, int prompt, int nnew) {
    double lin = 0;
    for (int l = 0; l < c->L; l++) {
        const LayerWeights *lw = &m->w.layers[l];
        for (int i = 0; i < LIN_COUNT; i++) lin += weight_bytes(&lw->lin[i]);  // (a sparse layer's MLP: rows 0)
        if (!c->moe[l]) continue;
        double active = c->E * (1 - pow(1 - (double)c->K / c->E, S));
        lin += weight_bytes(&lw->router) +
               active * (weight_bytes(&lw->experts[0]) + weight_bytes(&lw->experts[1]) + weight_bytes(&lw->experts[2]));
    }
    double head = (m->w.head.gran != FP8_OFF ? 1.0 : 2.0) * c->V * c->C;
    double ctx = prompt + nnew / 2.0;
    double kv = ctx * S * c->L * 2.0 * c->KVH * (m->kv_fp8 ? c->HD + 4.0 : c->HD * 2.0);  // FP8: codes + a scale
    return (lin + head + kv) / 3.0e12 * 1e3;
}

static const char *device = "cuda";  // --device
static int profile;  // --profile
static int kv_fp8;   // the row's KV cache: FP8 (--kv fp8)
static int fp8_embed;  // --fp8_embeddings (FP8 rows only)

static Row run(const char *size, FP8Gran gran, int S, int G, int prompt, int nnew, int rank, int graphs) {
    const Backend *be = backend_select(device, 0);
    Config cfg = bench_shape(size);
    ModelOptions opt = {gran, 0, 0, 0, fp8_embed && gran != FP8_OFF};
    Model m;
    model_init_random(&m, &cfg, be, &opt, 1234);
    m.kv_fp8 = kv_fp8;
    LoRA *lo = NULL;
    if (rank > 0) {
        lo = lora_create(&m, rank, (float)rank, (1u << LIN_COUNT) - 1, 7, 0);
        m.lora = lo;
    }
    int P = S / G;
    Rng r = rng_make(11);
    int **prompts = (int **)mallocCheck(P * sizeof(int *)), *plens = (int *)mallocCheck(P * sizeof(int));
    for (int p = 0; p < P; p++) {
        prompts[p] = (int *)mallocCheck(prompt * sizeof(int));
        for (int t = 0; t < prompt; t++) prompts[p][t] = rng_int(&r, cfg.V < 150000 ? cfg.V : 150000);
        plens[p] = prompt;
    }
    uint64_t *seeds = (uint64_t *)mallocCheck(S * sizeof(uint64_t));
    for (int s = 0; s < S; s++) seeds[s] = 1000 + s;
    RolloutConfig rc = {G, nnew, 1.0f, 1.0f, 0, NULL, 0, 16, 1};
    Rollout ro;
    // warm-up (kernel selection, cuBLASLt heuristics, allocations), then the measured run
    RolloutConfig warm = rc;
    warm.max_new = 8;
    rollout_run(&m, lo, &warm, P, (const int *const *)prompts, plens, seeds, &ro);
    rollout_free(&ro);
    m.no_graphs = !graphs;
    rollout_run(&m, lo, &rc, P, (const int *const *)prompts, plens, seeds, &ro);
    Row row = {fp8_gran_name(gran), S, G, graphs, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    if (graphs) {  // the same rollout without graphs must give the same tokens (fixed batch: same GEMM shapes)
        Rollout ref;
        m.no_graphs = 1;
        rollout_run(&m, lo, &rc, P, (const int *const *)prompts, plens, seeds, &ref);
        m.no_graphs = 0;
        row.same_as_no_graphs = memcmp(ro.ids, ref.ids, (size_t)S * nnew * sizeof(int)) == 0;
        rollout_free(&ref);
    }
    if (profile) {  // decode only: the prefill runs unprofiled first, then a rollout of the same shape
        Backend W;
        prof_install(be, &W);
        m.be = &W;
        if (lo) lo->be = &W;
        Rollout pr;
        rollout_run(&m, lo, &rc, P, (const int *const *)prompts, plens, seeds, &pr);
        m.be = be;
        if (lo) lo->be = be;
        char title[160];
        snprintf(title, sizeof title, "rollout %s, fp8 %s, batch %d, prompt %d + %d (prefill included once)", size,
                 fp8_gran_name(gran), S, prompt, nnew);
        prof_report(stdout, title, (pr.prefill_s + pr.decode_s) * 1e3, pr.decode_steps);
        rollout_free(&pr);
    }
    row.prefill_s = ro.prefill_s;
    row.decode_s = ro.decode_s;
    row.tok_s = (double)S * nnew / (ro.prefill_s + ro.decode_s);
    row.step_ms = ro.decode_s / (ro.decode_steps + 1) * 1e3;  // nnew samples: nnew - 1 decode steps + 1 first sample
    row.floor_ms = decode_floor_ms(&cfg, &m, S, prompt, nnew);
    size_t peak = 0;  // the backend samples device memory at every allocation: the most held so far
    be->mem_in_use(&peak);
    row.peak_gib = gib(peak);
    row.kv_gib = gib(ro.kv_bytes);
    row.weights_gib = gib(m.w.dense_bytes + m.w.fp8_bytes);
    long sum = 0;
    for (int s = 0; s < S; s++) sum += ro.len[s];
    if (sum != (long)S * nnew) die("expected fixed-length completions");
    rollout_free(&ro);
    if (lo) {
        m.lora = NULL;
        lora_free(lo);
    }
    model_free(&m);
    for (int p = 0; p < P; p++) free(prompts[p]);
    free(prompts), free(plens), free(seeds);
    return row;
}

// read every byte of the checkpoint's files once (what "reading the file" costs)
static double read_dir_s(const char *dir) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cat %s/*.safetensors > /dev/null", dir);
    double t0 = now_sec();
    if (system(cmd) != 0) die("cannot read %s", dir);
    return now_sec() - t0;
}

static void startup(const char *size, const char *dir) {
    const Backend *be = backend_select("cuda", 0);
    Config cfg = bench_shape(size);
    char p[4096];
    path_join(p, sizeof p, dir, "config.json");
    if (!file_exists(p)) {
        Model m;
        ModelOptions dense = {FP8_OFF, 0, 0, 0, 0};
        double t0 = now_sec();
        model_init_random(&m, &cfg, be, &dense, 99);
        model_save_hf(&m, dir, DT_BF16);
        model_free(&m);
        fprintf(stderr, "wrote a random %s bf16 checkpoint to %s in %.1f s\n", size, dir, now_sec() - t0);
    }
    // drop nothing from the page cache (no permission games): measure reading, then loading
    double t_read = read_dir_s(dir);
    double t0 = now_sec();
    Model m;
    ModelOptions o = {FP8_BLOCK, 0, 0, 0, 0};
    model_load(&m, dir, be, &o);
    double t_load = now_sec() - t0;
    int prompt[128], plen = 128;
    for (int t = 0; t < 128; t++) prompt[t] = 1000 + t;
    const int *pp = prompt;
    uint64_t seed = 1;
    RolloutConfig rc = {1, 1, 1.0f, 1.0f, 0, NULL, 0, 16, 1};
    Rollout ro;
    rollout_run(&m, NULL, &rc, 1, &pp, &plen, &seed, &ro);
    double t_first = now_sec() - t0;
    fflush(stdout);
    printf("\nstart to first rollout token, %s from %s (bf16 safetensors -> FP8 block on load):\n", size, dir);
    printf("  reading the files (cat, page cache warm): %.2f s\n", t_read);
    printf("  model_load (read + quantize to FP8 on the GPU): %.2f s\n", t_load);
    printf("  + prefill 128 tokens and sample the first token: %.2f s total\n", t_first);
    printf("  beyond reading the file: %.2f s\n", t_first - t_read);
    fflush(stdout);
    rollout_free(&ro);
    model_free(&m);
}

int main(int argc, char **argv) {
    const char *size = "0.6b", *grans = "block,off", *batches = "64,256", *startup_dir = NULL, *graph_list = "on", *kvs = "auto";
    const char *gemm = "auto", *dattn = "auto";
    int prompt = 128, nnew = 256, G = 1, rank = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) size = argv[++i];
        else if (!strcmp(argv[i], "--fp8") && i + 1 < argc) grans = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batches = argv[++i];
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--new") && i + 1 < argc) nnew = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--generations") && i + 1 < argc) G = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lora") && i + 1 < argc) rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--startup") && i + 1 < argc) startup_dir = argv[++i];
        else if (!strcmp(argv[i], "--graphs") && i + 1 < argc) graph_list = argv[++i];
        else if (!strcmp(argv[i], "--profile")) profile = 1;
        else if (!strcmp(argv[i], "--fp8_embeddings")) fp8_embed = 1;
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc) kvs = argv[++i];
        else if (!strcmp(argv[i], "--gemm") && i + 1 < argc) gemm = argv[++i];
        else if (!strcmp(argv[i], "--decode_attn") && i + 1 < argc) dattn = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else die("usage: bench_rollout [--model " SHAPE_NAMES "] [--fp8 block,row,tensor,off] [--batch 64,256] [--prompt 128] "
                 "[--new 256] [--generations G] [--lora r] [--graphs on,off] [--kv auto,fp8] [--gemm auto|cublaslt] "
                 "[--decode_attn auto|mma|fp32] [--profile] [--fp8_embeddings] [--startup DIR] [--device cuda|cpu]");
    }
    if (strcmp(device, "cuda") && strcmp(device, "cpu")) die("--device: cuda or cpu, not '%s'", device);
    if (!strcmp(device, "cpu") && (profile || startup_dir)) die("--profile and --startup time the CUDA backend: drop them with --device cpu");
    const Backend *be = backend_select(device, 1);
    (void)be;
    // the FP8 GEMM's implementation (fp8_cuda.h): AUTO's choice by shape, or cuBLASLt for every
    // product (what the Hopper kernels are worth end to end)
    if (!strcmp(gemm, "cublaslt") && !strcmp(device, "cuda")) fp8_cuda_set_backend(FP8_GEMM_CUBLASLT);
    else if (strcmp(gemm, "auto")) die("--gemm: auto or cublaslt, not '%s'", gemm);
    if (strcmp(dattn, "auto") && strcmp(dattn, "mma") && strcmp(dattn, "fp32")) die("--decode_attn: auto, mma or fp32, not '%s'", dattn);
    if (!strcmp(device, "cuda")) attention_decode_set_mma(!strcmp(dattn, "mma") ? 1 : !strcmp(dattn, "fp32") ? 0 : -1);
    // the lists, parsed first
    int gl[8], ng = 0, bl[8], nb = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", grans);
    for (char *g = strtok(buf, ","); g && ng < 8; g = strtok(NULL, ",")) {
        gl[ng] = fp8_gran_parse(g);
        if (gl[ng++] < 0) die("--fp8: unknown granularity '%s'", g);
    }
    snprintf(buf, sizeof buf, "%s", batches);
    for (char *b = strtok(buf, ","); b && nb < 8; b = strtok(NULL, ",")) {
        bl[nb] = atoi(b);
        if (bl[nb] < 1 || bl[nb] % G) die("--batch %s must be a positive multiple of --generations %d", b, G);
        nb++;
    }
    printf("rollout, %s shape (random weights), prompt %d + %d new tokens, temperature 1, %s, G %d%s, FP8 GEMM %s:\n", size,
           prompt, nnew, be->device_desc, G, rank ? ", LoRA on" : "", gemm);
    printf("| weights | batch | graphs | tokens/s | prefill s | decode s | decode step ms | floor ms | step/floor | process peak GiB | KV GiB | weights GiB | = no graphs |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    fflush(stdout);
    int gon[2], ngr = 0;
    if (strstr(graph_list, "on")) gon[ngr++] = 1;
    if (strstr(graph_list, "off")) gon[ngr++] = 0;
    int kl[2], nkv = 0;
    if (strstr(kvs, "auto")) kl[nkv++] = 0;
    if (strstr(kvs, "fp8")) kl[nkv++] = 1;
    for (int i = 0; i < ng; i++)
        for (int kv = 0; kv < nkv; kv++)
        for (int j = 0; j < nb; j++)
            for (int k = 0; k < ngr; k++) {  // each row printed as soon as it is measured
                kv_fp8 = kl[kv];
                Row r = run(size, (FP8Gran)gl[i], bl[j], G, prompt, nnew, rank, gon[k]);
                printf("| %s%s | %d | %s | %.0f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n", r.gran,
                       kv_fp8 ? " + fp8 KV" : "", r.batch,
                       r.graphs ? "on" : "off", r.tok_s, r.prefill_s, r.decode_s, r.step_ms, r.floor_ms, r.step_ms / r.floor_ms,
                       r.peak_gib, r.kv_gib, r.weights_gib, r.same_as_no_graphs < 0 ? "" : r.same_as_no_graphs ? "yes" : "NO");
                fflush(stdout);
            }
    if (startup_dir) startup(size, startup_dir);
    return 0;
}
