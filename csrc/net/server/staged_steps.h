// StagedSteps: the synchronous steps of fleets in progress on one shard (STAGE_UPDATE, COMMIT_UPDATE;
// docs/protocol.md, "Synchronous steps"). Each rank of a fleet sends the shard its part of a table's
// step; the part waits here, on its connection's thread, until every rank's part is in (the step is
// then ready) or its timeout passes (the step fails, naming the ranks whose part never came, and its
// parts are dropped). A ready step is applied once, by the first COMMIT_UPDATE, as one update of the
// parts concatenated in rank order; the later commits find it applied. So a step is applied on a
// shard only after every shard had every part (a rank commits only once all its parts were staged
// everywhere), and a rank's commit returns only once the shard applied it.
//
// Everything here is bounded, whatever clients send: staged bytes, the steps' own bookkeeping
// included, by max_bytes (a part past it is refused with Full); a step's life by its timeout (at
// most max_seconds): a part whose fleet never completes is dropped when its wait ends, and a ready or
// applied step not every rank commits is dropped by reap() once its timeout has passed again and the
// session of every rank that has not committed has ended (ranks died: their sessions lapse after
// --lease-seconds). A live rank's commit may come late — queued on its connection behind another
// table's request, which a checkpoint can hold for seconds — and must still find the step. At
// shutdown stop() ends the waits at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "net/wire/protocol.h"

namespace recdev::net {

struct Session;

class StagedSteps {
 public:
  using Clock = std::chrono::steady_clock;
  // Applies a step's rows (the parts in rank order) as one update; any_rows: some rank recorded a row
  // of the table on some shard (else nothing is applied, as a step without rows in one process).
  using Apply = std::function<void(const std::vector<uint64_t>& ids, const std::vector<float>& grads, bool any_rows)>;
  // Throws (StoreError) if a step of these rows (every rank's ids, in rank order) could be refused by
  // its apply: run once, when the last part arrives, so that a step this shard would refuse fails at
  // staging on every rank, before any shard applies it.
  using Check = std::function<void(const std::vector<uint64_t>& ids)>;

  StagedSteps(uint64_t max_bytes, double max_seconds) : max_bytes_(max_bytes), max_seconds_(max_seconds) {}

  // Stages rank tag.rank's part of the step of `table_id` and waits until every rank's part is in.
  // Throws StoreError: Unavailable naming the missing ranks when the timeout passes first (the step's
  // parts are then dropped: nothing of it can be applied here), Full past max_bytes, InvalidArgument
  // for a part that contradicts the step's others (world size, a rank sent twice, a step already past),
  // and check's error, to every rank, when the step is complete but check refuses it.
  // stager: the session the part came from.
  void stage(uint64_t table_id, const StepTag& tag, uint64_t rank_rows, double timeout_seconds,
             std::vector<uint64_t>&& ids, std::vector<float>&& grads, const Check& check,
             std::weak_ptr<const Session> stager);
  // Applies a ready step (the first commit, through `apply`) or returns once it is applied (the
  // others). Throws StoreError(NotFound) for a step that is not ready here (never staged, failed or
  // expired), and the apply's own error to every committing rank when the apply failed.
  void commit(uint64_t table_id, const StepTag& tag, const Apply& apply);
  // Drops the ready and applied steps past their deadline whose uncommitted ranks' sessions all
  // ended. Called periodically by the server.
  void reap();
  // At shutdown: fails every step still collecting parts (their waits end now, not at their
  // timeouts, so that the server can stop) and refuses new parts.
  void stop();
  // Bytes held by staged parts, counted in STATS and against --max-memory.
  uint64_t bytes() const;
  // Steps held: collecting parts, or ready or applied and not yet committed by every rank (STATS).
  size_t steps() const;

 private:
  enum class State { Collecting, Ready, Applying, Applied, Failed };
  struct Step {
    uint32_t world = 0;
    State state = State::Collecting;
    Clock::time_point deadline;  // when a ready or applied step nobody commits is dropped
    std::vector<bool> staged, committed;
    std::vector<std::weak_ptr<const Session>> stagers;  // per rank
    std::vector<std::vector<uint64_t>> ids;             // per rank
    std::vector<std::vector<float>> grads;
    uint64_t bytes = 0;
    bool any_rows = false;
    std::exception_ptr failure;  // Failed: why, for every rank still waiting or committing
  };
  using Key = std::tuple<uint64_t, uint64_t, uint64_t>;  // fleet, table, step
  using Steps = std::map<Key, std::shared_ptr<Step>>;

  // Frees a step's parts (under mutex_).
  void drop_parts(Step& step);
  // Fails a step for every rank with `failure` and forgets it (under mutex_).
  void fail(const Key& key, const std::shared_ptr<Step>& step, std::exception_ptr failure);
  // Every rank's ids of a step, in rank order.
  static std::vector<uint64_t> all_ids(const Step& step);
  // Removes a step's entry and uncounts all it held (under mutex_); returns the next entry.
  Steps::iterator forget(Steps::iterator entry);
  std::string describe(uint64_t table_id, const StepTag& tag) const;

  const uint64_t max_bytes_;
  const double max_seconds_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  Steps steps_;
  uint64_t bytes_ = 0;
  bool stopping_ = false;
};

}  // namespace recdev::net
