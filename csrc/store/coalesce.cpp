#include "coalesce.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "prefetch.h"
#include "task_runner.h"

namespace recdev::store {
namespace {

constexpr uint32_t kNoRow = ~uint32_t{0};
constexpr size_t kEntriesAhead = 16;

// sum[d] += grad[d] for d < dim, 32 bytes at a time: the plain loop stayed scalar at -O2 (it may
// not assume the rows apart), and was half the time of coalescing a batch of Zipf ids.
template <class T>
void add_row(T* sum, const T* grad, uint32_t dim) {
  typedef T Block __attribute__((vector_size(32)));
  constexpr uint32_t kLanes = sizeof(Block) / sizeof(T);
  uint32_t d = 0;
  for (; d + kLanes <= dim; d += kLanes) {
    Block total;
    Block addend;
    std::memcpy(&total, sum + d, sizeof(Block));
    std::memcpy(&addend, grad + d, sizeof(Block));
    total += addend;
    std::memcpy(sum + d, &total, sizeof(Block));
  }
  for (; d < dim; ++d) sum[d] += grad[d];
}

size_t map_capacity_for(size_t count) {
  size_t capacity = 16;
  while (capacity < 2 * count) capacity *= 2;  // load factor <= 0.5: probes stay short
  return capacity;
}

}  // namespace

template <class G>
CoalescedGradients<G>::CoalescedGradients(const uint64_t* ids, size_t n, const G* const* grads, ElementType type,
                                          uint32_t dim, size_t threads) {
  const ShardRoute route(ids, n);
  run_tasks(kNumShards, threads, [&](size_t shard) { coalesce_shard(route, shard, ids, grads, type, dim); });
}

template <class G>
void CoalescedGradients<G>::coalesce_shard(const ShardRoute& route, size_t shard, const uint64_t* ids,
                                           const G* const* grads, ElementType type, uint32_t dim) {
  const size_t begin = route.begin(shard);
  const size_t end = route.end(shard);
  if (begin == end) return;
  Shard& out = shards_[shard];
  out.rows.reserve(end - begin);
  // A half gradient in the sum's type: duplicates are widened (exactly) one row at a time.
  std::vector<Sum> widened(std::is_same_v<G, Sum> ? 0 : dim);
  const auto as_sum = [&](const G* grad) -> const Sum* {
    if constexpr (std::is_same_v<G, Sum>) {
      return grad;
    } else {
      widen_to_float(type, grad, widened.data(), dim);
      return widened.data();
    }
  };
  // row -> index of its sum in out.sums, for the rows named more than once. Sums are addressed by
  // index while they are being added up, since out.sums moves as it grows.
  std::vector<uint32_t> sum_of;
  sum_of.reserve(end - begin);
  // Open addressing on the hash's low bits (the sub-shard took its high bits): row id -> row index.
  std::vector<uint32_t> map(map_capacity_for(end - begin), kNoRow);
  const size_t mask = map.size() - 1;
  for (size_t entry = begin; entry < end; ++entry) {
    // A sub-shard's entries are far apart in the batch, so their ids and gradient pointers miss the
    // cache: fetched ahead. (Fetching the gradient rows ahead too, which only repeated rows read,
    // measured no better for Zipf ids and worse for uniform ones.)
    if (entry + kEntriesAhead < end) {
      const size_t later = route.position(entry + kEntriesAhead);
      prefetch(ids + later);
      prefetch(grads + later);
    }
    const size_t position = route.position(entry);
    const uint64_t row_id = ids[position];
    const G* grad = grads[position];
    for (size_t bucket = route.hash(entry) & mask;; bucket = (bucket + 1) & mask) {
      const uint32_t row = map[bucket];
      if (row == kNoRow) {
        map[bucket] = uint32_t(out.rows.size());
        out.rows.push_back(Row{row_id, route.hash(entry), grad, nullptr});
        sum_of.push_back(kNoRow);
        break;
      }
      if (out.rows[row].id != row_id) continue;
      // Entries come in batch order, so the sum starts from the first gradient and adds the others in
      // turn.
      if (sum_of[row] == kNoRow) {
        sum_of[row] = uint32_t(out.sums.size() / dim);
        const Sum* first = as_sum(out.rows[row].grad);
        out.sums.insert(out.sums.end(), first, first + dim);
      }
      add_row(out.sums.data() + size_t{sum_of[row]} * dim, as_sum(grad), dim);
      break;
    }
  }
  for (size_t row = 0; row < out.rows.size(); ++row) {
    if (sum_of[row] == kNoRow) continue;
    const Sum* sum = out.sums.data() + size_t{sum_of[row]} * dim;
    out.rows[row].grad = nullptr;
    out.rows[row].sum = sum;
    const Sum* bad = std::find_if(sum, sum + dim, [](Sum value) { return !std::isfinite(value); });
    if (bad != sum + dim && (!out.overflow || out.rows[row].id < out.overflow->row_id)) {
      out.overflow = Overflow{out.rows[row].id, uint32_t(bad - sum)};
    }
  }
}

template <class G>
size_t CoalescedGradients<G>::size() const {
  size_t total = 0;
  for (const Shard& shard : shards_) total += shard.rows.size();
  return total;
}

template <class G>
std::optional<typename CoalescedGradients<G>::Overflow> CoalescedGradients<G>::first_overflow() const {
  std::optional<Overflow> first;
  for (const Shard& shard : shards_) {
    if (shard.overflow && (!first || shard.overflow->row_id < first->row_id)) first = shard.overflow;
  }
  return first;
}

template class CoalescedGradients<float>;
template class CoalescedGradients<uint16_t>;
template class CoalescedGradients<double>;

}  // namespace recdev::store
