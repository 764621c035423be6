// The brick random generator: the backing device's own generator, labelled as brick.
//
// Backing-device kernels take a generator of their own device type, so a brick generator wraps
// one; the fallback hands the wrapped generator to the kernel. Seeding brick and the backing
// device alike therefore produces the same numbers.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace brick::backend {

class BrickGenerator final : public c10::GeneratorImpl {
 public:
  BrickGenerator(c10::DeviceIndex device, uint64_t seed);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  static c10::DeviceType device_type();

  // The generator that backing-device kernels draw from.
  const at::Generator& backing() const { return backing_; }

 private:
  BrickGenerator* clone_impl() const override;
  mutable at::Generator backing_;  // mutable: its mutex guards const reads too
};

// The default generator of brick device `device` (-1: the current device).
const at::Generator& brick_default_generator(c10::DeviceIndex device);

}  // namespace brick::backend
