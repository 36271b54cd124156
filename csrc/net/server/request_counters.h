// RequestCounters: what a shard counts of every request it answers, per opcode — a latency histogram
// (whose buckets add up to the requests), error responses, bytes received and sent, rows named — for
// STATS and recdev-server's metrics endpoint. Counting sits on the request path of every connection
// thread, so it takes no lock: each thread adds, with relaxed atomic adds, to one of kStripes copies
// of the counters (picked once per thread, in turn), so that connections on different cores seldom
// write the same cache line; a reader adds the copies up. A reader may see a request counted in one
// figure and not yet in another; every figure only grows.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "net/wire/protocol.h"
#include "net/wire/socket.h"

namespace recdev::net {

class RequestCounters {
 public:
  RequestCounters();

  // One answered request: its opcode, the bytes of its frame, its response frame (an error frame is
  // counted as an error), the rows it named, and how long the shard took.
  void record(Opcode opcode, uint64_t bytes_received, const std::vector<uint8_t>& response, uint64_t rows,
              Clock::duration latency);
  // Every opcode answered at least once, by opcode.
  std::vector<OpcodeCounters> read() const;

  // The bucket of a latency: the first k with latency <= latency_bucket_bound_us(k), else the last.
  static size_t bucket_of(Clock::duration latency);

 private:
  static constexpr size_t kStripes = 8;
  // An opcode's counters in one stripe, on cache lines of their own.
  struct alignas(64) Slot {
    std::atomic<uint64_t> errors{0}, bytes_received{0}, bytes_sent{0}, rows{0}, latency_ns{0};
    std::array<std::atomic<uint64_t>, kLatencyBuckets> buckets{};
  };

  // Opcode byte -> its slot in a stripe (every byte that names an opcode has one).
  std::array<uint8_t, 256> slot_of_{};
  std::vector<Opcode> opcodes_;    // slot -> opcode
  std::unique_ptr<Slot[]> slots_;  // kStripes x opcodes_.size()
};

}  // namespace recdev::net
