#!/usr/bin/env bash
# One entry point for newcomers and CI: sets everything up, then runs a job.
#
#   scripts/run.sh demo    set up, build, run the example of a model on brick (the main job)
#   scripts/run.sh test    set up, build with the C++ tests, run GoogleTest (CTest) and pytest
#   scripts/run.sh bench   set up, build, run the benchmarks
#   scripts/run.sh sanitize  build and run the C++ suites under ASan+UBSan and TSan (also part of
#                            `test`; BRICK_SKIP_SANITIZERS=1 skips them there)
#   scripts/run.sh torch-lane VERSION [pytest args]  build against another PyTorch release in its
#                            own virtual environment, run GoogleTest and the Python tests of
#                            LANE_TESTS there (or those the arguments select) (`test` runs it for
#                            $BRICK_TORCH_LANES, default 2.14.1; BRICK_TORCH_LANES= skips it)
#   scripts/run.sh gpu       the GPU machine's job (docs/gpu-job.md), one command within 8 minutes,
#                            no network: preflight, build with every core, a smoke step, the
#                            GoogleTests, test_cuda_backing.py, the demo in event mode,
#                            bench_cuda.py; each step bounded, logs in $BRICK_LOG_DIR (default
#                            build/gpu-logs), one summary line per step. `gpu --more`: the rest
#                            (other sync modes, NCCL, the whole suite). `gpu --rehearse`: the same
#                            job here on the host runtime (`test` runs it).
#   scripts/run.sh gpu-prepare  copies what the GPU machine lacks (GoogleTest's sources) into
#                            build/carry/ for the device tool to carry
#   scripts/run.sh compile-lane VERSION  compiles everything against another PyTorch release's
#                            headers without importing it (`test` runs it for 2.11.0, the GPU
#                            machines' release: $BRICK_COMPILE_LANES)
#
# Uses the torch already installed, else installs torch==2.13.0 (never an open-ended torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUILD_DIR=${BRICK_BUILD_DIR:-build/release}
export BRICK_BUILD_DIR="$PWD/$BUILD_DIR"
# What outlives a clone: the torch lanes' virtual environments, the compiler cache.
CACHE_ROOT="${BRICK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/torch_brickdev}"

# Each `log` line starts a stage; at exit the job prints the seconds each stage took (subshells'
# stages too: they append to the same file), so where a run's time went is in its own output.
STAGE_TIMES=$(mktemp "${TMPDIR:-/tmp}/brick-stages.XXXXXX")
log() {
  printf '\n== %s\n' "$*"
  printf '%s\t%s\n' "$(date +%s)" "$*" >>"$STAGE_TIMES"
}
print_stage_times() {
  local rc=$?
  if [ -s "$STAGE_TIMES" ]; then
    printf '\n== time per stage (s), exit status %s\n' "$rc"
    awk -F'\t' -v end="$(date +%s)" '
      NR > 1 { printf "%6d  %s\n", $1 - start, name }
      { start = $1; name = $2; if (NR == 1) first = $1 }
      END { if (NR) { printf "%6d  %s\n%6d  in all\n", end - start, name, end - first } }
    ' "$STAGE_TIMES"
  fi
  rm -f "$STAGE_TIMES"
  return "$rc"
}
trap print_stage_times EXIT

# System packages, by what the job needs: `build` (the main job: CMake and Ninja), `test` (also
# GoogleTest, Google Benchmark, clang-format, tmux, which drives top's terminal view in the tests,
# and ccache for the many builds of the test command). Only what is missing is installed, with
# apt-get where this is root.
setup_system() {
  local missing=()
  command -v cmake >/dev/null || missing+=(cmake)
  command -v ninja >/dev/null || missing+=(ninja-build)
  if [ "$1" = test ]; then
    [ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
    [ -f /usr/include/benchmark/benchmark.h ] || missing+=(libbenchmark-dev)
    command -v clang-format >/dev/null || missing+=(clang-format)
    command -v tmux >/dev/null || missing+=(tmux)
    command -v nm >/dev/null || missing+=(binutils)  # the compile lane's symbol check
    # ccache (use_compiler_cache) is optional: installed where apt-get can, never required
    if ! command -v ccache >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      missing+=(ccache)
    fi
  fi
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

# Every build below compiles through ccache where it is installed (setup_system installs it), its
# cache outside the tree ($CACHE_ROOT/ccache): a fresh clone's builds (release, sanitizers, the
# lanes) reuse the compilations of the sources that did not change since an earlier run, in this
# clone or another. The object files are the compiler's own; only a source, flag or header change
# compiles again. Paths inside the tree are hashed relative to it (CCACHE_BASEDIR), and the
# sanitizer builds' debug information names files relative to it (-fdebug-prefix-map), so the
# cache serves any clone's location. The PCH sloppiness is what ccache asks for CMake's
# precompiled headers; the mtime ones let a fresh clone's headers (all just written) hit.
# CMake takes the launchers from the environment when it configures a build folder first.
use_compiler_cache() {
  command -v ccache >/dev/null || return 0
  export CCACHE_DIR="${CCACHE_DIR:-$CACHE_ROOT/ccache}"
  export CCACHE_BASEDIR="$PWD"
  export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CMAKE_CUDA_COMPILER_LAUNCHER=ccache
}

# Whether $PYTHON has MODULE, found without importing it (importing each client library, torch
# with it, cost a torch lane's set-up most of a minute); a dotted name's parents are imported.
installed() {
  "$PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)" "$1" 2>/dev/null
}

# Python packages, by what the job needs: `build` (torch and setuptools: the main job), `test`
# (also pytest and its plugins, and the libraries the tests run on brick).
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
  [ "$1" = test ] || return 0
  local wanted=()
  for module in pytest pytest_timeout numpy expecttest hypothesis; do
    installed "$module" || wanted+=("${module//_/-}")
  done
  # pytest-xdist: run_pytest runs the tests that measure no time in parallel.
  installed xdist || wanted+=(pytest-xdist)
  if [ ${#wanted[@]} -gt 0 ]; then
    log "installing ${wanted[*]}"
    "$PYTHON" -m pip install -q "${wanted[@]}" || echo "could not install ${wanted[*]}; continuing" >&2
  fi
  # transformers models run on brick in the tests (small random configs, no downloads). Pinned:
  # its dependencies never include torch.
  if ! installed transformers; then
    log "installing transformers"
    "$PYTHON" -m pip install -q "transformers==5.24.0" ||
      echo "could not install transformers; its tests will skip" >&2
  fi
  # accelerate runs transformers' Trainer. It declares torch: installed without its
  # dependencies (psutil, pyyaml, safetensors, huggingface_hub come with the packages above).
  if ! installed accelerate; then
    log "installing accelerate"
    "$PYTHON" -m pip install -q psutil pyyaml && "$PYTHON" -m pip install -q --no-deps "accelerate==1.15.0" ||
      echo "could not install accelerate; the Trainer tests will skip" >&2
  fi
  # PyTorch Lightning trains on brick in the tests (Trainer(accelerator="brick")). Lightning
  # and torchmetrics declare torch: installed without their dependencies, which come first.
  if ! installed lightning || ! installed torchmetrics; then
    log "installing lightning"
    "$PYTHON" -m pip install -q fsspec tqdm packaging pyyaml typing-extensions \
      "lightning-utilities==0.15.3" &&
      "$PYTHON" -m pip install -q --no-deps "lightning==2.6.0" "torchmetrics==1.8.2" ||
      echo "could not install lightning; its tests will skip" >&2
  fi
  # torchvision's models train on brick in the tests. Its wheels are built for one torch release
  # each (and against CUDA): the 2.14 lane's torch is such a build, so it gets the matching
  # release, pinned, without dependencies (pillow pinned beside it). Elsewhere its tests skip.
  if "$PYTHON" -c "import sys; from importlib.metadata import version; sys.exit(not version('torch').startswith('2.14.'))" 2>/dev/null &&
    ! installed torchvision; then
    log "installing torchvision"
    "$PYTHON" -m pip install -q --no-deps "torchvision==0.29.1" "pillow==11.3.0" ||
      echo "could not install torchvision; its tests will skip" >&2
  fi
  # HolisticTraceAnalysis loads brick's traces in the tests. Its declared dependencies pull in
  # jupyterlab; it imports only these, so it is installed without them.
  if ! installed hta; then
    log "installing HolisticTraceAnalysis"
    "$PYTHON" -m pip install -q pandas plotly networkx pydot psutil pyyaml &&
      "$PYTHON" -m pip install -q --no-deps HolisticTraceAnalysis ||
      echo "could not install HolisticTraceAnalysis; its test will skip" >&2
  fi
  # torch-geometric's sparse adjacency paths run on brick in the tests (test_sparse.py). It
  # declares torch-related extras it does not import: installed without its dependencies, the
  # ones it imports first.
  if ! installed torch_geometric; then
    log "installing torch-geometric"
    "$PYTHON" -m pip install -q fsspec jinja2 numpy psutil pyparsing requests tqdm xxhash &&
      "$PYTHON" -m pip install -q --no-deps "torch-geometric==2.8.1" ||
      echo "could not install torch-geometric; its test will skip" >&2
  fi
}

# The C++ suites under sanitizers, each in its own build folder: AddressSanitizer +
# UndefinedBehaviorSanitizer (LeakSanitizer included) over every GoogleTest suite, and
# ThreadSanitizer over the runtime and registry suites (plain C++, no torch).
sanitize() {
  local asan="$PWD/build/asan" tsan="$PWD/build/tsan"
  # Line tables only (-g1: reports keep file and line) instead of RelWithDebInfo's full -g: the
  # debug info of torch's headers is most of a sanitized compile (distributed/collective_call.cpp
  # under ASan+UBSan on the 2-core VM: 18.1 s with -O2 -g, 13.2 s with -O2 -g1). -O1 would save
  # 1.6 s more but gives false -Wmaybe-uninitialized warnings inside c10's headers.
  local sanitize_flags="-O2 -g1 -DNDEBUG -fdebug-prefix-map=$PWD=."
  log "GoogleTest under AddressSanitizer + UndefinedBehaviorSanitizer ($asan)"
  cmake -S . -B "$asan" -G Ninja -DPython_EXECUTABLE="$(command -v "$PYTHON")" \
    -DBRICK_BUILD_TESTS=ON -DBRICK_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$sanitize_flags" >/dev/null
  cmake --build "$asan" --target brick_gtests
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
    ctest --test-dir "$asan" --output-on-failure -j 2
  log "GoogleTest under ThreadSanitizer ($tsan)"
  cmake -S . -B "$tsan" -G Ninja -DBRICK_WITH_TORCH=OFF -DBRICK_BUILD_TESTS=ON \
    -DBRICK_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$sanitize_flags" >/dev/null
  cmake --build "$tsan" --target brick_gtests
  TSAN_OPTIONS=halt_on_error=1 ctest --test-dir "$tsan" --output-on-failure -j 2
}

# The Python tests a torch lane runs: the files whose subject is where brick meets PyTorch's
# internals, which change between releases: the op and module databases, dispatch and tensors,
# autocast, random streams, PyTorch's device branches, the compiler, the profilers (legacy and
# Kineto), streams, memory, sparse layouts, transformers' models, torchvision (whose wheels are
# installed in the 2.14 lane only). Left out: brick's own tools on brick's data (reports,
# contracts, diff, the command line, top, docs, the test command itself) and the third-party
# programs run in child processes (Lightning, torchrun, accelerate, DDP, exit paths), which
# the main run covers; and the tests marked `model`. `scripts/run.sh torch-lane VERSION
# tests/python` runs everything there.
LANE_TESTS=(test_op_sweep.py test_module_db.py test_devices.py test_tensors.py test_op_errors.py
  test_autocast.py test_random.py test_random_streams.py test_device_branches.py test_compile.py
  test_compile_cpu_branches.py test_profiler.py test_kineto.py test_streams_events.py test_memory.py
  test_host_ops.py test_backing_records.py test_record_shapes.py test_roofline_peaks.py
  test_sparse.py test_training.py test_transformers_models.py test_torchvision.py
  test_structured_kernels.py)

# Another PyTorch release, in its own virtual environment and its own copy of the working tree
# (build/torch-VERSION/src: the built module sits beside the sources, so two builds of one tree
# would overwrite each other): the extension is built against that release, and GoogleTest and
# the Python tests of LANE_TESTS run there. The release is pinned: pip never chooses a torch.
# The environment is kept outside the tree ($BRICK_CACHE_DIR, default
# ~/.cache/torch_brickdev/venv-torch-VERSION), so a fresh clone reuses it (installing it is over
# a minute); it is made again when its Python or its torch is not the one asked for.
torch_lane() {
  local version=$1 lane="$PWD/build/torch-$1"
  local venv="$CACHE_ROOT/venv-torch-$1"
  local src="$lane/src" build="$lane/build"
  log "lane torch==$version ($lane)"
  if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
    log "installing torch==$version into $venv"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q "torch==$version" "setuptools>=64" wheel
  fi
  PYTHON="$venv/bin/python" setup_python test
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
    if [ $# -gt 1 ]; then
      PYTHON="$venv/bin/python" run_pytest "${@:2}"
    else
      PYTHON="$venv/bin/python" run_suite "not model" "${LANE_TESTS[@]/#/tests/python/}"
    fi
  )
}

# Compiles the extension, its bindings and every C++ test against another PyTorch release's
# headers (and links against its libraries), without importing it: for the release the GPU
# machines have (2.11.0, CUDA 13), which cannot be imported here. The wheel comes pinned and
# without dependencies; only its include/ and the libraries brick links are unpacked.
compile_lane() {
  local version=$1 lane="$PWD/build/compile-$1"
  log "compile lane: torch==$version headers ($lane)"
  if [ ! -f "$lane/torch/include/ATen/ATen.h" ]; then
    rm -rf "$lane" && mkdir -p "$lane/wheel"
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$lane/wheel" "torch==$version"
    "$PYTHON" - "$lane" <<'PY'
import pathlib, sys, zipfile
lane = pathlib.Path(sys.argv[1])
wheel = next((lane / "wheel").glob("torch-*.whl"))
libs = {f"torch/lib/{name}" for name in
        ("libtorch.so", "libtorch_cpu.so", "libc10.so", "libtorch_python.so")}
with zipfile.ZipFile(wheel) as archive:
    for name in archive.namelist():
        if name.startswith("torch/include/") or name in libs:
            archive.extract(name, lane)
PY
    rm -rf "$lane/wheel"
  fi
  # Links need not resolve the libraries' own CUDA dependencies: nothing built here runs.
  cmake -S . -B "$lane/build" -G Ninja -DPython_EXECUTABLE="$(command -v "$PYTHON")" \
    -DBRICK_TORCH_DIR="$lane/torch" -DBRICK_BUILD_TESTS=ON -DBRICK_WITH_CUDA=ON \
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined \
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST -DCMAKE_CXX_FLAGS=-Werror >"$lane/configure.log" || { cat "$lane/configure.log"; return 1; }
  grep -E "^-- (brick|torch.profiler)" "$lane/configure.log"
  cmake --build "$lane/build"
  # The CPU's kernels and structured classes brick reaches by symbol (cpu_stubs.cpp,
  # direct_kernels.cpp) must be in this release's library: a missing one would fail the import.
  local missing
  missing=$(comm -23 \
    <(nm -D --undefined-only "$lane/build"/_C*.so | awk '{print $2}' |
      grep -E 'DispatchStub|structured_' | sort -u) \
    <(nm -D --defined-only "$lane/torch/lib/libtorch_cpu.so" | awk '{print $3}' | sort -u))
  if [ -n "$missing" ]; then
    echo "torch==$version's libtorch_cpu.so lacks symbols brick's structured kernels use:" >&2
    echo "$missing" | c++filt >&2
    return 1
  fi
  log "compile lane torch==$version: every target compiled without a warning, every stub resolved"
}

# On a machine with the CUDA toolkit the CUDA runtime must have been built: CMake drops it
# silently where it finds no toolkit, which would leave the CUDA code untested here.
check_cuda_runtime_built() {
  if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
    "$PYTHON" -c "import torch_brickdev, sys; sys.exit(not torch_brickdev._C._built_with_cuda())" || {
      echo "the CUDA toolkit is installed but torch_brickdev was built without its CUDA runtime" >&2
      exit 1
    }
    echo "CUDA runtime built (CUDA toolkit found)"
  fi
}

build() {
  log "building torch_brickdev (CMake, $BUILD_DIR)"
  BRICK_BUILD_TESTS=${1:-0} "$PYTHON" -m pip install -q --no-build-isolation --no-deps -e .
}

# The whole pytest suite with $PYTHON, with SIGINT ignored, as a CI runner or scheduler may
# start the job (a background job of a non-interactive shell): the disposition is inherited
# across exec (pytest-xdist's workers included), so this proves that no test waits for an
# interrupt that never comes. Each test is bounded by pytest-timeout.
#
# With pytest-xdist and more than one core, the tests that measure no time run in parallel
# ($BRICK_TEST_WORKERS processes, default one per core), then the timing tests (marked `timing`
# in their files) alone, so no other test's work lands inside their measurements.
# With arguments (a selection, options) everything runs in one process, as asked.
run_pytest() {
  if [ $# -gt 0 ]; then
    (trap '' INT; exec "$PYTHON" -m pytest tests/python -q "$@")
  else
    run_suite "" tests/python
  fi
}

# `run_suite MARKS PATH...`: the tests under the paths whose marks match MARKS (a -m expression
# joined to the timing split with "and"; empty: all), in the two phases above.
run_suite() {
  local marks=${1:+ and ($1)} workers=${BRICK_TEST_WORKERS:-$(nproc)}
  shift
  if [ "$workers" -le 1 ] || ! installed xdist; then
    (trap '' INT; exec "$PYTHON" -m pytest "$@" -q -m "${marks# and }")
    return
  fi
  local parallel=0 alone=0
  # --durations: the slowest tests of each phase close its output, so a run shows where its
  # time went (docs/benchmarks.md, the test command stage by stage). Worksteal: each worker
  # starts on its own contiguous share of the tests (a module's fixtures set up once where it
  # can), and one that runs out takes tests from the other's queue.
  (trap '' INT; exec "$PYTHON" -m pytest "$@" -q -n "$workers" --dist worksteal \
    -m "not timing$marks" --durations=40) ||
    parallel=$?
  log "pytest: the timing tests, alone"
  (trap '' INT; exec "$PYTHON" -m pytest "$@" -q -m "timing$marks" --durations=25) || alone=$?
  # (pytest's 5: no test matched, not a failure)
  [[ "$parallel" =~ ^[05]$ ]] && [[ "$alone" =~ ^[05]$ ]]
}

# The GPU machine's job: gpu_prepare, gpu (sourced: it uses the helpers above).
# shellcheck source=scripts/gpu_job.sh
source scripts/gpu_job.sh

job=${1:-}
case "$job" in
  demo)
    setup_system build; use_compiler_cache; setup_python build; build 0
    log "python -m torch_brickdev demo"
    "$PYTHON" -m torch_brickdev demo "${@:2}"
    ;;
  test)
    setup_system test; use_compiler_cache; setup_python test
    log "clang-format check"
    clang-format --dry-run -Werror csrc/*/*.h csrc/*/*.cpp tests/cpp/*.h tests/cpp/*.cpp benchmarks/*.cpp \
      benchmarks/*.cu benchmarks/*.h
    # GoogleTest from the carried sources, as the GPU machine builds it: the rehearsal below
    # then reuses this build instead of making its own (the sanitizer builds and the torch
    # lanes take the installed GoogleTest).
    gpu_prepare
    BRICK_CMAKE_ARGS="$(carried_gtest_cmake_args)" build 1
    check_cuda_runtime_built
    log "GoogleTest (CTest)"
    ctest --test-dir "$BRICK_BUILD_DIR" --output-on-failure -j 2
    log "pytest (SIGINT ignored)"
    run_pytest "${@:2}"
    log "the GPU job, rehearsed on the host runtime"
    # (In a subshell: the rehearsal's environment, its runtime and event completion, ends there.)
    (BRICK_REHEARSAL_BUILD_DIR="$BRICK_BUILD_DIR" BRICK_REHEARSAL_GTEST_PASSED=1 gpu --rehearse)
    if [ "${BRICK_SKIP_SANITIZERS:-0}" != 1 ]; then sanitize; fi
    for version in ${BRICK_COMPILE_LANES-2.11.0}; do compile_lane "$version"; done
    for version in ${BRICK_TORCH_LANES-2.14.1}; do torch_lane "$version" "${@:2}"; done
    ;;
  sanitize)
    setup_system test; use_compiler_cache; setup_python build
    sanitize
    ;;
  torch-lane)
    [ -n "${2:-}" ] || { echo "usage: scripts/run.sh torch-lane VERSION [pytest args...]" >&2; exit 2; }
    setup_system test; use_compiler_cache; torch_lane "${@:2}"
    ;;
  bench)
    setup_system test; use_compiler_cache; setup_python test
    BRICK_CMAKE_ARGS="${BRICK_CMAKE_ARGS:-} -DBRICK_BUILD_BENCHMARKS=ON" build 0
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
    log "benchmarks: what each profiler costs on real models (Qwen2 generate, the demo's decode)"
    "$PYTHON" benchmarks/bench_profiled_models.py
    log "benchmarks: brick against the CPU without a profiler (four model copies per device)"
    "$PYTHON" benchmarks/bench_profiled_models.py --configurations none,cpu --instances 4
    log "benchmarks: what profile(modules=True) and profile(record_shapes=True) cost"
    "$PYTHON" benchmarks/bench_profile_options.py
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
  gpu-prepare)
    gpu_prepare
    ;;
  compile-lane)
    [ -n "${2:-}" ] || { echo "usage: scripts/run.sh compile-lane VERSION" >&2; exit 2; }
    setup_system test; use_compiler_cache; compile_lane "$2"
    ;;
  *)
    echo "usage: scripts/run.sh demo|test|bench|sanitize|torch-lane|compile-lane|gpu|gpu-prepare [args...]" >&2
    exit 2
    ;;
esac
