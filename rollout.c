// rollout.c: the rollout engine (see rollout.h): a pool of KV blocks with prefix sharing,
// one prefill per prompt, batched decode of all live sequences, per-sequence RNG, and
// prompts admitted as blocks come back when the pool cannot hold them all (continuous batching).
#include "rollout.h"

#include "lora.h"

static int cdiv(int a, int b) { return (a + b - 1) / b; }

void rollout_free(Rollout *r) {
    free(r->len);
    free(r->ids);
    free(r->logp);
    free(r->truncated);
    memset(r, 0, sizeof *r);
}

// copy one KV block (all layers, K and V) onto another: the copy-on-write of a
// prompt's partly filled last block, so each completion writes its own tokens after it
static void kv_copy_block(const Backend *be, KVCache *kv, int src, int dst) {
    size_t rows = (size_t)kv->BS * kv->KVH, blk = rows * kv->HD * kv->esize;  // a block's (slot, head) rows
    for (int l = 0; l < kv->L; l++) {
        void *kc, *vc;
        float *ks, *vs;
        kvcache_layer(kv, l, &kc, &vc, &ks, &vs);
        be->copy((char *)kc + dst * blk, (char *)kc + src * blk, blk);
        be->copy((char *)vc + dst * blk, (char *)vc + src * blk, blk);
        if (kv->fp8) {
            be->copy(ks + dst * rows, ks + src * rows, rows * sizeof(float));
            be->copy(vs + dst * rows, vs + src * rows, rows * sizeof(float));
        }
    }
}

// The blocks of one prompt's group. With sharing (the default) the prompt is prefilled once into
// blocks the G completions point at for its full blocks; each completion owns the rest, the first
// of which starts as a copy of the prompt's partly filled block (copy-on-write). Without sharing
// each completion prefills its own copy of the prompt.
typedef struct {
    int nq;          // prompts it prefills: 1 with sharing, G without
    int need;        // blocks it holds while any of its completions lives
    int live;        // completions not finished
    int *pblocks;    // the prompt blocks (returned when the last completion finishes)
    int npblocks;
} Group;

// everything a rollout keeps between admissions and decode steps
typedef struct {
    Model *m;
    LoRA *lo;              // the adapter sampled with, or NULL
    const RolloutConfig *rc;
    const int *const *prompts;
    const int *plens;
    int P, G, S, BS, MB, Tmax, share, V;
    Group *gr;
    int next_group;        // groups are admitted in order
    int max_q;             // prompts one admission prefills at most (what the prefill's activations were sized for)
    int *free_ids, nfree;  // the block pool: a stack of free block ids
    int *table;            // (S, MB) each sequence's blocks
    KVCache kv;
    void *logits;          // (S, V) hp: row i belongs to live sequence act[i]
    void *plogits;         // (prompts, V) hp: a prefill's last-position logits
    int *act, na;          // live sequences
    int *ids, *slots, *lens, *first;  // prefill staging: (prompts, Tmax), (prompts), prompt -> first sequence
} Run;

static int group_blocks(const Run *r, int p, int *full, int *own) {
    int pl = r->plens[p];
    *full = r->share ? pl / r->BS : cdiv(pl, r->BS);  // the prompt blocks a completion reads as they are
    *own = cdiv(pl + r->rc->max_new, r->BS) - *full;
    return (r->share ? cdiv(pl, r->BS) : r->G * *full) + r->G * *own;
}

// Admit the next groups whose blocks are free, prefill their prompts together, and append their
// completions to the live sequences with their first logits rows. Returns the groups admitted.
static int admit(Run *r) {
    const Backend *be = r->m->be;
    size_t hp = dtype_size(be->hp), row = (size_t)r->V * hp;
    int nq = 0, g0 = r->next_group, T = 0;
    while (r->next_group < r->P && r->gr[r->next_group].need <= r->nfree && nq + r->gr[r->next_group].nq <= r->max_q) {
        int p = r->next_group++, pl = r->plens[p], full, own;
        group_blocks(r, p, &full, &own);
        Group *g = &r->gr[p];
        g->live = r->G;
        g->npblocks = 0;
        for (int q = 0; q < g->nq; q++) {
            int b0 = g->npblocks;
            for (int b = 0; b < cdiv(pl, r->BS); b++) g->pblocks[g->npblocks++] = r->free_ids[--r->nfree];
            r->lens[nq] = pl;
            r->first[nq] = p * r->G + (r->share ? 0 : q);
            for (int t = 0; t < r->Tmax; t++)
                r->slots[(size_t)nq * r->Tmax + t] = t < pl ? g->pblocks[b0 + t / r->BS] * r->BS + t % r->BS : -1;
            nq++;
        }
        for (int j = 0; j < r->G; j++) {
            int s = p * r->G + j, q0 = r->share ? 0 : j * cdiv(pl, r->BS);
            for (int b = 0; b < full; b++) r->table[(size_t)s * r->MB + b] = g->pblocks[q0 + b];
            for (int b = full; b < full + own; b++) r->table[(size_t)s * r->MB + b] = r->free_ids[--r->nfree];
        }
        if (pl > T) T = pl;
    }
    if (!nq) return 0;
    // the prompts, right-padded into (nq, T)
    for (int q = 0; q < nq; q++) {
        const int *pr = r->prompts[r->first[q] / r->G];
        for (int t = 0; t < T; t++) {
            r->ids[(size_t)q * T + t] = t < r->lens[q] ? pr[t] : 0;
            r->slots[(size_t)q * T + t] = r->slots[(size_t)q * r->Tmax + t];  // (in place: q * T <= q * Tmax)
        }
    }
    model_prefill(r->m, r->lo, &r->kv, r->ids, r->lens, r->slots, nq, T, r->plogits);
    // each completion starts from its prompt's logits; with sharing it copies the partial block
    for (int q = 0; q < nq; q++)
        for (int j = 0; j < (r->share ? r->G : 1); j++) {
            int s = r->first[q] + j, pl = r->plens[s / r->G];
            r->act[r->na] = s;
            be->copy((char *)r->logits + (size_t)r->na * row, (char *)r->plogits + (size_t)q * row, row);
            r->na++;
            if (r->share && pl % r->BS)  // the prompt's partial block -> the completion's first own block
                kv_copy_block(be, &r->kv, r->gr[s / r->G].pblocks[pl / r->BS], r->table[(size_t)s * r->MB + pl / r->BS]);
        }
    return r->next_group - g0;
}

// The ids a text model must never produce: a multimodal Gemma 3's image, begin- and end-of-image tokens
// (Config.mm_ids), whose rows the published embedding table holds. They are masked out of the logits before the
// sampler: -inf in their columns, written from a column of S -inf values (never_column; NULL: nothing to mask).
// The rollout's distribution and logprobs are then those over the text ids, which differ from the trainer's
// softmax over the whole vocabulary by log(1 - p(image ids)): the importance-sampling ratio sees the
// distribution that was sampled.
static void *never_column(const Model *m, int S) {
    if (!m->cfg.n_mm_ids) return NULL;
    const Backend *be = m->be;
    float *h = (float *)mallocCheck(S * sizeof(float));
    for (int i = 0; i < S; i++) h[i] = -INFINITY;
    void *d = be->alloc((size_t)S * dtype_size(be->hp));
    be->upload_convert(d, be->hp, h, DT_F32, S);
    free(h);
    return d;
}
static void mask_never(const Model *m, void *logits, int rows, const void *never) {
    size_t hp = dtype_size(m->be->hp);
    for (int i = 0; never && i < m->cfg.n_mm_ids; i++)
        m->be->copy_2d((char *)logits + (size_t)m->cfg.mm_ids[i] * hp, (size_t)m->cfg.V * hp, never, hp, hp, rows);
}

void rollout_run(Model *m, LoRA *lo, const RolloutConfig *rc, int P, const int *const *prompts, const int *plens,
                 const uint64_t *seeds, Rollout *out) {
    const Backend *be = m->be;
    const Config *c = &m->cfg;
    int G = rc->G, S = P * G, BS = rc->block_size > 0 ? rc->block_size : 16, V = c->V;
    if (G < 1 || P < 1) die("rollout: need at least one prompt and one generation");
    if (rc->max_new < 1) die("rollout: max_completion_length must be >= 1");
    memset(out, 0, sizeof *out);
    out->S = S;
    out->max_new = rc->max_new;
    out->len = (int *)callocCheck(S, sizeof(int));
    out->ids = (int *)callocCheck((size_t)S * rc->max_new, sizeof(int));
    out->logp = (double *)callocCheck((size_t)S * rc->max_new, sizeof(double));
    out->truncated = (unsigned char *)callocCheck(S, 1);

    Run r;
    memset(&r, 0, sizeof r);
    r.m = m, r.lo = lo, r.rc = rc, r.prompts = prompts, r.plens = plens, r.P = P, r.G = G, r.S = S, r.BS = BS, r.V = V;
    r.share = rc->share_prefix || G == 1;
    for (int p = 0; p < P; p++) {
        if (plens[p] < 1) die("rollout: empty prompt %d", p);
        if (plens[p] + rc->max_new > c->max_pos)
            die("rollout: prompt of %d tokens + max_completion_length %d exceeds max_position_embeddings %d", plens[p],
                rc->max_new, c->max_pos);
        if (plens[p] > r.Tmax) r.Tmax = plens[p];
        int mb = cdiv(plens[p] + rc->max_new, BS);
        if (mb > r.MB) r.MB = mb;
    }
    int nprompts = r.share ? P : S;
    r.gr = (Group *)callocCheck(P, sizeof(Group));
    long total = 0;
    int most = 0;
    for (int p = 0; p < P; p++) {
        int full, own;
        r.gr[p].need = group_blocks(&r, p, &full, &own);
        r.gr[p].nq = r.share ? 1 : G;
        r.gr[p].pblocks = (int *)mallocCheck((size_t)r.gr[p].nq * cdiv(plens[p], BS) * sizeof(int));
        total += r.gr[p].need;
        if (r.gr[p].need > most) most = r.gr[p].need;
    }
    // The pool: every group's blocks at once, or, when the arena (--gpu_memory_utilization) holds
    // fewer, what it holds beside the prefill: groups then wait and are admitted as earlier
    // completions finish and return their blocks (continuous batching).
    // A pool that cannot hold every group prefills one group at a time (the later ones at the next
    // decode steps), so that the prefill's activations take one group's room, not every prompt's.
    int NB = (int)total;
    r.max_q = nprompts;
    size_t blk = kvcache_bytes(m, 1, BS), acts = model_acts_bytes(m, nprompts, r.Tmax, ACTS_FORWARD_ONLY);
    if (m->arena.cap && kvcache_bytes(m, NB, BS) + acts > m->arena.cap) {
        r.max_q = r.share ? 1 : G;
        acts = model_acts_bytes(m, r.max_q, r.Tmax, ACTS_FORWARD_ONLY);
        size_t room = m->arena.cap > acts ? m->arena.cap - acts : 0;
        NB = room / blk < (size_t)total ? (int)(room / blk) : (int)total;
        if (NB < most)
            die("rollout: one prompt's %d completions need %.1f MiB of KV cache, but the arena leaves %.1f MiB beside the "
                "prefill: raise --gpu_memory_utilization or lower --max_completion_length / --num_generations",
                G, most * blk / 1048576.0, room / 1048576.0);
    }
    model_arena_reserve(m, kvcache_bytes(m, NB, BS) + acts, "this rollout's KV cache and prefill");
    kvcache_alloc(&r.kv, m, NB, BS);
    out->kv_bytes = r.kv.bytes;
    r.free_ids = (int *)mallocCheck(NB * sizeof(int));
    for (int b = NB - 1; b >= 0; b--) r.free_ids[r.nfree++] = b;  // taken in ascending order
    size_t hp = dtype_size(be->hp);
    r.logits = be->alloc((size_t)S * V * hp);
    r.plogits = be->alloc((size_t)nprompts * V * hp);
    r.table = (int *)callocCheck((size_t)S * r.MB, sizeof(int));
    r.act = (int *)mallocCheck(S * sizeof(int));
    r.ids = (int *)mallocCheck((size_t)nprompts * r.Tmax * sizeof(int));
    r.slots = (int *)mallocCheck((size_t)nprompts * r.Tmax * sizeof(int));
    r.lens = (int *)mallocCheck(nprompts * sizeof(int));
    r.first = (int *)mallocCheck(nprompts * sizeof(int));

    // the adapters' act copies for the decode step (the masters are fixed during a rollout)
    if (lo) lora_sync_act(lo);
    double t0 = now_sec();
    admit(&r);
    be->sync();
    out->prefill_s = now_sec() - t0;

    // ---- decode: sample, then feed the live sequences' tokens ----
    t0 = now_sec();
    uint64_t *rng = (uint64_t *)mallocCheck(S * sizeof(uint64_t));
    memcpy(rng, seeds, S * sizeof(uint64_t));
    // the sampler's outputs back to back (rng (S) u64, tokens (S) i32, logp (S) hp), so a step reads
    // them back with one download; the host copy has the same layout
    size_t out_bytes = (size_t)S * (sizeof(uint64_t) + sizeof(int32_t) + hp);
    void *samp_d = be->alloc(out_bytes);
    void *never = never_column(m, S);
    void *rng_d = samp_d, *tok_d = (char *)samp_d + (size_t)S * sizeof(uint64_t), *logp_d = (char *)tok_d + (size_t)S * sizeof(int32_t);
    char *samp_h = (char *)mallocCheck(out_bytes);
    uint64_t *rng_a = (uint64_t *)samp_h;
    int32_t *tok = (int32_t *)(samp_h + (size_t)S * sizeof(uint64_t));
    void *lp_h = (char *)tok + (size_t)S * sizeof(int32_t);
    double *lp = (double *)mallocCheck(S * sizeof(double));
    int *pos = (int *)mallocCheck(S * sizeof(int)), *slot = (int *)mallocCheck(S * sizeof(int));
    int *tab = (int *)mallocCheck((size_t)S * r.MB * sizeof(int)), *feed = (int *)mallocCheck(S * sizeof(int));
    while (r.na > 0) {
        int na = r.na, *act = r.act;
        // the next token of each live sequence from its logits row (row i = act[i])
        for (int i = 0; i < na; i++) rng_a[i] = rng[act[i]];
        be->upload(rng_d, rng_a, na * sizeof(uint64_t));
        mask_never(m, r.logits, na, never);
        be->sample((int32_t *)tok_d, logp_d, r.logits, (uint64_t *)rng_d, na, V, rc->temperature, rc->top_k, rc->top_p);
        be->download(samp_h, samp_d, out_bytes);  // (S rows; the first na of each array are this step's)
        convert_to_f64(lp, lp_h, be->hp, na);
        int nf = 0;
        for (int i = 0; i < na; i++) {
            int s = act[i], k = out->len[s], p = s / G;
            rng[s] = rng_a[i];
            out->ids[(size_t)s * rc->max_new + k] = tok[i];
            out->logp[(size_t)s * rc->max_new + k] = lp[i];
            out->len[s] = k + 1;
            int eos = 0;
            for (int e = 0; e < rc->n_eos; e++) eos |= tok[i] == rc->eos_ids[e];
            if (eos || k + 1 == rc->max_new) {  // done: its own blocks go back, the prompt's with the group's last
                out->truncated[s] = !eos;
                int full, own;
                group_blocks(&r, p, &full, &own);
                for (int b = full; b < full + own; b++) r.free_ids[r.nfree++] = r.table[(size_t)s * r.MB + b];
                if (--r.gr[p].live == 0)
                    for (int b = 0; b < r.gr[p].npblocks; b++) r.free_ids[r.nfree++] = r.gr[p].pblocks[b];
                continue;
            }
            feed[nf] = tok[i];
            act[nf] = s;  // compact in place: nf <= i
            pos[nf] = plens[p] + k;
            slot[nf] = r.table[(size_t)s * r.MB + pos[nf] / BS] * BS + pos[nf] % BS;
            memcpy(tab + (size_t)nf * r.MB, r.table + (size_t)s * r.MB, r.MB * sizeof(int));
            nf++;
        }
        r.na = nf;
        if (nf > 0) {
            model_decode(m, lo, &r.kv, feed, pos, slot, tab, nf, r.MB, r.logits);
            out->decode_steps++;
        }
        if (r.next_group < P && r.gr[r.next_group].need <= r.nfree) {  // waiting prompts that fit now
            double ta = now_sec();
            admit(&r);  // their rows go after the decoded ones
            be->sync();
            double dt = now_sec() - ta;
            out->prefill_s += dt;
            t0 += dt;
            out->admissions++;
        }
    }
    be->sync();
    out->decode_s = now_sec() - t0;

    if (lo) lora_release_act(lo);
    be->free(r.logits);
    be->free(r.plogits);
    be->free(samp_d);
    if (never) be->free(never);
    kvcache_free_model(&r.kv, m);
    for (int p = 0; p < P; p++) free(r.gr[p].pblocks);
    free(r.gr);
    free(r.free_ids);
    free(r.table);
    free(r.act);
    free(r.ids);
    free(r.slots);
    free(r.lens);
    free(r.first);
    free(rng);
    free(samp_h);
    free(lp);
    free(pos);
    free(slot);
    free(tab);
    free(feed);
}
