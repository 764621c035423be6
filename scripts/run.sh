#!/usr/bin/env bash
# One entry point for newcomers and CI: sets everything up, then runs a job.
#
#   scripts/run.sh demo    set up, build, run the example of a model on brick (the main job)
#   scripts/run.sh test    set up, build with the C++ tests, run GoogleTest (CTest) and pytest
#   scripts/run.sh bench   set up, build, run the benchmarks
#   scripts/run.sh sanitize  build and run the C++ suites under ASan+UBSan and TSan (also part of
#                            `test`; BRICK_SKIP_SANITIZERS=1 skips them there)
#   scripts/run.sh torch-lane VERSION  build and run GoogleTest and pytest against another PyTorch
#                            release in its own virtual environment (`test` runs it for
#                            $BRICK_TORCH_LANES, default 2.14.1; BRICK_TORCH_LANES= skips it)
#   scripts/run.sh gpu [STEP...]  on a machine with an NVIDIA GPU and a CUDA build of PyTorch (no
#                            network needed): build with every core, then the CUDA GoogleTests,
#                            the CUDA-backing tests, the whole pytest suite, the decode demo on
#                            CUDA-backed brick in event/immediate/deferred mode, bench_cuda.py
#                            and bench_distributed.py (NCCL);
#                            each step bounded in time, its log in $BRICK_LOG_DIR (default
#                            build/gpu-logs), one summary line per step. STEPs: build gtest cuda
#                            pytest demo bench (default: all, in that order)
#
# Uses the torch already installed, else installs torch==2.13.0 (never an open-ended torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUILD_DIR=${BRICK_BUILD_DIR:-build/release}
export BRICK_BUILD_DIR="$PWD/$BUILD_DIR"

log() { printf '\n== %s\n' "$*"; }

setup_system() {
  local missing=()
  command -v cmake >/dev/null || missing+=(cmake)
  command -v ninja >/dev/null || missing+=(ninja-build)
  [ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
  [ -f /usr/include/benchmark/benchmark.h ] || missing+=(libbenchmark-dev)
  command -v clang-format >/dev/null || missing+=(clang-format)
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      log "installing system packages: ${missing[*]}"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
      echo "missing system packages: ${missing[*]} (install them, e.g. with apt-get)" >&2
      exit 1
    fi
  fi
}

setup_python() {
  if ! TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PYTHON" -c "import torch" 2>/dev/null; then
    log "installing torch==2.13.0"
    "$PYTHON" -m pip install -q torch==2.13.0
  fi
  # The build needs setuptools >= 64 (editable installs through pyproject.toml).
  if ! "$PYTHON" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 64)" 2>/dev/null; then
    log "installing setuptools>=64"
    "$PYTHON" -m pip install -q "setuptools>=64" wheel
  fi
  local wanted=()
  for module in pytest pytest_timeout numpy expecttest hypothesis; do
    TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PYTHON" -c "import $module" 2>/dev/null || wanted+=("${module//_/-}")
  done
  if [ ${#wanted[@]} -gt 0 ]; then
    log "installing ${wanted[*]}"
    "$PYTHON" -m pip install -q "${wanted[@]}" || echo "could not install ${wanted[*]}; continuing" >&2
  fi
  # transformers models run on brick in the tests (small random configs, no downloads). Pinned:
  # its dependencies never include torch.
  if ! TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PYTHON" -c "import transformers" 2>/dev/null; then
    log "installing transformers"
    "$PYTHON" -m pip install -q "transformers==5.24.0" ||
      echo "could not install transformers; its tests will skip" >&2
  fi
  # accelerate runs transformers' Trainer. It declares torch: installed without its
  # dependencies (psutil, pyyaml, safetensors, huggingface_hub come with the packages above).
  if ! TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PYTHON" -c "import accelerate" 2>/dev/null; then
    log "installing accelerate"
    "$PYTHON" -m pip install -q psutil pyyaml && "$PYTHON" -m pip install -q --no-deps "accelerate==1.15.0" ||
      echo "could not install accelerate; the Trainer tests will skip" >&2
  fi
  # HolisticTraceAnalysis loads brick's traces in the tests. Its declared dependencies pull in
  # jupyterlab; it imports only these, so it is installed without them.
  if ! TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PYTHON" -c "import hta.trace_analysis" 2>/dev/null; then
    log "installing HolisticTraceAnalysis"
    "$PYTHON" -m pip install -q pandas plotly networkx pydot psutil pyyaml &&
      "$PYTHON" -m pip install -q --no-deps HolisticTraceAnalysis ||
      echo "could not install HolisticTraceAnalysis; its test will skip" >&2
  fi
}

# The C++ suites under sanitizers, each in its own build folder: AddressSanitizer +
# UndefinedBehaviorSanitizer (LeakSanitizer included) over every GoogleTest suite, and
# ThreadSanitizer over the runtime and registry suites (plain C++, no torch).
sanitize() {
  local asan="$PWD/build/asan" tsan="$PWD/build/tsan"
  log "GoogleTest under AddressSanitizer + UndefinedBehaviorSanitizer ($asan)"
  cmake -S . -B "$asan" -G Ninja -DPython_EXECUTABLE="$(command -v "$PYTHON")" \
    -DBRICK_BUILD_TESTS=ON -DBRICK_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$asan"
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
    ctest --test-dir "$asan" --output-on-failure -j 2
  log "GoogleTest under ThreadSanitizer ($tsan)"
  cmake -S . -B "$tsan" -G Ninja -DBRICK_WITH_TORCH=OFF -DBRICK_BUILD_TESTS=ON \
    -DBRICK_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$tsan"
  TSAN_OPTIONS=halt_on_error=1 ctest --test-dir "$tsan" --output-on-failure -j 2
}

# Another PyTorch release, in its own virtual environment (build/torch-VERSION/venv) and its own
# copy of the working tree (build/torch-VERSION/src: the built module sits beside the sources, so
# two builds of one tree would overwrite each other): the extension is built against that release
# and every C++ and Python suite runs there. The release is pinned: pip never chooses a torch.
torch_lane() {
  local version=$1 lane="$PWD/build/torch-$1"
  local venv="$lane/venv" src="$lane/src" build="$lane/build"
  log "lane torch==$version ($lane)"
  if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
    log "installing torch==$version into $venv"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q "torch==$version" "setuptools>=64" wheel
  fi
  PYTHON="$venv/bin/python" setup_python
  rm -rf "$src" && mkdir -p "$src"
  git ls-files -co --exclude-standard -z | tar -c --null -T - -f - | tar -x -C "$src"
  (
    cd "$src"
    export BRICK_BUILD_DIR="$build"  # outside the copy: rebuilt incrementally (tar keeps mtimes)
    log "building torch_brickdev against torch==$version"
    BRICK_BUILD_TESTS=1 "$venv/bin/python" -m pip install -q --no-build-isolation --no-deps -e .
    log "GoogleTest (CTest), torch==$version"
    ctest --test-dir "$BRICK_BUILD_DIR" --output-on-failure -j 2
    log "pytest, torch==$version"
    PYTHON="$venv/bin/python" run_pytest "${@:2}"
  )
}

build() {
  log "building torch_brickdev (CMake, $BUILD_DIR)"
  BRICK_BUILD_TESTS=${1:-0} "$PYTHON" -m pip install -q --no-build-isolation --no-deps -e .
}

# The whole pytest suite with $PYTHON, with SIGINT ignored, as a CI runner or scheduler may
# start the job (a background job of a non-interactive shell): the disposition is inherited
# across exec, so this proves that no test waits for an interrupt that never comes. Each test is
# bounded by pytest-timeout.
run_pytest() {
  (trap '' INT; exec "$PYTHON" -m pytest tests/python -q "$@")
}

# One step of the GPU job: `gpu_step NAME SECONDS command...` runs the command bounded in time,
# its output in $logs/NAME.log, and prints (and appends to summary.txt) one line: the verdict, the
# seconds it took and the log's last line (pytest's counts, the contract's verdict, ...).
gpu_step() {
  local name=$1 limit=$2 start rc verdict
  shift 2
  start=$(date +%s)
  set +e
  timeout --kill-after=15 "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  set -e
  case $rc in
    0) verdict=ok ;;
    124 | 137) verdict="TIMED OUT after ${limit} s" ;;
    *) verdict="FAILED (exit $rc)" ;;
  esac
  printf 'gpu %-16s %-22s %4ss  %s\n' "$name" "$verdict" "$(($(date +%s) - start))" \
    "$(grep -v '^[[:space:]]*$' "$logs/$name.log" | tail -n 1 | cut -c1-160)" | tee -a "$logs/summary.txt"
  [ $rc = 0 ] || failures=$((failures + 1))
}

gpu() {
  logs=${BRICK_LOG_DIR:-$PWD/build/gpu-logs}
  mkdir -p "$logs"
  : >"$logs/summary.txt"
  failures=0
  local steps=("$@") cores
  [ ${#steps[@]} -gt 0 ] || steps=(build gtest cuda pytest demo bench)
  cores=$(nproc)
  # No network there: nothing is installed, what is missing is said.
  for tool in cmake nvidia-smi; do
    command -v "$tool" >/dev/null || { echo "gpu: $tool not found" >&2; exit 1; }
  done
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt"
  "$PYTHON" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda); \
assert torch.cuda.is_available(), 'this PyTorch sees no CUDA GPU'" | tee -a "$logs/gpu.txt"
  export BRICK_RUNTIME=cuda  # a build or machine that falls back to the host runtime fails loudly
  for step in "${steps[@]}"; do
    case $step in
      build) gpu_step build 540 env BRICK_BUILD_TESTS=1 CMAKE_BUILD_PARALLEL_LEVEL="$cores" \
        "$PYTHON" -m pip install --no-build-isolation --no-deps --no-index -e . ;;
      gtest) gpu_step gtest 180 ctest --test-dir "$BRICK_BUILD_DIR" --output-on-failure -j "$cores" ;;
      cuda) gpu_step cuda-tests 300 "$PYTHON" -m pytest tests/python/test_cuda_backing.py -q -rs ;;
      pytest) gpu_step pytest 560 bash -c "trap '' INT; exec \"$PYTHON\" -m pytest tests/python -q --timeout 300" ;;
      demo)
        for mode in event immediate deferred; do
          gpu_step "demo-$mode" 200 "$PYTHON" -m torch_brickdev demo --sync-mode "$mode" --runs 3 \
            --no-progress -o "$logs/demo-$mode"
        done ;;
      bench)
        gpu_step bench-cuda 400 "$PYTHON" benchmarks/bench_cuda.py
        # NCCL on brick's memory vs plain cuda tensors: one rank per GPU.
        gpu_step bench-distributed 300 "$PYTHON" benchmarks/bench_distributed.py \
          --nproc "$(nvidia-smi -L | wc -l)" --rounds 7 ;;
      *) echo "gpu: unknown step $step (build gtest cuda pytest demo bench)" >&2; exit 2 ;;
    esac
  done
  echo "gpu: $failures step(s) failed; logs in $logs"
  [ "$failures" = 0 ]
}

job=${1:-}
case "$job" in
  demo)
    setup_system; setup_python; build 0
    log "python -m torch_brickdev demo"
    "$PYTHON" -m torch_brickdev demo "${@:2}"
    ;;
  test)
    setup_system; setup_python
    log "clang-format check"
    clang-format --dry-run -Werror csrc/*/*.h csrc/*/*.cpp tests/cpp/*.h tests/cpp/*.cpp benchmarks/*.cpp
    build 1
    log "GoogleTest (CTest)"
    ctest --test-dir "$BRICK_BUILD_DIR" --output-on-failure -j 2
    log "pytest (SIGINT ignored)"
    run_pytest "${@:2}"
    if [ "${BRICK_SKIP_SANITIZERS:-0}" != 1 ]; then sanitize; fi
    for version in ${BRICK_TORCH_LANES-2.14.1}; do torch_lane "$version" "${@:2}"; done
    ;;
  sanitize)
    setup_system; setup_python
    sanitize
    ;;
  torch-lane)
    [ -n "${2:-}" ] || { echo "usage: scripts/run.sh torch-lane VERSION [pytest args...]" >&2; exit 2; }
    setup_system; torch_lane "${@:2}"
    ;;
  bench)
    setup_system; setup_python; build 0
    # valgrind counts instructions beside the times (bench_ops, bench_profiler); optional.
    if ! command -v valgrind >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null ||
        echo "could not install valgrind; instruction counts will be skipped" >&2
    fi
    log "benchmarks: brick vs CPU per op"
    "$PYTHON" benchmarks/bench_ops.py
    log "benchmarks: profiler overhead"
    "$PYTHON" benchmarks/bench_profiler.py
    log "benchmarks: registry under concurrent resets (8 threads x 100k ops, exact counts)"
    "$PYTHON" benchmarks/stress_concurrency.py
    log "benchmarks: memory over 1M profiled ops (RSS and device events bounded)"
    "$PYTHON" benchmarks/stress_memory.py
    log "benchmarks: torch.compile on brick vs on the CPU"
    "$PYTHON" benchmarks/bench_compile.py
    "$PYTHON" benchmarks/bench_distributed.py
    log "benchmarks: brick on CUDA vs plain cuda (skips without a CUDA-backed brick)"
    "$PYTHON" benchmarks/bench_cuda.py
    if [ -x "$BRICK_BUILD_DIR/registry_bench" ]; then
      log "benchmarks: registry start/stop (Google Benchmark)"
      "$BRICK_BUILD_DIR/registry_bench" --benchmark_min_time=0.2
    fi
    ;;
  gpu)
    gpu "${@:2}"
    ;;
  *)
    echo "usage: scripts/run.sh demo|test|bench|sanitize|torch-lane|gpu [args...]" >&2
    exit 2
    ;;
esac
