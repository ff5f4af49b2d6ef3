// rollout.c: the rollout engine (see rollout.h): block tables with prefix sharing,
// one prefill per prompt, batched decode of all live sequences, per-sequence RNG.
#include "rollout.h"

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
    size_t blk = (size_t)kv->BS * kv->KVH * kv->HD * dtype_size(be->act), layer = blk * kv->NB;
    for (int l = 0; l < kv->L; l++) {
        be->copy((char *)kv->k + l * layer + dst * blk, (char *)kv->k + l * layer + src * blk, blk);
        be->copy((char *)kv->v + l * layer + dst * blk, (char *)kv->v + l * layer + src * blk, blk);
    }
}

void rollout_run(Model *m, const RolloutConfig *rc, int P, const int *const *prompts, const int *plens,
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

    // ---- block tables ----
    // Prompt p owns blocks for its plen tokens. With sharing, completion s of prompt p
    // points at the prompt's full blocks and owns the rest, the first of which starts
    // as a copy of the prompt's partial block. Without sharing, each sequence is its own
    // prompt (prefilled G times).
    int share = rc->share_prefix || G == 1;
    int Pp = share ? P : S;  // prompts actually prefilled
    int Tmax = 0, MB = 0;
    for (int p = 0; p < P; p++) {
        if (plens[p] < 1) die("rollout: empty prompt %d", p);
        if (plens[p] + rc->max_new > c->max_pos)
            die("rollout: prompt of %d tokens + max_completion_length %d exceeds max_position_embeddings %d", plens[p],
                rc->max_new, c->max_pos);
        if (plens[p] > Tmax) Tmax = plens[p];
        int mb = cdiv(plens[p] + rc->max_new, BS);
        if (mb > MB) MB = mb;
    }
    int *pblock0 = (int *)mallocCheck(Pp * sizeof(int));  // first block of each prefilled prompt
    int nb = 0;
    for (int q = 0; q < Pp; q++) {
        pblock0[q] = nb;
        nb += cdiv(plens[share ? q : q / G], BS);
    }
    int *table = (int *)mallocCheck((size_t)S * MB * sizeof(int));
    int *copy_src = (int *)mallocCheck(S * sizeof(int));  // block to copy into the sequence's first own block, or -1
    for (int s = 0; s < S; s++) {
        int p = s / G, q = share ? p : s, pl = plens[p];
        int full = share ? pl / BS : cdiv(pl, BS);  // blocks taken from the prompt as they are
        int need = cdiv(pl + rc->max_new, BS);
        for (int b = 0; b < MB; b++) table[(size_t)s * MB + b] = 0;
        for (int b = 0; b < full; b++) table[(size_t)s * MB + b] = pblock0[q] + b;
        copy_src[s] = (share && pl % BS) ? pblock0[q] + full : -1;
        for (int b = full; b < need; b++) table[(size_t)s * MB + b] = nb++;
    }
    KVCache kv;
    // the arena (when on) holds the cache at its top and the prefill's activations below it
    model_arena_reserve(m, kvcache_bytes(m, nb, BS) + model_acts_bytes(m, share ? P : S, Tmax, 1), "this rollout's KV cache and prefill");
    kvcache_alloc(&kv, m, nb, BS);
    out->kv_bytes = kv.bytes;

    // ---- prefill: the prompts, right-padded into (Pp, Tmax) ----
    double t0 = now_sec();
    int *ids = (int *)callocCheck((size_t)Pp * Tmax, sizeof(int)), *slots = (int *)mallocCheck((size_t)Pp * Tmax * sizeof(int));
    int *lens = (int *)mallocCheck(Pp * sizeof(int));
    for (int q = 0; q < Pp; q++) {
        int p = share ? q : q / G;
        lens[q] = plens[p];
        for (int t = 0; t < Tmax; t++) {
            ids[(size_t)q * Tmax + t] = t < plens[p] ? prompts[p][t] : 0;
            slots[(size_t)q * Tmax + t] = t < plens[p] ? (pblock0[q] + t / BS) * BS + t % BS : -1;
        }
    }
    size_t hp = dtype_size(be->hp);
    void *logits = be->alloc((size_t)S * V * hp);
    model_prefill(m, &kv, ids, lens, slots, Pp, Tmax, logits);
    // every completion starts from its prompt's last-position logits
    if (share && G > 1)
        for (int s = S - 1; s >= 0; s--)
            be->copy((char *)logits + (size_t)s * V * hp, (char *)logits + (size_t)(s / G) * V * hp, (size_t)V * hp);
    for (int s = 0; s < S; s++)
        if (copy_src[s] >= 0) kv_copy_block(be, &kv, copy_src[s], table[(size_t)s * MB + plens[s / G] / BS]);
    be->sync();
    out->prefill_s = now_sec() - t0;

    // ---- decode: sample, then feed the live sequences' tokens ----
    t0 = now_sec();
    int *act = (int *)mallocCheck(S * sizeof(int)), na = S;  // live sequences, in order
    for (int s = 0; s < S; s++) act[s] = s;
    uint64_t *rng = (uint64_t *)mallocCheck(S * sizeof(uint64_t));
    memcpy(rng, seeds, S * sizeof(uint64_t));
    void *tok_d = be->alloc(S * sizeof(int32_t)), *logp_d = be->alloc(S * hp), *rng_d = be->alloc(S * sizeof(uint64_t));
    int32_t *tok = (int32_t *)mallocCheck(S * sizeof(int32_t));
    void *lp_h = mallocCheck(S * hp);
    double *lp = (double *)mallocCheck(S * sizeof(double));
    int *pos = (int *)mallocCheck(S * sizeof(int)), *slot = (int *)mallocCheck(S * sizeof(int));
    int *tab = (int *)mallocCheck((size_t)S * MB * sizeof(int)), *feed = (int *)mallocCheck(S * sizeof(int));
    uint64_t *rng_a = (uint64_t *)mallocCheck(S * sizeof(uint64_t));
    for (int k = 0; na > 0; k++) {
        // sample token k of each live sequence from its logits row (row i = act[i])
        for (int i = 0; i < na; i++) rng_a[i] = rng[act[i]];
        be->upload(rng_d, rng_a, na * sizeof(uint64_t));
        be->sample((int32_t *)tok_d, logp_d, logits, (uint64_t *)rng_d, na, V, rc->temperature, rc->top_k, rc->top_p);
        be->download(tok, tok_d, na * sizeof(int32_t));
        be->download(lp_h, logp_d, na * hp);
        be->download(rng_a, rng_d, na * sizeof(uint64_t));
        convert_to_f64(lp, lp_h, be->hp, na);
        int nf = 0;
        for (int i = 0; i < na; i++) {
            int s = act[i];
            rng[s] = rng_a[i];
            out->ids[(size_t)s * rc->max_new + k] = tok[i];
            out->logp[(size_t)s * rc->max_new + k] = lp[i];
            out->len[s] = k + 1;
            int eos = 0;
            for (int e = 0; e < rc->n_eos; e++) eos |= tok[i] == rc->eos_ids[e];
            if (eos) continue;
            if (k + 1 == rc->max_new) {
                out->truncated[s] = 1;
                continue;
            }
            feed[nf] = tok[i];
            act[nf] = s;  // compact in place: nf <= i
            pos[nf] = plens[s / G] + k;
            int b = pos[nf] / BS;
            slot[nf] = table[(size_t)s * MB + b] * BS + pos[nf] % BS;
            memcpy(tab + (size_t)nf * MB, table + (size_t)s * MB, MB * sizeof(int));
            nf++;
        }
        na = nf;
        if (na == 0) break;
        model_decode(m, &kv, feed, pos, slot, tab, na, MB, logits);
        out->decode_steps++;
    }
    be->sync();
    out->decode_s = now_sec() - t0;

    be->free(logits);
    be->free(tok_d);
    be->free(logp_d);
    be->free(rng_d);
    kvcache_free_model(&kv, m);
    free(pblock0);
    free(table);
    free(copy_src);
    free(ids);
    free(slots);
    free(lens);
    free(act);
    free(rng);
    free(tok);
    free(lp_h);
    free(lp);
    free(pos);
    free(slot);
    free(tab);
    free(feed);
    free(rng_a);
}
