// The device guard: recdev has a single device. Its streams are real handles (each thread has a
// current stream; new streams get their own ids) over one timeline, since every kernel completes
// before it returns and the only later work is the async-op thread's (async_ops.h): any stream's
// work is ordered before anything issued after it, so waiting on a stream, an event or the device
// means waiting for the async store operations issued before. Synchronizing the device also reads
// the answers of remote updates backward did not wait for (connect's overlap_updates) and raises a
// refused one. DeviceGuard, torch.Stream / torch.Event, torch.accelerator and autograd's engine call
// it; torch.recdev wraps it.

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>

#include "async_ops.h"
#include "current_store.h"

namespace recdev::device {

namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;

void check_device(c10::Device d) {
  TORCH_CHECK(d.type() == kType && (d.index() == 0 || d.index() == -1), "recdev has one device, recdev:0; got ", d);
}

c10::Stream stream_of_id(c10::StreamId id) { return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, 0), id); }

// Id 0 is the default stream; new streams count up from 1 (they own nothing, so ids are never reused).
std::atomic<c10::StreamId> last_stream_id{0};
thread_local c10::StreamId current_stream_id = 0;

// An event is the last async operation issued when it was recorded (0: none, or never recorded).
struct Event {
  uint64_t ticket = 0;
};

uint64_t ticket_of(void* event) { return event == nullptr ? 0 : static_cast<Event*>(event)->ticket; }

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
    check_device(d);
    return stream_of_id(current_stream_id);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    check_device(d);
    return stream_of_id(0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getNewStream(d, 0); }
  c10::Stream getNewStream(c10::Device d, int) const override {
    check_device(d);
    return stream_of_id(++last_stream_id);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    check_device(s.device());
    const c10::Stream previous = stream_of_id(current_stream_id);
    current_stream_id = s.id();
    return previous;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex, const c10::EventFlag) const override {
    check_device(stream.device());
    if (*event == nullptr) {
      *event = new Event();
    }
    static_cast<Event*>(*event)->ticket = last_async_op();
  }
  // Work issued on the stream after this call runs either on the calling thread (after this wait)
  // or on the async-op thread (after the event's operations, in issue order).
  void block(void* event, const c10::Stream&) const override { wait_for_async_ops(ticket_of(event)); }
  bool queryEvent(void* event) const override { return async_ops_done_through(ticket_of(event)); }
  void synchronizeEvent(void* event) const override { wait_for_async_ops(ticket_of(event)); }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override { delete static_cast<Event*>(event); }
  bool queryStream(const c10::Stream&) const override { return async_ops_done_through(last_async_op()); }
  void synchronizeStream(const c10::Stream&) const override { wait_for_async_ops(last_async_op()); }
  void synchronizeDevice(const c10::DeviceIndex) const override {
    wait_for_async_ops(last_async_op());
    wait_for_store_answers();
  }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, RecdevGuardImpl);

}  // namespace recdev::device
