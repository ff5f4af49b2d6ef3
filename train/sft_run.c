// sft_run.c: the run ./train_sft and ./train_dpo share (sft_run.h says what): the options, the output
// directory, the data, the model and what is trained, checkpoints, the metrics and the plot.
#include <math.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "dist/data_parallel.h"
#include "io/options.h"
#include "io/plot.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/builtin.h"
#include "train/dpo_train.h"
#include "train/optim.h"
#include "train/sft.h"
#include "train/sft_run.h"

// ----------------------------------------------------------------------------
// options: one table (options.h)


#define OFF(f) offsetof(SftOpts, f)
static const Option OPTIONS[] = {
    {.name = "model and data", .kind = OPT_SECTION},
    {"model", OPT_STRING, OFF(model), .meta = "DIR", .unset = "required",
     .help = "Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json)"},
    {"data", OPT_STRING, OFF(data), .meta = "FILE", .unset = "required",
     .help = "JSONL, one example per line: {\"prompt\", \"completion\"} as text or as chat messages, or {\"messages\"} "
             "(" JSONL_LIMITS ")"},
    {"max_length", OPT_INT, OFF(max_length), 2, 1e7, .dflt = "1024",
     .help = "tokens kept per example, prompt + completion (the start is kept; at most the model's max_position_embeddings)"},
    {"chat", OPT_INT, OFF(chat), -1, 1, .dflt = "-1",
     .help = "prompts in the chat template: -1 when the tokenizer has one, 0 raw text, 1 always"},
    {"system_prompt", OPT_TEXT, OFF(system_prompt), .help = "system message of the examples that have none (chat template only)"},
    {"device", OPT_CHOICE, OFF(device), .choices = "auto|cpu|cuda", .dflt = "auto", .help = "auto: the GPU when usable, else the CPU"},
    {"seed", OPT_LONG, OFF(seed), 0, 9e18, .dflt = "42", .help = "seed of the data order (a shuffle per epoch) and the LoRA init"},

    {.name = "training (TRL's SFTConfig names)", .kind = OPT_SECTION},
    {"num_train_epochs", OPT_DOUBLE, OFF(num_train_epochs), 1e-9, 1e6, .dflt = "3", .help = "passes over the data (when no --max_steps)"},
    {"max_steps", OPT_INT, OFF(max_steps), -1, 1e9, .dflt = "-1", .help = "optimizer steps in all (-1: from num_train_epochs)"},
    {"per_device_train_batch_size", OPT_INT, OFF(per_device_train_batch_size), 1, 1e6, .dflt = "8",
     .help = "examples per forward/backward (a micro-batch, right-padded to its longest)"},
    {"gradient_accumulation_steps", OPT_INT, OFF(gradient_accumulation_steps), 1, 1e6, .dflt = "1",
     .help = "micro-batches per optimizer step (the loss: the mean over all their completion tokens)"},
    {"learning_rate", OPT_DOUBLE, OFF(learning_rate), 0, 1, .dflt = "2e-5", .help = "peak learning rate"},
    {"lr_scheduler_type", OPT_CHOICE, OFF(lr_scheduler_type), .choices = "linear|cosine|constant", .dflt = "linear",
     .help = "the learning rate after the warm-up: down to 0 linearly or as a cosine, or constant"},
    {"warmup_ratio", OPT_DOUBLE, OFF(warmup_ratio), 0, 1, .dflt = "0", .help = "share of the steps that ramp the learning rate up"},
    {"weight_decay", OPT_DOUBLE, OFF(weight_decay), 0, 1, .dflt = "0", .help = "decoupled weight decay (AdamW)"},
    {"adam_beta1", OPT_DOUBLE, OFF(adam_beta1), 0, 0.999999, .dflt = "0.9", .help = "AdamW beta1"},
    {"adam_beta2", OPT_DOUBLE, OFF(adam_beta2), 0, 0.999999999, .dflt = "0.999", .help = "AdamW beta2"},
    {"adam_epsilon", OPT_DOUBLE, OFF(adam_epsilon), 1e-30, 1, .dflt = "1e-8", .help = "AdamW epsilon"},
    {"adam_moments", OPT_CHOICE, OFF(adam_moments), .choices = "fp32|bf16", .dflt = "fp32",
     .help = "training every weight: AdamW's two moments in fp32, or in bf16 rounded stochastically (DeepSeek-V3's; 4 "
             "bytes a parameter less)"},
    {"max_grad_norm", OPT_DOUBLE, OFF(max_grad_norm), 0, 1e9, .dflt = "1", .help = "clip the global gradient norm to this (0: off)"},
    {"gradient_checkpointing", OPT_FLAG, OFF(gradient_checkpointing), .help = "recompute each layer in the backward (less memory)"},
    {"recompute_mlp", OPT_FLAG, OFF(recompute_mlp),
     .help = "recompute the MLP's gate and up products in the backward instead of saving them (2 x intermediate_size values a "
             "token a layer less, for two products more)"},

    {.name = "what is trained", .kind = OPT_SECTION},
    {"use_peft", OPT_FLAG, OFF(use_peft), .help = "train a LoRA adapter on the frozen weights (else every weight, fp32 masters)"},
    {"lora_r", OPT_INT, OFF(lora_r), 1, 4096, .dflt = "16", .help = "LoRA rank (with --use_peft)"},
    {"lora_alpha", OPT_DOUBLE, OFF(lora_alpha), 1e-6, 1e6, .dflt = "32", .help = "LoRA scale alpha / r (with --use_peft)"},
    {"lora_target_modules", OPT_STRING, OFF(lora_target_modules), .meta = "LIST", .dflt = "all",
     .help = "comma list of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj, or all (with --use_peft)"},
    {"lora_target_parameters", OPT_STRING, OFF(lora_target_parameters), .meta = "LIST", .dflt = "",
     .help = "PEFT's target_parameters: mlp.experts.gate_up_proj,mlp.experts.down_proj puts LoRA on Qwen3 MoE's "
             "experts too (with --use_peft; --device cpu)"},
    {"load_in_fp8", OPT_CHOICE, OFF(load_in_fp8), .choices = "block|row|tensor|off", .dflt = "off",
     .help = "the frozen linear weights in E4M3 (LoRA only: training every weight needs them unquantized, off)"},

    {.name = "FP8 training of every weight (Transformer Engine's names; the GPU, fp8_train.cu)", .kind = OPT_SECTION},
    {"fp8_recipe", OPT_CHOICE, OFF(fp8_recipe), .choices = "off|delayed|current|block", .dflt = "off",
     .help = "each projection's three GEMMs in FP8: delayed (scales from the amax history), current (each tensor's amax "
             "now), block (1x128 and 128x128 groups, DeepSeek-V3); off: BF16"},
    {"fp8_format", OPT_CHOICE, OFF(fp8_format), .choices = "hybrid|e4m3", .dflt = "hybrid",
     .help = "hybrid: E4M3 forward, E5M2 gradients; e4m3: E4M3 everywhere"},
    {"fp8_amax_history_len", OPT_INT, OFF(fp8_amax_history_len), 1, 1 << 20, .dflt = "1024", .help = "delayed: steps of amax history"},
    {"fp8_amax_compute_algo", OPT_CHOICE, OFF(fp8_amax_compute_algo), .choices = "max|most_recent", .dflt = "max",
     .help = "delayed: the scale from the history's max, or from the last step's amax"},
    {"fp8_margin", OPT_DOUBLE, OFF(fp8_margin), 0, 64, .dflt = "0", .help = "scales leave 2^margin of headroom"},
    {"fp8_lm_head", OPT_FLAG, OFF(fp8_lm_head),
     .help = "the LM head's three GEMMs in FP8 too (delayed; the recipes of TE and torchao keep it in BF16 for the loss's "
             "precision: measured against BF16 in dev/notes/fp8-training.md)"},
    {"bf16_first_layers", OPT_INT, OFF(bf16_first_layers), 0, 1 << 20, .dflt = "0", .help = "keep the first N layers in BF16"},
    {"bf16_last_layers", OPT_INT, OFF(bf16_last_layers), 0, 1 << 20, .dflt = "0", .help = "keep the last N layers in BF16"},

    {.name = "logging and checkpoints", .kind = OPT_SECTION},
    {"output_dir", OPT_STRING, OFF(output_dir), .meta = "DIR", .dflt = "out/sft",
     .help = "where metrics.jsonl and checkpoint-N/ go"},
    {"resume", OPT_FLAG, OFF(resume), .help = "continue from the last checkpoint of --output_dir"},
    {"overwrite_output_dir", OPT_FLAG, OFF(overwrite_output_dir), .help = "start over in an --output_dir that holds checkpoints"},
    {"logging_steps", OPT_INT, OFF(logging_steps), 1, 1e9, .dflt = "10",
     .help = "a line (and a metrics.jsonl record) every N steps: the loss is their mean"},
    {"save_steps", OPT_INT, OFF(save_steps), 0, 1e9, .dflt = "500", .help = "checkpoint every N steps (0: only at the end)"},
    {"save_total_limit", OPT_INT, OFF(save_total_limit), 0, 1e9, .unset = "none, every checkpoint is kept",
     .help = "keep only the newest N checkpoints (never the one --resume continued; 0: keep all)"},
    {"quiet", OPT_FLAG, OFF(quiet), .help = "no per-step lines, only the summary"},
    {"eval_data", OPT_STRING, OFF(eval_data), .meta = "FILE", .unset = "none",
     .help = "held-out examples (--data's format): their loss (eval_loss in metrics.jsonl) every --eval_steps and at the end"},
    {"eval_steps", OPT_INT, OFF(eval_steps), 0, 1e9, .dflt = "0", .help = "with --eval_data: evaluate every N steps (0: at the end only)"},

    {.name = "several GPUs (README: Several GPUs)", .kind = OPT_SECTION},
    {"nproc_per_node", OPT_INT, OFF(nproc_per_node), 1, 1024, .unset = "one process, or the ranks torchrun / srun started",
     .help = "start N processes on this machine, one per GPU: each trains per_device_train_batch_size x "
             "gradient_accumulation_steps examples a step, every weight's optimizer state sharded over them"},
};
#define N_OPTIONS ((int)(sizeof OPTIONS / sizeof OPTIONS[0]))

// train_dpo's own rows (TRL's DPOConfig names and defaults, dpo.h), after the shared ones
static const Option DPO_OPTIONS[] = {
    {.name = "DPO (TRL's DPOConfig names; dpo.h has each loss's formula)", .kind = OPT_SECTION},
    {"beta", OPT_DOUBLE, OFF(beta), 1e-9, 1e9, .dflt = "0.1", .help = "how far the policy may move from the reference (ipo: its tau)"},
    {"loss_type", OPT_CHOICE, OFF(loss_type), .choices = "sigmoid|robust|exo_pair|hinge|ipo|nca_pair|sppo_hard|apo_zero|apo_down|discopop",
     .dflt = "sigmoid", .help = "the preference loss: sigmoid is DPO's"},
    {"label_smoothing", OPT_DOUBLE, OFF(label_smoothing), 0, 0.999999, .dflt = "0",
     .help = "the share of pairs assumed mislabeled (sigmoid: cDPO; robust: below 0.5; exo_pair)"},
    {"reference_free", OPT_FLAG, OFF(reference_free),
     .help = "the loss against a uniform reference (the rewards still against the reference, as TRL's)"},
    {"discopop_tau", OPT_DOUBLE, OFF(discopop_tau), 1e-9, 1e9, .dflt = "0.05", .help = "discopop's temperature"},
    {"precompute_ref_log_probs", OPT_FLAG, OFF(precompute_ref_log_probs),
     .help = "the reference's log-probs once before training (always when training every weight: no frozen copy is kept)"},
    {"max_prompt_length", OPT_INT, OFF(max_prompt_length), 0, 1e7, .dflt = "0",
     .help = "the prompt's last tokens kept (0: all, as TRL 1.16, which has no such option; TRL 0.28's default was 512)"},
    {"max_completion_length", OPT_INT, OFF(max_completion_length), 0, 1e7, .dflt = "0",
     .help = "each completion's first tokens kept, EOS included (0: all; TRL 0.28's option, 1.16 has none)"},
    {"truncation_mode", OPT_CHOICE, OFF(truncation_mode), .choices = "keep_start|keep_end", .dflt = "keep_start",
     .help = "over max_length: keep the sequence's start (the completion's end goes first; TRL 1.16's default) or its end "
             "(the prompt's start goes first; TRL 0.28's default)"},
    {"per_device_eval_batch_size", OPT_INT, OFF(per_device_eval_batch_size), 1, 1e6, .dflt = "8",
     .help = "held-out pairs per forward (--eval_data); the metrics are the means of these batches' means, as TRL's"},
};
#define N_DPO_OPTIONS ((int)(sizeof DPO_OPTIONS / sizeof DPO_OPTIONS[0]))

// train_dpo's defaults: the built-in run's (no --model, no --data), and with --model TRL's DPOConfig's.
// The built-in run's make it show in a minute on a CPU what DPO fixes. loss_type sppo_hard, not
// sigmoid: on these pairs sigmoid DPO raises the chosen answers' probability only relative to the
// rejected ones, both fall, and greedy decoding then finds a third answer (dev/notes/learning-curves.md,
// "DPO on the built-in task, three seeds": 0.651 with sigmoid, 0.899 with sppo_hard);
// sppo_hard pulls each log-ratio to a target of its own, the chosen one up.
static const struct {
    const char *name, *builtin, *trl;
} DPO_DEFAULTS[] = {
    {"use_peft", "true", "false"},     {"load_in_fp8", "block", "off"}, {"loss_type", "sppo_hard", "sigmoid"},
    {"learning_rate", "1e-3", "1e-6"}, {"per_device_train_batch_size", "16", "8"}, {"max_steps", "100", "-1"},
    {"save_steps", "50", "500"},       {"chat", "0", "-1"},  // the warm-up learned raw text
};

// the program's table: train_sft's rows, and for train_dpo its rows after them, with its defaults
// (DPO_DEFAULTS) and the data's words, less the several-GPU rows (DPO runs on one process so far:
// sft_run_options refuses --nproc_per_node in one line)
static int option_rows(int dpo, Option *rows) {
    if (!dpo) {
        memcpy(rows, OPTIONS, sizeof OPTIONS);
        return N_OPTIONS;
    }
    int n = 0;
    for (int i = 0; i < N_OPTIONS; i++)
        if (strcmp(OPTIONS[i].name, "nproc_per_node") && strncmp(OPTIONS[i].name, "several GPUs", 12)) rows[n++] = OPTIONS[i];
    memcpy(rows + n, DPO_OPTIONS, sizeof DPO_OPTIONS);
    n += N_DPO_OPTIONS;
    for (int i = 0; i < n; i++) {
        Option *o = &rows[i];
        if (!o->name || o->kind == OPT_SECTION) continue;
        for (size_t k = 0; k < sizeof DPO_DEFAULTS / sizeof DPO_DEFAULTS[0]; k++)
            if (!strcmp(o->name, DPO_DEFAULTS[k].name)) o->dflt = DPO_DEFAULTS[k].builtin, o->dflt_model = DPO_DEFAULTS[k].trl;
        if (!strcmp(o->name, "model")) o->unset = "the built-in model (./train_grpo's warm-up), with the built-in task";
        if (!strcmp(o->name, "output_dir")) o->dflt = NULL, o->unset = "a new out/dpo-N";
        if (!strcmp(o->name, "data"))
            o->help = "JSONL, one preference pair per line: {\"prompt\", \"chosen\", \"rejected\"} as text or as chat messages "
                      "(" JSONL_LIMITS ")";
        if (!strcmp(o->name, "max_length")) o->help = "tokens kept per sequence, prompt + completion (truncation_mode says which end)";
        if (!strcmp(o->name, "per_device_train_batch_size")) o->help = "pairs per forward/backward (2x that sequences: chosen and rejected)";
        if (!strcmp(o->name, "gradient_accumulation_steps")) o->help = "micro-batches per optimizer step (the loss: the mean over all their pairs)";
        if (!strcmp(o->name, "eval_data"))
            o->help = "held-out pairs (--data's format): TRL's eval_loss, eval_rewards/*, eval_logps/* in metrics.jsonl every "
                      "--eval_steps and at the end";
    }
    return n;
}

// the DPO loss's settings from the options (dpo.h checks them)
static DpoConfig dpo_config_of(const SftOpts *o) {
    DpoConfig c = dpo_config_default();
    c.beta = o->beta, c.loss_type = (DpoLossType)dpo_loss_type_parse(o->loss_type), c.label_smoothing = o->label_smoothing;
    c.reference_free = o->reference_free, c.discopop_tau = o->discopop_tau;
    return c;
}

void sft_run_options(int argc, char **argv, int dpo, SftOpts *o) {
    memset(o, 0, sizeof *o);
    o->dpo = dpo;
    for (int i = 1; o->dpo && i < argc; i++)  // not in its table: "unknown option" would not say why
        if (!strncmp(argv[i], "--nproc_per_node", 16) || !strncmp(argv[i], "--nproc-per-node", 16))
            die("--nproc_per_node: train_dpo runs on one process so far: leave it out");
    static Option rows[N_OPTIONS + N_DPO_OPTIONS];
    OptionTable t = {.usage = o->dpo ? "usage: ./train_dpo [--model DIR --data PAIRS.jsonl] [--name value | --name=value ...]\n"
                                       "Alone: the built-in preference task on the built-in model (README: DPO).\n"
                                       "DPO on preference pairs: every weight (the reference: its log-probs computed before "
                                       "training), or a LoRA adapter with --use_peft (the reference: the adapter off). Names as "
                                       "TRL's; '-' and '_' are the same; a flag alone means true."
                                     : "usage: ./train_sft --model DIR --data FILE.jsonl [--name value | --name=value ...]\n"
                                       "Supervised fine-tuning, the loss on the completion tokens only: every weight, or a LoRA "
                                       "adapter with --use_peft. Names as TRL's; '-' and '_' are the same; a flag alone means true.",
                     .rows = rows, .n = option_rows(o->dpo, rows), .base = o};
    options_parse(&t, argc, argv);
    o->builtin = o->dpo && !options_given(&t, "model") && !options_given(&t, "data");
    o->max_length_given = options_given(&t, "max_length");
    if (o->builtin) o->data = "the built-in arithmetic task";
    if (!o->model && !o->builtin) die("--model is required: a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json)");
    if (!o->data)
        die("--data is required: a JSONL file, one %s per line",
            o->dpo ? "{\"prompt\", \"chosen\", \"rejected\"}" : "{\"prompt\", \"completion\"} or {\"messages\"}");
    if (o->dpo) {
        char err[512];
        DpoConfig c = dpo_config_of(o);
        if (dpo_config_check(&c, err, sizeof err)) die("%s", err);
    }
    if (!o->use_peft && strcmp(o->load_in_fp8, "off"))
        die("--load_in_fp8 %s freezes the linear weights in FP8, but training every weight updates them: use --load_in_fp8 off, "
            "or --use_peft to train a LoRA adapter on the FP8 weights", o->load_in_fp8);
    if (o->resume && o->overwrite_output_dir) die("--resume and --overwrite_output_dir contradict each other");
    if (o->use_peft && strcmp(o->adam_moments, "fp32"))
        die("--adam_moments %s is for training every weight (a LoRA adapter's optimizer state is small): drop it or --use_peft",
            o->adam_moments);
    if (o->use_peft && strcmp(o->fp8_recipe, "off"))
        die("--fp8_recipe %s trains every weight in FP8; with --use_peft the base is frozen: use --load_in_fp8 for an FP8 base "
            "under a LoRA adapter, or drop --use_peft",
            o->fp8_recipe);
    if (o->eval_steps && !o->eval_data) die("--eval_steps %d evaluates --eval_data, which is not given: add --eval_data FILE", o->eval_steps);
    if (o->fp8_lm_head && strcmp(o->fp8_recipe, "delayed"))
        die("--fp8_lm_head runs under --fp8_recipe delayed (got %s): set --fp8_recipe delayed, or drop --fp8_lm_head",
            o->fp8_recipe);
    if (!strcmp(o->device, "cpu") && strcmp(o->fp8_recipe, "off"))
        die("--fp8_recipe %s: FP8 training runs on the GPU (the CPU backend has no FP8 GEMMs): use --device cuda, or --fp8_recipe "
            "off to train in BF16",
            o->fp8_recipe);
}

// the FP8 training recipe of the options (fp8_recipe.h)
static FP8Recipe recipe_of(const SftOpts *o) {
    FP8Recipe r = fp8_recipe_default();
    r.kind = (FP8RecipeKind)fp8_recipe_parse(o->fp8_recipe);
    r.hybrid = fp8_format_hybrid_parse(o->fp8_format);
    r.history_len = o->fp8_amax_history_len;
    r.algo = (AmaxAlgo)amax_algo_parse(o->fp8_amax_compute_algo);
    r.margin = (float)o->fp8_margin;
    r.lm_head = o->fp8_lm_head;
    return r;
}


// ----------------------------------------------------------------------------
// the stages, in the order main() calls them

// the settings a checkpoint must agree with to be resumed: every option but those a resume may change
// (checkpoint.h: run_options_json); the batch is the step's over every rank (train_batch_size), so
// that a run resumes on any number of ranks that splits it; and the fingerprint of the base's
// weights, so that a checkpoint is never continued on another model saved under the same path
static cJSON *run_identity(const SftRun *r) {
    const SftOpts *o = &r->o;
    Option rows[N_OPTIONS + N_DPO_OPTIONS];
    OptionTable t = {.rows = rows, .n = option_rows(o->dpo, rows), .base = (void *)o};
    cJSON *j = run_options_json(&t);
    if (o->dpo) cJSON_AddStringToObject(j, "trainer", "dpo");
    cJSON_AddNumberToObject(j, "train_batch_size", (double)o->per_device_train_batch_size * o->gradient_accumulation_steps * r->world);
    cJSON_AddStringToObject(j, "base_model_fingerprint", r->base_fp);  // the weights of --model (st_fingerprint)
    return j;
}

// train_dpo without --output_dir: a new out/dpo-N each run, claimed (run_dir_claim_new), so that the
// command runs again without losing the last run; --resume: the newest out/dpo-N with a checkpoint
static void new_run_dir(SftRun *r) {
    SftOpts *o = &r->o;
    if (o->resume) {
        int n = newest_numbered("out", "dpo", 1);
        if (n < 0) die("--resume: no out/dpo-N holds a checkpoint: give the run's --output_dir");
        snprintf(r->dir, sizeof r->dir, "out/dpo-%d", n);
    } else {
        run_dir_claim_new("out", "dpo", r->dir, sizeof r->dir);
        r->claimed = 1;
    }
    o->output_dir = r->dir;
}

// Where the run writes, claimed before any work (checkpoint.h: made, locked, checked: a directory
// holding checkpoints needs --resume or --overwrite_output_dir). A resume is checked against its
// checkpoint here too (the settings, the base's weights, the batch), before the data and the model are read.
void sft_run_prepare_output(SftRun *r) {
    const SftOpts *o = &r->o;
    if (r->rank) {  // rank 0 checks; the others need only which checkpoint a resume reads
        dist_broadcast_host(r->dist, &r->last, sizeof r->last, 0);
        return;
    }
    if (!o->output_dir) new_run_dir(r);
    if (r->claimed) r->last = -1;
    else r->last = run_dir_claim(o->output_dir, o->resume, o->overwrite_output_dir);
    path_join(r->metrics, sizeof r->metrics, o->output_dir, "metrics.jsonl");
    st_dir_fingerprint(o->model, r->base_fp);
    if (o->resume) {
        char dir[4300], err[512];
        snprintf(dir, sizeof dir, "%s/checkpoint-%d", o->output_dir, r->last);
        int tbs = dp_checkpoint_batch(dir);
        if (tbs > 0 &&
            dp_resume_batch_check(tbs, o->per_device_train_batch_size, o->gradient_accumulation_steps, r->world, 0, err, sizeof err))
            die("%s: %s", dir, err);
        checkpoint_check_files(dir);
        cJSON *mine = run_identity(r);
        char *id = cJSON_PrintUnformatted(mine);
        checkpoint_check_run(dir, r->last, id);
        cJSON_Delete(mine);
        free(id);
    }
    printf("output: %s\n", o->output_dir);
    dist_broadcast_host(r->dist, &r->last, sizeof r->last, 0);
}

// the dtype of a checkpoint's weights as model_save_hf can write them: bf16 stays, others fp32
static DType checkpoint_dtype(const char *dir) {
    SafeTensors st;
    st_open_dir(&st, dir);
    const STensor *t = st_find(&st, "model.embed_tokens.weight");
    DType dt = t && t->dtype == DT_BF16 ? DT_BF16 : DT_F32;
    st_close(&st);
    return dt;
}

// the data of SFT: examples
static void load_examples(SftRun *r, const SftFormat *f) {
    const SftOpts *o = &r->o;
    char err[1024];
    if (sft_data_load(&r->data, o->data, f, (uint64_t)o->seed, err, sizeof err) < 0) die("%s", err);
    const SftData *d = &r->data;
    printf("data: %ld examples from %s (%ld completion tokens, the longest %ld tokens; prompts %s)\n", d->n, o->data,
           d->completion_tokens, d->max_tokens, f->chat ? "in the chat template" : "as raw text");
    if (d->truncated) printf("data: %ld examples longer than %d tokens cut to it (the completion's end lost)\n", d->truncated, f->max_length);
    if (d->dropped)
        printf("data: %ld examples left out, their prompt alone fills max_length %d (line %ld is the first)\n", d->dropped,
               f->max_length, d->first_dropped);
    r->n_items = d->n;
    if (!o->eval_data) return;
    if (sft_data_load(&r->eval, o->eval_data, f, (uint64_t)o->seed, err, sizeof err) < 0) die("%s", err);
    const SftData *e = &r->eval;
    if (e->n < r->world) die("%s: %ld held-out examples for %d ranks: give at least one a rank", o->eval_data, e->n, r->world);
    printf("eval: %ld held-out examples from %s (%ld completion tokens)\n", e->n, o->eval_data, e->completion_tokens);
    r->eval_ex = (const SftExample **)mallocCheck((size_t)e->n * sizeof *r->eval_ex);
    for (long i = r->rank; i < e->n; i += r->world) r->eval_ex[r->eval_n++] = sft_data_at(&r->eval, i);
}

// Stage "built-in base" (train_dpo without --model and --data): the warm-up model of ./train_grpo's
// default run (made now if the warm-up cache holds none: warmup_ensure) becomes --model
void sft_run_builtin_base(SftRun *r) {
    SftOpts *o = &r->o;
    r->be = backend_select(o->device, 1);
    Tokenizer *tok = tokenizer_byte_level();
    Config tc = builtin_config(tokenizer_vocab_size(tok), !strcmp(r->be->name, "cuda"));
    WarmupSpec w = warmup_spec_default();
    w.seed = o->seed, w.quiet = o->quiet;
    TaskOptions to = task_options_default();
    to.seed = (uint64_t)o->seed, to.max_operand = w.max_operand;
    task_open_or_die(&r->task, w.task, &to);
    r->fmt = (Formatter){tok, 0, NULL, 512};
    char json[512], root[4096];
    warmup_cache_root(root, sizeof root);  // ./train_grpo's runs share it
    warmup_key(&w, &tc, root, json, sizeof json, r->warm_dir, sizeof r->warm_dir);
    warmup_ensure(&w, &tc, r->be, &r->task, &r->fmt, json, r->warm_dir);
    o->model = r->warm_dir;
}

// DPO's held-out pairs (--eval_data), with the training pairs' tokens and truncations
static void load_eval_pairs(SftRun *r, const PrefFormat *pf) {
    const SftOpts *o = &r->o;
    char err[1024];
    if (!o->eval_data) return;
    if (pref_data_load(&r->pref_eval, o->eval_data, pf, (uint64_t)o->seed, err, sizeof err) < 0) die("%s", err);
    const PrefData *e = &r->pref_eval;
    printf("eval: %ld held-out preference pairs from %s (batches of %d)\n", e->n, o->eval_data, o->per_device_eval_batch_size);
    if (e->dropped)
        printf("eval: %ld pairs left out, a side with no completion token left to score (line %ld is the first)\n", e->dropped,
               e->first_dropped);
}

// the built-in preference pairs: every addition of the task's training split, chosen its sum, rejected
// the carry got wrong, the warm-up's error: forgotten where the ones digits carry ("17+25=" 42 over
// 32), added where they do not ("12+14=" 26 over 36), so that the tens digit is learned from the
// carry and not as "one more"
static void builtin_pairs(SftRun *r, const SftFormat *f) {
    const SftOpts *o = &r->o;
    PrefFormat pf = {*f, o->max_prompt_length, o->max_completion_length, !strcmp(o->truncation_mode, "keep_end")};
    long n = task_size(&r->task, SPLIT_TRAIN), k = 0;
    PrefPair *pairs = (PrefPair *)callocCheck(n, sizeof(PrefPair));
    for (long i = 0; i < n; i++) {
        Example e;
        task_example(&r->task, SPLIT_TRAIN, i, &e);
        long a, b;
        char op, right[32], wrong[32];
        if (sscanf(e.prompt, "%ld%c%ld=", &a, &op, &b) == 3 && op == '+') {
            int carry = a % 10 + b % 10 >= 10;
            snprintf(right, sizeof right, "%ld", a + b);
            snprintf(wrong, sizeof wrong, "%ld", carry ? a + b - 10 : a + b + 10);
            pref_encode(&pf, NULL, e.prompt, right, wrong, &pairs[k++]);
        }
        example_free(&e);
    }
    pref_data_from_pairs(&r->pref, pairs, k, (uint64_t)o->seed);
    r->n_items = k;
    printf("data: %ld preference pairs made from the additions of the task's %ld training problems (chosen: the sum; rejected: "
           "the carry got wrong), %ld held-out problems\n", k, n, task_size(&r->task, SPLIT_HELDOUT));
    load_eval_pairs(r, &pf);
}

// the built-in run's held-out accuracy (greedy, as ./train_grpo's evaluation) with the adapter lo (or NULL)
double sft_run_builtin_accuracy(SftRun *r, LoRA *lo) {
    int eos = r->m.cfg.eos_ids[0];
    return evaluate(&r->m, lo, &r->task, &r->fmt, 200, 8, &eos, 1);
}

// the data of DPO: preference pairs, with TRL's truncations
static void load_pairs(SftRun *r, const SftFormat *f) {
    const SftOpts *o = &r->o;
    PrefFormat pf = {*f, o->max_prompt_length, o->max_completion_length, !strcmp(o->truncation_mode, "keep_end")};
    char err[1024];
    if (pref_data_load(&r->pref, o->data, &pf, (uint64_t)o->seed, err, sizeof err) < 0) die("%s", err);
    const PrefData *d = &r->pref;
    printf("data: %ld preference pairs from %s (the longest sequence %ld tokens; prompts %s)\n", d->n, o->data, d->max_tokens,
           f->chat ? "in the chat template" : "as raw text");
    if (d->truncated)
        printf("data: %ld pairs cut by max_prompt_length %d, max_completion_length %d or max_length %d (%s)\n", d->truncated,
               o->max_prompt_length, o->max_completion_length, f->max_length, o->truncation_mode);
    if (d->dropped)
        printf("data: %ld pairs left out, a side with no completion token left to score (line %ld is the first)\n", d->dropped,
               d->first_dropped);
    r->n_items = d->n;
    load_eval_pairs(r, &pf);
}

// DPO's reference, before any step: the adapter off on each micro-batch, or log-probs computed now
// (--precompute_ref_log_probs; always when training every weight, which keeps no frozen copy); a
// resumed run computes them again from --model's weights, before the checkpoint's are read
static void reference(SftRun *r) {
    const SftOpts *o = &r->o;
    r->dpo.t = &r->tr;
    r->dpo.cfg = dpo_config_of(o);
    if (o->use_peft && !o->precompute_ref_log_probs) {
        printf("reference: the same weights with the adapter off, on each micro-batch (no second copy)\n");
        return;
    }
    double t0 = now_sec();
    pref_precompute_ref(&r->pref, &r->m, o->per_device_train_batch_size);
    if (o->eval_data) pref_precompute_ref(&r->pref_eval, &r->m, o->per_device_eval_batch_size);
    printf("reference: log-probabilities of the %ld pairs%s computed before training, %s (%.1f s)\n", r->pref.n,
           o->eval_data ? " and the held-out ones" : "", o->use_peft ? "the adapter off" : "every weight as loaded: no frozen copy is kept",
           now_sec() - t0);
}

// Stage "inputs": the tokenizer and the data, each bad input said in one line before the run claims
// its directory and the weights are read.
void sft_run_read_inputs(SftRun *r) {
    SftOpts *o = &r->o;
    r->tok = tokenizer_load_dir(o->model);
    Config cfg;
    config_load_dir(&cfg, o->model);
    config_check_tokenizer(&cfg, tokenizer_vocab_size(r->tok), o->model);
    int chat = prompts_in_chat(r->tok, o->chat, o->system_prompt, o->model);
    int max_length = o->max_length;
    if (max_length > cfg.max_pos) {  // said when given; the default is the model's length where that is shorter
        if (o->max_length_given)
            printf("max_length %d is more than the model's max_position_embeddings %d: examples are cut at %d tokens\n", max_length,
                   cfg.max_pos, cfg.max_pos);
        max_length = cfg.max_pos;
    }
    SftFormat f = {r->tok, chat, o->system_prompt, sft_eos_id(r->tok, chat), max_length};
    if (f.eos < 0) die("%s: the tokenizer has no eos_token to end a completion with: add one to tokenizer_config.json", o->model);
    if (o->builtin) builtin_pairs(r, &f);
    else if (o->dpo) load_pairs(r, &f);
    else load_examples(r, &f);
}

// Stage "load": the backend, the model, and what is trained.
void sft_run_load(SftRun *r) {
    SftOpts *o = &r->o;
    if (!r->be) r->be = backend_select(o->device, 1);
    ModelOptions mo = {(FP8Gran)fp8_gran_parse(o->load_in_fp8), 0, o->bf16_first_layers, o->bf16_last_layers, 0};
    model_load(&r->m, o->model, r->be, &mo);
    r->m.recompute = o->gradient_checkpointing;
    r->m.recompute_mlp = o->recompute_mlp;
    SftTrainer tr = {.m = &r->m, .micro_batch = o->per_device_train_batch_size, .beta1 = (float)o->adam_beta1,
                     .beta2 = (float)o->adam_beta2, .eps = (float)o->adam_epsilon, .weight_decay = (float)o->weight_decay,
                     .max_grad_norm = o->max_grad_norm};
    if (o->use_peft) {
        r->lo = lora_create(&r->m, o->lora_r, (float)o->lora_alpha,
                            lora_parse_targets(o->lora_target_modules) | lora_parse_target_parameters(o->lora_target_parameters),
                            (uint64_t)o->seed + 17, 0);
        r->m.lora = r->lo;
        tr.lora = r->lo;
        printf("training: a LoRA adapter (r %d, alpha %g, %zu parameters) on the frozen weights (%s)\n", r->lo->r, r->lo->alpha,
               r->lo->n, o->load_in_fp8);
    } else {
        full_init_sharded(&r->ft, &r->m, r->dist, !strcmp(o->adam_moments, "bf16"));
        tr.full = &r->ft;
        if (strcmp(o->fp8_recipe, "off")) {
            FP8Recipe rc = recipe_of(o);
            model_fp8_train(&r->m, &rc);
            printf("training: FP8 recipe %s, %s, the projections of layers %d..%d%s (fp8_train.cu)\n", o->fp8_recipe, o->fp8_format,
                   o->bf16_first_layers, r->m.cfg.L - 1 - o->bf16_last_layers, o->fp8_lm_head ? " and the LM head" : "");
        }
        r->save_dt = checkpoint_dtype(o->model);
        size_t k = r->ft.hi - r->ft.lo;
        printf("training: every weight (%zu values, fp32 masters and AdamW's moments in %s: %.1f MiB%s), saved in %s\n", r->ft.n,
               o->adam_moments, (k * dtype_size(r->be->hp) + 2 * k * dtype_size(r->ft.mdt)) / 1048576.0,
               r->world > 1 ? " a rank, sharded over the ranks" : "", dtype_name(r->save_dt));
    }
    tr.dist = r->world > 1 ? r->dist : NULL;
    r->tr = tr;
    if (o->dpo) reference(r);
}

// The run's length, and where it starts: a checkpoint's step (--resume) or 0.
// With several ranks, rank 0 reads the checkpoint and sends the state: the sharded masters and
// moments each rank's block (full_load_state), a LoRA adapter's to all.
void sft_run_begin(SftRun *r) {
    const SftOpts *o = &r->o;
    r->per_step = o->per_device_train_batch_size * o->gradient_accumulation_steps;
    r->per_step_all = r->per_step * r->world;
    r->total = o->max_steps > 0 ? o->max_steps : (long)ceil(o->num_train_epochs * r->n_items / r->per_step_all);
    if (r->total < 1) r->total = 1;
    r->warmup = warmup_steps_from_ratio(o->warmup_ratio, r->total);
    if (o->resume) {
        char dir[4300];
        snprintf(dir, sizeof dir, "%s/checkpoint-%d", o->output_dir, r->last);
        if (r->rank == 0) {  // (checked already by prepare_output; read now)
            cJSON *mine = run_identity(r);
            char *id = cJSON_PrintUnformatted(mine);
            cJSON_Delete(mine);
            if (o->use_peft) checkpoint_read(dir, r->last, id, r->lo);
            else checkpoint_read_full(dir, r->last, id, &r->ft, &r->m);
            free(id);
            metrics_truncate(r->metrics, r->last);
        } else if (!o->use_peft) full_load_state(&r->ft, &r->m, NULL);  // its block, from rank 0
        if (o->use_peft) {
            size_t bytes = r->lo->n * dtype_size(r->lo->sdt);
            dist_broadcast(r->dist, r->be, r->lo->params, bytes, 0);
            dist_broadcast(r->dist, r->be, r->lo->m, bytes, 0);
            dist_broadcast(r->dist, r->be, r->lo->v, bytes, 0);
            dist_broadcast_host(r->dist, &r->lo->step, sizeof r->lo->step, 0);
        }
        r->start = r->last;
        printf("resumed from %s (the data at %s %ld)\n", dir, o->dpo ? "pair" : "example", (long)r->start * r->per_step_all);
    } else if (r->rank == 0) run_dir_start(o->output_dir, o->overwrite_output_dir);
    if (o->use_peft && !o->resume) dist_broadcast(r->dist, r->be, r->lo->params, r->lo->n * dtype_size(r->lo->sdt), 0);
    const char *what = o->dpo ? "pairs" : "examples";
    printf("%s: %ld steps x %d %s (%d x %d accumulated%s), %.2f epochs of %ld %s, lr %g (%s, %ld warm-up steps)\n",
           o->dpo ? "DPO" : "SFT", r->total, r->per_step_all, what, o->per_device_train_batch_size, o->gradient_accumulation_steps,
           r->world > 1 ? " on each rank" : "", (double)r->total * r->per_step_all / r->n_items, r->n_items, what, o->learning_rate,
           o->lr_scheduler_type, r->warmup);
    if (o->dpo)
        printf("DPO: loss_type %s, beta %g, label_smoothing %g%s\n", o->loss_type, o->beta, o->label_smoothing,
               o->reference_free ? ", reference_free" : "");
}

// Stage "checkpoint": checkpoint-<step>/ (every save_steps, and at the end), then the oldest
// deleted past save_total_limit.
// Rank 0 writes; sharded full training gathers the masters and moments to it (every rank calls
// full_save_state).
void sft_run_checkpoint(const SftRun *r, int step) {
    const SftOpts *o = &r->o;
    if (step != r->total && (o->save_steps == 0 || step % o->save_steps)) return;
    if (r->rank) {
        if (!r->lo) full_save_state(&r->ft, &r->m, NULL);
        return;
    }
    char tmp[4200], p[4300];
    checkpoint_begin(o->output_dir, step, tmp, sizeof tmp);
    path_join(p, sizeof p, tmp, "optimizer.safetensors");
    if (r->lo) {
        lora_save_peft(r->lo, &r->m, tmp, o->model, r->base_fp);
        lora_save_state(r->lo, p);
    } else {
        model_save_hf(&r->m, tmp, r->save_dt);
        checkpoint_copy_tokenizer(o->model, tmp);
        full_save_state(&r->ft, &r->m, p);
    }
    cJSON *run = run_identity(r);
    checkpoint_commit(o->output_dir, step, tmp, run);
    cJSON_Delete(run);
    if (!o->quiet) printf("saved %s/checkpoint-%d\n", o->output_dir, step);
    if (o->save_total_limit > 0) rotate_checkpoints(o->output_dir, o->save_total_limit, step, o->resume ? r->start : -1, o->quiet);
}

// Stage "log": every logging_steps (and the last step), the window's mean loss, the step's
// grad_norm and learning rate, the tokens a second, as a line and a metrics.jsonl record (TRL's
// names); DPO adds its metrics over the window's pairs (ds: the step's sums, NULL for SFT).
void sft_run_log(const SftRun *r, SftWindow *w, const SftStats *s, const DpoStats *ds, int step, double lr, long tokens_seen) {
    const SftOpts *o = &r->o;
    w->steps++, w->loss += s->loss, w->tokens += s->tokens, w->seq_tokens += s->seq_tokens;
    if (ds) {
        DpoStats *a = &w->dpo;
        a->pairs += ds->pairs, a->loss += ds->loss, a->rewards_chosen += ds->rewards_chosen, a->rewards_rejected += ds->rewards_rejected;
        a->accuracies += ds->accuracies, a->logps_chosen += ds->logps_chosen, a->logps_rejected += ds->logps_rejected;
    }
    if (r->rank || (step % o->logging_steps && step != r->total)) return;
    double dt = now_sec() - w->t0, loss = w->loss / w->steps, tps = w->seq_tokens / (dt > 0 ? dt : 1e-9);
    double epoch = (double)step * r->per_step_all / r->n_items;
    DpoMetrics dm = dpo_metrics(&w->dpo);
    if (!o->quiet && ds)
        printf("step %4d/%ld | loss %.4f | rewards/accuracies %.3f | rewards/margins %.4f | grad_norm %.3f | lr %.3e | epoch %.2f\n", step,
               r->total, loss, dm.rewards_accuracies, dm.rewards_margins, s->grad_norm, lr, epoch);
    else if (!o->quiet)
        printf("step %4d/%ld | loss %.4f | grad_norm %.3f | lr %.3e | epoch %.2f | %.0f tokens/s\n", step, r->total, loss,
               s->grad_norm, lr, epoch, tps);
    FILE *f = fopenCheck(r->metrics, "a");
    fprintf(f, "{\"step\": %d, \"epoch\": %.6f, \"loss\": %.8f, \"grad_norm\": %.8f, \"learning_rate\": %.8e, "
               "\"num_tokens\": %ld, \"tokens_per_second\": %.1f",
            step, epoch, loss, s->grad_norm, lr, tokens_seen, tps);
    if (ds)
        fprintf(f, ", \"rewards/chosen\": %.8f, \"rewards/rejected\": %.8f, \"rewards/accuracies\": %.8f, \"rewards/margins\": %.8f, "
                   "\"logps/chosen\": %.8f, \"logps/rejected\": %.8f",
                dm.rewards_chosen, dm.rewards_rejected, dm.rewards_accuracies, dm.rewards_margins, dm.logps_chosen, dm.logps_rejected);
    fprintf(f, "}\n");
    fclose(f);
    memset(w, 0, sizeof *w);
    w->t0 = now_sec();
}

// DPO's evaluation (--eval_data): the held-out pairs' loss and metrics with the weights of step `step`
// (dpo_evaluate: TRL's DPOTrainer.evaluate), a line and a metrics.jsonl record with TRL's names
static void eval_pairs(SftRun *r, int step) {
    double t0 = now_sec();
    DpoMetrics m = dpo_evaluate(&r->dpo, &r->pref_eval, r->o.per_device_eval_batch_size);
    r->eval_last = step;
    printf("eval: step %d | eval_loss %.4f | eval_rewards/accuracies %.3f | eval_rewards/margins %.4f (%ld pairs, %.1f s)\n", step,
           m.loss, m.rewards_accuracies, m.rewards_margins, r->pref_eval.n, now_sec() - t0);
    FILE *f = fopenCheck(r->metrics, "a");
    fprintf(f, "{\"step\": %d, \"eval_loss\": %.8f, \"eval_rewards/chosen\": %.8f, \"eval_rewards/rejected\": %.8f, "
               "\"eval_rewards/accuracies\": %.8f, \"eval_rewards/margins\": %.8f, \"eval_logps/chosen\": %.8f, "
               "\"eval_logps/rejected\": %.8f}\n",
            step, m.loss, m.rewards_chosen, m.rewards_rejected, m.rewards_accuracies, m.rewards_margins, m.logps_chosen, m.logps_rejected);
    fclose(f);
}

// Stage "eval_heldout" (--eval_data; DPO: eval_pairs): the held-out examples' loss with the weights of step `step` (each rank its
// share), a line and a metrics.jsonl record {"step", "eval_loss", "eval_tokens"} (TRL's eval_loss). The forward
// is a training forward's, FP8 products included; with delayed scaling it records its amaxes into the next
// step's history as a training forward does (a run resumed at an evaluated step's checkpoint scales from
// the step's own amaxes alone).
void sft_run_eval(SftRun *r, int step) {
    if (r->o.dpo) {
        eval_pairs(r, step);
        return;
    }
    long tokens;
    double t0 = now_sec(), loss = sft_eval(&r->tr, r->eval_ex, r->eval_n, &tokens);
    r->eval_last = step;
    if (r->rank) return;
    printf("eval: step %d | eval_loss %.4f (%ld completion tokens of %ld examples, %.1f s)\n", step, loss, tokens, r->eval.n,
           now_sec() - t0);
    FILE *f = fopenCheck(r->metrics, "a");
    fprintf(f, "{\"step\": %d, \"eval_loss\": %.8f, \"eval_tokens\": %ld}\n", step, loss, tokens);
    fclose(f);
}

// metrics.jsonl's values of key, by step (NaN where a line lacks it), into x and y (n lines; malloc'ed)
static int metric_series(const char *path, const char *key, double **x, double **y) {
    int n = 0, cap = 0;
    *x = *y = NULL;
    if (!file_exists(path)) return 0;
    char *text = read_file(path, NULL), *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        cJSON *s = j ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL, *v = j ? cJSON_GetObjectItemCaseSensitive(j, key) : NULL;
        if (cJSON_IsNumber(s)) {
            if (n == cap) cap = cap ? 2 * cap : 64, *x = (double *)reallocCheck(*x, cap * sizeof(double)), *y = (double *)reallocCheck(*y, cap * sizeof(double));
            (*x)[n] = s->valuedouble, (*y)[n++] = cJSON_IsNumber(v) ? v->valuedouble : NAN;
        }
        cJSON_Delete(j);
    }
    free(text);
    return n;
}

// Stage "finish": plot.svg beside metrics.jsonl, from its lines (a resumed run's too): the loss, and
// for DPO the share of pairs whose chosen completion has the higher reward, and the margin; each
// panel with its held-out value (eval_ + its name, dots) where the run evaluated
void sft_run_plot(const SftRun *r) {
    if (r->rank) return;
    static const char *keys[3] = {"loss", "rewards/accuracies", "rewards/margins"};
    static const char *titles[3] = {NULL, "rewards/accuracies: pairs whose chosen completion gains more than the rejected one",
                                    "rewards/margins: beta x (chosen log-ratio - rejected log-ratio)"};
    int k = r->o.dpo ? 3 : 1, n = 0;
    double *x[6], *y[6];
    char names[3][64];
    PlotSeries s[6];
    PlotPanel panels[3];
    for (int i = 0; i < k; i++) {
        snprintf(names[i], sizeof names[i], "eval_%s", keys[i]);
        n = metric_series(r->metrics, keys[i], &x[2 * i], &y[2 * i]);
        metric_series(r->metrics, names[i], &x[2 * i + 1], &y[2 * i + 1]);
        int evals = 0;  // the held-out series only where a run has one
        for (int t = 0; t < n; t++) evals += !isnan(y[2 * i + 1][t]);
        s[2 * i] = (PlotSeries){keys[i], x[2 * i], y[2 * i], n, "#1f77b4", 0, 0};
        s[2 * i + 1] = (PlotSeries){names[i], x[2 * i + 1], y[2 * i + 1], n, "#d62728", 0, 1};
        panels[i] = (PlotPanel){i == 0 ? (r->o.dpo ? "DPO: the loss" : "SFT: the loss") : titles[i], "step", "", &s[2 * i], evals ? 2 : 1};
    }
    char path[4200];
    path_join(path, sizeof path, r->o.output_dir, "plot.svg");
    if (n > 0) plot_svg(path, panels, k);
    for (int i = 0; i < 2 * k; i++) free(x[i]), free(y[i]);
}

void sft_run_finish(SftRun *r, double t0, double last_loss) {
    if (r->o.eval_data && r->eval_last != r->total) sft_run_eval(r, (int)r->total);  // the end's, once
    if (r->start >= r->total) printf("checkpoint-%d is at the run's last step %ld: nothing left to do\n", r->start, r->total);
    else printf("done: %ld steps in %.1f s, the last one's loss %.4f; %s/checkpoint-%ld holds the %s\n", r->total - r->start,
                now_sec() - t0, last_loss, r->o.output_dir, r->total, r->lo ? "adapter (PEFT format)" : "model (a Hugging Face checkpoint)");
    sft_run_plot(r);
}

void sft_run_free(SftRun *r) {
    if (r->lo) lora_free(r->lo);
    else full_free(&r->ft);
    r->m.lora = NULL;
    model_free(&r->m);
    sft_data_free(&r->data);
    if (r->o.eval_data) sft_data_free(&r->eval);
    free(r->eval_ex);
    pref_data_free(&r->pref);
    pref_data_free(&r->pref_eval);
    if (r->o.builtin) task_free(&r->task), tokenizer_free((Tokenizer *)r->fmt.tok);
    tokenizer_free(r->tok);
}

