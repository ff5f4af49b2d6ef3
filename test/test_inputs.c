// test/test_inputs.c: bad input, one defect at a time. Each regression input of the fuzz corpora
// (test/fuzz/corpus/<target>/regress-*, made by test/fuzz/make_corpus.py, replayed by make
// fuzz-replay) goes through the loader it broke, which must now give the one-line error named
// here, or (the misaligned tensor) read it correctly; then the programs on a few of them: a
// one-line error on stderr and exit 1. The fuzz targets themselves are test/fuzz/fuzz_*.c.
// Then the inputs that never end (/dev/zero, a FIFO, a 1 GiB line) as every data file of the
// training programs: refused in one line within a second, in under 100 MB, no directory made; and
// the cases that were accepted without a word (a repeated option, a bad FP8GRPO_* knob, invalid
// UTF-8, a system prompt with no chat template, a prompt over --max_prompt_length in the template).
#include <check.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fuzz/fuzz.h"
#include "lora.h"
#include "model.h"
#include "testutil.h"
#include "tokenizer.h"
#include "io/safetensors.h"
#include "tasks/tasks.h"
#include "train/checkpoint.h"
#include "train/dpo_train.h"
#include "train/sft.h"

// the files of the regression input test/fuzz/corpus/<target>/<name>, written as names[] into the
// scratch directory (fuzz.h's format); returns the directory
static const char *unpack(const char *target, const char *name, const char *const *names, int n) {
    char p[1024];
    snprintf(p, sizeof p, "%s/../fuzz/corpus/%s/%s", fixture_dir(), target, name);
    size_t len, nrest;
    char *data = read_file(p, &len);
    fuzz_files((const uint8_t *)data, len, names, n, &nrest);
    free(data);
    return fuzz_scratch();
}

static const char *const ST[] = {"model.safetensors", "model.safetensors.index.json"};
static SafeTensors st;
static void open_st(const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", unpack("safetensors", name, ST, 2));
    st_open(&st, p);
}

START_TEST(test_safetensors) {
    // data_offsets beyond 2^64 (1e20) and infinite (1e400): refused before any conversion
    EXPECT_DIE(open_st("regress-offsets-1e20"), "tensor w: data_offsets [0, 1e+20] beyond the data section (4 bytes)");
    EXPECT_DIE(open_st("regress-offsets-inf"), "tensor w: data_offsets [0, inf] beyond the data section");
    // a shape of 2^32 x 2^32 elements: its count wrapped to 0 and the file was accepted
    EXPECT_DIE(open_st("regress-numel-overflow"), "tensor w: its shape needs more than the 0 bytes of the data section");
    // a name with a newline: the error stays one line (EXPECT_DIE checks)
    EXPECT_DIE(open_st("regress-name-newline"), "tensor a?b: unsupported dtype Q4");
    // data at an odd address (a header of 57 bytes): read through an aligned copy, values intact
    open_st("regress-misaligned");
    const STensor *t = st_find(&st, "w");
    ck_assert(t && t->copy && (uintptr_t)t->data % 4 == 0);
    float f[3];
    convert_to_f32(f, t->data, t->dtype, 3);
    ck_assert(f[0] == 1.5f && f[1] == -2.0f && f[2] == 0.25f);
    st_close(&st);
}
END_TEST

static const char *const MODEL[] = {"config.json", "model.safetensors"};
static void load_model(const char *name) {
    Model m;
    ModelOptions o = {FP8_BLOCK, 0, 0, 0, 0};
    model_load(&m, unpack("model", name, MODEL, 2), backend_cpu(), &o);
    model_free(&m);
}
static void expect_model_error(const char *name, const char *error) { EXPECT_DIE(load_model(name), error); }

START_TEST(test_config) {
    static const struct { const char *input, *error; } cases[] = {
        // sizes out of their bounds, each named with the bounds (before: 244 GB asked for)
        {"regress-vocab-huge", "\"vocab_size\" is 953326694: it must be an integer in [1, 16777216]"},
        // in bounds but not what the weights hold: an error before anything is allocated
        {"regress-vocab-mismatch", "tensor model.embed_tokens.weight has shape (16, 8) but config.json implies (10000000, 8)"},
        // heads x head_dim overflowed int (a checkpoint of zero-width q/k/v loaded)
        {"regress-head-dim-overflow", "\"head_dim\" is 536870912: it must be an integer in [2, 1024]"},
        {"regress-heads-overflow", "\"num_attention_heads\" is 1048576: it must be an integer in [1, 1024]"},
        {"regress-max-pos-negative", "\"max_position_embeddings\" is -1: it must be an integer in [1, 16777216]"},
        {"regress-rope-factor-zero", "rope_scaling: \"factor\" is 0: it must be a number in (0, 1e+06]"},
        {"regress-rope-theta-huge", "\"rope_theta\" is 1e+300: it must be a number in (1, 1e+12]"},
        {"regress-eps-negative", "\"rms_norm_eps\" is -1e-06: it must be a number in (0, 1]"},
        {"regress-eos-out-of-range", "\"eos_token_id\" must be a token id: an integer in [0, vocab_size 16)"},
        {"regress-layers-fraction", "\"num_hidden_layers\" is 1.5: it must be an integer in [1, 1024]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_model_error(cases[i].input, cases[i].error);
    load_model("seed-qwen3-fp8");  // the seeds load
    load_model("seed-llama3-f16");
}
END_TEST

static const char *const TOK[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
static void load_tok(const char *name) { tokenizer_free(tokenizer_load_dir(unpack("tokenizer", name, TOK, 3))); }

START_TEST(test_tokenizer) {
    // an added token of the lone byte 0xBD: encoding "你好" hung (no NFC) or read wild memory
    // (NFC); a tokenizer.json that is not UTF-8 is refused, as tokenizers refuses it
    EXPECT_DIE(load_tok("regress-added-invalid-utf8"), "tokenizer.json: not valid UTF-8 (byte 0xBD at offset");
    EXPECT_DIE(load_tok("regress-added-invalid-utf8-nfc"), "tokenizer.json: not valid UTF-8 (byte 0xBD at offset");
    // zero ids decode to "" (the NULL + 0 of an empty byte string: UBSan in make test SAN=1)
    Tokenizer *t = tokenizer_load_dir(unpack("tokenizer", "seed-qwen2-chat", TOK, 3));
    char *s = tokenizer_decode(t, NULL, 0);
    ck_assert_str_eq(s, "");
    free(s);
    // NFC of bytes that are not UTF-8 (the normalizer's loops now step over them)
    size_t n;
    s = tokenizer_nfc("e\xCC\x81\xBD\xE4\xBD", 6, &n);
    ck_assert_str_eq(s, "\xC3\xA9\xEF\xBF\xBD\xEF\xBF\xBD");
    free(s);
    tokenizer_free(t);
    // a Llama 3.2 template (strftime_now): today's date in the system block, as transformers
    // renders it (what fuzz_tokenizer found here was glibc's time-zone data, loaded at the first
    // localtime_r and kept, taken for a leak: its init loads it now)
    t = tokenizer_load_dir(unpack("tokenizer", "found-chat-strftime-tzset", TOK, 3));
    char today[64], want[128];
    time_t now = time(NULL);
    struct tm tmv;
    localtime_r(&now, &tmv);
    strftime(today, sizeof today, "%d %b %Y", &tmv);
    snprintf(want, sizeof want, "Cutting Knowledge Date: December 2023\nToday Date: %s\n", today);
    s = tokenizer_chat_text(t, NULL, "hi");
    ck_assert_msg(strstr(s, want), "'%s' does not hold '%s'", s, want);
    free(s);
    tokenizer_free(t);
}
END_TEST

// the qwen3 fixture: the model fuzz_peft.c and fuzz_resume.c build has its shapes
static Model qwen3;
static void load_qwen3(void) {
    char p[1024];
    fixture_path(p, sizeof p, "qwen3");
    ModelOptions o = {FP8_OFF, 0, 0, 0, 0};
    model_load(&qwen3, p, backend_cpu(), &o);
}

static const char *const PEFT[] = {"adapter_config.json", "adapter_model.safetensors"};
static void load_peft(const char *name) { lora_free(lora_load_peft(&qwen3, unpack("peft", name, PEFT, 2))); }

START_TEST(test_peft) {
    load_qwen3();
    EXPECT_DIE(load_peft("regress-r-fraction"), "adapter_config.json: \"r\" must be an integer in [1, 65536]");  // was read as 4
    EXPECT_DIE(load_peft("regress-alpha-huge"), "adapter_config.json: \"lora_alpha\" must be a number in (0, 1e6]");
    // r = 65536 over tensors of rank 1: refused by the size of the file before the LoRA is allocated
    EXPECT_DIE(load_peft("regress-r-unbacked"), "adapter_config.json: \"r\" 65536 needs 41943040 values, and");
    // a tensor of a module target_modules leaves out: refused (it was ignored); a string is a regex
    EXPECT_DIE(load_peft("regress-tensor-unselected"), "tensor base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight is of "
                                                       "no module that target_modules");
    load_peft("seed-r1-qv-regex");
    load_peft("seed-r2-all-bf16");
    model_free(&qwen3);
}
END_TEST

// JSONL data: a duplicate key and a NUL character, refused with the line (they were read as the first
// value, and cut at the NUL)
START_TEST(test_jsonl) {
    const char *const names[] = {"data.jsonl"};
    const struct { const char *name, *msg; } bad[] = {
        {"regress-duplicate-key", "data.jsonl:1: the key \"prompt\" appears twice in one object: keep one"},
        {"regress-nul-escape", "data.jsonl:1: a string holds \\u0000 (a NUL character), which a prompt or answer cannot"},
    };
    for (int i = 0; i < 2; i++) {
        char p[1200], err[512];
        snprintf(p, sizeof p, "%s/data.jsonl", unpack("jsonl", bad[i].name, names, 1));
        Task t;
        ck_assert_int_eq(task_open(&t, p, NULL, err, sizeof err), -1);
        ck_assert_msg(strstr(err, bad[i].msg), "%s", err);
    }
}
END_TEST

// the limits of the reader every data file goes through (tasks.h), on each reader: a line over
// JSONL_MAX_LINE, invalid UTF-8, a file over JSONL_MAX_FILE (sparse: refused by its size, unread),
// and what is not a regular file (a directory; the FIFO and /dev/zero: test_streams)
static const char *scratch_file(const char *name, const char *text) {  // text into the scratch directory
    static char p[8][700];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", fuzz_scratch(), name);
    if (text) write_file_atomic(p[k], text, strlen(text));
    return p[k];
}
static void big_file(const char *path, const char *head, long size) {  // head, then zeros up to size (sparse)
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert(fd >= 0 && write(fd, head, strlen(head)) == (ssize_t)strlen(head) && ftruncate(fd, size) == 0 && close(fd) == 0);
}
// path read by the reader of train_grpo (0), train_sft (1) or train_dpo (2): 0, or -1 with the message in err
static int read_data(int reader, const char *path, char *err, size_t cap) {
    Task task;
    SftText *sft;
    PrefText *pref;
    long n;
    int rc = reader == 0 ? task_open(&task, path, NULL, err, cap)
             : reader == 1 ? sft_read_jsonl(path, &sft, &n, err, cap) : pref_read_jsonl(path, &pref, &n, err, cap);
    if (!rc) reader == 0 ? task_free(&task) : reader == 1 ? sft_texts_free(sft, n) : pref_texts_free(pref, n);
    return rc;
}

START_TEST(test_jsonl_limits) {
    const char *good[] = {"{\"prompt\": \"1+1=\", \"answer\": \"2\"}", "{\"prompt\": \"1+1=\", \"completion\": \"2\"}",
                          "{\"prompt\": \"1+1=\", \"chosen\": \"2\", \"rejected\": \"3\"}"};
    char err[1024], text[512];
    for (int i = 0; i < 3; i++) {
        // the good line alone is read
        snprintf(text, sizeof text, "%s\n", good[i]);
        const char *p = scratch_file("data.jsonl", text);
        ck_assert_msg(read_data(i, p, err, sizeof err) == 0, "%s", err);
        // invalid UTF-8 (a Latin-1 "é") on line 2: the file, the line and the byte
        snprintf(text, sizeof text, "%s\n{\"prompt\": \"caf\xE9\"}\n", good[i]);
        p = scratch_file("latin1.jsonl", text);
        ck_assert_int_eq(read_data(i, p, err, sizeof err), -1);
        ck_assert_msg(strstr(err, "latin1.jsonl:2: not valid UTF-8 (byte 0xE9 at column 16): save the file as UTF-8"), "%s", err);
        // line 2 one byte over JSONL_MAX_LINE (a string of that many x), then a good line: refused at line 2
        p = scratch_file("long.jsonl", NULL);
        FILE *f = fopen(p, "w");
        ck_assert(f);
        fprintf(f, "%s\n{\"prompt\": \"", good[i]);
        for (size_t k = 12; k < JSONL_MAX_LINE + 1; k++) fputc('x', f);
        fprintf(f, "\n%s\n", good[i]);
        ck_assert(fclose(f) == 0);
        ck_assert_int_eq(read_data(i, p, err, sizeof err), -1);
        ck_assert_msg(strstr(err, "long.jsonl:2: a line longer than 1 MiB, the limit of one example"), "%s", err);
        // a line of exactly JSONL_MAX_LINE bytes is read (the prompt of the rest of it)
        f = fopen(p, "w");
        ck_assert(f);
        char tail[256];
        int nt = snprintf(tail, sizeof tail, "%s", good[i] + strlen("{\"prompt\": \"1+1="));
        fprintf(f, "{\"prompt\": \"");
        for (size_t k = 12; k < JSONL_MAX_LINE - (size_t)nt; k++) fputc('x', f);
        fprintf(f, "%s\n", tail);
        ck_assert(fclose(f) == 0);
        ck_assert_msg(read_data(i, p, err, sizeof err) == 0, "%s", err);
        // a directory
        ck_assert_int_eq(read_data(i, fuzz_scratch(), err, sizeof err), -1);
        ck_assert_msg(strstr(err, " is a directory, not a file: give a .jsonl file"), "%s", err);
        // a file over JSONL_MAX_FILE, refused by its size before a byte is read
        p = scratch_file("huge.jsonl", NULL);
        big_file(p, good[i], JSONL_MAX_FILE + 1);
        ck_assert_int_eq(read_data(i, p, err, sizeof err), -1);
        ck_assert_msg(strstr(err, "huge.jsonl holds 2.00 GiB, more than the 2 GiB a data file may"), "%s", err);
        unlink(p);
    }
}
END_TEST

static const char RUN[] = "{\"model\":\"builtin-tiny\",\"data\":\"arithmetic\",\"lora_r\":2,\"lora_alpha\":4}";  // fuzz_resume.c's
static const char *const RESUME[] = {"trainer_state.json", "optimizer.safetensors"};
static void resume(const char *name) {
    LoRA *lo = lora_create(&qwen3, 2, 4.0f, (1u << LIN_Q) | (1u << LIN_V), 1, 0);
    checkpoint_read(unpack("resume", name, RESUME, 2), 3, RUN, lo);
    lora_free(lo);
}

START_TEST(test_resume) {
    load_qwen3();
    EXPECT_DIE(resume("regress-step-negative"), "optimizer.safetensors: its metadata's step -1 is below global_step 3");
    EXPECT_DIE(resume("regress-no-run"), "trainer_state.json records no \"run\" settings: not a checkpoint this program wrote");
    EXPECT_DIE(resume("regress-step-fraction"), "trainer_state.json: global_step does not match the directory name");
    resume("seed-step3");
    model_free(&qwen3);
}
END_TEST

// a program on a bad input: exit 1, and stderr ends with one line, "error: " and the text given
// (after what it printed before, "backend: ...")
static void expect_program_error(const char *cmd, const char *text) {
    char full[4096], path[600];
    snprintf(path, sizeof path, "%s/stderr.txt", fuzz_scratch());  // this process's own directory
    snprintf(full, sizeof full, "%s 2>%s >/dev/null", cmd, path);
    int rc = system(full);
    char *e = read_file(path, NULL), *last = strstr(e, "error: ");
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "%s: exit status %d (stderr: %s)", cmd, rc, e);
    ck_assert_msg(last && (last == e || last[-1] == '\n') && strchr(last, '\n') == last + strlen(last) - 1,
                  "%s: stderr does not end with one error line: %s", cmd, e);
    ck_assert_msg(strstr(last, text), "%s: '%s' does not say '%s'", cmd, last, text);
    free(e);
}

START_TEST(test_programs) {
    char cmd[2048], dir[1024];
    snprintf(dir, sizeof dir, "%s", unpack("model", "regress-head-dim-overflow", MODEL, 2));
    snprintf(cmd, sizeof cmd, "./generate --device cpu --model %s --tokens '1 2'", dir);
    expect_program_error(cmd, "\"head_dim\" is 536870912: it must be an integer in [2, 1024]");
    // a good checkpoint with the bad tokenizer next to it
    unpack("model", "seed-qwen3-f32", MODEL, 2);
    unpack("tokenizer", "regress-added-invalid-utf8", TOK, 1);
    snprintf(cmd, sizeof cmd, "./generate --device cpu --model %s --prompt hi", dir);
    expect_program_error(cmd, "not valid UTF-8 (byte 0xBD");
}
END_TEST

// ---------------------------------------------------------------------------
// the programs on inputs that never end, and on the cases once accepted without a word

// The peak resident memory (KiB) of program prog stopping at its first argument (an unknown option):
// its code and libraries, before it reads anything. About 3 MB built without CUDA; with the CUDA
// libraries linked (cuBLAS, cuBLASLt, NCCL) about 220 MB, whether or not a GPU is there.
static long program_base_kib(const char *prog) {
    static char name[8][64];
    static long kib[8];
    static int n;
    for (int i = 0; i < n; i++)
        if (!strcmp(name[i], prog)) return kib[i];
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        int nul = open("/dev/null", O_WRONLY);
        if (nul < 0 || dup2(nul, 1) < 0 || dup2(nul, 2) < 0) _exit(126);
        execl(prog, prog, "--no_such_option_at_all", (char *)NULL);
        _exit(127);
    }
    int st;
    struct rusage ru;
    ck_assert(wait4(pid, &st, 0, &ru) == pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%s --no_such_option_at_all: exit status %d", prog, st);
    ck_assert(n < 8);
    snprintf(name[n], sizeof name[n], "%s", prog);
    kib[n] = ru.ru_maxrss;
    return kib[n++];
}

// A program (argv, run from the repository root; env: "NAME=value" or NULL) on an input it must refuse
// at once: exit 1, stderr one line "error: ..." holding text, within a second, its peak memory (the
// child's ru_maxrss) under 100 MB beyond the program's own (program_base_kib: what reading the input
// may add), and dir (NULL: none) never made. An alarm set before the exec (it survives it) ends a
// program that regresses into waiting for a FIFO's writer or reading forever, so that the test fails
// instead of hanging.
static void expect_quick_refusal(const char *const *argv, const char *env, const char *dir, const char *text) {
    char errp[700], cmd[2048] = "";
    snprintf(errp, sizeof errp, "%s/stderr.txt", fuzz_scratch());
    for (int i = 0; argv[i]; i++) snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), "%s ", argv[i]);
    double t0 = now_sec();
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        int fd = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644), nul = open("/dev/null", O_WRONLY);
        if (fd < 0 || nul < 0 || dup2(fd, 2) < 0 || dup2(nul, 1) < 0) _exit(126);
        if (env) putenv((char *)env);
        alarm(10);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    struct rusage ru;
    ck_assert(wait4(pid, &st, 0, &ru) == pid);
    double secs = now_sec() - t0;
    char *e = read_file(errp, NULL);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%s: exit status %d (stderr: %s)", cmd, st, e);
    ck_assert_msg(!strncmp(e, "error: ", 7) && strchr(e, '\n') == e + strlen(e) - 1, "%s: stderr is not one error line: %s", cmd, e);
    ck_assert_msg(strstr(e, text), "%s: '%s' does not say '%s'", cmd, e, text);
    ck_assert_msg(secs < 1.0, "%s: refused after %.2f s", cmd, secs);
    long base = program_base_kib(argv[0]);
    ck_assert_msg(ru.ru_maxrss < base + 100 * 1024, "%s: peak resident memory %ld KiB, the program's own %ld", cmd,
                  ru.ru_maxrss, base);
    ck_assert_msg(!dir || !dir_exists(dir), "%s: left %s", cmd, dir);
    free(e);
}

// The built-in model, warmed up for a few steps, as a checkpoint of its own (byte-level tokenizer,
// no chat template) at <scratch>/plain, and the same with a ChatML template at <scratch>/chat;
// remove_models: those and the runs' directories gone again (the scratch directory's clean-up at exit
// removes files only)
static const char *const MADE[] = {"warm", "plain", "chat", "out", "cache"};
static void remove_models(void) {
    for (int i = 0; i < 5; i++) rm_rf(scratch_file(MADE[i], NULL));
}
static void make_models(void) {
    const char *d = fuzz_scratch();
    char cmd[4096];
    remove_models();
    // the warm-up is made in a cache of the scratch directory's own (train/builtin.h: XDG_CACHE_HOME)
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME=%s/cache ./train_grpo --device cpu --quiet --eval_size 0 --warmup_sft_steps 3 "
             "--max_steps 1 --per_device_train_batch_size 8 --output_dir %s/warm >/dev/null 2>&1 && "
             "mv %s/cache/fp8-grpo/warmup-* %s/plain && cp -r %s/plain %s/chat", d, d, d, d, d, d);
    ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
    const char *cfg = "{\"eos_token\": \"<|endoftext|>\", \"chat_template\": \"{% for message in messages %}{{'<|im_start|>' + "
                      "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt "
                      "%}{{ '<|im_start|>assistant\\n' }}{% endif %}\"}";
    scratch_file("chat/tokenizer_config.json", cfg);
}

START_TEST(test_streams) {
    make_models();
    const char *d = fuzz_scratch();
    char plain[700], out[700], fifo[700], big[700], grpo[700], sft[700], dpo[700];
    snprintf(plain, sizeof plain, "%s/plain", d);
    snprintf(out, sizeof out, "%s/out", d);
    snprintf(fifo, sizeof fifo, "%s/fifo.jsonl", d);
    snprintf(big, sizeof big, "%s/big.jsonl", d);
    ck_assert(mkfifo(fifo, 0600) == 0);
    big_file(big, "{\"prompt\": \"", 1L << 30);  // one line of 1 GiB (sparse: no disk, no memory)
    snprintf(grpo, sizeof grpo, "%s", scratch_file("grpo.jsonl", "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n"));
    snprintf(sft, sizeof sft, "%s", scratch_file("sft.jsonl", "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n"));
    snprintf(dpo, sizeof dpo, "%s", scratch_file("dpo.jsonl", "{\"prompt\": \"1+1=\", \"chosen\": \"2\", \"rejected\": \"3\"}\n"));
    const char *inputs[] = {"/dev/zero", fifo, big};
    const char *says[] = {"/dev/zero is a character device, not a file: give a .jsonl file", "fifo.jsonl is a FIFO (pipe), not a file",
                          "big.jsonl:1: a line longer than 1 MiB, the limit of one example"};
    for (int i = 0; i < 3; i++) {
        const char *x = inputs[i];
        const char *const runs[][12] = {
            {"./train_grpo", "--device", "cpu", "--model", plain, "--data", x, "--output_dir", out, NULL},
            {"./train_grpo", "--device", "cpu", "--model", plain, "--data", grpo, "--eval_data", x, "--output_dir", out, NULL},
            {"./train_sft", "--device", "cpu", "--model", plain, "--data", x, "--output_dir", out, NULL},
            {"./train_sft", "--device", "cpu", "--model", plain, "--data", sft, "--eval_data", x, "--output_dir", out, NULL},
            {"./train_dpo", "--device", "cpu", "--model", plain, "--data", x, "--output_dir", out, NULL},
            {"./train_dpo", "--device", "cpu", "--model", plain, "--data", dpo, "--eval_data", x, "--output_dir", out, NULL},
        };
        for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) expect_quick_refusal(runs[k], NULL, out, says[i]);
    }
    unlink(big);
    remove_models();
}
END_TEST

START_TEST(test_silent_cases) {
    make_models();
    const char *d = fuzz_scratch();
    char plain[700], chat[700], out[700], grpo[700], latin1[700];
    snprintf(plain, sizeof plain, "%s/plain", d);
    snprintf(chat, sizeof chat, "%s/chat", d);
    snprintf(out, sizeof out, "%s/out", d);
    snprintf(grpo, sizeof grpo, "%s", scratch_file("grpo.jsonl", "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n"));
    snprintf(latin1, sizeof latin1, "%s",
             scratch_file("latin1.jsonl", "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n{\"prompt\": \"caf\xE9?\", \"answer\": \"1\"}\n"));
    const struct {
        const char *argv[14], *env;  // the command (NULL-ended), and a "NAME=value" to run it with (or NULL)
        const char *says;            // what its one error line must say (the run's --output_dir, if any, is out: never made)
    } cases[] = {
        // a repeated option: which value wins is not obvious ("--learning-rate" is the same option)
        {{"./train_grpo", "--learning_rate", "1", "--learning-rate=2"}, NULL,
         "--learning_rate is given twice (the second time as '2'): give it once"},
        // the CUDA backend's chunk knobs, checked on any device
        {{"./generate", "--device", "cpu", "--model", plain, "--prompt", "1+1="}, "FP8GRPO_LOGITS_CHUNK_ROWS=0",
         "FP8GRPO_LOGITS_CHUNK_ROWS='0': not a number of rows in [1, 16777216]"},
        {{"./train_grpo", "--device", "cpu", "--model", plain, "--data", grpo, "--max_completion_length", "8", "--output_dir", out},
         "FP8GRPO_LOGITS_CHUNK_ROWS=abc", "FP8GRPO_LOGITS_CHUNK_ROWS='abc': not a number of rows"},
        {{"./train_grpo", "--device", "cpu", "--model", plain, "--data", grpo, "--max_completion_length", "8", "--output_dir", out},
         "FP8GRPO_HEAD_GROUP_ROWS=16x", "FP8GRPO_HEAD_GROUP_ROWS='16x': not a number of rows"},
        // invalid UTF-8: in the data (file and line), in --prompt, in --system_prompt
        {{"./train_grpo", "--device", "cpu", "--model", plain, "--data", latin1, "--output_dir", out}, NULL,
         "latin1.jsonl:2: not valid UTF-8 (byte 0xE9 at column 16)"},
        {{"./generate", "--device", "cpu", "--model", plain, "--prompt", "caf\xE9"}, NULL,
         "--prompt: not valid UTF-8 (byte 0xE9 at offset 3): give the text in UTF-8"},
        {{"./train_grpo", "--device", "cpu", "--model", chat, "--data", grpo, "--system_prompt", "\xFF", "--output_dir", out}, NULL,
         "--system_prompt: not valid UTF-8 (byte 0xFF at offset 0)"},
        // a system prompt where no chat template can hold it (it was dropped without a word)
        {{"./train_grpo", "--device", "cpu", "--model", plain, "--data", grpo, "--system_prompt", "Be brief.", "--output_dir", out}, NULL,
         "plain has no chat template (tokenizer_config.json's chat_template)"},
        {{"./train_grpo", "--device", "cpu", "--system_prompt", "Be brief.", "--output_dir", out}, NULL,
         "--system_prompt: the built-in model reads its prompts as raw text"},
        {{"./train_sft", "--device", "cpu", "--model", plain, "--data", grpo, "--system_prompt", "Be brief.", "--output_dir", out}, NULL,
         "plain has no chat template"},
        // --max_prompt_length counts the prompt in the chat template, before any directory exists: "1+1="
        // is 4 byte-level tokens, 23 in ChatML (<|im_start|> "user\n" 1+1= <|im_end|> "\n" <|im_start|>
        // "assistant\n": 1 + 5 + 4 + 1 + 1 + 1 + 10)
        {{"./train_grpo", "--device", "cpu", "--model", chat, "--data", grpo, "--max_prompt_length", "22", "--output_dir", out}, NULL,
         "grpo.jsonl: 1 prompt has more than --max_prompt_length 22 tokens in the chat template (the longest 23: '1+1=...')"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_quick_refusal(cases[i].argv, cases[i].env, out, cases[i].says);
    // and the data: line says 23
    char cmd[4096], text[16384];
    snprintf(cmd, sizeof cmd, "./train_grpo --device cpu --model %s --data %s --max_prompt_length 23 --max_completion_length 4 "
             "--max_steps 1 --per_device_train_batch_size 2 --num_generations 2 --eval_size 0 --output_dir %s 2>&1", chat, grpo, out);
    FILE *p = popen(cmd, "r");
    ck_assert(p);
    size_t n = fread(text, 1, sizeof text - 1, p);
    text[n] = 0;
    ck_assert_msg(pclose(p) == 0, "%s: %s", cmd, text);
    ck_assert_msg(strstr(text, "; prompts 23-23 tokens in the chat template (mean 23.0)"), "%s", text);
    remove_models();
}
END_TEST

Suite *inputs_suite(void) {
    Suite *s = suite_create("inputs");
    TCase *tc = tcase_create("regressions");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_safetensors);
    tcase_add_test(tc, test_config);
    tcase_add_test(tc, test_tokenizer);
    tcase_add_test(tc, test_peft);
    tcase_add_test(tc, test_jsonl);
    tcase_add_test(tc, test_jsonl_limits);
    tcase_add_test(tc, test_resume);
    tcase_add_test(tc, test_programs);
    tcase_add_test(tc, test_streams);
    tcase_add_test(tc, test_silent_cases);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(inputs_suite()); }
