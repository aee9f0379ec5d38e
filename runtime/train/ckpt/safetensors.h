/* safetensors.h - writer and strict reader of the safetensors format.
 *
 * dtrain stores weights and optimiser state as safetensors so that the wider ecosystem (the
 * Python `safetensors` package, Hugging Face tooling, candle, ...) loads them as they are. The
 * format, exactly as the reference implementation writes and checks it:
 *
 *     [8 bytes]  N, unsigned little-endian: the size of the header
 *     [N bytes]  JSON object, UTF-8, starting with '{':
 *                  {"__metadata__":{"k":"v",...},            (optional, string -> string)
 *                   "NAME":{"dtype":"F32","shape":[2,3],"data_offsets":[BEGIN,END]}, ...}
 *                padded with spaces (0x20) so that 8 + N is a multiple of 8
 *     [rest]     the data section: every tensor's bytes, row-major, little-endian; offsets are
 *                relative to the start of this section, END one past the last byte
 *
 * The writer produces the bytes the reference `serialize` produces for the same tensors and
 * metadata: compact JSON, "__metadata__" first, tensors ordered by dtype (widest first, in the
 * reference's dtype order) then by name, offsets packed from 0, the header padded with spaces.
 *
 * The reader rejects, with a message naming the tensor and the numbers involved: a file shorter
 * than 8 bytes; a header larger than 100 MB (the reference's limit) or running past the end of
 * the file; a header that is not UTF-8, not a JSON object, starts with anything but '{', holds a
 * control character, or repeats a key; an unknown dtype or key; a shape or offset that is not a
 * non-negative integer, or more than DT_ST_MAX_DIMS dimensions; an element count that overflows;
 * data_offsets whose length differs from dtype size x element count; tensors that overlap,
 * leave a hole, or do not start at 0; a data section longer or shorter than the tensors it
 * holds (the reference rejects trailing bytes too); __metadata__ values that are not strings.
 *
 * Byte order: the format is little-endian and so are the machines dtrain supports; a big-endian
 * build stops at compile time (safetensors.c) rather than write files no one else can read.
 */
#ifndef DT_SAFETENSORS_H
#define DT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define DT_ST_MAX_DIMS 8
#define DT_ST_MAX_HEADER 100000000ULL /* the reference implementation's limit on N */

/* Element types, in the reference implementation's order (which the writer sorts by). */
typedef enum dt_st_dtype {
    DT_ST_BOOL = 0,
    DT_ST_F4,
    DT_ST_F6_E2M3,
    DT_ST_F6_E3M2,
    DT_ST_U8,
    DT_ST_I8,
    DT_ST_F8_E5M2,
    DT_ST_F8_E4M3,
    DT_ST_F8_E8M0,
    DT_ST_I16,
    DT_ST_U16,
    DT_ST_F16,
    DT_ST_BF16,
    DT_ST_I32,
    DT_ST_U32,
    DT_ST_F32,
    DT_ST_F64,
    DT_ST_I64,
    DT_ST_U64,
    DT_ST_NUM_DTYPES
} dt_st_dtype;

/* The name in the header ("F32"), or "?" for an invalid value. */
const char *dt_st_dtype_name(dt_st_dtype t);
/* Bits per element (F4 is 4, F6_* are 6, BOOL is 8). 0 for an invalid value. */
int dt_st_dtype_bits(dt_st_dtype t);
/* Parses a header dtype name. 0, or -EINVAL when unknown. */
int dt_st_dtype_parse(const char *name, dt_st_dtype *out);

typedef struct dt_st_tensor {
    const char *name;               /* writer: borrowed; reader: owned by the dt_st_file */
    dt_st_dtype dtype;
    int ndim;                       /* 0 = a scalar (one element) */
    int64_t shape[DT_ST_MAX_DIMS];  /* (ndim) */
    uint64_t begin, end;            /* data_offsets: [begin, end) within the data section */
    const void *data;               /* writer: the bytes, borrowed (NULL when numel is 0);
                                     * reader: into the loaded data section, or NULL when only
                                     * the header was read */
} dt_st_tensor;

typedef struct dt_st_kv {
    const char *key, *value;        /* writer: borrowed; reader: owned by the dt_st_file */
} dt_st_kv;

/* Elements of t (the product of its shape; 1 for a scalar). */
uint64_t dt_st_numel(const dt_st_tensor *t);

/* ---- writing ---- */

/* Lays out a file holding tensors[0..n): sorts `tensors` in place into the reference order
 * (widest dtype first, then name, bytewise), fills each begin/end, and builds the header: the
 * 8-byte length, the JSON and its padding. *header (malloc'd, caller frees) is written first,
 * then every tensor's bytes in array order; *data_len is the size of the data section.
 * meta (n_meta pairs) becomes __metadata__; meta == NULL omits it, n_meta == 0 with a non-NULL
 * meta writes an empty object. Fails with -EINVAL on an empty or duplicate name, a negative
 * dimension, an invalid dtype, or a size that is not a whole number of bytes; tensors is then
 * sorted but otherwise unchanged. */
int dt_st_layout(dt_st_tensor *tensors, int n, const dt_st_kv *meta, int n_meta, char **header,
                 size_t *header_len, uint64_t *data_len, dt_err *err);

/* A sink for dt_st_write: consumes n bytes or fails (returns a negative code, filling err). */
typedef int (*dt_st_write_fn)(void *ctx, const void *buf, size_t n, dt_err *err);

/* dt_st_layout, then the header and every tensor's bytes through write_fn (tensors adjacent in
 * memory go as one call). Returns 0 or the first failure. *total (may be NULL) gets the size of
 * the whole file. */
int dt_st_write(dt_st_tensor *tensors, int n, const dt_st_kv *meta, int n_meta,
                dt_st_write_fn write_fn, void *ctx, uint64_t *total, dt_err *err);

/* Writes a whole file at path (created or truncated, not fsynced: for tools and tests; the
 * checkpoint writer does its own atomic, durable writes). */
int dt_st_save(const char *path, dt_st_tensor *tensors, int n, const dt_st_kv *meta, int n_meta,
               dt_err *err);

/* ---- reading ---- */

typedef struct dt_st_file {
    dt_st_tensor *tensors;   /* (num_tensors) in data order (by begin) */
    int num_tensors;
    dt_st_kv *meta;          /* (num_meta) __metadata__ in file order */
    int num_meta;
    bool has_meta;           /* the header had a __metadata__ entry */
    uint64_t header_len;     /* N */
    uint64_t data_offset;    /* 8 + N: where the data section starts in the file */
    uint64_t data_len;       /* bytes of the data section (= file size - data_offset) */
    void *priv;              /* owned storage (names, data); do not touch */
} dt_st_file;

/* Parses and validates the start of a file. buf holds the first `avail` bytes of a file of
 * `file_size` bytes; avail must cover at least 8 + N (the whole header). When avail equals
 * file_size, tensor data pointers point into buf (borrowed: buf must outlive *out); otherwise
 * they are NULL. On success *out is owned by the caller (dt_st_free); on failure *out is
 * untouched and err says what is wrong: -EINVAL for a malformed file, -ENOMEM. */
int dt_st_parse(const void *buf, size_t avail, uint64_t file_size, dt_st_file **out,
                dt_err *err);

/* Reads the file at path and parses it: only the header when load_data is false (cheap for
 * large files), else the whole file, kept in memory owned by *out. Errors name the path. */
int dt_st_open(const char *path, bool load_data, dt_st_file **out, dt_err *err);

/* The tensor called name, or NULL. */
const dt_st_tensor *dt_st_find(const dt_st_file *f, const char *name);
/* The __metadata__ value of key, or NULL. */
const char *dt_st_meta_get(const dt_st_file *f, const char *key);

/* Accepts NULL. */
void dt_st_free(dt_st_file *f);

#endif
