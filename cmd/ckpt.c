/* ckpt.c - `dtrain ckpt list|show|verify`: checkpoint tools. */
#include "cmd/cmd.h"

int dt_cmd_ckpt(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return dt_cmd_unavailable("ckpt", "checkpoint tools land with the checkpoint issue");
}
