// tasks.h: what the model is trained on and how it is scored. Built-in synthetic
// tasks (arithmetic, countdown) with seeded generators and a held-out split that
// is disjoint from training by construction; user data as JSONL in TRL's shape (a
// prompt as text or as messages, an optional answer with GSM8K "#### 72" answers,
// every other column kept); reward functions (correctness, format) in a table.
// Depends on common.h and cJSON (-lcjson). Host only, text in, numbers out: the
// tokenizer and the chat template are the caller's.
//
// Use:
//   Task t; task_open_or_die(&t, "countdown" | "arithmetic" | "data.jsonl", NULL);
//   Example ex; task_example(&t, SPLIT_TRAIN, i, &ex);   // the i-th training prompt
//   ... generate completions for ex.prompt ...
//   for r in REWARD_FUNCS: rewards[b][r] = REWARD_FUNCS[r].fn(&ex, completion_text, truncated);
//   example_free(&ex); task_free(&t);
// Adding a reward: write one `double fn(const Example *, const char *, int)` and
// add a line {name, fn, default weight} to REWARD_FUNCS in tasks.c.
#ifndef TASKS_H
#define TASKS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TASK_ARITHMETIC = 0, TASK_COUNTDOWN, TASK_JSONL } TaskKind;
typedef enum { SPLIT_TRAIN = 0, SPLIT_HELDOUT = 1 } Split;

#define COUNTDOWN_MAX_NUMS 6

// One problem. prompt and answer are owned (example_free).
typedef struct {
    TaskKind kind;
    char *prompt;   // the text the model continues: "17+25=", "3,5,7->22:", or the JSONL prompt
    char *answer;   // the expected final answer: "42"; countdown: one solution, "3*5+7" (any valid
                    // expression scores); JSONL: the answer, GSM8K's "... #### 1,234" -> "1234", or
                    // NULL for a line without one (a reward program judges its completions)
    char *system;   // JSONL conversational prompt: its system message (NULL: none)
    char *messages; // JSONL conversational prompt: the list of messages as the line gives it, JSON text
                    // (prompt then holds the user message); NULL: a text prompt
    char *columns;  // JSONL: every field of the line but the prompt, a JSON object's text (the reward
                    // programs' columns); NULL: a built-in task
    int nums[COUNTDOWN_MAX_NUMS];  // countdown: the numbers that may be used, each at most once
    int n_nums;
    long target;                   // countdown: the value to reach
    uint64_t key;   // hash of the problem's canonical form: what decides its split
} Example;
void example_free(Example *ex);

typedef struct {
    uint64_t seed;          // 1: the order of examples (never the split)
    int max_operand;        // 99: arithmetic operands in [0, max_operand]; a-b only with a >= b
    int countdown_numbers;  // 3: how many numbers a countdown problem gives (2..COUNTDOWN_MAX_NUMS)
    int countdown_max;      // 9: countdown numbers in [1, countdown_max]; targets up to 999
    double heldout_frac;    // 0.1: share of problems in the held-out split (0: none)
} TaskOptions;
TaskOptions task_options_default(void);

typedef struct {
    TaskKind kind;
    char name[256];           // "arithmetic", "countdown" or the JSONL path
    TaskOptions opt;
    Example *items;           // JSONL: every example of the file
    long n_items;
    long n_unanswered;        // JSONL lines without "answer"
    long n_conversational;    // JSONL lines whose prompt is a list of messages
    uint32_t *order[2];       // per split: arithmetic problem codes / JSONL item indices, seeded shuffle
    long n[2];                // sizes of order[]
} Task;

// The JSONL reader of every data file (a task's, ./train_sft's, ./train_dpo's), with limits, so that
// no input can hang a run or exhaust its memory: the file must be a regular file (a FIFO, a device
// such as /dev/zero or a directory is refused at once: a stream never ends), of at most
// JSONL_MAX_FILE bytes (its examples are held in memory for the whole run), each line of at most
// JSONL_MAX_LINE bytes and valid UTF-8. jsonl_reader_open: 0, or -1 with a one-line message in err.
// jsonl_next gives the next non-blank line parsed as one JSON value: 1 and *out (the caller
// cJSON_Deletes it), 0 at the end, or -1 with "path:line: ..." (not valid JSON, more than one value,
// too long, not UTF-8) in err. lineno: the line just read. jsonl_reader_close: what open made, freed.
#define JSONL_MAX_LINE ((size_t)1 << 20)  // 1 MiB: a 100k-token conversation fits, one JSON object
#define JSONL_MAX_FILE ((long)2 << 30)    // 2 GiB
#define JSONL_LIMITS "a regular file of UTF-8 text, at most 2 GiB, lines up to 1 MiB"  // (--help's words for both)
struct cJSON;
typedef struct {
    FILE *f;
    const char *path;  // for the messages
    char *line;        // the line just read (NUL-terminated, its '\n' dropped), up to JSONL_MAX_LINE bytes
    size_t cap;
    long lineno;
} JsonlReader;
int jsonl_reader_open(JsonlReader *r, const char *path, char *err, size_t cap);
int jsonl_next(JsonlReader *r, struct cJSON **out, char *err, size_t cap);
void jsonl_reader_close(JsonlReader *r);

// spec: "arithmetic", "countdown", or a path to a .jsonl file. opt NULL = defaults.
// Returns 0, or -1 with a one-line message ("data.jsonl:3: missing \"answer\"").
int task_open(Task *t, const char *spec, const TaskOptions *opt, char *err, size_t errcap);
void task_open_or_die(Task *t, const char *spec, const TaskOptions *opt);
void task_free(Task *t);
// A JSONL task's held-out split from a file of its own (--eval_data): every example of path, in the
// format of the task's file; the task must have been opened with heldout_frac 0 (all of its own
// examples train). Returns 0 (*both: how many of path's prompts the training file holds too, which the
// evaluation then measures on problems seen in training), or -1 with a one-line message in err.
int task_set_eval_file(Task *t, const char *path, long *both, char *err, size_t errcap);
// distinct problems in a split; -1 for countdown (generated on demand, effectively unlimited)
long task_size(const Task *t, Split s);
// The i-th example of a split, the same for the same (task, options, i) on every
// run. Arithmetic and JSONL cycle through a seeded shuffle of their split;
// countdown draws problem i from its own seeded stream, rejecting problems of
// the other split. Dies (clear message) when the split is empty.
void task_example(const Task *t, Split s, uint64_t i, Example *out);
// the split a problem belongs to, from its canonical form ("3,5,7->22", "17+25=")
Split task_split_of_key(uint64_t key, double heldout_frac);
uint64_t task_key(const char *canonical);

// ----------------------------------------------------------------------------
// countdown expressions: + - * / and parentheses over non-negative integer
// literals, evaluated exactly in rationals (8/3*3 == 8). No unary minus.

typedef struct { int64_t num, den; } Rational;  // den > 0, reduced
// 0 and the value (and the literals used, in order), or -1 with the reason in
// err: "unexpected '*' at 3", "division by zero", "missing ')'", ...
int expr_eval(const char *s, Rational *value, long *literals, int max_literals, int *n_literals, char *err, size_t errcap);
// 1 when expr is valid, uses only the given numbers (each at most once) and equals
// target; else 0 with the reason in err (may be NULL).
int countdown_check(const int *nums, int n_nums, long target, const char *expr, char *err, size_t errcap);

// ----------------------------------------------------------------------------
// rewards. completion: the generated text, decoded without special tokens (no
// EOS). truncated: 1 when generation stopped at max_completion_length, not at EOS.

typedef double (*RewardFn)(const Example *ex, const char *completion, int truncated);
typedef struct {
    const char *name;  // logged as rewards/<name>/mean
    RewardFn fn;
    double weight;     // default weight (GRPOConfig.reward_weights overrides)
} RewardDef;
extern const RewardDef REWARD_FUNCS[];
extern const int N_REWARD_FUNCS;

// 1.0 when the final answer is right. Built-in tasks: the completion is the bare
// answer, optionally inside <answer>...</answer>; countdown: an expression that
// countdown_check accepts. JSONL: the answer inside <answer>...</answer>, else
// after the last "####", else inside the last \boxed{}, else the whole text; for a
// numeric expected answer the number found there (first after ####, else the
// last; commas and $ ignored) must equal it, else the text must (case-insensitive).
// NaN (does not apply) for a JSONL line without an answer.
double reward_correctness(const Example *ex, const char *completion, int truncated);
// 1.0 when well-formed and ended by EOS (not truncated). Arithmetic: an integer
// and nothing else; countdown: a syntactically valid expression and nothing else
// (both optionally inside <answer></answer>); JSONL: an explicit final answer
// (<answer></answer>, "####" or \boxed{}).
double reward_format(const Example *ex, const char *completion, int truncated);
// The final-answer text the rewards look at (see reward_correctness), into out.
// Returns 1 when an explicit marker (<answer>, ####, \boxed) was found, else 0.
int extract_answer(const Example *ex, const char *completion, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
#endif  // TASKS_H
