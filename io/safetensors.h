// safetensors.h: read and write the safetensors format (Hugging Face checkpoints,
// PEFT adapters, our own checkpoints).
//
// Format: 8 bytes little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"k": "v"}}
// then the raw little-endian data; offsets are relative to the end of the header.
// Reading memory-maps each file and validates every entry (known dtype, integer offsets
// inside the file, size = numel * dtype size in 64-bit arithmetic, no overlaps) before
// anything uses it, so a bad file is a one-line error naming the file and the tensor, never a
// crash. Data that is not aligned to its element size in the file (legal, if unusual) is
// copied, so every tensor's data may be read as its type.
// Depends on cJSON.
#ifndef SAFETENSORS_H
#define SAFETENSORS_H

#include <stdint.h>

#include "core/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_MAX_DIMS 8

typedef struct {
    char *name;
    DType dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    size_t nbytes;
    const void *data;  // inside the mapped file (or copy), aligned to the element size
    int file;          // which file of the set
    void *copy;        // data that lay misaligned in the file, copied; else NULL
} STensor;

typedef struct {
    int nfiles;
    char **paths;
    void **maps;       // mmap of each file
    size_t *sizes;
    STensor *t;        // all tensors of all files, sorted by name
    int n;
} SafeTensors;

// Open one .safetensors file, or a checkpoint directory: model.safetensors.index.json
// (sharded), else model.safetensors, else every *.safetensors in it. Dies on bad input.
void st_open(SafeTensors *st, const char *path);
void st_open_dir(SafeTensors *st, const char *dir);
// the tensor called name, or NULL
const STensor *st_find(const SafeTensors *st, const char *name);
void st_close(SafeTensors *st);
// the integer a single-file st holds as the string value of key in its header's __metadata__
// (st_write's {"step":"12"}); dies naming path when it is missing
int st_metadata_int(const SafeTensors *st, const char *key, const char *path);
// the string value of key in a single-file st's __metadata__ into out: 0, or -1 when it has none
int st_metadata_str(const SafeTensors *st, const char *key, char *out, size_t cap);
// A fingerprint of the weights (16 hex digits): what an adapter records of the base it was trained
// on, so that applying it to another base is caught (lora.h, lora_check_base). From every tensor's
// name, dtype, shape and a sample of its bytes (safetensors.c says which); st_dir_fingerprint opens
// a checkpoint directory as st_open_dir does.
void st_fingerprint(const SafeTensors *st, char out[17]);
void st_dir_fingerprint(const char *dir, char out[17]);

// One tensor to write; data is host memory of numel * dtype_size(dtype) bytes.
typedef struct {
    const char *name;
    DType dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
} STWrite;

// Write n tensors to path atomically (path.tmp, fsync, rename). metadata: NULL or
// a flat JSON object text of string values, e.g. {"format":"pt"}.
void st_write(const char *path, const STWrite *t, int n, const char *metadata_json);

// Write a whole text file atomically (for config.json, adapter_config.json, ...)
void write_file_atomic(const char *path, const void *data, size_t n);
// Read a whole file into a NUL-terminated buffer; dies naming the file when it cannot
char *read_file(const char *path, size_t *n_out);
// Read a JSON file whose top level is an object (config.json, adapter_config.json, ...); dies
// "PATH: not valid JSON" otherwise. cJSON_Delete it.
struct cJSON *read_json_object(const char *path);
int file_exists(const char *path);

#ifdef __cplusplus
}
#endif
#endif  // SAFETENSORS_H
