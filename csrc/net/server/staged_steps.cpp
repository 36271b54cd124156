#include "staged_steps.h"

#include <algorithm>

#include "store/errors.h"

namespace recdev::net {

using store::ErrorCode;
using store::seconds_text;
using store::StoreError;

namespace {

// A step's per-rank bookkeeping is allocated when its first part arrives: the world size a client
// names must not make that allocation large.
constexpr uint32_t kMaxWorld = 1u << 16;

// What a step's entry holds besides its parts (its per-rank bookkeeping, the map's node), counted in
// the staged bytes from its first part until it is forgotten: steps whose parts are gone (applied
// but not committed by every rank, or empty) must not pile up uncounted.
uint64_t bookkeeping_bytes(uint32_t world) { return 256 + uint64_t{world} * 64; }

}  // namespace

std::string StagedSteps::describe(uint64_t table_id, const StepTag& tag) const {
  return "synchronous step " + std::to_string(tag.step) + " of fleet " + std::to_string(tag.fleet) + " on table " +
         std::to_string(table_id);
}

void StagedSteps::drop_parts(Step& step) {
  bytes_ -= step.bytes;
  step.bytes = 0;
  step.ids = {};
  step.grads = {};
}

StagedSteps::Steps::iterator StagedSteps::forget(Steps::iterator entry) {
  drop_parts(*entry->second);
  bytes_ -= bookkeeping_bytes(entry->second->world);
  return steps_.erase(entry);
}

void StagedSteps::fail(const Key& key, const std::shared_ptr<Step>& step, std::exception_ptr failure) {
  step->failure = std::move(failure);
  step->state = State::Failed;
  const auto found = steps_.find(key);
  if (found != steps_.end() && found->second == step) forget(found);
  changed_.notify_all();
}

std::vector<uint64_t> StagedSteps::all_ids(const Step& step) {
  size_t rows = 0;
  for (const auto& part : step.ids) rows += part.size();
  std::vector<uint64_t> ids;
  ids.reserve(rows);
  for (const auto& part : step.ids) ids.insert(ids.end(), part.begin(), part.end());
  return ids;
}

uint64_t StagedSteps::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

size_t StagedSteps::steps() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return steps_.size();
}

void StagedSteps::stage(uint64_t table_id, const StepTag& tag, uint64_t rank_rows, double timeout_seconds,
                        std::vector<uint64_t>&& ids, std::vector<float>&& grads, const Check& check,
                        std::weak_ptr<const Session> stager) {
  const std::string what = describe(table_id, tag);
  if (tag.world == 0 || tag.world > kMaxWorld || tag.rank >= tag.world) {
    throw StoreError(ErrorCode::InvalidArgument,
                     what + ": rank " + std::to_string(tag.rank) + " of " + std::to_string(tag.world) +
                         " is not a rank of a fleet of at most " + std::to_string(kMaxWorld));
  }
  if (!(timeout_seconds > 0)) throw StoreError(ErrorCode::InvalidArgument, what + ": the timeout must be positive");
  // A client's timeout is its own business up to the server's cap, which bounds how long a part it
  // sent can be held.
  const double timeout = std::min(timeout_seconds, max_seconds_);
  const uint64_t part_bytes = ids.size() * sizeof(uint64_t) + grads.size() * sizeof(float);
  const Key key{tag.fleet, table_id, tag.step};
  std::unique_lock<std::mutex> lock(mutex_);
  if (stopping_) throw StoreError(ErrorCode::Unavailable, what + ": the server is shutting down");
  const auto existing = steps_.find(key);
  const uint64_t new_bytes = part_bytes + (existing == steps_.end() ? bookkeeping_bytes(tag.world) : 0);
  if (bytes_ + new_bytes > max_bytes_) {
    throw StoreError(ErrorCode::Full, what + ": staging " + std::to_string(new_bytes) + " bytes for rank " +
                                          std::to_string(tag.rank) + "'s gradients would hold more than the " +
                                          std::to_string(max_bytes_) + " bytes of --max-staged-bytes (" +
                                          std::to_string(bytes_) + " staged)");
  }
  std::shared_ptr<Step>& slot = steps_[key];
  if (!slot) {
    bytes_ += bookkeeping_bytes(tag.world);
    slot = std::make_shared<Step>();
    slot->world = tag.world;
    slot->staged.assign(tag.world, false);
    slot->committed.assign(tag.world, false);
    slot->stagers.resize(tag.world);
    slot->ids.resize(tag.world);
    slot->grads.resize(tag.world);
  }
  const std::shared_ptr<Step> step = slot;
  if (step->world != tag.world) {
    throw StoreError(ErrorCode::InvalidArgument,
                     what + ": rank " + std::to_string(tag.rank) + " names a fleet of " + std::to_string(tag.world) +
                         " ranks; the step's other parts name " + std::to_string(step->world));
  }
  if (step->state != State::Collecting || step->staged[tag.rank]) {
    throw StoreError(ErrorCode::InvalidArgument,
                     what + ": rank " + std::to_string(tag.rank) + " already sent its part of this step");
  }
  step->staged[tag.rank] = true;
  step->stagers[tag.rank] = std::move(stager);
  step->ids[tag.rank] = std::move(ids);
  step->grads[tag.rank] = std::move(grads);
  step->bytes += part_bytes;
  bytes_ += part_bytes;
  step->any_rows = step->any_rows || rank_rows > 0 || !step->ids[tag.rank].empty();
  const auto now = Clock::now();
  bool complete = true;
  for (const bool staged : step->staged) complete = complete && staged;
  if (complete) {
    try {
      check(all_ids(*step));
    } catch (...) {
      fail(key, step, std::current_exception());
      throw;
    }
    step->state = State::Ready;
    step->deadline = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout));
    changed_.notify_all();
    return;
  }
  const auto deadline = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout));
  changed_.wait_until(lock, deadline, [&] { return step->state != State::Collecting; });
  if (step->state == State::Failed) std::rethrow_exception(step->failure);
  if (step->state != State::Collecting) return;
  // This rank's wait is over first: the step fails for every rank, and its parts go.
  std::string missing;
  size_t count = 0;
  for (uint32_t r = 0; r < step->world; ++r) {
    if (step->staged[r]) continue;
    missing += (count++ ? ", " : "") + std::to_string(r);
  }
  const StoreError error(ErrorCode::Unavailable, what + ": rank" + (count > 1 ? "s " : " ") + missing + " of " +
                                                     std::to_string(step->world) + " sent no part within " +
                                                     seconds_text(timeout) +
                                                     " (dead or hung); nothing of this step was applied");
  fail(key, step, std::make_exception_ptr(error));
  throw error;
}

void StagedSteps::commit(uint64_t table_id, const StepTag& tag, const Apply& apply) {
  const std::string what = describe(table_id, tag);
  const Key key{tag.fleet, table_id, tag.step};
  std::unique_lock<std::mutex> lock(mutex_);
  const auto found = steps_.find(key);
  if (found == steps_.end()) {
    throw StoreError(ErrorCode::NotFound,
                     what + " is not staged here: its parts never all arrived, or it expired uncommitted");
  }
  const std::shared_ptr<Step> step = found->second;
  if (tag.world != step->world || tag.rank >= step->world) {
    throw StoreError(ErrorCode::InvalidArgument, what + ": rank " + std::to_string(tag.rank) + " of " +
                                                     std::to_string(tag.world) + " commits a step of " +
                                                     std::to_string(step->world) + " ranks");
  }
  if (step->state == State::Collecting) {
    throw StoreError(ErrorCode::InvalidArgument, what + ": committed before every rank's part arrived");
  }
  if (step->state == State::Ready) {
    step->state = State::Applying;
    // The parts are read outside the lock (other steps go on meanwhile): the Applying state keeps
    // every other commit of this step waiting and reap() away from it.
    lock.unlock();
    std::exception_ptr failure;
    try {
      size_t words = 0;
      for (const auto& part : step->grads) words += part.size();
      std::vector<float> grads;
      grads.reserve(words);
      for (const auto& part : step->grads) grads.insert(grads.end(), part.begin(), part.end());
      apply(all_ids(*step), grads, step->any_rows);
    } catch (...) {
      failure = std::current_exception();
    }
    lock.lock();
    drop_parts(*step);
    step->state = failure ? State::Failed : State::Applied;
    step->failure = failure;
    changed_.notify_all();
  } else {
    changed_.wait(lock, [&] { return step->state != State::Applying; });
  }
  if (step->state == State::Failed) std::rethrow_exception(step->failure);
  step->committed[tag.rank] = true;
  bool all = true;
  for (const bool committed : step->committed) all = all && committed;
  if (all) {
    const auto again = steps_.find(key);
    if (again != steps_.end() && again->second == step) forget(again);
  }
}

void StagedSteps::stop() {
  std::lock_guard<std::mutex> lock(mutex_);
  stopping_ = true;
  const auto failure = std::make_exception_ptr(StoreError(
      ErrorCode::Unavailable, "the server is shutting down: this synchronous step was dropped, nothing of it applied"));
  for (auto it = steps_.begin(); it != steps_.end();) {
    Step& step = *it->second;
    if (step.state == State::Collecting) {
      step.state = State::Failed;
      step.failure = failure;
      it = forget(it);
    } else {
      ++it;
    }
  }
  changed_.notify_all();
}

void StagedSteps::reap() {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  for (auto it = steps_.begin(); it != steps_.end();) {
    Step& step = *it->second;
    // A collecting step has a waiting part, whose own timeout ends it; an applying one is in use.
    const bool settled = step.state == State::Ready || step.state == State::Applied || step.state == State::Failed;
    bool awaited = false;  // a rank that has not committed yet still could
    for (uint32_t r = 0; r < step.world && step.state != State::Failed; ++r) {
      awaited = awaited || (!step.committed[r] && !step.stagers[r].expired());
    }
    if (settled && step.deadline <= now && !awaited) {
      it = forget(it);
    } else {
      ++it;
    }
  }
}

}  // namespace recdev::net
