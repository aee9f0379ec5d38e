/* store.c - `dtrain store [--host H] [--port P] [--token-file F]`: a standalone store server. */
#include "cmd/cmd.h"

int dt_cmd_store(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return dt_cmd_unavailable("store", "the standalone store lands with the rendezvous-store issue");
}
