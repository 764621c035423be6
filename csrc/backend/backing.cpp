// Running brick work on its backing device: see backing.h.
#include "backend/backing.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>

#include "backend/errors.h"

namespace brick::backend {

namespace {

constexpr c10::DeviceType kCuda = c10::DeviceType::CUDA;

const c10::impl::DeviceGuardImplInterface& cuda_guard() {
  return *c10::impl::getDeviceGuardImpl(kCuda);
}

// Brick stream id -> id of the PyTorch CUDA stream behind it, per device. Written once per
// stream (under a lock), read on every op (lock-free). Id 0 is the default stream on both sides.
class CudaStreamTable {
 public:
  static constexpr runtime::StreamId kCapacity = 4096;
  static constexpr c10::StreamId kUnmapped = -1;

  c10::StreamId find(c10::DeviceIndex device, runtime::StreamId stream) const {
    if (stream == runtime::kDefaultStream) return 0;
    const Row* row = rows_[device].load(std::memory_order_acquire);
    if (row == nullptr || stream < 0 || stream >= kCapacity) return kUnmapped;
    return (*row)[stream].load(std::memory_order_acquire);
  }

  void add(c10::DeviceIndex device, runtime::StreamId stream, c10::StreamId cuda_stream) {
    TORCH_CHECK(stream >= 0 && stream < kCapacity, "brick: brick:", static_cast<int>(device),
                " has more than ", kCapacity, " streams backed by CUDA streams");
    std::lock_guard<std::mutex> lock(mutex_);
    Row* row = rows_[device].load(std::memory_order_relaxed);
    if (row == nullptr) {
      row = new Row();  // lives for the process, like the streams it maps
      for (auto& entry : *row) entry.store(kUnmapped, std::memory_order_relaxed);
      rows_[device].store(row, std::memory_order_release);
    }
    (*row)[stream].store(cuda_stream, std::memory_order_release);
  }

 private:
  using Row = std::array<std::atomic<c10::StreamId>, kCapacity>;
  std::array<std::atomic<Row*>, runtime::kMaxDevices> rows_{};
  std::mutex mutex_;
};

CudaStreamTable& cuda_streams() {
  static auto* table = new CudaStreamTable();
  return *table;
}

// Registers a PyTorch CUDA stream as a brick stream of `device`.
runtime::StreamId adopt_cuda_stream(c10::DeviceIndex device, const c10::Stream& cuda_stream) {
  const runtime::StreamId id =
      runtime_call([&] { return rt().stream_from_native(device, cuda_stream.native_handle()); });
  cuda_streams().add(device, id, cuda_stream.id());
  return id;
}

// Asked when the runtime is first used, not at import: at::hasCUDA() initializes CUDA, after
// which a forked child could not use CUDA (DataLoader workers, multiprocessing).
std::optional<std::string> why_torch_cannot_run_cuda() {
  if (at::hasCUDA()) return std::nullopt;
  return "this PyTorch cannot run CUDA kernels (a CPU-only build, or no GPU visible to it)";
}

// PyTorch's autograd engine runs brick's backward ops on its own thread for the brick device,
// whose intra-op thread count is the one the process had when the engine started that thread
// (at::init_num_threads in its thread_init): a later torch.set_num_threads() never reaches it,
// and brick's backward would run the CPU's kernels with another thread count than the CPU's
// backward (other results in the last bits, other speed). So on the host runtime, once per
// backward pass (graph task) on the calling thread, brick re-applies the process's count. The
// thread that loaded brick (Python's main thread) is never an engine thread, and its count is
// the one the CPU's own kernels there use: it skips the question, which costs two cold calls
// into libtorch per op.
const std::thread::id g_loading_thread = std::this_thread::get_id();
[[gnu::tls_model("initial-exec")]] constinit thread_local int tls_last_graph_task = -1;

}  // namespace

namespace detail {

void follow_process_thread_count() {
  if (tls_may_run_engine_work < 0) [[unlikely]] {
    tls_may_run_engine_work = std::this_thread::get_id() != g_loading_thread ? 1 : 0;
    if (tls_may_run_engine_work == 0) return;
  }
  const int graph_task = torch::autograd::get_current_graph_task_id();
  if (graph_task != tls_last_graph_task) [[unlikely]] {
    tls_last_graph_task = graph_task;
    if (graph_task != -1) at::init_num_threads();
  }
}

}  // namespace detail

void configure_runtime_backing() {
  // Only a CUDA build of PyTorch with a usable GPU can run CUDA kernels on brick memory.
  runtime::set_cuda_backing_check(&why_torch_cannot_run_cuda);
}

void BackingScope::enter_cuda(c10::DeviceIndex device) {
  // Brick's runtime first: in a child forked after CUDA was used it refuses with brick's own
  // message, before any CUDA call fails there with CUDA's.
  const runtime::StreamId stream = runtime_call([&] { return rt().current_stream(device); });
  const auto& guard = cuda_guard();
  previous_device_ = guard.exchangeDevice(backing_device(device));
  try {
    previous_stream_ = guard.exchangeStream(backing_cuda_stream(device, stream));
  } catch (...) {
    guard.uncheckedSetDevice(previous_device_);
    throw;
  }
  entered_cuda_ = true;
}

void BackingScope::leave_cuda() noexcept {
  const auto& guard = cuda_guard();
  try {
    guard.exchangeStream(previous_stream_);
  } catch (...) {
    // Restoring a stream that was current before cannot fail; nothing sensible to do here.
  }
  guard.uncheckedSetDevice(previous_device_);
}

runtime::StreamId new_brick_stream(c10::DeviceIndex device, int priority) {
  if (!cuda_backing()) return runtime_call([&] { return rt().create_stream(device, priority); });
  // PyTorch's CUDA pool takes 0 (normal) down to its highest priority and refuses positive
  // values; like torch.cuda.Stream, brick clamps rather than refuses.
  const int pool_priority = std::clamp(priority, -64, 0);
  return adopt_cuda_stream(device,
                           cuda_guard().getNewStream(backing_device(device), pool_priority));
}

runtime::StreamId pooled_brick_stream(c10::DeviceIndex device, bool high_priority) {
  // On CUDA, PyTorch's own pool (round robin over its streams). On the host, a pool like it:
  // created on first use, then handed out round robin.
  if (cuda_backing()) {
    return adopt_cuda_stream(
        device, cuda_guard().getStreamFromGlobalPool(backing_device(device), high_priority));
  }
  constexpr int kPoolSize = 32;
  struct Pool {
    std::once_flag once;
    std::array<runtime::StreamId, kPoolSize> ids{};
    std::atomic<uint32_t> next{0};
  };
  static std::array<Pool, 2 * runtime::kMaxDevices> pools;
  Pool& pool = pools[2 * device + (high_priority ? 1 : 0)];
  std::call_once(pool.once, [&] {
    for (auto& id : pool.ids) {
      id = runtime_call([&] { return rt().create_stream(device, high_priority ? -1 : 0); });
    }
  });
  return pool.ids[pool.next.fetch_add(1, std::memory_order_relaxed) % kPoolSize];
}

c10::Stream backing_cuda_stream(c10::DeviceIndex device, runtime::StreamId stream) {
  const c10::StreamId id = cuda_streams().find(device, stream);
  TORCH_CHECK(id != CudaStreamTable::kUnmapped, "brick: stream ", stream,
              " of brick:", static_cast<int>(device),
              " has no CUDA stream behind it (brick streams come from torch.brick.Stream, "
              "torch.Stream(device='brick') or the stream pool)");
  return c10::Stream(c10::Stream::UNSAFE, backing_device(device), id);
}

at::Generator make_backing_generator(c10::DeviceIndex device, uint64_t seed) {
  if (!cuda_backing()) return at::make_generator<at::CPUGeneratorImpl>(seed);
  // A clone: brick's seeds must not move torch.cuda's default generator, nor the reverse.
  at::Generator generator = at::globalContext().defaultGenerator(backing_device(device)).clone();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_current_seed(seed);
  return generator;
}

}  // namespace brick::backend
