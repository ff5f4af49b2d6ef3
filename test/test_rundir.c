// test/test_rundir.c: runs never mix (train/checkpoint.c, as ./train_grpo, ./train_sft, ./train_dpo
// and ./export use it). A process refused an output directory touches nothing in it, even one it
// made itself for a run that won the lock; the lock's file holds its holder's pid from the moment it
// can be seen, a killed holder's taken over; --overwrite and --overwrite_output_dir never remove a
// live run's files (export included, which holds the lock while it replaces the directory); a
// .checkpoint-N.deleting left by a kill during --save_total_limit pruning is finished by the next
// start; --resume refuses a damaged checkpoint (its manifest's sizes and checksums) and every option
// that changes what the run computes, naming it, and accepts the options README's "Runs never mix"
// lists as free to change. Each race is put in order by the checkpoint code's test hook
// (FP8GRPO_TEST_PAUSE, checkpoint.h: a process waits at a named point until the test lets it go), so
// every case runs the same way each time; "nothing touched" is every file's name and bytes compared.
// A removal removes a link, never what it points to.
#include <check.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define TMP_TEMPLATE "/tmp/fp8grpo_rundirXXXXXX"
#include "progutil.h"

// the built-in model after 3 warm-up steps (cached in each --output_dir): a run of a few steps in ~1 s
#define TINY "--device cpu --quiet --eval_size 0 --warmup_sft_steps 3 --per_device_train_batch_size 8"

// ----------------------------------------------------------------------------
// processes in a chosen order

// `exec cmd` started in the background, its stdout and stderr into log, with FP8GRPO_TEST_PAUSE=pause
// (NULL: none); its pid is the program's
static pid_t start(const char *cmd, const char *pause, const char *log) {
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        if (pause) setenv("FP8GRPO_TEST_PAUSE", pause, 1);
        char full[8400];
        snprintf(full, sizeof full, "exec %s >%s 2>&1", cmd, log);
        execl("/bin/sh", "sh", "-c", full, (char *)NULL);
        _exit(127);
    }
    return pid;
}
static int finish(pid_t pid) {  // its exit status (128 + the signal that ended it)
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
// the hook's rendezvous: a process stopped at its point (go.reached made), and letting it go on
static void wait_reached(const char *go) {
    char p[1300];
    snprintf(p, sizeof p, "%s.reached", go);
    for (int i = 0; i < 3000 && !file_exists(p); i++) usleep(10000);
    ck_assert_msg(file_exists(p), "no process reached the point of %s in 30 s", go);
}
static void let_go(const char *go) { write_text(go, ""); }

// a process that holds dir (checkpoint.h: dir_claim) until release_holder; its pid
static int holder_out;
static pid_t hold(const char *dir) {
    int ready[2], done[2];
    ck_assert(pipe(ready) == 0 && pipe(done) == 0);
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        close(done[1]);
        dir_claim(dir, 1);
        char c = 'x';
        if (write(ready[1], &c, 1) != 1) _exit(1);
        while (read(done[0], &c, 1) > 0) {}
        exit(0);  // (at exit, as a program's end: its lock file removed)
    }
    close(ready[1]), close(done[0]);
    char c;
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    close(ready[0]);
    holder_out = done[1];
    return pid;
}
static void release_holder(pid_t pid) {
    close(holder_out);
    ck_assert_int_eq(finish(pid), 0);
}

// every name under dir with its bytes' checksum (md5sum), as text: equal before and after = untouched
static void snapshot(const char *dir, char *out, size_t cap) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cd %s && find . | LC_ALL=C sort && find . -type f | LC_ALL=C sort | xargs -r md5sum", dir);
    ck_assert_int_eq(run_cmd(cmd, out, cap), 0);
}

// a refused command: exit 1 and its output one line "error: ...want..."
static void assert_refused(const char *cmd, const char *want) {
    char out[4096];
    int rc = run_cmd(cmd, out, sizeof out);
    ck_assert_msg(rc == 1, "%s: exit %d: %s", cmd, rc, out);
    char *e = strstr(out, "error: ");
    ck_assert_msg(e && (e == out || e[-1] == '\n') && strstr(e, want) && strchr(e, '\n') == e + strlen(e) - 1,
                  "%s: output '%s', want one error line with '%s'", cmd, out, want);
}
static void assert_log_refused(const char *log, const char *want) {
    char *t = read_file(log, NULL), *e = strstr(t, "error: ");
    ck_assert_msg(e && strstr(e, want) && strchr(e, '\n') == e + strlen(e) - 1, "%s: '%s', want one error line with '%s'", log, t,
                  want);
    free(t);
}
static int holder_pid_in(const char *dir) {  // the pid in dir/.lock
    char p[1300];
    snprintf(p, sizeof p, "%s/.lock", dir);
    char *t = read_file(p, NULL);
    int pid = atoi(t);
    free(t);
    return pid;
}

// ./export's input: the qwen3 fixture; the trainers': the built-in model warmed up (with a tokenizer)
static char qwen3[1024], warm[1200], sft_data[1200], dpo_data[1200];
static void setup(void) {
    static int done = 0;
    if (done) return;
    done = 1;
    fixture_path(qwen3, sizeof qwen3, "qwen3");
    warm_model(warm, sizeof warm);
    snprintf(sft_data, sizeof sft_data, "%s", tmp_path("sft.jsonl"));
    snprintf(dpo_data, sizeof dpo_data, "%s", tmp_path("dpo.jsonl"));
    char sft[4096] = "", dpo[4096] = "";
    for (int i = 0; i < 16; i++) {
        snprintf(sft + strlen(sft), sizeof sft - strlen(sft), "{\"prompt\": \"%d+%d=\", \"completion\": \"%d\"}\n", i, i % 5, i + i % 5);
        snprintf(dpo + strlen(dpo), sizeof dpo - strlen(dpo), "{\"prompt\": \"%d+%d=\", \"chosen\": \"%d\", \"rejected\": \"%d\"}\n", i,
                 i % 5, i + i % 5, i + i % 5 + 10);
    }
    write_text(sft_data, sft);
    write_text(dpo_data, dpo);
}

// each program's command into dir: train_grpo on the built-in model (its warm-up cached in dir), the
// others on the warmed-up model (export: the qwen3 fixture)
static void program_cmd(int k, const char *dir, const char *extra, char *cmd, size_t cap) {
    switch (k) {
    case 0: snprintf(cmd, cap, "./train_grpo " TINY " --output_dir %s %s", dir, extra); break;
    case 1: snprintf(cmd, cap, "./train_sft --device cpu --quiet --model %s --data %s --output_dir %s %s", warm, sft_data, dir, extra); break;
    case 2: snprintf(cmd, cap, "./train_dpo --device cpu --quiet --model %s --data %s --output_dir %s %s", warm, dpo_data, dir, extra); break;
    default: snprintf(cmd, cap, "./export --model %s --output_dir %s %s", qwen3, dir, extra);
    }
}
static const char *const PROGRAMS[4] = {"train_grpo", "train_sft", "train_dpo", "export"};

// ----------------------------------------------------------------------------
// the lock

// Two processes into one new directory: the one that made it loses the lock to the other, and is
// refused; it removes nothing at its exit (before: the directory it made and the winner's .lock with
// it), whichever program it is
START_TEST(test_refused_run_removes_nothing) {
    setup();
    for (int k = 0; k < 4; k++) {
        char dir[1200], go[1200], log[1200], cmd[4096], before[8192], after[8192], want[1400];
        snprintf(dir, sizeof dir, "%s", tmp_path("new"));
        snprintf(go, sizeof go, "%s", tmp_path("go-made"));
        snprintf(log, sizeof log, "%s", tmp_path("made.log"));
        snprintf(cmd, sizeof cmd, "rm -rf %s %s %s.reached", dir, go, go);
        ck_assert_int_eq(system(cmd), 0);
        program_cmd(k, dir, k == 3 ? "--overwrite" : "--overwrite_output_dir", cmd, sizeof cmd);
        pid_t loser = start(cmd, strcat(strcpy(want, "dir_made:"), go), log);
        wait_reached(go);  // it made dir, and has not tried the lock yet
        pid_t winner = hold(dir);
        snapshot(dir, before, sizeof before);
        let_go(go);
        ck_assert_int_eq(finish(loser), 1);
        snprintf(want, sizeof want, "%s is in use by another run (pid %d)", dir, (int)winner);
        assert_log_refused(log, want);
        snapshot(dir, after, sizeof after);
        ck_assert_msg(!strcmp(before, after), "%s touched the winner's directory:\n%s\nnow:\n%s", PROGRAMS[k], before, after);
        ck_assert_int_eq(holder_pid_in(dir), winner);
        release_holder(winner);
    }
}
END_TEST

// The lock's file names its holder from the moment it exists: a second process that finds it right
// after it was taken (the holder stopped there) reads the holder's pid, never "unknown"; the file a
// killed holder left is taken over and rewritten before anyone sees the new holder
START_TEST(test_lock_names_its_holder) {
    setup();
    char dir[1200], go[1200], log[1200], cmd[4096], pause[1300], want[1400];
    snprintf(dir, sizeof dir, "%s", tmp_path("pid"));
    for (int round = 0; round < 2; round++) {
        if (round == 1) {  // a holder killed outright: its .lock stays, with its pid
            pid_t dead = hold(dir);
            kill(dead, SIGKILL);
            ck_assert_int_eq(finish(dead), 128 + SIGKILL);
            ck_assert_int_eq(holder_pid_in(dir), dead);
        }
        snprintf(go, sizeof go, "%s", tmp_path(round ? "go-lock1" : "go-lock0"));
        snprintf(log, sizeof log, "%s", tmp_path("lock.log"));
        snprintf(pause, sizeof pause, "lock_taken:%s", go);
        program_cmd(0, dir, "", cmd, sizeof cmd);
        pid_t first = start(cmd, pause, log);
        wait_reached(go);  // .lock just taken
        ck_assert_int_eq(holder_pid_in(dir), first);
        snprintf(want, sizeof want, "%s is in use by another run (pid %d)", dir, (int)first);
        for (int k = 0; k < 4; k++) {
            program_cmd(k, dir, "", cmd, sizeof cmd);
            assert_refused(cmd, want);
        }
        let_go(go);
        ck_assert_msg(finish(first) == 0, "%s", read_file(log, NULL));
        snprintf(cmd, sizeof cmd, "%s/.lock", dir);
        ck_assert_msg(!file_exists(cmd), "a run that ended left its lock file");
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        ck_assert_int_eq(system(cmd), 0);
    }
}
END_TEST

// --overwrite_output_dir and export's --overwrite while another process holds the directory (a
// training run with a checkpoint and metrics): refused in one line, nothing of the run touched. And
// an export holds the directory it replaces: a training run started meanwhile is refused, and the
// export ends complete, no lock file and no temporary directory left
START_TEST(test_overwrite_never_removes_a_live_run) {
    setup();
    char dir[1200], go[1200], log[1200], cmd[4096], before[8192], after[8192], want[1400];
    snprintf(dir, sizeof dir, "%s", tmp_path("live"));
    pid_t run = hold(dir);
    snprintf(cmd, sizeof cmd, "mkdir %s/checkpoint-1 && echo weights > %s/checkpoint-1/adapter_model.safetensors && "
                              "echo '{\"step\": 1}' > %s/metrics.jsonl", dir, dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    snapshot(dir, before, sizeof before);
    snprintf(want, sizeof want, "%s is in use by another run (pid %d)", dir, (int)run);
    for (int k = 0; k < 4; k++) {
        program_cmd(k, dir, k == 3 ? "--overwrite" : "--overwrite_output_dir", cmd, sizeof cmd);
        assert_refused(cmd, want);
        program_cmd(k, dir, k == 3 ? "" : "--resume", cmd, sizeof cmd);
        assert_refused(cmd, want);
    }
    snapshot(dir, after, sizeof after);
    ck_assert_msg(!strcmp(before, after), "the live run's directory changed:\n%s\nnow:\n%s", before, after);
    release_holder(run);

    // the export holds it (stopped once locked); the trainers are refused; it then replaces the directory
    snprintf(go, sizeof go, "%s", tmp_path("go-export"));
    snprintf(log, sizeof log, "%s", tmp_path("export.log"));
    snprintf(want, sizeof want, "lock_taken:%s", go);
    program_cmd(3, dir, "--overwrite", cmd, sizeof cmd);
    pid_t ex = start(cmd, want, log);
    wait_reached(go);
    snapshot(dir, before, sizeof before);
    snprintf(want, sizeof want, "%s is in use by another run (pid %d)", dir, (int)ex);
    for (int k = 0; k < 3; k++) {
        program_cmd(k, dir, "--overwrite_output_dir", cmd, sizeof cmd);
        assert_refused(cmd, want);
    }
    snapshot(dir, after, sizeof after);
    ck_assert_msg(!strcmp(before, after), "the directory changed while the export held it");
    let_go(go);
    ck_assert_msg(finish(ex) == 0, "%s", read_file(log, NULL));
    snprintf(cmd, sizeof cmd, "ls -A %s | LC_ALL=C sort | tr '\\n' ' '; ls -d %s.* 2>/dev/null; true", dir, dir);
    ck_assert_int_eq(run_cmd(cmd, after, sizeof after), 0);
    ck_assert_str_eq(after, "config.json generation_config.json model.safetensors ");
}
END_TEST

// ----------------------------------------------------------------------------
// removals that a kill interrupts

// A kill -9 while --save_total_limit deletes a checkpoint leaves .checkpoint-N.deleting (never a
// half-deleted checkpoint-N); the next run in the directory finishes it, under its lock, and says so
START_TEST(test_killed_pruning_finished_at_next_start) {
    setup();
    char dir[1200], go[1200], log[1200], cmd[4096], out[16384], pause[1300], p[1400];
    snprintf(dir, sizeof dir, "%s", tmp_path("prune"));
    snprintf(go, sizeof go, "%s", tmp_path("go-prune"));
    snprintf(log, sizeof log, "%s", tmp_path("prune.log"));
    snprintf(pause, sizeof pause, "pruning:%s", go);
    snprintf(cmd, sizeof cmd, "./train_grpo " TINY " --max_steps 3 --save_steps 1 --save_total_limit 1 --output_dir %s", dir);
    pid_t run = start(cmd, pause, log);
    wait_reached(go);  // checkpoint-2 written, checkpoint-1 renamed aside, not yet removed
    kill(run, SIGKILL);
    ck_assert_int_eq(finish(run), 128 + SIGKILL);
    snprintf(p, sizeof p, "%s/.checkpoint-1.deleting", dir);
    ck_assert_msg(dir_exists(p), "no %s", p);
    snprintf(p, sizeof p, "%s/checkpoint-1", dir);
    ck_assert(!dir_exists(p));
    snprintf(cmd, sizeof cmd, "./train_grpo " TINY " --max_steps 3 --save_steps 1 --save_total_limit 1 --resume --output_dir %s", dir);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
    snprintf(p, sizeof p, "removed %s/.checkpoint-1.deleting (left by a run that was killed)", dir);
    ck_assert_msg(strstr(out, p), "%s", out);
    snprintf(cmd, sizeof cmd, "ls -A %s | grep -v '^warmup-' | LC_ALL=C sort | tr '\\n' ' '", dir);
    ck_assert_int_eq(run_cmd(cmd, out, sizeof out), 0);
    ck_assert_str_eq(out, "checkpoint-2 checkpoint-3 metrics.jsonl plot.svg ");  // (2: the one resumed from)
}
END_TEST

// ----------------------------------------------------------------------------
// --resume: the checkpoint's files and the run's options

// dir's checkpoint-2 resumed with extra: refused with one line holding want, dir untouched
static void refused_resume(int k, const char *dir, const char *extra, const char *want) {
    char cmd[4096], before[16384], after[16384], args[1024];
    snprintf(args, sizeof args, "--max_steps 3 --resume %s", extra);
    program_cmd(k, dir, args, cmd, sizeof cmd);
    snapshot(dir, before, sizeof before);
    assert_refused(cmd, want);
    snapshot(dir, after, sizeof after);
    ck_assert_msg(!strcmp(before, after), "%s --resume %s changed the run's directory", PROGRAMS[k], extra);
}

// Each option that changes what the run computes, changed on --resume: one line naming it (two: both
// named), nothing touched; the options that may change (where and how often it writes, how long it
// runs, memory) change freely
START_TEST(test_resume_names_changed_options) {
    setup();
    static const struct { const char *arg, *name; } grpo[] = {
        {"--learning_rate 1e-3", "learning_rate 0.0005 there, 0.001 here"}, {"--beta 0.04", "beta \"0\" there, \"0.04\" here"},
        {"--loss_type dr_grpo", "loss_type"},     {"--epsilon 0.3", "epsilon"},          {"--lora_r 8", "lora_r"},
        {"--lora_alpha 8", "lora_alpha"},         {"--lora_target_modules q_proj", "lora_target_modules"},
        {"--seed 7", "seed"},                     {"--load_in_fp8 row", "load_in_fp8"},  {"--temperature 0.9", "temperature"},
        {"--max_grad_norm 0.5", "max_grad_norm"}, {"--warmup_ratio 0.1", "warmup_ratio"}, {"--num_generations 4", "num_generations"},
        {"--scale_rewards none", "scale_rewards"}, {"--weight_decay 0.01", "weight_decay"}, {"--top_k 5", "top_k"},
    };
    char dir[1200], cmd[4096], out[16384];
    snprintf(dir, sizeof dir, "%s", tmp_path("resume_grpo"));
    program_cmd(0, dir, "--max_steps 2 --save_steps 1", cmd, sizeof cmd);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
    char want[1400];
    for (size_t i = 0; i < sizeof grpo / sizeof grpo[0]; i++) {
        snprintf(want, sizeof want, "%s/checkpoint-2 was made with other settings than this run (%s", dir, grpo[i].name);
        refused_resume(0, dir, grpo[i].arg, want);
    }
    refused_resume(0, dir, "--learning_rate 1e-3 --seed 7", "seed 42 there, 7 here; learning_rate 0.0005 there, 0.001 here");
    program_cmd(0, dir, "--max_steps 3 --resume --save_steps 3 --logging_steps 2 --eval_steps 0 --save_total_limit 4 "
                        "--gradient_checkpointing --micro_batch_size 4", cmd, sizeof cmd);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0 && strstr(out, "resumed from"), "%s", out);

    // train_sft and train_dpo (LoRA, so that the adapter is in the checkpoint too)
    static const struct { int k; const char *arg, *name; } other[] = {
        {1, "--learning_rate 1e-3", "learning_rate"}, {1, "--max_length 64", "max_length"},  {1, "--lora_r 4", "lora_r"},
        {1, "--seed 1", "seed"},                      {2, "--beta 0.2", "beta 0.1 there, 0.2 here"}, {2, "--loss_type ipo", "loss_type"},
        {2, "--label_smoothing 0.1", "label_smoothing"},
    };
    for (int k = 1; k <= 2; k++) {
        snprintf(dir, sizeof dir, "%s", tmp_path(k == 1 ? "resume_sft" : "resume_dpo"));
        program_cmd(k, dir, "--use_peft --max_steps 2 --save_steps 1 --per_device_train_batch_size 2", cmd, sizeof cmd);
        ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
        for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
            if (other[i].k != k) continue;
            char extra[256];
            snprintf(extra, sizeof extra, "--use_peft --per_device_train_batch_size 2 %s", other[i].arg);
            snprintf(want, sizeof want, "%s/checkpoint-2 was made with other settings than this run (%s", dir, other[i].name);
            refused_resume(k, dir, extra, want);
        }
        program_cmd(k, dir, "--use_peft --per_device_train_batch_size 2 --max_steps 3 --resume --save_steps 5 --logging_steps 3",
                    cmd, sizeof cmd);
        ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0 && strstr(out, "resumed from"), "%s", out);
    }
}
END_TEST

// A checkpoint whose files are not those it was written with: a truncated adapter (it used to be
// rebuilt from the optimizer's file), a changed byte, a file missing or added, no manifest at all
// (a checkpoint of an earlier version): each one line naming the file, nothing touched; put back,
// the checkpoint resumes
START_TEST(test_resume_checks_every_file) {
    setup();
    char dir[1200], cmd[4096], out[16384], want[1400], ck[1300];
    snprintf(dir, sizeof dir, "%s", tmp_path("files"));
    snprintf(ck, sizeof ck, "%s/checkpoint-2", dir);
    program_cmd(0, dir, "--max_steps 2 --save_steps 1", cmd, sizeof cmd);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
    snprintf(cmd, sizeof cmd, "cp -a %s %s/saved", ck, base_dir);
    ck_assert_int_eq(system(cmd), 0);
    static const struct { const char *damage, *want; } cases[] = {
        {"truncate -s -1 %s/adapter_model.safetensors", "adapter_model.safetensors is 531471 bytes where its manifest.json says 531472"},
        {"printf '\\377' | dd of=%s/optimizer.safetensors bs=1 seek=100000 conv=notrunc status=none",
         "optimizer.safetensors does not match its checksum in manifest.json"},
        {"rm %s/adapter_config.json", "adapter_config.json: cannot read it (No such file or directory)"},
        {"echo x > %s/notes.txt", "notes.txt is not in its manifest.json"},
        {"rm %s/manifest.json", "has no manifest.json"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd, cases[i].damage, ck);
        ck_assert_int_eq(system(cmd), 0);
        snprintf(want, sizeof want, "%s", cases[i].want);
        refused_resume(0, dir, "", want);
        snprintf(cmd, sizeof cmd, "rm -rf %s && cp -a %s/saved %s", ck, base_dir, ck);
        ck_assert_int_eq(system(cmd), 0);
    }
    program_cmd(0, dir, "--max_steps 3 --resume", cmd, sizeof cmd);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0 && strstr(out, "resumed from"), "%s", out);
}
END_TEST

// rm_rf (every removal above) removes a link, never what it points to: a checkpoint or an old export
// holding a link to a directory elsewhere leaves that directory as it was
START_TEST(test_removal_keeps_link_targets) {
    char dir[1200], cmd[12288], before[4096], after[4096], other[1200];
    snprintf(dir, sizeof dir, "%s", tmp_path("links"));
    snprintf(other, sizeof other, "%s", tmp_path("elsewhere"));
    snprintf(cmd, sizeof cmd, "mkdir -p %s/sub %s && echo keep > %s/file && ln -s %s %s/to_dir && ln -s %s %s/sub/again && "
                              "ln -s %s/file %s/to_file", dir, other, other, other, dir, other, dir, other, dir);
    ck_assert_int_eq(system(cmd), 0);
    snapshot(other, before, sizeof before);
    rm_rf(dir);
    struct stat sb;
    ck_assert_msg(lstat(dir, &sb) != 0, "%s left", dir);
    snapshot(other, after, sizeof after);
    ck_assert_str_eq(before, after);
}
END_TEST

static Suite *rundir_suite(void) {
    Suite *s = suite_create("rundir");
    TCase *tc = tcase_create("rundir");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_refused_run_removes_nothing);
    tcase_add_test(tc, test_lock_names_its_holder);
    tcase_add_test(tc, test_overwrite_never_removes_a_live_run);
    tcase_add_test(tc, test_killed_pruning_finished_at_next_start);
    tcase_add_test(tc, test_resume_names_changed_options);
    tcase_add_test(tc, test_resume_checks_every_file);
    tcase_add_test(tc, test_removal_keeps_link_targets);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    setenv("CK_FORK", "no", 1);  // one process: the warm-up made once is used by every test
    return tmp_cleanup(run_suite(rundir_suite()));
}
