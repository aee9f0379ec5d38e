/* comm_opts.c - a communicator's default options; see comm_opts.h. */
#include "runtime/comm/comm_opts.h"

#include <string.h>

void dt_comm_opts_default(dt_comm_opts *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "cpu";
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
