// test/test_inputs.c: bad input, one defect at a time. Each regression input of the fuzz corpora
// (test/fuzz/corpus/<target>/regress-*, made by test/fuzz/make_corpus.py, replayed by make
// fuzz-replay) goes through the loader it broke, which must now give the one-line error named
// here, or (the misaligned tensor) read it correctly; then the programs on a few of them: a
// one-line error on stderr and exit 1. The fuzz targets themselves are test/fuzz/fuzz_*.c.
#include <check.h>
#include <sys/wait.h>
#include <time.h>

#include "fuzz/fuzz.h"
#include "lora.h"
#include "model.h"
#include "testutil.h"
#include "tokenizer.h"
#include "io/safetensors.h"
#include "tasks/tasks.h"
#include "train/checkpoint.h"

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

Suite *inputs_suite(void) {
    Suite *s = suite_create("inputs");
    TCase *tc = tcase_create("regressions");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_safetensors);
    tcase_add_test(tc, test_config);
    tcase_add_test(tc, test_tokenizer);
    tcase_add_test(tc, test_peft);
    tcase_add_test(tc, test_jsonl);
    tcase_add_test(tc, test_resume);
    tcase_add_test(tc, test_programs);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(inputs_suite()); }
