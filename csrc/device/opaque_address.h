#pragma once
// Addresses for table storage. A table's DataPtr must be an address that
// crashes at once if anything dereferences it on the host, instead of reading
// or corrupting real memory. Addresses with a bit between 48 and 55 set are
// non-canonical on x86-64 and unmapped translation faults on aarch64 (whose
// top-byte-ignore covers bits 56-63 only), so every table gets a range there.

#include <cstdint>

namespace recdev::device {

// Reserves an opaque range of at least `nbytes`. Throws if the range of
// opaque addresses cannot hold it (a table too large to address).
uintptr_t reserve_opaque_range(uint64_t nbytes);
void release_opaque_range(uintptr_t base);

}  // namespace recdev::device
