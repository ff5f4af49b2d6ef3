// reward_program.c: a reward program kept alive over JSON lines (reward_program.h says the protocol).
// Every wait is bounded: the request is written and the answer read with poll() against one deadline,
// so a program that stops reading or never answers costs the timeout, never a hang.
#include "tasks/reward_program.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/common.h"

// ----------------------------------------------------------------------------
// the process

static int valid_name(const char *s, size_t n) {
    if (n == 0 || n >= 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("_-.", s[i])) return 0;
    return 1;
}

int reward_program_start(RewardProgram *p, const char *cmd, const char *names, char *err, size_t cap) {
    memset(p, 0, sizeof *p);
    p->cmd = cmd;
    snprintf(p->label, sizeof p->label, "reward program '%.60s'", names);
    for (const char *s = names;; p->n_names++) {
        size_t n = strcspn(s, "+");
        if (!valid_name(s, n))
            return error_msg(err, cap, "--reward_names: '%s': a name is 1-63 letters, digits, '_', '-' or '.', several joined by '+'", names);
        if (p->n_names == REWARD_PROGRAM_MAX_NAMES)
            return error_msg(err, cap, "--reward_names: '%s': at most %d rewards from one program", names, REWARD_PROGRAM_MAX_NAMES);
        memcpy(p->names[p->n_names], s, n);
        p->names[p->n_names][n] = 0;
        for (int k = 0; k < p->n_names; k++)
            if (!strcmp(p->names[k], p->names[p->n_names])) return error_msg(err, cap, "--reward_names: '%s' names '%s' twice", names, p->names[k]);
        if (!s[n]) {
            p->n_names++;
            break;
        }
        s += n + 1;
    }
    if (!*cmd) return error_msg(err, cap, "--reward_cmd is empty: give the command that runs the program");
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC)) return error_msg(err, cap, "%s: cannot make pipes: %s", p->label, strerror(errno));
    signal(SIGPIPE, SIG_IGN);  // a program that exits makes our write fail with EPIPE, which is said, not a silent death
    fflush(stdout);            // (the child must not write our buffered lines again)
    pid_t pid = fork();
    if (pid < 0) {
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        return error_msg(err, cap, "%s: cannot start it: %s", p->label, strerror(errno));
    }
    if (pid == 0) {  // the program: its own process group (stopped as one), stdin and stdout the pipes
        setpgid(0, 0);
        signal(SIGPIPE, SIG_DFL);
        dup2(in[0], 0);
        dup2(out[1], 1);
        long maxfd = sysconf(_SC_OPEN_MAX);
        for (int fd = 3; fd < (maxfd > 0 && maxfd < 65536 ? maxfd : 65536); fd++) close(fd);  // (none of ours: a lock, a file)
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);  // (both sides: whichever runs first)
    close(in[0]), close(out[1]);
    p->pid = pid, p->to = in[1], p->from = out[0];
    fcntl(p->to, F_SETFL, O_NONBLOCK);
    fcntl(p->from, F_SETFL, O_NONBLOCK);
    return 0;
}

static void kill_program(RewardProgram *p) {
    if (!p->pid) return;
    kill(-p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
}

void reward_program_stop(RewardProgram *p) {
    if (p->pid) {
        close(p->to), p->to = -1;
        int st;
        for (int i = 0; i < 200 && waitpid(p->pid, &st, WNOHANG) == 0; i++) nanosleep(&(struct timespec){0, 10000000}, NULL);
        if (waitpid(p->pid, &st, WNOHANG) == 0) kill_program(p);  // (still there: killed, and reaped)
        else kill(-p->pid, SIGKILL), p->pid = 0;                   // (its children, if it left any)
        close(p->from);
    }
    free(p->buf);
    p->buf = NULL;
    p->len = p->cap = 0;
}

// ----------------------------------------------------------------------------
// the request

static cJSON *parse_or_null(const char *text) { return text ? cJSON_Parse(text) : NULL; }

// the example's columns: the data's other fields; a built-in task's answer (countdown: its numbers too)
static cJSON *example_columns(const Example *ex) {
    if (ex->columns) return parse_or_null(ex->columns);
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "answer", ex->answer);
    if (ex->kind == TASK_COUNTDOWN) {
        cJSON_AddItemToObject(c, "nums", cJSON_CreateIntArray(ex->nums, ex->n_nums));
        cJSON_AddNumberToObject(c, "target", (double)ex->target);
    }
    return c;
}

char *reward_request(const Example *ex, int G, int S, char *const *completions, const int *ids, const int *lens, int Tc,
                     const unsigned char *truncated, int step, int max_steps) {
    int P = S / G;
    cJSON *req = cJSON_CreateObject(), *prompts = cJSON_AddArrayToObject(req, "prompts");
    cJSON *comps = cJSON_AddArrayToObject(req, "completions"), *cids = cJSON_AddArrayToObject(req, "completion_ids");
    cJSON *trunc = cJSON_AddArrayToObject(req, "truncated"), *state = cJSON_AddObjectToObject(req, "trainer_state");
    cJSON_AddNumberToObject(state, "global_step", step);
    cJSON_AddNumberToObject(state, "max_steps", max_steps);
    cJSON **cols = (cJSON **)callocCheck(P, sizeof(cJSON *));
    for (int p = 0; p < P; p++) cols[p] = example_columns(&ex[p]);
    for (int q = 0; q < S; q++) {
        const Example *e = &ex[q / G];
        cJSON_AddItemToArray(prompts, e->messages ? parse_or_null(e->messages) : cJSON_CreateString(e->prompt));
        if (e->messages) {  // TRL's conversational completion: one assistant message
            cJSON *list = cJSON_CreateArray(), *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", completions[q]);
            cJSON_AddItemToArray(list, m);
            cJSON_AddItemToArray(comps, list);
        } else cJSON_AddItemToArray(comps, cJSON_CreateString(completions[q]));
        cJSON_AddItemToArray(cids, cJSON_CreateIntArray(ids + (size_t)q * Tc, lens[q]));
        cJSON_AddItemToArray(trunc, cJSON_CreateBool(truncated[q]));
    }
    // every column any of the step's examples has, in the order first seen, a value per completion
    for (int p = 0; p < P; p++)
        for (const cJSON *c = cols[p] ? cols[p]->child : NULL; c; c = c->next) {
            if (cJSON_GetObjectItemCaseSensitive(req, c->string)) continue;
            cJSON *list = cJSON_AddArrayToObject(req, c->string);
            for (int q = 0; q < S; q++) {
                const cJSON *v = cJSON_GetObjectItemCaseSensitive(cols[q / G], c->string);
                cJSON_AddItemToArray(list, v ? cJSON_Duplicate(v, 1) : cJSON_CreateNull());
            }
        }
    for (int p = 0; p < P; p++) cJSON_Delete(cols[p]);
    free(cols);
    char *line = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    return line;
}

// ----------------------------------------------------------------------------
// talking to it

enum { IO_OK = 0, IO_EXITED = -1, IO_TIMEOUT = -2, IO_TOO_LONG = -3 };

static int ms_left(double deadline) {
    double s = deadline - now_sec();
    return s <= 0 ? 0 : s > 1e6 ? 1000000000 : (int)(s * 1000) + 1;
}

// read what is there now into p->buf: IO_OK, IO_EXITED (end of its stdout) or IO_TOO_LONG
static int drain(RewardProgram *p) {
    for (;;) {
        if (p->len + 65536 + 1 > p->cap) {
            if (p->len > REWARD_ANSWER_MAX) return IO_TOO_LONG;
            p->cap = p->cap ? 2 * p->cap : 65536 * 2;
            p->buf = (char *)reallocCheck(p->buf, p->cap);
        }
        ssize_t k = read(p->from, p->buf + p->len, 65536);
        if (k > 0) p->len += (size_t)k;
        else if (k == 0) return IO_EXITED;
        else if (errno == EINTR) continue;
        else return IO_OK;  // EAGAIN: nothing more now
    }
}

// write request + '\n' while reading whatever the program writes meanwhile (a program that answers
// before it has read everything must not block us both)
static int send_request(RewardProgram *p, const char *request, double deadline) {
    size_t n = strlen(request), done = 0;
    while (done <= n) {
        struct pollfd fds[2] = {{p->to, POLLOUT, 0}, {p->from, POLLIN, 0}};
        int r = poll(fds, 2, ms_left(deadline));
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) return IO_TIMEOUT;
        if (fds[1].revents) {
            int rc = drain(p);
            if (rc) return rc;
        }
        if (fds[0].revents & (POLLERR | POLLHUP)) return IO_EXITED;
        if (fds[0].revents & POLLOUT) {
            ssize_t k = done < n ? write(p->to, request + done, n - done) : write(p->to, "\n", 1);
            if (k > 0) done += (size_t)k;
            else if (k < 0 && errno == EPIPE) return IO_EXITED;
        }
    }
    return IO_OK;
}

// until p->buf holds a whole line: IO_OK and its length (without '\n') in *n, or why not
static int read_line(RewardProgram *p, double deadline, size_t *n) {
    for (;;) {
        char *nl = p->len ? (char *)memchr(p->buf, '\n', p->len) : NULL;
        if (nl) {
            *n = (size_t)(nl - p->buf);
            return IO_OK;
        }
        if (p->len > REWARD_ANSWER_MAX) return IO_TOO_LONG;
        struct pollfd fd = {p->from, POLLIN, 0};
        int r = poll(&fd, 1, ms_left(deadline));
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) return IO_TIMEOUT;
        int rc = drain(p);
        if (rc == IO_EXITED) {  // a last line without '\n' is still read: then the next read says it exited
            nl = p->len ? (char *)memchr(p->buf, '\n', p->len) : NULL;
            if (!nl) return IO_EXITED;
        } else if (rc) return rc;
    }
}

static void consume(RewardProgram *p, size_t n) {  // drop n bytes and the '\n' after them
    size_t k = n + 1 <= p->len ? n + 1 : p->len;
    memmove(p->buf, p->buf + k, p->len - k);
    p->len -= k;
}

// what the program wrote, quoted for a message: its first 200 characters
static const char *quote(const char *s, size_t n, char *q, size_t cap) {
    snprintf(q, cap, "\"%.*s%s\"", (int)(n < 200 ? n : 200), s, n > 200 ? "..." : "");
    return q;
}

static const char *exit_text(RewardProgram *p, char *t, size_t cap) {
    if (!p->pid) return "is not running";
    int st = 0;
    pid_t w;
    double until = now_sec() + 1;  // (its stdout ended: its exit follows)
    while ((w = waitpid(p->pid, &st, WNOHANG)) == 0 && now_sec() < until) nanosleep(&(struct timespec){0, 5000000}, NULL);
    if (w != p->pid) return snprintf(t, cap, "closed its stdout"), t;  // (still running: kill_program ends it)
    p->pid = 0;  // (reaped)
    if (WIFEXITED(st)) snprintf(t, cap, "exited with status %d%s", WEXITSTATUS(st), WEXITSTATUS(st) == 127 ? " (command not found?)" : "");
    else if (WIFSIGNALED(st)) snprintf(t, cap, "was killed by signal %d", WTERMSIG(st));
    else snprintf(t, cap, "exited");
    return t;
}

// the answer line into rewards; NULL, or what is wrong with it
static const char *parse_answer(const RewardProgram *p, const char *line, int S, double *rewards, int stride, char *why, size_t cap) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(line, &end, 0);
    while (j && end && isspace((unsigned char)*end)) end++;
    if (!j || (end && *end)) {
        cJSON_Delete(j);
        return "answered text that is not one JSON value";
    }
    const char *bad = NULL;
    for (int k = 0; k < p->n_names && !bad; k++) {
        const cJSON *list = j;
        if (cJSON_IsObject(j)) {
            list = cJSON_GetObjectItemCaseSensitive(j, p->names[k]);
            if (!list) snprintf(why, cap, "answered an object without \"%s\" (its --reward_names entry)", p->names[k]), bad = why;
        } else if (p->n_names > 1) snprintf(why, cap, "answered no object of the %d rewards its --reward_names entry declares", p->n_names), bad = why;
        if (bad) break;
        if (!cJSON_IsArray(list)) {
            snprintf(why, cap, "answered %s, not a list of rewards", cJSON_IsObject(list) ? "an object" : "a single value"), bad = why;
            break;
        }
        int n = cJSON_GetArraySize(list), q = 0;
        char of[80] = "";  // which of several rewards
        if (p->n_names > 1) snprintf(of, sizeof of, " of \"%s\"", p->names[k]);
        if (n != S) {
            snprintf(why, cap, "answered %d rewards for %d completions%s", n, S, of), bad = why;
            break;
        }
        for (const cJSON *v = list->child; v; v = v->next, q++) {
            if (cJSON_IsNull(v)) rewards[(size_t)q * stride + k] = NAN;
            else if (cJSON_IsNumber(v) && isfinite(v->valuedouble)) rewards[(size_t)q * stride + k] = v->valuedouble;
            else {
                snprintf(why, cap, "answered a reward that is not a finite number or null (entry %d%s)", q, of), bad = why;
                break;
            }
        }
    }
    if (!bad && cJSON_IsObject(j) && cJSON_GetArraySize(j) != p->n_names)
        snprintf(why, cap, "answered an object with keys its --reward_names entry does not declare"), bad = why;
    cJSON_Delete(j);
    return bad;
}

int reward_program_score(RewardProgram *p, const char *request, int S, int step, double timeout, double *rewards, int stride,
                         char *err, size_t cap) {
    double t0 = now_sec(), deadline = t0 + timeout;
    char q[256], why[160], t[96];
    size_t n = 0;
    int rc = p->pid ? drain(p) : IO_EXITED;  // anything it wrote unasked is not an answer to this request
    if (rc == IO_OK && p->len) {
        rc = error_msg(err, cap, "%s at step %d: wrote to stdout before its answer (before it was asked): %s; write logs to stderr",
                       p->label, step, quote(p->buf, p->len, q, sizeof q));
        kill_program(p);
        return rc;
    }
    if (rc == IO_OK) rc = send_request(p, request, deadline);
    if (rc == IO_OK) rc = read_line(p, deadline, &n);
    if (rc == IO_EXITED) rc = error_msg(err, cap, "%s at step %d: %s without answering%s%s", p->label, step, exit_text(p, t, sizeof t),
                                        p->len ? "; it wrote " : "", p->len ? quote(p->buf, p->len, q, sizeof q) : "");
    else if (rc == IO_TIMEOUT)
        rc = error_msg(err, cap, "%s at step %d: no answer within --reward_timeout %g s%s%s", p->label, step, timeout,
                       p->len ? "; it wrote " : "", p->len ? quote(p->buf, p->len, q, sizeof q) : "");
    else if (rc == IO_TOO_LONG)
        rc = error_msg(err, cap, "%s at step %d: answered a line longer than %zu MiB: %s", p->label, step, REWARD_ANSWER_MAX >> 20,
                       quote(p->buf, p->len, q, sizeof q));
    if (rc) {
        kill_program(p);
        return rc;
    }
    p->buf[n] = 0;
    const char *bad = parse_answer(p, p->buf, S, rewards, stride, why, sizeof why);
    if (bad) {
        // a second line soon after the first: the first was something printed before the answer
        quote(p->buf, n, q, sizeof q);
        consume(p, n);
        size_t n2;
        double grace = now_sec() + 1 < deadline ? now_sec() + 1 : deadline;
        if (read_line(p, grace, &n2) == IO_OK)
            rc = error_msg(err, cap, "%s at step %d: wrote to stdout before its answer: %s; write logs to stderr", p->label, step, q);
        else rc = error_msg(err, cap, "%s at step %d: %s: %s", p->label, step, bad, q);
        kill_program(p);
        return rc;
    }
    consume(p, n);
    p->seconds = now_sec() - t0;
    return 0;
}

// ----------------------------------------------------------------------------
// a run's rewards

static int add_name(RewardSet *rs, const char *name, char *err, size_t cap) {
    if (rs->R == REWARD_SET_MAX) return error_msg(err, cap, "more than %d rewards in all: use fewer", REWARD_SET_MAX);
    for (int k = 0; k < rs->R; k++)
        if (!strcmp(rs->names[k], name)) return error_msg(err, cap, "two rewards are named '%s': give each its own (--reward_names)", name);
    rs->names[rs->R++] = name;
    return 0;
}

static int open_builtins(RewardSet *rs, const char *funcs, char *err, size_t cap) {
    if (!strcmp(funcs, "none")) return 0;
    for (const char *s = funcs;;) {
        size_t n = strcspn(s, ",");
        int k = 0;
        while (k < N_REWARD_FUNCS && (strlen(REWARD_FUNCS[k].name) != n || strncmp(REWARD_FUNCS[k].name, s, n))) k++;
        if (k == N_REWARD_FUNCS) return error_msg(err, cap, "--reward_funcs: unknown reward '%.*s': use correctness, format or none", (int)n, s);
        if (add_name(rs, REWARD_FUNCS[k].name, err, cap)) return -1;
        rs->builtin[rs->n_builtin++] = k;
        if (!s[n]) return 0;
        s += n + 1;
    }
}

int reward_set_open(RewardSet *rs, const char *funcs, const char *const *cmds, int n_cmd, const char *names, const char *model,
                    double timeout, char *err, size_t cap) {
    memset(rs, 0, sizeof *rs);
    rs->timeout = timeout;
    rs->model_col = -1;
    if (open_builtins(rs, funcs ? funcs : n_cmd ? "none" : "correctness,format", err, cap)) return -1;
    if (names && !n_cmd) return error_msg(err, cap, "--reward_names names the --reward_cmd programs: add --reward_cmd");
    if (n_cmd > REWARD_SET_MAX) return error_msg(err, cap, "--reward_cmd: at most %d programs", REWARD_SET_MAX);
    for (int i = 0; i < n_cmd; i++) {
        char entry[1024];
        const char *s = names;
        for (int k = 0; s && k < i; k++) s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL;
        if (names && !s)
            return error_msg(err, cap, "--reward_names '%s' has fewer entries than the %d --reward_cmd programs: one each", names, n_cmd);
        if (s) snprintf(entry, sizeof entry, "%.*s", (int)strcspn(s, ","), s);
        else snprintf(entry, sizeof entry, "cmd%d", i);
        RewardProgram *p = &rs->prog[rs->n_prog];
        if (reward_program_start(p, cmds[i], entry, err, cap)) {
            reward_set_close(rs);
            return -1;
        }
        rs->n_prog++;
        for (int k = 0; k < p->n_names; k++)
            if (add_name(rs, p->names[k], err, cap)) {
                reward_set_close(rs);
                return -1;
            }
    }
    const char *extra = names;
    for (int k = 0; extra && k < n_cmd; k++) extra = strchr(extra, ',') ? strchr(extra, ',') + 1 : NULL;
    if (extra) {
        reward_set_close(rs);
        return error_msg(err, cap, "--reward_names '%s' has more entries than the %d --reward_cmd programs: one each", names, n_cmd);
    }
    if (model) {
        rs->model_col = rs->R;
        if (add_name(rs, model, err, cap)) {
            reward_set_close(rs);
            return -1;
        }
    }
    if (rs->R == 0) return error_msg(err, cap, "--reward_funcs none and no --reward_cmd or --reward_model: the run has no reward");
    return 0;
}

int reward_set_score(RewardSet *rs, const Example *ex, int G, int S, char *const *texts, const int *ids, const int *lens, int Tc,
                     const unsigned char *truncated, int step, int max_steps, double *out, char *err, size_t cap) {
    int R = rs->R;
    for (int q = 0; q < S; q++)
        for (int k = 0; k < rs->n_builtin; k++) out[(size_t)q * R + k] = REWARD_FUNCS[rs->builtin[k]].fn(&ex[q / G], texts[q], truncated[q]);
    rs->prog_seconds = 0;
    if (!rs->n_prog) return 0;
    double t0 = now_sec();
    char *request = reward_request(ex, G, S, texts, ids, lens, Tc, truncated, step, max_steps);
    int rc = 0;
    for (int i = 0, col = rs->n_builtin; i < rs->n_prog && !rc; col += rs->prog[i++].n_names)
        rc = reward_program_score(&rs->prog[i], request, S, step, rs->timeout, out + col, R, err, cap);
    free(request);
    rs->prog_seconds = now_sec() - t0;
    return rc;
}

void reward_set_close(RewardSet *rs) {
    for (int i = 0; i < rs->n_prog; i++) reward_program_stop(&rs->prog[i]);
    rs->n_prog = 0;
}
