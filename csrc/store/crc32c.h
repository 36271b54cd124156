// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of the disk tier's blocks, of
// versions and of torch.save's table snapshots. Chosen once, at run time, the fastest this CPU has:
// carry-less multiplication folding 256 bytes at a time (AVX-512 VPCLMULQDQ: as fast as memory);
// else SSE4.2's `crc32` instruction, eight bytes per instruction on three interleaved streams past
// 24 KiB (about 3 bytes per cycle per core); else a portable table-driven version.
#pragma once

#include <cstddef>
#include <cstdint>

namespace recdev::store {

// Continues a running checksum: crc32c_update(crc32c_update(0, a), b) == crc32c of a followed by b.
uint32_t crc32c_update(uint32_t crc, const void* data, size_t size);
// The portable version, for tests that compare the two.
uint32_t crc32c_update_portable(uint32_t crc, const void* data, size_t size);
// Which version crc32c_update runs here: "vpclmulqdq", "sse4.2" or "portable" (ATEN_CPU_CAPABILITY
// caps it as it caps the other kernels: "avx2" rules out the first, "default" both).
const char* crc32c_kernel();

}  // namespace recdev::store
