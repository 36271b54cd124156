// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of the disk tier's blocks, of
// versions and of torch.save's table snapshots. x86's SSE4.2 `crc32` instruction computes it eight
// bytes per instruction, on three interleaved streams past 24 KiB (about 3 bytes per cycle per core);
// a portable table-driven version runs where the instruction is missing (chosen once, at run time).
#pragma once

#include <cstddef>
#include <cstdint>

namespace recdev::store {

// Continues a running checksum: crc32c_update(crc32c_update(0, a), b) == crc32c of a followed by b.
uint32_t crc32c_update(uint32_t crc, const void* data, size_t size);
// The portable version, for tests that compare the two.
uint32_t crc32c_update_portable(uint32_t crc, const void* data, size_t size);

}  // namespace recdev::store
