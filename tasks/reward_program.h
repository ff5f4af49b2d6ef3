// reward_program.h: a reward in any language (--reward_cmd): a program kept alive beside the trainer
// and spoken to in JSON lines, with TRL's reward-function arguments by name; and RewardSet, a run's
// rewards: the built-in functions it uses, then its programs' rewards, as the columns of one table.
// Defines RewardProgram, reward_program_start / _score / _stop, reward_request, RewardSet,
// reward_set_open / _score / _close (reward_program.c). Depends on tasks.h, common.h and cJSON;
// POSIX (fork, pipes, poll). Several processes (one per GPU): each runs its own programs for its own
// completions, as each calls reward_set_score on its own rollouts.
//
// The protocol. The trainer starts the command once, `sh -c CMD` in a process group of its own; the
// program's stdin and stdout are pipes to the trainer, its stderr is the trainer's (the terminal).
// Each step the trainer writes ONE line, a JSON object with an entry per completion in every list
// (S of them: the step's prompts x num_generations, a prompt's entries repeated for its G
// completions, as TRL repeats its inputs):
//   "prompts"         the prompt's text; conversational data: its list of messages, as the line has it
//   "completions"     the completion's text (special tokens dropped); conversational data:
//                     [{"role": "assistant", "content": text}]
//   "completion_ids"  the completion's token ids (EOS included when it was sampled)
//   "truncated"       true where the completion reached max_completion_length without EOS (this
//                     project's own: TRL's functions cannot tell)
//   "trainer_state"   {"global_step": step, "max_steps": N}
//   every other column of the data's lines ("answer", ...; null where a line lacks it); the built-in
//   tasks give "answer" (countdown: "nums" and "target" too)
// and the program answers with ONE line: a list of S numbers or nulls (one reward), or an object of
// such lists keyed by the names its --reward_names entry declares ("format+exact": one program, two
// rewards). null means "does not apply": left out of the weighted sum, as TRL does with None.
// Any other answer stops the run with one line naming the cause and quoting the answer's first 200
// characters: the program exited, gave no answer within the timeout, answered text that is not JSON,
// the wrong number of rewards, something that is not a number or null, an object with other keys, a
// line longer than REWARD_ANSWER_MAX, or wrote to stdout before its answer (logs go to stderr).
// At the end of the run its stdin is closed; a program still there 2 s later is killed.
#ifndef REWARD_PROGRAM_H
#define REWARD_PROGRAM_H

#include <stddef.h>
#include <sys/types.h>

#include "tasks/tasks.h"

#ifdef __cplusplus
extern "C" {
#endif

#define REWARD_PROGRAM_MAX_NAMES 8
#define REWARD_ANSWER_MAX ((size_t)16 << 20)  // bytes of one answer line at most

typedef struct {
    const char *cmd;                              // the shell command line
    char label[96];                               // how messages name it: "reward program 'cmd0'"
    int n_names;                                  // rewards it answers: 1 (a list) or more (an object)
    char names[REWARD_PROGRAM_MAX_NAMES][64];     // their names (logged as rewards/<name>/mean)
    pid_t pid;                                    // its process (and process group); 0: not running
    int to, from;                                 // our ends of its stdin and stdout
    char *buf;                                    // what it wrote that is not consumed yet
    size_t len, cap;
    double seconds;                               // wall time of the last reward_program_score
} RewardProgram;

// Check names ("a" or "a+b+...": letters, digits, '_', '-', '.') and start cmd. 0, or -1 with a
// one-line message in err (nothing started).
int reward_program_start(RewardProgram *p, const char *cmd, const char *names, char *err, size_t cap);
// The step's request line (malloc'ed, no newline): ex (P = S / G examples), completions (S texts),
// ids (S, Tc) with lens (S), truncated (S).
char *reward_request(const Example *ex, int G, int S, char *const *completions, const int *ids, const int *lens, int Tc,
                     const unsigned char *truncated, int step, int max_steps);
// Send request, read the answer (waiting timeout seconds at most): rewards[q * stride + k] for the
// program's k-th name (NaN for null). 0, or -1 with "<label> at step N: <cause>" in err, the
// program killed.
int reward_program_score(RewardProgram *p, const char *request, int S, int step, double timeout, double *rewards, int stride,
                         char *err, size_t cap);
// Close its stdin, give it 2 s to exit, then kill its process group.
void reward_program_stop(RewardProgram *p);

// ----------------------------------------------------------------------------
// a run's rewards

#define REWARD_SET_MAX 8
typedef struct {
    int R;                                  // rewards (the table's columns): the built-in ones, the programs', then
                                            // a reward model's (train/reward_model.h)
    const char *names[REWARD_SET_MAX];      // (R)
    int n_builtin, builtin[REWARD_SET_MAX]; // the built-in ones, as indices of REWARD_FUNCS
    int n_prog;
    RewardProgram prog[REWARD_SET_MAX];
    double timeout;                         // seconds a program may take to answer
    double prog_seconds;                    // the programs' wall time in the last reward_set_score
    int model_col;                          // the reward model's column, last, which its caller fills; -1: none
} RewardSet;

// funcs: the built-in rewards, "correctness,format" or "none" (NULL: both without programs, none
// with them); cmds: n_cmd program command lines; names: their --reward_names, one comma-separated
// entry each ("a" or "a+b"; NULL: cmd0, cmd1, ...); model: a reward model's name (kept by the caller),
// whose column comes last and is left to the caller, or NULL. Starts the programs. 0, or -1 with one
// line in err (nothing left running).
int reward_set_open(RewardSet *rs, const char *funcs, const char *const *cmds, int n_cmd, const char *names, const char *model,
                    double timeout, char *err, size_t cap);
// The rewards of S completions (texts, ids (S, Tc), lens, truncated) of the examples ex (S / G of
// them) at step: out (S, R) row-major, NaN where a reward does not apply. 0, or -1 with one line in
// err (a program's failure; that program is killed). The reward model's column is not written.
int reward_set_score(RewardSet *rs, const Example *ex, int G, int S, char *const *texts, const int *ids, const int *lens, int Tc,
                     const unsigned char *truncated, int step, int max_steps, double *out, char *err, size_t cap);
void reward_set_close(RewardSet *rs);

#ifdef __cplusplus
}
#endif
#endif  // REWARD_PROGRAM_H
