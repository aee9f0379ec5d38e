/* fuzz_frame.c - libFuzzer target for the store's frame parser (rendezvous/protocol.c).
 *
 * The input is a byte stream as the server reads it after the handshake. dt_proto_check_stream
 * parses it as requests (with small limits, so that every limit path is reachable) and as
 * replies, walks every item and checks the parser's promises; a broken promise traps, and
 * AddressSanitizer/UBSan catch any read outside the input. Not part of the normal build: run
 * tests/fuzz/run.sh (needs clang with libFuzzer). The seeds in tests/fuzz/corpus/ are replayed
 * by tests/test_store.c (test proto_corpus) in the normal suite. */
#include <stddef.h>
#include <stdint.h>

#include "rendezvous/protocol.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dt_proto_limits lim = {.max_frame = 4096, .max_key = 64, .max_value = 1024, .max_items = 16};
    if (dt_proto_check_stream(data, size, &lim) < 0)
        __builtin_trap();
    return 0;
}
