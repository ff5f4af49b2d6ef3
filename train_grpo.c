// train_grpo.c: GRPO + LoRA on one frozen FP8 copy of the weights.
//
//   make && ./train_grpo                       built-in tiny model + arithmetic task (warm-up, then GRPO)
//   ./train_grpo --model DIR --data FILE.jsonl  a Hugging Face checkpoint and your data
//   ./train_grpo --help                         every option, its default and meaning
//
// One step, train/grpo_train.h's grpo_train_step: sample per_device_train_batch_size / num_generations
// prompts; the rollout engine (rollout.c) samples num_generations completions of each with the adapter;
// rewards (tasks/, reward programs, a reward model) -> group advantages (grpo.c); then the update:
// num_iterations times, per micro-batch a forward to per-token logprobs, grpo_loss gives dL/dlogp,
// model_backward accumulates the LoRA gradients; clip, AdamW.
// The reference for the KL (beta != 0) is the same model with no adapter.
// --algo ppo runs PPO instead (TRL's PPOTrainer and PPOConfig names): the same rollouts and rewards,
// then ppo_step (train/ppo_train.h): a value model (a LoRA adapter of its own and a score head on
// the same frozen base), per-token KL rewards and GAE, num_ppo_epochs of clipped policy and value updates.
// This file is the driver: the options, the run's lifecycle (its directory, checkpoints, the built-in
// model's warm-up, the data, the rewards opened), the loop calling the step, and the logging.
// A run writes into --output_dir, or without it into a new out/run-N (so the default
// command can run again; the built-in model's warm-ups are cached apart, in ~/.cache/fp8-grpo,
// and shared by every run):
// metrics.jsonl (TRL's metric names), checkpoints (checkpoint-N/: PEFT adapter +
// optimizer state, written atomically), and at the end plot.svg. --resume continues
// from the last checkpoint bit-exactly. main(), at the bottom, is the table of
// contents: one function per stage (inputs, output, load, begin, the step, evaluate, log, checkpoint,
// finish).
// Several processes (one per GPU; torchrun, srun or --nproc_per_node N start them) train as one:
// each rolls out its share of the step's prompts, the LoRA gradients are summed over them, and
// each steps its own identical copy of the optimizer (data_parallel.h says why that equals one process with
// the whole batch); rank 0 alone writes metrics, checkpoints and the plot.
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "grpo.h"
#include "lora.h"
#include "ppo.h"
#include "model.h"
#include "rollout.h"
#include "tokenizer.h"
#include "dist/data_parallel.h"
#include "io/options.h"
#include "io/plot.h"
#include "io/safetensors.h"
#include "tasks/reward_program.h"
#include "train/reward_model.h"
#include "tasks/tasks.h"
#include "train/builtin.h"
#include "train/checkpoint.h"
#include "train/full_finetune.h"
#include "train/grpo_train.h"
#include "train/optim.h"
#include "train/ppo_train.h"
#include "train/sft.h"

// ----------------------------------------------------------------------------
// options: one table (options.h); the GRPO ones go to GrpoConfig through grpo.c

typedef struct {
    const char *model, *data, *task, *output_dir, *device, *system_prompt, *lr_scheduler_type, *lora_target_modules;
    const char *lora_target_parameters;
    const char *load_in_fp8, *kv_cache_dtype, *lora_dtype, *eval_data, *algo, *kl_estimator, *adam_moments;
    const char *reward_funcs, *reward_names;  // the rewards: the built-in ones, the programs' names
    const char *reward_model, *reward_model_fp8;  // a *ForSequenceClassification checkpoint (train/reward_model.h)
    OptList reward_cmd;                       // the reward programs (tasks/reward_program.h)
    double reward_timeout;
    double heldout_frac;
    // PPO (--algo ppo): TRL's PPOConfig, copied into a PpoConfig (ppo.h) by parse_options
    int num_ppo_epochs, num_mini_batches, whiten_rewards;
    double cliprange, cliprange_value, vf_coef, gamma, lam, kl_coef, missing_eos_penalty;
    int resume, overwrite_output_dir, fp8_pow2, bf16_first_layers, bf16_last_layers, quiet, gradient_checkpointing, fp8_embeddings;
    int use_peft;
    int max_steps, per_device_train_batch_size, micro_batch_size, lora_r, top_k, logging_steps, save_steps;
    int eval_steps, eval_size, warmup_sft_steps, max_prompt_length, chat, max_operand, save_total_limit, nproc_per_node;
    double learning_rate, weight_decay, adam_beta1, adam_beta2, adam_epsilon, max_grad_norm, warmup_ratio;
    double lora_alpha, temperature, top_p, gpu_memory_utilization, warmup_carry_errors;
    long seed;
} Opts;

#define OFF(f) offsetof(Opts, f)
static const Option OPTIONS[] = {
    {.name = "model and data", .kind = OPT_SECTION},
    {"model", OPT_STRING, OFF(model), .meta = "DIR", .unset = "the built-in tiny model",
     .help = "Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json)"},
    {"data", OPT_STRING, OFF(data), .meta = "FILE", .unset = "the built-in --task",
     .help = "JSONL training data in TRL's shape: a \"prompt\" (text, or a list of messages), an \"answer\" (GSM8K "
             "\"#### N\" ok; optional when reward programs judge) and any other columns, which reach the reward programs ("
             JSONL_LIMITS "); needs --model"},
    {"eval_data", OPT_STRING, OFF(eval_data), .meta = "FILE", .unset = "a share of --data (--heldout_frac)",
     .help = "JSONL held-out problems for the evaluations, as --data's lines; with it every line of --data trains"},
    {"heldout_frac", OPT_DOUBLE, OFF(heldout_frac), 0, 0.9, .dflt = "0.1",
     .help = "share of --data's problems held out for the evaluations, chosen by a hash of the prompt (the same "
             "problems on every run and seed; 0: none, no evaluation)"},
    {"task", OPT_CHOICE, OFF(task), .choices = "arithmetic|countdown", .dflt = "arithmetic", .help = "the built-in task, when no --data"},
    {"max_operand", OPT_INT, OFF(max_operand), 1, 999, .dflt = "30", .help = "built-in arithmetic: operands in [0, max_operand]"},
    {"warmup_sft_steps", OPT_INT, OFF(warmup_sft_steps), 0, 1e7, .dflt = "1000",
     .help = "built-in model: supervised warm-up steps before GRPO (made once per setting, cached in "
             "$XDG_CACHE_HOME/fp8-grpo/warmup-<key>/, by default ~/.cache/fp8-grpo/)"},
    {"warmup_carry_errors", OPT_DOUBLE, OFF(warmup_carry_errors), 0, 1, .dflt = "0.7",
     .help = "built-in arithmetic: share of the warm-up's additions shown with the carry forgotten (for GRPO to fix)"},
    {"chat", OPT_INT, OFF(chat), -1, 1, .dflt = "-1",
     .help = "prompts in the chat template: -1 when the tokenizer has one, 0 raw text, 1 always"},
    {"system_prompt", OPT_TEXT, OFF(system_prompt), .help = "system message, for checkpoints with a chat template"},
    {"max_prompt_length", OPT_INT, OFF(max_prompt_length), 1, 1e7, .dflt = "512", .help = "a longer prompt (in tokens) is an error"},
    {"device", OPT_CHOICE, OFF(device), .choices = "auto|cpu|cuda", .dflt = "auto", .help = "auto: the GPU when usable, else the CPU"},
    {"seed", OPT_LONG, OFF(seed), 0, 9e18, .dflt = "42", .help = "seed of everything random (data order, LoRA init, sampling)"},
    {"algo", OPT_CHOICE, OFF(algo), .choices = "grpo|ppo", .dflt = "grpo",
     .help = "the RL algorithm: GRPO (group baselines, the GRPO section's options; RLOO through --advantage_estimator) "
             "or PPO (a value model on the same FP8 base, the PPO section's options)"},

    {.name = "FP8 (the frozen weights)", .kind = OPT_SECTION},
    {"load_in_fp8", OPT_CHOICE, OFF(load_in_fp8), .choices = "block|row|tensor|off", .dflt = "block",
     .help = "linear weights in E4M3 with a scale per 128x128 block, per row or per tensor; off: unquantized"},
    {"fp8_pow2_scales", OPT_FLAG, OFF(fp8_pow2), .help = "round the FP8 scales up to powers of two"},
    {"bf16_first_layers", OPT_INT, OFF(bf16_first_layers), 0, 1e6, .dflt = "0", .help = "keep the first N layers unquantized"},
    {"bf16_last_layers", OPT_INT, OFF(bf16_last_layers), 0, 1e6, .dflt = "0", .help = "keep the last N layers unquantized"},

    {.name = "GRPO (TRL's GRPOConfig names)", .kind = OPT_SECTION},
    {"max_steps", OPT_INT, OFF(max_steps), 1, 1e9, .dflt = "150", .dflt_model = "200",
     .help = "GRPO steps (a rollout, then num_iterations updates)"},
    {"per_device_train_batch_size", OPT_INT, OFF(per_device_train_batch_size), 1, 1e6, .dflt = "64",
     .help = "completions per step (a multiple of num_generations)"},
    {"num_generations", OPT_GRPO, .meta = "N", .help = "completions per prompt: a group, whose rewards give the advantages"},
    {"max_completion_length", OPT_GRPO, .meta = "N", .dflt = "8", .dflt_model = "256", .help = "new tokens per completion at most"},
    {"beta", OPT_GRPO, .help = "KL coefficient (k3, against the reference: LoRA off); 0: no reference pass"},
    {"epsilon", OPT_GRPO, .help = "lower clip of the policy ratio: ratio >= 1 - epsilon"},
    {"epsilon_high", OPT_GRPO, .help = "upper clip: ratio <= 1 + epsilon_high (none: epsilon; DAPO uses 0.28)"},
    {"loss_type", OPT_GRPO, .choices = "grpo|bnpo|dr_grpo|dapo",
     .help = "token losses summed and divided per sequence (grpo), by the batch's tokens (bnpo), by batch x "
             "max_completion_length (dr_grpo), by the step's tokens (dapo)"},
    {"scale_rewards", OPT_GRPO, .choices = "group|batch|none", .help = "advantages divided by the group's reward std, the batch's, or not"},
    {"advantage_estimator", OPT_GRPO, .choices = "grpo|rloo",
     .help = "a reward's baseline: its group's mean, or the mean of the group's others (RLOO: with --scale_rewards none, TRL's RLOOTrainer)"},
    {"importance_sampling_level", OPT_GRPO, .choices = "token|sequence", .help = "policy ratio per token, or per sequence (GSPO)"},
    {"num_iterations", OPT_GRPO, .meta = "N", .help = "updates per rollout batch (mu); > 1 adds an old-policy pass"},
    {"mask_truncated_completions", OPT_GRPO_FLAG, .help = "completions cut at max_completion_length get no loss"},
    {"reward_weights", OPT_GRPO, .meta = "X,X", .help = "a weight per reward: the built-in ones (--reward_funcs), then each program's "
     "(none: correctness 1.0, format 0.2, a program's 1.0), then the reward model's (1.0)"},
    {"reward_funcs", OPT_STRING, OFF(reward_funcs), .meta = "LIST", .unset = "correctness,format; none with --reward_cmd or --reward_model",
     .help = "the built-in rewards used: a comma list of correctness and format, or none"},
    {"reward_cmd", OPT_LIST, OFF(reward_cmd), .meta = "CMD",
     .help = "a reward program in any language, run with sh -c once and asked each step in a JSON line with TRL's "
             "reward-function arguments (README: Your own rewards); may be given several times"},
    {"reward_names", OPT_STRING, OFF(reward_names), .meta = "LIST", .unset = "cmd0,cmd1,...",
     .help = "a name per --reward_cmd, comma-separated (logged as rewards/<name>/mean); a+b: that program answers an "
             "object of the rewards a and b"},
    {"reward_timeout", OPT_DOUBLE, OFF(reward_timeout), 0.001, 1e9, .dflt = "300",
     .help = "seconds a reward program may take to answer a step; past it the run stops (its last checkpoint intact)"},
    {"reward_model", OPT_STRING, OFF(reward_model), .meta = "DIR",
     .help = "a reward model: a Llama/Qwen2/Qwen3 *ForSequenceClassification checkpoint (num_labels 1, its tokenizer beside "
             "it), frozen on the policy's device; it scores prompt + completion under its own tokenizer and chat template; "
             "its weight last in --reward_weights (1.0), logged as rewards/<DIR's basename>/mean"},
    {"reward_model_fp8", OPT_CHOICE, OFF(reward_model_fp8), .choices = "block|row|tensor|off", .unset = "--load_in_fp8's",
     .help = "the reward model's linear weights in FP8 at this granularity, or off (BF16)"},
    {"vllm_importance_sampling_correction", OPT_GRPO_FLAG,
     .help = "weight tokens by exp(trainer - sampler logprob), capped: the rollout engine's numbers differ slightly"},
    {"vllm_importance_sampling_mode", OPT_GRPO, .choices = "token_truncate|token_mask|sequence_truncate|sequence_mask",
     .help = "that weight per token or per sequence; above the cap: cut to it (truncate) or 0 (mask)"},
    {"vllm_importance_sampling_cap", OPT_GRPO, .help = "the cap of that weight"},

    {.name = "PPO (--algo ppo; TRL's PPOConfig names; of the GRPO options, num_generations, max_completion_length and the reward options apply)", .kind = OPT_SECTION},
    {"num_ppo_epochs", OPT_INT, OFF(num_ppo_epochs), 1, 1e6, .dflt = "4", .help = "passes over each rollout batch"},
    {"num_mini_batches", OPT_INT, OFF(num_mini_batches), 1, 1e6, .dflt = "1",
     .help = "optimizer steps per pass, each on its share of the batch (shuffled per pass)"},
    {"cliprange", OPT_DOUBLE, OFF(cliprange), 0, 0.999, .dflt = "0.2", .help = "the policy ratio's clip: 1 +- cliprange"},
    {"cliprange_value", OPT_DOUBLE, OFF(cliprange_value), 0, 1e9, .dflt = "0.2",
     .help = "the value prediction's clip around the rollout's value"},
    {"vf_coef", OPT_DOUBLE, OFF(vf_coef), 0, 1e6, .dflt = "0.1", .help = "the value loss's weight"},
    {"gamma", OPT_DOUBLE, OFF(gamma), 0, 1, .dflt = "1", .help = "discount factor"},
    {"lam", OPT_DOUBLE, OFF(lam), 0, 1, .dflt = "0.95", .help = "GAE's lambda"},
    {"kl_coef", OPT_DOUBLE, OFF(kl_coef), 0, 1e6, .dflt = "0.05",
     .help = "the KL penalty per token, against the reference (the base, LoRA off)"},
    {"kl_estimator", OPT_CHOICE, OFF(kl_estimator), .choices = "k1|k3", .dflt = "k1",
     .help = "the per-token KL: k1 = logp - ref_logp, k3 = e^r - 1 - r with r = ref_logp - logp"},
    {"whiten_rewards", OPT_FLAG, OFF(whiten_rewards), .help = "whiten the per-token rewards (mean kept) before GAE"},
    {"missing_eos_penalty", OPT_DOUBLE, OFF(missing_eos_penalty), 0, 1e9, .dflt = "0",
     .help = "subtracted from the score of a completion that ends without EOS (0: TRL's None)"},

    {.name = "optimizer (AdamW on the LoRA weights)", .kind = OPT_SECTION},
    {"learning_rate", OPT_DOUBLE, OFF(learning_rate), 0, 1, .dflt = "5e-4", .dflt_model = "1e-5", .help = "peak learning rate"},
    {"lr_scheduler_type", OPT_CHOICE, OFF(lr_scheduler_type), .choices = "cosine|linear|constant", .dflt = "cosine",
     .help = "the learning rate after the warm-up (train/optim.h)"},
    {"warmup_ratio", OPT_DOUBLE, OFF(warmup_ratio), 0, 1, .dflt = "0", .help = "share of the updates that ramp the learning rate up"},
    {"weight_decay", OPT_DOUBLE, OFF(weight_decay), 0, 1, .dflt = "0", .help = "decoupled weight decay"},
    {"adam_beta1", OPT_DOUBLE, OFF(adam_beta1), 0, 0.999999, .dflt = "0.9", .help = "AdamW beta1"},
    {"adam_beta2", OPT_DOUBLE, OFF(adam_beta2), 0, 0.999999999, .dflt = "0.999", .help = "AdamW beta2"},
    {"adam_epsilon", OPT_DOUBLE, OFF(adam_epsilon), 1e-30, 1, .dflt = "1e-8", .help = "AdamW epsilon"},
    {"adam_moments", OPT_CHOICE, OFF(adam_moments), .choices = "fp32|bf16", .dflt = "fp32",
     .help = "--use_peft false: AdamW's two moments in fp32, or in bf16 rounded stochastically (4 bytes a parameter "
             "less; a LoRA adapter's state follows --lora_dtype)"},
    {"max_grad_norm", OPT_DOUBLE, OFF(max_grad_norm), 0, 1e9, .dflt = "1", .help = "clip the global gradient norm to this (0: off)"},

    {.name = "LoRA", .kind = OPT_SECTION},
    {"use_peft", OPT_FLAG, OFF(use_peft), .dflt = "true",
     .help = "train a LoRA adapter on the frozen (FP8) weights; false: every weight (fp32 masters and AdamW, "
             "--load_in_fp8 off, --beta 0, one process), the rollouts sampling from the bf16 weights it trains"},
    {"lora_r", OPT_INT, OFF(lora_r), 1, 4096, .dflt = "16", .help = "rank"},
    {"lora_alpha", OPT_DOUBLE, OFF(lora_alpha), 1e-6, 1e6, .dflt = "32", .help = "scale alpha / r"},
    {"lora_target_modules", OPT_STRING, OFF(lora_target_modules), .meta = "LIST", .dflt = "all",
     .help = "comma list of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj, or all"},
    {"lora_target_parameters", OPT_STRING, OFF(lora_target_parameters), .meta = "LIST", .dflt = "",
     .help = "PEFT's target_parameters: mlp.experts.gate_up_proj,mlp.experts.down_proj puts LoRA on Qwen3 MoE's "
             "experts too (--device cpu)"},
    {"lora_dtype", OPT_CHOICE, OFF(lora_dtype), .choices = "fp32|bf16", .dflt = "fp32",
     .help = "the adapters' masters and AdamW state; bf16: 10 bytes a parameter instead of 16, stochastic rounding "
             "at each update (the gradients stay fp32)"},

    {.name = "sampling (the rollouts)", .kind = OPT_SECTION},
    {"temperature", OPT_DOUBLE, OFF(temperature), 0, 100, .dflt = "1",
     .help = "sampling temperature (the trainer's logprobs use it too, as TRL's)"},
    {"top_p", OPT_DOUBLE, OFF(top_p), 1e-6, 1, .dflt = "1", .help = "nucleus sampling (1: off)"},
    {"top_k", OPT_INT, OFF(top_k), 0, 1e9, .dflt = "0", .help = "top-k sampling (0: off)"},

    {.name = "logging and checkpoints", .kind = OPT_SECTION},
    {"output_dir", OPT_STRING, OFF(output_dir), .meta = "DIR", .unset = "a new out/run-N per run",
     .help = "where metrics.jsonl, checkpoint-N/ and plot.svg go (the built-in model's warm-ups are cached apart: --warmup_sft_steps)"},
    {"resume", OPT_FLAG, OFF(resume), .help = "continue from the last checkpoint of --output_dir (without it: the newest out/run-N that has one)"},
    {"overwrite_output_dir", OPT_FLAG, OFF(overwrite_output_dir), .help = "start over in an --output_dir that holds checkpoints"},
    {"logging_steps", OPT_INT, OFF(logging_steps), 1, 1e9, .dflt = "1", .help = "print a step's line every N steps"},
    {"save_steps", OPT_INT, OFF(save_steps), 0, 1e9, .dflt = "0", .help = "checkpoint every N steps (0: only at the end)"},
    {"save_total_limit", OPT_INT, OFF(save_total_limit), 0, 1e9, .unset = "none, every checkpoint is kept",
     .help = "keep only the newest N checkpoints: older ones are deleted once a new one is complete, never the one "
             "--resume continued (0: keep all, as none)"},
    {"eval_steps", OPT_INT, OFF(eval_steps), 0, 1e9, .dflt = "25", .dflt_model = "50",
     .help = "held-out greedy accuracy every N steps (0: before and at the end only)"},
    {"eval_size", OPT_INT, OFF(eval_size), 0, 1e7, .dflt = "200", .dflt_model = "100", .help = "held-out problems per evaluation"},
    {"quiet", OPT_FLAG, OFF(quiet), .help = "no per-step lines, only the summary"},

    {.name = "memory", .kind = OPT_SECTION},
    {"micro_batch_size", OPT_INT, OFF(micro_batch_size), 1, 1e6,
     .unset = "chosen each step to fit the arena: all of per_device_train_batch_size when it fits",
     .help = "sequences per forward/backward"},
    {"gradient_checkpointing", OPT_FLAG, OFF(gradient_checkpointing),
     .help = "recompute each layer in the backward (less memory); without it, turned on by itself when the update would "
             "not fit otherwise"},
    {"fp8_embeddings", OPT_FLAG, OFF(fp8_embeddings),
     .help = "the embedding table and LM head in E4M3 too, a scale per row (frozen; tied ones share one copy)"},
    {"kv_cache_dtype", OPT_CHOICE, OFF(kv_cache_dtype), .choices = "auto|fp8", .dflt = "auto",
     .help = "the rollouts' KV cache: the activations' type, or E4M3 with a scale per token and head (half the bytes)"},
    {"gpu_memory_utilization", OPT_DOUBLE, OFF(gpu_memory_utilization), 0.05, 0.99, .dflt = "0.6",
     .help = "share of the GPU's memory for weights, LoRA and the arena (KV cache in rollouts, activations in updates); "
             "not given, raised up to 0.95 where the default would leave the arena under 2 GiB"},

    {.name = "several GPUs (data parallel; README: Several GPUs)", .kind = OPT_SECTION},
    {"nproc_per_node", OPT_INT, OFF(nproc_per_node), 1, 1024, .unset = "one process, or the ranks torchrun / srun started",
     .help = "start N processes on this machine, one per GPU, each with per_device_train_batch_size completions a step"},
};
#define N_OPTIONS ((int)(sizeof OPTIONS / sizeof OPTIONS[0]))

// --algo ppo: its options into c, and the options it cannot use refused by name, each with what PPO has
// instead (and PPO's options without it)
static void ppo_options(const OptionTable *t, const Opts *o, PpoConfig *c) {
    static const char *const ppo_only[] = {"num_ppo_epochs", "num_mini_batches", "cliprange", "cliprange_value", "vf_coef",
                                           "gamma", "lam", "kl_coef", "kl_estimator", "whiten_rewards", "missing_eos_penalty"};
    static const char *const grpo_only[][2] = {
        {"beta", "its KL penalty is --kl_coef (per token, in the rewards)"},
        {"epsilon", "its ratio clip is --cliprange"},
        {"epsilon_high", "its ratio clip is --cliprange, the same both ways"},
        {"num_iterations", "its passes over a batch are --num_ppo_epochs"},
        {"loss_type", "its losses are masked means over the tokens"},
        {"scale_rewards", "its advantages are whitened over the batch"},
        {"advantage_estimator", "its advantages come from the value model (GAE)"},
        {"importance_sampling_level", "its ratio is per token"},
        {"mask_truncated_completions", "a completion without EOS can lose --missing_eos_penalty instead"},
        {"vllm_importance_sampling_correction", "its old policy is the trainer's own forward"},
        {"vllm_importance_sampling_mode", "its old policy is the trainer's own forward"},
        {"vllm_importance_sampling_cap", "its old policy is the trainer's own forward"},
    };
    int ppo = !strcmp(o->algo, "ppo");
    if (!ppo) {
        for (size_t i = 0; i < sizeof ppo_only / sizeof ppo_only[0]; i++)
            if (options_given(t, ppo_only[i])) die("--%s is a PPO option: add --algo ppo", ppo_only[i]);
        return;
    }
    for (size_t i = 0; i < sizeof grpo_only / sizeof grpo_only[0]; i++)
        if (options_given(t, grpo_only[i][0])) die("--%s is a GRPO option; with --algo ppo %s", grpo_only[i][0], grpo_only[i][1]);
    if (!o->use_peft)
        die("--algo ppo trains LoRA adapters (the policy's, and the value model's on the same frozen base): drop --use_peft false");
    if (o->nproc_per_node > 1)  // (torchrun's or srun's ranks: load says it)
        die("--algo ppo runs on one process so far (its advantages are whitened over one process's batch): run one process");
    if (o->per_device_train_batch_size < 2) die("--algo ppo whitens the advantages over the batch: per_device_train_batch_size must be >= 2");
    if (o->per_device_train_batch_size % o->num_mini_batches)
        die("per_device_train_batch_size %d is not a multiple of num_mini_batches %d", o->per_device_train_batch_size,
            o->num_mini_batches);
    *c = ppo_config_default();
    c->num_ppo_epochs = o->num_ppo_epochs, c->num_mini_batches = o->num_mini_batches;
    c->cliprange = o->cliprange, c->cliprange_value = o->cliprange_value, c->vf_coef = o->vf_coef;
    c->gamma = o->gamma, c->lam = o->lam, c->kl_coef = o->kl_coef;
    c->kl_estimator = !strcmp(o->kl_estimator, "k3") ? PPO_KL_K3 : PPO_KL_K1;
    c->whiten_rewards = o->whiten_rewards, c->missing_eos_penalty = o->missing_eos_penalty;
}

static void parse_options(int argc, char **argv, Opts *o, GrpoConfig *g, PpoConfig *pc, int *util_given) {
    memset(o, 0, sizeof *o);
    OptionTable t = {.usage = "usage: ./train_grpo [--name value | --name=value ...]\n"
                              "GRPO with LoRA on frozen FP8 weights; without --model, the built-in tiny model and task (a\n"
                              "supervised warm-up, cached, then GRPO). Names as TRL's; '-' and '_' are the same; a flag alone means true.",
                     .rows = OPTIONS, .n = N_OPTIONS, .base = o, .grpo = g};
    options_parse(&t, argc, argv);
    *util_given = options_given(&t, "gpu_memory_utilization");
    if (o->eval_data && !o->data) die("--eval_data needs --data (the built-in tasks hold out problems of their own)");
    if (options_given(&t, "heldout_frac") && !o->data)
        die("--heldout_frac is the share of --data held out: the built-in tasks hold out a fixed 10%%");
    if (options_given(&t, "heldout_frac") && o->eval_data)
        die("--heldout_frac and --eval_data both choose the held-out problems: give one");
    ppo_options(&t, o, pc);
    char err[256];
    GrpoConfig gc = *g;
    if (!strcmp(o->algo, "ppo")) gc.num_generations = 2;  // PPO needs no groups: one completion a prompt is TRL's
    if (grpo_config_check(&gc, err, sizeof err) < 0) die("%s", err);
    // full-weight GRPO (--use_peft false): what it needs, said before any work
    if (!o->use_peft && strcmp(o->load_in_fp8, "off"))
        die("--use_peft false trains every weight, and FP8 weights are frozen: add --load_in_fp8 off (or train a LoRA "
            "adapter on the FP8 weights: --use_peft)");
    if (!o->use_peft && g->beta != 0)
        die("--use_peft false keeps no reference model (the KL term's frozen weights are the ones it trains): use --beta 0 "
            "(the default), or --use_peft, whose reference is the frozen base");
    if (!o->use_peft && o->fp8_embeddings) die("--use_peft false trains the embeddings too, which --fp8_embeddings freezes: drop it");
    if (o->use_peft && strcmp(o->adam_moments, "fp32"))
        die("--adam_moments %s is for --use_peft false (every weight); a LoRA adapter's state follows --lora_dtype", o->adam_moments);
    if (o->per_device_train_batch_size % g->num_generations)
        die("per_device_train_batch_size %d is not a multiple of num_generations %d", o->per_device_train_batch_size,
            g->num_generations);
    if (o->data && o->model == NULL) die("--data needs --model (the built-in tiny model only knows the built-in tasks)");
    if (o->temperature < 1e-3)  // (0 is greedy sampling)
        die("--temperature %g samples (all but) greedily: the completions of a group are the same, so every advantage and "
            "gradient is 0 and RL cannot learn; use a temperature of at least 0.001 (the default is 1)", o->temperature);
    if (o->resume && o->overwrite_output_dir) die("--resume and --overwrite_output_dir contradict each other");
    if (o->overwrite_output_dir && !o->output_dir)
        die("--overwrite_output_dir needs --output_dir (without it each run writes to a new out/run-N)");
}

// ----------------------------------------------------------------------------
// the run's state

typedef struct {  // what the plot needs, per step (reward: the sampled correctness)
    double *step, *reward, *acc, *kl, *len;
    int n, cap;
} History;

// what the stages share, from the options to the end
typedef struct {
    Opts o;
    GrpoConfig g;
    int ppo;                // --algo ppo: the update is PPO's (train/ppo_train.h), with its config and value model
    PpoConfig pc;
    PpoTrainer pt;
    double *score;          // PPO: (S) each completion's score (the weighted rewards, less missing_eos_penalty)
    PpoStepStats ps;        // PPO: the step's figures
    const char *prog;       // argv[0]: the generate command printed at the end is its neighbour
    Dist *dist;             // the ranks (world 1: this process alone)
    DpBatch dp;             // this rank's share of a step's prompts and sequences
    int rank0;              // this process writes the metrics, checkpoints, plot and prints the run
    char dir[4096];         // where this run writes: --output_dir, or a new out/run-N
    char warm_root[4096];   // where the built-in model's warm-ups are cached (warmup_cache_root: shared by every run)
    char warm_dir[4400];    // this run's: <warm_root>/warmup-<key>, one per setting (warmup_settings)
    char warm_json[512];    // the settings that define the built-in model's weights ("" with --model)
    char base_fp[17];       // the fingerprint of the base's weights (st_fingerprint; "": not known yet)
    char metrics[4200];     // <dir>/metrics.jsonl
    int last;               // the newest checkpoint-N in dir (-1: none)
    int max_pos;            // --model's max_position_embeddings (0: the built-in model)
    const Backend *be;
    Task task;
    Tokenizer *tok;
    Formatter fmt;
    int eos[8], neos;       // ids that end a completion: the tokenizer's and config.json's
    Model m;                // the frozen weights (FP8 unless --load_in_fp8 off) with...
    LoRA *lo;               // ...the adapter GRPO trains (NULL with --use_peft false:)
    FullTrainer ft;         // every weight trained instead: fp32 masters and AdamW (full_finetune.h)
    size_t lora_bytes;      // LoRA parameters, gradients, AdamW m and v
    int gpu_util_given;     // --gpu_memory_utilization was on the command line (else it may be raised to fit)
    int G, S, P, Tc, R;     // group size, this rank's sequences per step (P prompts x G), max completion tokens, reward functions
    long total_updates;     // optimizer steps of the whole run (max_steps x num_iterations)
    long lr_warmup;         // of which ramp the learning rate up
    float inv_temp;         // logprobs at the sampling temperature, as TRL's trainer computes them
    double weights[GRPO_MAX_REWARDS];  // (R) reward weights
    const char *reward_names[GRPO_MAX_REWARDS];
    RewardSet rewards;      // the built-in rewards used and the reward programs (this rank's own)
    RewardModel rmodel;     // --reward_model (rmodel.tok NULL: none), the rewards' last column
    int start;              // the step resumed from (0: a fresh run)
    int end;                // the step of the run's last checkpoint: max_steps, or start when a resumed run is past it
    char memory_help[256];  // the options that would shrink what the run holds (memory_options), for the steps' errors
    double acc;             // this step's held-out accuracy (NaN: not evaluated)
    History hist;
} Run;

// ----------------------------------------------------------------------------
// checkpoints (checkpoint.h: the output directory, writing and reading them)

// the settings a checkpoint must agree with to be resumed: every option but those a resume may change
// (checkpoint.h: run_options_json), the built-in model's warm-up, the batch as the step's over all ranks
// (train_batch_size), so that a run resumes on any number of ranks that splits it (data_parallel.h), and
// the base by its weights' fingerprint, so that a checkpoint never continues on another model saved
// under the same path (or another warm-up of the built-in one)
static cJSON *run_identity(const Run *r) {
    const Opts *o = &r->o;
    OptionTable t = {.rows = OPTIONS, .n = N_OPTIONS, .base = (void *)o, .grpo = (GrpoConfig *)&r->g};
    cJSON *j = run_options_json(&t);
    if (!o->model) cJSON_AddItemToObject(j, "warmup", cJSON_Parse(r->warm_json));  // what made the built-in model's weights
    cJSON_AddNumberToObject(j, "train_batch_size", (double)o->per_device_train_batch_size * dist_world(r->dist));
    if (r->base_fp[0]) cJSON_AddStringToObject(j, "base_model_fingerprint", r->base_fp);
    return j;
}

// checkpoint-N: the adapter (PEFT format) and its optimizer state; with --use_peft false the whole
// model as a Hugging Face checkpoint (bf16, with the tokenizer's files) and the masters and moments
static void save_checkpoint(const Run *r, int step) {
    const char *base = r->o.model ? r->o.model : r->warm_dir;
    char tmp[4200], p[4300];
    checkpoint_begin(r->dir, step, tmp, sizeof tmp);
    path_join(p, sizeof p, tmp, "optimizer.safetensors");
    if (r->lo) {
        lora_save_peft(r->lo, &r->m, tmp, base, r->base_fp);
        lora_save_state(r->lo, p);
        if (r->ppo) {  // the value model: its adapter and head with their AdamW state (resume only; TRL saves the policy alone)
            path_join(p, sizeof p, tmp, "value_model.safetensors");
            value_save_state(&r->pt.value, p);
        }
    } else {
        model_save_hf(&r->m, tmp, DT_BF16);
        checkpoint_copy_tokenizer(base, tmp);
        full_save_state(&r->ft, &r->m, p);
    }
    cJSON *run = run_identity(r);
    checkpoint_commit(r->dir, step, tmp, run);
    cJSON_Delete(run);
}

// restore a checkpoint (checkpoint.c); returns its step. A batch that differs because the number
// of ranks did is said first, with the --per_device_train_batch_size that continues it.
// (resume_check: the settings and the batch, before any work; load_checkpoint: the state, with the base's
// fingerprint now that it is known)
static void resume_check(const Run *r) {
    const Opts *o = &r->o;
    char dir[4300], err[512];
    snprintf(dir, sizeof dir, "%s/checkpoint-%d", r->dir, r->last);
    checkpoint_check_files(dir);
    int tbs = dp_checkpoint_batch(dir);
    if (tbs > 0 && dp_resume_batch_check(tbs, o->per_device_train_batch_size, 1, dist_world(r->dist), r->g.num_generations, err, sizeof err))
        die("%s: %s", dir, err);
    cJSON *mine = run_identity(r);
    char *id = cJSON_PrintUnformatted(mine);
    cJSON_Delete(mine);
    checkpoint_check_run(dir, r->last, id);
    free(id);
}
static int load_checkpoint(Run *r) {
    char dir[4300];
    snprintf(dir, sizeof dir, "%s/checkpoint-%d", r->dir, r->last);
    cJSON *mine = run_identity(r);
    char *id = cJSON_PrintUnformatted(mine);
    cJSON_Delete(mine);
    if (r->lo) checkpoint_read(dir, r->last, id, r->lo);
    else checkpoint_read_full(dir, r->last, id, &r->ft, &r->m);
    if (r->ppo) {
        char p[4400];
        path_join(p, sizeof p, dir, "value_model.safetensors");
        value_load_state(&r->pt.value, p);
    }
    free(id);
    return r->last;
}


// ----------------------------------------------------------------------------
// the run

static void hist_add(History *h, double step, double reward, double acc, double kl, double len) {
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 64;
        h->step = (double *)reallocCheck(h->step, h->cap * sizeof(double));
        h->reward = (double *)reallocCheck(h->reward, h->cap * sizeof(double));
        h->acc = (double *)reallocCheck(h->acc, h->cap * sizeof(double));
        h->kl = (double *)reallocCheck(h->kl, h->cap * sizeof(double));
        h->len = (double *)reallocCheck(h->len, h->cap * sizeof(double));
    }
    h->step[h->n] = step, h->reward[h->n] = reward, h->acc[h->n] = acc, h->kl[h->n] = kl, h->len[h->n] = len;
    h->n++;
}

static void hist_from_metrics(History *h, const char *path) {
    if (!file_exists(path)) return;
    char *text = read_file(path, NULL), *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        if (!j) continue;
        cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step"), *r = cJSON_GetObjectItemCaseSensitive(j, "rewards/correctness/mean");
        cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "eval/accuracy"), *k = cJSON_GetObjectItemCaseSensitive(j, "kl");
        if (!k) k = cJSON_GetObjectItemCaseSensitive(j, "objective/kl");  // (PPO's)
        cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "completions/mean_length");
        if (cJSON_IsNumber(s))
            hist_add(h, s->valuedouble, cJSON_IsNumber(r) ? r->valuedouble : NAN, cJSON_IsNumber(a) ? a->valuedouble : NAN,
                     cJSON_IsNumber(k) ? k->valuedouble : NAN, cJSON_IsNumber(l) ? l->valuedouble : NAN);
        cJSON_Delete(j);
    }
    free(text);
}

static void add_num(cJSON *j, const char *k, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(j, k, v);
    else cJSON_AddNullToObject(j, k);
}

// The built-in model's warm-up as these options define it (builtin.h)
static WarmupSpec warm_spec(const Run *r) {
    const Opts *o = &r->o;
    WarmupSpec w = {o->task, o->max_operand, o->warmup_sft_steps, o->warmup_carry_errors, o->seed, o->quiet, o->eval_size,
                    r->g.max_completion_length};
    return w;
}

// The settings that define the built-in model's weights (warm_json), and the cache directory of
// that warm-up: <warm_root>/warmup-<a hash of them> (warmup_key).
static void warmup_settings(Run *r, const Config *tc) {
    WarmupSpec w = warm_spec(r);
    warmup_key(&w, tc, r->warm_root, r->warm_json, sizeof r->warm_json, r->warm_dir, sizeof r->warm_dir);
}

// Stage "warm-up": the built-in model, trained once by warmup_ensure and cached in warm_dir as a
// Hugging Face checkpoint (config.json, model.safetensors, tokenizer.json, and warmup.json: its
// settings); then loaded as any checkpoint is. With several ranks, rank 0 makes it (or finds it)
// while the others wait, then each loads it.
static void warmup(Run *r, const Config *tc, const ModelOptions *mo) {
    if (r->rank0) {
        WarmupSpec w = warm_spec(r);
        warmup_ensure(&w, tc, r->be, &r->task, &r->fmt, r->warm_json, r->warm_dir);
    }
    dist_barrier(r->dist);
    model_load(&r->m, r->warm_dir, r->be, mo);
}

// ----------------------------------------------------------------------------
// the stages, in the order main() calls them

// Where the run writes, claimed before any work (checkpoint.h: made, locked, checked). Without
// --output_dir each run gets a new out/run-N, so the default command runs again without losing the
// last run; --resume continues the newest out/run-N that holds a checkpoint. With --output_dir: that
// directory. The built-in model's warm-ups are cached apart (warmup_cache_root), for every run.
// Rank 0 decides (out/run-N is claimed by one mkdir) and tells the others.
static void prepare_output(Run *r) {
    Opts *o = &r->o;
    if (r->rank0) {
        if (!o->model) warmup_cache_root(r->warm_root, sizeof r->warm_root);
        if (o->output_dir) {
            snprintf(r->dir, sizeof r->dir, "%s", o->output_dir);
            r->last = run_dir_claim(r->dir, o->resume, o->overwrite_output_dir);
        } else {
            if (o->resume) {
                int n = newest_numbered("out", "run", 1);
                if (n < 0) die("--resume: no out/run-N holds a checkpoint: give the run's --output_dir");
                snprintf(r->dir, sizeof r->dir, "out/run-%d", n);
                r->last = run_dir_claim(r->dir, 1, 0);
            } else {
                run_dir_claim_new("out", "run", r->dir, sizeof r->dir);
                r->last = -1;
            }
        }
        const char *why = o->output_dir ? "" : o->resume ? " (the newest out/run-N with a checkpoint)" : " (a new out/run-N for each run without --output_dir)";
        printf("output: %s%s\n", r->dir, why);
    }
    dist_broadcast_host(r->dist, r->dir, sizeof r->dir, 0);
    dist_broadcast_host(r->dist, r->warm_root, sizeof r->warm_root, 0);
    dist_broadcast_host(r->dist, &r->last, sizeof r->last, 0);
    o->output_dir = r->dir;
    path_join(r->metrics, sizeof r->metrics, r->dir, "metrics.jsonl");
}

// What the process may hold: --gpu_memory_utilization of the device. Left at its default, a share that
// leaves the arena less than MIN_ARENA beside the weights, LoRA and the 1 GiB reserve (a large model on
// a small GPU) is raised as far as 0.95, and said. Dies in one line, naming what would help, when even
// that leaves no arena.
#define MIN_ARENA ((size_t)2 << 30)
// The options that would shrink what the whole run holds, those not at their leanest yet, as the start
// of a one-line error's advice ("raise --gpu_memory_utilization (now 0.60), use --load_in_fp8 block, ");
// returns the characters written. arena_budget and the update's fit (train/grpo_train.c) add what their
// own shortfall depends on.
static size_t memory_options(const Opts *o, char *help, size_t cap) {
    size_t n = 0;
    help[0] = 0;
    if (o->gpu_memory_utilization < 0.95)
        n += snprintf(help + n, cap - n, "raise --gpu_memory_utilization (now %.2f), ", o->gpu_memory_utilization);
    if (!strcmp(o->load_in_fp8, "off")) n += snprintf(help + n, cap - n, "use --load_in_fp8 block, ");
    if (!o->fp8_embeddings) n += snprintf(help + n, cap - n, "add --fp8_embeddings, ");
    return n;
}
static size_t arena_budget(Run *r) {
    Opts *o = &r->o;
    double cap = (double)r->be->mem_capacity();
    size_t used = r->be->mem_in_use(NULL), reserve = (size_t)1 << 30;
    if (!r->gpu_util_given && o->gpu_memory_utilization * cap < (double)(used + reserve + MIN_ARENA)) {
        double u = fmin(0.95, (double)(used + reserve + MIN_ARENA) / cap);
        if (u > o->gpu_memory_utilization) {
            printf("memory: --gpu_memory_utilization %.2f would leave the KV-cache/activation arena %.2f GiB beside the "
                   "weights: using %.2f (the option sets it)\n",
                   o->gpu_memory_utilization, fmax(0, o->gpu_memory_utilization * cap - used - reserve) / 1073741824.0, u);
            o->gpu_memory_utilization = u;
        }
    }
    size_t budget = (size_t)(o->gpu_memory_utilization * cap);
    if (budget <= used + reserve) {
        char help[256];
        size_t n = memory_options(o, help, sizeof help);
        if (strcmp(o->lora_dtype, "bf16")) n += snprintf(help + n, sizeof help - n, "use --lora_dtype bf16, ");
        snprintf(help + n, sizeof help - n, "or lower --lora_r");
        die("--gpu_memory_utilization %.2f gives %.2f GiB, but the weights, LoRA and optimizer hold %.2f GiB and the "
            "backend keeps 1 GiB in reserve: %s",
            o->gpu_memory_utilization, budget / 1073741824.0, used / 1073741824.0, help);
    }
    return budget;
}

// One line on the data: the problems of each split and how the held-out ones were chosen; for a
// file, the prompts' length in tokens as the model reads them (in the chat template, with the system
// prompt, where the run uses one) and the answers'. A prompt over --max_prompt_length dies here, in
// one line, before the run claims its directory.
static void data_summary(const Run *r) {
    const Opts *o = &r->o;
    const Task *t = &r->task;
    long ntr = task_size(t, SPLIT_TRAIN), nho = task_size(t, SPLIT_HELDOUT);
    if (ntr < 0) {
        printf("data: the built-in task %s, problems made on demand, %g%% of them held out (by a hash of the problem)\n", t->name,
               100 * t->opt.heldout_frac);
        return;
    }
    long pmin = LONG_MAX, pmax = 0, amin = LONG_MAX, amax = 0, over = 0, longest = 0;
    double psum = 0, asum = 0;
    if (t->kind == TASK_JSONL) {
        Formatter f = r->fmt;
        f.max_prompt = INT_MAX;  // (counted here; those over it said below, together)
        for (long k = 0; k < t->n_items; k++) {
            int *ids;
            const char *ans = t->items[k].answer;
            long np = encode_prompt(&f, &t->items[k], &ids), na = ans ? (long)strlen(ans) : 0;
            free(ids);
            if (np > pmax) longest = k;
            over += np > r->fmt.max_prompt;
            pmin = np < pmin ? np : pmin, pmax = np > pmax ? np : pmax, psum += np;
            if (ans) amin = na < amin ? na : amin, amax = na > amax ? na : amax, asum += na;
        }
        if (over)
            die("%s%s%s: %ld prompt%s more than --max_prompt_length %d tokens%s (the longest %ld: '%.40s...'): raise "
                "--max_prompt_length or shorten them", o->data, o->eval_data ? " and " : "", o->eval_data ? o->eval_data : "", over,
                over == 1 ? " has" : "s have", r->fmt.max_prompt, r->fmt.chat ? " in the chat template" : "", pmax,
                t->items[longest].prompt);
        if (r->max_pos && pmax + r->g.max_completion_length > r->max_pos)
            die("%s%s%s: the longest prompt (%ld tokens%s) and --max_completion_length %d exceed the model's "
                "max_position_embeddings %d: lower --max_completion_length, or shorten the prompts", o->data,
                o->eval_data ? " and " : "", o->eval_data ? o->eval_data : "", pmax, r->fmt.chat ? " in the chat template" : "",
                r->g.max_completion_length, r->max_pos);
    }
    char how[4300];
    if (o->eval_data) snprintf(how, sizeof how, "those of %s", o->eval_data);
    else if (!o->data) snprintf(how, sizeof how, "%g%% of the problems, by a hash of the problem", 100 * t->opt.heldout_frac);
    else snprintf(how, sizeof how, "--heldout_frac %g of the problems, by a hash of the prompt", o->heldout_frac);
    printf("data: %s: %ld training and %ld held-out problems (held out: %s)", o->data ? o->data : t->name, ntr, nho, how);
    if (t->kind == TASK_JSONL) {
        long nans = t->n_items - t->n_unanswered;
        printf("; prompts %ld-%ld tokens%s (mean %.1f)", pmin, pmax, r->fmt.chat ? " in the chat template" : "",
               psum / t->n_items);
        if (nans) printf(", answers %ld-%ld characters (mean %.1f)", amin, amax, asum / nans);
        if (t->n_unanswered) printf(", %ld lines without an answer", t->n_unanswered);
        if (t->n_conversational) printf(", %ld prompts as messages", t->n_conversational);
    }
    printf("\n");
}

// The run's rewards (tasks/reward_program.h): the built-in ones the data can serve, the reward
// programs, started now (each rank its own, for its own completions), and a reward model checked with its
// tokenizer read (its weights are read with the policy's: load)
static void open_rewards(Run *r) {
    const Opts *o = &r->o;
    RewardSet *rs = &r->rewards;
    char err[512];
    if (o->reward_model) reward_model_open(&r->rmodel, o->reward_model, r->task.n_conversational > 0);
    const char *funcs = o->reward_funcs ? o->reward_funcs : o->reward_model ? "none" : NULL;  // (TRL: the model alone)
    if (reward_set_open(rs, funcs, o->reward_cmd.v, o->reward_cmd.n, o->reward_names, o->reward_model ? r->rmodel.name : NULL,
                        o->reward_timeout, err, sizeof err))
        die("%s", err);
    for (int k = 0; k < rs->n_builtin; k++)
        if (REWARD_FUNCS[rs->builtin[k]].fn == reward_correctness && r->task.n_unanswered == r->task.n_items && r->task.n_items)
            die("%s: no line has an \"answer\", which the built-in correctness reward needs: judge the completions with "
                "--reward_cmd (with --reward_funcs format or none), or add answers", o->data);
}

// Stage "inputs": the data, the tokenizer (checked against the checkpoint's vocabulary) and how the
// prompts become tokens, each bad input said in one line before the run claims its directory; the
// prompts' lengths counted as the model will read them (data_summary); the reward programs started
static void read_inputs(Run *r) {
    const Opts *o = &r->o;
    TaskOptions to = task_options_default();
    to.seed = (uint64_t)o->seed;
    to.max_operand = o->max_operand;
    if (o->data) to.heldout_frac = o->eval_data ? 0 : o->heldout_frac;
    task_open_or_die(&r->task, o->data ? o->data : o->task, &to);
    if (o->eval_data) {
        char err[512];
        long both;
        if (task_set_eval_file(&r->task, o->eval_data, &both, err, sizeof err)) die("--eval_data: %s", err);
        if (both && r->rank0)
            printf("note: %ld of the %ld problems of %s are in %s too: the evaluation measures them after training on them\n",
                   both, task_size(&r->task, SPLIT_HELDOUT), o->eval_data, o->data);
    }
    open_rewards(r);
    if (o->model) {
        r->tok = tokenizer_load_dir(o->model);
        Config cfg;
        config_load_dir(&cfg, o->model);
        config_check_tokenizer(&cfg, tokenizer_vocab_size(r->tok), o->model);
        r->max_pos = cfg.max_pos;
    } else r->tok = tokenizer_byte_level();
    r->fmt = (Formatter){r->tok, prompts_in_chat(r->tok, o->chat, o->system_prompt, o->model), o->system_prompt, o->max_prompt_length};
    if (r->task.n_conversational && !r->fmt.chat)
        die("%s: %ld prompts are lists of messages, which need the chat template: %s", o->data, r->task.n_conversational,
            o->chat == 0 ? "drop --chat 0" : "this checkpoint's tokenizer has none (give those prompts as text)");
    data_summary(r);
}

// Stage "load": the backend, the model (the built-in one through its warm-up), LoRA, and the GPU
// arena's budget.
static void load(Run *r) {
    const Opts *o = &r->o;
    r->be = backend_select(o->device, 1);
    Config tc;  // the built-in model's shape (on a GPU a larger one), and the warm-up that makes its weights
    if (!o->model) {
        tc = builtin_config(tokenizer_vocab_size(r->tok), !strcmp(r->be->name, "cuda"));
        r->eos[r->neos++] = tc.eos_ids[0];
        warmup_settings(r, &tc);
    }
    ModelOptions mo = {(FP8Gran)fp8_gran_parse(o->load_in_fp8), o->fp8_pow2, o->bf16_first_layers, o->bf16_last_layers,
                       o->fp8_embeddings};
    // a resume checked against its checkpoint before any work: the settings, the batch, and the
    // base's fingerprint where the base is there to read (a warm-up still to make: after it)
    if (r->rank0) {
        if (o->model) st_dir_fingerprint(o->model, r->base_fp);
        else if (dir_exists(r->warm_dir)) st_dir_fingerprint(r->warm_dir, r->base_fp);
        if (o->resume) resume_check(r);
    }
    Model *m = &r->m;
    if (o->model) {
        model_load(m, o->model, r->be, &mo);
        int n;
        const int *e = tokenizer_eos_ids(r->tok, &n);
        for (int i = 0; i < n && r->neos < 8; i++) r->eos[r->neos++] = e[i];
        for (int i = 0; i < m->cfg.n_eos && r->neos < 8; i++) r->eos[r->neos++] = m->cfg.eos_ids[i];
    } else {
        warmup(r, &tc, &mo);
        if (r->rank0 && !r->base_fp[0]) st_dir_fingerprint(r->warm_dir, r->base_fp);
    }
    if (o->reward_model) {  // held before the arena's budget is set: the memory plan counts its weights
        reward_model_load(&r->rmodel, r->be, (FP8Gran)fp8_gran_parse(o->reward_model_fp8 ? o->reward_model_fp8 : o->load_in_fp8));
        printf("reward model %s: a %s, linear weights %s\n", r->rmodel.name, r->rmodel.cls, fp8_gran_name(r->rmodel.m.opt.gran));
    }
    config_print(&m->cfg, stdout);
    printf("%s linear weights: %s, %.2f MiB (of %.2f MiB of weights)\n", o->use_peft ? "frozen" : "trained", o->load_in_fp8,
           m->w.linear_bytes / 1048576.0, (m->w.dense_bytes + m->w.fp8_bytes) / 1048576.0);

    m->recompute = o->gradient_checkpointing;
    m->kv_fp8 = !strcmp(o->kv_cache_dtype, "fp8");
    if (o->use_peft) {
        unsigned targets = lora_parse_targets(o->lora_target_modules) | lora_parse_target_parameters(o->lora_target_parameters);
        r->lo = lora_create(m, o->lora_r, (float)o->lora_alpha, targets, (uint64_t)o->seed + 17, !strcmp(o->lora_dtype, "bf16"));
        m->lora = r->lo;
        printf("LoRA: r %d, alpha %g, %zu parameters\n", r->lo->r, r->lo->alpha, r->lo->n);
        r->lora_bytes = lora_state_bytes(r->lo);  // parameters, gradients, Adam m and v
        if (r->ppo) {
            if (dist_world(r->dist) > 1) die("--algo ppo runs on one process so far (its advantages are whitened over one process's batch)");
            ppo_init(&r->pt, &r->pc, m, r->lo, o->per_device_train_batch_size, r->g.max_completion_length, (uint64_t)o->seed);
            r->lora_bytes += value_state_bytes(&r->pt.value);
            printf("PPO value model: a LoRA adapter of its own (r %d, %zu parameters) and a score head (%d -> 1) on the same "
                   "frozen base\n", r->pt.value.lo->r, r->pt.value.lo->n, m->cfg.C);
        }
    } else {
        if (dist_world(r->dist) > 1) die("--use_peft false runs on one process so far: train a LoRA adapter (--use_peft) on several GPUs");
        full_init_sharded(&r->ft, m, NULL, !strcmp(o->adam_moments, "bf16"));  // fp32 gradients and masters, AdamW's moments
        r->lora_bytes = r->ft.n * (2 * dtype_size(r->be->hp) + 2 * dtype_size(r->ft.mdt));
        printf("training: every weight (%zu values; gradients, fp32 masters and AdamW's moments in %s: %.1f MiB); the rollouts "
               "sample from the bf16 weights it trains\n", r->ft.n, o->adam_moments, r->lora_bytes / 1048576.0);
    }
    printf("memory (%s): weights %.1f MiB (linear %.1f MiB as %s), %s %.1f MiB\n", r->be->name,
           (m->w.dense_bytes + m->w.fp8_bytes) / 1048576.0, m->w.linear_bytes / 1048576.0, o->load_in_fp8,
           r->lo ? "LoRA + AdamW" : "gradients + masters + AdamW", r->lora_bytes / 1048576.0);
    if (r->be->mem_capacity() > 0) {  // a device with a memory budget (not the host)
        // the time-shared arena (KV cache during rollouts, activations during updates) gets what
        // --gpu_memory_utilization leaves after what is held now and a reserve for the backend's
        // scratch, which grows lazily (FP8 activation codes, 512 MiB logits chunks, LoRA copies)
        size_t budget = arena_budget(r), used = r->be->mem_in_use(NULL), reserve = (size_t)1 << 30;
        model_arena_init(m, budget - used - reserve);
        printf("arena (KV cache during rollouts, activations during updates): up to %.2f GiB, grown on demand\n",
               (budget - used - reserve) / 1073741824.0);
    }
}

// the held-out accuracy of the model as it is now with the adapter lo (or NULL) (greedy, eval_size
// problems) (several ranks: each evaluates its slice of the problems, the counts are summed)
static double held_out_accuracy(Run *r, LoRA *lo) {
    int n = eval_count(&r->task, r->o.eval_size), W = r->dp.world, k = r->dp.rank;
    if (n == 0 || r->task.n_unanswered) return NAN;  // (greedy correctness needs every problem's answer)
    double correct =
        evaluate_range(&r->m, lo, &r->task, &r->fmt, (int)((long)n * k / W), (int)((long)n * (k + 1) / W), r->Tc, r->eos, r->neos, NULL);
    dist_all_reduce_sum_f64_host(r->dist, &correct, 1);
    return correct / n;
}

// the algorithm as the lines and the plot name it: PPO (--algo ppo), RLOO (the GRPO loop with
// --advantage_estimator rloo: TRL's RLOOTrainer), else GRPO
static const char *algo_name(const Run *r) { return r->ppo ? "PPO" : r->g.advantage_estimator == ADV_RLOO ? "RLOO" : "GRPO"; }

// what to print for an accuracy that is not there (evaluate's NaN, or no line in metrics.jsonl)
static const char *no_accuracy(const Run *r) {
    if (r->o.eval_size == 0) return "not measured (--eval_size 0)";
    if (task_size(&r->task, SPLIT_HELDOUT) == 0) return "not measured (no held-out problems)";
    if (r->task.n_unanswered) return "not measured (lines of the data have no \"answer\")";
    return "not in metrics.jsonl";
}

// The shapes of a step, and where the run starts: a checkpoint's step (--resume), or 0 with
// the held-out accuracy before GRPO (LoRA off: the frozen model alone) as metrics line 0.
// Rank 0 reads the checkpoint and sends it to the others (so only rank 0's disk needs it); a fresh
// run sends rank 0's initial adapter (the same seed gives the same one, but this way the copies are
// equal by construction, as DDP broadcasts the model at its start).
static void begin(Run *r) {
    const Opts *o = &r->o;
    r->dp = dp_batch(r->dist, o->per_device_train_batch_size, r->g.num_generations);
    if (o->resume && r->rank0) {
        r->start = load_checkpoint(r);
        metrics_truncate(r->metrics, r->start);
        printf("resumed from %s/checkpoint-%d\n", r->dir, r->start);
    } else if (r->rank0) run_dir_start(r->dir, o->overwrite_output_dir);
    LoRA *lo = r->lo;
    if (lo) dist_broadcast(r->dist, r->be, lo->params, lo->n * dtype_size(lo->sdt), 0);
    if (lo && o->resume) {
        dist_broadcast(r->dist, r->be, lo->m, lo->n * dtype_size(lo->sdt), 0);
        dist_broadcast(r->dist, r->be, lo->v, lo->n * dtype_size(lo->sdt), 0);
        dist_broadcast_host(r->dist, &lo->step, sizeof lo->step, 0);
    }
    if (o->resume) dist_broadcast_host(r->dist, &r->start, sizeof r->start, 0);
    if (r->rank0) hist_from_metrics(&r->hist, r->metrics);
    r->end = r->start > o->max_steps ? r->start : o->max_steps;

    r->G = r->g.num_generations, r->S = o->per_device_train_batch_size, r->P = r->S / r->G, r->Tc = r->g.max_completion_length;
    r->total_updates = (long)o->max_steps * (r->ppo ? r->pc.num_ppo_epochs * r->pc.num_mini_batches : r->g.num_iterations);
    r->lr_warmup = warmup_steps_from_ratio(o->warmup_ratio, r->total_updates);
    r->inv_temp = (float)(1.0 / o->temperature);
    r->R = r->rewards.R;  // the built-in rewards (their own default weights), then the programs' (1.0)
    double defaults[GRPO_MAX_REWARDS];
    for (int k = 0; k < r->R; k++) defaults[k] = 1.0, r->reward_names[k] = r->rewards.names[k];
    for (int k = 0; k < r->rewards.n_builtin; k++) defaults[k] = REWARD_FUNCS[r->rewards.builtin[k]].weight;
    char err[256];
    if (grpo_resolve_reward_weights(&r->g, r->R, defaults, r->reward_names, r->weights, err, sizeof err) < 0) die("%s", err);

    r->acc = NAN;
    if (o->resume && r->start >= o->max_steps) {  // a finished run: finish() reports what metrics.jsonl holds
        printf("checkpoint-%d is at --max_steps %d: nothing left to do (a larger --max_steps trains on); the run's "
               "figures, from %s:\n", r->start, o->max_steps, r->metrics);
        return;
    }
    if (!o->resume) {
        double acc = held_out_accuracy(r, NULL);  // the base model
        long avail = task_size(&r->task, SPLIT_HELDOUT);
        if (isfinite(acc))
            printf("held-out accuracy before %s: %.3f (%ld held-out problems, greedy)\n", algo_name(r), acc,
                   avail >= 0 && avail < o->eval_size ? avail : (long)o->eval_size);
        else printf("held-out accuracy before %s: %s\n", algo_name(r), no_accuracy(r));
        if (r->rank0) {
            FILE *mf = fopenCheck(r->metrics, "a");
            if (isfinite(acc)) fprintf(mf, "{\"step\": 0, \"eval/accuracy\": %.6f}\n", acc);
            else fprintf(mf, "{\"step\": 0, \"eval/accuracy\": null}\n");
            fclose(mf);
        }
        hist_add(&r->hist, 0, NAN, acc, NAN, NAN);
    }
    if (r->ppo) {
        const PpoConfig *c = &r->pc;
        printf("PPO: %d steps x %d prompts x %d completions, max %d new tokens, %d epochs x %d mini-batches, cliprange %g, "
               "vf_coef %g, kl_coef %g (%s), gamma %g, lam %g, lr %g\n", o->max_steps, r->dp.P_all, r->G, r->Tc, c->num_ppo_epochs,
               c->num_mini_batches, c->cliprange, c->vf_coef, c->kl_coef, c->kl_estimator == PPO_KL_K3 ? "k3" : "k1", c->gamma,
               c->lam, o->learning_rate);
    } else
        printf("%s: %d steps x %d prompts x %d completions, max %d new tokens, loss %s, beta %g, lr %g\n", algo_name(r),
               o->max_steps, r->dp.P_all, r->G, r->Tc, grpo_loss_type_name(r->g.loss_type), r->g.beta, o->learning_rate);
    if (r->dp.world > 1)
        printf("data parallel: %d ranks x %d prompts; gradients summed over them by %s, optimizer replicated\n", r->dp.world, r->P,
               dist_transport(r->dist, r->be));
}

// The steps (train/grpo_train.h), set up from the run
static void step_alloc(Run *r, GrpoStep *s) {
    const Opts *o = &r->o;
    memory_options(o, r->memory_help, sizeof r->memory_help);
    GrpoSetup u = {&r->g, &r->task, &r->fmt, r->tok, &r->rewards, r->rmodel.tok ? &r->rmodel : NULL, r->weights, r->dist, r->dp,
                   {r->G, r->Tc, (float)o->temperature, (float)o->top_p, o->top_k, r->eos, r->neos, 16, 1},
                   (uint64_t)o->seed, o->max_steps, r->inv_temp,
                   {o->lr_scheduler_type, o->learning_rate, o->adam_beta1, o->adam_beta2, o->adam_epsilon, o->weight_decay,
                    o->max_grad_norm, r->lr_warmup, r->total_updates},
                   o->micro_batch_size, o->gradient_checkpointing ? 1 : -1, r->memory_help};
    grpo_step_init(s, &u);
    if (r->ppo) r->score = (double *)mallocCheck((size_t)r->S * sizeof(double));
}

// PPO's step (--algo ppo; train/ppo_train.h): GRPO's rollout, rewards and batch (train/grpo_train.h), each
// completion's score; then ppo_step: the reference (LoRA off), old-policy and value passes, the per-token
// rewards and GAE, num_ppo_epochs x num_mini_batches updates of the policy adapter and the value model
// (adapter + head)
static void ppo_train_step(Run *r, GrpoStep *s, int step) {
    grpo_rollout(s, &r->m, r->lo, step);
    grpo_score(s, &r->m, step);  // (of the advantages, PPO uses only the reward metrics)
    ppo_scores(&r->pc, s->S, s->R, s->rewards, r->weights, s->trunc, r->score);
    double t_train0 = now_sec();
    grpo_batch(s, &r->m);
    PpoBatch b = {s->S, s->T, s->Tc, s->ids, s->tg, s->start, s->ro.len, s->trunc, r->score, r->inv_temp};
    ppo_step(&r->pt, &r->m, r->lo, &b, s->mb, &s->u.oc, step, &r->ps);
    s->loss = r->ps.loss, s->gnorm = r->ps.grad_norm, s->lr = r->ps.lr, s->t_ref = r->ps.t_rollout_passes;
    s->t_reduce = s->t_reduce_min = 0;
    s->t_train = now_sec() - t_train0, s->t_total = now_sec() - s->t_step;
}

// held-out accuracy every eval_steps and after the last step
static int eval_due(const Run *r, int step) { return (r->o.eval_steps > 0 && step % r->o.eval_steps == 0) || step == r->o.max_steps; }

// after the first step, once every buffer has been made: the memory by part
static void memory_report(const Run *r, const GrpoStep *s) {
    const Model *m = &r->m;
    size_t peak = 0;
    r->be->mem_in_use(&peak);
    printf("memory after the first step: weights %.1f MiB, %s %.1f MiB, activations %.1f MiB "
           "(%s), KV cache %.1f MiB (during the rollout), decode scratch %.1f MiB; peak held %.1f MiB\n",
           (m->w.dense_bytes + m->w.fp8_bytes) / 1048576.0, r->lo ? "LoRA + AdamW" : "gradients + masters + AdamW",
           r->lora_bytes / 1048576.0, (m->acts.bytes + (r->lo ? lora_acts_bytes(r->lo, r->lo->ax_cap) : 0)) / 1048576.0, m->recompute ? "recomputed per layer" : "all layers kept",
           s->ro.kv_bytes / 1048576.0, m->dec.bytes / 1048576.0, peak / 1048576.0);
    if (r->rmodel.tok) reward_model_report(&r->rmodel, stdout);
    if (m->arena.cap)
        printf("arena: %.1f MiB, time-shared: KV cache %.1f MiB at most, activations %.1f MiB at most "
               "(separate allocations would hold %.1f MiB)\n",
               m->arena.bytes / 1048576.0, m->arena.peak_kv / 1048576.0, m->arena.peak_acts / 1048576.0,
               (m->arena.peak_kv + m->arena.peak_acts) / 1048576.0);
}

// PPO's figures under TRL's PPOTrainer names (policy/entropy_avg, the entropy of the whole distribution, is
// not here: the logprobs op gives the sampled token's log-prob alone); grad_norm/value and val/mean are this
// program's: the value model's gradient norm and its mean prediction over the rollout's tokens
static void log_ppo(cJSON *j, const PpoStepStats *p) {
    add_num(j, "objective/kl", p->kl);
    add_num(j, "objective/entropy", p->entropy);
    add_num(j, "objective/non_score_reward", p->non_score_reward);
    add_num(j, "objective/rlhf_reward", p->rlhf_reward);
    add_num(j, "objective/scores", p->scores);
    add_num(j, "policy/approxkl_avg", p->approxkl);
    add_num(j, "policy/clipfrac_avg", p->pg_clipfrac);
    add_num(j, "loss/policy_avg", p->pg_loss);
    add_num(j, "loss/value_avg", p->vf_loss);
    add_num(j, "val/clipfrac_avg", p->vf_clipfrac);
    add_num(j, "val/ratio", p->ratio);
    add_num(j, "val/ratio_var", p->ratio_var);
    add_num(j, "val/mean", p->value_mean);
    add_num(j, "grad_norm/value", p->value_grad_norm);
}

// Stage "log": the step's metrics.jsonl line (TRL's names), the plot's history, the printed line.
static void log_step(Run *r, const GrpoStep *s, int step) {
    if (!r->rank0) return;
    const Model *m = &r->m;
    const GrpoConfig *g = &r->g;
    int S = r->dp.S_all, T = s->T;  // (the update's tokens/s: this rank's T, all ranks' sequences)
    double t_upd = s->t_train - s->t_ref;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "step", step);
    add_num(j, "loss", s->loss);
    add_num(j, "grad_norm", s->gnorm);
    add_num(j, "learning_rate", s->lr);
    add_num(j, "reward", s->rm.reward);
    if (!r->ppo) add_num(j, "reward_std", s->rm.reward_std);  // (the groups' spread: GRPO's)
    for (int k = 0; k < r->R; k++) {
        char key[96];
        snprintf(key, sizeof key, "rewards/%s/mean", r->reward_names[k]);
        add_num(j, key, s->rm.func_mean[k]);
        snprintf(key, sizeof key, "rewards/%s/std", r->reward_names[k]);
        add_num(j, key, s->rm.func_std[k]);
    }
    if (r->ppo) log_ppo(j, &r->ps);
    else {
        add_num(j, "frac_reward_zero_std", s->rm.frac_reward_zero_std);
        add_num(j, "kl", s->gm.kl);
        add_num(j, "clip_ratio/low_mean", s->gm.clip_low_mean);
        add_num(j, "clip_ratio/high_mean", s->gm.clip_high_mean);
        add_num(j, "clip_ratio/region_mean", s->gm.clip_region_mean);
    }
    add_num(j, "completions/mean_length", (double)s->gen_tokens / S);  // (S, gen_tokens: all ranks')
    add_num(j, "completions/min_length", s->minlen);
    add_num(j, "completions/max_length", s->maxlen);
    add_num(j, "completions/clipped_ratio", (double)s->nclip / S);
    if (r->ppo) add_num(j, "val/num_eos_tokens", S - s->nclip);  // (TRL's: the EOS tokens sampled, one per finished completion)
    if (!r->ppo) {
        add_num(j, "sampling/sampling_logp_difference/mean", s->gm.sampling_logp_diff_mean);
        add_num(j, "sampling/sampling_logp_difference/max", s->gm.sampling_logp_diff_max);
        add_num(j, "sampling/importance_sampling_ratio/min", s->gm.is_ratio_min);
        add_num(j, "sampling/importance_sampling_ratio/mean", s->gm.is_ratio_mean);
        add_num(j, "sampling/importance_sampling_ratio/max", s->gm.is_ratio_max);
    }
    add_num(j, "eval/accuracy", r->acc);
    add_num(j, "step_time", s->t_total);
    add_num(j, "time/rollout", s->t_roll);
    add_num(j, "time/reward", s->t_reward);
    add_num(j, "time/reference", s->t_ref);
    add_num(j, "time/update", t_upd);
    if (r->dp.world > 1) {  // the ranks' mean waits for the slowest rank's rollout and update; the transfers
        add_num(j, "time/rank_wait", s->t_wait - s->t_wait_min);
        add_num(j, "time/update_wait", s->t_reduce - s->t_reduce_min);
        add_num(j, "time/all_reduce", s->t_reduce_min);
    }
    add_num(j, "tokens_per_sec/rollout", s->gen_tokens / fmax(s->t_roll, 1e-9));
    // (PPO: three passes before the updates, the reference, old-policy and value ones; then per epoch a forward and
    // backward of the value and of the policy each, counted once)
    double ref_passes = r->ppo ? 3 : (g->beta != 0) + (g->num_iterations > 1);
    double upd_tok_s = (double)(r->ppo ? r->pc.num_ppo_epochs : g->num_iterations) * S * T / fmax(t_upd, 1e-9);
    add_num(j, "tokens_per_sec/reference", ref_passes > 0 ? ref_passes * S * T / fmax(s->t_ref, 1e-9) : 0.0);
    add_num(j, "tokens_per_sec/update", upd_tok_s);
    size_t peak_held = 0;
    r->be->mem_in_use(&peak_held);
    add_num(j, "memory/weights_mib", (m->w.dense_bytes + m->w.fp8_bytes) / 1048576.0);
    add_num(j, "memory/lora_adamw_mib", r->lora_bytes / 1048576.0);
    add_num(j, "memory/kv_cache_mib", s->ro.kv_bytes / 1048576.0);
    add_num(j, "memory/activations_mib", m->acts.bytes / 1048576.0);
    if (m->arena.cap) add_num(j, "memory/arena_mib", m->arena.bytes / 1048576.0);
    add_num(j, "memory/peak_mib", peak_held / 1048576.0);
    char *line = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    FILE *mf = fopenCheck(r->metrics, "a");
    fprintf(mf, "%s\n", line);
    fclose(mf);
    free(line);
    double kl = r->ppo ? r->ps.kl : s->gm.kl;
    hist_add(&r->hist, step, s->rm.func_mean[0], r->acc, kl, (double)s->gen_tokens / S);
    if (!r->o.quiet && (step % r->o.logging_steps == 0 || step == r->o.max_steps)) {
        printf("step %4d/%d | reward %.3f", step, r->o.max_steps, s->rm.reward);
        if (!r->ppo) printf(" (std %.3f)", s->rm.reward_std);
        if (!strcmp(r->reward_names[0], "correctness")) printf(" | correct %.3f", s->rm.func_mean[0]);
        else printf(" | %s %.3f", r->reward_names[0], s->rm.func_mean[0]);
        if (isfinite(r->acc)) printf(" | held-out %.3f", r->acc);
        printf(" | len %.1f | kl %.4f | loss %+.4f | |g| %.3f | %.2f s: rollout %.2f (%.0f tok/s), reward %.2f, ref %.2f, "
               "update %.2f (%.0f tok/s)\n",
               (double)s->gen_tokens / S, isfinite(kl) ? kl : 0.0, s->loss, s->gnorm, s->t_total, s->t_roll,
               s->gen_tokens / fmax(s->t_roll, 1e-9), s->t_reward, s->t_ref, t_upd, upd_tok_s);
    }
    if (step == r->start + 1) memory_report(r, s);
}

// Stage "checkpoint": every save_steps and after the last step; then, with --save_total_limit,
// the oldest ones beyond the limit go (never the new one, nor the one the run resumed from)
static void checkpoint(const Run *r, int step) {
    if (r->rank0 && ((r->o.save_steps > 0 && step % r->o.save_steps == 0) || step == r->o.max_steps)) {
        save_checkpoint(r, step);
        if (r->o.save_total_limit > 0)
            rotate_checkpoints(r->dir, r->o.save_total_limit, step, r->o.resume ? r->start : -1, r->o.quiet);
    }
}

// a shell command line, built word by word
typedef struct {
    char s[16384];
    size_t n;
} CmdLine;

__attribute__((format(printf, 2, 3))) static void cmd_add(CmdLine *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(c->s + c->n, sizeof c->s - c->n, fmt, ap);
    va_end(ap);
    if (k > 0) c->n = c->n + k < sizeof c->s ? c->n + k : sizeof c->s - 1;
}

// one word, bare when it holds nothing the shell reads (or quote is 0), else in single quotes
static void cmd_word(CmdLine *c, const char *word, int quote) {
    for (const char *p = word; *p && !quote; p++) quote = !(isalnum((unsigned char)*p) || strchr("_./+=:,@%-", *p));
    cmd_add(c, "%s%s", c->n ? " " : "", quote ? "'" : "");
    for (const char *p = word; *p; p++) {
        if (*p == '\'' && quote) cmd_add(c, "'\\''");  // ' ends the quotes, \' is a quote, ' reopens them
        else cmd_add(c, "%c", *p);
    }
    if (quote) cmd_add(c, "'");
}

// The held-out problem the run's command shows: among the first 16, the first that the adapter answers
// and the base alone (LoRA off) does not, else the first the adapter answers, else the first; *why
// says which. Two greedy passes over them (rank 0 alone, after the run).
enum { SHOWCASE = 16 };
static int showcase_problem(Run *r, const char **why) {
    int n = eval_count(&r->task, SHOWCASE);
    *why = "a held-out problem";
    if (!r->lo || n == 0 || r->task.n_unanswered) return 0;
    double on[SHOWCASE], off[SHOWCASE];
    evaluate_range(&r->m, r->lo, &r->task, &r->fmt, 0, n, r->Tc, r->eos, r->neos, on);
    evaluate_range(&r->m, NULL, &r->task, &r->fmt, 0, n, r->Tc, r->eos, r->neos, off);
    for (int i = 0; i < n; i++)
        if (on[i] == 1 && off[i] != 1) {
            *why = "a held-out problem the adapter answers and the base model alone does not";
            return i;
        }
    for (int i = 0; i < n; i++)
        if (on[i] == 1) {
            *why = "a held-out problem the adapter answers (the base model alone answers the first 16 too)";
            return i;
        }
    return 0;
}

// The ./generate command that samples from the trained adapter: the run's paths, the frozen
// weights and cache as they were trained, and a held-out prompt (showcase_problem; a placeholder for a
// long one)
static void print_generate_command(Run *r) {
    const Opts *o = &r->o;
    CmdLine c = {.n = 0};
    char path[4300];
    const char *slash = strrchr(r->prog, '/');  // ./generate beside ./train_grpo
    snprintf(path, sizeof path, "%.*sgenerate", slash ? (int)(slash - r->prog + 1) : 0, r->prog);
    cmd_word(&c, path, 0);
    snprintf(path, sizeof path, "%s/checkpoint-%d", r->dir, r->end);
    cmd_add(&c, " --model");
    if (r->lo) {
        char wd[4200];
        const char *base = o->model ? o->model : path_for_shell(r->warm_dir, wd, sizeof wd);
        if (base[0] == '~') cmd_add(&c, " %s", base);  // bare, for the shell to expand
        else cmd_word(&c, base, 0);
        cmd_add(&c, " --lora");
    }
    cmd_word(&c, path, 0);  // the adapter, or (--use_peft false) the whole trained model
    if (strcmp(o->load_in_fp8, "block")) cmd_add(&c, " --load_in_fp8 %s", o->load_in_fp8);
    if (o->fp8_pow2) cmd_add(&c, " --fp8_pow2_scales");
    if (o->bf16_first_layers) cmd_add(&c, " --bf16_first_layers %d", o->bf16_first_layers);
    if (o->bf16_last_layers) cmd_add(&c, " --bf16_last_layers %d", o->bf16_last_layers);
    if (o->fp8_embeddings) cmd_add(&c, " --fp8_embeddings");
    if (strcmp(o->kv_cache_dtype, "auto")) cmd_add(&c, " --kv_cache_dtype %s", o->kv_cache_dtype);
    if (r->fmt.chat) cmd_add(&c, " --chat");
    if (r->fmt.chat && o->system_prompt && strlen(o->system_prompt) < 1000) {
        cmd_add(&c, " --system_prompt");
        cmd_word(&c, o->system_prompt, 1);
    }
    cmd_add(&c, " --max_new_tokens %d --prompt", r->Tc);
    const char *why;
    int i = showcase_problem(r, &why);
    Example ex;
    task_example(&r->task, task_size(&r->task, SPLIT_HELDOUT) != 0 ? SPLIT_HELDOUT : SPLIT_TRAIN, (uint64_t)i, &ex);
    cmd_word(&c, strlen(ex.prompt) <= 200 && !strchr(ex.prompt, '\n') ? ex.prompt : "YOUR PROMPT", 1);
    printf("try it: %s\n        (%s; its answer: %s)\n", c.s, why, ex.answer ? ex.answer : "none in the data");
    example_free(&ex);
}

// Stage "finish": the plot, the accuracy before and after, where everything is.
static void finish(Run *r) {
    History *h = &r->hist;
    char plot[4200];
    path_join(plot, sizeof plot, r->dir, "plot.svg");
    PlotSeries rs = {"correct (sampled)", h->step, h->reward, h->n, "#1f77b4", 0, 0};
    PlotSeries as = {"held-out (greedy)", h->step, h->acc, h->n, "#d62728", 0, 1};
    PlotSeries ks = {"kl", h->step, h->kl, h->n, "#2ca02c", 0, 0};
    PlotSeries ls = {"mean length", h->step, h->len, h->n, "#9467bd", 0, 0};
    PlotSeries top[2] = {rs, as};
    char title[96];
    snprintf(title, sizeof title, "%s: accuracy on training rollouts and on held-out problems", algo_name(r));
    PlotPanel panels[3] = {{title, "step", "", top, 2},
                           {"completion length", "step", "tokens", &ls, 1},
                           {"KL to the reference (LoRA off)", "step", "", &ks, 1}};
    plot_svg(plot, panels, (r->ppo ? r->pc.kl_coef : r->g.beta) != 0 ? 3 : 2);
    // before: metrics line 0; after: the last evaluation (the last step's, as eval_due always
    // evaluates it), both from the history, which holds metrics.jsonl's lines after a resume
    int i0 = -1, i1 = -1;
    for (int i = 0; i < h->n; i++)
        if (isfinite(h->acc[i])) {
            if (i0 < 0 && h->step[i] == 0) i0 = i;
            else if (h->step[i] > 0) i1 = i;
        }
    char a0[64], a1[64];
    const char *none = no_accuracy(r);
    acc_text(i0 >= 0 ? h->acc[i0] : NAN, none, a0, sizeof a0);
    acc_text(i1 >= 0 ? h->acc[i1] : NAN, none, a1, sizeof a1);
    if (i0 < 0 && i1 < 0) printf("held-out accuracy: %s\n", none);
    else printf("held-out accuracy: %s before %s -> %s after %d steps\n", a0, algo_name(r), a1, i1 >= 0 ? (int)h->step[i1] : r->end);
    printf("%s: %s/checkpoint-%d (%s)\nmetrics: %s\nplot: %s\n", r->lo ? "adapter" : "model", r->dir, r->end,
           r->lo ? "PEFT format" : "a Hugging Face checkpoint", r->metrics, plot);
    print_generate_command(r);
}

static void run_free(Run *r) {
    History *h = &r->hist;
    free(h->step), free(h->reward), free(h->acc), free(h->kl), free(h->len);
    r->m.lora = NULL;
    if (r->ppo) ppo_free(&r->pt);
    free(r->score);
    if (r->lo) lora_free(r->lo);
    else full_free(&r->ft);
    model_free(&r->m);
    tokenizer_free(r->tok);
    task_free(&r->task);
    reward_set_close(&r->rewards);
    reward_model_close(&r->rmodel);
}

// ----------------------------------------------------------------------------

int main(int argc, char **argv) {
    Run r;
    memset(&r, 0, sizeof r);
    r.prog = argv[0];
    parse_options(argc, argv, &r.o, &r.g, &r.pc, &r.gpu_util_given);
    r.ppo = !strcmp(r.o.algo, "ppo");
    dist_launch(argc, argv);  // --nproc_per_node N: start N of these (each goes on below), wait, exit
    setvbuf(stdout, NULL, _IOLBF, 0);
    r.dist = dist_from_env();  // the ranks (torchrun's or srun's environment; none: one process)
    r.rank0 = dist_rank(r.dist) == 0;
    read_inputs(&r);     // data, tokenizer, prompts: each bad input said before any directory exists
    prepare_output(&r);  // where the run writes; checked now, not after the warm-up
    load(&r);            // backend, model (the built-in one: warm-up, cached), LoRA
    begin(&r);           // resume a checkpoint, or the held-out accuracy before GRPO

    GrpoStep s;
    step_alloc(&r, &s);
    for (int step = r.start + 1; step <= r.o.max_steps; step++) {
        dp_test_kill(r.dist, step);
        if (r.ppo) ppo_train_step(&r, &s, step);  // the same rollout and rewards; values, GAE, epochs of clipped updates
        else grpo_train_step(&s, &r.m, r.lo, &r.ft, step);  // rollout -> rewards -> advantages -> batch -> update
        r.acc = eval_due(&r, step) ? held_out_accuracy(&r, r.lo) : NAN;  // evaluate
        log_step(&r, &s, step);
        checkpoint(&r, step);
        grpo_step_end(&s);
    }
    if (r.rank0) finish(&r);  // plot, accuracy before -> after, the generate command

    grpo_step_free(&s);
    run_free(&r);
    dist_finalize(r.dist);
    return 0;
}
