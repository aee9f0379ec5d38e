/* comm_opts.c - a communicator's default options; see comm_opts.h. */
#include "runtime/comm/comm_opts.h"

#include <string.h>

const char *dt_comm_kind_name(dt_comm_kind kind)
{
    return kind == DT_COMM_CPU ? "cpu" : kind == DT_COMM_NCCL ? "nccl" : "?";
}

void dt_comm_opts_default(dt_comm_opts *o)
{
    memset(o, 0, sizeof *o);
    o->backend = DT_COMM_CPU;
    o->rank = 0;
    o->world_size = 1;
    o->local_rank = 0;
    o->local_world_size = 1;
    o->run_id = NULL;
    o->attempt = 0;
    o->timeout_ms = 300000;
    o->local_addr = NULL;
    o->device_index = 0;
    o->number = 0;
}
