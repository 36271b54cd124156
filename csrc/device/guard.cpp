// The device guard: recdev has a single device and executes synchronously, so
// streams and events are trivial. It still has to exist, because
// DeviceGuard, torch.device contexts and autograd's engine ask for it.

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

namespace recdev::device {

namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;

void check_device(c10::Device d) {
  TORCH_CHECK(d.type() == kType && (d.index() == 0 || d.index() == -1), "recdev has one device, recdev:0; got ", d);
}

struct RecdevGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    check_device(d);
    return c10::Device(kType, 0);
  }
  c10::Device getDevice() const override { return c10::Device(kType, 0); }
  void setDevice(c10::Device d) const override { check_device(d); }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kType, 0));
  }
  c10::Stream getNewStream(c10::Device d, int) const override { return getStream(d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return getStream(s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  // Work is complete when a kernel returns; events record nothing.
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, RecdevGuardImpl);

}  // namespace recdev::device
