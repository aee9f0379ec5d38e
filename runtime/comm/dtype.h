/* dtype.h - the element types and reduction ops of the collectives, and what every part of
 * runtime/comm/ needs to know about them (sizes, names, which are floating point).
 *
 * A leaf: it includes nothing of runtime/comm/, so the front end (comm.c), the cpu backend and
 * its transports, and the element kernels (comm_reduce.c) can all use it without including each
 * other. The enum values travel in transport messages (dt_coll_desc.dtype, .redop): append, never
 * renumber.
 */
#ifndef DT_DTYPE_H
#define DT_DTYPE_H

#include <stdbool.h>
#include <stddef.h>

typedef enum dt_dtype {
    DT_FLOAT32 = 0,
    DT_BFLOAT16 = 1,
    DT_FLOAT16 = 2,
    DT_INT32 = 3, /* two's complement; sums wrap modulo 2^32 */
    DT_INT64 = 4, /* two's complement; sums wrap modulo 2^64 */
    DT_UINT8 = 5, /* bytes, flags; sums wrap modulo 256 */
    DT_FLOAT64 = 6, /* IEEE double; reductions accumulate in double (counts, sums of metrics) */
} dt_dtype;
#define DT_DTYPE_COUNT 7

/* Reductions. float32, bfloat16 and float16 accumulate in float32, float64 in double (see
 * comm_reduce.h); integer types reduce
 * exactly in their own type. DT_AVG is defined for floating types only: an integer average
 * would have to round, so the collectives reject it (-EINVAL); sum and divide instead. */
typedef enum dt_redop {
    DT_SUM = 0,
    DT_AVG = 1,
    DT_MAX = 2,
    DT_MIN = 3,
} dt_redop;
#define DT_REDOP_COUNT 4

/* Bytes per element; 0 for a value that is not a dt_dtype. */
size_t dt_dtype_size(dt_dtype t);
/* "float32", "bfloat16", "float16", "int32", "int64", "uint8", "float64"; "unknown-dtype"
 * otherwise. */
const char *dt_dtype_name(dt_dtype t);
/* True for the values of dt_dtype. */
bool dt_dtype_valid(int t);
/* True for float32, bfloat16, float16 and float64. */
bool dt_dtype_is_float(dt_dtype t);
/* "sum", "avg", "max", "min"; "unknown-op" otherwise. */
const char *dt_redop_name(dt_redop op);
/* True for the values of dt_redop. */
bool dt_redop_valid(int op);

#endif
