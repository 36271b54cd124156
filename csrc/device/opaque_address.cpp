#include "opaque_address.h"

#include <c10/util/Exception.h>

#include <map>
#include <mutex>

namespace recdev::device {

namespace {

constexpr uintptr_t kFirst = uintptr_t{1} << 55;
constexpr uintptr_t kEnd = uintptr_t{1} << 56;
// Slot granularity: 16 TiB holds a 10^10-row table of 128 float32s (5.1 TB).
constexpr int kSlotShift = 44;
constexpr uint64_t kSlots = (kEnd - kFirst) >> kSlotShift;

struct Ranges {
  std::mutex mutex;
  std::map<uint64_t, uint64_t> used;  // first slot -> slot count
};

Ranges& ranges() {
  static Ranges instance;
  return instance;
}

}  // namespace

uintptr_t reserve_opaque_range(uint64_t nbytes) {
  const uint64_t slots = nbytes == 0 ? 1 : ((nbytes - 1) >> kSlotShift) + 1;
  TORCH_CHECK(slots <= kSlots, "recdev: a table of ", nbytes, " bytes cannot be addressed (the limit is ",
              kSlots << kSlotShift, " bytes); use fewer rows or a narrower row");
  Ranges& r = ranges();
  std::lock_guard<std::mutex> lock(r.mutex);
  uint64_t candidate = 0;
  for (const auto& [first, count] : r.used) {
    if (first - candidate >= slots) {
      break;
    }
    candidate = first + count;
  }
  TORCH_CHECK(candidate + slots <= kSlots, "recdev: out of table address space (", r.used.size(),
              " tables live); free tables you no longer use");
  r.used.emplace(candidate, slots);
  return kFirst + (uintptr_t{candidate} << kSlotShift);
}

void release_opaque_range(uintptr_t base) {
  Ranges& r = ranges();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.used.erase((base - kFirst) >> kSlotShift);
}

}  // namespace recdev::device
