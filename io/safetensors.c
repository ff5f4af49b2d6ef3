// safetensors.c: the safetensors reader (mmap + validation) and atomic writer.
// See safetensors.h for the format.
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

char *read_file(const char *path, size_t *n_out) {
    FILE *f = fopen(path, "rb");
    if (!f) die("%s: cannot open (%s)", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) die("%s: cannot seek", path);
    long n = ftell(f);
    if (n < 0) die("%s: cannot tell its size", path);
    rewind(f);
    char *buf = (char *)mallocCheck((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) die("%s: short read", path);
    fclose(f);
    buf[n] = 0;
    if (n_out) *n_out = (size_t)n;
    return buf;
}

struct cJSON *read_json_object(const char *path) {
    char *text = read_file(path, NULL);
    cJSON *r = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(r)) die("%s: not valid JSON", path);
    return r;
}

static int dtype_from_st(const char *s) {
    static const struct { const char *n; DType t; } tab[] = {
        {"F32", DT_F32}, {"F64", DT_F64}, {"BF16", DT_BF16}, {"F16", DT_F16}, {"F8_E4M3", DT_E4M3},
        {"F8_E5M2", DT_E5M2}, {"I32", DT_I32}, {"I64", DT_I64}, {"U8", DT_U8}, {"BOOL", DT_U8},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(s, tab[i].n)) return tab[i].t;
    return -1;
}

static int cmp_by_offset(const void *a, const void *b) {
    const STensor *x = *(const STensor *const *)a, *y = *(const STensor *const *)b;
    uintptr_t xo = (uintptr_t)x->data, yo = (uintptr_t)y->data;
    return xo < yo ? -1 : xo > yo;
}
static int cmp_by_name(const void *a, const void *b) {
    return strcmp(((const STensor *)a)->name, ((const STensor *)b)->name);
}

// map one file and append its tensors to st
static void st_add_file(SafeTensors *st, const char *path) {
    int fi = st->nfiles++;
    st->paths = (char **)reallocCheck(st->paths, st->nfiles * sizeof(char *));
    st->maps = (void **)reallocCheck(st->maps, st->nfiles * sizeof(void *));
    st->sizes = (size_t *)reallocCheck(st->sizes, st->nfiles * sizeof(size_t));
    st->paths[fi] = str_dup(path);
    st->maps[fi] = NULL;
    st->sizes[fi] = 0;

    int fd = open(path, O_RDONLY);
    if (fd < 0) die("%s: cannot open (%s)", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) die("%s: cannot stat", path);
    size_t size = (size_t)sb.st_size;
    if (size < 8) die("%s: truncated safetensors file (%zu bytes, less than the 8-byte header length)", path, size);
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) die("%s: mmap failed (%s)", path, strerror(errno));
    st->maps[fi] = map;
    st->sizes[fi] = size;

    uint64_t hlen;
    memcpy(&hlen, map, 8);
    if (hlen > size - 8) die("%s: header length %llu runs past the end of the file (%zu bytes): truncated or not a safetensors file",
                             path, (unsigned long long)hlen, size);
    if (hlen > (100u << 20)) die("%s: header of %llu bytes is implausibly large", path, (unsigned long long)hlen);
    char *json = (char *)mallocCheck(hlen + 1);
    memcpy(json, (char *)map + 8, hlen);
    json[hlen] = 0;
    cJSON *root = cJSON_Parse(json);
    free(json);
    if (!root || !cJSON_IsObject(root)) die("%s: header is not valid JSON", path);
    const char *data0 = (const char *)map + 8 + hlen;
    size_t data_size = size - 8 - hlen;

    int first = st->n, count = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, root) count += strcmp(e->string, "__metadata__") != 0;
    st->t = (STensor *)reallocCheck(st->t, (st->n + count) * sizeof(STensor));
    cJSON_ArrayForEach(e, root) {
        if (!strcmp(e->string, "__metadata__")) continue;
        const char *nm = e->string;
        cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
        cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2)
            die("%s: tensor %s: entry needs dtype, shape and data_offsets [begin, end]", path, nm);
        int dt = dtype_from_st(jd->valuestring);
        if (dt < 0) die("%s: tensor %s: unsupported dtype %s", path, nm, jd->valuestring);
        STensor *t = &st->t[st->n++];
        memset(t, 0, sizeof *t);
        t->name = str_dup(nm);
        t->dtype = (DType)dt;
        t->file = fi;
        t->ndim = cJSON_GetArraySize(js);
        if (t->ndim > ST_MAX_DIMS) die("%s: tensor %s: %d dims (at most %d)", path, nm, t->ndim, ST_MAX_DIMS);
        int zero = 0;
        for (int i = 0; i < t->ndim; i++) {
            cJSON *d = cJSON_GetArrayItem(js, i);
            if (!cJSON_IsNumber(d) || !(d->valuedouble >= 0 && d->valuedouble <= 1e12) || d->valuedouble != floor(d->valuedouble))
                die("%s: tensor %s: bad shape (dimension %d is not an integer in [0, 1e12])", path, nm, i);
            t->shape[i] = (int64_t)d->valuedouble;
            zero |= t->shape[i] == 0;
        }
        // the element count in 64 bits and never past what the data section holds (a shape of
        // [2^32, 2^32] would wrap to 0 elements and pass the size check below)
        uint64_t numel = 1, most = data_size / dtype_size(t->dtype);
        for (int i = 0; i < t->ndim && !zero; i++) {
            if ((uint64_t)t->shape[i] > most / numel)
                die("%s: tensor %s: its shape needs more than the %zu bytes of the data section", path, nm, data_size);
            numel *= (uint64_t)t->shape[i];
        }
        t->numel = zero ? 0 : (int64_t)numel;
        // the offsets as doubles until they are known to fit (1e20, or 1e400 = inf, do not fit a size_t)
        cJSON *b = cJSON_GetArrayItem(jo, 0), *en = cJSON_GetArrayItem(jo, 1);
        if (!cJSON_IsNumber(b) || !cJSON_IsNumber(en) || !(b->valuedouble >= 0 && en->valuedouble >= b->valuedouble) ||
            b->valuedouble != floor(b->valuedouble) || en->valuedouble != floor(en->valuedouble))
            die("%s: tensor %s: bad data_offsets (two integers, begin <= end)", path, nm);
        if (en->valuedouble > (double)data_size)
            die("%s: tensor %s: data_offsets [%.17g, %.17g] beyond the data section (%zu bytes): file truncated?", path, nm,
                b->valuedouble, en->valuedouble, data_size);
        size_t begin = (size_t)b->valuedouble, end = (size_t)en->valuedouble;
        t->nbytes = end - begin;
        if (t->nbytes != (size_t)t->numel * dtype_size(t->dtype))
            die("%s: tensor %s: %zu bytes of data for %lld elements of %s", path, nm, t->nbytes, (long long)t->numel,
                dtype_name(t->dtype));
        t->data = data0 + begin;
    }
    cJSON_Delete(root);

    // overlapping tensors mean a corrupt (or malicious) file
    STensor **order = (STensor **)mallocCheck(count * sizeof(STensor *));
    for (int i = 0; i < count; i++) order[i] = &st->t[first + i];
    qsort(order, count, sizeof(STensor *), cmp_by_offset);
    for (int i = 1; i < count; i++) {
        const STensor *p = order[i - 1], *q = order[i];
        if ((const char *)p->data + p->nbytes > (const char *)q->data && q->nbytes > 0 && p->nbytes > 0)
            die("%s: tensors %s and %s overlap", path, p->name, q->name);
    }
    free(order);
    // Data that does not start at a multiple of its element size (a header length that is not a
    // multiple of 8, or an odd offset: legal, if unusual) is copied, so that every reader may load
    // it as the type it is
    for (int i = first; i < st->n; i++) {
        STensor *t = &st->t[i];
        if ((uintptr_t)t->data % dtype_size(t->dtype) == 0) continue;
        t->copy = mallocCheck(t->nbytes);
        memcpy(t->copy, t->data, t->nbytes);
        t->data = t->copy;
    }
}

static void st_finish(SafeTensors *st) {
    qsort(st->t, st->n, sizeof(STensor), cmp_by_name);
    for (int i = 1; i < st->n; i++)
        if (!strcmp(st->t[i - 1].name, st->t[i].name))
            die("tensor %s appears twice (%s and %s)", st->t[i].name, st->paths[st->t[i - 1].file], st->paths[st->t[i].file]);
}

void st_open(SafeTensors *st, const char *path) {
    memset(st, 0, sizeof *st);
    st_add_file(st, path);
    st_finish(st);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void st_open_dir(SafeTensors *st, const char *dir) {
    memset(st, 0, sizeof *st);
    char p[4096];
    path_join(p, sizeof p, dir, "model.safetensors.index.json");
    if (file_exists(p)) {
        // sharded: the index's weight_map names each tensor's file; open each file once
        char *text = read_file(p, NULL);
        cJSON *root = cJSON_Parse(text);
        free(text);
        cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
        if (!cJSON_IsObject(wm)) die("%s: not valid JSON with a weight_map object", p);
        int nf = 0;
        char **files = NULL;
        cJSON *e;
        cJSON_ArrayForEach(e, wm) {
            if (!cJSON_IsString(e)) die("%s: weight_map entry %s is not a file name", p, e->string);
            if (strchr(e->valuestring, '/')) die("%s: weight_map names %s outside the checkpoint directory", p, e->valuestring);
            int seen = 0;
            for (int i = 0; i < nf; i++) seen |= !strcmp(files[i], e->valuestring);
            if (!seen) {
                files = (char **)reallocCheck(files, (nf + 1) * sizeof(char *));
                files[nf++] = str_dup(e->valuestring);
            }
        }
        qsort(files, nf, sizeof(char *), cmp_str);
        for (int i = 0; i < nf; i++) {
            char fp[4096];
            path_join(fp, sizeof fp, dir, files[i]);
            if (!file_exists(fp)) die("%s: shard %s listed in the index is missing", dir, files[i]);
            st_add_file(st, fp);
            free(files[i]);
        }
        free(files);
        st_finish(st);
        // every tensor the index names must be where it says
        cJSON_ArrayForEach(e, wm) {
            const STensor *t = st_find(st, e->string);
            if (!t) die("%s: tensor %s listed in the index is in none of the shards", p, e->string);
        }
        cJSON_Delete(root);
        return;
    }
    path_join(p, sizeof p, dir, "model.safetensors");
    if (file_exists(p)) {
        st_add_file(st, p);
        st_finish(st);
        return;
    }
    DIR *d = opendir(dir);
    if (!d) die("%s: cannot open the checkpoint directory (%s)", dir, strerror(errno));
    struct dirent *de;
    int nf = 0;
    char **files = NULL;
    while ((de = readdir(d))) {
        size_t L = strlen(de->d_name);
        if (L > 12 && !strcmp(de->d_name + L - 12, ".safetensors")) {
            files = (char **)reallocCheck(files, (nf + 1) * sizeof(char *));
            files[nf++] = str_dup(de->d_name);
        }
    }
    closedir(d);
    if (nf == 0) die("%s: no *.safetensors files (a Hugging Face checkpoint directory has model.safetensors or shards with an index)", dir);
    qsort(files, nf, sizeof(char *), cmp_str);
    for (int i = 0; i < nf; i++) {
        char fp[4096];
        path_join(fp, sizeof fp, dir, files[i]);
        st_add_file(st, fp);
        free(files[i]);
    }
    free(files);
    st_finish(st);
}

const STensor *st_find(const SafeTensors *st, const char *name) {
    int lo = 0, hi = st->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(st->t[mid].name, name);
        if (!c) return &st->t[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

int st_metadata_str(const SafeTensors *st, const char *key, char *out, size_t cap) {
    uint64_t hl;
    memcpy(&hl, st->maps[0], 8);
    char *hdr = (char *)mallocCheck(hl + 1);
    memcpy(hdr, (char *)st->maps[0] + 8, hl);
    hdr[hl] = 0;
    cJSON *root = cJSON_Parse(hdr);
    free(hdr);
    cJSON *md = root ? cJSON_GetObjectItemCaseSensitive(root, "__metadata__") : NULL;
    cJSON *v = md ? cJSON_GetObjectItemCaseSensitive(md, key) : NULL;
    int found = cJSON_IsString(v);
    if (found) snprintf(out, cap, "%s", v->valuestring);
    cJSON_Delete(root);
    return found ? 0 : -1;
}

int st_metadata_int(const SafeTensors *st, const char *key, const char *path) {
    char v[64];
    if (st_metadata_str(st, key, v, sizeof v) < 0) die("%s: no %s in the metadata", path, key);
    return atoi(v);
}

// FNV-1a over bytes, then a final mix
static uint64_t fnv(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = (const uint8_t *)data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

// Every tensor's name, dtype and shape, and its bytes: all of them up to 64 KiB, else 16 runs of
// 4 KiB spread evenly from its first byte to its last. Reading a sample, not every byte, keeps it
// milliseconds for a model of any size (the runs are the pages read), and still tells apart any two
// checkpoints whose weights were trained or quantized apart: those differ in nearly every block of
// 4 KiB of every matrix. Two files that differ only outside the samples share a fingerprint.
void st_fingerprint(const SafeTensors *st, char out[17]) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < st->n; i++) {
        const STensor *t = &st->t[i];
        h = fnv(h, t->name, strlen(t->name) + 1);
        int64_t meta[2 + ST_MAX_DIMS] = {t->dtype, t->ndim};
        for (int d = 0; d < t->ndim; d++) meta[2 + d] = t->shape[d];
        h = fnv(h, meta, sizeof meta);
        const size_t run = 4096, nruns = 16;
        if (t->nbytes <= nruns * run) h = fnv(h, t->data, t->nbytes);
        else
            for (size_t k = 0; k < nruns; k++) h = fnv(h, (const uint8_t *)t->data + (t->nbytes - run) / (nruns - 1) * k, run);
    }
    uint64_t x = h;
    snprintf(out, 17, "%016llx", (unsigned long long)splitmix64(&x));
}

void st_dir_fingerprint(const char *dir, char out[17]) {
    SafeTensors st;
    st_open_dir(&st, dir);
    st_fingerprint(&st, out);
    st_close(&st);
}

void st_close(SafeTensors *st) {
    for (int i = 0; i < st->n; i++) free(st->t[i].name), free(st->t[i].copy);
    for (int i = 0; i < st->nfiles; i++) {
        if (st->maps[i]) munmap(st->maps[i], st->sizes[i]);
        free(st->paths[i]);
    }
    free(st->t);
    free(st->maps);
    free(st->paths);
    free(st->sizes);
    memset(st, 0, sizeof *st);
}

// ----------------------------------------------------------------------------
// writing

static void write_all(FILE *f, const void *p, size_t n, const char *path) {
    if (n && fwrite(p, 1, n, f) != n) die("%s: write failed (%s): disk full?", path, strerror(errno));
}

static FILE *open_tmp(const char *path, char *tmp, size_t cap) {
    int k = snprintf(tmp, cap, "%s.tmp", path);
    if (k < 0 || (size_t)k >= cap) die("path too long: %s", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) die("%s: cannot create (%s): does the directory exist and is it writable?", tmp, strerror(errno));
    return f;
}
static void close_and_rename(FILE *f, const char *tmp, const char *path) {
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) die("%s: write failed (%s)", tmp, strerror(errno));
    fclose(f);
    if (rename(tmp, path) != 0) die("cannot rename %s to %s (%s)", tmp, path, strerror(errno));
}

void write_file_atomic(const char *path, const void *data, size_t n) {
    char tmp[4096];
    FILE *f = open_tmp(path, tmp, sizeof tmp);
    write_all(f, data, n, tmp);
    close_and_rename(f, tmp, path);
}

void st_write(const char *path, const STWrite *t, int n, const char *metadata_json) {
    cJSON *root = cJSON_CreateObject();
    if (metadata_json) {
        cJSON *md = cJSON_Parse(metadata_json);
        if (!md) die("st_write: metadata is not JSON");
        cJSON_AddItemToObject(root, "__metadata__", md);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        int64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= t[i].shape[d];
        size_t nb = (size_t)numel * dtype_size(t[i].dtype);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "dtype", dtype_name(t[i].dtype));
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t[i].ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON *of = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + nb)));
        cJSON_AddItemToObject(root, t[i].name, e);
        off += nb;
    }
    char *hdr = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;  // the data section starts 8-byte aligned
    char tmp[4096];
    FILE *f = open_tmp(path, tmp, sizeof tmp);
    uint64_t h64 = padded;
    write_all(f, &h64, 8, tmp);
    write_all(f, hdr, hl, tmp);
    for (size_t i = hl; i < padded; i++) write_all(f, " ", 1, tmp);
    free(hdr);
    for (int i = 0; i < n; i++) {
        int64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= t[i].shape[d];
        write_all(f, t[i].data, (size_t)numel * dtype_size(t[i].dtype), tmp);
    }
    close_and_rename(f, tmp, path);
}
