# The README's two commands. Both install what a fresh Debian 12 machine
# lacks (apt, idempotent: nothing is installed when everything is present),
# build with 2 jobs, then run.
#
#   make run    build and start attnaudit-server on the embedded defaults
#               (CPU backend, data under ./var, gRPC localhost:50051,
#               metrics localhost:9464)
#   make test   build and run every test (ctest; the Python client's tests
#               build build/py-venv from pinned PyPI packages)
#   make py-venv       the Python client in build/py-venv (pinned, no torch)
#   make bench-python  the Python client benchmark (build/py-bench-venv with
#                      torch from PyPI, about 3 GB of downloads the first time)
#   make bench  every benchmark of docs/PERF.md (see the bench targets below)

BUILD_DIR ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
SERVER_FLAGS ?=

# Debian 12 packages the build and the tests need (python3-venv: the
# Python client's tests run in a virtual environment).
APT_PACKAGES := build-essential cmake pkg-config git python3 python3-venv \
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
  libabsl-dev libtbb-dev libhwy-dev prometheus-cpp-dev libsqlite3-dev libssl-dev \
  libcli11-dev libspdlog-dev \
  libgtest-dev libgmock-dev libbenchmark-dev prometheus curl openssl \
  python3-yaml

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps build run test bench bench-check bench-env bench-peers \
  bench-sweeps bench-server bench-diagnosis demo clean py-venv bench-python

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

build: deps $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j $(JOBS)

run: build
	@mkdir -p var
	@if [ -x $(BUILD_DIR)/bin/attnaudit-server ]; then \
	  exec $(BUILD_DIR)/bin/attnaudit-server $(SERVER_FLAGS); \
	else \
	  $(MAKE) --no-print-directory demo; \
	fi

# Offline demo: synthesise a W1 snapshot and audit it without a server.
demo: build
	@mkdir -p var
	$(BUILD_DIR)/bin/attnaudit synth --preset llama3-8b --batch 8 --context 4096 --permute-pages -o var/w1.pb
	$(BUILD_DIR)/bin/attnaudit check var/w1.pb

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900

# Benchmarks (docs/PERF.md has the method and figures of each). Results are
# printed as markdown and written as JSON to $(BENCH_OUT); temporary
# snapshots go to $(BENCH_TMP) (up to 512 MiB at a time) and are deleted.
# Run times on the 2-core dev VM:
#   bench-check   C++ W1 stages vs the floor                       ~20 s
#   bench-peers   attnaudit check vs numpy / torch                 ~30 s
#                 (RLKERNEL=/path/to/checkout adds the RL-Kernel harness:
#                 ~8 s per run, 5 runs); the first run builds bench-env
#   bench-sweeps  context / tokens / batch sweeps, up to 128k      ~1 min
#   bench-server  small-snapshot audits/s through the server       ~1.5 min
#   bench-diagnosis  the statistical detector and the diagnosis:
#                 200 faulty snapshots per fault class, 2,000 clean ones
#                 across engine kinds, the W1 cost, then 10,000 small clean
#                 audits for the false-alarm rate                 ~30 min
#   bench-env     the peers' venv, pinned PyPI packages: ~6 min and 5.4 GiB
#                 the first time (PyPI's torch wheel brings CUDA libraries)
# REPEATS sets the timed runs per measurement.
BENCH_VENV := $(BUILD_DIR)/bench-venv
BENCH_OUT := $(BUILD_DIR)/bench-results
BENCH_TMP := $(BUILD_DIR)/bench-tmp
REPEATS ?= 5
RLKERNEL ?=

bench: bench-check bench-peers bench-sweeps bench-server bench-diagnosis

bench-diagnosis: build
	$(BUILD_DIR)/bin/attnaudit_bench_diagnosis --clean 2000 --faulty 200 --w1 --threads 2
	$(BUILD_DIR)/bin/attnaudit_bench_diagnosis --clean 10000 --faulty 0 --small --seed 77

bench-check: build
	$(BUILD_DIR)/bin/attnaudit_bench_floor --sweep
	$(BUILD_DIR)/bin/attnaudit_bench_check --repeats 9 --markdown

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

bench-peers: build bench-env
	@mkdir -p $(BENCH_OUT) $(BENCH_TMP)
	$(BENCH_VENV)/bin/python bench/peers/peers.py --bin-dir $(BUILD_DIR)/bin \
	  --repeats $(REPEATS) --workdir $(BENCH_TMP) --json $(BENCH_OUT)/peers.json \
	  $(if $(RLKERNEL),--rlkernel $(RLKERNEL))

bench-sweeps: build
	@mkdir -p $(BENCH_OUT) $(BENCH_TMP)
	python3 bench/sweeps/sweeps.py --bin-dir $(BUILD_DIR)/bin \
	  --repeats $(REPEATS) --workdir $(BENCH_TMP) --json $(BENCH_OUT)/sweeps.json

bench-server: build
	@mkdir -p $(BENCH_OUT) $(BENCH_TMP)
	python3 bench/sweeps/server_rate.py --bin-dir $(BUILD_DIR)/bin \
	  --workdir $(BENCH_TMP) --json $(BENCH_OUT)/server_rate.json

PYTHON ?= python3
PY_VENV := $(BUILD_DIR)/py-venv
PY_BENCH_VENV := $(BUILD_DIR)/py-bench-venv

py-venv: deps
	bash client/python/scripts/make_venv.sh $(PY_VENV) $(PYTHON) client/python/requirements/test.txt

# The hook's cost per decode step (docs/PERF.md "Python client"), against a
# real attnaudit-server started by the script.
bench-python: build
	bash client/python/scripts/make_venv.sh $(PY_BENCH_VENV) $(PYTHON) client/python/requirements/bench.txt
	$(PY_BENCH_VENV)/bin/python bench/python_client/bench_hook.py \
	  --server $(BUILD_DIR)/bin/attnaudit-server

clean:
	rm -rf $(BUILD_DIR)
