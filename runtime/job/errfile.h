/* errfile.h - the error record a worker leaves behind when it fails.
 *
 * The agent gives each worker DTRAIN_ERROR_FILE (and TORCHELASTIC_ERROR_FILE, the same path). On
 * a fatal error the built-in worker writes one JSON object there, in torchelastic's shape so that
 * tools reading PyTorch's error files read ours:
 *
 *   {"message": {"message": "what failed", "extraInfo": {"py_callstack": "", "timestamp": "1700000000"}},
 *    "dtrain": {"rank": 3, "host": "node1", "pid": 1234, "exit_code": 1}}
 *
 * A PyTorch script under dtrain writes the same shape through torch.distributed.elastic's
 * @record. The agent reads the file of the first failed worker for its root-cause table.
 */
#ifndef DT_ERRFILE_H
#define DT_ERRFILE_H

#include <stddef.h>

#include "common/err.h"

/* Writes the record to path (or to DTRAIN_ERROR_FILE / TORCHELASTIC_ERROR_FILE when path is NULL;
 * nothing when neither is set). Written to a temporary file then renamed. */
int dt_errfile_write(const char *path, int rank, int exit_code, const char *message, dt_err *err);

/* Reads the message and timestamp of a record (either shape). message is always terminated;
 * -ENOENT when there is no file. */
int dt_errfile_read(const char *path, char *message, size_t cap, double *timestamp, dt_err *err);

#endif
