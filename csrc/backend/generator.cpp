#include "backend/generator.h"

#include <array>
#include <mutex>

#include "backend/backing.h"
#include "backend/device_index.h"

namespace brick::backend {

BrickGenerator::BrickGenerator(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kBrick, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      backing_(make_backing_generator(device, seed)) {}

void BrickGenerator::set_current_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(backing_.mutex());
  backing_.set_current_seed(seed);
}

void BrickGenerator::set_offset(uint64_t offset) {
  std::lock_guard<std::mutex> lock(backing_.mutex());
  backing_.set_offset(offset);
}

uint64_t BrickGenerator::get_offset() const {
  std::lock_guard<std::mutex> lock(backing_.mutex());
  return backing_.get_offset();
}

uint64_t BrickGenerator::current_seed() const {
  std::lock_guard<std::mutex> lock(backing_.mutex());
  return backing_.current_seed();
}

uint64_t BrickGenerator::seed() {
  std::lock_guard<std::mutex> lock(backing_.mutex());
  return backing_.seed();
}

void BrickGenerator::set_state(const c10::TensorImpl& new_state) {
  std::lock_guard<std::mutex> lock(backing_.mutex());
  backing_.unsafeGetGeneratorImpl()->set_state(new_state);
}

c10::intrusive_ptr<c10::TensorImpl> BrickGenerator::get_state() const {
  std::lock_guard<std::mutex> lock(backing_.mutex());
  return backing_.unsafeGetGeneratorImpl()->get_state();
}

c10::DeviceType BrickGenerator::device_type() { return kBrick; }

BrickGenerator* BrickGenerator::clone_impl() const {
  auto* copy = new BrickGenerator(device().index(), 0);
  std::lock_guard<std::mutex> lock(backing_.mutex());
  copy->backing_ = backing_.clone();
  return copy;
}

// Default generators, one per device, created on first use.
const at::Generator& brick_default_generator(c10::DeviceIndex device) {
  static std::array<at::Generator, runtime::kMaxDevices> generators;
  static std::array<std::once_flag, runtime::kMaxDevices> created;
  const auto index = resolve_device_index(device);
  std::call_once(created[index], [&] {
    generators[index] = at::make_generator<BrickGenerator>(index, c10::default_rng_seed_val);
  });
  return generators[index];
}

}  // namespace brick::backend
