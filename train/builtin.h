// builtin.h: the built-in model of ./train_grpo and ./train_dpo's runs without --model: its shape,
// its supervised warm-up (made once per setting, cached as a Hugging Face checkpoint), and greedy
// held-out accuracy on a task (also what train_grpo evaluates a real checkpoint with).
//   defines: Formatter, encode_prompt (prompts as tokens), prompts_in_chat, builtin_config,
//            acc_text, eval_count, evaluate_range, evaluate (held-out accuracy), demo_answer,
//            WarmupSpec, warmup_cache_root, warmup_key, warmup_ensure (the warm-up and its cache)
#ifndef BUILTIN_H
#define BUILTIN_H

#include <stddef.h>

#include "model.h"
#include "tokenizer.h"
#include "tasks/tasks.h"

#ifdef __cplusplus
extern "C" {
#endif

// how a task's prompt becomes tokens
typedef struct {
    const Tokenizer *tok;
    int chat;            // prompts in the chat template
    const char *system;  // its system message, or NULL
    int max_prompt;      // tokens
} Formatter;

// the example's prompt as tokens (malloc'ed into *ids), their count: in the chat template (with the
// example's own messages, else with f's system message) or as text; dies on an empty prompt or one longer than max_prompt
int encode_prompt(const Formatter *f, const Example *ex, int **ids);
// Whether the prompts go into the chat template: chat_opt (the --chat option; -1: not given) or else
// whether the tokenizer of checkpoint model has one; the built-in model (model NULL) reads raw text.
// A system_prompt with no template to hold it dies in one line (it would be dropped without a word).
int prompts_in_chat(const Tokenizer *tok, int chat_opt, const char *system_prompt, const char *model);

// the built-in tiny model's shape (Qwen3-style, byte-level vocabulary of V); gpu: a larger one
// (hidden 256, 6 layers: ~7x the parameters)
Config builtin_config(int V, int gpu);

// an accuracy as printed: "0.650", or why there is none (never "nan")
const char *acc_text(double acc, const char *why_none, char *buf, size_t cap);
// the held-out problems an evaluation of n asks for that exist (0: none)
int eval_count(const Task *task, int n);
// the number of held-out problems i0 <= i < i1 the model with the adapter lo (NULL: the base model alone)
// answers correctly (greedy, up to max_new tokens, stopping at any of eos); each (or NULL): every problem's
// reward, i1 - i0 of them
double evaluate_range(Model *m, LoRA *lo, const Task *task, const Formatter *f, int i0, int i1, int max_new, const int *eos, int neos,
                      double *each);
// the share of the first n held-out problems answered correctly (NaN: none to evaluate)
double evaluate(Model *m, LoRA *lo, const Task *task, const Formatter *f, int n, int max_new, const int *eos, int neos);

// The answer a warm-up demonstration shows: ex's, or with probability p_forget, for an addition
// whose ones digits carry, the carry forgotten ("17+25=32")
void demo_answer(const Example *ex, double p_forget, Rng *r, char *out, size_t cap);

// what defines the built-in model's weights (train_grpo's options of those names)
typedef struct {
    const char *task;     // the built-in task the warm-up demonstrates ("arithmetic", "countdown")
    int max_operand;      // the task's
    int steps;            // warmup_sft_steps
    double carry_errors;  // warmup_carry_errors: demo_answer's p_forget
    long seed;
    int quiet;            // no progress lines
    int eval_size;        // the progress lines' held-out problems
    int max_new;          // and their tokens
} WarmupSpec;
// the settings of ./train_grpo's default run (its options' defaults: the two must agree, so that
// ./train_dpo's built-in run trains on the warm-up train_grpo made, and the other way round)
WarmupSpec warmup_spec_default(void);
// Where the warm-ups are cached (out): $XDG_CACHE_HOME/fp8-grpo, else ~/.cache/fp8-grpo. One cache
// for every run of the user, whatever its --output_dir or working directory, so that a setting's
// warm-up is made once; an adapter trained on one records its absolute path as its base.
void warmup_cache_root(char *out, size_t cap);
// dir as a person types it in a shell: "~/..." where it lies under $HOME (the rest plain letters, digits
// and "_./+=:,@%-"), else dir itself; out (cap bytes) holds the short form
const char *path_for_shell(const char *dir, char *out, size_t cap);
// The settings as JSON (json: what the cache's warmup.json holds) and the cache's directory:
// root/warmup-<a hash of them>. A run with other settings gets a directory of its own, so that a
// warm-up is never replaced by another under an adapter trained on it.
void warmup_key(const WarmupSpec *w, const Config *tc, const char *root, char *json, size_t jcap, char *dir, size_t dcap);
// dir as this warm-up's cache: found (its warmup.json must hold json, else one line and exit), or made
// (SFT of every weight of a random model of shape tc on be, on task demonstrations made in memory,
// then a Hugging Face checkpoint with f->tok's tokenizer.json, written whole and renamed into place).
// Under dir's lock (<root>/.warmup-<key>.lock): a run that needs a warm-up another is making waits for
// it, and finds it made.
void warmup_ensure(const WarmupSpec *w, const Config *tc, const Backend *be, const Task *task, const Formatter *f, const char *json,
                   const char *dir);

#ifdef __cplusplus
}
#endif
#endif  // BUILTIN_H
