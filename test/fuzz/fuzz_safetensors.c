// test/fuzz/fuzz_safetensors.c: the safetensors reader (safetensors.c). Input: model.safetensors,
// optionally then model.safetensors.index.json (test/fuzz/fuzz.h's separator between them). The
// file is opened alone (st_open), or as a sharded checkpoint directory when the index is there
// (st_open_dir); every tensor is looked up by name and every element read as a number.
#include "fuzz.h"
#include "core/backend.h"
#include "io/safetensors.h"

static void body(const char *dir, const uint8_t *rest, size_t nrest) {
    (void)rest, (void)nrest;
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    SafeTensors st;
    if (file_exists(p)) st_open_dir(&st, dir);
    else {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        st_open(&st, p);
    }
    double sum = 0, buf[256];
    for (int i = 0; i < st.n; i++) {
        const STensor *t = &st.t[i];
        if (st_find(&st, t->name) != t) fprintf(stderr, "fuzz_safetensors: st_find(%s) is not the tensor\n", t->name), abort();
        if (t->dtype == DT_I64 || t->dtype == DT_U8) continue;  // no conversion to floating point
        size_t esz = dtype_size(t->dtype);
        for (size_t k = 0; k < (size_t)t->numel; k += 256) {
            size_t m = (size_t)t->numel - k < 256 ? (size_t)t->numel - k : 256;
            convert_to_f64(buf, (const char *)t->data + k * esz, t->dtype, m);
            for (size_t j = 0; j < m; j++) sum += buf[j];
        }
    }
    st_close(&st);
    if (sum == 12345.678) fprintf(stderr, "(keeps the reads)\n");
}

FUZZ_TARGET(body, NULL, "model.safetensors", "model.safetensors.index.json")
