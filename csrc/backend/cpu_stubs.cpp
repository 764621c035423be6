// The CPU's kernels behind the PrivateUse1 entries of the stubs brick's structured kernels reach
// (cpu_stubs.h).
//
// A stub's per-ISA kernels (DEFAULT, AVX2, AVX512) are exported static members of its type, but
// declared only where PyTorch's build defines the ISA macros; PyTorch's x86-64 builds compile
// both AVX2 and AVX512 kernels, so this file (alone) declares them as PyTorch's build does.
#if defined(__x86_64__) || defined(_M_X64)
#define HAVE_AVX2_CPU_DEFINITION
#define HAVE_AVX512_CPU_DEFINITION
#define BRICK_CPU_STUBS 1
#else
#define BRICK_CPU_STUBS 0
#endif

#include "backend/cpu_stubs.h"

#include <ATen/Context.h>
#include <ATen/native/Activation.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/Copy.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/Fill.h>
#include <ATen/native/Pow.h>
#include <ATen/native/TensorCompare.h>
#include <ATen/native/UnaryOps.h>

#include <string>

namespace brick::backend {

namespace detail {
std::atomic<bool> g_cpu_stubs_in_use{false};
at::native::copy_fn g_cpu_copy_kernel = nullptr;
}  // namespace detail

#if BRICK_CPU_STUBS

namespace {

enum class Isa { kDefault, kAvx2, kAvx512 };

// As DispatchStub's choose_cpu_impl picks: a missing AVX512 kernel means the AVX2 one.
template <typename Stub>
typename Stub::FnPtr use_the_cpus(Stub& stub, Isa isa) {
  typename Stub::FnPtr kernel = Stub::DEFAULT;
  if (isa == Isa::kAvx512) {
    kernel = Stub::AVX512 != nullptr ? Stub::AVX512 : Stub::AVX2;
  } else if (isa == Isa::kAvx2) {
    kernel = Stub::AVX2;
  }
  stub.set_privateuse1_dispatch_ptr(kernel);
  return kernel;
}

}  // namespace

void use_the_cpus_stubs() {
  static const bool done = [] {
    // PyTorch's own reading of the machine and of ATEN_CPU_CAPABILITY.
    const std::string capability = at::get_cpu_capability();
    const Isa isa = capability == "AVX512" ? Isa::kAvx512
                    : capability == "AVX2" ? Isa::kAvx2
                                           : Isa::kDefault;
    namespace native = at::native;
    use_the_cpus(native::add_stub, isa);  // add and sub
    use_the_cpus(native::mul_stub, isa);
    use_the_cpus(native::div_true_stub, isa);
    use_the_cpus(native::maximum_stub, isa);
    use_the_cpus(native::minimum_stub, isa);
    use_the_cpus(native::bitwise_or_stub, isa);
    use_the_cpus(native::bitwise_and_stub, isa);
    use_the_cpus(native::eq_stub, isa);
    use_the_cpus(native::ne_stub, isa);
    use_the_cpus(native::gt_stub, isa);
    use_the_cpus(native::ge_stub, isa);
    use_the_cpus(native::lt_stub, isa);
    use_the_cpus(native::le_stub, isa);
    use_the_cpus(native::neg_stub, isa);
    use_the_cpus(native::rsqrt_stub, isa);
    use_the_cpus(native::sigmoid_stub, isa);
    use_the_cpus(native::tanh_stub, isa);
    use_the_cpus(native::exp_stub, isa);
    use_the_cpus(native::sqrt_stub, isa);
    use_the_cpus(native::log_stub, isa);
    use_the_cpus(native::sin_stub, isa);
    use_the_cpus(native::cos_stub, isa);
    use_the_cpus(native::pow_tensor_scalar_stub, isa);
    use_the_cpus(native::silu_stub, isa);
    use_the_cpus(native::clamp_min_scalar_stub, isa);
    use_the_cpus(native::bitwise_not_stub, isa);
    use_the_cpus(native::fill_stub, isa);
    // cat's copies into slices of its result; clone's and _to_copy's copies.
    detail::g_cpu_copy_kernel = use_the_cpus(native::copy_stub, isa);
    return true;
  }();
  // Published after the entries: an op that sees the flag finds them set.
  detail::g_cpu_stubs_in_use.store(done, std::memory_order_release);
}

#else

void use_the_cpus_stubs() {}

#endif

}  // namespace brick::backend
