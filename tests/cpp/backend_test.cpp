// GoogleTest suite for the brick backend driven from C++ (ATen), without Python.
//
// Uses the process-wide runtime (brick::backend::rt()), so memory checks compare against a
// baseline taken inside each test rather than against zero.
#include <ATen/ATen.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/record_function.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/DeviceType.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/alias_pool.h"
#include "backend/allocator.h"
#include "backend/backing_call.h"
#include "backend/device_index.h"
#include "backend/registration.h"
#include "test_util.h"

namespace {

using brick::backend::rt;

c10::Device brick(int index) {
  return c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index));
}
const c10::Device kCpu(c10::DeviceType::CPU);

at::TensorOptions on(c10::Device device, at::ScalarType dtype = at::kFloat) {
  return at::TensorOptions().device(device).dtype(dtype);
}

// A CPU tensor with distinct, reproducible values.
at::Tensor cpu_values(at::IntArrayRef sizes, double offset = 0.0) {
  int64_t numel = 1;
  for (const int64_t s : sizes) numel *= s;
  return (at::arange(numel, on(kCpu)) * 0.25 + offset).sin().reshape(sizes);
}

// Runs `fn`, expects a c10::Error (or a subclass) and returns its message without backtrace.
template <typename Fn>
std::string c10_error_message(Fn&& fn) {
  return brick::test::thrown_message<c10::Error>(fn, "c10::Error");
}

class BrickEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    // Two devices unless the caller chose otherwise; must be set before the runtime exists.
    setenv("BRICK_HOST_DEVICES", "2", /*overwrite=*/0);
    c10::register_privateuse1_backend("brick");
    brick::backend::ensure_registered();
  }
};

[[maybe_unused]] const auto* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new BrickEnvironment);

class BackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(rt().current_device(), 0) << "a previous test left another brick device current";
  }
  void TearDown() override { rt().set_current_device(0); }

  // Skips the test when the runtime has fewer than `n` devices (BRICK_HOST_DEVICES=1).
  bool has_devices(int n) { return rt().device_count() >= n; }
};

#define REQUIRE_DEVICES(n)                                                             \
  if (!has_devices(n)) {                                                               \
    GTEST_SKIP() << "needs " << (n) << " brick devices, have " << rt().device_count(); \
  }

// ---------------------------------------------------------------------------------------------
// Registration and creation

TEST_F(BackendTest, RegisteredAsBrick) {
  EXPECT_EQ(c10::get_privateuse1_backend(), "brick");
  EXPECT_EQ(brick(0).str(), "brick:0");
  EXPECT_TRUE(at::isPrivateUse1HooksRegistered());
  EXPECT_GE(rt().device_count(), 1);
  EXPECT_NO_THROW(brick::backend::ensure_registered());  // idempotent
}

TEST_F(BackendTest, EmptyCreatesABrickTensor) {
  const at::Tensor t = at::empty({3, 4}, on(brick(0)));
  EXPECT_TRUE(t.is_privateuseone());
  EXPECT_EQ(t.device(), brick(0));
  EXPECT_EQ(t.sizes(), at::IntArrayRef({3, 4}));
  EXPECT_EQ(t.scalar_type(), at::kFloat);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.storage().device(), brick(0));
  EXPECT_TRUE(brick::backend::is_brick_allocation(t.storage().data_ptr()));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 64, 0u);
}

TEST_F(BackendTest, OnesCreatesABrickTensorOfOnes) {
  const at::Tensor t = at::ones({2, 5}, on(brick(0), at::kDouble));
  EXPECT_EQ(t.device(), brick(0));
  EXPECT_EQ(t.scalar_type(), at::kDouble);
  EXPECT_TRUE(at::equal(t.cpu(), at::ones({2, 5}, on(kCpu, at::kDouble))));
}

TEST_F(BackendTest, EmptyStridedAndZeroSizedTensors) {
  const at::Tensor strided = at::empty_strided({2, 3}, {1, 2}, on(brick(0)));
  EXPECT_EQ(strided.device(), brick(0));
  EXPECT_EQ(strided.strides(), at::IntArrayRef({1, 2}));
  const at::Tensor none = at::empty({0, 7}, on(brick(0)));
  EXPECT_EQ(none.device(), brick(0));
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(none.cpu().sizes(), at::IntArrayRef({0, 7}));
}

TEST_F(BackendTest, DeviceWithoutIndexUsesTheCurrentDevice) {
  REQUIRE_DEVICES(2);
  {
    c10::DeviceGuard guard(brick(1));
    EXPECT_EQ(rt().current_device(), 1);
    const at::Tensor t = at::empty({4}, on(c10::Device(c10::DeviceType::PrivateUse1)));
    EXPECT_EQ(t.device(), brick(1));
  }
  EXPECT_EQ(rt().current_device(), 0) << "the device guard did not restore the device";
}

// ---------------------------------------------------------------------------------------------
// Ops match the CPU

TEST_F(BackendTest, AddMatchesCpu) {
  const at::Tensor a = cpu_values({4, 5});
  const at::Tensor b = cpu_values({4, 5}, 1.0);
  const at::Tensor result = at::add(a.to(brick(0)), b.to(brick(0)), /*alpha=*/2);
  EXPECT_EQ(result.device(), brick(0));
  EXPECT_TRUE(at::equal(result.cpu(), at::add(a, b, 2)));
}

TEST_F(BackendTest, MmMatchesCpu) {
  const at::Tensor a = cpu_values({7, 5});
  const at::Tensor b = cpu_values({5, 3}, 2.0);
  const at::Tensor result = at::mm(a.to(brick(0)), b.to(brick(0)));
  EXPECT_EQ(result.device(), brick(0));
  EXPECT_EQ(result.sizes(), at::IntArrayRef({7, 3}));
  EXPECT_TRUE(at::allclose(result.cpu(), at::mm(a, b)));
}

TEST_F(BackendTest, OpsOnNonContiguousInputsMatchCpu) {
  const at::Tensor a = cpu_values({5, 7});
  const at::Tensor b = cpu_values({5, 3}, 2.0);
  // a.t() is a transposed (non-contiguous) brick view.
  const at::Tensor result = at::mm(a.to(brick(0)).t(), b.to(brick(0)));
  EXPECT_TRUE(at::allclose(result.cpu(), at::mm(a.t(), b)));
  const at::Tensor sum = a.to(brick(0)).t().sum(/*dim=*/1);
  EXPECT_EQ(sum.device(), brick(0));
  EXPECT_TRUE(at::allclose(sum.cpu(), a.t().sum(1)));
}

TEST_F(BackendTest, OpsOnTheSecondDeviceStayThere) {
  REQUIRE_DEVICES(2);
  const at::Tensor a = cpu_values({3, 3});
  const at::Tensor result = at::mm(a.to(brick(1)), a.to(brick(1)));
  EXPECT_EQ(result.device(), brick(1));
  EXPECT_TRUE(at::allclose(result.cpu(), at::mm(a, a)));
  EXPECT_EQ(rt().current_device(), 0) << "running an op on brick:1 changed the current device";
}

TEST_F(BackendTest, CpuScalarTensorMixesWithBrick) {
  const at::Tensor a = cpu_values({2, 3});
  const at::Tensor scalar = at::scalar_tensor(3.0, on(kCpu));
  const at::Tensor result = at::mul(a.to(brick(0)), scalar);
  EXPECT_EQ(result.device(), brick(0));
  EXPECT_TRUE(at::equal(result.cpu(), at::mul(a, scalar)));
}

// ---------------------------------------------------------------------------------------------
// Copies

TEST_F(BackendTest, ToCpuCopies) {
  at::Tensor b = at::ones({6}, on(brick(0)));
  const at::Tensor c = b.to(kCpu);
  EXPECT_TRUE(c.device().is_cpu());
  EXPECT_NE(c.data_ptr(), b.data_ptr());
  b.fill_(5.0);  // later writes to the brick tensor do not reach the copy
  EXPECT_TRUE(at::equal(c, at::ones({6}, on(kCpu))));
  EXPECT_TRUE(at::equal(b.cpu(), at::full({6}, 5.0, on(kCpu))));
}

TEST_F(BackendTest, CpuBrickCpuRoundTrip) {
  for (const auto dtype : {at::kFloat, at::kDouble, at::kInt, at::kLong, at::kBool, at::kHalf}) {
    const at::Tensor original = (cpu_values({3, 4, 5}) * 10).to(dtype);
    const at::Tensor on_brick = original.to(brick(0));
    EXPECT_EQ(on_brick.device(), brick(0)) << dtype;
    EXPECT_EQ(on_brick.scalar_type(), dtype);
    const at::Tensor back = on_brick.to(kCpu);
    EXPECT_TRUE(at::equal(back, original)) << dtype;
  }
}

TEST_F(BackendTest, NonContiguousRoundTrip) {
  const at::Tensor original = cpu_values({4, 6});
  const at::Tensor on_brick = original.t().to(brick(0));  // non-contiguous source
  EXPECT_TRUE(at::equal(on_brick.cpu(), original.t()));
  EXPECT_TRUE(at::equal(original.to(brick(0)).t().cpu(), original.t()));  // non-contiguous brick
}

TEST_F(BackendTest, CopyBetweenBrickDevices) {
  REQUIRE_DEVICES(2);
  const at::Tensor original = cpu_values({8, 3});
  const at::Tensor on0 = original.to(brick(0));
  const at::Tensor on1 = on0.to(brick(1));
  EXPECT_EQ(on1.device(), brick(1));
  EXPECT_EQ(on1.storage().device(), brick(1));
  EXPECT_NE(on1.data_ptr(), on0.data_ptr());
  EXPECT_TRUE(at::equal(on1.cpu(), original));

  // copy_ into an existing tensor on the other device, and back.
  at::Tensor dst = at::zeros({8, 3}, on(brick(1)));
  dst.copy_(on0);
  EXPECT_EQ(dst.device(), brick(1));
  EXPECT_TRUE(at::equal(dst.cpu(), original));
  at::Tensor back = at::zeros({8, 3}, on(brick(0)));
  back.copy_(dst);
  EXPECT_TRUE(at::equal(back.cpu(), original));
  EXPECT_EQ(rt().current_device(), 0);
}

TEST_F(BackendTest, CopyToBrickDeviceCountsOnTheTargetDevice) {
  REQUIRE_DEVICES(2);
  const auto before = rt().memory_stats(1).allocated_bytes;
  const at::Tensor on1 = at::ones({256}, on(brick(0))).to(brick(1));
  EXPECT_GE(rt().memory_stats(1).allocated_bytes, before + 256 * 4);
}

// ---------------------------------------------------------------------------------------------
// Views share storage

TEST_F(BackendTest, ViewSharesStorage) {
  const at::Tensor base = cpu_values({4, 6}).to(brick(0));
  const at::Tensor v = base.view({6, 4});
  EXPECT_EQ(v.device(), brick(0));
  EXPECT_EQ(v.data_ptr(), base.data_ptr());
  EXPECT_TRUE(v.storage().is_alias_of(base.storage()));
  EXPECT_TRUE(v.is_view());
  EXPECT_TRUE(at::equal(v.cpu(), base.cpu().view({6, 4})));
}

TEST_F(BackendTest, TransposeSharesStorage) {
  const at::Tensor cpu = cpu_values({4, 6});
  const at::Tensor base = cpu.to(brick(0));
  const at::Tensor t = base.transpose(0, 1);
  EXPECT_EQ(t.device(), brick(0));
  EXPECT_EQ(t.data_ptr(), base.data_ptr());
  EXPECT_TRUE(t.storage().is_alias_of(base.storage()));
  EXPECT_EQ(t.strides(), at::IntArrayRef({1, 6}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(at::equal(t.cpu(), cpu.transpose(0, 1)));
}

TEST_F(BackendTest, AsStridedSharesStorage) {
  const at::Tensor cpu = cpu_values({4, 6});
  const at::Tensor base = cpu.to(brick(0));
  const at::Tensor s = base.as_strided({2, 3}, {6, 2}, /*storage_offset=*/1);
  EXPECT_EQ(s.device(), brick(0));
  EXPECT_TRUE(s.storage().is_alias_of(base.storage()));
  EXPECT_EQ(s.storage_offset(), 1);
  EXPECT_EQ(static_cast<char*>(s.data_ptr()), static_cast<char*>(base.data_ptr()) + sizeof(float));
  EXPECT_TRUE(at::equal(s.cpu(), cpu.as_strided({2, 3}, {6, 2}, 1)));
}

TEST_F(BackendTest, ViewOpsThroughTheFallbackShareStorage) {
  const at::Tensor cpu = cpu_values({4, 6});
  const at::Tensor base = cpu.to(brick(0));
  for (const at::Tensor& v : {base.select(0, 2), base.narrow(1, 1, 3), base.unsqueeze(0),
                              base.reshape({24}), base.flatten()}) {
    EXPECT_EQ(v.device(), brick(0));
    EXPECT_TRUE(v.storage().is_alias_of(base.storage())) << v.sizes();
  }
  EXPECT_TRUE(at::equal(base.select(0, 2).cpu(), cpu.select(0, 2)));
  EXPECT_TRUE(at::equal(base.narrow(1, 1, 3).cpu(), cpu.narrow(1, 1, 3)));
}

// ---------------------------------------------------------------------------------------------
// In-place and out=

TEST_F(BackendTest, InPlaceOpMutatesTheBrickTensor) {
  at::Tensor t = at::ones({3, 4}, on(brick(0)));
  void* const data = t.data_ptr();
  const auto version = t._version();
  at::Tensor& same = t.add_(2.0);
  EXPECT_TRUE(same.is_same(t));
  EXPECT_EQ(t.data_ptr(), data) << "in-place op moved the storage";
  EXPECT_EQ(t.device(), brick(0));
  EXPECT_GT(t._version(), version);
  EXPECT_TRUE(at::equal(t.cpu(), at::full({3, 4}, 3.0, on(kCpu))));
}

TEST_F(BackendTest, InPlaceOpOnAViewMutatesTheBase) {
  const at::Tensor base = at::zeros({4, 6}, on(brick(0)));
  base.transpose(0, 1).select(0, 2).fill_(7.0);  // column 2
  at::Tensor expected = at::zeros({4, 6}, on(kCpu));
  expected.select(1, 2).fill_(7.0);
  EXPECT_TRUE(at::equal(base.cpu(), expected));
  base.view({24}).mul_(2.0);
  EXPECT_TRUE(at::equal(base.cpu(), expected * 2));
}

TEST_F(BackendTest, OutVariantWithWrongSizedOutResizesIt) {
  const at::Tensor a = cpu_values({4, 5});
  const at::Tensor b = cpu_values({4, 5}, 1.0);
  at::Tensor out = at::empty({1}, on(brick(0)));
  at::Tensor& returned = at::add_out(out, a.to(brick(0)), b.to(brick(0)));
  EXPECT_TRUE(returned.is_same(out));
  EXPECT_EQ(out.device(), brick(0));
  EXPECT_EQ(out.storage().device(), brick(0));
  EXPECT_EQ(out.sizes(), at::IntArrayRef({4, 5}));
  EXPECT_GE(out.storage().nbytes(), 20 * sizeof(float));
  EXPECT_TRUE(brick::backend::is_brick_allocation(out.storage().data_ptr()));
  EXPECT_TRUE(at::equal(out.cpu(), a + b));
}

TEST_F(BackendTest, MmOutWithWrongSizedOutResizesIt) {
  const at::Tensor a = cpu_values({6, 4});
  const at::Tensor b = cpu_values({4, 2}, 3.0);
  at::Tensor out = at::empty({0}, on(brick(0)));
  at::mm_out(out, a.to(brick(0)), b.to(brick(0)));
  EXPECT_EQ(out.device(), brick(0));
  EXPECT_EQ(out.sizes(), at::IntArrayRef({6, 2}));
  EXPECT_TRUE(at::allclose(out.cpu(), at::mm(a, b)));
}

TEST_F(BackendTest, ResizeKeepsThePrefix) {
  at::Tensor t = at::arange(4, on(brick(0)));
  t.resize_({10});
  EXPECT_EQ(t.device(), brick(0));
  EXPECT_EQ(t.numel(), 10);
  EXPECT_TRUE(at::equal(t.narrow(0, 0, 4).cpu(), at::arange(4, on(kCpu))));
}

TEST_F(BackendTest, InPlaceAndOutOnTheSecondDeviceStayThere) {
  REQUIRE_DEVICES(2);
  const auto before0 = rt().memory_stats(0);
  const auto before1 = rt().memory_stats(1);
  {
    at::Tensor t = at::ones({16}, on(brick(1)));
    t.mul_(4.0);
    EXPECT_EQ(t.device(), brick(1));
    EXPECT_TRUE(at::equal(t.cpu(), at::full({16}, 4.0, on(kCpu))));

    at::Tensor out = at::empty({1}, on(brick(1)));
    at::add_out(out, t, t);  // grows out's storage while brick:0 is current
    EXPECT_EQ(out.device(), brick(1));
    EXPECT_EQ(out.storage().device(), brick(1));
    EXPECT_TRUE(at::equal(out.cpu(), at::full({16}, 8.0, on(kCpu))));
    EXPECT_GE(rt().memory_stats(1).allocated_bytes, before1.allocated_bytes + 2 * 16 * 4);
    EXPECT_EQ(rt().memory_stats(0).allocated_bytes, before0.allocated_bytes)
        << "brick:1 work was counted on brick:0";
  }
  EXPECT_EQ(rt().memory_stats(1).allocated_bytes, before1.allocated_bytes);
  EXPECT_EQ(rt().memory_stats(1).allocations, before1.allocations);
  EXPECT_EQ(rt().current_device(), 0);
}

TEST_F(BackendTest, ConjugateAndNegativeViewsCopyResolved) {
  const at::Tensor cpu = at::complex(cpu_values({2, 3}), cpu_values({2, 3}, 1.0));
  const at::Tensor b = cpu.to(brick(0));
  const at::Tensor conj = b.conj();
  EXPECT_TRUE(conj.is_conj());
  EXPECT_TRUE(conj.storage().is_alias_of(b.storage()));
  EXPECT_TRUE(at::equal(conj.cpu(), cpu.conj().resolve_conj()));
  EXPECT_TRUE(at::equal(conj.resolve_conj().cpu(), cpu.conj().resolve_conj()));
  const at::Tensor neg = b._neg_view();
  EXPECT_TRUE(at::equal(neg.cpu(), -cpu));
  EXPECT_TRUE(at::equal(at::mul(conj, b).cpu(), at::mul(cpu.conj(), cpu)));
}

// cuDNN runs float32 convolutions in TF32 by default (allowTF32CuDNN), about 1e-3 relative
// error; on CUDA backing the comparison with the CPU's IEEE float32 is made with TF32 off, like
// with like. (The host runtime runs the CPU's kernel itself: no effect there.)
class Ieee32Convolutions {
 public:
  Ieee32Convolutions() : previous_(at::globalContext().allowTF32CuDNN()) {
    at::globalContext().setAllowTF32CuDNN(false);
  }
  ~Ieee32Convolutions() { at::globalContext().setAllowTF32CuDNN(previous_); }
  Ieee32Convolutions(const Ieee32Convolutions&) = delete;
  Ieee32Convolutions& operator=(const Ieee32Convolutions&) = delete;

 private:
  bool previous_;
};

TEST_F(BackendTest, Conv2dForwardAndBackwardMatchCpu) {
  const Ieee32Convolutions ieee32;
  const at::Tensor input = cpu_values({2, 3, 8, 8});
  const at::Tensor weight = cpu_values({4, 3, 3, 3}, 0.5);
  const at::Tensor bias = cpu_values({4}, 1.5);

  const at::Tensor cpu_in = input.clone().requires_grad_();
  const at::Tensor cpu_w = weight.clone().requires_grad_();
  const at::Tensor cpu_b = bias.clone().requires_grad_();
  const at::Tensor cpu_out = at::conv2d(cpu_in, cpu_w, cpu_b, {1, 1}, {1, 1});
  cpu_out.sum().backward();

  const at::Tensor b_in = input.to(brick(0)).requires_grad_();
  const at::Tensor b_w = weight.to(brick(0)).requires_grad_();
  const at::Tensor b_b = bias.to(brick(0)).requires_grad_();
  const at::Tensor b_out = at::conv2d(b_in, b_w, b_b, {1, 1}, {1, 1});
  EXPECT_EQ(b_out.device(), brick(0));
  EXPECT_TRUE(at::allclose(b_out.detach().cpu(), cpu_out.detach(), 1e-5, 1e-5));
  b_out.sum().backward();
  ASSERT_TRUE(b_in.grad().defined());
  EXPECT_EQ(b_in.grad().device(), brick(0));
  EXPECT_EQ(b_w.grad().device(), brick(0));
  EXPECT_EQ(b_b.grad().device(), brick(0));
  EXPECT_TRUE(at::allclose(b_in.grad().cpu(), cpu_in.grad(), 1e-4, 1e-4));
  EXPECT_TRUE(at::allclose(b_w.grad().cpu(), cpu_w.grad(), 1e-4, 1e-4));
  EXPECT_TRUE(at::allclose(b_b.grad().cpu(), cpu_b.grad(), 1e-4, 1e-4));
}

TEST_F(BackendTest, AutogradThroughFallbackOpsMatchesCpu) {
  const at::Tensor a = cpu_values({4, 3});
  const at::Tensor w = cpu_values({3, 2}, 0.3);
  const at::Tensor cpu_w = w.clone().requires_grad_();
  at::mm(a, cpu_w).tanh().sum().backward();
  const at::Tensor b_w = w.to(brick(0)).requires_grad_();
  at::mm(a.to(brick(0)), b_w).tanh().sum().backward();
  ASSERT_TRUE(b_w.grad().defined());
  EXPECT_EQ(b_w.grad().device(), brick(0));
  EXPECT_TRUE(at::allclose(b_w.grad().cpu(), cpu_w.grad(), 1e-5, 1e-5));
}

// ---------------------------------------------------------------------------------------------
// Generators

TEST_F(BackendTest, SeededRandomIsReproducible) {
  auto generator = at::globalContext().defaultGenerator(brick(0));
  auto draw = [&] {
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_current_seed(1234);
    }
    return at::randn({64}, on(brick(0)));
  };
  const at::Tensor first = draw();
  const at::Tensor second = draw();
  EXPECT_EQ(first.device(), brick(0));
  EXPECT_TRUE(at::equal(first.cpu(), second.cpu()));
  const at::Tensor third = at::randn({64}, on(brick(0)));
  EXPECT_FALSE(at::equal(third.cpu(), second.cpu())) << "the generator did not advance";
}

// ---------------------------------------------------------------------------------------------
// Streams and events through PyTorch's device guard

TEST_F(BackendTest, GuardStreamsAreBrickStreams) {
  c10::impl::VirtualGuardImpl guard(c10::DeviceType::PrivateUse1);
  EXPECT_EQ(guard.deviceCount(), rt().device_count());
  const c10::Stream current = guard.getStream(brick(0));
  EXPECT_EQ(current.device(), brick(0));
  EXPECT_EQ(current.id(), 0);
  EXPECT_EQ(guard.getDefaultStream(brick(0)).id(), 0);
  const c10::Stream fresh = guard.getNewStream(brick(0));
  const c10::Stream fresh2 = guard.getNewStream(brick(0));
  EXPECT_NE(fresh.id(), 0);
  EXPECT_NE(fresh.id(), fresh2.id());
  {
    c10::StreamGuard stream_guard(fresh);
    EXPECT_EQ(guard.getStream(brick(0)).id(), fresh.id());
    EXPECT_EQ(rt().current_stream(0), fresh.id());
    // Ops still work with a non-default current stream.
    EXPECT_TRUE(
        at::equal(at::add(at::ones({2}, on(brick(0))), 1).cpu(), at::full({2}, 2.0, on(kCpu))));
  }
  EXPECT_EQ(rt().current_stream(0), 0) << "StreamGuard did not restore the default stream";
  EXPECT_TRUE(guard.queryStream(fresh));
  EXPECT_NO_THROW(guard.synchronizeStream(fresh));
  EXPECT_NO_THROW(guard.synchronizeDevice(0));
}

TEST_F(BackendTest, GuardRejectsUnknownStreams) {
  const c10::Stream bogus(c10::Stream::UNSAFE, brick(0), 1 << 30);
  const std::string message = c10_error_message([&] { c10::StreamGuard stream_guard(bogus); });
  EXPECT_CONTAINS(message, std::to_string(1 << 30));
  EXPECT_EQ(rt().current_stream(0), 0);
}

TEST_F(BackendTest, EventsMeasureElapsedTime) {
  const c10::Stream stream =
      c10::impl::VirtualGuardImpl(c10::DeviceType::PrivateUse1).getStream(brick(0));
  c10::Event start(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
  c10::Event end(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
  const auto before = std::chrono::steady_clock::now();
  start.record(stream);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  end.record(stream);
  EXPECT_TRUE(start.query());
  EXPECT_NO_THROW(end.synchronize());
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - before).count();
  const double ms = start.elapsedTime(end);
  EXPECT_GE(ms, 4.5);
  EXPECT_LE(ms, wall_ms + 1.0);  // inside the wall time around it, however busy the machine
}

TEST_F(BackendTest, ElapsedTimeOfUnrecordedEventsThrows) {
  c10::Event start(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
  c10::Event end(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
  const std::string message = c10_error_message([&] { (void)start.elapsedTime(end); });
  EXPECT_CONTAINS(message, "recorded");
}

// ---------------------------------------------------------------------------------------------
// Threads

TEST_F(BackendTest, CurrentDeviceIsPerThread) {
  REQUIRE_DEVICES(2);
  c10::Device seen_default = kCpu;
  c10::Device seen_guarded = kCpu;
  std::thread worker([&] {
    seen_default = at::empty({1}, on(c10::Device(c10::DeviceType::PrivateUse1))).device();
    c10::DeviceGuard guard(brick(1));
    seen_guarded = at::empty({1}, on(c10::Device(c10::DeviceType::PrivateUse1))).device();
  });
  {
    c10::DeviceGuard guard(brick(1));
    worker.join();
  }
  EXPECT_EQ(seen_default, brick(0)) << "a new thread starts on brick:0";
  EXPECT_EQ(seen_guarded, brick(1));
  EXPECT_EQ(rt().current_device(), 0);
}

TEST_F(BackendTest, ConcurrentOpsOnBothDevices) {
  REQUIRE_DEVICES(2);
  const auto before0 = rt().memory_stats(0);
  const auto before1 = rt().memory_stats(1);
  const at::Tensor a = cpu_values({16, 16});
  const at::Tensor expected = at::mm(a, a);
  std::vector<int> failures(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const c10::Device device = brick(t % 2);
      for (int i = 0; i < 50; ++i) {
        const at::Tensor x = a.to(device);
        const at::Tensor y = at::mm(x, x);
        if (y.device() != device || !at::allclose(y.cpu(), expected)) ++failures[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  EXPECT_EQ(rt().memory_stats(0).allocated_bytes, before0.allocated_bytes);
  EXPECT_EQ(rt().memory_stats(1).allocated_bytes, before1.allocated_bytes);
}

// ---------------------------------------------------------------------------------------------
// Memory statistics

TEST_F(BackendTest, MemoryStatsFollowATensorsLifetime) {
  const auto before = rt().memory_stats(0);
  {
    const at::Tensor t = at::empty({1024}, on(brick(0)));
    const auto during = rt().memory_stats(0);
    EXPECT_EQ(during.allocated_bytes, before.allocated_bytes + 4096);
    EXPECT_EQ(during.allocations, before.allocations + 1);
    EXPECT_EQ(during.total_allocations, before.total_allocations + 1);
    EXPECT_GE(during.peak_allocated_bytes, during.allocated_bytes);
  }
  const auto after = rt().memory_stats(0);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.total_frees, before.total_frees + 1);
}

TEST_F(BackendTest, MemoryStatsCountOpResultsUntilFreed) {
  const at::Tensor a = at::ones({512}, on(brick(0)));
  const at::Tensor b = at::ones({512}, on(brick(0)));
  const auto before = rt().memory_stats(0);
  {
    const at::Tensor c = at::add(a, b);  // a fresh result adopted from the backing kernel
    EXPECT_TRUE(brick::backend::is_brick_allocation(c.storage().data_ptr()));
    const auto during = rt().memory_stats(0);
    EXPECT_GE(during.allocated_bytes, before.allocated_bytes + 512 * 4);
    EXPECT_GE(during.allocations, before.allocations + 1);
  }
  const auto after = rt().memory_stats(0);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.adopted_bytes, before.adopted_bytes);
}

TEST_F(BackendTest, MemoryStatsAfterOutResizeReturnToBaseline) {
  const auto before = rt().memory_stats(0);
  {
    const at::Tensor a = at::ones({64, 64}, on(brick(0)));
    at::Tensor out = at::empty({1}, on(brick(0)));
    at::add_out(out, a, a);
    EXPECT_GE(rt().memory_stats(0).allocated_bytes, before.allocated_bytes + 2 * 64 * 64 * 4);
  }
  const auto after = rt().memory_stats(0);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.adopted_bytes, before.adopted_bytes);
}

TEST_F(BackendTest, MemoryStatsAreKeptPerDevice) {
  REQUIRE_DEVICES(2);
  const auto before0 = rt().memory_stats(0).allocated_bytes;
  const auto before1 = rt().memory_stats(1).allocated_bytes;
  {
    const at::Tensor t = at::empty({100}, on(brick(1)));
    EXPECT_EQ(rt().memory_stats(0).allocated_bytes, before0);
    EXPECT_EQ(rt().memory_stats(1).allocated_bytes, before1 + 400);
  }
  EXPECT_EQ(rt().memory_stats(1).allocated_bytes, before1);
}

TEST_F(BackendTest, ViewsAllocateNothing) {
  const at::Tensor base = at::ones({8, 8}, on(brick(0)));
  const auto before = rt().memory_stats(0);
  const at::Tensor views[] = {base.view({64}), base.t(), base.as_strided({4}, {9}),
                              base.select(1, 3), base.reshape({2, 32})};
  const auto after = rt().memory_stats(0);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.total_allocations, before.total_allocations);
  for (const at::Tensor& v : views) EXPECT_TRUE(v.storage().is_alias_of(base.storage()));
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST_F(BackendTest, MixingBrickDevicesThrows) {
  REQUIRE_DEVICES(2);
  const at::Tensor a = at::ones({3}, on(brick(0)));
  const at::Tensor b = at::ones({3}, on(brick(1)));
  const std::string message = c10_error_message([&] { (void)at::add(a, b); });
  EXPECT_CONTAINS(message, "brick:0");
  EXPECT_CONTAINS(message, "brick:1");
  EXPECT_CONTAINS(message, "same device");
  EXPECT_EQ(rt().current_device(), 0) << "a failed op left another device current";
}

TEST_F(BackendTest, MixingBrickAndCpuThrows) {
  const at::Tensor a = at::ones({3}, on(brick(0)));
  const at::Tensor b = at::ones({3}, on(kCpu));
  const std::string message = c10_error_message([&] { (void)at::add(a, b); });
  EXPECT_CONTAINS(message, "brick:0");
  EXPECT_CONTAINS(message, "cpu");
}

TEST_F(BackendTest, MixingCpuFirstWithTheSecondBrickDeviceNamesIt) {
  // The mismatch must be reported against the brick tensors' device, not the current one.
  REQUIRE_DEVICES(2);
  const at::Tensor cpu = at::ones({3}, on(kCpu));
  const at::Tensor b = at::ones({3}, on(brick(1)));
  const std::string message = c10_error_message([&] { (void)at::add(cpu, b); });
  EXPECT_CONTAINS(message, "cpu");
  EXPECT_CONTAINS(message, "brick:1");
}

TEST_F(BackendTest, DeviceIndexOutOfRangeThrows) {
  const int count = rt().device_count();
  const int bad = count;
  const at::Tensor cpu = at::ones({2}, on(kCpu));
  const std::vector<std::pair<const char*, std::string>> cases = {
      {"empty", c10_error_message([&] { (void)at::empty({2}, on(brick(bad))); })},
      {"ones", c10_error_message([&] { (void)at::ones({2}, on(brick(bad))); })},
      {"empty_strided",
       c10_error_message([&] { (void)at::empty_strided({2}, {1}, on(brick(bad))); })},
      {"to", c10_error_message([&] { (void)cpu.to(brick(bad)); })},
      {"DeviceGuard", c10_error_message([&] { c10::DeviceGuard guard(brick(bad)); })},
  };
  for (const auto& [what, message] : cases) {
    SCOPED_TRACE(what);
    // Names the offending index and the valid range, whatever the exact wording.
    EXPECT_CONTAINS(message, std::to_string(bad));
    EXPECT_CONTAINS(message, "out of range");
    EXPECT_CONTAINS(message, "0.." + std::to_string(count - 1));
  }
  EXPECT_EQ(rt().current_device(), 0);
}

// ---------------------------------------------------------------------------------------------
// Backing aliases lent from the thread's pool (direct kernels, copies)

// True when `alias` is a backing-device view of exactly `brick_tensor`'s elements.
void expect_aliases(const at::Tensor& alias, const at::Tensor& brick_tensor) {
  EXPECT_EQ(alias.device(), brick::backend::backing_device(brick_tensor.device().index()));
  EXPECT_EQ(alias.data_ptr(), brick_tensor.data_ptr());
  EXPECT_EQ(alias.sizes(), brick_tensor.sizes());
  EXPECT_EQ(alias.strides(), brick_tensor.strides());
  EXPECT_EQ(alias.storage_offset(), brick_tensor.storage_offset());
  EXPECT_EQ(alias.dtype(), brick_tensor.dtype());
}

TEST_F(BackendTest, LentAliasesAreDistinctViewsOfTheirTensors) {
  const at::Tensor x = cpu_values({4, 6}).to(brick(0));
  const at::Tensor y = cpu_values({3, 5}, 1.0).to(brick(0), at::kDouble).t();  // strided
  const at::Tensor z = x.narrow(1, 2, 3);                                      // offset
  brick::backend::LentAliases aliases;
  const at::Tensor& ax = aliases(x);
  const at::Tensor& ay = aliases(y);
  const at::Tensor& az = aliases(z);
  EXPECT_NE(ax.unsafeGetTensorImpl(), ay.unsafeGetTensorImpl());
  EXPECT_NE(ax.unsafeGetTensorImpl(), az.unsafeGetTensorImpl());
  expect_aliases(ax, x);
  expect_aliases(ay, y);
  expect_aliases(az, z);
  at::Tensor& mutable_x = aliases(x);
  mutable_x.add_(1.0);  // writes land in the brick tensor's memory
  EXPECT_TRUE(at::allclose(x.cpu(), cpu_values({4, 6}) + 1.0));
}

TEST_F(BackendTest, NestedLentAliasesNeverShareOne) {
  const at::Tensor x = cpu_values({8}).to(brick(0));
  const at::Tensor y = cpu_values({2, 2}).to(brick(0));
  brick::backend::LentAliases outer;
  const at::Tensor& ax = outer(x);
  {
    brick::backend::LentAliases inner;  // a kernel running inside another on this thread
    const at::Tensor& ay = inner(y);
    const at::Tensor& ax_again = inner(x);
    EXPECT_NE(ay.unsafeGetTensorImpl(), ax.unsafeGetTensorImpl());
    EXPECT_NE(ax_again.unsafeGetTensorImpl(), ax.unsafeGetTensorImpl());
    expect_aliases(ay, y);
  }
  expect_aliases(ax, x);  // the inner scope's end left the outer's alias alone
  brick::backend::LentAliases after;
  EXPECT_NE(after(y).unsafeGetTensorImpl(), ax.unsafeGetTensorImpl());
  expect_aliases(ax, x);
}

TEST_F(BackendTest, MoreLentAliasesThanThePoolHoldsStayValid) {
  std::vector<at::Tensor> tensors;
  for (int i = 0; i < 3 * static_cast<int>(brick::backend::AliasPool::kSize); ++i) {
    tensors.push_back(cpu_values({i + 1}, i).to(brick(0)));
  }
  brick::backend::LentAliases aliases;
  std::vector<const at::Tensor*> lent;
  for (const at::Tensor& tensor : tensors) lent.push_back(&aliases(tensor));
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE(i);
    expect_aliases(*lent[i], tensors[i]);                      // none was repointed by a later one
    EXPECT_TRUE(at::equal(lent[i]->cpu(), tensors[i].cpu()));  // the alias is the backing's
  }
}

TEST_F(BackendTest, AnAliasAKernelKeepsIsNotReused) {
  const at::Tensor x = cpu_values({5}).to(brick(0));
  const at::Tensor y = cpu_values({7}, 3.0).to(brick(0));
  at::Tensor kept;
  {
    brick::backend::LentAliases aliases;
    kept = aliases(x);  // as a kernel that returns or saves its input would
  }
  for (int i = 0; i < 2 * static_cast<int>(brick::backend::AliasPool::kSize); ++i) {
    brick::backend::LentAliases aliases;
    expect_aliases(aliases(y), y);
    const at::Tensor copied = aliases(y);  // as a tensor list's aliases are kept for the call
    expect_aliases(copied, y);
  }
  expect_aliases(kept, x);
}

// ---------------------------------------------------------------------------------------------
// BackingCall: the one way a brick kernel runs on the backing device

// (The device calls name the last brick device: the second where there are two, as on the host
// runtime, so that a call is seen to name its own device and not the current one.)
TEST_F(BackendTest, BackingCallNamesAFailureWithItsOpAndDevice) {
  const c10::DeviceIndex last = rt().device_count() - 1;
  const std::string message = c10_error_message([last] {
    brick::backend::BackingCall call("aten::sample", "Tensor", last);
    call.run([] { TORCH_CHECK(false, "the kernel refused"); });
  });
  EXPECT_NE(message.find("the kernel refused"), std::string::npos) << message;
  const std::string backing = c10::DeviceTypeName(brick::backend::backing_device_type(), true);
  EXPECT_NE(message.find("brick: aten::sample.Tensor on brick:" + std::to_string(last) +
                         " failed on its backing device (" + backing + ")"),
            std::string::npos)
      << message;
  const std::string no_overload = c10_error_message([] {
    brick::backend::BackingCall call("aten::sample", "", 0);
    call.run([] { TORCH_CHECK(false, "no"); });
  });
  EXPECT_NE(no_overload.find("brick: aten::sample on brick:0 failed"), std::string::npos)
      << no_overload;
}

TEST_F(BackendTest, BackingCallEntersItsDeviceAndRestoresTheCurrentOneAfterAFailure) {
  REQUIRE_DEVICES(2);
  ASSERT_EQ(rt().current_device(), 0);
  {
    brick::backend::BackingCall call("aten::sample", "", 1);
    EXPECT_EQ(call.device(), 1);
    EXPECT_EQ(rt().current_device(), 1);
  }
  EXPECT_EQ(rt().current_device(), 0);
  EXPECT_THROW(
      {
        brick::backend::BackingCall call("aten::sample", "", 1);
        call.run([] { TORCH_CHECK(false, "no"); });
      },
      c10::Error);
  EXPECT_EQ(rt().current_device(), 0);
}

TEST_F(BackendTest, BackingCallLendsAliasesAndAdoptsResultsOnItsDevice) {
  const c10::DeviceIndex last = rt().device_count() - 1;
  const at::Tensor x = cpu_values({6}).to(brick(last));
  brick::backend::BackingCall call("aten::sample", "", last);
  const at::Tensor& alias = call.alias(x);
  EXPECT_EQ(alias.device(), brick::backend::backing_device(last));
  EXPECT_EQ(alias.data_ptr(), x.data_ptr()) << "an alias shares the brick tensor's bytes";
  const at::Tensor scalar = at::scalar_tensor(2.0, on(kCpu));
  EXPECT_TRUE(call.alias(scalar).is_same(scalar)) << "a host tensor goes as it is";
  EXPECT_FALSE(call.alias(std::optional<at::Tensor>()).defined());
  const at::Tensor result = call.adopt(call.run([&] { return alias * 2; }));
  EXPECT_EQ(result.device(), brick(last));
  EXPECT_TRUE(at::equal(result.cpu(), x.cpu() * 2));
  EXPECT_FALSE(call.adopt(at::Tensor()).defined());
}

// Counts the ops RecordFunction sees on this thread while it lives.
class RecordedOps {
 public:
  RecordedOps()
      : handle_(at::addThreadLocalCallback(at::RecordFunctionCallback(&RecordedOps::on_enter)
                                               .scopes({at::RecordScope::FUNCTION}))) {
    count() = 0;
  }
  ~RecordedOps() { at::removeCallback(handle_); }
  static int& count() {
    thread_local int recorded = 0;
    return recorded;
  }

 private:
  static std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& /*fn*/) {
    ++count();
    return nullptr;
  }
  at::CallbackHandle handle_;
};

TEST_F(BackendTest, ADispatchingBackingCallRecordsNoOpOfItsOwnWork) {
  const at::Tensor x = cpu_values({4});
  RecordedOps recorded;
  {
    brick::backend::DispatchingBackingCall call("aten::sample", "", 0);
    (void)call.run([&] { return at::add(x, x); });
    EXPECT_EQ(RecordedOps::count(), 0) << "the backing device's ops are the brick op's device work";
  }
  (void)at::add(x, x);
  EXPECT_GT(RecordedOps::count(), 0) << "recording resumes when the call ends";
  const int before = RecordedOps::count();
  {
    brick::backend::BackingCall call("aten::sample", "", 0);  // redispatching: nothing silenced
    (void)at::add(x, x);
  }
  EXPECT_GT(RecordedOps::count(), before);
}

// Records the order of a launch's announcements.
class LaunchOrder final : public brick::runtime::LaunchObserver {
 public:
  std::vector<std::string> seen;
  void begin(brick::runtime::Launch& launch) noexcept override {
    seen.push_back(std::string("begin ") + launch.name);
  }
  void queue(brick::runtime::Launch& launch) noexcept override {
    seen.push_back("queue " + std::to_string(launch.device));
  }
  void end(brick::runtime::Launch& /*launch*/) noexcept override { seen.push_back("end"); }
  void collective_done(const brick::runtime::Launch& /*launch*/,
                       int64_t /*device_ns*/) noexcept override {}
};

TEST_F(BackendTest, ABackingCallPreparesItsArgumentsInsideItsLaunch) {
  static LaunchOrder order;  // an installed observer must outlive every launch that read it
  order.seen.clear();
  const c10::DeviceIndex last = rt().device_count() - 1;
  brick::runtime::set_launch_observer(&order);
  {
    brick::backend::BackingCall call("aten::sample", "", brick::runtime::LaunchKind::Kernel,
                                     [last] {
                                       order.seen.push_back("prepare");
                                       return last;
                                     });
    order.seen.push_back("run");
  }
  brick::runtime::set_launch_observer(nullptr);
  EXPECT_EQ(order.seen, (std::vector<std::string>{"begin aten::sample", "prepare",
                                                  "queue " + std::to_string(last), "run", "end"}));
}

// ---------------------------------------------------------------------------------------------
// Pinned host memory (host runtime)

TEST_F(BackendTest, PinnedHostMemoryIsRecognisedInsideItsBlockOnly) {
  if (brick::backend::cuda_backing()) GTEST_SKIP() << "CUDA backing pins through CUDA's allocator";
  const auto& hooks = at::detail::getPrivateUse1Hooks();
  c10::Allocator* pinned = hooks.getPinnedMemoryAllocator();
  c10::DataPtr block = pinned->allocate(256);
  auto* start = static_cast<char*>(block.get());
  ASSERT_NE(start, nullptr);
  EXPECT_TRUE(hooks.isPinnedPtr(start));
  EXPECT_TRUE(hooks.isPinnedPtr(start + 255)) << "an address inside the block is pinned";
  EXPECT_FALSE(hooks.isPinnedPtr(start + 256)) << "one past the end is not";
  const at::Tensor ordinary = at::empty({64}, on(kCpu));
  EXPECT_FALSE(hooks.isPinnedPtr(ordinary.data_ptr()));
  EXPECT_FALSE(hooks.isPinnedPtr(nullptr));
  const at::Tensor pinned_tensor = at::empty({64}, on(kCpu)).pin_memory();
  EXPECT_TRUE(pinned_tensor.is_pinned());
  block.clear();
  EXPECT_FALSE(hooks.isPinnedPtr(start)) << "a freed block is forgotten";
}

}  // namespace
