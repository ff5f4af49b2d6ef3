// test/test_sft.c: supervised fine-tuning (sft.h) and ./train_sft.
// The JSONL formats (prompt/completion, messages, conversational prompt/completion) and every
// error, each naming file:line; the tokens of an example and the batch's loss mask (prompt and
// pad positions never targets); the data order (every example once per epoch, seeded); the
// completion-only loss against the mean NLL computed here from transformers' logits (the qwen3
// fixture); gradient accumulation against one big batch (fp64 backend); a few hundred steps on
// the built-in arithmetic lowering the loss; and ./train_sft end to end: a full run's checkpoint
// holds exactly the trained weights (bf16 when the model was bf16) and ./generate reloads it,
// --resume is bit-exact (every weight and LoRA), --gradient_checkpointing changes nothing, bad
// flags and data are one-line errors.
#include <check.h>
#include <math.h>
#include <sys/wait.h>

#include "testutil.h"
#include "io/safetensors.h"
#include "tasks/tasks.h"
#include "train/optim.h"
#include "train/sft.h"

#define TMP_TEMPLATE "/tmp/fp8grpo_sftXXXXXX"
#include "progutil.h"

// ----------------------------------------------------------------------------
// the JSONL formats and their errors

START_TEST(test_jsonl_formats) {
    const char *path = tmp_path("formats.jsonl");
    write_text(path,
               "{\"prompt\": \"17+25=\", \"completion\": \"42\"}\n"
               "\n"
               "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"}, "
               "{\"role\": \"assistant\", \"content\": \"Hello\"}]}\n"
               "{\"prompt\": [{\"role\": \"user\", \"content\": \"2+2?\"}], \"completion\": [{\"role\": \"assistant\", \"content\": \"4\"}]}\n"
               "  {\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"\"}]}  \n"
               // content as a list of parts (gemma-3-it's shape): the texts joined, each stripped, as its template does
               "{\"messages\": [{\"role\": \"system\", \"content\": [{\"type\": \"text\", \"text\": \"Be brief.\"}]}, "
               "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \" 2+2 \"}, {\"type\": \"text\", \"text\": \"?\\n\"}]}, "
               "{\"role\": \"assistant\", \"content\": [{\"type\": \"text\", \"text\": \"4\"}]}]}\n");
    SftText *t;
    long n;
    char err[512];
    ck_assert_msg(sft_read_jsonl(path, &t, &n, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(n, 5);
    long lines[5] = {1, 3, 4, 5, 6};
    const char *sys[5] = {NULL, "Be brief.", NULL, NULL, "Be brief."}, *prompt[5] = {"17+25=", "Hi", "2+2?", "a", "2+2?"},
               *comp[5] = {"42", "Hello", "4", "", "4"};
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(t[i].line, lines[i]);
        ck_assert_int_eq(t[i].conversational, i > 0);
        if (sys[i]) ck_assert_str_eq(t[i].system, sys[i]);
        else ck_assert_ptr_null(t[i].system);
        ck_assert_str_eq(t[i].prompt, prompt[i]);
        ck_assert_str_eq(t[i].completion, comp[i]);
    }
    sft_texts_free(t, n);
}
END_TEST

JSONL_READER(read_sft, SftText, sft_read_jsonl, sft_texts_free)

START_TEST(test_jsonl_errors) {
    static const BadLine cases[] = {
        {"{\"prompt\": \"a\", \"completion\": ", "not valid JSON"},
        {"{\"prompt\": \"a\", \"completion\": \"b\"} {\"prompt\": \"c\"}", "more than one JSON value on the line"},
        {"[1, 2]", "not a JSON object"},
        {"{\"messages\": [], \"prompt\": \"a\"}", "both \"messages\" and \"prompt\"/\"completion\""},
        {"{\"messages\": \"hi\"}", "\"messages\" must be a list"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"}]}",
         "\"messages\" has the roles [user, user]: an optional system message, one user turn and the assistant's reply are supported"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}, "
         "{\"role\": \"user\", \"content\": \"c\"}, {\"role\": \"assistant\", \"content\": \"d\"}]}",
         "multi-turn conversations are not"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"url\": \"cat.png\"}, {\"type\": \"text\", "
         "\"text\": \"a\"}]}, {\"role\": \"assistant\", \"content\": \"b\"}]}",
         "\"messages\"[0] has an image (part 0): fp8-grpo trains a model on text (Gemma 3's vision tower is not read): give "
         "text parts only"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": 3}]}]}",
         "\"messages\"[0]'s content part 0 is not {\"type\": \"text\", \"text\": \"...\"}"},
        {"{\"messages\": [{\"role\": \"user\"}]}", "\"messages\"[0] is not a {\"role\": ..., \"content\": \"text\"} message"},
        {"{\"text\": \"some text\"}", "\"text\" (language modelling, a loss on every token) is not supported"},
        {"{\"prompt\": \"1+1?\", \"answer\": \"2\"}", "\"prompt\"/\"answer\" is train_grpo's data"},
        {"{\"prompt\": \"a\"}", "missing \"completion\""},
        {"{\"completion\": \"a\"}", "missing \"prompt\""},
        {"{\"question\": \"a\"}", "missing \"prompt\" and \"completion\" (or \"messages\")"},
        {"{\"prompt\": \"a\", \"completion\": 4}", "must both be text, or both lists"},
        {"{\"prompt\": \"\", \"completion\": \"b\"}", "\"prompt\" is empty"},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"completion\": [{\"role\": \"user\", \"content\": \"b\"}]}",
         "\"completion\" has the roles [user]: one assistant message"},
        {"{\"prompt\": [{\"role\": \"assistant\", \"content\": \"a\"}], \"completion\": [{\"role\": \"assistant\", \"content\": \"b\"}]}",
         "\"prompt\" has the roles [assistant]: an optional system message and one user turn"},
    };
    expect_bad_lines(read_sft, "{\"prompt\": \"ok\", \"completion\": \"fine\"}", cases, sizeof cases / sizeof cases[0]);
    const char *path = tmp_path("bad.jsonl");
    SftText *t;
    long n;
    char err[1024];
    write_text(path, "\n  \n");
    ck_assert_int_eq(sft_read_jsonl(path, &t, &n, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "no examples"), "%s", err);
    ck_assert_int_eq(sft_read_jsonl(tmp_path("missing.jsonl"), &t, &n, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "cannot open") && strstr(err, "missing.jsonl"), "%s", err);
}
END_TEST

// ----------------------------------------------------------------------------
// tokens, the batch's mask, the data order

// ids of text in the byte-level vocabulary
static int bytes_of(const Tokenizer *tok, const char *text, int *out) {
    int *ids, n = tokenizer_encode(tok, text, &ids);
    memcpy(out, ids, n * sizeof(int));
    free(ids);
    return n;
}

START_TEST(test_encode_and_mask) {
    Tokenizer *tok = tokenizer_byte_level();
    int eos = sft_eos_id(tok, 0);
    // no tokenizer_config.json: the first end token the vocabulary has (ChatML's end of turn)
    ck_assert_int_eq(eos, tokenizer_token_id(tok, "<|im_end|>"));
    SftFormat f = {tok, 0, NULL, eos, 0};
    SftExample a, b;
    ck_assert_int_eq(sft_encode(&f, NULL, "17+25=", "42", &a), 0);
    ck_assert_int_eq(sft_encode(&f, NULL, "3+4=", "7", &b), 0);
    int want[16], np = bytes_of(tok, "17+25=", want);
    int nc = bytes_of(tok, "42", want + np);
    want[np + nc] = eos;
    ck_assert_int_eq(a.plen, 6);
    ck_assert_int_eq(a.n, 9);
    for (int i = 0; i < a.n; i++) ck_assert_int_eq(a.ids[i], want[i]);
    ck_assert_int_eq(b.plen, 4);
    ck_assert_int_eq(b.n, 6);

    // the batch: right-padded with 0; position t targets ids[t + 1] exactly when that is a completion token
    const SftExample *ex[2] = {&a, &b};
    SftBatch bt;
    sft_batch_make(&bt, ex, 2);
    ck_assert_int_eq(bt.B, 2);
    ck_assert_int_eq(bt.T, 9);
    ck_assert_int_eq(bt.ntok, 3 + 2);
    int tg_a[9] = {-1, -1, -1, -1, -1, a.ids[6], a.ids[7], a.ids[8], -1};
    int tg_b[9] = {-1, -1, -1, b.ids[4], b.ids[5], -1, -1, -1, -1};
    for (int t = 0; t < 9; t++) {
        ck_assert_int_eq(bt.tg[t], tg_a[t]);
        ck_assert_int_eq(bt.tg[9 + t], tg_b[t]);
        ck_assert_int_eq(bt.ids[t], a.ids[t]);
        ck_assert_int_eq(bt.ids[9 + t], t < 6 ? b.ids[t] : 0);
    }
    ck_assert_int_eq(bt.tg[9 + 4], eos);  // the EOS is a target: the model learns to stop
    sft_batch_free(&bt);

    // max_length keeps the start: a cut completion loses its end and its EOS
    SftExample c;
    f.max_length = 7;
    ck_assert_int_eq(sft_encode(&f, NULL, "17+25=", "42", &c), 2);
    ck_assert_int_eq(c.n, 7);
    ck_assert_int_eq(c.plen, 6);
    const SftExample *one[1] = {&c};
    sft_batch_make(&bt, one, 1);
    ck_assert_int_eq(bt.ntok, 1);
    ck_assert_int_eq(bt.tg[5], want[6]);
    ck_assert_int_eq(bt.tg[6], -1);
    sft_batch_free(&bt);
    sft_example_free(&a), sft_example_free(&b), sft_example_free(&c);
    tokenizer_free(tok);
}
END_TEST

START_TEST(test_data_load_and_order) {
    Tokenizer *tok = tokenizer_byte_level();
    SftFormat f = {tok, 0, NULL, sft_eos_id(tok, 0), 0};
    const char *path = tmp_path("order.jsonl");
    char text[8192] = "";
    for (int i = 0; i < 20; i++)
        snprintf(text + strlen(text), sizeof text - strlen(text), "{\"prompt\": \"%d+%d=\", \"completion\": \"%d\"}\n", i, i, 2 * i);
    write_text(path, text);
    SftData d, e;
    char err[512];
    ck_assert_msg(sft_data_load(&d, path, &f, 7, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(sft_data_load(&e, path, &f, 7, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(d.n, 20);
    long comp = 0;
    for (int i = 0; i < 20; i++) comp += d.ex[i].n - d.ex[i].plen;
    ck_assert_int_eq(d.completion_tokens, comp);
    // every example once per epoch, each epoch its own order, the same for the same seed
    int same_as_epoch0 = 1;
    const SftExample *first[20];
    for (long epoch = 0; epoch < 3; epoch++) {
        int seen[20] = {0};
        for (long i = 0; i < 20; i++) {
            const SftExample *x = sft_data_at(&d, epoch * 20 + i);
            seen[x - d.ex]++;
            if (epoch == 0) first[i] = x;
            else same_as_epoch0 &= x == first[i];
        }
        for (int i = 0; i < 20; i++) ck_assert_int_eq(seen[i], 1);
    }
    ck_assert_msg(!same_as_epoch0, "the epochs share one order");
    for (long pos = 59; pos >= 0; pos -= 7) ck_assert_int_eq(sft_data_at(&e, pos) - e.ex, sft_data_at(&d, pos) - d.ex);
    sft_data_free(&e);
    sft_data_free(&d);

    // a prompt that fills max_length leaves nothing to learn: left out; when all do, an error
    write_text(path, "{\"prompt\": \"1234567+1=\", \"completion\": \"1234568\"}\n{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n");
    f.max_length = 6;
    ck_assert_msg(sft_data_load(&d, path, &f, 7, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(d.n, 1);
    ck_assert_int_eq(d.dropped, 1);
    ck_assert_int_eq(d.first_dropped, 1);
    ck_assert_int_eq(d.truncated, 0);
    sft_data_free(&d);
    f.max_length = 3;
    ck_assert_int_eq(sft_data_load(&d, path, &f, 7, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "raise --max_length") && strstr(err, "line 1"), "%s", err);

    // a conversation needs a chat template
    write_text(path, "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n"
                     "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}\n");
    f.max_length = 0;
    ck_assert_int_eq(sft_data_load(&d, path, &f, 7, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "order.jsonl:2: a conversation"), "%s", err);
    tokenizer_free(tok);
}
END_TEST

// ----------------------------------------------------------------------------
// the loss against transformers, gradient accumulation

static void load_qwen3(Model *m, const Backend *be) {
    char p[1024];
    fixture_path(p, sizeof p, "qwen3");
    ModelOptions o = {FP8_OFF, 0, 0, 0, 0};
    model_load(m, p, be, &o);
}

// example i of the fixture's two rows of 24 tokens: row r, the first n tokens, the first plen the prompt
static SftExample fixture_example(const Npy *tokens, int r, int n, int plen) {
    SftExample e = {(int *)mallocCheck(n * sizeof(int)), n, plen, 0};
    for (int t = 0; t < n; t++) e.ids[t] = (int)tokens->data[r * 24 + t];
    return e;
}

START_TEST(test_loss_matches_transformers) {
    char p[1024];
    fixture_path(p, sizeof p, "qwen3/tokens.npy");
    Npy tokens = npy_read(p);
    fixture_path(p, sizeof p, "qwen3/logits.npy");
    Npy logits = npy_read(p);  // (2, 24, V) transformers, each row alone, fp32
    int V = (int)logits.shape[2];
    // row 0 whole with a 7-token prompt; row 1 cut to 15 tokens (so padded to 24) with a 3-token prompt.
    // Causal attention: the fixture's logits at positions < 15 of row 1 are those of its first 15 tokens.
    int n[2] = {24, 15}, plen[2] = {7, 3};
    SftExample ex[2] = {fixture_example(&tokens, 0, n[0], plen[0]), fixture_example(&tokens, 1, n[1], plen[1])};
    double nll = 0;
    long count = 0;
    for (int r = 0; r < 2; r++)
        for (int t = plen[r] - 1; t + 1 < n[r]; t++) {  // the completion tokens, from transformers' logits in fp64
            const double *z = logits.data + ((size_t)r * 24 + t) * V;
            double mx = z[0], s = 0;
            for (int v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
            for (int v = 0; v < V; v++) s += exp(z[v] - mx);
            nll += mx + log(s) - z[ex[r].ids[t + 1]];
            count++;
        }
    ck_assert_int_eq(count, 17 + 12);
    double want = nll / count;

    Model m;
    load_qwen3(&m, backend_cpu());
    const SftExample *b[2] = {&ex[0], &ex[1]};
    SftBatch bt;
    sft_batch_make(&bt, b, 2);
    ck_assert_int_eq(bt.ntok, count);
    double got = sft_loss(&m, NULL, &bt, (double)bt.ntok, 0);
    // both sides compute in fp32 (the C model, and transformers in float32): each logit carries a few
    // fp32 roundings of its ~100-term sums, 1e-6 relative at most, and the mean of log-softmax
    // entries no more than that
    double tol = 1e-6 * want;
    printf("SFT loss: %.9f, transformers' logits give %.9f (|diff| %.2e, tolerance %.2e)\n", got, want, fabs(got - want), tol);
    ck_assert_msg(fabs(got - want) <= tol, "loss %.9f, want %.9f", got, want);
    ck_assert_msg(want > 1.0, "the check is vacuous: loss %.3f", want);
    // the held-out loss (sft_eval, --eval_data) of the same two examples, one a micro-batch: the same mean
    for (int mb = 1; mb <= 2; mb++) {
        SftTrainer tr = {.m = &m, .micro_batch = mb};
        long tok = 0;
        double e = sft_eval(&tr, b, 2, &tok);
        printf("held-out loss, micro-batches of %d: %.9f (%ld tokens)\n", mb, e, tok);
        ck_assert_int_eq(tok, count);
        ck_assert_msg(fabs(e - want) <= tol, "sft_eval %.9f, want %.9f", e, want);
    }
    sft_batch_free(&bt);
    model_free(&m);
    sft_example_free(&ex[0]), sft_example_free(&ex[1]);
    npy_free(&tokens), npy_free(&logits);
}
END_TEST

// the dense weights of m as doubles (the hp / act type of the fp64 backend)
static double *weights_f64(const Model *m, size_t *n) {
    *n = m->w.dense_bytes / sizeof(double);
    double *w = (double *)mallocCheck(m->w.dense_bytes);
    m->be->download(w, m->w.dense_mem, m->w.dense_bytes);
    return w;
}

START_TEST(test_grad_accumulation_equals_one_batch) {
    // four examples of different lengths: one step on all four at once, and one of four micro-batches
    // (each padded to its own length): the same loss, gradient norm and updated weights (fp64 backend)
    char p[1024];
    fixture_path(p, sizeof p, "qwen3/tokens.npy");
    Npy tokens = npy_read(p);
    SftExample ex[4] = {fixture_example(&tokens, 0, 24, 5), fixture_example(&tokens, 1, 11, 4), fixture_example(&tokens, 0, 9, 8),
                        fixture_example(&tokens, 1, 20, 12)};
    const SftExample *b[4] = {&ex[0], &ex[1], &ex[2], &ex[3]};
    double *w[2];
    size_t nw;
    SftStats s[2];
    for (int k = 0; k < 2; k++) {
        Model m;
        load_qwen3(&m, backend_cpu64());
        FullTrainer ft;
        full_init(&ft, &m);
        SftTrainer tr = {.m = &m, .full = &ft, .micro_batch = k == 0 ? 4 : 1, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                         .weight_decay = 0.01f, .max_grad_norm = 0.5};
        s[k] = sft_step(&tr, b, 4, 1e-3);
        w[k] = weights_f64(&m, &nw);
        full_free(&ft);
        model_free(&m);
    }
    ck_assert_int_eq(s[0].tokens, 19 + 7 + 1 + 8);
    ck_assert_int_eq(s[0].pad_tokens, 4 * 24);
    ck_assert_int_eq(s[1].pad_tokens, 24 + 11 + 9 + 20);
    ck_assert_msg(fabs(s[0].loss - s[1].loss) <= 1e-12 * s[0].loss, "loss %.15g vs %.15g", s[0].loss, s[1].loss);
    ck_assert_msg(fabs(s[0].grad_norm - s[1].grad_norm) <= 1e-12 * s[0].grad_norm, "grad_norm %.15g vs %.15g", s[0].grad_norm,
                  s[1].grad_norm);
    ck_assert_msg(s[0].grad_norm > 0.5, "clipping not exercised: grad_norm %g", s[0].grad_norm);
    double d = max_abs_diff_d(w[0], w[1], (long)nw);
    ck_assert_msg(d <= 1e-12, "the weights after the step differ by %g", d);
    free(w[0]), free(w[1]);
    for (int i = 0; i < 4; i++) sft_example_free(&ex[i]);
    npy_free(&tokens);
}
END_TEST

// ----------------------------------------------------------------------------
// learning: a few hundred steps on the built-in arithmetic, every weight of a small random model

START_TEST(test_builtin_data_loss_falls) {
    Tokenizer *tok = tokenizer_byte_level();
    Config c = {0};
    c.arch = ARCH_QWEN3;
    c.V = (tokenizer_vocab_size(tok) + 7) / 8 * 8;
    c.C = 64, c.FF = 128, c.L = 2, c.NH = 4, c.KVH = 2, c.HD = 16, c.max_pos = 64;
    c.eps = 1e-6f, c.rope_theta = 10000.0f, c.qk_norm = 1, c.tied = 1, c.bos_id = -1;
    Model m;
    ModelOptions dense = {FP8_OFF, 0, 0, 0, 0};
    model_init_random(&m, &c, backend_cpu(), &dense, 5);
    FullTrainer ft;
    full_init(&ft, &m);
    SftTrainer tr = {.m = &m, .full = &ft, .micro_batch = 32, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .max_grad_norm = 1.0};
    SftFormat f = {tok, 0, NULL, sft_eos_id(tok, 0), 0};
    Task task;
    TaskOptions to = task_options_default();
    task_open_or_die(&task, "arithmetic", &to);
    enum { STEPS = 300, B = 32, H = 64 };
    SftExample ex[B], held[H];  // held: the task's held-out problems, whose loss sft_eval measures
    const SftExample *b[B], *hb[H];
    for (int i = 0; i < H; i++) {
        Example e;
        task_example(&task, SPLIT_HELDOUT, i, &e);
        sft_encode(&f, NULL, e.prompt, e.answer, &held[i]);
        hb[i] = &held[i];
        example_free(&e);
    }
    double first = 0, last = 0, held0 = sft_eval(&tr, hb, H, NULL);
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < B; i++) {
            Example e;
            task_example(&task, SPLIT_TRAIN, (uint64_t)step * B + i, &e);
            sft_encode(&f, NULL, e.prompt, e.answer, &ex[i]);
            b[i] = &ex[i];
            example_free(&e);
        }
        SftStats s = sft_step(&tr, b, B, lr_schedule("cosine", 3e-3, step, STEPS / 10, STEPS));
        if (step < 10) first += s.loss / 10;
        if (step >= STEPS - 10) last += s.loss / 10;
        for (int i = 0; i < B; i++) sft_example_free(&ex[i]);
    }
    double held1 = sft_eval(&tr, hb, H, NULL);
    printf("SFT on the built-in arithmetic, %d steps: loss %.3f (first 10 steps) -> %.3f (last 10); held-out %.3f -> %.3f\n",
           STEPS, first, last, held0, held1);
    ck_assert_msg(first > 3.0, "the random model starts at loss %.3f (log V is %.2f)", first, log(c.V));
    ck_assert_msg(last < 0.35 * first, "loss %.3f -> %.3f", first, last);
    ck_assert_msg(held1 < 0.35 * held0, "held-out loss %.3f -> %.3f: it learned the training problems only", held0, held1);
    for (int i = 0; i < H; i++) sft_example_free(&held[i]);
    task_free(&task);
    full_free(&ft);
    model_free(&m);
    tokenizer_free(tok);
}
END_TEST

START_TEST(test_learning_rate_schedules) {
    // transformers' schedules: a linear ramp over warmup, then linear to 0, cosine to 0, or constant
    ck_assert_double_eq_tol(lr_schedule("linear", 1.0, 0, 2, 10), 0.0, 1e-15);
    ck_assert_double_eq_tol(lr_schedule("linear", 1.0, 1, 2, 10), 0.5, 1e-15);
    ck_assert_double_eq_tol(lr_schedule("linear", 1.0, 2, 2, 10), 1.0, 1e-15);
    ck_assert_double_eq_tol(lr_schedule("linear", 1.0, 6, 2, 10), 0.5, 1e-15);
    ck_assert_double_eq_tol(lr_schedule("cosine", 1.0, 6, 2, 10), 0.5, 1e-12);
    ck_assert_double_eq_tol(lr_schedule("cosine", 1.0, 4, 2, 10), 0.5 * (1 + cos(M_PI * 0.25)), 1e-12);
    ck_assert_double_eq_tol(lr_schedule("constant", 1.0, 9, 2, 10), 1.0, 1e-15);
    ck_assert_double_eq_tol(lr_schedule("constant", 1.0, 1, 2, 10), 0.5, 1e-15);
    EXPECT_DIE(lr_schedule("polynomial", 1.0, 1, 2, 10), "unknown lr_scheduler_type 'polynomial': use linear, cosine or constant");
}
END_TEST

// ----------------------------------------------------------------------------
// ./train_sft end to end (CPU)

static char model_dir[1200], data_path[1200];

// A model directory with a tokenizer (the built-in model after a short warm-up: warm_model), and
// arithmetic demonstrations.
static void setup_program(void) {
    static int done = 0;
    if (done) return;
    done = 1;
    warm_model(model_dir, sizeof model_dir);
    snprintf(data_path, sizeof data_path, "%s", tmp_path("sum.jsonl"));
    char text[16384] = "";
    for (int i = 0; i < 48; i++)
        snprintf(text + strlen(text), sizeof text - strlen(text), "{\"prompt\": \"%d+%d=\", \"completion\": \"%d\"}\n", i % 13,
                 i % 7, i % 13 + i % 7);
    write_text(data_path, text);
}

#define SFT_ARGS "--device cpu --quiet --max_steps 20 --per_device_train_batch_size 4 --gradient_accumulation_steps 2 " \
                 "--learning_rate 1e-3 --logging_steps 5 --save_steps 10 --warmup_ratio 0.1"

START_TEST(test_full_checkpoint_reloads) {
    setup_program();
    char cmd[4096], out[16384], p[1400], q[1500];
    const char *dir = tmp_path("full");
    snprintf(cmd, sizeof cmd, "./train_sft " SFT_ARGS " --model %s --data %s --output_dir %s", model_dir, data_path, dir);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
    // max_length left at its default (1024) fits itself to the model (64 positions) without a word
    ck_assert_msg(!strstr(out, "max_position_embeddings"), "a warning about a default: %s", out);
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "optimizer.safetensors", "trainer_state.json"};
    for (int k = 10; k <= 20; k += 10)
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
            snprintf(p, sizeof p, "%s/checkpoint-%d/%s", dir, k, files[i]);
            ck_assert_msg(file_exists(p), "%s missing", p);
        }
    // metrics: a line per logging_steps with TRL's names; the loss falls from its first window to its last
    double l5 = metrics_loss(dir, 5), l20 = metrics_loss(dir, 20);
    ck_assert_msg(isfinite(l5) && isfinite(l20) && l20 < l5, "loss at step 5 %g, at step 20 %g", l5, l20);
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    char *m = read_file(p, NULL);
    ck_assert_msg(strstr(m, "\"grad_norm\": ") && strstr(m, "\"learning_rate\": ") && strstr(m, "\"tokens_per_second\": ") &&
                      strstr(m, "\"step\": 15,") && !strstr(m, "\"step\": 4,"),
                  "%s", m);
    free(m);

    // the Hugging Face checkpoint holds exactly the trained weights: read back, they are the fp32
    // masters of optimizer.safetensors bit for bit (one flat layout: model_load pads as full_finetune.h's)
    snprintf(p, sizeof p, "%s/checkpoint-20", dir);
    Model mm;
    ModelOptions dense = {FP8_OFF, 0, 0, 0, 0};
    model_load(&mm, p, backend_cpu(), &dense);
    snprintf(q, sizeof q, "%s/optimizer.safetensors", p);
    SafeTensors st;
    st_open(&st, q);
    const STensor *params = st_find(&st, "params");
    ck_assert_ptr_nonnull(params);
    ck_assert_uint_eq(params->nbytes, mm.w.dense_bytes);
    ck_assert_msg(!memcmp(params->data, mm.w.dense_mem, params->nbytes), "model.safetensors is not the trained weights");
    st_close(&st);
    // and ./generate reads it: its logits are the reloaded model's
    snprintf(q, sizeof q, "%s/logits.npy", dir);
    snprintf(cmd, sizeof cmd, "./generate --device cpu --model %s --tokens '49 43 50 61' --load_in_fp8 off --dump_logits %s", p, q);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
    Npy lg = npy_read(q);
    int ids[4] = {49, 43, 50, 61};
    model_forward(&mm, NULL, ids, 1, 4);
    float *mine = (float *)mallocCheck((size_t)lg.n * sizeof(float));
    ck_assert_int_eq(lg.n, 4 * mm.cfg.V);
    model_logits(&mm, mine);
    for (long i = 0; i < lg.n; i++) ck_assert_msg(lg.data[i] == mine[i], "logit %ld: %g vs %g", i, lg.data[i], mine[i]);
    // and transformers reads it as the same model: its logits of this checkpoint (made by
    // dev/make_sft_fixture.py from the same deterministic CPU run) within 1e-4 of the largest logit,
    // the model fixtures' tolerance for two fp32 forwards that sum in different orders
    fixture_path(q, sizeof q, "sft/transformers_logits.npy");
    Npy hf = npy_read(q);
    ck_assert_int_eq(hf.n, lg.n);
    double big = 0, worst = 0;
    for (long i = 0; i < hf.n; i++) big = fmax(big, fabs(hf.data[i]));
    for (long i = 0; i < hf.n; i++) worst = fmax(worst, fabs(hf.data[i] - lg.data[i]));
    printf("full fine-tune checkpoint in transformers: max |diff| %.3g of max |logit| %.3g\n", worst, big);
    ck_assert_msg(worst <= 1e-4 * big, "transformers' logits differ by %g (max |logit| %g)", worst, big);
    npy_free(&hf);
    free(mine);
    npy_free(&lg);
    model_free(&mm);
}
END_TEST

// a bf16 checkpoint trains and saves in bf16
START_TEST(test_bf16_model_saved_in_bf16) {
    setup_program();
    // the warm-up model in bf16, with its tokenizer
    const char *src = tmp_path("bf16model"), *dir = tmp_path("bf16run");
    Model mm;
    ModelOptions dense = {FP8_OFF, 0, 0, 0, 0};
    model_load(&mm, model_dir, backend_cpu(), &dense);
    model_save_hf(&mm, src, DT_BF16);
    model_free(&mm);
    char cmd[4096], out[8192], p[1400];
    snprintf(cmd, sizeof cmd, "cp %s/tokenizer.json %s/ && ./train_sft --device cpu --quiet --max_steps 2 --max_length 100 --model %s "
             "--data %s --output_dir %s", model_dir, src, src, data_path, dir);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
    // a --max_length given beyond the model's positions is said (the default is not: test_full_checkpoint_reloads)
    ck_assert_msg(strstr(out, "max_length 100 is more than the model's max_position_embeddings 64: examples are cut at 64 tokens"),
                  "%s", out);
    snprintf(p, sizeof p, "%s/checkpoint-2/model.safetensors", dir);
    SafeTensors st;
    st_open(&st, p);
    ck_assert_int_eq(st_find(&st, "model.embed_tokens.weight")->dtype, DT_BF16);
    st_close(&st);
}
END_TEST

START_TEST(test_resume_bit_exact) {
    // 10 steps, then --resume to 20, against 20 straight: the same checkpoint-20, byte for byte (every
    // weight; a LoRA adapter; every weight with AdamW's moments in bf16, rounded stochastically)
    setup_program();
    const char *modes[3] = {"", "--use_peft --lora_r 4 --load_in_fp8 block", "--adam_moments bf16"};
    const char *outs[3][2] = {{"straight", "resumed"}, {"peft_straight", "peft_resumed"}, {"m16_straight", "m16_resumed"}};
    const char *check[3][2] = {{"optimizer.safetensors", "model.safetensors"}, {"optimizer.safetensors", "adapter_model.safetensors"},
                               {"optimizer.safetensors", "model.safetensors"}};
    for (int k = 0; k < 3; k++) {
        char a[1200], b[1200], cmd[4096], out[8192], p[1400], q[1400];
        snprintf(a, sizeof a, "%s", tmp_path(outs[k][0]));
        snprintf(b, sizeof b, "%s", tmp_path(outs[k][1]));
        snprintf(cmd, sizeof cmd, "./train_sft " SFT_ARGS " %s --model %s --data %s --output_dir %s", modes[k], model_dir, data_path, a);
        ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
        // the resumed run: a copy of the first stopped after checkpoint-10 (its later files gone)
        snprintf(cmd, sizeof cmd, "cp -r %s %s && rm -rf %s/checkpoint-20", a, b, b);
        ck_assert_int_eq(system(cmd), 0);
        snprintf(cmd, sizeof cmd, "./train_sft " SFT_ARGS " %s --model %s --data %s --output_dir %s --resume", modes[k], model_dir,
                 data_path, b);
        ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
        for (int i = 0; i < 2; i++) {
            snprintf(p, sizeof p, "%s/checkpoint-20/%s", a, check[k][i]);
            snprintf(q, sizeof q, "%s/checkpoint-20/%s", b, check[k][i]);
            ck_assert_msg(same_file(p, q), "%s differs from %s", q, p);
        }
        ck_assert_msg(metrics_loss(a, 20) == metrics_loss(b, 20) && metrics_loss(b, 15) == metrics_loss(a, 15),
                      "metrics differ after the resume");
        // --resume again: the run is finished, nothing is trained
        ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
        ck_assert_msg(strstr(out, "nothing left to do"), "%s", out);
    }
}
END_TEST

// --overwrite_output_dir: the earlier run's checkpoints and metrics gone (plot.svg is the new run's), so a later --resume continues
// the new run and metrics.jsonl holds its lines alone; a start-over that fails on its data leaves the
// earlier run as it was, and a run that fails into a new directory leaves none behind
START_TEST(test_overwrite_output_dir) {
    setup_program();
    char dir[1200], cmd[4096], out[8192], p[1400];
    snprintf(dir, sizeof dir, "%s", tmp_path("over"));
    const char *args = "./train_sft --device cpu --quiet --logging_steps 1 --save_steps 1";
    snprintf(cmd, sizeof cmd, "%s --max_steps 3 --model %s --data %s --output_dir %s", args, model_dir, data_path, dir);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
    snprintf(cmd, sizeof cmd, "%s --max_steps 1 --model %s --data %s.none --output_dir %s --overwrite_output_dir", args, model_dir,
             data_path, dir);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) != 0, "%s", out);
    snprintf(p, sizeof p, "%s/checkpoint-3", dir);
    ck_assert_msg(access(p, F_OK) == 0, "the earlier run was touched");
    ck_assert(!isnan(metrics_loss(dir, 3)));
    snprintf(cmd, sizeof cmd, "%s --max_steps 1 --model %s --data %s --output_dir %s --overwrite_output_dir", args, model_dir, data_path,
             dir);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
    snprintf(cmd, sizeof cmd, "ls -A %s | grep -v -x -e checkpoint-1 -e metrics.jsonl -e plot.svg -e .lock", dir);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) != 0, "left of the earlier run: %s", out);
    ck_assert(!isnan(metrics_loss(dir, 1)) && isnan(metrics_loss(dir, 2)) && isnan(metrics_loss(dir, 3)));
    snprintf(cmd, sizeof cmd, "%s --max_steps 2 --model %s --data %s --output_dir %s --resume", args, model_dir, data_path, dir);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0 && strstr(out, "/checkpoint-1 (the data at example"), "%s", out);
    ck_assert(!isnan(metrics_loss(dir, 2)) && isnan(metrics_loss(dir, 3)));
    // a run that fails on its data into a directory it would make: refused before the directory is
    // claimed (no "output:" line), nothing left
    snprintf(p, sizeof p, "%s", tmp_path("new/sub"));
    snprintf(cmd, sizeof cmd, "%s --max_steps 1 --model %s --data %s.none --output_dir %s", args, model_dir, data_path, p);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) != 0 && strstr(out, ".none: No such file") && !strstr(out, "output: "), "%s", out);
    snprintf(p, sizeof p, "%s", tmp_path("new"));
    ck_assert_msg(access(p, F_OK) != 0, "%s left behind", p);
}
END_TEST

START_TEST(test_gradient_checkpointing_same_result) {
    // recomputing each layer in the backward, or the MLP's gate and up products alone, changes the
    // memory, not one bit of the result (CPU)
    setup_program();
    char cmd[4096], out[8192], p[1400], q[1400];
    const char *flags[3] = {"", "--gradient_checkpointing", "--recompute_mlp"};
    const char *dirs[3] = {tmp_path("nogc"), tmp_path("gc"), tmp_path("rmlp")};
    for (int k = 0; k < 3; k++) {
        snprintf(cmd, sizeof cmd, "./train_sft --device cpu --quiet --max_steps 3 --model %s --data %s --output_dir %s %s", model_dir,
                 data_path, dirs[k], flags[k]);
        ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
    }
    snprintf(p, sizeof p, "%s/checkpoint-3/optimizer.safetensors", dirs[0]);
    for (int k = 1; k < 3; k++) {
        snprintf(q, sizeof q, "%s/checkpoint-3/optimizer.safetensors", dirs[k]);
        ck_assert_msg(same_file(p, q), "%s changed the trained weights", flags[k]);
    }
}
END_TEST

// --eval_data through the program: the held-out loss every --eval_steps and at the end, once each, as
// metrics.jsonl records {"step", "eval_loss", "eval_tokens"}
START_TEST(test_eval_data) {
    setup_program();
    const char *dir = tmp_path("evalrun");
    char cmd[4096], out[8192], p[1500];
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && ./train_sft --device cpu --quiet --max_steps 3 --eval_steps 2 --model %s --data %s --eval_data %s "
             "--output_dir %s", dir, model_dir, data_path, data_path, dir);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    char *m = read_file(p, NULL), *save = NULL;
    int steps[4], n = 0;
    for (char *line = strtok_r(m, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strstr(line, "eval_loss")) continue;
        int st;
        double loss;
        ck_assert_msg(sscanf(line, "{\"step\": %d, \"eval_loss\": %lf", &st, &loss) == 2, "%s", line);
        ck_assert_msg(n < 4 && isfinite(loss) && loss > 0, "%s", line);
        steps[n++] = st;
    }
    ck_assert_msg(n == 2 && steps[0] == 2 && steps[1] == 3, "%d eval records (steps %d, %d): want steps 2 and 3", n, n ? steps[0] : -1,
                  n > 1 ? steps[1] : -1);
    ck_assert_msg(strstr(out, "eval: step 3 | eval_loss"), "%s", out);
    free(m);
}
END_TEST

START_TEST(test_bad_flags_and_data) {
    setup_program();
    const char *bad = tmp_path("bad_data.jsonl");
    write_text(bad, "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n{\"prompt\": \"2+2=\", \"answer\": \"4\"}\n");
    char model[1300], data[1300], badd[1300];
    snprintf(model, sizeof model, "--model %s", model_dir);
    snprintf(data, sizeof data, "--data %s", data_path);
    snprintf(badd, sizeof badd, "--data %s", bad);
    const BadCase cases[] = {
        {"", data, "", "--model is required"},
        {model, "", "", "--data is required"},
        {model, data, "--load_in_fp8 block", "--load_in_fp8 block freezes the linear weights in FP8, but training every weight"},
        {model, data, "--lr_scheduler_type polynomial", "--lr_scheduler_type: unknown value 'polynomial': use linear, cosine or constant"},
        {model, data, "--per_device_train_batch_size 0", "--per_device_train_batch_size: 0 is too small: at least 1"},
        {model, data, "--max_steps abc", "--max_steps: 'abc' is not an integer"},
        {model, data, "--num_generations 4", "unknown option --num_generations"},
        {model, data, "--resume --overwrite_output_dir", "contradict"},
        {model, data, "--use_peft --fp8_recipe block", "--fp8_recipe block trains every weight in FP8; with --use_peft the base is frozen"},
        {model, data, "--fp8_recipe delayed", "--fp8_recipe delayed: FP8 training runs on the GPU (the CPU backend has no FP8 GEMMs)"},
        {model, data, "--fp8_recipe hybrid", "--fp8_recipe: unknown value 'hybrid'"},
        {model, data, "--fp8_lm_head", "--fp8_lm_head runs under --fp8_recipe delayed (got off)"},
        {model, data, "--eval_steps 5", "--eval_steps 5 evaluates --eval_data, which is not given"},
        {model, data, "--eval_data /nonexistent/eval.jsonl", "/nonexistent/eval.jsonl"},
        {model, data, "--fp8_recipe current --fp8_lm_head", "--fp8_lm_head runs under --fp8_recipe delayed (got current)"},
        {model, data, "--resume", "--resume: no checkpoint-N in"},
        {model, badd, "", "bad_data.jsonl:2: missing \"completion\" (\"prompt\"/\"answer\" is train_grpo's data"},
        {"--model /nonexistent/dir", data, "", "/nonexistent/dir"},
    };
    const char *dir = tmp_path("badrun");
    expect_bad_runs("./train_sft --device cpu", dir, cases, sizeof cases / sizeof cases[0]);
    // a directory holding a checkpoint is never trained over without --resume
    char cmd[4096], out[8192], p[1500];
    snprintf(cmd, sizeof cmd, "rm -rf %s && ./train_sft --device cpu --quiet --max_steps 1 %s %s --output_dir %s", dir, model, data, dir);
    ck_assert_msg(run_cmd(cmd, out, sizeof out) == 0, "%s", out);
    snprintf(p, sizeof p, "%s/checkpoint-1/optimizer.safetensors", dir);
    size_t n0;
    char *before = read_file(p, &n0);
    snprintf(cmd, sizeof cmd, "./train_sft --device cpu --quiet --max_steps 1 --learning_rate 0.1 %s %s --output_dir %s", model, data, dir);
    ck_assert_int_ne(run_cmd(cmd, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "already holds checkpoint-1: pass --resume"), "%s", out);
    char *after = read_file(p, &n0);
    ck_assert_msg(!memcmp(before, after, n0), "the checkpoint was overwritten");
    free(before), free(after);
}
END_TEST

static Suite *sft_suite(void) {
    Suite *s = suite_create("sft");
    TCase *tc = tcase_create("sft");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_jsonl_formats);
    tcase_add_test(tc, test_jsonl_errors);
    tcase_add_test(tc, test_encode_and_mask);
    tcase_add_test(tc, test_data_load_and_order);
    tcase_add_test(tc, test_learning_rate_schedules);
    tcase_add_test(tc, test_loss_matches_transformers);
    tcase_add_test(tc, test_grad_accumulation_equals_one_batch);
    tcase_add_test(tc, test_builtin_data_loss_falls);
    tcase_add_test(tc, test_full_checkpoint_reloads);
    tcase_add_test(tc, test_eval_data);
    tcase_add_test(tc, test_bf16_model_saved_in_bf16);
    tcase_add_test(tc, test_resume_bit_exact);
    tcase_add_test(tc, test_gradient_checkpointing_same_result);
    tcase_add_test(tc, test_overwrite_output_dir);
    tcase_add_test(tc, test_bad_flags_and_data);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    // one process: the model made by the first program test is reused by the others
    setenv("CK_FORK", "no", 1);
    return tmp_cleanup(run_suite(sft_suite()));
}
