/* dtype.c - sizes and names of the collectives' element types and reduction ops; see dtype.h. */
#include "runtime/comm/dtype.h"

size_t dt_dtype_size(dt_dtype t)
{
    switch (t) {
    case DT_FLOAT32: return 4;
    case DT_BFLOAT16: return 2;
    case DT_FLOAT16: return 2;
    case DT_INT32: return 4;
    case DT_INT64: return 8;
    case DT_UINT8: return 1;
    case DT_FLOAT64: return 8;
    }
    return 0;
}

const char *dt_dtype_name(dt_dtype t)
{
    switch (t) {
    case DT_FLOAT32: return "float32";
    case DT_BFLOAT16: return "bfloat16";
    case DT_FLOAT16: return "float16";
    case DT_INT32: return "int32";
    case DT_INT64: return "int64";
    case DT_UINT8: return "uint8";
    case DT_FLOAT64: return "float64";
    }
    return "unknown-dtype";
}

bool dt_dtype_valid(int t) { return t >= 0 && t < DT_DTYPE_COUNT; }

bool dt_dtype_is_float(dt_dtype t)
{
    return t == DT_FLOAT32 || t == DT_BFLOAT16 || t == DT_FLOAT16 || t == DT_FLOAT64;
}

const char *dt_redop_name(dt_redop op)
{
    switch (op) {
    case DT_SUM: return "sum";
    case DT_AVG: return "avg";
    case DT_MAX: return "max";
    case DT_MIN: return "min";
    }
    return "unknown-op";
}

bool dt_redop_valid(int op) { return op >= 0 && op < DT_REDOP_COUNT; }
