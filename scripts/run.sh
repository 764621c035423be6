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

log() { printf '\n== %s\n' "$*"; }

setup_system() {
  local missing=()
  command -v cmake >/dev/null || missing+=(cmake)
  command -v ninja >/dev/null || missing+=(ninja-build)
  [ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
  [ -f /usr/include/benchmark/benchmark.h ] || missing+=(libbenchmark-dev)
  command -v clang-format >/dev/null || missing+=(clang-format)
  command -v tmux >/dev/null || missing+=(tmux)  # drives top's terminal view in the tests
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
  # PyTorch Lightning trains on brick in the tests (Trainer(accelerator="brick")). Lightning
  # and torchmetrics declare torch: installed without their dependencies, which come first.
  if ! TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PYTHON" -c "import lightning.pytorch" 2>/dev/null; then
    log "installing lightning"
    "$PYTHON" -m pip install -q fsspec tqdm packaging pyyaml typing-extensions \
      "lightning-utilities==0.15.3" &&
      "$PYTHON" -m pip install -q --no-deps "lightning==2.6.0" "torchmetrics==1.8.2" ||
      echo "could not install lightning; its tests will skip" >&2
  fi
  # torchvision's models train on brick in the tests. Its wheels are built for one torch release
  # each (and against CUDA): the 2.14 lane's torch is such a build, so it gets the matching
  # release, pinned, without dependencies (pillow pinned beside it). Elsewhere its tests skip.
  if TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PYTHON" -c "import sys, torch; sys.exit(not torch.__version__.startswith('2.14.'))" 2>/dev/null &&
    ! TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PYTHON" -c "import torchvision" 2>/dev/null; then
    log "installing torchvision"
    "$PYTHON" -m pip install -q --no-deps "torchvision==0.29.1" "pillow==11.3.0" ||
      echo "could not install torchvision; its tests will skip" >&2
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
  log "compile lane torch==$version: every target compiled without a warning"
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
# across exec, so this proves that no test waits for an interrupt that never comes. Each test is
# bounded by pytest-timeout.
run_pytest() {
  (trap '' INT; exec "$PYTHON" -m pytest tests/python -q "$@")
}

# ---- the GPU job (docs/gpu-job.md) -------------------------------------------------------------
# The GPU machine is lent for 15 minutes in all, at most 10 per command, installs nothing and
# reaches no network: one command, every step bounded, the whole job inside $BRICK_GPU_BUDGET_S
# (480 s), its logs in $BRICK_LOG_DIR. `--rehearse` runs the same script here on the host runtime,
# the GPU-only parts replaced by their host counterparts, so what would fail there fails here.

GTEST_CARRIED=build/carry/googletest  # Debian's GoogleTest sources, carried to the GPU machine

# Copies what the GPU machine lacks into the working tree (ignored paths the device tool carries).
gpu_prepare() {
  [ -f /usr/src/googletest/CMakeLists.txt ] || setup_system  # libgtest-dev ships the sources
  rm -rf "$GTEST_CARRIED" && mkdir -p "$(dirname "$GTEST_CARRIED")"
  cp -r /usr/src/googletest "$GTEST_CARRIED"
  echo "gpu-prepare: $GTEST_CARRIED ($(du -sh "$GTEST_CARRIED" | cut -f1)); carry it with the job"
}

# `gpu_step NAME SECONDS command...`: the command bounded by SECONDS and by what is left of the
# job's budget, its output in $logs/NAME.log; prints (and appends to summary.txt) one line: the
# verdict, the seconds it took and the log's last line (pytest's counts, the contract's verdict...).
gpu_step() {
  local name=$1 limit=$2 start rc verdict left
  shift 2
  left=$((deadline - $(date +%s)))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 5 ]; then
    printf 'gpu %-16s %-22s %4ss  %s\n' "$name" "SKIPPED" 0 "out of the job's time budget" |
      tee -a "$logs/summary.txt"
    failures=$((failures + 1))
    return
  fi
  start=$(date +%s)
  set +e
  timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  set -e
  local failed=1
  case $rc in
    0) verdict=ok failed=0 ;;
    124 | 137) verdict="TIMED OUT after ${limit} s" ;;
    *) verdict="FAILED (exit $rc)" ;;
  esac
  # The demo's contract exits 3 when a timing check is inconclusive: the machine was busy (the
  # check names the runs and what they were denied), neither a pass nor a defect.
  if [ $rc = 3 ] && [[ $name == demo-* ]]; then verdict="INCONCLUSIVE (busy)" failed=0; fi
  # The log's verdict line (ctest's and pytest's counts, the contract's verdict), else its last.
  local said
  said=$(grep -E "tests passed|tests failed| passed| failed|verdict:" "$logs/$name.log" | tail -n 1 || true)
  [ -n "$said" ] || said=$(grep -v '^[[:space:]]*$' "$logs/$name.log" | tail -n 1 || true)
  printf 'gpu %-16s %-22s %4ss  %s\n' "$name" "$verdict" "$(($(date +%s) - start))" \
    "$(printf '%s' "$said" | cut -c1-160)" | tee -a "$logs/summary.txt"
  [ $failed = 0 ] || failures=$((failures + 1))
}

# What the job needs, checked before anything runs; what is missing is named, and the job stops.
gpu_preflight() {
  local missing=()
  for tool in cmake timeout; do command -v "$tool" >/dev/null || missing+=("$tool (command)"); done
  "$PYTHON" -c "import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" ||
    missing+=("Python.h (the Python headers)")
  for module in torch pytest pytest_timeout setuptools; do
    TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PYTHON" -c "import $module" 2>/dev/null || missing+=("$module (Python)")
  done
  [ -f /usr/include/gtest/gtest.h ] || [ -f "$GTEST_CARRIED/CMakeLists.txt" ] ||
    missing+=("GoogleTest (not installed, and $GTEST_CARRIED was not carried: scripts/run.sh gpu-prepare)")
  if [ "$rehearse" = 0 ]; then
    command -v nvidia-smi >/dev/null || missing+=("nvidia-smi")
    command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || missing+=("nvcc (the CUDA toolkit)")
    TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null ||
      missing+=("a CUDA build of PyTorch that sees a GPU")
  fi
  {
    [ "$rehearse" = 0 ] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PYTHON" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'CUDA', torch.version.cuda)" 2>&1
    (command -v nvcc >/dev/null && nvcc --version | tail -n 2 | head -n 1) || true
    echo "cores $(nproc)"
  } | tee "$logs/machine.txt"
  if [ ${#missing[@]} -gt 0 ]; then
    printf 'gpu preflight: missing %s\n' "${missing[@]}" | tee -a "$logs/summary.txt" >&2
    return 1
  fi
  echo "gpu preflight: ok" | tee -a "$logs/summary.txt"
}

# One bounded look at the device: the runtime, an allocation, one op checked against the CPU,
# one event pair timed.
GPU_SMOKE='
import sys, torch, torch_brickdev
want, need_cuda_build = sys.argv[1], sys.argv[2] == "1"
assert torch_brickdev._C._built_with_cuda() or not need_cuda_build, "this build has no CUDA runtime"
assert torch_brickdev.runtime_name() == want, (torch_brickdev.runtime_name(), torch_brickdev.runtime_note())
x = torch.arange(1024, dtype=torch.float32, device="brick")
start, end = torch.brick.Event(enable_timing=True), torch.brick.Event(enable_timing=True)
start.record(); y = (x * 2 + 1).sum(); end.record(); end.synchronize()
assert y.item() == float((torch.arange(1024.0) * 2 + 1).sum()), y.item()
print("smoke: ok:", torch_brickdev.runtime_note(), "| backing", torch_brickdev.backing_device_type(),
      "| one op timed by an event pair: %.3f ms" % start.elapsed_time(end))
'

gpu() {
  rehearse=0
  local more=0 arg
  for arg in "$@"; do
    case $arg in
      --rehearse) rehearse=1 ;;
      --more) more=1 ;;
      *) echo "usage: scripts/run.sh gpu [--rehearse] [--more]" >&2; exit 2 ;;
    esac
  done
  logs=${BRICK_LOG_DIR:-$PWD/build/gpu-logs}
  rm -rf "$logs" && mkdir -p "$logs"
  : >"$logs/summary.txt"
  failures=0
  deadline=$(($(date +%s) + ${BRICK_GPU_BUDGET_S:-480}))
  local cores runtime=cuda cmake_args build_dir=$PWD/build/gpu
  cores=$(nproc)
  [ "$rehearse" = 1 ] && runtime=host build_dir=$PWD/build/gpu-rehearsal
  gpu_preflight || exit 1
  cmake_args=""
  if [ ! -f /usr/include/gtest/gtest.h ] || [ "$rehearse" = 1 ]; then
    # The rehearsal builds GoogleTest from the carried sources too, as the GPU machine must.
    cmake_args="-DBRICK_GTEST_SOURCE_DIR=$PWD/$GTEST_CARRIED -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON"
  fi
  export BRICK_RUNTIME=$runtime  # a build or machine that falls back to the host fails loudly
  export PYTHONFAULTHANDLER=1    # a crash prints every thread's Python stack into the step's log
  # The decode demo sized as a GPU decode (Llama-3-8B's widths, 2 layers): its ordering check
  # compares a vocab GEMV with a six-kernel RmsNorm, which the CPU-sized model cannot pass on a
  # fast GPU (its LmHead is a 16 µs GEMV there). The rehearsal keeps the CPU-sized one.
  local demo_size=(--hidden 4096 --heads 32 --kv-heads 8 --vocab 128256)
  [ "$rehearse" = 1 ] && demo_size=()
  [ "$rehearse" = 1 ] && export BRICK_HOST_COMPLETION=deferred  # events complete later, as on a GPU
  export BRICK_BUILD_DIR=$build_dir
  local pytest=("$PYTHON" -m pytest -q -rs -p no:cacheprovider --timeout 120)
  if [ "$more" = 0 ]; then
    gpu_step build 300 env BRICK_BUILD_TESTS=1 CMAKE_BUILD_PARALLEL_LEVEL="$cores" \
      BRICK_CMAKE_ARGS="$cmake_args" "$PYTHON" -m pip install --no-build-isolation --no-deps --no-index -e .
    if [ "$failures" != 0 ]; then  # every later step would test an older build, or none
      echo "gpu: the build failed (its log: $logs/build.log); nothing else was run" | tee -a "$logs/summary.txt"
      return 1
    fi
    local need_cuda_build=1  # (a rehearsal where no CUDA toolkit is installed builds without it)
    [ "$rehearse" = 1 ] && ! command -v nvcc >/dev/null && need_cuda_build=0
    gpu_step smoke 60 "$PYTHON" -c "$GPU_SMOKE" "$runtime" "$need_cuda_build"
    # What Event mode's CUDA calls cost the host here (a record, a capture check, a query...).
    [ "$rehearse" = 0 ] && gpu_step api-costs 40 bash -c \
      "\$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) -O2 -o '$build_dir/cuda_api_costs' benchmarks/cuda_api_costs.cu && '$build_dir/cuda_api_costs'"
    gpu_step gtest 150 ctest --test-dir "$build_dir" --output-on-failure --no-tests=error -j "$cores" \
      --timeout 100
    if [ "$rehearse" = 1 ]; then  # the profilers' asynchronous paths, as the CUDA runtime takes them
      gpu_step cuda-tests 240 "${pytest[@]}" tests/python/test_cuda_backing.py tests/python/test_async_events.py
    else
      gpu_step cuda-tests 240 "${pytest[@]}" tests/python/test_cuda_backing.py
    fi
    gpu_step demo-event 120 "$PYTHON" -m torch_brickdev demo --sync-mode event --runs 3 \
      --no-progress -o "$logs/demo-event" "${demo_size[@]}"
    if [ "$rehearse" = 1 ]; then  # bench_cuda.py only notes that no GPU backs brick here
      gpu_step bench 120 "$PYTHON" benchmarks/bench_profiler.py --rounds 1 --iterations 200 \
        --report-ops 2000 --no-instructions
    else
      gpu_step bench-cuda 150 "$PYTHON" benchmarks/bench_cuda.py --rounds 3 --tokens 32
    fi
  else  # the second, optional command: the rest, if device time remains
    # First, which first NCCL collective crashes (plain NCCL, brick loaded, brick's path), each alone.
    [ "$rehearse" = 0 ] && gpu_step nccl-probe 100 "$PYTHON" scripts/nccl_probe.py
    for mode in immediate deferred; do
      gpu_step "demo-$mode" 90 "$PYTHON" -m torch_brickdev demo --sync-mode "$mode" --runs 3 \
        --no-progress -o "$logs/demo-$mode" "${demo_size[@]}"
    done
    gpu_step distributed 150 "${pytest[@]}" tests/python/test_distributed.py -k nccl
    [ "$rehearse" = 0 ] && gpu_step bench-distributed 120 "$PYTHON" benchmarks/bench_distributed.py \
      --nproc "$(nvidia-smi -L | wc -l)" --rounds 5
    gpu_step pytest-all 240 bash -c "trap '' INT; exec ${pytest[*]} tests/python -x"
  fi
  # Every step left its log and its summary line: a log that would not come back is found here.
  local step_lines
  step_lines=$(grep -c '^gpu ' "$logs/summary.txt" || true)
  for log in "$logs"/*.log; do [ -s "$log" ] || { echo "gpu: empty log $log" >&2; failures=$((failures + 1)); }; done
  echo "gpu: $step_lines step(s), $failures failed; logs in $logs" | tee -a "$logs/summary.txt"
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
    check_cuda_runtime_built
    log "GoogleTest (CTest)"
    ctest --test-dir "$BRICK_BUILD_DIR" --output-on-failure -j 2
    log "pytest (SIGINT ignored)"
    run_pytest "${@:2}"
    log "the GPU job, rehearsed on the host runtime"
    gpu_prepare
    (gpu --rehearse)  # its own environment (runtime, build folder) ends with it
    if [ "${BRICK_SKIP_SANITIZERS:-0}" != 1 ]; then sanitize; fi
    for version in ${BRICK_COMPILE_LANES-2.11.0}; do compile_lane "$version"; done
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
  gpu-prepare)
    gpu_prepare
    ;;
  compile-lane)
    [ -n "${2:-}" ] || { echo "usage: scripts/run.sh compile-lane VERSION" >&2; exit 2; }
    setup_system; compile_lane "$2"
    ;;
  *)
    echo "usage: scripts/run.sh demo|test|bench|sanitize|torch-lane|compile-lane|gpu|gpu-prepare [args...]" >&2
    exit 2
    ;;
esac
