#pragma once
// The recdev generator. Its state is a (seed, offset) pair, like CUDA's
// Philox generator: each random op consumes one offset, so a stream of ops is
// reproducible from the seed alone and a state is two integers to save. Lazy
// table rows derive their initial values from the same seed.

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace recdev::device {

class RecdevGenerator final : public c10::GeneratorImpl {
 public:
  explicit RecdevGenerator(c10::DeviceIndex index = 0);

  // Read by at::check_generator.
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  // A 64-bit seed for one random op: a hash of (seed, offset), then offset+1.
  // Callers hold the generator's mutex.
  uint64_t next_op_seed();

 private:
  RecdevGenerator* clone_impl() const override;

  uint64_t seed_;
  uint64_t offset_ = 0;
};

const at::Generator& default_generator(c10::DeviceIndex index);

// The 64-bit seed of one random op, drawn from `generator` (the recdev
// default generator when absent): what a lazy table's init rule is seeded with.
uint64_t draw_op_seed(const std::optional<at::Generator>& generator);

// A CPU generator that draws the stream of one random op from `generator`
// (the recdev default generator when absent). CPU kernels take it in place of
// their own default generator.
at::Generator cpu_generator_for_op(const std::optional<at::Generator>& generator);

}  // namespace recdev::device
