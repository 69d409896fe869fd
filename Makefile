# The README's two commands. Both install what a fresh Debian 12 machine
# lacks (apt, idempotent: nothing is installed when everything is present),
# build with 2 jobs, then run.
#
#   make run    build and start attnaudit-server on the embedded defaults
#               (CPU backend, data under ./var, gRPC localhost:50051,
#               metrics localhost:9464)
#   make test   build and run every test (ctest)

BUILD_DIR ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
SERVER_FLAGS ?=

# Debian 12 packages the build and the tests need.
APT_PACKAGES := build-essential cmake pkg-config git python3 \
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
  libabsl-dev prometheus-cpp-dev libsqlite3-dev libssl-dev \
  libcli11-dev libspdlog-dev \
  libgtest-dev libgmock-dev libbenchmark-dev prometheus curl openssl

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps build run test bench demo clean

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

bench: build
	$(BUILD_DIR)/bin/attnaudit_bench_check

clean:
	rm -rf $(BUILD_DIR)
