// GoogleTest suite for choosing the runtime: BRICK_RUNTIME, the CUDA backing check of the layer
// above, and what an unusable GPU says. make_runtime_from_env() is what get() runs once; these
// tests hold on either kind of machine: where a GPU is usable they expect the CUDA runtime.
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <optional>
#include <string>

#include "runtime/runtime.h"
#include "runtime_test_util.h"
#include "test_util.h"

namespace brick::runtime {
namespace {

using brick::test::error_message;

// CUDA backing checks standing in for a CPU-only PyTorch above the runtime.
std::optional<std::string> refuse_cuda_backing() {
  return "this PyTorch build cannot run CUDA kernels";
}
std::optional<std::string> refuse_cuda_backing_without_reason() { return ""; }

class SelectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (size_t i = 0; i < kVariables.size(); ++i) {
      if (const char* value = std::getenv(kVariables[i])) saved_[i] = value;
    }
    gpu_usable_ = cuda_runtime_usable(&gpu_reason_);
    unsetenv("BRICK_HOST_DEVICES");
  }
  void TearDown() override {
    set_cuda_backing_check(nullptr);
    for (size_t i = 0; i < kVariables.size(); ++i) {
      if (saved_[i]) {
        setenv(kVariables[i], saved_[i]->c_str(), 1);
      } else {
        unsetenv(kVariables[i]);
      }
    }
  }

  static constexpr std::array<const char*, 2> kVariables = {"BRICK_RUNTIME", "BRICK_HOST_DEVICES"};
  std::array<std::optional<std::string>, 2> saved_;
  bool gpu_usable_ = false;
  std::string gpu_reason_;
};

TEST_F(SelectionTest, InvalidValueListsTheValidOnes) {
  for (const char* bad : {"gpu", "CUDA", "host ", "none"}) {
    setenv("BRICK_RUNTIME", bad, 1);
    const std::string message = error_message([] { make_runtime_from_env(); });
    EXPECT_CONTAINS(message, (std::string("BRICK_RUNTIME='") + bad + "' is not valid")) << bad;
    EXPECT_CONTAINS(message, ("'auto'"));
    EXPECT_CONTAINS(message, ("'host'"));
    EXPECT_CONTAINS(message, ("'cuda'"));
  }
}

TEST_F(SelectionTest, HostIsAlwaysTheHostRuntime) {
  setenv("BRICK_RUNTIME", "host", 1);
  setenv("BRICK_HOST_DEVICES", "3", 1);
  const RuntimeChoice choice = make_runtime_from_env();
  EXPECT_EQ(choice.runtime->backing_kind(), BackingKind::Host);
  EXPECT_EQ(choice.runtime->device_count(), 3);
  EXPECT_CONTAINS(choice.note, ("BRICK_RUNTIME=host"));
}

TEST_F(SelectionTest, AutoIsTheDefaultAndFallsBackToHostWithTheReason) {
  for (const char* value : {static_cast<const char*>(nullptr), "", "auto"}) {
    if (value == nullptr) {
      unsetenv("BRICK_RUNTIME");
    } else {
      setenv("BRICK_RUNTIME", value, 1);
    }
    const RuntimeChoice choice = make_runtime_from_env();
    if (gpu_usable_) {
      EXPECT_EQ(choice.runtime->backing_kind(), BackingKind::Cuda);
      EXPECT_CONTAINS(choice.note, ("chose the cuda runtime"));
    } else {
      EXPECT_EQ(choice.runtime->backing_kind(), BackingKind::Host);
      EXPECT_EQ(choice.runtime->device_count(), 2) << "BRICK_HOST_DEVICES' default";
      EXPECT_CONTAINS(choice.note, ("BRICK_RUNTIME=auto chose the host runtime because"));
      EXPECT_CONTAINS(choice.note, (gpu_reason_));
    }
  }
}

TEST_F(SelectionTest, AutoRespectsADisallowedCudaBacking) {
  setenv("BRICK_RUNTIME", "auto", 1);
  set_cuda_backing_check(&refuse_cuda_backing);
  const RuntimeChoice choice = make_runtime_from_env();
  EXPECT_EQ(choice.runtime->backing_kind(), BackingKind::Host);
  EXPECT_CONTAINS(choice.note, ("because this PyTorch build cannot run CUDA kernels"));
}

TEST_F(SelectionTest, CudaWithoutAGpuThrowsTheReason) {
  setenv("BRICK_RUNTIME", "cuda", 1);
  if (gpu_usable_) {
    EXPECT_EQ(make_runtime_from_env().runtime->backing_kind(), BackingKind::Cuda);
    return;
  }
  const std::string message = error_message([] { make_runtime_from_env(); });
  EXPECT_CONTAINS(message, ("brick: BRICK_RUNTIME=cuda was asked for but "));
  EXPECT_CONTAINS(message, (gpu_reason_));
  EXPECT_CONTAINS(message, ("; unset it or use BRICK_RUNTIME=host"));
}

TEST_F(SelectionTest, CudaWhenCudaBackingIsDisallowedThrowsThatReason) {
  setenv("BRICK_RUNTIME", "cuda", 1);
  set_cuda_backing_check(&refuse_cuda_backing);
  EXPECT_CONTAINS(error_message([] { make_runtime_from_env(); }),
                  ("BRICK_RUNTIME=cuda was asked for but this PyTorch build cannot run CUDA "
                   "kernels; unset it or use BRICK_RUNTIME=host"));
  set_cuda_backing_check(&refuse_cuda_backing_without_reason);  // no reason given: still a sentence
  EXPECT_CONTAINS(error_message([] { make_runtime_from_env(); }), ("disallowed"));
}

TEST(CudaAvailability, UnusableCudaExplainsItselfConsistently) {
  std::string why;
  if (cuda_runtime_usable(&why)) GTEST_SKIP() << "a GPU is usable here";
  EXPECT_FALSE(why.empty());
  EXPECT_FALSE(cuda_runtime_usable(nullptr));
#if BRICK_WITH_CUDA
  EXPECT_CONTAINS(why, ("cudaGetDeviceCount"));
#else
  EXPECT_EQ(why,
            "this build of torch_brickdev has no CUDA runtime (built without the CUDA toolkit)");
#endif
  const std::string message = error_message([] { make_cuda_runtime(); });
  EXPECT_CONTAINS(message, ("brick: cannot create the CUDA runtime"));
}

}  // namespace
}  // namespace brick::runtime
