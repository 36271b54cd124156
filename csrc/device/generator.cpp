#include "generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <mutex>

namespace recdev::device {

namespace {

constexpr uint64_t kDefaultSeed = 67280421310721ULL;  // CPU's default seed.
constexpr size_t kStateBytes = 2 * sizeof(uint64_t);

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

RecdevGenerator::RecdevGenerator(c10::DeviceIndex index)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, index),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(kDefaultSeed) {}

void RecdevGenerator::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

uint64_t RecdevGenerator::current_seed() const { return seed_; }

uint64_t RecdevGenerator::seed() {
  const uint64_t random = c10::detail::getNonDeterministicRandom();
  set_current_seed(random);
  return random;
}

void RecdevGenerator::set_offset(uint64_t offset) { offset_ = offset; }

uint64_t RecdevGenerator::get_offset() const { return offset_; }

void RecdevGenerator::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() &&
                  new_state.numel() == static_cast<int64_t>(kStateBytes) && new_state.is_contiguous(),
              "recdev: an RNG state is a contiguous uint8 tensor of ", kStateBytes,
              " bytes (seed, offset), as returned by torch.recdev.get_rng_state(); got ", new_state.numel(),
              " elements of ", new_state.dtype().name());
  uint64_t words[2];
  std::memcpy(words, new_state.data(), kStateBytes);
  seed_ = words[0];
  offset_ = words[1];
}

c10::intrusive_ptr<c10::TensorImpl> RecdevGenerator::get_state() const {
  auto state = at::empty({static_cast<int64_t>(kStateBytes)}, at::kByte);
  const uint64_t words[2] = {seed_, offset_};
  std::memcpy(state.data_ptr(), words, kStateBytes);
  return state.getIntrusivePtr();
}

uint64_t RecdevGenerator::next_op_seed() { return splitmix64(seed_ ^ splitmix64(offset_++)); }

RecdevGenerator* RecdevGenerator::clone_impl() const {
  auto* copy = new RecdevGenerator(device().index());
  copy->seed_ = seed_;
  copy->offset_ = offset_;
  return copy;
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  TORCH_CHECK(index == -1 || index == 0, "recdev has one device (recdev:0); got device index ",
              static_cast<int>(index));
  static at::Generator generator = at::make_generator<RecdevGenerator>(0);
  return generator;
}

uint64_t draw_op_seed(const std::optional<at::Generator>& generator) {
  at::Generator source = generator.has_value() && generator->defined() ? *generator : default_generator(0);
  TORCH_CHECK(source.device().type() == c10::DeviceType::PrivateUse1,
              "Expected a 'recdev' device type for generator but found '", source.device().type(), "'");
  std::lock_guard<std::mutex> lock(source.mutex());
  return at::check_generator<RecdevGenerator>(source)->next_op_seed();
}

at::Generator cpu_generator_for_op(const std::optional<at::Generator>& generator) {
  return at::make_generator<at::CPUGeneratorImpl>(draw_op_seed(generator));
}

}  // namespace recdev::device
