# Makefile for fp8-grpo.
#
#   make              build ./train_grpo, ./train_sft, ./train_dpo, ./generate and ./export (CPU backend always; CUDA
#                     backend too when nvcc is found), on every core
#   make test         build and run the CPU test suites (Check); non-zero on any failure
#   make test-gpu     build and run the GPU test suites (needs a CUDA GPU)
#   make bench-gemm   build build/bench_gemm (the FP8 GEMM as the programs run it; dev/Makefile)
#   make bench-train  build build/bench_train (the LoRA training step on the CUDA backend)
#   make bench-full   build build/bench_full (full fine-tuning, BF16 and the FP8 recipes)
#   make bench-rollout build build/bench_rollout (rollout throughput on the CUDA backend)
#   make bench-dp     build build/bench_dp (several GPUs: the GRPO step data parallel, full fine-tuning
#                     sharded; dev/multi_gpu_check.sh runs it)
#   make bench-grpo   build build/bench_grpo (one GRPO step at a named shape and its memory by part)
#   make dev-check    build the FP8 GEMM's versions (dev/cuda) and run each one's validation (GPU)
#   make fuzz-replay  build the fuzz targets (test/fuzz) as plain programs and replay their corpora
#   make fuzz         build the fuzz targets with clang's libFuzzer (+ ASan, UBSan) into build-fuzz/
#                     and run each for FUZZ_SECONDS (default 60); FUZZ_TARGETS picks some
#   make test SAN=1   the sanitizer build (below) of the CPU suites; make fuzz-replay SAN=1 likewise
#
# Knobs: CUDA_HOME=/path (default: where nvcc lives), NO_CUDA=1 (CPU only), NCCL_HOME=dir (NCCL's
# include/ and lib/: below),
# GPU_ARCH=90a|89|120|all (default: probe the GPU, else all), DEPS_PREFIX=dir
# (Check/cJSON/PCRE2 unpacked there: see fetch_deps.sh).
# CFLAGS=... replaces the optimization and debug flags (default -O3 -march=native -g; with SAN=1
# -O1 -g -march=native); the flags the build needs (-std=c11, the warnings, -fopenmp, the include
# paths, the sanitizers) are always added to what is given (make CFLAGS=-O0 builds with -O0 and
# all of them); LDFLAGS=... is added to likewise.
# SAN=1: AddressSanitizer + UndefinedBehaviorSanitizer (float-cast-overflow too), the first report
# fatal (-fno-sanitize-recover=all), CPU backend only, everything in build-san/ (the programs as
# build-san/train_grpo, build-san/train_sft, build-san/export and build-san/generate, and the
# suites run there), so that the normal build is untouched; all but the CPU kernels (see KCFLAGS
# below). CI runs make test and make fuzz-replay in both builds (.ci/run).

MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
CC      ?= gcc
OMP     := -fopenmp
ifeq ($(FUZZ),1)
# make fuzz: clang, libFuzzer's coverage, ASan + UBSan, one thread (OpenMP's pragmas ignored)
CC      := clang
CFLAGS  ?= -O1 -g -march=native
SANFLAGS := -fsanitize=fuzzer-no-link,address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer
OMP     := -fopenmp-simd
BUILD   := build-fuzz
BIN     := build-fuzz/
NO_CUDA := 1
else ifeq ($(SAN),1)
CFLAGS  ?= -O1 -g -march=native
SANFLAGS := -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer
BUILD   := build-san
BIN     := build-san/
NO_CUDA := 1
else
CFLAGS  ?= -O3 -march=native -g
BUILD   := build
BIN     :=
endif
# override: added to a CFLAGS given on the command line, not replaced by it (the sanitizers are
# added last, below; the link lines use CFLAGS too, so they reach them)
override CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter $(OMP) -I.
LDLIBS  := -lm $(OMP)

# ---- C libraries: cJSON and PCRE2 (the programs), Check (the tests) ----
# From DEPS_PREFIX when given; else from the system when it has them (Debian / Ubuntu: libcjson-dev
# libpcre2-dev check); else fetched into .deps/ by ./fetch_deps.sh (apt-get download + dpkg -x: no
# root needed), which make says it does.
have_header = $(shell printf '\043define PCRE2_CODE_UNIT_WIDTH 8\n\043include <$(1)>\n' | $(CC) -E -x c - >/dev/null 2>&1 && echo yes)
ifndef DEPS_PREFIX
ifneq ($(call have_header,cjson/cJSON.h)$(call have_header,pcre2.h)$(call have_header,check.h),yesyesyes)
DEPS_PREFIX := $(CURDIR)/.deps/usr
ifeq ($(wildcard $(DEPS_PREFIX)/include/check.h),)
$(info deps: cJSON, PCRE2 or Check not found on this system: fetching them into .deps/ (./fetch_deps.sh: apt-get download + dpkg -x, no root))
ifneq ($(shell ./fetch_deps.sh .deps >&2 && echo ok),ok)
$(error deps: fetching failed (see above): install libcjson-dev libpcre2-dev check, or pass DEPS_PREFIX=dir)
endif
else
$(info deps: cJSON, PCRE2 and Check from .deps/ (fetched earlier by ./fetch_deps.sh))
endif
endif
endif
ifdef DEPS_PREFIX
override CFLAGS  += -I$(DEPS_PREFIX)/include
override LDFLAGS += -L$(DEPS_PREFIX)/lib/x86_64-linux-gnu -Wl,-rpath,$(DEPS_PREFIX)/lib/x86_64-linux-gnu
endif
LDLIBS  += -lcjson -lpcre2-8
CHECK_LIBS := -lcheck -lsubunit -lpthread -lrt -lm
override CFLAGS += $(SANFLAGS)
# The CPU kernels (ops_cpu.c in both precisions, fp8_cpu.c): with SAN=1 at -O3 and without the
# sanitizers, whose checks in their inner loops stop the vectorizer (instrumented, a training step
# runs 8 to 15 times slower and test_train_grpo alone takes over an hour on 2 cores). They are loops
# over buffers sized where those are allocated; make fuzz instruments them like the rest.
ifeq ($(SAN),1)
KCFLAGS = $(filter-out $(SANFLAGS),$(CFLAGS)) -O3
else
KCFLAGS = $(CFLAGS)
endif

# ---- probes: nvcc, then the GPU's architecture; one line each ----
ifeq ($(NO_CUDA),1)
NVCC :=
else
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
endif
ifeq ($(NVCC),)
$(info probe nvcc: not found (or NO_CUDA=1): building the CPU backend only)
HAVE_CUDA := 0
else
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVCC_VERSION := $(shell $(NVCC) --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
$(info probe nvcc: $(NVCC) (CUDA $(NVCC_VERSION)))
HAVE_CUDA := 1
GPU_CC := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '. ')
ifeq ($(GPU_ARCH),)
ifeq ($(GPU_CC),)
GPU_ARCH := all
$(info probe GPU: none found (nvidia-smi): compiling for sm_89, sm_90a and sm_120)
else
GPU_ARCH := $(if $(filter 90,$(GPU_CC)),90a,$(GPU_CC))
$(info probe GPU: compute capability $(GPU_CC): compiling for sm_$(GPU_ARCH))
endif
else
$(info probe GPU: GPU_ARCH=$(GPU_ARCH) given)
endif
ifeq ($(GPU_ARCH),all)
GENCODE := -gencode arch=compute_89,code=sm_89 -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_120,code=sm_120
else
GENCODE := -gencode arch=compute_$(GPU_ARCH),code=sm_$(GPU_ARCH)
endif
NVCCFLAGS ?= -O3 -lineinfo
NVCCFLAGS += -std=c++17 $(GENCODE) -I. -Xcompiler -fopenmp,-Wall,-Wno-unused-parameter
ifdef DEPS_PREFIX
NVCCFLAGS += -I$(DEPS_PREFIX)/include
# nvcc splits -Xlinker arguments at commas, so no -Wl,-rpath,dir here
NVLDFLAGS := -L$(DEPS_PREFIX)/lib/x86_64-linux-gnu -Xlinker -rpath=$(DEPS_PREFIX)/lib/x86_64-linux-gnu
endif
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart_static -lstdc++ -ldl -lrt -lpthread
# ---- NCCL (several GPUs): from a package, never from this tree. NCCL_HOME=dir (dir/include/nccl.h,
# dir/lib/libnccl.so*), else the system's (Debian/Ubuntu: libnccl-dev), else the pip wheel
# nvidia-nccl-cu13 (or -cu12) of python3 (nvidia/nccl/include, nvidia/nccl/lib). Without it the
# programs still run on several GPUs, their gradients through the host (slow): said here, once.
ifndef NCCL_HOME
ifeq ($(shell printf '\043include <nccl.h>\n' | $(CC) -E -I$(CUDA_HOME)/include -x c - >/dev/null 2>&1 && echo yes),yes)
NCCL_HOME := system
else
NCCL_HOME := $(shell python3 -c 'import nvidia.nccl as m, os; p = list(m.__path__)[0]; print(p if os.path.exists(p + "/include/nccl.h") else "")' 2>/dev/null)
endif
endif
ifeq ($(NCCL_HOME),)
$(info probe NCCL: not found: several GPUs work, through the host (slow); for NCCL: make NCCL_HOME=dir, or pip install nvidia-nccl-cu13 (README, "Several GPUs"))
else ifeq ($(NCCL_HOME),system)
$(info probe NCCL: nccl.h and libnccl of the system or of $(CUDA_HOME))
NCCL_FLAGS := -DHAVE_NCCL
NCCL_LIBS  := -lnccl
NCCL_NVLIBS := -lnccl
else
ifeq ($(wildcard $(NCCL_HOME)/include/nccl.h),)
$(error NCCL_HOME=$(NCCL_HOME) has no include/nccl.h: point it at the directory that holds include/ and lib/)
endif
NCCL_LIBFILE := $(firstword $(wildcard $(NCCL_HOME)/lib/libnccl.so $(NCCL_HOME)/lib/libnccl.so.2))
$(info probe NCCL: $(NCCL_HOME) ($(notdir $(NCCL_LIBFILE))))
NCCL_FLAGS := -DHAVE_NCCL -I$(NCCL_HOME)/include
NCCL_LIBS  := -L$(NCCL_HOME)/lib -Wl,-rpath,$(NCCL_HOME)/lib -l:$(notdir $(NCCL_LIBFILE))
# the same for nvcc's link lines (the GPU suites)
NCCL_NVLIBS := -L$(NCCL_HOME)/lib -Xlinker -rpath=$(NCCL_HOME)/lib -Xlinker -l:$(notdir $(NCCL_LIBFILE))
endif
# NCCL first, so that its directory is searched before CUDA's (which may hold another libnccl.so.2)
CUDA_LIBS := $(NCCL_LIBS) $(CUDA_LIBS)
# what nvcc's link lines (the GPU suites, the lab's CUDA programs) add after the library
NVLDLIBS := -lcjson -lpcre2-8 $(NCCL_NVLIBS) -lcublasLt -lcublas -lgomp -lm -lrt -lpthread
endif

# ---- sources ----
# the library: everything but the programs' mains. The lesson lies at the root (model, fp8, lora,
# grpo, tokenizer, rollout); the machinery in folders named for their job (README: the layout):
# core (what every file builds on), cpu and cuda (the two backends), train (the training recipes),
# io (file formats and the command line), text (Unicode for the tokenizer), tasks (data and
# rewards), dist (several processes). Includes name the folder: #include "cuda/fp8_cuda.h".
SRC_DIRS := core cpu cuda train io text tasks dist
STUBS   := cuda/backend_cuda_stub.c dist/dist_cuda_stub.c
LIB_C   := model.c model_alloc.c lora.c grpo.c dpo.c ppo.c tokenizer.c rollout.c $(filter-out $(STUBS),$(wildcard $(addsuffix /*.c,$(SRC_DIRS))))
LIB_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(notdir $(LIB_C)))
# the CPU reference kernels and backend again, in fp64 (backend "cpu64")
LIB_OBJ += $(BUILD)/ops_cpu64.o $(BUILD)/backend_cpu64.o
ifeq ($(HAVE_CUDA),1)
LIB_CU  := fp8.cu $(wildcard cuda/*.cu dist/*.cu)
LIB_OBJ += $(patsubst %.cu,$(BUILD)/%.o,$(notdir $(LIB_CU)))
LDLIBS  += $(CUDA_LIBS)
else  # the CUDA backend's and NCCL's stand-ins: the programs link, and say why they run on the CPU
LIB_OBJ += $(patsubst %.c,$(BUILD)/%.o,$(notdir $(STUBS)))
endif
LIB     := $(BUILD)/libfp8grpo.a
PROGS   := $(patsubst %.c,$(BIN)%,$(wildcard train_grpo.c train_sft.c train_dpo.c generate.c export.c))
HEADERS := $(wildcard *.h $(addsuffix /*.h,$(SRC_DIRS)) $(addsuffix /*.cuh,$(SRC_DIRS)))

VPATH := . $(SRC_DIRS) test

.PHONY: all test test-gpu clean bench-gemm bench-train bench-full bench-rollout bench-dp bench-grpo fuzz fuzz-run fuzz-replay
all: $(PROGS)

$(BUILD):
	@mkdir -p $(BUILD)

$(BUILD)/%.o: %.c $(HEADERS) | $(BUILD)
	$(CC) $(CFLAGS) -c $< -o $@
$(BUILD)/ops_cpu.o $(BUILD)/fp8_cpu.o: $(BUILD)/%.o: %.c $(HEADERS) | $(BUILD)
	$(CC) $(KCFLAGS) -c $< -o $@
$(BUILD)/ops_cpu64.o: cpu/ops_cpu.c $(HEADERS) | $(BUILD)
	$(CC) $(KCFLAGS) -DCPU_F64 -c $< -o $@
$(BUILD)/backend_cpu64.o: cpu/backend_cpu.c $(HEADERS) | $(BUILD)
	$(CC) $(CFLAGS) -DCPU_F64 -c $< -o $@
$(BUILD)/%.o: %.cu $(HEADERS) | $(BUILD)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
$(BUILD)/dist_cuda.o: dist/dist_cuda.cu $(HEADERS) | $(BUILD)
	$(NVCC) $(NVCCFLAGS) $(NCCL_FLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(PROGS): $(BIN)%: %.c $(LIB) $(HEADERS)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@

# ---- tests ----
# CPU suites: test/test_*.c (Check); each is one program; all must pass.
TESTS_CPU := $(patsubst test/%.c,$(BUILD)/%,$(wildcard test/test_*.c))
$(BUILD)/test_%: test/test_%.c test/testutil.h test/progutil.h test/fuzz/fuzz.h $(LIB) $(HEADERS)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) $(CHECK_LIBS) -o $@

# the reward program test_reward_program runs (--reward_cmd), at an absolute path the suite is built with
$(BUILD)/reward_prog: test/reward_prog.c $(LIB) $(HEADERS)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@
$(BUILD)/test_reward_program: $(BUILD)/reward_prog
$(BUILD)/test_reward_program: override CFLAGS += -DREWARD_PROG='"$(abspath $(BUILD))/reward_prog"'

# (SAN=1: run inside build-san/, where the suites' ./train_grpo, ./train_sft and ./generate are its own)
TEST_RUN := $(if $(BIN),cd $(BUILD) && FIXTURES=$(CURDIR)/test/fixtures UBSAN_OPTIONS=print_stacktrace=1,)
test: $(TESTS_CPU) $(PROGS)
	@set -e; total=0; \
	for t in $(TESTS_CPU); do \
	  echo "== $$t"; \
	  ($(TEST_RUN) $(CURDIR)/$$t) 2>&1 | tee $(BUILD)/last_test.log; rc=$${PIPESTATUS[0]}; \
	  if [ $$rc -ne 0 ]; then echo "FAILED: $$t (exit $$rc)"; exit 1; fi; \
	  n=$$(sed -n 's/.*Checks: \([0-9]*\).*/\1/p' $(BUILD)/last_test.log | awk '{s+=$$1} END {print s+0}'); \
	  total=$$((total + n)); \
	done; \
	echo "make test: all CPU suites passed, $$total checks"
SHELL := /bin/bash

# GPU suites: test/gpu_*.cu, run without Check's fork (a CUDA context does not survive fork)
ifeq ($(HAVE_CUDA),1)
TESTS_GPU := $(patsubst test/%.cu,$(BUILD)/%,$(wildcard test/gpu_*.cu))
$(BUILD)/gpu_%: test/gpu_%.cu test/testutil.h $(LIB) $(HEADERS)
	$(NVCC) $(NVCCFLAGS) $(NVLDFLAGS) $< $(LIB) -o $@ -lcheck -lsubunit $(NVLDLIBS)
test-gpu: $(TESTS_GPU)
	@set -e; for t in $(TESTS_GPU); do echo "== $$t"; CK_FORK=no $$t; done; echo "make test-gpu: all GPU suites passed"
endif

# ---- dev/: the lab, never linked into the programs, built into $(BUILD)/ against the library with
# this file's probes and flags: the tokenizer benchmark on every machine; where nvcc is, the
# benchmarks (dev/*.c, on the CUDA runtime), the FP8 GEMM's versions and the CUDA tools
# (dev/cuda/*.cu, dev/bench_gemm.cu); the kernel tracer where CUPTI is. make dev builds them all, and checks the lab's scripts' syntax (bash -n;
# python3's compile where python3 is): CI runs it, so an API change that breaks the lab fails there.
# (dev/Makefile forwards make -C dev ... here.)
DEV_CPU  := $(BUILD)/bench_tokenizer
DEV_BINS := $(DEV_CPU)
$(DEV_CPU): $(BUILD)/%: dev/%.c $(LIB) $(HEADERS)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@
ifeq ($(HAVE_CUDA),1)
# the benchmarks in C, on the CUDA runtime's API (events, memory)
DEV_C    := $(filter-out $(DEV_CPU) $(BUILD)/kernel_trace,$(patsubst dev/%.c,$(BUILD)/%,$(wildcard dev/*.c)))
DEV_BINS += $(DEV_C)
$(DEV_C): $(BUILD)/%: dev/%.c $(LIB) $(HEADERS) $(wildcard dev/*.h)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@
DEV_CU   := $(patsubst dev/cuda/%.cu,$(BUILD)/%,$(wildcard dev/cuda/*.cu)) $(BUILD)/bench_gemm
DEV_BINS += $(DEV_CU)
# each from its own source (dev/cuda/NAME.cu, or dev/bench_gemm.cu), rebuilt when that changes
.SECONDEXPANSION:
$(DEV_CU): $(BUILD)/%: $$(firstword $$(wildcard dev/cuda/$$*.cu dev/$$*.cu)) $(LIB) $(HEADERS) dev/cuda/common.cuh
	$(NVCC) $(NVCCFLAGS) $(NVLDFLAGS) $< $(LIB) -o $@ $(NVLDLIBS)
ifneq ($(wildcard $(CUDA_HOME)/include/cupti.h),)
DEV_BINS += $(BUILD)/kernel_trace.so
endif
$(BUILD)/kernel_trace.so: dev/kernel_trace.c | $(BUILD)
	$(CC) -O2 -shared -fPIC $< -o $@ -I$(CUDA_HOME)/include -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcupti
endif
.PHONY: dev dev-scripts
dev: $(DEV_BINS) dev-scripts
	@echo "make dev: $(words $(DEV_BINS)) lab programs built$(if $(filter 1,$(HAVE_CUDA)),, (no nvcc: the CUDA ones skipped))"
dev-scripts:
	@set -e; for f in dev/*.sh; do bash -n $$f; done; \
	if command -v python3 >/dev/null; then python3 -c 'import sys, ast; [ast.parse(open(f).read(), f) for f in sys.argv[1:]]' dev/*.py test/fuzz/*.py; fi

# the benchmarks and the lab's checks by name
bench-gemm bench-train bench-full bench-rollout bench-dp bench-grpo: bench-%: $(BUILD)/bench_%
ifeq ($(HAVE_CUDA),1)
# each FP8 GEMM version's validation on the GPU (partial tiles, more tiles than SMs: dev/cuda/common.cuh); stops at
# the first failure (the Hopper versions need an sm_90a GPU and build)
DEV_VERSIONS := $(patsubst dev/cuda/%.cu,$(BUILD)/%,$(sort $(wildcard dev/cuda/fp8_gemm_v*.cu)))
dev-check: $(DEV_VERSIONS)
	@set -e; for v in $(DEV_VERSIONS); do echo "== $$v --validate"; $$v --validate; done; \
	echo "make dev-check: every FP8 GEMM version within its tolerance"
else
test-gpu dev-check:
	@echo "no nvcc: the GPU suites need the CUDA toolkit (and a GPU to run)"; exit 1
endif

# ---- fuzz targets: test/fuzz/fuzz_<target>.c, one per loader (test/fuzz/README.md) ----
# Each defines LLVMFuzzerTestOneInput. fuzz-replay links it with test/fuzz/replay.c (a main that
# runs every file of the corpus directories given) and runs it over test/fuzz/corpus/<target>/;
# with SAN=1 under the sanitizers (what CI runs). make fuzz builds it with clang's libFuzzer, ASan
# and UBSan into build-fuzz/ (FUZZ=1) and runs each target FUZZ_SECONDS: new inputs go to
# build-fuzz/corpus/<target>/ (the committed corpus is read, never written), crashes to
# build-fuzz/artifacts/, the log to build-fuzz/<target>.log; a table of executions last, and a
# non-zero exit when there were findings. (ASan's quarantine of freed memory is 16 MB instead of
# 256: a third faster.)
FUZZ_TARGETS ?= safetensors model tokenizer jsonl peft resume
FUZZ_SECONDS ?= 60
FUZZ_BINS := $(patsubst %,$(BUILD)/fuzz_%,$(FUZZ_TARGETS))
ifeq ($(FUZZ),1)
$(BUILD)/fuzz_%: test/fuzz/fuzz_%.c $(wildcard test/fuzz/*.h) $(LIB) $(HEADERS)
	$(CC) $(CFLAGS) -fsanitize=fuzzer $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@
else
$(BUILD)/fuzz_%: test/fuzz/fuzz_%.c $(wildcard test/fuzz/*.h) test/fuzz/replay.c $(LIB) $(HEADERS)
	$(CC) $(CFLAGS) $(LDFLAGS) $< test/fuzz/replay.c $(LIB) $(LDLIBS) -o $@
endif
fuzz-replay: $(FUZZ_BINS)
	@set -e; for t in $(FUZZ_TARGETS); do $(BUILD)/fuzz_$$t test/fuzz/corpus/$$t; done
fuzz:
	@command -v clang >/dev/null || { echo "make fuzz needs clang and libFuzzer (Debian: apt-get install clang libclang-rt-dev)"; exit 1; }
	$(MAKE) FUZZ=1 fuzz-run
fuzz-run: $(FUZZ_BINS)
	@mkdir -p $(BUILD)/artifacts; touch $(BUILD)/fuzz-run.start; \
	for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(BUILD)/corpus/$$t; \
	  echo "== fuzz_$$t for $(FUZZ_SECONDS) s (log: $(BUILD)/$$t.log)"; \
	  t0=$$(date +%s); \
	  ASAN_OPTIONS=$${ASAN_OPTIONS:-quarantine_size_mb=16} \
	  $(BUILD)/fuzz_$$t $(BUILD)/corpus/$$t test/fuzz/corpus/$$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 \
	    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=$(BUILD)/artifacts/$$t- \
	    $$([ -f test/fuzz/$$t.dict ] && echo -dict=test/fuzz/$$t.dict) > $(BUILD)/$$t.log 2>&1 || true; \
	  echo $$(( $$(date +%s) - t0 )) > $(BUILD)/$$t.seconds; \
	done; \
	printf '%-12s %8s %12s %8s %9s\n' target seconds executions exec/s findings; n=0; \
	for t in $(FUZZ_TARGETS); do \
	  runs=$$(sed -n 's/^stat::number_of_executed_units: *//p' $(BUILD)/$$t.log); \
	  [ -n "$$runs" ] || runs=$$(sed -n 's/^#\([0-9]*\).*/\1/p' $(BUILD)/$$t.log | tail -n1); \
	  secs=$$(cat $(BUILD)/$$t.seconds); \
	  found=$$(find $(BUILD)/artifacts -name "$$t-*" -newer $(BUILD)/fuzz-run.start | wc -l); n=$$((n + found)); \
	  printf '%-12s %8s %12s %8s %9s\n' $$t $$secs "$$runs" $$(( $${runs:-0} / ($$secs > 0 ? $$secs : 1) )) $$found; \
	done; \
	if [ $$n -gt 0 ]; then echo "make fuzz: $$n findings in $(BUILD)/artifacts/ (see the logs)"; exit 1; fi

clean:
	rm -rf build build-san build-fuzz $(PROGS)
