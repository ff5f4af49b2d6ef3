// test/test_dist.c: several processes as one (dist.h, data_parallel.h, ./train_grpo --nproc_per_node).
//   env        the rank environment of torchrun and Slurm read as they set it, each bad one a
//              one-line error naming the variable; Slurm host lists
//   ring       the CPU collectives on 2 and 3 real processes over TCP, random inputs (never zeros),
//              sizes that do not divide by the ranks, smaller than them, and larger than a socket's
//              buffer: sums within the fp32 bound of their order and identical on every rank,
//              gathers and broadcasts exact; the same through a stand-in device's memory (a GPU
//              without NCCL)
//   failures   a rank that dies (every other one stops with one line, in seconds), one that hangs
//              (the timeout), one that never comes (the rendezvous says so), a wrong WORLD_SIZE
//   dp         which ranks resume a checkpoint's batch and the line when they cannot; ZeRO's shards
//   train      ./train_grpo on 2 and 3 processes gives the adapter of one process with the same
//              global batch (tolerance derived below), under every loss normalizer; a rank killed
//              mid-run stops the others, and --resume continues bit-exactly at the same world size
//              and to the same tolerance on one process; ./train_sft sharded (ZeRO) on 2 ranks
//              gives one process's gradients and resumes on one
#include <check.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "dist/data_parallel.h"
#include "dist/dist.h"
#include "io/safetensors.h"
#include "core/fp8_recipe.h"

// ----------------------------------------------------------------------------
// env: a table in place of the process environment

static const char *const *env_tab;
static const char *tab_get(const char *name) {
    size_t k = strlen(name);
    for (const char *const *p = env_tab; p && *p; p++)
        if (!strncmp(*p, name, k) && (*p)[k] == '=') return *p + k + 1;
    return NULL;
}
static int parse(const char *const *tab, DistEnv *e, char *err, size_t cap) {
    env_tab = tab;
    err[0] = 0;
    return dist_env_parse(tab_get, e, err, cap);
}
// one line naming what is wrong
static void expect_error(const char *const *tab, const char *substr) {
    DistEnv e;
    char err[512];
    ck_assert_int_eq(parse(tab, &e, err, sizeof err), -1);
    ck_assert_msg(strstr(err, substr), "error '%s' does not mention '%s'", err, substr);
    ck_assert_msg(!strchr(err, '\n'), "error '%s' is not one line", err);
}

// the table parses to these values
static void expect_env(const char *const *tab, int rank, int world, int lrank, int lworld, const char *addr, int port, const char *source) {
    DistEnv e;
    char err[512];
    ck_assert_msg(parse(tab, &e, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(e.rank, rank);
    ck_assert_int_eq(e.world, world);
    ck_assert_int_eq(e.local_rank, lrank);
    ck_assert_int_eq(e.local_world, lworld);
    ck_assert_str_eq(e.addr, addr);
    ck_assert_int_eq(e.port, port);
    ck_assert_str_eq(e.source, source);
}

START_TEST(test_env_none_and_torchrun) {
    DistEnv e;
    char err[512];
    const char *none[] = {"HOME=/root", NULL};
    ck_assert_int_eq(parse(none, &e, err, sizeof err), 0);
    ck_assert_int_eq(e.world, 1);
    ck_assert_int_eq(e.rank, 0);
    ck_assert_str_eq(e.source, "none");
    ck_assert(e.timeout == 1800);
    // what torchrun --nnodes 2 --nproc_per_node 4 sets on the second machine's third process
    expect_env((const char *[]){"RANK=6", "WORLD_SIZE=8", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=4", "MASTER_ADDR=node1", "MASTER_PORT=29400", NULL},
               6, 8, 2, 4, "node1", 29400, "torchrun");
    // what --nproc_per_node 2 sets
    expect_env((const char *[]){"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=40000",
                                "FP8GRPO_LAUNCHED=1", NULL},
               1, 2, 1, 2, "127.0.0.1", 40000, "--nproc_per_node");
    // one machine, only RANK and WORLD_SIZE: LOCAL_RANK = RANK, rank 0 on this host, torchrun's port
    const char *min[] = {"RANK=1", "WORLD_SIZE=2", "FP8GRPO_DIST_TIMEOUT=5", NULL};
    ck_assert_int_eq(parse(min, &e, err, sizeof err), 0);
    ck_assert_int_eq(e.local_rank, 1);
    ck_assert_int_eq(e.local_world, 2);
    ck_assert_str_eq(e.addr, "127.0.0.1");
    ck_assert_int_eq(e.port, 29500);
    ck_assert(e.timeout == 5);
}
END_TEST

START_TEST(test_env_slurm) {
    // srun -N 2 --ntasks-per-node 4 inside job 123456: task 5 is the second node's second
    expect_env((const char *[]){"SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_STEP_NUM_TASKS=8", "SLURM_LOCALID=1",
                                "SLURM_STEP_TASKS_PER_NODE=4(x2)", "SLURM_JOB_ID=123456", "SLURM_STEP_NODELIST=gpu[07-08]", NULL},
               5, 8, 1, 4, "gpu07", 20000 + 123456 % 20000, "slurm");
    // the batch script's own environment (no srun step): SLURM_NTASKS of the allocation, one node
    expect_env((const char *[]){"SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_JOB_ID=7", NULL}, 0, 1, 0, 1, "127.0.0.1", 20007, "slurm");
    // MASTER_ADDR / MASTER_PORT given win; torchrun's variables win over Slurm's
    expect_env((const char *[]){"SLURM_PROCID=3", "SLURM_NTASKS=4", "MASTER_ADDR=10.0.0.9", "MASTER_PORT=1234", "RANK=0", "WORLD_SIZE=1", NULL},
               0, 1, 0, 1, "10.0.0.9", 1234, "torchrun");
    char h[64];
    ck_assert_int_eq(dist_slurm_first_host("a[07-09,12],b", h, sizeof h), 0);
    ck_assert_str_eq(h, "a07");
    ck_assert_int_eq(dist_slurm_first_host("node-3,node-4", h, sizeof h), 0);
    ck_assert_str_eq(h, "node-3");
    ck_assert_int_eq(dist_slurm_first_host("x[3]", h, sizeof h), 0);
    ck_assert_str_eq(h, "x3");
    ck_assert_int_eq(dist_slurm_first_host("", h, sizeof h), -1);
    ck_assert_int_eq(dist_slurm_first_host("x[a-b]", h, sizeof h), -1);
}
END_TEST

START_TEST(test_env_errors) {
    expect_error((const char *[]){"RANK=0", NULL}, "WORLD_SIZE is not");
    expect_error((const char *[]){"WORLD_SIZE=2", NULL}, "RANK is not");
    expect_error((const char *[]){"RANK=2", "WORLD_SIZE=2", NULL}, "RANK must be below WORLD_SIZE");
    expect_error((const char *[]){"RANK=one", "WORLD_SIZE=2", NULL}, "RANK='one'");
    expect_error((const char *[]){"RANK=0", "WORLD_SIZE=0", NULL}, "WORLD_SIZE='0'");
    expect_error((const char *[]){"RANK=0", "WORLD_SIZE=2x", NULL}, "WORLD_SIZE='2x'");
    expect_error((const char *[]){"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=70000", NULL}, "MASTER_PORT='70000'");
    expect_error((const char *[]){"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", NULL}, "LOCAL_RANK='2'");
    expect_error((const char *[]){"RANK=0", "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=2", NULL}, "MASTER_ADDR is not set");
    expect_error((const char *[]){"FP8GRPO_DIST_TIMEOUT=0", NULL}, "FP8GRPO_DIST_TIMEOUT='0'");
    expect_error((const char *[]){"SLURM_PROCID=0", NULL}, "start the ranks with srun");
    expect_error((const char *[]){"SLURM_PROCID=4", "SLURM_NTASKS=4", NULL}, "SLURM_PROCID='4'");
    expect_error((const char *[]){"SLURM_PROCID=0", "SLURM_NTASKS=2", NULL}, "gives no first node");
}
END_TEST

// ----------------------------------------------------------------------------
// ring: W real processes on this machine

static char tmp_dir[] = "/tmp/fp8grpo_distXXXXXX";

// a socket listening on a port the kernel picks (its number in *port), held from here until rank 0
// takes it (DistEnv.master_fd), as dist_launch does: no other process can take the port in between
static int listening_port(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY), .sin_port = 0};
    socklen_t len = sizeof a;
    ck_assert(fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
    ck_assert(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 64) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    *port = ntohs(a.sin_port);
    return fd;
}

typedef int (*RankFn)(Dist *d, int rank, int world);

// Runs fn on `world` forked ranks (present[r] == 0: rank r is never started), each with the
// environment --nproc_per_node would give it; their exit codes into code, each one's stderr in
// tmp_dir/rank-R.err; the seconds it took. A rank still running after `limit` seconds is a hang:
// killed, and the test fails.
static double run_ranks(int world, RankFn fn, const int *present, const char *timeout, int *code, double limit) {
    static int made = 0;
    if (!made) ck_assert(mkdtemp(tmp_dir)), made = 1;
    int port, lfd = listening_port(&port);
    pid_t pid[8];
    double t0 = now_sec();
    for (int r = 0; r < world; r++) {
        pid[r] = 0;
        if (r > 0 && lfd >= 0) close(lfd), lfd = -1;  // rank 0 has it (or, absent, nobody listens there)
        if (present && !present[r]) continue;
        pid[r] = fork();
        ck_assert(pid[r] >= 0);
        if (pid[r] == 0) {
            char v[64], path[256];
            if (r == 0) snprintf(v, sizeof v, "%d", lfd), setenv("FP8GRPO_MASTER_FD", v, 1);
            snprintf(path, sizeof path, "%s/rank-%d.err", tmp_dir, r);
            if (!freopen(path, "w", stderr)) _exit(99);
            snprintf(v, sizeof v, "%d", r), setenv("RANK", v, 1), setenv("LOCAL_RANK", v, 1);
            snprintf(v, sizeof v, "%d", world), setenv("WORLD_SIZE", v, 1);
            snprintf(v, sizeof v, "%d", port), setenv("MASTER_PORT", v, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("FP8GRPO_DIST_TIMEOUT", timeout ? timeout : "30", 1);
            DistEnv e;
            char err[512];
            if (dist_env_parse((DistGetenv)getenv, &e, err, sizeof err)) die("%s", err);
            Dist *d = dist_init(&e);
            int rc = fn(d, r, world);
            if (rc == 0) dist_finalize(d);
            _exit(rc);
        }
    }
    if (lfd >= 0) close(lfd);
    for (int r = 0; r < world; r++) {
        code[r] = -1;
        if (!pid[r]) continue;
        int st = 0;
        for (;;) {
            pid_t p = waitpid(pid[r], &st, WNOHANG);
            if (p == pid[r]) break;
            if (now_sec() - t0 > limit) {
                for (int k = 0; k < world; k++)
                    if (pid[k]) kill(pid[k], SIGKILL);
                ck_abort_msg("rank %d still runs after %.0f s: a hang", r, limit);
            }
            usleep(20000);
        }
        code[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    return now_sec() - t0;
}

// rank r's stderr, copied into a buffer of this file's (no allocation that a failed check would leave behind)
static const char *rank_err(int r) {
    static char buf[8192];
    char path[256];
    snprintf(path, sizeof path, "%s/rank-%d.err", tmp_dir, r);
    char *e = read_file(path, NULL);
    snprintf(buf, sizeof buf, "%s", e);
    free(e);
    return buf;
}

// rank r's value i of the test with seed s: uniform in +-[0.5, 1.5), never 0, different per rank
static float rval(int r, uint64_t s, size_t i) {
    uint64_t x = s * 0x9e3779b97f4a7c15ull ^ (uint64_t)r * 0xbf58476d1ce4e5b9ull ^ (uint64_t)i * 0x94d049bb133111ebull;
    uint64_t u = splitmix64(&x);
    float m = 0.5f + (float)((u >> 11) * 0x1.0p-53);
    return (u & 1) ? -m : m;
}

// Every collective on random inputs. The sum of W fp32 values in any order is within
// gamma_{W-1} = (W-1) u / (1 - (W-1) u) of the sum of their magnitudes (Higham, 2nd ed., eq. 4.4;
// u = 2^-24), compared with the exact sum (fp64 is exact for 3 such addends); fp64's bound
// likewise with u = 2^-53. Gathers, broadcasts and the max move values without arithmetic: exact.
static int all_collectives(Dist *d, int rank, int W) {
    const size_t sizes[] = {1, 2, 5, 1001, (size_t)3 << 20};  // 12 MiB of fp32: far beyond a socket's buffer
    int bad = 0;
    double g32 = (W - 1) * 0x1.0p-24 / (1 - (W - 1) * 0x1.0p-24), g64 = (W - 1) * 0x1.0p-53 / (1 - (W - 1) * 0x1.0p-53);
    for (int si = 0; si < 5; si++) {
        size_t n = sizes[si];
        float *x = (float *)mallocCheck(n * sizeof(float)), *rs = (float *)mallocCheck(W * n * sizeof(float));
        double *y = (double *)mallocCheck(n * sizeof(double)), *mx = (double *)mallocCheck(n * sizeof(double));
        for (size_t i = 0; i < n; i++) x[i] = rval(rank, si, i), y[i] = x[i] * 1.25, mx[i] = x[i];
        for (int r = 0; r < W; r++)
            for (size_t i = 0; i < n; i++) rs[r * n + i] = rval(rank, 100 + si, r * n + i);
        dist_all_reduce_sum_f32_host(d, x, n);
        dist_all_reduce_sum_f64_host(d, y, n);
        dist_all_reduce_max_f64_host(d, mx, n);
        dist_reduce_scatter_sum_f32_host(d, rs, n);
        for (size_t i = 0; i < n; i++) {
            double exact = 0, mag = 0, emax = -INFINITY, ers = 0, mrs = 0;
            for (int r = 0; r < W; r++) {
                double v = rval(r, si, i), w = rval(r, 100 + si, rank * n + i);
                exact += v, mag += fabs(v), emax = v > emax ? v : emax, ers += w, mrs += fabs(w);
            }
            if (fabs(x[i] - exact) > g32 * mag) bad |= 1;
            if (fabs(y[i] - 1.25 * exact) > g64 * 1.25 * mag) bad |= 2;
            if (mx[i] != emax) bad |= 4;
            if (fabs(rs[rank * n + i] - ers) > g32 * mrs) bad |= 8;
        }
        // identical on every rank: each rank's result gathered and compared with its own
        float *all = (float *)mallocCheck(W * n * sizeof(float));
        memcpy(all + rank * n, x, n * sizeof(float));
        dist_all_gather_host(d, all, n * sizeof(float));
        for (int r = 0; r < W; r++)
            if (memcmp(all + r * n, x, n * sizeof(float))) bad |= 16;
        // the gather itself: every block is that rank's input, exactly
        for (size_t i = 0; i < n; i++) all[rank * n + i] = rval(rank, 200 + si, i);
        dist_all_gather_host(d, all, n * sizeof(float));
        for (int r = 0; r < W; r++)
            for (size_t i = 0; i < n; i++)
                if (all[r * n + i] != rval(r, 200 + si, i)) bad |= 32;
        // broadcast from the last rank and from rank 0
        for (int root = W - 1; root >= 0; root -= W - 1 > 0 ? W - 1 : 1) {
            for (size_t i = 0; i < n; i++) x[i] = rval(rank, 300 + si + root, i);
            dist_broadcast_host(d, x, n * sizeof(float), root);
            for (size_t i = 0; i < n; i++)
                if (x[i] != rval(root, 300 + si + root, i)) bad |= 64;
            if (root == 0) break;
        }
        dist_barrier(d);
        free(x), free(rs), free(y), free(mx), free(all);
    }
    if (bad) fprintf(stderr, "rank %d: failed checks mask %d\n", rank, bad);
    return bad ? 1 : 0;
}

// The backend-memory collectives as a GPU without NCCL runs them (down to the host, the ring, back
// up), on a stand-in device: host memory behind a backend that says it has device memory, whose
// copies are memcpy and count themselves.
static long fake_moves;
static size_t fake_capacity(void) { return (size_t)1 << 30; }
static void fake_sync(void) {}
static void fake_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes), fake_moves++; }
static int device_collectives(Dist *d, int rank, int W) {
    Backend fake;
    memset(&fake, 0, sizeof fake);
    fake.name = "fake", fake.act = fake.hp = DT_F32;
    fake.mem_capacity = fake_capacity, fake.sync = fake_sync, fake.upload = fake_copy, fake.download = fake_copy;
    size_t n = 100003;  // not a multiple of the ranks
    float *x = (float *)mallocCheck(W * n * sizeof(float));
    int bad = 0;
    double g32 = (W - 1) * 0x1.0p-24 / (1 - (W - 1) * 0x1.0p-24);
    for (size_t i = 0; i < n; i++) x[i] = rval(rank, 7, i);
    dist_all_reduce_sum(d, &fake, x, n);
    for (size_t i = 0; i < n; i++) {
        double exact = 0, mag = 0;
        for (int r = 0; r < W; r++) exact += rval(r, 7, i), mag += fabs(rval(r, 7, i));
        if (fabs(x[i] - exact) > g32 * mag) bad |= 1;
    }
    for (size_t i = 0; i < W * n; i++) x[i] = rval(rank, 8, i);
    dist_reduce_scatter_sum(d, &fake, x, n);
    for (size_t i = 0; i < n; i++) {
        double exact = 0, mag = 0;
        for (int r = 0; r < W; r++) exact += rval(r, 8, rank * n + i), mag += fabs(rval(r, 8, rank * n + i));
        if (fabs(x[rank * n + i] - exact) > g32 * mag) bad |= 2;
    }
    for (size_t i = 0; i < n; i++) x[rank * n + i] = rval(rank, 9, i);
    dist_all_gather(d, &fake, x, n * sizeof(float));
    for (int r = 0; r < W; r++)
        for (size_t i = 0; i < n; i++)
            if (x[r * n + i] != rval(r, 9, i)) bad |= 4;
    for (size_t i = 0; i < n; i++) x[i] = rval(rank, 10, i);
    dist_broadcast(d, &fake, x, 3 * sizeof(float) + 1, W - 1);  // 13 bytes: not whole values
    uint32_t last = 0, mine = 0, want = 0;
    float v = rval(W - 1, 10, 3), w = rval(rank, 10, 3);
    memcpy(&want, &v, 4), memcpy(&mine, &w, 4), memcpy(&last, &x[3], 4);
    for (int i = 0; i < 3; i++)
        if (x[i] != rval(W - 1, 10, i)) bad |= 8;
    if ((last & 0xff) != (want & 0xff) || (last >> 8) != (mine >> 8)) bad |= 16;  // byte 13 came, byte 14 on did not
    if (fake_moves != 8) bad |= 32;  // each collective: one download, one upload
    if (!strcmp(dist_transport(d, &fake), "nccl")) bad |= 64;
    free(x);
    if (bad) fprintf(stderr, "rank %d: failed checks mask %d (%ld moves)\n", rank, bad, fake_moves);
    return bad ? 1 : 0;
}

// FP8 delayed scaling on several ranks (Transformer Engine's reduce_amax): each rank sees its own rows
// of every tensor; once dist_reduce_amax has reduced the step's amaxes, every rank rolls the history one
// process seeing all the rows would, so its scales equal that process's bit for bit (the max is exact),
// through a NaN on one rank and an inf on another. Without the reduction the ranks' scales would part
// (checked: each rank's own amax differs from the whole batch's at some step).
static float amax_value(int step, int t, int q, int j) {
    if (step == 5 && t == 1 && q == 1 && j == 0) return NAN;
    if (step == 8 && t == 3 && q == 0 && j == 2) return INFINITY;
    return expf(4.0f * sinf(0.7f * step + 1.3f * t + 2.1f * q + 0.37f * j));
}
static int amax_ranks(Dist *d, int rank, int W) {
    enum { T = 4, STEPS = 12, ROWS = 5 };  // tensors, steps, rows a rank
    FP8Recipe r = fp8_recipe_default();
    r.history_len = 4;
    DelayedScale mine[T], one[T];
    for (int t = 0; t < T; t++) {
        delayed_init(&mine[t], &r, t == 2 ? FP8_E5M2 : FP8_E4M3);
        delayed_init(&one[t], &r, t == 2 ? FP8_E5M2 : FP8_E4M3);
    }
    int bad = 0, parted = 0;
    for (int step = 0; step < STEPS; step++) {
        float local[T], all[T];
        for (int t = 0; t < T; t++) {
            local[t] = all[t] = 0.0f;
            for (int q = 0; q < W; q++)
                for (int j = 0; j < ROWS; j++) {
                    float v = fabsf(amax_value(step, t, q, j));
                    if (q == rank) local[t] = isnan(v) || isnan(local[t]) ? NAN : fmaxf(local[t], v);
                    all[t] = isnan(v) || isnan(all[t]) ? NAN : fmaxf(all[t], v);
                }
            parted |= !(local[t] == all[t] || (isnan(local[t]) && isnan(all[t])));
        }
        dist_reduce_amax(d, local, T);
        for (int t = 0; t < T; t++) {
            delayed_record(&mine[t], local[t]);
            delayed_update(&mine[t]);
            delayed_record(&one[t], all[t]);
            delayed_update(&one[t]);
            if (mine[t].scale != one[t].scale || mine[t].scale_inv != one[t].scale_inv || mine[t].overflows != one[t].overflows) bad = 1;
        }
    }
    if (!parted) bad = 1;  // the case would test nothing
    for (int t = 0; t < T; t++) {
        if (one[t].overflows != (t == 1 || t == 3)) bad = 1;  // the NaN step and the inf step, once each
        delayed_free(&mine[t]);
        delayed_free(&one[t]);
    }
    return bad;
}

// fn on W ranks; every rank must exit 0
static void expect_ranks_pass(int W, RankFn fn, const char *what) {
    int code[8];
    run_ranks(W, fn, NULL, NULL, code, 120);
    for (int r = 0; r < W; r++) {
        const char *e = rank_err(r);
        ck_assert_msg(code[r] == 0, "%s, world %d rank %d: exit %d: %s", what, W, r, code[r], e);
    }
}

START_TEST(test_fp8_amax_over_ranks) {
    for (int W = 2; W <= 3; W++) expect_ranks_pass(W, amax_ranks, "the scales differ from one process's");
}
END_TEST

START_TEST(test_ring_collectives) {
    for (int W = 2; W <= 3; W++) {
        expect_ranks_pass(W, all_collectives, "host collectives");
        expect_ranks_pass(W, device_collectives, "backend-memory collectives");
    }
}
END_TEST

// ----------------------------------------------------------------------------
// failures: one line each, every rank stopped, in seconds

static int die_early(Dist *d, int rank, int W) {  // rank 1 dies (as a crash would: no goodbye)
    if (rank == 1) _exit(3);
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = rval(rank, 1, i);
    dist_all_reduce_sum_f32_host(d, x, 1000);
    return 0;  // not reached: the all-reduce dies
}
static int hang(Dist *d, int rank, int W) {  // rank 1 alive but 4 s late, FP8GRPO_DIST_TIMEOUT=1
    if (rank == 1) sleep(4);
    double x = 1;
    dist_all_reduce_sum_f64_host(d, &x, 1);
    return 0;
}
static int nothing(Dist *d, int rank, int W) { return 0; }

// rank r exited non-zero with one "error: " line on stderr that mentions substr
static void expect_rank_error(int r, const int *code, const char *substr) {
    const char *e = rank_err(r);
    ck_assert_msg(code[r] != 0, "rank %d exited 0", r);
    const char *line = strstr(e, "error: ");
    ck_assert_msg(line, "rank %d: no error line in '%s'", r, e);
    ck_assert_msg(strstr(line, substr), "rank %d: '%s' does not mention '%s'", r, line, substr);
    ck_assert_msg(!strchr(line, '\n') || !strchr(strchr(line, '\n') + 1, '\n') || !strstr(strchr(line, '\n') + 1, "error: "),
                  "rank %d: more than one error line: %s", r, e);
}

START_TEST(test_dead_rank_stops_all) {
    int code[8];
    // (the timeout far beyond the wait run_ranks allows: the EOF stops them, whatever the machine's load)
    run_ranks(3, die_early, NULL, "600", code, 240);
    ck_assert_int_eq(code[1], 3);
    expect_rank_error(0, code, "lost rank");
    expect_rank_error(2, code, "lost rank 1");
}
END_TEST

START_TEST(test_hung_rank_times_out) {
    int code[8];
    run_ranks(3, hang, NULL, "1", code, 240);
    expect_rank_error(2, code, "FP8GRPO_DIST_TIMEOUT");  // waits on rank 1 directly
    ck_assert_msg(code[0] != 0 && code[1] != 0, "every rank stops (exit %d, %d)", code[0], code[1]);
}
END_TEST

START_TEST(test_rendezvous_errors) {
    int code[8];
    run_ranks(2, nothing, (const int[]){1, 0}, "1", code, 30);  // rank 1 never starts
    expect_rank_error(0, code, "only 1 of 2 ranks");
    run_ranks(2, nothing, (const int[]){0, 1}, "1", code, 30);  // rank 0 never starts
    expect_rank_error(1, code, "cannot reach rank 0 at MASTER_ADDR:MASTER_PORT");
}
END_TEST

// ----------------------------------------------------------------------------
// dp: the batch on resume, ZeRO's shards

START_TEST(test_dp_resume_batch_and_shards) {
    char err[512];
    ck_assert_int_eq(dp_resume_batch_check(64, 32, 1, 2, 8, err, sizeof err), 0);
    ck_assert_int_eq(dp_resume_batch_check(64, 16, 1, 4, 8, err, sizeof err), 0);
    ck_assert_int_eq(dp_resume_batch_check(64, 32, 1, 4, 8, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "--per_device_train_batch_size 16"), "%s", err);
    ck_assert_int_eq(dp_resume_batch_check(64, 16, 1, 3, 8, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "3 ranks cannot split") && strstr(err, "divides 8 prompts"), "%s", err);
    ck_assert_int_eq(dp_resume_batch_check(16, 8, 1, 4, 8, err, sizeof err), -1);  // 4 ranks x 8: half a group each
    ck_assert_msg(strstr(err, "cannot split"), "%s", err);
    // SFT: examples, gradient accumulation
    ck_assert_int_eq(dp_resume_batch_check(32, 4, 2, 4, 0, err, sizeof err), 0);
    ck_assert_int_eq(dp_resume_batch_check(32, 4, 2, 2, 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "32 examples") && strstr(err, "--per_device_train_batch_size 8 (not 4) with the same --gradient_accumulation_steps"), "%s", err);
    ck_assert_int_eq(dp_resume_batch_check(32, 4, 2, 3, 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "3 ranks x gradient_accumulation_steps 2 cannot split"), "%s", err);
    // shards cover [0, n) once, in order: floor(n / W) each, the last one's tail under W more
    const size_t ns[] = {1, 7, 128, 1000003};
    for (int k = 0; k < 4; k++)
        for (int W = 1; W <= 5; W++) {
            size_t next = 0;
            for (int r = 0; r < W; r++) {
                DpShard s = dp_shard(ns[k], W, r);
                ck_assert_uint_eq(s.lo, next);
                ck_assert_uint_eq(s.shard, ns[k] / W);
                ck_assert_uint_eq(s.hi - s.lo, r < W - 1 ? s.shard : ns[k] - (W - 1) * s.shard);
                next = s.hi;
            }
            ck_assert_uint_eq(next, ns[k]);
        }
}
END_TEST

// ----------------------------------------------------------------------------
// train: ./train_grpo on several processes against one

static char run_dir[] = "/tmp/fp8grpo_dptrainXXXXXX";
// a short warm-up: the equality does not need a good model, only rewards that differ within groups,
// which groups of 4 sampled at temperature 1.3 give at every step (compare_metrics checks it), and
// with beta 0.04 from step 2 the KL term gives every completion token a gradient, so that every
// rank's rows add to every gradient element (with advantages alone, a group whose rewards are all
// equal adds exact zeros)
#define BASE "./train_grpo --device cpu --quiet --warmup_sft_steps 200 --eval_size 24 --eval_steps 2 --num_generations 4 --temperature 1.3 --beta 0.04"

static int sh(const char *cmd, char *err, size_t cap) {
    char full[20000], ef[1200];
    snprintf(ef, sizeof ef, "%s/stderr.txt", run_dir);
    snprintf(full, sizeof full, "%s >/dev/null 2>%s", cmd, ef);
    int rc = system(full);
    if (err) {
        char *t = read_file(ef, NULL);
        snprintf(err, cap, "%s", t);
        free(t);
    }
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static void train_setup(void) {
    static int done = 0;
    if (done) return;
    done = 1;
    ck_assert(mkdtemp(run_dir));
    use_cache_in(run_dir);  // the warm-up made here is the one every run below loads
    char cmd[4096], err[4096];
    snprintf(cmd, sizeof cmd, BASE " --max_steps 1 --output_dir %s/warm", run_dir);
    ck_assert_msg(sh(cmd, err, sizeof err) == 0, "warm-up failed: %s", err);
}

static void fresh(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", run_dir, name);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", out, out);
    ck_assert_int_eq(system(cmd), 0);
}

// the adapter's values (all tensors, in name order) of dir/checkpoint-N
static float *adapter(const char *dir, int step, size_t *n) {
    char p[2048];
    snprintf(p, sizeof p, "%s/checkpoint-%d/adapter_model.safetensors", dir, step);
    SafeTensors st;
    st_open(&st, p);
    size_t k = 0;
    for (int i = 0; i < st.n; i++) k += st.t[i].numel;
    float *v = (float *)mallocCheck(k * sizeof(float));
    k = 0;
    for (int i = 0; i < st.n; i++) {
        ck_assert_int_eq(st.t[i].dtype, DT_F32);
        memcpy(v + k, st.t[i].data, st.t[i].nbytes);
        k += st.t[i].numel;
    }
    st_close(&st);
    *n = k;
    return v;
}

// The tolerance. With --adam_epsilon 1 (and no clipping, no weight decay) the first AdamW step
// moves each parameter by lr g / (|g| + 1): linear in the gradient g to within |g| (|g| < 0.02
// here), so a gradient summed wrongly (halved, a rank's rows missing or counted twice: errors of
// 50% and more) shows in the adapter as it is, instead of being normalized away as Adam's usual
// epsilon does (lr sign(g) after one step, whatever the scale). The two runs compute every row's
// contribution t_i to a gradient element identically (each row's forward and backward is its own,
// and the rollouts are the same tokens: the metrics below check that); they differ only in the
// order of the fp32 additions: one process adds the N rows one after another, the ranks add their
// own rows and then the ranks' sums. Two orders of a sum of N terms differ by at most
// 2 gamma_N sum|t_i| (Higham, eq. 4.4), gamma_N ~ N u, u = 2^-24; N <= 24 sequences x 16 tokens =
// 384 rows: 4.6e-5 sum|t_i|. GRPO's advantages sum to zero in a group, so g is a difference of
// comparable terms: we allow sum|t_i| up to K = 32 times the largest |g| (a cancellation far beyond
// what these batches show): 1.5e-3 of the largest update a step, 2.9e-3 of |B| after two steps (B
// starts at zero). The difference measured is ~4e-7 of it; a bug is > 0.3.
#define DP_TOL_REL (2 * 384 * 0x1.0p-24 * 32 * 2)

static void compare_adapters(const char *a, const char *b, int step, double tol_rel, const char *what) {
    size_t na, nb;
    float *x = adapter(a, step, &na), *y = adapter(b, step, &nb);
    ck_assert_uint_eq(na, nb);
    double maxdiff = 0, maxv = 0;
    for (size_t i = 0; i < na; i++) {
        maxdiff = fmax(maxdiff, fabs((double)x[i] - y[i]));
        maxv = fmax(maxv, fabs((double)x[i]));
    }
    // |B| at its largest: the A's are their initial values plus updates, B's are updates only
    double maxb = 0;
    char p[2048];
    snprintf(p, sizeof p, "%s/checkpoint-%d/adapter_model.safetensors", a, step);
    SafeTensors st;
    st_open(&st, p);
    for (int i = 0; i < st.n; i++)
        if (strstr(st.t[i].name, "lora_B"))
            for (int64_t j = 0; j < st.t[i].numel; j++) maxb = fmax(maxb, fabs((double)((const float *)st.t[i].data)[j]));
    st_close(&st);
    ck_assert_msg(maxb > 0, "%s: the adapter did not move", what);
    fprintf(stderr, "%s: max |diff| %.3g = %.3g of max |B| %.3g (tolerance %.3g)\n", what, maxdiff, maxdiff / maxb, maxb, tol_rel);
    ck_assert_msg(maxdiff <= tol_rel * maxb, "%s: max |diff| %.3g > %.3g x max |B| %.3g", what, maxdiff, tol_rel, maxb);
    free(x), free(y);
}

// metrics lines of two runs: the keys that depend only on the sampled tokens equal exactly
static void compare_metrics(const char *a, const char *b) {
    char pa[2048], pb[2048];
    snprintf(pa, sizeof pa, "%s/metrics.jsonl", a);
    snprintf(pb, sizeof pb, "%s/metrics.jsonl", b);
    char *ma = read_file(pa, NULL), *mb = read_file(pb, NULL), *sa = NULL, *sb = NULL;
    int lines = 0;
    for (char *x = strtok_r(ma, "\n", &sa), *y = strtok_r(mb, "\n", &sb); x && y; x = strtok_r(NULL, "\n", &sa), y = strtok_r(NULL, "\n", &sb)) {
        cJSON *la = cJSON_Parse(x), *lb = cJSON_Parse(y);
        cJSON *gn = cJSON_GetObjectItemCaseSensitive(la, "grad_norm");  // every step has a gradient to compare
        ck_assert_msg(lines == 0 || (cJSON_IsNumber(gn) && gn->valuedouble > 0), "line %d: no gradient (all groups' rewards equal)", lines);
        const char *keys[] = {"step", "reward", "reward_std", "completions/mean_length", "completions/max_length",
                              "completions/clipped_ratio", "frac_reward_zero_std", "eval/accuracy"};
        for (int k = 0; k < 8; k++) {
            cJSON *u = cJSON_GetObjectItemCaseSensitive(la, keys[k]), *v = cJSON_GetObjectItemCaseSensitive(lb, keys[k]);
            ck_assert_msg((!u && !v) || (u && v && cJSON_Compare(u, v, 1)), "line %d: %s differs", lines, keys[k]);
        }
        cJSON_Delete(la), cJSON_Delete(lb);
        lines++;
    }
    ck_assert_int_ge(lines, 3);
    free(ma), free(mb);
}

START_TEST(test_data_parallel_equals_one_process) {
    train_setup();
    // every loss normalizer: dapo (the step's tokens), dr_grpo (B x Tc), grpo (per sequence, over B),
    // bnpo (the batch's active tokens), with batch-scaled rewards in one (the gathered rewards)
    const char *variants[] = {"--loss_type dapo", "--loss_type dr_grpo --scale_rewards batch", "--loss_type grpo",
                              "--loss_type bnpo --mask_truncated_completions"};
    for (int v = 0; v < 4; v++)
        for (int W = 2; W <= 3; W++) {
            if (W == 3 && v > 0) continue;  // three ranks once: the ring with an odd count
            char one[1200], many[1200], cmd[4096], err[4096], what[256];
            fresh("one", one, sizeof one);
            fresh("many", many, sizeof many);
            const char *F = "--max_steps 2 --adam_epsilon 1 --max_grad_norm 0 --micro_batch_size 4";
            snprintf(cmd, sizeof cmd, BASE " %s %s --per_device_train_batch_size %d --output_dir %s", F, variants[v], 8 * W, one);
            ck_assert_msg(sh(cmd, err, sizeof err) == 0, "%s", err);
            snprintf(cmd, sizeof cmd, BASE " %s %s --per_device_train_batch_size 8 --nproc_per_node %d --output_dir %s", F, variants[v], W,
                     many);
            ck_assert_msg(sh(cmd, err, sizeof err) == 0, "%s", err);
            snprintf(what, sizeof what, "%d ranks x 8 vs 1 x %d, %s", W, 8 * W, variants[v]);
            compare_adapters(one, many, 2, DP_TOL_REL, what);
            compare_metrics(one, many);
        }
}
END_TEST

// A rank killed at step 3 stops the other (one line, in seconds); --resume continues from
// checkpoint-2: at the same world size bit-exactly (the same arithmetic in the same order), on one
// process with the same global batch to the tolerance above; at a world size that does not split
// the batch, or with the wrong per-device batch, one line says what would.
START_TEST(test_killed_rank_and_resume) {
    train_setup();
    char straight[1200], killed[1200], single[1200], cmd[4096], err[4096];
    const char *F = "--max_steps 4 --save_steps 2 --adam_epsilon 1 --max_grad_norm 0 --per_device_train_batch_size 8";
    fresh("straight", straight, sizeof straight);
    snprintf(cmd, sizeof cmd, BASE " %s --nproc_per_node 2 --output_dir %s", F, straight);
    ck_assert_msg(sh(cmd, err, sizeof err) == 0, "%s", err);

    fresh("killed", killed, sizeof killed);
    // (stopped by the EOF, "lost rank", never by the timeout, whose message differs)
    snprintf(cmd, sizeof cmd, "FP8GRPO_TEST_KILL=1:3 FP8GRPO_DIST_TIMEOUT=1800 " BASE " %s --nproc_per_node 2 --output_dir %s", F, killed);
    int rc = sh(cmd, err, sizeof err);
    ck_assert_msg(rc != 0, "a run with a killed rank exited 0");
    ck_assert_msg(strstr(err, "error: rank 0 of 2: lost rank 1") && strstr(err, "--resume") && !strstr(err, "FP8GRPO_DIST_TIMEOUT"), "%s", err);
    char p[2048];
    snprintf(p, sizeof p, "%s/checkpoint-2/adapter_model.safetensors", killed);
    ck_assert(file_exists(p));
    snprintf(p, sizeof p, "%s/checkpoint-4", killed);
    ck_assert(!file_exists(p));

    snprintf(cmd, sizeof cmd, "cp -r %s %s/single", killed, run_dir);  // the same checkpoint for the one-process resume
    ck_assert_int_eq(system(cmd), 0);
    snprintf(single, sizeof single, "%s/single", run_dir);
    snprintf(cmd, sizeof cmd, BASE " %s --nproc_per_node 2 --resume --output_dir %s", F, killed);
    ck_assert_msg(sh(cmd, err, sizeof err) == 0, "%s", err);
    const char *files[] = {"checkpoint-4/adapter_model.safetensors", "checkpoint-4/optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        size_t na, nb;
        char pa[2048], pb[2048];
        snprintf(pa, sizeof pa, "%s/%s", straight, files[i]);
        snprintf(pb, sizeof pb, "%s/%s", killed, files[i]);
        char *x = read_file(pa, &na), *y = read_file(pb, &nb);
        ck_assert_msg(na == nb && !memcmp(x, y, na), "%s differs after the resume on 2 ranks", files[i]);
        free(x), free(y);
    }
    // one process: per_device 8 is the wrong batch (16 a step), 3 ranks cannot split 2 prompts
    snprintf(cmd, sizeof cmd, BASE " %s --resume --output_dir %s", F, single);
    ck_assert(sh(cmd, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "trained with 16 completions a step") && strstr(err, "--per_device_train_batch_size 16"), "%s", err);
    snprintf(cmd, sizeof cmd, BASE " %s --nproc_per_node 3 --resume --output_dir %s", F, single);
    ck_assert(sh(cmd, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "3 ranks cannot split it into whole groups") || strstr(err, "3 ranks cannot split"), "%s", err);
    snprintf(cmd, sizeof cmd, BASE " --max_steps 4 --save_steps 2 --adam_epsilon 1 --max_grad_norm 0 --per_device_train_batch_size 16 "
                              "--resume --output_dir %s", single);
    ck_assert_msg(sh(cmd, err, sizeof err) == 0, "%s", err);
    compare_adapters(straight, single, 4, DP_TOL_REL * 2, "resumed on 1 process vs 2 ranks");  // 4 steps: twice the 2 steps' bound
    compare_metrics(straight, single);
}
END_TEST

// ./train_sft on 2 ranks against one process with the same global batch (8 examples a step: 1 x 4
// x 2 accumulated, 2 x 2 x 2): every weight (the masters and moments sharded, the gradients
// reduce-scattered, the weights all-gathered) and a LoRA adapter (replicated). After one step AdamW's
// first moment is (1 - beta1) g exactly, so the checkpoints' adam_m compare the gradients themselves:
// as above, the runs differ only in the order of the fp32 additions over N <= 8 examples x 16 tokens
// = 128 rows, 2 gamma_N sum|t_i| <= 2 x 128 u x K max|g| with K = 32: 4.9e-4 of the largest. The
// masters moved by lr g / (|g| + 1) (adam_epsilon 1): within lr |dg| plus their own rounding (2 ulp).
// Then the 2-rank checkpoint (gathered whole by rank 0) resumes on one process, and its second
// step agrees with the 2-rank run's to twice the bound; the loss lines agree.
#define SFT_TOL_REL (2 * 128 * 0x1.0p-24 * 32)

static const STensor *opt_tensor(SafeTensors *st, const char *dir, int step, const char *name) {
    char p[2048];
    snprintf(p, sizeof p, "%s/checkpoint-%d/optimizer.safetensors", dir, step);
    st_open(st, p);
    const STensor *t = st_find(st, name);
    ck_assert_msg(t && t->dtype == DT_F32, "%s: no fp32 %s", p, name);
    return t;
}

// max |a - b| of the optimizer tensor name of two runs at step, and max |a|
static double opt_diff(const char *a, const char *b, int step, const char *name, double *maxa) {
    SafeTensors sa, sb;
    const STensor *x = opt_tensor(&sa, a, step, name), *y = opt_tensor(&sb, b, step, name);
    ck_assert_int_eq(x->numel, y->numel);
    double d = 0, m = 0;
    for (int64_t i = 0; i < x->numel; i++) {
        double u = ((const float *)x->data)[i], v = ((const float *)y->data)[i];
        d = fmax(d, fabs(u - v)), m = fmax(m, fabs(u));
    }
    st_close(&sa), st_close(&sb);
    *maxa = m;
    return d;
}

START_TEST(test_sft_sharded_equals_one_process) {
    train_setup();
    char data[1200], cmd[16384], err[4096];
    snprintf(data, sizeof data, "%s/sum.jsonl", run_dir);
    FILE *f = fopenCheck(data, "w");
    for (int i = 0; i < 48; i++) fprintf(f, "{\"prompt\": \"%d+%d=\", \"completion\": \"%d\"}\n", i % 13, i % 7, i % 13 + i % 7);
    fclose(f);
    const char *modes[3] = {"", " --use_peft", " --adam_moments bf16"};
    for (int peft = 0; peft < 3; peft++) {  // every weight, a LoRA adapter, every weight with bf16 moments
        char one[1200], two[1200], res[1200], F[3000];
        snprintf(one, sizeof one, "%s/sft-one-%d", run_dir, peft);
        snprintf(two, sizeof two, "%s/sft-two-%d", run_dir, peft);
        snprintf(res, sizeof res, "%s/sft-res-%d", run_dir, peft);
        char warm[1300];
        warm_cached(warm, sizeof warm);
        snprintf(F, sizeof F, "./train_sft --device cpu --quiet --max_steps 2 --save_steps 1 --logging_steps 1 --learning_rate 1e-3 "
                              "--adam_epsilon 1 --max_grad_norm 0 --model %s --data %s%s",
                 warm, data, modes[peft]);
        snprintf(cmd, sizeof cmd, "rm -rf %s %s %s && %s --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --output_dir %s",
                 one, two, res, F, one);
        ck_assert_msg(sh(cmd, err, sizeof err) == 0, "%s", err);
        snprintf(cmd, sizeof cmd, "%s --per_device_train_batch_size 2 --gradient_accumulation_steps 2 --nproc_per_node 2 --output_dir %s", F, two);
        ck_assert_msg(sh(cmd, err, sizeof err) == 0, "%s", err);
        double mmax, pmax, dm = opt_diff(one, two, 1, "adam_m", &mmax), dp = opt_diff(one, two, 1, "params", &pmax);
        // bf16 moments: each rank rounds its block with the whole array's bits (Bf16Moments.i0), so a
        // moment differs only where the fp32 sums' last bits put it across a rounding boundary: by one
        // bf16 step (2^-7 of the largest at most)
        double tm = peft == 2 ? 0x1.0p-7 : SFT_TOL_REL;
        fprintf(stderr, "SFT %s, 2 ranks vs 1, step 1: adam_m max |diff| %.3g = %.3g of %.3g (tolerance %.3g); params %.3g\n",
                peft == 1 ? "LoRA" : peft ? "every weight, bf16 moments" : "every weight", dm, dm / mmax, mmax, tm, dp);
        ck_assert_msg(mmax > 0 && dm <= tm * mmax, "adam_m differs by %g of %g", dm, mmax);
        if (peft < 2) ck_assert_msg(dp <= 1e-3 * SFT_TOL_REL * mmax / 0.1 + 2 * 0x1.0p-24 * pmax, "params differ by %g", dp);
        // the 2-rank checkpoint-1 on one process
        snprintf(cmd, sizeof cmd, "cp -r %s %s && rm -r %s/checkpoint-2 && %s --per_device_train_batch_size 4 --gradient_accumulation_steps 2 "
                                  "--resume --output_dir %s", two, res, res, F, res);
        ck_assert_msg(sh(cmd, err, sizeof err) == 0, "%s", err);
        dm = opt_diff(two, res, 2, "adam_m", &mmax);
        ck_assert_msg(dm <= 2 * tm * mmax, "resumed on 1 process: adam_m differs by %g of %g", dm, mmax);
        // and on 3 ranks the 8 examples (x 2 accumulated) do not split: one line says so
        snprintf(cmd, sizeof cmd, "%s --per_device_train_batch_size 1 --gradient_accumulation_steps 2 --nproc_per_node 3 --resume "
                                  "--output_dir %s", F, res);
        ck_assert(sh(cmd, err, sizeof err) != 0);
        ck_assert_msg(strstr(err, "3 ranks x gradient_accumulation_steps 2 cannot split"), "%s", err);
    }
}
END_TEST

// the program's own lines for a bad rank environment or launch
START_TEST(test_program_env_errors) {
    train_setup();
    char cmd[4096], err[4096];
    snprintf(cmd, sizeof cmd, "RANK=0 " BASE " --max_steps 1 --output_dir %s/bad", run_dir);
    ck_assert(sh(cmd, err, sizeof err) == 1);
    ck_assert_msg(strstr(err, "error: RANK is set but WORLD_SIZE is not") && !strchr(strchr(err, '\n') + 1, '\n'), "%s", err);
    snprintf(cmd, sizeof cmd, "RANK=0 WORLD_SIZE=2 " BASE " --nproc_per_node 2 --max_steps 1 --output_dir %s/bad", run_dir);
    ck_assert(sh(cmd, err, sizeof err) == 1);
    ck_assert_msg(strstr(err, "launch one way"), "%s", err);
    snprintf(cmd, sizeof cmd, BASE " --nproc_per_node 0 --max_steps 1 --output_dir %s/bad", run_dir);
    ck_assert(sh(cmd, err, sizeof err) == 1);
    ck_assert_msg(strstr(err, "--nproc_per_node"), "%s", err);
}
END_TEST

static Suite *dist_suite(void) {
    Suite *s = suite_create("dist");
    TCase *env = tcase_create("env");
    tcase_add_test(env, test_env_none_and_torchrun);
    tcase_add_test(env, test_env_slurm);
    tcase_add_test(env, test_env_errors);
    tcase_add_test(env, test_dp_resume_batch_and_shards);
    suite_add_tcase(s, env);
    TCase *ring = tcase_create("ring");
    tcase_set_timeout(ring, 300);
    tcase_add_test(ring, test_ring_collectives);
    tcase_add_test(ring, test_dead_rank_stops_all);
    tcase_add_test(ring, test_hung_rank_times_out);
    tcase_add_test(ring, test_rendezvous_errors);
    tcase_add_test(ring, test_fp8_amax_over_ranks);
    suite_add_tcase(s, ring);
    TCase *train = tcase_create("train");
    tcase_set_timeout(train, 900);
    tcase_add_test(train, test_program_env_errors);
    tcase_add_test(train, test_data_parallel_equals_one_process);
    tcase_add_test(train, test_killed_rank_and_resume);
    tcase_add_test(train, test_sft_sharded_equals_one_process);
    suite_add_tcase(s, train);
    return s;
}

int main(void) {
    setenv("CK_FORK", "no", 1);  // one process: the warm-up made by the first training test is reused
    return run_suite(dist_suite());
}
