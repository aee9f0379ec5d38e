/* store.c - `dtrain store [--host H] [--port P] [--token-file F] [limits]`: a standalone store
 * server. It prints the port it bound on one line of stdout (so `--port 0` is scriptable),
 * logs to stderr, and runs until SIGINT or SIGTERM, then stops cleanly and exits 0. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "common/env.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store_server.h"
#include "runtime/job/workenv.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain store [--host H] [--port P] [--token-file F] [limits]\n"
            "\n"
            "Runs a dtrain store server until SIGINT/SIGTERM. Prints the bound port on one line\n"
            "of stdout (useful with --port 0); logs go to stderr.\n"
            "\n"
            "  --host H                  bind address (default 0.0.0.0)\n"
            "  --port P                  port, 0 = any free port (default 29400)\n"
            "  --token-file F            require the token in file F from every client (default:\n"
            "                            DTRAIN_STORE_TOKEN if set, else no token)\n"
            "limits (sizes take K, M, G suffixes):\n"
            "  --max-key-size N          bytes per key (4K)\n"
            "  --max-value-size N        bytes per value (64M)\n"
            "  --max-keys-per-request N  keys in one multi-get/set/check/wait (65536)\n"
            "  --max-total-bytes N       keys + values stored, each key charged 112 bytes more\n"
            "                            for the server's bookkeeping (1G)\n"
            "  --max-connections N       open client connections (65536, or fewer when the\n"
            "                            open-file limit, ulimit -n, allows fewer)\n"
            "  --max-unauthenticated N   connections still in the handshake or AUTH; a new one\n"
            "                            beyond N closes the oldest (half of --max-connections)\n"
            "  --max-pending-output N    reply bytes buffered per client; beyond it the server\n"
            "                            reads no more of its requests until they drain, and a\n"
            "                            single larger reply is refused (65M; at least\n"
            "                            --max-value-size + 64K: raised with it when not given)\n"
            "  --max-input-buffered N    bytes of large requests (over 64K) being received at\n"
            "                            once, over all clients; a client whose request does not\n"
            "                            fit waits its turn, one larger than N alone is refused\n"
            "                            (1G)\n"
            "  --write-stall-ms N        disconnect a client whose replies pile up beyond\n"
            "                            --max-pending-output and take none for N ms (10000)\n"
            "  --handshake-timeout-ms N  close a connection that has not finished the handshake\n"
            "                            (and AUTH, with a token) N ms after it opened (3000)\n"
            "  --input-stall-ms N        disconnect a client that holds part of\n"
            "                            --max-input-buffered for a request it stopped sending:\n"
            "                            no byte for N ms while others wait for budget (10000)\n");
}

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    (void)!write(sig_pipe[1], &b, 1);
    errno = saved;
}

/* "64M" -> 67108864; plain numbers are bytes. */
static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno || *s == '-')
        return -EINVAL;
    unsigned long long mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    default: break;
    }
    if (*end == 'b' || *end == 'B' || *end == 'i')
        end += (*end == 'i' && (end[1] == 'B' || end[1] == 'b')) ? 2 : 1;
    if (*end || (v && mul > SIZE_MAX / v))
        return -EINVAL;
    *out = (size_t)(v * mul);
    return 0;
}

int dt_cmd_store(int argc, char **argv)
{
    dt_store_server_opts o;
    dt_store_server_opts_default(&o);
    o.port = 29400;
    const char *token_file = NULL;
    char *token = NULL;
    struct {
        const char *name;
        size_t *dst;
    } limits[] = {
        {"--max-key-size", &o.max_key_size},
        {"--max-value-size", &o.max_value_size},
        {"--max-keys-per-request", &o.max_keys_per_request},
        {"--max-total-bytes", &o.max_total_bytes},
        {"--max-connections", &o.max_connections},
        {"--max-unauthenticated", &o.max_unauthenticated},
        {"--max-pending-output", &o.max_pending_output},
        {"--max-input-buffered", &o.max_input_buffered},
    };
    struct {
        const char *name;
        int *dst;
    } millis[] = {
        {"--write-stall-ms", &o.write_stall_ms},
        {"--handshake-timeout-ms", &o.handshake_timeout_ms},
        {"--input-stall-ms", &o.input_stall_ms},
    };
    static const char *const flags[] = {
        "--host", "--port", "--token-file", "--help", "--max-key-size", "--max-value-size",
        "--max-keys-per-request", "--max-total-bytes", "--max-connections", "--max-unauthenticated",
        "--max-pending-output", "--max-input-buffered", "--write-stall-ms",
        "--handshake-timeout-ms", "--input-stall-ms"};
    int pending_given = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        char name[64];
        const char *val = NULL;
        const char *eq = strchr(a, '=');
        if (eq && (size_t)(eq - a) < sizeof name) {
            memcpy(name, a, (size_t)(eq - a));
            name[eq - a] = '\0';
            val = eq + 1;
        } else {
            dt_strlcpy(name, a, sizeof name);
        }
        for (char *p = name + 2; *p && name[0] == '-'; p++)
            if (*p == '_')
                *p = '-';
        int known = 0;
        for (size_t k = 0; k < DT_ARRAY_LEN(flags); k++)
            known |= !strcmp(name, flags[k]);
        if (!known) {
            const char *near = dt_nearest(name, flags, DT_ARRAY_LEN(flags));
            fprintf(stderr, "dtrain store: unknown option \"%s\"%s%s%s (see dtrain store --help)\n",
                    a, near ? "; did you mean " : "", near ? near : "", near ? "?" : "");
            return DT_EXIT_CONFIG;
        }
        if (!val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dtrain store: %s needs a value\n", name);
                return DT_EXIT_CONFIG;
            }
            val = argv[++i];
        }
        int *ms = NULL;
        for (size_t k = 0; k < DT_ARRAY_LEN(millis); k++)
            if (!strcmp(name, millis[k].name))
                ms = millis[k].dst;
        if (!strcmp(name, "--host")) {
            o.host = val;
        } else if (!strcmp(name, "--port")) {
            if (dt_parse_int(val, &o.port) < 0 || o.port < 0 || o.port > 65535) {
                fprintf(stderr, "dtrain store: --port %s: need a port in 0..65535\n", val);
                return DT_EXIT_CONFIG;
            }
        } else if (!strcmp(name, "--token-file")) {
            token_file = val;
        } else if (ms) {
            if (dt_parse_int(val, ms) < 0 || *ms <= 0) {
                fprintf(stderr, "dtrain store: %s %s: need a positive number of "
                        "milliseconds\n", name, val);
                return DT_EXIT_CONFIG;
            }
        } else {
            pending_given |= !strcmp(name, "--max-pending-output");
            for (size_t k = 0; k < DT_ARRAY_LEN(limits); k++)
                if (!strcmp(name, limits[k].name) &&
                    (parse_size(val, limits[k].dst) < 0 || *limits[k].dst == 0)) {
                    fprintf(stderr, "dtrain store: %s %s: need a positive size (e.g. 4096, 64M)\n",
                            name, val);
                    return DT_EXIT_CONFIG;
                }
        }
    }

    /* A reply carries up to one whole value: keep room for it unless told otherwise (the
     * server says which flag to change when an explicit setting is too small). */
    if (!pending_given && o.max_value_size <= SIZE_MAX - (1u << 20) &&
        o.max_pending_output < o.max_value_size + (1u << 20))
        o.max_pending_output = o.max_value_size + (1u << 20);

    dt_err err = {0};
    if (token_file) {
        size_t len;
        if (dt_read_file(token_file, &token, &len, &err) < 0) {
            fprintf(stderr, "dtrain store: reading the token file: %s\n", dt_err_str(&err));
            return 1;
        }
        dt_trim(token);
        if (!*token) {
            fprintf(stderr, "dtrain store: the token file %s is empty\n", token_file);
            free(token);
            return 1;
        }
        o.token = token;
    } else {
        o.token = dt_env("DTRAIN_STORE_TOKEN");
    }

    /* SIGINT/SIGTERM: a handler writes the signal number to a pipe that this thread reads.
     * (Not sigwait with the signals blocked: threads created before main, such as OpenBLAS's
     * pool, have them unblocked, and the kernel may deliver to any of them.) */
    if (pipe2(sig_pipe, O_CLOEXEC) != 0) {
        fprintf(stderr, "dtrain store: pipe: %s\n", strerror(errno));
        free(token);
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    dt_store_server *srv = NULL;
    if (dt_store_server_start(&srv, &o, &err) < 0) {
        fprintf(stderr, "dtrain store: %s\n", dt_err_str(&err));
        close(sig_pipe[0]);
        close(sig_pipe[1]);
        free(token);
        return 1;
    }
    printf("%d\n", dt_store_server_port(srv));
    fflush(stdout);

    unsigned char sig = 0;
    while (read(sig_pipe[0], &sig, 1) != 1 && errno == EINTR)
        ;
    DT_INFO("store: %s received; stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
    dt_store_server_stop(srv);
    close(sig_pipe[0]);
    close(sig_pipe[1]);
    free(token);
    return 0;
}
