// export.c: a merged Hugging Face checkpoint to serve what was trained, with transformers or vLLM.
//
//   ./export --model BASE --lora out/run-1/checkpoint-150 --output_dir merged --dtype bf16
//   ./export --model BASE --lora ADAPTER --output_dir merged-fp8 --dtype fp8
//   ./export --model FULL_FINETUNE --output_dir converted --dtype fp8   (no adapter: a conversion)
//   ./export --help
//
// The base (BF16, F16, F32, or FP8 block with weight_scale_inv) is read on the CPU backend with every
// linear weight unquantized: fp32 on the host, 4 bytes per parameter (33 GB for an 8B model). Each
// adapted projection (and Qwen3 MoE expert weight, PEFT's target_parameters) is merged as W + (alpha / r) B A
// in fp64 and rounded once to what is written:
//   --dtype bf16  every tensor BF16; config.json the base's with torch_dtype bfloat16.
//   --dtype fp8   q, k, v, o, gate, up and down as float8_e4m3fn codes with weight_scale_inv (fp32, one per
//                 128x128 block, edge blocks by their own amax: fp8.h's quantizer, the one --load_in_fp8
//                 block runs at load), the rest (embeddings, norms, biases, lm_head) BF16; config.json gains
//                 the quantization_config below. The merge is rounded to fp32 and quantized from there, so
//                 that ./generate --load_in_fp8 block on the merged weights holds the same codes and scales.
//                 A projection whose shape is not whole 128x128 blocks (a side over 128 and not a multiple
//                 of it: hidden 576, intermediate 160) is written in BF16 instead and named in
//                 modules_to_not_convert (fp8_whole_blocks says why), and a line says which. How much of
//                 the adapter's change the codes keep, and the BF16 projections, is measured as below.
//   --dtype fp32  every tensor fp32, torch_dtype float32: twice BF16's bytes, and the merge whole. A typical
//                 LoRA change is ~1e-3 of a weight, below BF16's step (2^-8 of it) at most weights: rounded to
//                 BF16 most of it is lost, which the line after the export measures (`kept`).
// Above --max_shard_size the tensors go to model-0000i-of-0000n.safetensors with
// model.safetensors.index.json, as transformers' save_pretrained shards them. The tokenizer files
// are copied. A multimodal Gemma 3 (Gemma3ForConditionalGeneration) is written back whole: its text model as
// above, under the base's tensor names, its vision tower and projector copied byte for byte, config.json the
// base's (so transformers loads the export as the same class). OUTPUT_DIR is claimed first, as a training run
// claims its directory (made, its .lock held: checkpoint.h's dir_claim), so that no run writes into it meanwhile
// and no export replaces a running training's directory. Everything is written into OUTPUT_DIR.tmp-XXXXXX and
// exchanged with OUTPUT_DIR at the end in one step (dir_replace), the previous contents then removed; a failure
// removes the temporary directory, so OUTPUT_DIR is either complete or absent (or, with --overwrite, the
// previous one untouched). A process killed outright leaves OUTPUT_DIR.tmp-XXXXXX behind, never a partial
// OUTPUT_DIR.
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <sys/stat.h>
#include <cjson/cJSON.h>

#include "fp8.h"
#include "lora.h"
#include "model.h"
#include "io/options.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"  // dir_claim, dir_replace

// ----------------------------------------------------------------------------
// options

typedef struct {
    const char *model, *lora, *output_dir, *dtype, *max_shard_size;
    int overwrite, allow_other_base;
} ExportOpts;

#define OFF(f) offsetof(ExportOpts, f)
static const Option OPTIONS[] = {
    {.name = "what to export", .kind = OPT_SECTION},
    {"model", OPT_STRING, OFF(model), .meta = "DIR", .unset = "with --lora: the base its adapter_config.json names, else required",
     .help = "the base (or fully fine-tuned) Hugging Face checkpoint directory"},
    {"lora", OPT_STRING, OFF(lora), .meta = "DIR", .help = "a PEFT LoRA adapter to merge into it (e.g. train_grpo's checkpoint-N)"},
    {"allow_other_base", OPT_FLAG, OFF(allow_other_base),
     .help = "merge --lora into a --model other than the base it was trained on (its weights' fingerprint differs)"},
    {.name = "output", .kind = OPT_SECTION},
    {"output_dir", OPT_STRING, OFF(output_dir), .meta = "DIR", .unset = "none, it is required",
     .help = "where the merged checkpoint goes (must not exist or be empty, unless --overwrite)"},
    {"dtype", OPT_CHOICE, OFF(dtype), .choices = "bf16|fp8|fp32", .dflt = "bf16",
     .help = "bf16: every tensor BF16; fp8: the projections E4M3 with 128x128 block scales, the rest BF16; fp32: every "
             "tensor fp32 (the merge whole: an adapter's change is often below BF16's resolution)"},
    {"max_shard_size", OPT_STRING, OFF(max_shard_size), .dflt = "5GB", .meta = "SIZE",
     .help = "largest safetensors file before sharding, as transformers reads it: 5GB = 5e9 bytes, 4GiB, 500MB, 1000000"},
    {"overwrite", OPT_FLAG, OFF(overwrite), .help = "replace a non-empty --output_dir (only once the new one is complete)"},
};
#define N_OPTIONS ((int)(sizeof OPTIONS / sizeof OPTIONS[0]))

// "5GB" -> 5e9: transformers' convert_file_size_to_int (KB/MB/GB are powers of 10, KiB/MiB/GiB of 2)
static size_t parse_size(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    static const struct { const char *unit; double mult; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
    };
    if (end != s && !errno && v > 0)
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (!strcmp(end, units[i].unit) && v * units[i].mult >= 1 && v * units[i].mult < 1e18)
                return (size_t)(v * units[i].mult);
    die("--max_shard_size: '%s' is not a size: give bytes or a number with KB, MB, GB, KiB, MiB or GiB (e.g. 5GB)", s);
}

static int dir_is_empty(const char *path) {  // but for our lock
    DIR *d = opendir(path);
    if (!d) die("--output_dir %s: cannot read it (%s)", path, strerror(errno));
    struct dirent *e;
    int empty = 1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, ".lock")) empty = 0;
    closedir(d);
    return empty;
}

// Every output problem before any work: the directory (claimed: made, locked) and what replacing it would mean
static void check_output(const ExportOpts *o) {
    struct stat sb;
    if (stat(o->output_dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode)) die("--output_dir %s exists and is not a directory: choose another path", o->output_dir);
        char a[PATH_MAX], b[PATH_MAX];
        const char *inputs[2] = {o->model, o->lora};
        for (int i = 0; i < 2; i++)
            if (inputs[i] && realpath(o->output_dir, a) && realpath(inputs[i], b) && !strcmp(a, b))
                die("--output_dir %s is the checkpoint being read (--%s): write the export elsewhere", o->output_dir,
                    i ? "lora" : "model");
    }
    dir_claim(o->output_dir, 0);
    if (!o->overwrite && !dir_is_empty(o->output_dir))
        die("--output_dir %s exists and is not empty: choose another path, or pass --overwrite to replace it", o->output_dir);
}

static void parse_options(int argc, char **argv, ExportOpts *o) {
    memset(o, 0, sizeof *o);
    OptionTable t = {.usage = "usage: ./export --model DIR [--lora ADAPTER] --output_dir DIR [--dtype bf16|fp8|fp32] [--name value ...]\n"
                              "'-' and '_' are the same in names; a flag alone means true.",
                     .rows = OPTIONS, .n = N_OPTIONS, .base = o};
    options_parse(&t, argc, argv);
    if (!o->model && o->lora) o->model = lora_base_dir(o->lora);
    if (!o->model) die("--model DIR is required (see --help)");
    if (!o->output_dir) die("--output_dir DIR is required (see --help)");
    static char out[PATH_MAX];  // without trailing '/': DIR.tmp-XXXXXX must lie beside DIR, not in it
    int k = snprintf(out, sizeof out, "%s", o->output_dir);
    if (k < 0 || (size_t)k >= sizeof out - 16) die("--output_dir: path too long");
    while (k > 1 && out[k - 1] == '/') out[--k] = 0;
    o->output_dir = out;
    parse_size(o->max_shard_size);
    check_output(o);
}

// ----------------------------------------------------------------------------
// the temporary directory: removed by exit() (die() too) until it has been renamed

static char tmp_dir[PATH_MAX];

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }
static void remove_tree(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }
static void remove_tmp_dir(void) {
    if (tmp_dir[0]) remove_tree(tmp_dir);
}

// ----------------------------------------------------------------------------
// merging and rounding

// x (fp64) to the nearest BF16, rounded once. Through fp32 with round-to-odd (an inexact result gets
// an odd last bit, a sticky bit) and then to nearest even: fp32 has 16 more bits than BF16, enough for
// the second rounding to equal the direct one (Boldo and Melquiond). (float)x alone would round twice.
static uint16_t f64_to_bf16(double x) {
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((double)f != x && isfinite(f) && !(u & 1)) {
        f = nextafterf(f, (float)(x > f ? INFINITY : -INFINITY));  // the odd neighbour on x's side
        if (isinf(f)) f = (float)x;
    }
    return f32_to_bf16(f);
}

// A merged weight's parts (a projection's, or Qwen3 MoE expert e's gate, up or down): W (rows, cols) fp32 as
// loaded; the adapter's fp32 masters, row r of B at B + r * ldb, its k-th value at stride kst, A's row k at
// A + k * cols (NULL: no adapter)
typedef struct {
    const QWeight *w;
    const float *A, *B;
    size_t ldb, kst;
} MergeParts;

static MergeParts merge_parts(const Model *m, const HFTensor *h) {
    const LoRA *lo = m->lora;
    const LayerWeights *lw = &m->w.layers[h->layer];
    if (h->expert < 0) {  // a projection: A (r, cols), B (rows, r)
        int k = h->layer * LIN_COUNT + h->which;
        return (MergeParts){&lw->lin[h->which], lo ? (const float *)lo->A[k] : NULL, lo ? (const float *)lo->B[k] : NULL,
                            lo ? lo->r : 0, 1};
    }
    // an expert's weight: PEFT's layout (ExpertLoRA, backend.h), gate and up the two halves of gate_up's B
    int e = h->expert / 3, kind = h->expert % 3, j = kind == 2, E = m->cfg.E;
    MergeParts p = {&lw->experts[h->expert], NULL, NULL, 0, 0};
    if (!lo || !lo->eA[2 * h->layer + j]) return p;
    p.A = (const float *)lo->eA[2 * h->layer + j] + (size_t)e * lo->r * p.w->cols;
    p.B = (const float *)lo->eB[2 * h->layer + j] + (kind == 1 ? (size_t)m->cfg.FFe * lo->r * E : 0) + e;
    p.ldb = (size_t)lo->r * E, p.kst = E;
    return p;
}

// The merged weight h: W + (alpha / r) B A in fp64 (merge_parts). out (rows, cols) fp64.
static void merge_weight(double *out, const Model *m, const MergeParts *p) {
    const float *W = (const float *)p->w->dense;
    size_t n = (size_t)p->w->rows * p->w->cols;
    const LoRA *lo = m->lora;
    if (!p->A) {
        for (size_t i = 0; i < n; i++) out[i] = W[i];
        return;
    }
    double s = (double)lo->alpha / lo->r;
    int R = lo->r, cols = p->w->cols;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < p->w->rows; r++)
        for (int c = 0; c < cols; c++) {
            double d = 0;
            for (int k = 0; k < R; k++) d += (double)p->B[r * p->ldb + k * p->kst] * p->A[(size_t)k * cols + c];
            out[(size_t)r * cols + c] = W[(size_t)r * cols + c] + s * d;
        }
}

// ----------------------------------------------------------------------------
// the tensors to write: each model tensor, and for FP8 each projection's scales after its codes

typedef struct {
    const HFTensor *src;
    const STensor *raw;  // or a tensor of the base the model does not read, copied as it is (vision tower, projector)
    int scales;        // 1: the weight_scale_inv of the FP8 tensor written just before
    char name[112];
    DType dtype;
    int64_t shape[ST_MAX_DIMS];
    int ndim;
    size_t bytes;
    int shard;
} OutTensor;

// Whether a (rows, cols) weight can be written as FP8 blocks that its readers read as they were made.
// transformers' FineGrainedFP8 takes a weight (N, K) with weight_scale_inv (gn, gk) as blocks of
// N / gn x K / gk (and refuses the weight when those do not divide: "not divisible by scale grid"), vLLM
// wants multiples of 128; our scales are of 128x128 tiles, the last one partial. The two agree when
// each side is a multiple of 128, or at most 128 (one tile, the side itself). Any other side (576 =
// 4.5 x 128; 160) would be read with the wrong scales or refused: such a projection goes out in BF16.
static int fp8_whole_blocks(int64_t rows, int64_t cols) {
    return (rows % FP8_BLOCK_SIZE == 0 || rows <= FP8_BLOCK_SIZE) && (cols % FP8_BLOCK_SIZE == 0 || cols <= FP8_BLOCK_SIZE);
}
static int written_fp8(const HFTensor *h, int fp8) { return fp8 && h->lin && fp8_whole_blocks(h->rows, h->cols); }

// the model's tensors (h), then the base's that the model does not read (st: a multimodal Gemma 3's vision
// tower and projector, NULL: none)
static int plan_tensors(const HFTensor *h, int nh, const SafeTensors *st, int fp8, int fp32, OutTensor *out) {
    int n = 0;
    for (int i = 0; st && i < st->n; i++) {
        if (!hf_vision_tensor(st->t[i].name)) continue;
        OutTensor t = {.raw = &st->t[i], .dtype = st->t[i].dtype, .ndim = st->t[i].ndim, .bytes = st->t[i].nbytes};
        if (snprintf(t.name, sizeof t.name, "%s", st->t[i].name) >= (int)sizeof t.name)
            die("tensor name %.60s... is longer than %d characters", st->t[i].name, (int)sizeof t.name - 1);
        memcpy(t.shape, st->t[i].shape, sizeof t.shape);
        if (out) out[n] = t;
        n++;
    }
    for (int i = 0; i < nh; i++) {
        OutTensor t = {&h[i], NULL, 0, "", fp32 ? DT_F32 : DT_BF16, {h[i].rows, h[i].cols}, h[i].cols ? 2 : 1, 0, 0};
        snprintf(t.name, sizeof t.name, "%s", h[i].name);
        if (written_fp8(&h[i], fp8)) t.dtype = DT_E4M3;
        t.bytes = (size_t)h[i].rows * (h[i].cols ? h[i].cols : 1) * dtype_size(t.dtype);
        if (out) out[n] = t;
        n++;
        if (written_fp8(&h[i], fp8)) {  // HF's weight_scale_inv: (ceil(rows / 128), ceil(cols / 128)) fp32
            OutTensor s = t;
            s.scales = 1;
            s.dtype = DT_F32;
            snprintf(s.name, sizeof s.name, "%s_scale_inv", h[i].name);
            s.shape[0] = (h[i].rows + FP8_BLOCK_SIZE - 1) / FP8_BLOCK_SIZE;
            s.shape[1] = (h[i].cols + FP8_BLOCK_SIZE - 1) / FP8_BLOCK_SIZE;
            s.bytes = (size_t)s.shape[0] * s.shape[1] * sizeof(float);
            if (out) out[n] = s;
            n++;
        }
    }
    return n;
}

// The shards as huggingface_hub's split_state_dict_into_shards makes them: tensors in order, a new shard
// when the next tensor would take the current one past the limit (a tensor larger than the limit
// alone). An FP8 weight and its scales stay together: a reader may look for the scales beside it.
static int plan_shards(OutTensor *t, int n, size_t max_bytes) {
    int shard = 0;
    size_t cur = 0;
    for (int i = 0; i < n; i++) {
        size_t b = t[i].bytes + (i + 1 < n && t[i + 1].scales ? t[i + 1].bytes : 0);
        if (t[i].scales) {
            t[i].shard = shard;
            continue;
        }
        if (cur > 0 && cur + b > max_bytes) shard++, cur = 0;
        t[i].shard = shard;
        cur += b;
    }
    return shard + 1;
}

// How much of the adapter's change survives the output dtype: over every merged weight, the change
// d = (alpha / r) B A and the error of what the file shows of it, (written merge) - (the base's weight
// in the same dtype) - d. A change below the dtype's resolution at a weight is lost. Kept apart for
// the projections written as BF16 or fp32 ([0]) and as FP8 codes ([1]: each dequantized with its
// block's scale, the base's quantized as --load_in_fp8 block would).
static struct {
    double change2, err2;
    int n;  // projections the adapter changes
} kept[2];

// kept[1]'s share of one projection: q the merge's codes, W (rows, cols) the base's weight, x the merge
static void kept_fp8(const FP8Tensor *q, const float *W, const double *x, size_t n) {
    FP8Tensor qb;
    fp8_tensor_alloc_cpu(&qb, q->rows, q->cols, FP8_BLOCK, FP8_E4M3, FP8_BLOCK_SIZE);
    fp8_quantize_cpu(&qb, W, 0);
    float *v = (float *)mallocCheck(n * sizeof(float)), *vb = (float *)mallocCheck(n * sizeof(float));
    fp8_dequantize_cpu(v, q);
    fp8_dequantize_cpu(vb, &qb);
    for (size_t i = 0; i < n; i++) {
        double d = x[i] - W[i], e = (double)v[i] - vb[i] - d;
        kept[1].change2 += d * d, kept[1].err2 += e * e;
    }
    free(v), free(vb);
    fp8_tensor_free_cpu(&qb);
}

// One tensor's bytes as written (malloc'ed). FP8 codes also return their scales in *scales_out
// (HF's (br, bc) layout, malloc'ed) for the scales tensor that follows.
static void *tensor_bytes(const Model *m, const OutTensor *t, float **scales_out) {
    if (t->raw) return memcpy(mallocCheck(t->bytes), t->raw->data, t->bytes);
    const HFTensor *h = t->src;
    size_t n = (size_t)h->rows * (h->cols ? h->cols : 1);
    if (t->scales) {
        void *s = *scales_out;
        *scales_out = NULL;
        return s;
    }
    if (!h->lin && h->expert < 0 && t->dtype == DT_F32) return memcpy(mallocCheck(n * 4), h->dense, n * 4);
    if (!h->lin && h->expert < 0) {  // embeddings, norms, biases: fp32 as loaded, rounded to BF16
        uint16_t *b = (uint16_t *)mallocCheck(n * 2);
        for (size_t i = 0; i < n; i++) b[i] = f32_to_bf16(((const float *)h->dense)[i]);
        return b;
    }
    double *x = (double *)mallocCheck(n * sizeof(double));
    MergeParts parts = merge_parts(m, h);  // (a projection, or an expert's weight)
    merge_weight(x, m, &parts);
    const float *W = (const float *)parts.w->dense;
    int adapted = parts.A != NULL;
    kept[t->dtype == DT_E4M3].n += adapted;
    void *out;
    if (t->dtype == DT_E4M3) {
        float *f = (float *)mallocCheck(n * sizeof(float));
        for (size_t i = 0; i < n; i++) f[i] = (float)x[i];
        FP8Tensor q;
        fp8_tensor_alloc_cpu(&q, (int)h->rows, (int)h->cols, FP8_BLOCK, FP8_E4M3, FP8_BLOCK_SIZE);
        fp8_quantize_cpu(&q, f, 0);
        // fp8.h pads each row of block scales to a multiple of 4 (cuBLASLt's layout); HF's has no padding
        int br = (q.rows + FP8_BLOCK_SIZE - 1) / FP8_BLOCK_SIZE, bc = (q.cols + FP8_BLOCK_SIZE - 1) / FP8_BLOCK_SIZE;
        int ld = fp8_scale_ld(FP8_BLOCK, q.rows, q.cols, FP8_BLOCK_SIZE);
        float *s = (float *)mallocCheck((size_t)br * bc * sizeof(float));
        for (int r = 0; r < br; r++) memcpy(s + (size_t)r * bc, q.scale + (size_t)r * ld, bc * sizeof(float));
        if (adapted) kept_fp8(&q, W, x, n);
        out = q.data;  // the codes, (rows, cols) row-major as HF stores them
        free(q.scale);
        free(f);
        *scales_out = s;
    } else {
        int f32 = t->dtype == DT_F32;
        out = mallocCheck(n * (f32 ? 4 : 2));
        for (size_t i = 0; i < n; i++) {
            double v, vb, d = x[i] - W[i];
            if (f32) v = ((float *)out)[i] = (float)x[i], vb = W[i];
            else {
                uint16_t b = ((uint16_t *)out)[i] = f64_to_bf16(x[i]);
                v = bf16_to_f32(b), vb = bf16_to_f32(f32_to_bf16(W[i]));
            }
            kept[0].change2 += d * d, kept[0].err2 += (v - vb - d) * (v - vb - d);
        }
    }
    free(x);
    return out;
}

// One line per kind of projection the adapter changed (rounded: "BF16" or "fp32"; FP8 codes): how far
// what the file holds of the change is from it, and what keeps it where much is lost
static void report_kept(const char *rounded) {
    for (int k = 0; k < 2; k++) {
        if (kept[k].change2 <= 0) continue;
        const char *dt = k ? "FP8" : rounded;
        double e = sqrt(kept[k].err2 / kept[k].change2);
        char file[96], lost[200] = "";
        if (kept[!k].n) snprintf(file, sizeof file, "exported file holds it in the %d projections written as %s", kept[k].n, dt);
        else snprintf(file, sizeof file, "%s file holds it", dt);
        if (e > 0.1)
            snprintf(lost, sizeof lost, ": much of it is below %s's resolution at these weights, and lost; --dtype fp32 keeps it "
                     "(or serve the base with the adapter unmerged)", dt);
        fprintf(stderr, "merge: the adapter's change to the weights, as the %s, is off by %.3g of its size (relative L2)%s\n",
                file, e, lost);
    }
}

static void shard_name(char *out, size_t cap, int shard, int nshards) {
    if (nshards == 1) snprintf(out, cap, "model.safetensors");
    else snprintf(out, cap, "model-%05d-of-%05d.safetensors", shard + 1, nshards);
}

// the weights: each shard converted and written in turn (one shard's bytes in memory at a time)
static void write_weights(const Model *m, OutTensor *t, int n, int nshards, const char *dir) {
    STWrite *w = (STWrite *)mallocCheck(n * sizeof(STWrite));
    void **bufs = (void **)mallocCheck(n * sizeof(void *));
    size_t total = 0;
    for (int s = 0, i = 0; s < nshards; s++) {
        int k = 0;
        float *scales = NULL;
        for (; i < n && t[i].shard == s; i++, k++) {
            bufs[k] = tensor_bytes(m, &t[i], &scales);
            w[k] = (STWrite){t[i].name, t[i].dtype, t[i].ndim, {0}, bufs[k]};
            memcpy(w[k].shape, t[i].shape, sizeof w[k].shape);
            total += t[i].bytes;
        }
        char name[64], p[4096];
        shard_name(name, sizeof name, s, nshards);
        path_join(p, sizeof p, dir, name);
        st_write(p, w, k, "{\"format\":\"pt\"}");
        for (int j = 0; j < k; j++) free(bufs[j]);
    }
    free(w);
    free(bufs);
    if (nshards == 1) return;
    // model.safetensors.index.json: total_size (bytes of tensor data) and weight_map, as save_pretrained
    // writes them (the map sorted by name)
    int *order = (int *)mallocCheck(n * sizeof(int));
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 1; i < n; i++)  // insertion sort by name (hundreds of names)
        for (int j = i; j > 0 && strcmp(t[order[j - 1]].name, t[order[j]].name) > 0; j--) {
            int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    cJSON *root = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(root, "metadata");
    cJSON_AddNumberToObject(md, "total_size", (double)total);
    cJSON *wm = cJSON_AddObjectToObject(root, "weight_map");
    for (int i = 0; i < n; i++) {
        char name[64];
        shard_name(name, sizeof name, t[order[i]].shard, nshards);
        cJSON_AddStringToObject(wm, t[order[i]].name, name);
    }
    free(order);
    char *text = cJSON_Print(root), p[4096];
    cJSON_Delete(root);
    path_join(p, sizeof p, dir, "model.safetensors.index.json");
    write_file_atomic(p, text, strlen(text));
    free(text);
}

// ----------------------------------------------------------------------------
// config.json and the tokenizer files

// The base's config.json with the new dtype; the FP8 export's quantization_config, and which reader
// reads which field:
//   quant_method "fp8"        vLLM Fp8Config.from_config: "fp8" in quant_method means the checkpoint holds
//                             FP8 (is_checkpoint_fp8_serialized); transformers picks FineGrainedFP8Config
//   activation_scheme         both: "dynamic" (per-token 1x128 scales computed at run time) is the only one
//                             either accepts with block weights
//   weight_block_size         both: [128, 128] makes vLLM create weight_scale_inv (ceil(N/128), ceil(K/128))
//                             fp32 for each linear layer, and transformers' FP8Linear the same
//   fmt "e4m3"                read by neither (DeepSeek-V3 and Qwen3-FP8 write it): says the codes' format
//   modules_to_not_convert    transformers (vLLM reads it when ignored_layers is absent): lm_head stays BF16,
//                             and the projections written in BF16 (fp8_whole_blocks), by their module names;
//                             the embeddings and norms are no linear layers, so neither quantizes them.
//                             With no projection left in FP8 there is no quantization_config at all.
// vLLM also needs every part of a fused projection (q, k, v; gate, up) to be a multiple of 128 rows
// (validate_fp8_block_shape): true of real checkpoints (KV heads of 128), not of the tiny fixtures.
static void write_config(const char *model_dir, const char *dir, int fp8, int fp32, const HFTensor *h, int nh, int mm) {
    int nfp8 = 0;
    for (int i = 0; i < nh; i++) nfp8 += written_fp8(&h[i], fp8);
    char p[4096];
    path_join(p, sizeof p, model_dir, "config.json");
    cJSON *r = read_json_object(p);
    const char *dt = fp32 ? "float32" : "bfloat16";
    cJSON_DeleteItemFromObjectCaseSensitive(r, "torch_dtype");
    cJSON_AddStringToObject(r, "torch_dtype", dt);
    if (cJSON_GetObjectItemCaseSensitive(r, "dtype")) {  // transformers 5.x writes "dtype"
        cJSON_DeleteItemFromObjectCaseSensitive(r, "dtype");
        cJSON_AddStringToObject(r, "dtype", dt);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(r, "quantization_config");  // an FP8 base's, now stale
    if (nfp8) {
        cJSON *q = cJSON_AddObjectToObject(r, "quantization_config");
        cJSON_AddStringToObject(q, "quant_method", "fp8");
        cJSON_AddStringToObject(q, "fmt", "e4m3");
        cJSON_AddStringToObject(q, "activation_scheme", "dynamic");
        cJSON *b = cJSON_AddArrayToObject(q, "weight_block_size");
        cJSON_AddItemToArray(b, cJSON_CreateNumber(FP8_BLOCK_SIZE));
        cJSON_AddItemToArray(b, cJSON_CreateNumber(FP8_BLOCK_SIZE));
        cJSON *skip = cJSON_AddArrayToObject(q, "modules_to_not_convert");
        cJSON_AddItemToArray(skip, cJSON_CreateString("lm_head"));
        if (mm) {  // a multimodal Gemma 3's vision tower and projector, copied as they were (BF16)
            cJSON_AddItemToArray(skip, cJSON_CreateString("vision_tower"));
            cJSON_AddItemToArray(skip, cJSON_CreateString("multi_modal_projector"));
        }
        for (int i = 0; i < nh; i++)
            if (h[i].lin && !written_fp8(&h[i], fp8)) {  // "model.layers.0.mlp.gate_proj", without ".weight"
                char mod[96];
                snprintf(mod, sizeof mod, "%.*s", (int)(strlen(h[i].name) - strlen(".weight")), h[i].name);
                cJSON_AddItemToArray(skip, cJSON_CreateString(mod));
            }
    }
    char *text = cJSON_Print(r);
    cJSON_Delete(r);
    path_join(p, sizeof p, dir, "config.json");
    write_file_atomic(p, text, strlen(text));
    free(text);
}

// what transformers' AutoTokenizer and GenerationConfig read beside the weights
static const char *const TOKENIZER_FILES[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json", "chat_template.jinja",
    "chat_template.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
};

static void copy_tokenizer_files(const char *model_dir, const char *dir) {
    for (size_t i = 0; i < sizeof TOKENIZER_FILES / sizeof TOKENIZER_FILES[0]; i++) {
        char src[4096], dst[4096];
        path_join(src, sizeof src, model_dir, TOKENIZER_FILES[i]);
        struct stat sb;
        if (lstat(src, &sb) != 0) continue;  // absent: the checkpoint does not have it
        if (!file_exists(src)) die("%s: not a regular file (or a link to none): remove it or replace it with the file", src);
        size_t n;
        char *data = read_file(src, &n);
        path_join(dst, sizeof dst, dir, TOKENIZER_FILES[i]);
        write_file_atomic(dst, data, n);
        free(data);
    }
}

// ----------------------------------------------------------------------------

int main(int argc, char **argv) {
    ExportOpts o;
    parse_options(argc, argv, &o);
    int fp8 = !strcmp(o.dtype, "fp8"), fp32 = !strcmp(o.dtype, "fp32");
    size_t max_shard = parse_size(o.max_shard_size);

    // the base in fp32 on the host, linear weights unquantized (an FP8 base dequantized); the adapter's
    // fp32 masters. Both loaders check everything before anything is written.
    const Backend *be = backend_cpu();
    ModelOptions mo = {FP8_OFF, 0, 0, 0, 0};
    Model m;
    if (o.lora) lora_check_base(o.lora, o.model, o.allow_other_base);
    model_load(&m, o.model, be, &mo);
    if (o.lora) m.lora = lora_load_peft(&m, o.lora);
    if (fp8 && m.cfg.E)
        die("--dtype fp8 writes the projections in FP8 but not a qwen3_moe model's experts, which it does not do yet: "
            "use --dtype bf16");

    int nh = model_hf_tensors(&m, NULL);
    HFTensor *h = (HFTensor *)mallocCheck(nh * sizeof(HFTensor));
    model_hf_tensors(&m, h);
    SafeTensors base;  // a multimodal Gemma 3's vision tower and projector, written back as they are
    if (m.cfg.mm) st_open_dir(&base, o.model);
    const SafeTensors *vision = m.cfg.mm ? &base : NULL;
    int n = plan_tensors(h, nh, vision, fp8, fp32, NULL);
    OutTensor *t = (OutTensor *)mallocCheck(n * sizeof(OutTensor));
    plan_tensors(h, nh, vision, fp8, fp32, t);
    int nshards = plan_shards(t, n, max_shard);

    snprintf(tmp_dir, sizeof tmp_dir, "%s.tmp-XXXXXX", o.output_dir);
    if (!mkdtemp(tmp_dir)) {
        int e = errno;
        tmp_dir[0] = 0;
        die("--output_dir %s: cannot create a directory beside it (%s): does its parent exist and is it writable?",
            o.output_dir, strerror(e));
    }
    atexit(remove_tmp_dir);
    chmod(tmp_dir, 0755);  // mkdtemp makes it 0700: the export is meant to be read by others (a server)

    write_weights(&m, t, n, nshards, tmp_dir);
    write_config(o.model, tmp_dir, fp8, fp32, h, nh, m.cfg.mm != MM_NONE);
    copy_tokenizer_files(o.model, tmp_dir);

    // into place, OUTPUT_DIR's lock held throughout; what it held before removed
    dir_replace(o.output_dir, tmp_dir);
    tmp_dir[0] = 0;

    size_t total = 0;
    for (int i = 0; i < n; i++) total += t[i].bytes;
    int nlin = 0, nbf16 = 0, ex = -1;  // projections, those written in BF16 under --dtype fp8, the first of them
    for (int i = 0; i < nh; i++)
        if (h[i].lin) {
            nlin++;
            if (fp8 && !written_fp8(&h[i], fp8) && nbf16++ == 0) ex = i;
        }
    fprintf(stderr, "wrote %s: %s, %d tensors, %.1f MB in %d file%s%s%s\n", o.output_dir,
            fp8 && nbf16 < nlin ? "FP8 E4M3 projections with 128x128 block scales, the rest BF16" : fp32 ? "fp32" : "BF16", n,
            total / 1e6, nshards, nshards > 1 ? "s + model.safetensors.index.json" : "", o.lora ? ", adapter merged" : "",
            vision ? "; the vision tower and projector copied from the base as they are (Gemma3ForConditionalGeneration)" : "");
    if (nbf16)
        fprintf(stderr, "fp8: %d of %d projections written in BF16, their shapes not whole 128x128 blocks (e.g. %s, %lld x "
                "%lld), which transformers' and vLLM's FP8 loaders need; %s\n", nbf16, nlin, h[ex].name,
                (long long)h[ex].rows, (long long)h[ex].cols,
                nbf16 < nlin ? "they are listed in quantization_config.modules_to_not_convert"
                             : "none is left in FP8, so the checkpoint is plain BF16 (no quantization_config)");
    if (o.lora) report_kept(fp32 ? "fp32" : "BF16");
    free(t);
    free(h);
    if (vision) st_close(&base);
    if (m.lora) lora_free(m.lora);
    model_free(&m);
    return 0;
}
