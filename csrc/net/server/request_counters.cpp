#include "request_counters.h"

#include <bit>

namespace recdev::net {

namespace {

// The stripe of the calling thread: threads take stripes in turn as they first count.
size_t this_threads_stripe(size_t stripes) {
  static std::atomic<size_t> next{0};
  thread_local const size_t stripe = next.fetch_add(1, std::memory_order_relaxed) % stripes;
  return stripe;
}

}  // namespace

RequestCounters::RequestCounters() {
  for (int byte = 0; byte < 256; ++byte) {
    if (opcode_name(uint8_t(byte)) == nullptr) continue;
    slot_of_[byte] = uint8_t(opcodes_.size());
    opcodes_.push_back(Opcode(byte));
  }
  slots_ = std::make_unique<Slot[]>(kStripes * opcodes_.size());
}

size_t RequestCounters::bucket_of(Clock::duration latency) {
  // Whole microseconds rounded up, so that "at most 2^k us" holds for the time itself.
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(latency).count();
  const uint64_t us = ns <= 0 ? 0 : (uint64_t(ns) + 999) / 1000;
  const size_t bucket = us <= 1 ? 0 : size_t(std::bit_width(us - 1));  // the least k with us <= 2^k
  return bucket < kLatencyBuckets ? bucket : kLatencyBuckets - 1;
}

void RequestCounters::record(Opcode opcode, uint64_t bytes_received, const std::vector<uint8_t>& response,
                             uint64_t rows, Clock::duration latency) {
  Slot& slot = slots_[this_threads_stripe(kStripes) * opcodes_.size() + slot_of_[uint8_t(opcode)]];
  constexpr auto relaxed = std::memory_order_relaxed;
  // The frame header's flags byte (protocol.h: u32 length, u8 opcode, u8 flags).
  if (response.size() > 5 && (response[5] & kFlagError) != 0) slot.errors.fetch_add(1, relaxed);
  slot.bytes_received.fetch_add(bytes_received, relaxed);
  slot.bytes_sent.fetch_add(response.size(), relaxed);
  if (rows != 0) slot.rows.fetch_add(rows, relaxed);
  slot.latency_ns.fetch_add(uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(latency).count()), relaxed);
  slot.buckets[bucket_of(latency)].fetch_add(1, relaxed);
}

std::vector<OpcodeCounters> RequestCounters::read() const {
  std::vector<OpcodeCounters> out;
  constexpr auto relaxed = std::memory_order_relaxed;
  for (size_t k = 0; k < opcodes_.size(); ++k) {
    OpcodeCounters sum;
    sum.opcode = opcodes_[k];
    for (size_t stripe = 0; stripe < kStripes; ++stripe) {
      const Slot& slot = slots_[stripe * opcodes_.size() + k];
      sum.errors += slot.errors.load(relaxed);
      sum.bytes_received += slot.bytes_received.load(relaxed);
      sum.bytes_sent += slot.bytes_sent.load(relaxed);
      sum.rows += slot.rows.load(relaxed);
      sum.latency_ns += slot.latency_ns.load(relaxed);
      for (size_t bucket = 0; bucket < kLatencyBuckets; ++bucket) {
        sum.latency_buckets[bucket] += slot.buckets[bucket].load(relaxed);
      }
    }
    if (sum.requests() != 0) out.push_back(sum);
  }
  return out;
}

}  // namespace recdev::net
