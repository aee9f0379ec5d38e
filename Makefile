# dtrain - top-level build.
#
#   make              build/dtrain (CPU, always) and build/libdtrain_cuda.so where nvcc is found
#   make test         every unit and integration test (GPU tests are skipped, visibly, without GPU)
#   make test-gpu     only the GPU tests, which then fail instead of skipping when no GPU is found
#   make run          the quickstart job (configs/quickstart.ini)
#   make deps         install the system packages (scripts/install-deps.sh)
#   make install      copy what `make` built to $(DESTDIR)$(PREFIX): bin/dtrain and, when built,
#                     lib/dtrain/libdtrain_cuda.so (where an installed dtrain looks for it);
#                     PREFIX=/usr/local by default. It builds first only when build/dtrain is
#                     missing, so `make && sudo make install` never compiles as root.
#   make uninstall    removes those files again
#   make clean
#
# Switches: SANITIZE=address,undefined (everything rebuilt under the sanitizers), WERROR=1,
# DEBUG=1 (-O0), CUDA=0 (skip the CUDA backend), CUDA_HOME=/path (where nvcc lives),
# CUDNN_HOME=/path and NCCL_HOME=/path (searched first for cuDNN and NCCL).

BUILD   := build
CC      ?= cc
PKGS    := libuv libcjson inih openblas libcurl
VERSION := 0.1.0

.DEFAULT_GOAL := all
.SECONDARY:
.PHONY: all test test-cluster test-gpu run deps deps-cluster clean fuzz install uninstall FORCE

PREFIX  ?= /usr/local
DESTDIR ?=

# ---- system packages -----------------------------------------------------------------------
# Every build target checks the libraries with pkg-config and runs scripts/install-deps.sh when
# one is missing (it installs them as root, or prints the exact command and fails).
ifeq ($(filter deps clean install uninstall,$(MAKECMDGOALS)),)
DEPS_OK := $(shell pkg-config --exists $(PKGS) 2>/dev/null && echo yes)
ifneq ($(DEPS_OK),yes)
$(info dtrain: some of $(PKGS) not found by pkg-config; running scripts/install-deps.sh)
DEPS_RC := $(shell scripts/install-deps.sh 1>&2; echo $$?)
ifneq ($(DEPS_RC),0)
$(error dtrain: system packages missing; see the message above (or run: make deps))
endif
endif
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
endif

# ---- flags ---------------------------------------------------------------------------------
OPT      := $(if $(DEBUG),-O0,-O2)
CFLAGS   := -std=c11 -D_GNU_SOURCE -DDT_VERSION='"$(VERSION)"' $(OPT) -g -fPIC -pthread \
            -Wall -Wextra -Wno-unused-parameter -Wshadow -Wstrict-prototypes \
            -I. $(PKG_CFLAGS) $(if $(WERROR),-Werror,) $(EXTRA_CFLAGS)
LDFLAGS  := -pthread $(EXTRA_LDFLAGS)
LDLIBS   := $(PKG_LIBS) -lm -ldl
ifneq ($(SANITIZE),)
CFLAGS   += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS  += -fsanitize=$(SANITIZE)
endif

# ---- CUDA ----------------------------------------------------------------------------------
CUDA_HOME ?= $(if $(wildcard /usr/local/cuda/bin/nvcc),/usr/local/cuda,$(patsubst %/bin/nvcc,%,$(shell command -v nvcc 2>/dev/null)))
NVCC      := $(if $(CUDA_HOME),$(wildcard $(CUDA_HOME)/bin/nvcc),)
ifeq ($(CUDA),0)
NVCC      :=
CUDA_WHY  := no: disabled by CUDA=0
else
CUDA_WHY  := no: nvcc not found (looked in CUDA_HOME=$(or $(CUDA_HOME),unset), /usr/local/cuda and PATH)
endif
# The backend also needs cuDNN (kernels/cuda) and NCCL (runtime/comm/comm_nccl.cu): each header and
# library is looked for under CUDNN_HOME / NCCL_HOME (when set), CUDA_HOME and the system
# directories. Without either the CUDA backend is skipped with the reason; the build goes on.
CUDA_SYS_INC ?= /usr/include /usr/include/x86_64-linux-gnu
CUDA_SYS_LIB ?= /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib
dt_first   = $(firstword $(foreach d,$(2),$(if $(wildcard $(d)/$(1)),$(d),)))
CUDNN_INCS := $(strip $(if $(CUDNN_HOME),$(CUDNN_HOME)/include) $(if $(CUDA_HOME),$(CUDA_HOME)/include) $(CUDA_SYS_INC))
CUDNN_LIBS := $(strip $(if $(CUDNN_HOME),$(CUDNN_HOME)/lib64 $(CUDNN_HOME)/lib) $(if $(CUDA_HOME),$(CUDA_HOME)/lib64) $(CUDA_SYS_LIB))
NCCL_INCS  := $(strip $(if $(NCCL_HOME),$(NCCL_HOME)/include) $(if $(CUDA_HOME),$(CUDA_HOME)/include) $(CUDA_SYS_INC))
NCCL_LIBS  := $(strip $(if $(NCCL_HOME),$(NCCL_HOME)/lib64 $(NCCL_HOME)/lib) $(if $(CUDA_HOME),$(CUDA_HOME)/lib64) $(CUDA_SYS_LIB))
ifneq ($(NVCC),)
CUDNN_INC  := $(call dt_first,cudnn.h,$(CUDNN_INCS))
CUDNN_LIB  := $(call dt_first,libcudnn.so,$(CUDNN_LIBS))
NCCL_INC   := $(call dt_first,nccl.h,$(NCCL_INCS))
NCCL_LIB   := $(call dt_first,libnccl.so,$(NCCL_LIBS))
CUDNN_WHY  := $(if $(CUDNN_INC),,cudnn.h not found under $(CUDNN_INCS))$(if $(CUDNN_INC)$(CUDNN_LIB),,; )$(if $(CUDNN_LIB),,libcudnn.so not found under $(CUDNN_LIBS))
NCCL_WHY   := $(if $(NCCL_INC),,nccl.h not found under $(NCCL_INCS))$(if $(NCCL_INC)$(NCCL_LIB),,; )$(if $(NCCL_LIB),,libnccl.so not found under $(NCCL_LIBS))
CUDNN_LINE := $(if $(CUDNN_WHY),no: $(CUDNN_WHY),yes ($(CUDNN_INC)/cudnn.h, $(CUDNN_LIB)/libcudnn.so))
NCCL_LINE  := $(if $(NCCL_WHY),no: $(NCCL_WHY),yes ($(NCCL_INC)/nccl.h, $(NCCL_LIB)/libnccl.so))
ifneq ($(CUDNN_WHY)$(NCCL_WHY),)
CUDA_WHY   := skipped: $(if $(CUDNN_WHY),cuDNN not found ($(CUDNN_WHY)); install libcudnn9-dev-cuda-12 or set CUDNN_HOME)$(if $(CUDNN_WHY),$(if $(NCCL_WHY),; ))$(if $(NCCL_WHY),NCCL not found ($(NCCL_WHY)); install libnccl-dev or set NCCL_HOME)
NVCC       :=
endif
else
CUDNN_LINE := not checked (no CUDA backend)
NCCL_LINE  := not checked (no CUDA backend)
endif
# Include and library directories beyond the compilers' defaults.
CUDA_XINC := $(filter-out $(CUDA_HOME)/include /usr/include /usr/include/x86_64-linux-gnu,$(sort $(CUDNN_INC) $(NCCL_INC)))
CUDA_XLIB := $(filter-out $(CUDA_HOME)/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib,$(sort $(CUDNN_LIB) $(NCCL_LIB)))
NVFLAGS   := -O2 -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden -I. $(addprefix -I,$(CUDA_XINC)) \
             -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90 $(if $(WERROR),-Werror all-warnings,)
CUDA_LIBS := $(addprefix -L,$(CUDA_XLIB)) -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudnn -lnccl -lcudart \
             $(addprefix -Xlinker -rpath=,$(CUDA_XLIB)) -Xlinker -rpath=$(CUDA_HOME)/lib64

# ---- sources -------------------------------------------------------------------------------
LIB_SRC  := $(wildcard common/*.c rendezvous/*.c kernels/*.c kernels/cpu/*.c \
                       runtime/*/*.c runtime/*/*/*.c runtime/*/*/*/*.c) $(filter-out cmd/main.c,$(wildcard cmd/*.c cmd/*/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_LIB := $(patsubst %.c,$(BUILD)/obj/%.o,$(filter-out $(TEST_SRC),$(wildcard tests/*.c)))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_SO  := $(patsubst tests/fake/%.c,$(BUILD)/tests/libfake_%.so,$(wildcard tests/fake/*.c))
CU_SRC   := $(wildcard kernels/cuda/*.cu runtime/comm/*.cu)
CU_CSRC  := $(wildcard kernels/cuda/*.c) kernels/backend_ops.c common/err.c common/log.c \
            common/util.c common/env.c
CU_OBJ   := $(CU_SRC:%.cu=$(BUILD)/cuda/%.o) $(CU_CSRC:%.c=$(BUILD)/cuda/%.o)

TARGETS  := $(BUILD)/dtrain $(if $(NVCC),$(BUILD)/libdtrain_cuda.so,)

all: features $(TARGETS)

.PHONY: features
features:
	@echo "dtrain: CPU backend: yes (OpenBLAS $$(pkg-config --modversion openblas 2>/dev/null))"
	@echo "dtrain: cuDNN: $(CUDNN_LINE)"
	@echo "dtrain: NCCL: $(NCCL_LINE)"
	@echo "dtrain: CUDA backend: $(if $(NVCC),yes ($(NVCC)),$(CUDA_WHY))"
	@echo "dtrain: sanitizers: $(if $(SANITIZE),$(SANITIZE),off (SANITIZE=address,undefined to enable))"

# Rebuild everything when the flags change (e.g. a SANITIZE build after a normal one).
$(BUILD)/.flags: FORCE
	@mkdir -p $(BUILD)
	@echo '$(CC) $(CFLAGS) $(LDFLAGS)' | cmp -s - $@ || echo '$(CC) $(CFLAGS) $(LDFLAGS)' > $@

$(BUILD)/obj/%.o: %.c $(BUILD)/.flags
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	@$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libdtrain.a: $(LIB_OBJ)
	@rm -f $@
	@echo "  AR    $@"
	@ar rcs $@ $^

$(BUILD)/dtrain: $(BUILD)/obj/cmd/main.o $(BUILD)/libdtrain.a
	@echo "  LD    $@"
	@$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(TEST_LIB) $(BUILD)/libdtrain.a $(BUILD)/.flags | $(TEST_SO)
	@mkdir -p $(dir $@)
	@echo "  CC    $@"
	@$(CC) $(CFLAGS) -MMD -MP $(LDFLAGS) -o $@ $< $(TEST_LIB) $(BUILD)/libdtrain.a $(LDLIBS)

# Stand-ins for driver libraries (tests/fake/NAME.c -> build/tests/libfake_NAME.so).
$(BUILD)/tests/libfake_%.so: tests/fake/%.c $(BUILD)/.flags
	@mkdir -p $(dir $@)
	@echo "  CC    $@"
	@$(CC) $(filter-out -fsanitize%,$(CFLAGS)) -fPIC -shared -o $@ $<

# The CUDA backend: a shared object loaded at run time, so build/dtrain links no CUDA library.
$(BUILD)/cuda/%.o: %.cu $(BUILD)/.flags
	@mkdir -p $(dir $@)
	@echo "  NVCC  $<"
	@$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/cuda/%.o: %.c $(BUILD)/.flags
	@mkdir -p $(dir $@)
	@echo "  CC    $< (cuda)"
	@$(CC) $(filter-out -fsanitize=%,$(CFLAGS)) -fvisibility=hidden -I$(CUDA_HOME)/include $(addprefix -I,$(CUDA_XINC)) -MMD -MP -c $< -o $@

$(BUILD)/libdtrain_cuda.so: $(CU_OBJ)
	@echo "  LD    $@"
	@$(NVCC) -shared -o $@ $^ $(CUDA_LIBS)

# The slow tests of the simulated cluster (real Slurm and OpenSSH, etcd partitions: about three
# minutes) run in `make test-cluster`; `make test` runs every other test binary, the cluster
# ones with namespaces too (tests/test_cluster*.c skip, saying why, where none can be made).
# Their daemons: scripts/install-deps.sh --cluster (make deps-cluster).
CLUSTER_SLOW := test_cluster_etcd test_cluster_sched

test: all $(TEST_BIN)
	@DT_TEST_EXCEPT="$(CLUSTER_SLOW)" tests/run.sh $(BUILD)

test-cluster: all $(TEST_BIN)
	@DT_TEST_ONLY="$(CLUSTER_SLOW)" tests/run.sh $(BUILD)

test-gpu: all $(TEST_BIN)
	@DTRAIN_REQUIRE_GPU=1 tests/run.sh $(BUILD) gpu

run: all
	$(BUILD)/dtrain configs/quickstart.ini

# A few seconds of the store frame-parser fuzzer (clang + libFuzzer; skipped with a message
# when they are missing). Longer runs: tests/fuzz/run.sh SECONDS.
FUZZ_SECONDS ?= 10
fuzz:
	@DT_FUZZ_SKIP_OK=1 tests/fuzz/run.sh $(FUZZ_SECONDS)

deps:
	scripts/install-deps.sh

deps-cluster:
	scripts/install-deps.sh --cluster

# Not a dependency on the build: its flag check would rebuild everything under other flags
# (make WERROR=1, then make install). A missing binary is built with a plain make first.
install:
	@test -x $(BUILD)/dtrain || $(MAKE) --no-print-directory all
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(BUILD)/dtrain $(DESTDIR)$(PREFIX)/bin/dtrain
	@if [ -f $(BUILD)/libdtrain_cuda.so ]; then \
	    echo "install -d $(DESTDIR)$(PREFIX)/lib/dtrain"; install -d $(DESTDIR)$(PREFIX)/lib/dtrain && \
	    echo "install -m 755 $(BUILD)/libdtrain_cuda.so $(DESTDIR)$(PREFIX)/lib/dtrain/"; \
	    install -m 755 $(BUILD)/libdtrain_cuda.so $(DESTDIR)$(PREFIX)/lib/dtrain/libdtrain_cuda.so; \
	else \
	    echo "dtrain: no $(BUILD)/libdtrain_cuda.so (built without the CUDA backend): CPU only"; \
	fi

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/dtrain $(DESTDIR)$(PREFIX)/lib/dtrain/libdtrain_cuda.so
	rmdir $(DESTDIR)$(PREFIX)/lib/dtrain 2>/dev/null || true

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
