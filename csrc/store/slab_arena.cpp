#include "slab_arena.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace recdev::store {
namespace {

constexpr size_t kFullChunkBytes = size_t{16} << 10;
// The first chunk holds 1/32 of a full one: a table's 64 sub-shards each start an arena for its
// records and one for its ids, so a table of a few thousand rows would otherwise hold mostly empty
// first chunks (1/8 cost the CTR demo's tables 10% more memory). Only the first few chunks of a
// growing arena are below full size.
constexpr unsigned kLogGrowthSteps = 5;

unsigned log2_floor(size_t value) { return unsigned(63 - __builtin_clzll(value)); }

}  // namespace

SlabArena::SlabArena(size_t record_bytes)
    : record_bytes_(record_bytes),
      log_full_rows_(log2_floor(std::max<size_t>(1, kFullChunkBytes / record_bytes))),
      log_first_rows_(log_full_rows_ > kLogGrowthSteps ? log_full_rows_ - kLogGrowthSteps : 0),
      full_rows_(size_t{1} << log_full_rows_),
      first_rows_(size_t{1} << log_first_rows_),
      num_growing_chunks_(log_full_rows_ - log_first_rows_ + 1) {}

SlabArena::SlabArena(SlabArena&& other) noexcept
    : record_bytes_(other.record_bytes_),
      log_full_rows_(other.log_full_rows_),
      log_first_rows_(other.log_first_rows_),
      full_rows_(other.full_rows_),
      first_rows_(other.first_rows_),
      num_growing_chunks_(other.num_growing_chunks_),
      chunks_(std::move(other.chunks_)),
      size_(std::exchange(other.size_, 0)),
      chunk_bytes_(std::exchange(other.chunk_bytes_, 0)) {
  other.chunks_.clear();
}

SlabArena& SlabArena::operator=(SlabArena&& other) noexcept {
  record_bytes_ = other.record_bytes_;
  log_full_rows_ = other.log_full_rows_;
  log_first_rows_ = other.log_first_rows_;
  full_rows_ = other.full_rows_;
  first_rows_ = other.first_rows_;
  num_growing_chunks_ = other.num_growing_chunks_;
  chunks_ = std::move(other.chunks_);
  other.chunks_.clear();
  size_ = std::exchange(other.size_, 0);
  chunk_bytes_ = std::exchange(other.chunk_bytes_, 0);
  return *this;
}

size_t SlabArena::chunk_start(size_t chunk) const {
  if (chunk == 0) return 0;
  if (chunk < num_growing_chunks_) return first_rows_ << (chunk - 1);
  return full_rows_ * (chunk - num_growing_chunks_ + 1);
}

size_t SlabArena::chunk_rows(size_t chunk) const {
  if (chunk == 0) return first_rows_;
  if (chunk < num_growing_chunks_) return first_rows_ << (chunk - 1);
  return full_rows_;
}

SlabArena SlabArena::copy() const {
  SlabArena out(record_bytes_);
  out.chunks_.reserve(chunks_.size());
  for (size_t chunk = 0; chunk < chunks_.size(); ++chunk) {
    const size_t bytes = chunk_rows(chunk) * record_bytes_;
    out.chunks_.push_back(allocate_chunk(bytes));
    out.chunk_bytes_ += bytes;
    std::memcpy(out.chunks_.back().get(), chunks_[chunk].get(), used_rows(chunk) * record_bytes_);
  }
  out.size_ = size_;
  return out;
}

void SlabArena::copy_out(std::byte* out) const {
  for (size_t chunk = 0; chunk < chunks_.size(); ++chunk) {
    const size_t bytes = used_rows(chunk) * record_bytes_;
    std::memcpy(out, chunks_[chunk].get(), bytes);
    out += bytes;
  }
}

size_t SlabArena::used_rows(size_t chunk) const {
  return std::min(chunk_rows(chunk), size_ - std::min(size_, chunk_start(chunk)));
}

size_t SlabArena::push_back() {
  if (size_ == chunk_start(chunks_.size())) {
    const size_t bytes = chunk_rows(chunks_.size()) * record_bytes_;
    // Room first, so that a chunk is never allocated and then dropped.
    if (chunks_.size() == chunks_.capacity()) chunks_.reserve(std::max<size_t>(4, 2 * chunks_.capacity()));
    chunks_.push_back(allocate_chunk(bytes));
    chunk_bytes_ += bytes;
  }
  return size_++;
}

void SlabArena::pop_back() {
  --size_;
  while (chunks_.size() >= 2 && chunk_start(chunks_.size() - 2) >= size_) {
    chunk_bytes_ -= chunk_rows(chunks_.size() - 1) * record_bytes_;
    chunks_.pop_back();
  }
  if (size_ == 0) clear();
}

void SlabArena::clear() {
  decltype(chunks_)().swap(chunks_);  // releases the chunk table too, unlike clear()
  size_ = 0;
  chunk_bytes_ = 0;
}

}  // namespace recdev::store
