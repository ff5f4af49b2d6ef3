// dist.c: the processes of a run, and the CPU collectives between them (dist.h says the model):
// the environment torchrun and Slurm set, the --nproc_per_node launcher, the rendezvous through rank
// 0, the ring of TCP connections and the collectives on it; the backend-memory collectives choose
// NCCL (dist_cuda.cu) or the ring.
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dist/dist.h"

// ----------------------------------------------------------------------------
// the environment

// a whole decimal number in [lo, hi], or -1 (with the message) when the variable holds anything else
static int env_int(DistGetenv get, const char *name, long lo, long hi, long dflt, long *out, char *err, size_t cap) {
    const char *v = get(name);
    if (!v) return *out = dflt, 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi)
        return error_msg(err, cap, "%s='%.40s' is not a whole number in [%ld, %ld]: set it as torchrun or srun would, or unset it",
                         name, v, lo, hi);
    *out = x;
    return 0;
}

int dist_slurm_first_host(const char *list, char *out, size_t cap) {
    // "a[07-09,12],b" -> "a07": the name up to '[' or ',', then the first number of the bracket as
    // written (zero padding kept)
    size_t n = 0;
    const char *p = list;
    while (*p && *p != ',' && *p != '[' && n + 1 < cap) out[n++] = *p++;
    if (*p == '[') {
        p++;
        while (isdigit((unsigned char)*p) && n + 1 < cap) out[n++] = *p++;
        if (*p != '-' && *p != ',' && *p != ']') return -1;
    }
    out[n] = 0;
    return n > 0 ? 0 : -1;
}

int dist_env_parse(DistGetenv get, DistEnv *e, char *err, size_t cap) {
    memset(e, 0, sizeof *e);
    long rank = 0, world = 1, lrank = 0, lworld = 1, port = 29500, t = 1800;
    if (env_int(get, "FP8GRPO_DIST_TIMEOUT", 1, 7 * 86400, 1800, &t, err, cap)) return -1;
    e->timeout = (double)t;
    const char *addr = get("MASTER_ADDR");
    if (get("RANK") || get("WORLD_SIZE")) {
        e->source = get("FP8GRPO_LAUNCHED") ? "--nproc_per_node" : "torchrun";
        if (!get("RANK") || !get("WORLD_SIZE"))
            return error_msg(err, cap, "%s is set but %s is not: a launcher sets both (torchrun, or --nproc_per_node N)",
                             get("RANK") ? "RANK" : "WORLD_SIZE", get("RANK") ? "WORLD_SIZE" : "RANK");
        if (env_int(get, "WORLD_SIZE", 1, 65536, 1, &world, err, cap)) return -1;
        if (env_int(get, "RANK", 0, 65535, 0, &rank, err, cap)) return -1;
        if (rank >= world)
            return error_msg(err, cap, "RANK=%ld but WORLD_SIZE=%ld: RANK must be below WORLD_SIZE (ranks are 0..%ld)", rank, world,
                             world - 1);
        if (env_int(get, "LOCAL_WORLD_SIZE", 1, world, world, &lworld, err, cap)) return -1;
        if (env_int(get, "LOCAL_RANK", 0, lworld - 1, rank % lworld, &lrank, err, cap)) return -1;
        if (!addr && lworld < world)
            return error_msg(err, cap, "MASTER_ADDR is not set and the %ld ranks span several machines (LOCAL_WORLD_SIZE=%ld): set it "
                                       "to rank 0's host", world, lworld);
    } else if (get("SLURM_PROCID")) {
        e->source = "slurm";
        const char *ntasks = get("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
        if (!get(ntasks)) return error_msg(err, cap, "SLURM_PROCID is set but SLURM_NTASKS is not: start the ranks with srun");
        if (env_int(get, ntasks, 1, 65536, 1, &world, err, cap)) return -1;
        if (env_int(get, "SLURM_PROCID", 0, world - 1, 0, &rank, err, cap)) return -1;
        if (env_int(get, "SLURM_LOCALID", 0, world - 1, 0, &lrank, err, cap)) return -1;
        // "4" when every node runs the same number of tasks; "4(x2),3" otherwise: then the local world
        // is not one number, and only its use (the GPU choice: local_rank) matters
        const char *tpn = get("SLURM_STEP_TASKS_PER_NODE") ? get("SLURM_STEP_TASKS_PER_NODE") : get("SLURM_TASKS_PER_NODE");
        char *end;
        lworld = tpn ? strtol(tpn, &end, 10) : world;
        if (!tpn || lworld < 1 || lworld > world) lworld = world;
        if (lrank >= lworld) lworld = lrank + 1;
        long job = 0;
        if (env_int(get, "SLURM_JOB_ID", 0, LONG_MAX, 0, &job, err, cap)) return -1;
        port = 20000 + job % 20000;
        static char first[256];  // the default MASTER_ADDR: task 0's node, the step's first
        const char *nodes = get("SLURM_STEP_NODELIST") ? get("SLURM_STEP_NODELIST") : get("SLURM_JOB_NODELIST");
        if (!addr && world > 1) {
            if (!nodes || dist_slurm_first_host(nodes, first, sizeof first))
                return error_msg(err, cap, "MASTER_ADDR is not set and SLURM_STEP_NODELIST ('%.60s') gives no first node: set "
                                           "MASTER_ADDR to task 0's host", nodes ? nodes : "");
            addr = first;
        }
    } else e->source = "none";
    if (env_int(get, "MASTER_PORT", 1, 65535, port, &port, err, cap)) return -1;
    snprintf(e->addr, sizeof e->addr, "%s", addr ? addr : "127.0.0.1");
    long mfd = -1;
    if (env_int(get, "FP8GRPO_MASTER_FD", 0, INT_MAX, -1, &mfd, err, cap)) return -1;
    e->rank = (int)rank, e->world = (int)world, e->local_rank = (int)lrank, e->local_world = (int)lworld, e->port = (int)port;
    e->master_fd = (int)mfd;
    return 0;
}

// ----------------------------------------------------------------------------
// --nproc_per_node

static int nproc_arg(int argc, char **argv, long *n) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (strncmp(a, "--nproc", 7) || (a[7] != '_' && a[7] != '-') || strncmp(a + 8, "per", 3) || (a[11] != '_' && a[11] != '-') ||
            strncmp(a + 12, "node", 4))
            continue;
        if (a[16] == '=') v = a + 17;
        else if (a[16] == 0 && i + 1 < argc) v = argv[i + 1];
        else if (a[16] == 0) die("--nproc_per_node needs a value: the number of processes (GPUs) on this machine");
        else continue;
        char *end;
        *n = strtol(v, &end, 10);
        if (!*v || *end || *n < 1 || *n > 1024) die("--nproc_per_node: '%.40s' is not a number of processes in [1, 1024]", v);
        return 1;
    }
    return 0;
}

static int listen_on(int port, int *bound_port);

void dist_launch(int argc, char **argv) {
    long n;
    if (!nproc_arg(argc, argv, &n) || getenv("FP8GRPO_LAUNCHED")) return;  // a started child: train
    if (getenv("RANK") || getenv("WORLD_SIZE"))
        die("--nproc_per_node with RANK/WORLD_SIZE already set: launch one way (torchrun or --nproc_per_node), not both");
    // MASTER_PORT: the user's, or one the kernel picks, held listening from here and handed to rank 0
    // alone (FP8GRPO_MASTER_FD), so that nothing else (another run, a rank's own ring socket) can take it
    // between its choice and rank 0's start
    char port[16], buf[16];
    int lfd = -1, lport = 0;
    if (!getenv("MASTER_PORT")) {
        lfd = listen_on(0, &lport);
        if (lfd < 0) die("--nproc_per_node: cannot open a TCP port for rank 0 (%s): set MASTER_PORT", strerror(errno));
        snprintf(port, sizeof port, "%d", lport);
        setenv("MASTER_PORT", port, 1);
        snprintf(buf, sizeof buf, "%d", lfd);
        setenv("FP8GRPO_MASTER_FD", buf, 1);
    }
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("NCCL_NVLS_ENABLE", "0", 1);  // NVLink multicast (NVLS) stays off
    setenv("FP8GRPO_LAUNCHED", "1", 1);
    snprintf(buf, sizeof buf, "%ld", n);
    setenv("WORLD_SIZE", buf, 1);
    setenv("LOCAL_WORLD_SIZE", buf, 1);
    fflush(stdout), fflush(stderr);
    pid_t *pid = (pid_t *)mallocCheck(n * sizeof(pid_t));
    for (long r = 0; r < n; r++) {
        snprintf(buf, sizeof buf, "%ld", r);
        setenv("RANK", buf, 1);
        setenv("LOCAL_RANK", buf, 1);
        pid[r] = fork();
        if (pid[r] < 0) die("--nproc_per_node: fork failed (%s)", strerror(errno));
        if (pid[r] == 0) {
            execv("/proc/self/exe", argv);
            fprintf(stderr, "error: --nproc_per_node: cannot run %s (%s)\n", argv[0], strerror(errno));
            _exit(127);
        }
        if (r == 0 && lfd >= 0) {  // rank 0 has it; the other ranks neither inherit nor name it
            close(lfd);
            lfd = -1;
            unsetenv("FP8GRPO_MASTER_FD");
        }
    }
    // wait for all; the first failure decides the status. The others stop on their own when the ring
    // breaks; any still running a minute later (a hang the timeout has not caught yet) gets SIGTERM.
    int status = 0, left = (int)n;
    double t_fail = 0;
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, t_fail > 0 ? WNOHANG : 0);
        if (p < 0 && errno == EINTR) continue;
        if (p < 0) break;
        if (p == 0) {
            if (now_sec() - t_fail > 60)
                for (long r = 0; r < n; r++)
                    if (pid[r] > 0) kill(pid[r], SIGTERM);
            usleep(100000);
            continue;
        }
        left--;
        for (long r = 0; r < n; r++)
            if (pid[r] == p) pid[r] = 0;
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (code != 0 && status == 0) {
            status = code;
            t_fail = now_sec();
        }
    }
    free(pid);
    exit(status);
}

// ----------------------------------------------------------------------------
// the ring

struct Dist {
    int rank, world;
    int next, prev;       // sockets: to rank + 1, from rank - 1 (world > 1)
    double timeout;
    void *nccl;           // NCCL communicator, or NULL
    int nccl_tried;       // dist_nccl_init was called (once)
    char nccl_why[256];   // why there is none (said once)
    void *stage;          // host copy of device buffers for the ring (grown)
    size_t stage_cap;
    const Backend *nccl_be;  // the backend whose memory NCCL runs on, once it does
    void *dstage;         // device copy of host buffers for NCCL (grown; host_nccl)
    size_t dstage_cap;
};

// Once NCCL runs, the host collectives take it too, through a device copy: a step's control data
// (rewards, normalizers, metrics: bytes to kilobytes) would otherwise cross W - 1 hops of the TCP ring,
// some 0.1-1 ms each, a large part of a step that takes milliseconds. op as dist_nccl_run's; returns 0
// (nothing done) where NCCL is not running.
#define HOST_NCCL_MAX ((size_t)16 << 20)
static int host_nccl(Dist *d, void *x, size_t bytes, int op, size_t n, int root) {
    if (!d->nccl || !d->nccl_be || bytes > HOST_NCCL_MAX) return 0;
    const Backend *be = d->nccl_be;
    if (bytes > d->dstage_cap) {
        if (d->dstage) be->free(d->dstage);
        d->dstage = be->alloc(bytes);
        d->dstage_cap = bytes;
    }
    be->upload(d->dstage, x, bytes);
    be->sync();  // NCCL runs on a stream of its own
    dist_nccl_run(d, d->nccl, op, d->dstage, n, root);
    be->download(x, d->dstage, bytes);
    return 1;
}

int dist_rank(const Dist *d) { return d->rank; }
int dist_world(const Dist *d) { return d->world; }
double dist_timeout(const Dist *d) { return d->timeout; }

__attribute__((format(printf, 2, 3), noreturn)) static void dist_die(const Dist *d, const char *fmt, ...) {
    char msg[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    die("rank %d of %d: %s", d->rank, d->world, msg);
}

static void lost(const Dist *d, int to_next, const char *what) {
    int peer = to_next ? (d->rank + 1) % d->world : (d->rank + d->world - 1) % d->world;
    dist_die(d, "lost rank %d (%s): a rank died or stopped, so every rank stops; fix its error (above or in its log) and rerun "
                "with --resume to continue from the last checkpoint", peer, what);
}

// send sn bytes to next and receive rn bytes from prev at the same time: every rank sends before it
// receives, so blocking sends of more than the sockets buffer would wait for each other round the
// ring forever; poll() moves both a little at a time. The timeout counts seconds without progress.
static void sendrecv(Dist *d, const void *sbuf, size_t sn, void *rbuf, size_t rn) {
    size_t so = 0, ro = 0;
    double last = now_sec();
    while (so < sn || ro < rn) {
        struct pollfd p[2];
        int k = 0, is = -1, ir = -1;
        if (so < sn) is = k, p[k++] = (struct pollfd){d->next, POLLOUT, 0};
        if (ro < rn) ir = k, p[k++] = (struct pollfd){d->prev, POLLIN, 0};
        int rc = poll(p, k, 1000);
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) dist_die(d, "poll failed (%s)", strerror(errno));
        if (rc == 0) {
            if (now_sec() - last > d->timeout)
                dist_die(d, "no data from rank %d for %.0f s (FP8GRPO_DIST_TIMEOUT): a rank hangs or is far behind; every rank stops, "
                            "rerun with --resume", (d->rank + d->world - 1) % d->world, d->timeout);
            continue;
        }
        if (is >= 0 && p[is].revents) {
            ssize_t w = send(d->next, (const char *)sbuf + so, sn - so, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) lost(d, 1, strerror(errno));
            if (w > 0) so += (size_t)w, last = now_sec();
        }
        if (ir >= 0 && p[ir].revents) {
            ssize_t r = recv(d->prev, (char *)rbuf + ro, rn - ro, MSG_DONTWAIT);
            if (r == 0) lost(d, 0, "its connection closed");
            if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) lost(d, 0, strerror(errno));
            if (r > 0) ro += (size_t)r, last = now_sec();
        }
    }
}

int dist_peer_lost(Dist *d, char *msg, size_t cap) {
    if (d->world == 1) return 0;
    struct pollfd p[2] = {{d->prev, POLLIN, 0}, {d->next, POLLIN, 0}};
    if (poll(p, 2, 0) <= 0) return 0;
    for (int i = 0; i < 2; i++) {
        if (!p[i].revents) continue;
        char c;  // nothing is sent outside a collective: readable means EOF or an error
        ssize_t r = recv(p[i].fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r > 0) continue;
        int peer = i == 1 ? (d->rank + 1) % d->world : (d->rank + d->world - 1) % d->world;
        snprintf(msg, cap, "rank %d of %d: lost rank %d (%s): a rank died or stopped, so every rank stops; rerun with --resume",
                 d->rank, d->world, peer, r == 0 ? "its connection closed" : strerror(errno));
        return 1;
    }
    return 0;
}

// chunk c of n values split into w nearly equal parts: [*lo, *hi)
static void chunk(size_t n, int w, int c, size_t *lo, size_t *hi) {
    *lo = n * (size_t)c / (size_t)w;
    *hi = n * (size_t)(c + 1) / (size_t)w;
}

// Ring reduce-scatter over the world chunks of x (n values of size es each). Step s (0..W-2): send
// chunk (r-s-1) to next, receive chunk (r-s-2) from prev and add it to ours. A chunk starts at the
// rank just after its owner and gathers one rank's addend per step, so after W-1 steps rank r holds
// the whole sum of chunk r. add(dst, src, k) adds k values.
static void ring_reduce_scatter(Dist *d, void *x, size_t n, size_t es, void (*add)(void *, const void *, size_t)) {
    int W = d->world, r = d->rank;
    size_t lo, hi, maxc = n / W + 1;
    char *tmp = (char *)mallocCheck(maxc * es);
    for (int s = 0; s < W - 1; s++) {
        int cs = ((r - s - 1) % W + W) % W, cr = ((r - s - 2) % W + W) % W;
        size_t rlo, rhi;
        chunk(n, W, cs, &lo, &hi);
        chunk(n, W, cr, &rlo, &rhi);
        sendrecv(d, (char *)x + lo * es, (hi - lo) * es, tmp, (rhi - rlo) * es);
        add((char *)x + rlo * es, tmp, rhi - rlo);
    }
    free(tmp);
}

// Ring all-gather: rank r holds chunk r; step s sends chunk (r-s) and receives chunk (r-s-1) in place.
static void ring_all_gather(Dist *d, void *x, size_t n, size_t es) {
    int W = d->world, r = d->rank;
    for (int s = 0; s < W - 1; s++) {
        int cs = ((r - s) % W + W) % W, cr = ((r - s - 1) % W + W) % W;
        size_t lo, hi, rlo, rhi;
        chunk(n, W, cs, &lo, &hi);
        chunk(n, W, cr, &rlo, &rhi);
        sendrecv(d, (char *)x + lo * es, (hi - lo) * es, (char *)x + rlo * es, (rhi - rlo) * es);
    }
}

static void add_f32(void *dst, const void *src, size_t k) {
    float *a = (float *)dst;
    const float *b = (const float *)src;
    for (size_t i = 0; i < k; i++) a[i] += b[i];
}
static void add_f64(void *dst, const void *src, size_t k) {
    double *a = (double *)dst;
    const double *b = (const double *)src;
    for (size_t i = 0; i < k; i++) a[i] += b[i];
}
static void max_f64(void *dst, const void *src, size_t k) {
    double *a = (double *)dst;
    const double *b = (const double *)src;
    for (size_t i = 0; i < k; i++) a[i] = b[i] > a[i] || a[i] != a[i] ? b[i] : a[i];
}

// all-reduce = reduce-scatter (each rank ends with the sum of its chunk) + all-gather (each rank
// sends its chunk round): 2 (W-1) steps of n / W values
void dist_all_reduce_sum_f32_host(Dist *d, float *x, size_t n) {
    if (d->world == 1 || n == 0 || host_nccl(d, x, n * sizeof(float), 0, n, 0)) return;
    ring_reduce_scatter(d, x, n, sizeof(float), add_f32);
    ring_all_gather(d, x, n, sizeof(float));
}
void dist_all_reduce_sum_f64_host(Dist *d, double *x, size_t n) {
    if (d->world == 1 || n == 0 || host_nccl(d, x, n * sizeof(double), 4, n, 0)) return;
    ring_reduce_scatter(d, x, n, sizeof(double), add_f64);
    ring_all_gather(d, x, n, sizeof(double));
}
void dist_all_reduce_max_f64_host(Dist *d, double *x, size_t n) {
    if (d->world == 1 || n == 0 || host_nccl(d, x, n * sizeof(double), 5, n, 0)) return;
    ring_reduce_scatter(d, x, n, sizeof(double), max_f64);
    ring_all_gather(d, x, n, sizeof(double));
}
void dist_reduce_amax(Dist *d, float *amax, size_t n) {
    if (d->world == 1 || n == 0) return;
    double *x = (double *)mallocCheck(2 * n * sizeof(double));  // the amaxes (NaN as +inf), then NaN flags
    for (size_t i = 0; i < n; i++) x[i] = isnan(amax[i]) ? INFINITY : amax[i], x[n + i] = isnan(amax[i]);
    dist_all_reduce_max_f64_host(d, x, 2 * n);
    for (size_t i = 0; i < n; i++) amax[i] = x[n + i] > 0 ? NAN : (float)x[i];  // float -> double -> float: exact
    free(x);
}
void dist_reduce_scatter_sum_f32_host(Dist *d, float *x, size_t n) {
    if (d->world > 1 && n > 0 && !host_nccl(d, x, n * d->world * sizeof(float), 1, n, 0)) ring_reduce_scatter(d, x, n * d->world, sizeof(float), add_f32);
}
void dist_all_gather_host(Dist *d, void *x, size_t bytes) {
    if (d->world > 1 && bytes > 0 && !host_nccl(d, x, bytes * d->world, 2, bytes, 0)) ring_all_gather(d, x, bytes * d->world, 1);
}

// from root round the ring: each rank receives from prev and passes it on, unless next is root
void dist_broadcast_host(Dist *d, void *x, size_t bytes, int root) {
    if (d->world == 1 || bytes == 0 || host_nccl(d, x, bytes, 3, bytes, root)) return;
    if (d->rank != root) sendrecv(d, NULL, 0, x, bytes);
    if ((d->rank + 1) % d->world != root) sendrecv(d, x, bytes, NULL, 0);
}

void dist_barrier(Dist *d) {
    double one = 1;
    dist_all_reduce_sum_f64_host(d, &one, 1);
    if (d->world > 1 && one != d->world) dist_die(d, "barrier counted %g ranks, not %d: the ring is broken", one, d->world);
}

// ----------------------------------------------------------------------------
// the rendezvous

typedef struct {  // what a rank tells rank 0
    uint32_t magic, rank, world, port;
} Hello;
#define HELLO_MAGIC 0x46503847u  // "FP8G"

typedef struct {  // what rank 0 tells every rank about each: where its ring listener is
    char host[256];
    uint32_t port;
} Where;

// blocking I/O of exactly n bytes on fd during the rendezvous, with a deadline
static int io_all(int fd, void *buf, size_t n, int sending, double deadline) {
    size_t k = 0;
    while (k < n) {
        struct pollfd p = {fd, sending ? POLLOUT : POLLIN, 0};
        int ms = (int)((deadline - now_sec()) * 1000);
        if (ms <= 0) return -1;
        int rc = poll(&p, 1, ms);
        if (rc < 0 && errno == EINTR) continue;
        if (rc <= 0) return -1;
        ssize_t r = sending ? send(fd, (char *)buf + k, n - k, MSG_NOSIGNAL) : recv(fd, (char *)buf + k, n - k, 0);
        if (r <= 0) return -1;
        k += (size_t)r;
    }
    return 0;
}

static int listen_on(int port, int *bound_port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (fd < 0) return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY), .sin_port = htons((uint16_t)port)};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 1024) || getsockname(fd, (struct sockaddr *)&a, &len)) {
        close(fd);
        return -1;
    }
    if (bound_port) *bound_port = ntohs(a.sin_port);
    return fd;
}

static int accept_by(int lfd, double deadline, struct sockaddr_in *peer) {
    struct pollfd p = {lfd, POLLIN, 0};
    int ms = (int)((deadline - now_sec()) * 1000);
    if (ms <= 0 || poll(&p, 1, ms) <= 0) return -1;
    socklen_t len = sizeof *peer;
    return accept(lfd, (struct sockaddr *)peer, &len);
}

// The ring's listener, on a port the kernel picks but never MASTER_PORT: a rank started before rank 0 on
// rank 0's host (or rank 0 itself, before it listens there) could otherwise take the port rank 0 needs, and
// a rank's rendezvous would reach its own ring socket instead of rank 0.
static int ring_listener(int master_port, int *port) {
    int fd = listen_on(0, port);
    if (fd >= 0 && *port == master_port) {
        int again = listen_on(0, port);  // while fd holds MASTER_PORT the kernel picks another
        close(fd);
        fd = again;
    }
    return fd;
}

// whether a connected socket reached itself: with nothing listening on a local port, TCP may pick that
// same port as the connection's own end and "connect" (a simultaneous open with itself)
static int self_connected(int fd) {
    struct sockaddr_in a, b;
    socklen_t la = sizeof a, lb = sizeof b;
    return !getsockname(fd, (struct sockaddr *)&a, &la) && !getpeername(fd, (struct sockaddr *)&b, &lb) &&
           a.sin_port == b.sin_port && a.sin_addr.s_addr == b.sin_addr.s_addr;
}

// connect to host:port, trying again until the deadline (the other side may not listen yet)
static int connect_to(const char *host, int port, double deadline, char *why, size_t cap) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
        int g = getaddrinfo(host, ps, &hints, &res);
        if (g) snprintf(why, cap, "cannot resolve '%s' (%s)", host, gai_strerror(g));
        else {
            int fd = socket(AF_INET, SOCK_STREAM, 0), self = 0;
            if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 && !(self = self_connected(fd))) {
                freeaddrinfo(res);
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                return fd;
            }
            snprintf(why, cap, "%s:%d: %s", host, port, self ? "nothing listens there" : strerror(errno));
            if (fd >= 0) close(fd);
            freeaddrinfo(res);
        }
        if (now_sec() > deadline) return -1;
        usleep(100000);
    }
}

static void nonblocking(int fd) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Dist *dist_init(const DistEnv *e) {
    Dist *d = (Dist *)callocCheck(1, sizeof(Dist));
    d->rank = e->rank, d->world = e->world, d->timeout = e->timeout, d->next = d->prev = -1;
    // rank 0's inherited socket, if it is what it claims to be (a socket on MASTER_PORT; any other fd is
    // left alone): used by rank 0 of several, closed otherwise
    int mfd = -1;
    if (e->master_fd >= 0) {
        struct sockaddr_in a;
        socklen_t len = sizeof a;
        if (!getsockname(e->master_fd, (struct sockaddr *)&a, &len) && a.sin_family == AF_INET && ntohs(a.sin_port) == e->port) {
            if (d->rank == 0 && d->world > 1) mfd = e->master_fd;
            else close(e->master_fd);
        }
    }
    if (d->world == 1) return d;
    int W = d->world, ring_port = 0;
    double deadline = now_sec() + e->timeout;
    // every rank's ring listener first, so that every connect below finds it listening
    int ring = ring_listener(e->port, &ring_port);
    if (ring < 0) dist_die(d, "cannot open a TCP port for the ring (%s)", strerror(errno));
    Where *where = (Where *)callocCheck(W, sizeof(Where));
    char why[512] = "";
    if (d->rank == 0) {
        int lfd = mfd >= 0 ? mfd : listen_on(e->port, NULL);
        if (lfd < 0)
            dist_die(d, "cannot listen on MASTER_PORT %d (%s): another run may use it; set MASTER_PORT to a free port", e->port,
                     strerror(errno));
        int *fds = (int *)mallocCheck(W * sizeof(int));
        for (int i = 0; i < W; i++) fds[i] = -1;
        snprintf(where[0].host, sizeof where[0].host, "%s", e->addr);
        where[0].port = (uint32_t)ring_port;
        double said = now_sec();
        for (int got = 1; got < W;) {
            struct sockaddr_in peer;
            double step = now_sec() + 10 < deadline ? now_sec() + 10 : deadline;
            int fd = accept_by(lfd, step, &peer);
            if (fd < 0) {
                if (now_sec() >= deadline)
                    dist_die(d, "only %d of %d ranks reached MASTER_PORT %d within %.0f s: start every rank (same WORLD_SIZE, "
                                "MASTER_ADDR, MASTER_PORT)", got, W, e->port, e->timeout);
                if (now_sec() - said > 9) fprintf(stderr, "rank 0: waiting for %d more of %d ranks on port %d\n", W - got, W, e->port);
                said = now_sec();
                continue;
            }
            Hello h;
            if (io_all(fd, &h, sizeof h, 0, deadline) || h.magic != HELLO_MAGIC) {
                close(fd);  // not one of ours (a port scanner, another program): ignore it
                continue;
            }
            if (h.world != (uint32_t)W)
                dist_die(d, "rank %u says WORLD_SIZE %u, rank 0 has %d: start every rank with the same WORLD_SIZE", h.rank, h.world, W);
            if (h.rank == 0 || h.rank >= (uint32_t)W || fds[h.rank] >= 0)
                dist_die(d, "two processes say they are rank %u: give each rank its own RANK", h.rank);
            fds[h.rank] = fd;
            inet_ntop(AF_INET, &peer.sin_addr, where[h.rank].host, sizeof where[h.rank].host);
            where[h.rank].port = h.port;
            got++;
        }
        for (int r = 1; r < W; r++) {
            if (io_all(fds[r], where, W * sizeof(Where), 1, deadline)) dist_die(d, "rank %d left during the rendezvous", r);
            close(fds[r]);
        }
        free(fds);
        close(lfd);
    } else {
        int fd = connect_to(e->addr, e->port, deadline, why, sizeof why);
        if (fd < 0)
            dist_die(d, "cannot reach rank 0 at MASTER_ADDR:MASTER_PORT within %.0f s (%s): start rank 0, or set MASTER_ADDR/MASTER_PORT "
                        "to its host and port", e->timeout, why);
        Hello h = {HELLO_MAGIC, (uint32_t)d->rank, (uint32_t)W, (uint32_t)ring_port};
        if (io_all(fd, &h, sizeof h, 1, deadline) || io_all(fd, where, W * sizeof(Where), 0, deadline))
            dist_die(d, "rank 0 closed the rendezvous (see its error)");
        close(fd);
    }
    // the ring: connect to next, accept prev; then each says who it is, to catch a crossed wire
    int nx = (d->rank + 1) % W;
    d->next = connect_to(where[nx].host, (int)where[nx].port, deadline, why, sizeof why);
    if (d->next < 0) dist_die(d, "cannot connect to rank %d's ring port (%s)", nx, why);
    struct sockaddr_in peer;
    d->prev = accept_by(ring, deadline, &peer);
    if (d->prev < 0) dist_die(d, "rank %d did not connect within %.0f s", (d->rank + W - 1) % W, e->timeout);
    close(ring);
    nonblocking(d->next);
    nonblocking(d->prev);
    int me = d->rank, from = -1;
    sendrecv(d, &me, sizeof me, &from, sizeof from);
    if (from != (d->rank + W - 1) % W)
        dist_die(d, "the ring is miswired (rank %d connected where rank %d was expected)", from, (d->rank + W - 1) % W);
    free(where);
    dist_barrier(d);
    return d;
}

void dist_finalize(Dist *d) {
    if (!d) return;
    if (d->world > 1) {
        dist_barrier(d);
        close(d->next);
        close(d->prev);
    }
    if (d->dstage) d->nccl_be->free(d->dstage);
    if (d->nccl) dist_nccl_free(d->nccl);
    free(d->stage);
    free(d);
}

void dist_quiet_others(const Dist *d) {
    if (d->rank != 0 && !freopen("/dev/null", "w", stdout)) die("rank %d: cannot silence stdout", d->rank);
}

// ----------------------------------------------------------------------------
// backend memory: NCCL where it can, else through the host

// NCCL starts at the first collective on a GPU's memory (every rank reaches it at the same point)
static int use_nccl(Dist *d, const Backend *be) {
    if (d->world == 1 || strcmp(be->name, "cuda")) return 0;
    if (!d->nccl_tried) {
        d->nccl_tried = 1;
        d->nccl = dist_nccl_init(d, d->nccl_why, sizeof d->nccl_why);
        if (d->nccl) d->nccl_be = be;
        if (!d->nccl && d->rank == 0)
            fprintf(stderr, "note: no NCCL (%s): the GPUs' gradients go through the host and TCP (slow)\n", d->nccl_why);
    }
    return d->nccl != NULL;
}

const char *dist_transport(const Dist *d, const Backend *be) {
    if (d->world == 1) return "none (one process)";
    return use_nccl((Dist *)d, be) ? "nccl" : "tcp";
}

static void *stage(Dist *d, size_t bytes) {
    if (bytes > d->stage_cap) {
        d->stage = reallocCheck(d->stage, bytes);
        d->stage_cap = bytes;
    }
    return d->stage;
}

// the host path for a device buffer of `bytes`: down, the ring, up (the CPU backend's is the host's)
#define VIA_HOST(d, be, x, bytes, call)                          \
    do {                                                         \
        int dev_ = be->mem_capacity() > 0;                       \
        void *h_ = dev_ ? stage(d, bytes) : (x);                 \
        if (dev_) be->download(h_, x, bytes);                    \
        call;                                                    \
        if (dev_) be->upload(x, h_, bytes);                      \
    } while (0)

void dist_all_reduce_sum(Dist *d, const Backend *be, void *x, size_t n) {
    if (d->world == 1 || n == 0) return;
    be->sync();
    if (use_nccl(d, be)) dist_nccl_run(d, d->nccl, 0, x, n, 0);
    else VIA_HOST(d, be, x, n * sizeof(float), dist_all_reduce_sum_f32_host(d, (float *)h_, n));
}
void dist_reduce_sum(Dist *d, const Backend *be, void *x, size_t n, int root) {
    if (d->world == 1 || n == 0) return;
    be->sync();
    if (use_nccl(d, be)) dist_nccl_run(d, d->nccl, 6, x, n, root);
    else VIA_HOST(d, be, x, n * sizeof(float), dist_all_reduce_sum_f32_host(d, (float *)h_, n));  // (the ring: all get it)
}
void dist_reduce_scatter_sum(Dist *d, const Backend *be, void *x, size_t n) {
    if (d->world == 1 || n == 0) return;
    be->sync();
    if (use_nccl(d, be)) dist_nccl_run(d, d->nccl, 1, x, n, 0);
    else VIA_HOST(d, be, x, n * d->world * sizeof(float), dist_reduce_scatter_sum_f32_host(d, (float *)h_, n));
}
void dist_all_gather(Dist *d, const Backend *be, void *x, size_t bytes) {
    if (d->world == 1 || bytes == 0) return;
    be->sync();
    if (use_nccl(d, be)) dist_nccl_run(d, d->nccl, 2, x, bytes, 0);
    else VIA_HOST(d, be, x, bytes * d->world, dist_all_gather_host(d, h_, bytes));
}
void dist_broadcast(Dist *d, const Backend *be, void *x, size_t bytes, int root) {
    if (d->world == 1 || bytes == 0) return;
    be->sync();
    if (use_nccl(d, be)) dist_nccl_run(d, d->nccl, 3, x, bytes, root);
    else VIA_HOST(d, be, x, bytes, dist_broadcast_host(d, h_, bytes, root));
}
