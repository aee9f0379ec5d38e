/* main.c - the dtrain binary's entry point; everything else is in cmd/dtrain.c. */
#include "cmd/cmd.h"

int main(int argc, char **argv) { return dt_cmd_main(argc, argv); }
