# The GPU machine's job, sourced by scripts/run.sh (`scripts/run.sh gpu`, `gpu-prepare`): it
# uses run.sh's helpers (log, setup_python, build, run_pytest, check_cuda_runtime_built).
# ---- the GPU job (docs/gpu-job.md) -------------------------------------------------------------
# The GPU machine is lent for 15 minutes in all, at most 10 per command, installs nothing and
# reaches no network: one command, every step bounded, the whole job inside $BRICK_GPU_BUDGET_S
# (480 s), its logs in $BRICK_LOG_DIR. `--rehearse` runs the same script here on the host runtime,
# the GPU-only parts replaced by their host counterparts, so what would fail there fails here.

GTEST_CARRIED=build/carry/googletest  # Debian's GoogleTest sources, carried to the GPU machine

# The CMake arguments that build GoogleTest from the carried sources, as the GPU machine must.
carried_gtest_cmake_args() {
  echo "-DBRICK_GTEST_SOURCE_DIR=$PWD/$GTEST_CARRIED -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON"
}

# Copies what the GPU machine lacks into the working tree (ignored paths the device tool carries).
gpu_prepare() {
  [ -f /usr/src/googletest/CMakeLists.txt ] || setup_system test  # libgtest-dev ships the sources
  rm -rf "$GTEST_CARRIED" && mkdir -p "$(dirname "$GTEST_CARRIED")"
  cp -r /usr/src/googletest "$GTEST_CARRIED"
  echo "gpu-prepare: $GTEST_CARRIED ($(du -sh "$GTEST_CARRIED" | cut -f1)); carry it with the job"
}

# `gpu_step NAME SECONDS command...`: the command bounded by SECONDS (times $time_scale) and by
# what is left of the job's budget, its output in $logs/NAME.log; prints (and appends to
# summary.txt) one line: the verdict, the seconds it took and the log's last line (pytest's
# counts, the contract's verdict...). A failed step is named once in $failed_steps.
gpu_step() {
  local name=$1 limit=$(($2 * time_scale)) start rc verdict left
  shift 2
  ran_steps+=("$name")
  left=$((deadline - $(date +%s)))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 5 ]; then
    printf 'gpu %-16s %-22s %4ss  %s\n' "$name" "SKIPPED" 0 "out of the job's time budget" |
      tee -a "$logs/summary.txt"
    failed_steps+=("$name")
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
    124 | 137)
      verdict="TIMED OUT after ${limit} s"
      # Said in the log too (a step killed before it printed anything leaves it empty otherwise),
      # with the machine's load: what else wanted the CPUs meanwhile.
      echo "gpu step $name: killed after $limit s; load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" >>"$logs/$name.log"
      ;;
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
  [ $failed = 0 ] || failed_steps+=("$name")
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
  # (The rehearsal builds GoogleTest from the carried sources too: see gpu.)
  if { [ ! -f /usr/include/gtest/gtest.h ] || [ "$rehearse" = 1 ]; } &&
    [ ! -f "$GTEST_CARRIED/CMakeLists.txt" ]; then
    missing+=("GoogleTest's sources in $GTEST_CARRIED (run scripts/run.sh gpu-prepare here and carry that folder)")
  fi
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
    # (The module's libstdc++ depends on the toolchain and its flags: see CMakeLists.txt.)
    echo "c++: $(c++ --version 2>/dev/null | head -n 1); LDFLAGS '${LDFLAGS:-}'; CXXFLAGS '${CXXFLAGS:-}'"
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
try:  # an error message keeps its number (one libstdc++ in the process, see CMakeLists.txt)
    torch.empty(1, device="brick:99")
except RuntimeError as error:
    assert "device index 99 is out of range" in str(error), str(error)
else:
    raise AssertionError("brick:99 was accepted: expected an out-of-range error")
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
  ran_steps=() failed_steps=()
  # On the GPU machine the bounds are the lease's. A rehearsal's bounds are hang guards only: a
  # shared or busy machine (others taking several times the job's CPU) must not fail it, so they
  # are $BRICK_REHEARSAL_TIME_SCALE (default 5) times the GPU's.
  time_scale=1
  [ "$rehearse" = 1 ] && time_scale=${BRICK_REHEARSAL_TIME_SCALE:-5}
  deadline=$(($(date +%s) + ${BRICK_GPU_BUDGET_S:-480} * time_scale))
  local cores runtime=cuda cmake_args build_dir=$PWD/build/gpu
  cores=$(nproc)
  # (CI's rehearsal reuses CI's own build, configured alike: BRICK_REHEARSAL_BUILD_DIR.)
  [ "$rehearse" = 1 ] && runtime=host \
    build_dir=${BRICK_REHEARSAL_BUILD_DIR:-$PWD/build/gpu-rehearsal}
  gpu_preflight || exit 1
  cmake_args=""
  if [ ! -f /usr/include/gtest/gtest.h ] || [ "$rehearse" = 1 ]; then
    # The rehearsal builds GoogleTest from the carried sources too, as the GPU machine must.
    cmake_args=$(carried_gtest_cmake_args)
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
    if [ ${#failed_steps[@]} != 0 ]; then  # every later step would test an older build, or none
      echo "gpu: the build failed (its log: $logs/build.log); nothing else was run" | tee -a "$logs/summary.txt"
      return 1
    fi
    local need_cuda_build=1  # (a rehearsal where no CUDA toolkit is installed builds without it)
    [ "$rehearse" = 1 ] && ! command -v nvcc >/dev/null && need_cuda_build=0
    gpu_step smoke 60 "$PYTHON" -c "$GPU_SMOKE" "$runtime" "$need_cuda_build"
    # What Event mode's CUDA calls cost the host here (a record, a capture check, a query...).
    [ "$rehearse" = 0 ] && gpu_step api-costs 40 bash -c \
      "\$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) -O2 -o '$build_dir/cuda_api_costs' benchmarks/cuda_api_costs.cu && '$build_dir/cuda_api_costs'"
    # What CUPTI's activity API gives and costs here (kernel records paired with pushed external
    # ids, the first enable, the cost per launch, event pairs against CUPTI per call), with the
    # CUPTI library of PyTorch's nvidia packages. The rehearsal compiles it wherever nvcc is.
    local nvcc cupti_library
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    if [ "$rehearse" = 0 ]; then
      cupti_library=$(TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PYTHON" -c 'import glob, os, torch
found = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)),
                                      "nvidia", "**", "libcupti.so*"), recursive=True))
print(found[0] if found else "libcupti.so")' || echo libcupti.so)
      gpu_step cupti-probe 60 bash -c \
        "'$nvcc' -O2 -Icsrc -o '$build_dir/cupti_probe' benchmarks/cupti_probe.cu -ldl && '$build_dir/cupti_probe' '$cupti_library'"
    elif [ -x "$nvcc" ]; then
      gpu_step cupti-probe 60 bash -c \
        "'$nvcc' -O2 -Icsrc -o '$build_dir/cupti_probe' benchmarks/cupti_probe.cu -ldl && echo 'cupti_probe: compiled (it runs on a GPU)'"
    fi
    # The test command's rehearsal runs on its own build, whose GoogleTests it has just passed
    # (BRICK_REHEARSAL_GTEST_PASSED): the step is named, not repeated.
    if [ "$rehearse" = 1 ] && [ "${BRICK_REHEARSAL_GTEST_PASSED:-0}" = 1 ]; then
      gpu_step gtest 5 echo "gtest: passed on this build by the test command; not repeated"
    else
      gpu_step gtest 150 ctest --test-dir "$build_dir" --output-on-failure --no-tests=error \
        -j "$cores" --timeout 100
    fi
    if [ "$rehearse" = 1 ]; then  # the profilers' asynchronous paths, as the CUDA runtime takes them
      gpu_step cuda-tests 240 "${pytest[@]}" tests/python/test_cuda_backing.py tests/python/test_async_events.py
    else
      gpu_step cuda-tests 240 "${pytest[@]}" tests/python/test_cuda_backing.py
    fi
    gpu_step demo-event 120 "$PYTHON" -m torch_brickdev demo --sync-mode event --runs 3 \
      --no-progress -o "$logs/demo-event" "${demo_size[@]}"
    # The same with each brick timed from the device's own record of its work (CUPTI).
    gpu_step demo-traced 90 "$PYTHON" -m torch_brickdev demo --sync-mode event \
      --device-timing traced --runs 3 --no-progress -o "$logs/demo-traced" "${demo_size[@]}"
    if [ "$rehearse" = 1 ]; then  # bench_cuda.py only notes that no GPU backs brick here
      gpu_step bench 120 "$PYTHON" benchmarks/bench_profiler.py --rounds 1 --iterations 200 \
        --report-ops 2000 --no-instructions
    else
      gpu_step bench-cuda 150 "$PYTHON" benchmarks/bench_cuda.py --rounds 3 --tokens 32
    fi
  else  # the second, optional command: the rest, if device time remains
    # First, which first NCCL collective crashes (plain NCCL, brick loaded, brick's path), each alone.
    [ "$rehearse" = 0 ] && gpu_step crash-probe 120 "$PYTHON" scripts/crash_probe.py
    for mode in immediate deferred; do
      gpu_step "demo-$mode" 90 "$PYTHON" -m torch_brickdev demo --sync-mode "$mode" --runs 3 \
        --no-progress -o "$logs/demo-$mode" "${demo_size[@]}"
    done
    # input shapes and the roofline on the backing GPU: FLOPs exact, achieved <= measured peaks
    gpu_step roofline 120 "${pytest[@]}" tests/python/test_record_shapes.py tests/python/test_roofline.py
    gpu_step distributed 150 "${pytest[@]}" tests/python/test_distributed.py -k nccl
    [ "$rehearse" = 0 ] && gpu_step bench-distributed 120 "$PYTHON" benchmarks/bench_distributed.py \
      --nproc "$(nvidia-smi -L | wc -l)" --rounds 5
    gpu_step pytest-all 240 bash -c "trap '' INT; exec ${pytest[*]} tests/python -x"
  fi
  gpu_summary
}

# The job's last line: how many steps ran and which failed, each named once. Every step left its
# log and its summary line: a log that would not come back is found here (a failed step's log
# holds at least its verdict, so this names only steps that passed).
gpu_summary() {
  local log step
  for log in "$logs"/*.log; do
    step=$(basename "$log" .log)
    if [ ! -s "$log" ] && [[ " ${failed_steps[*]} " != *" $step "* ]]; then
      echo "gpu: $step passed but left an empty log ($log)" | tee -a "$logs/summary.txt" >&2
      failed_steps+=("$step")
    fi
  done
  local failed_text=""
  [ ${#failed_steps[@]} = 0 ] || failed_text=" (${failed_steps[*]})"
  echo "gpu: ${#ran_steps[@]} step(s), ${#failed_steps[@]} failed$failed_text; logs in $logs" |
    tee -a "$logs/summary.txt"
  [ ${#failed_steps[@]} = 0 ]
}
