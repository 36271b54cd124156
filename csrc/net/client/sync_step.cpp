#include "sync_step.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "store/errors.h"
#include "store/trace_range.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

namespace {

// The tables as this client's, each checked: every table of one optimizer lives in one store (one
// session, one lease, one round of requests).
std::vector<RemoteTable*> remote_tables(const std::vector<store::TableHandle*>& tables) {
  std::vector<RemoteTable*> remote;
  for (store::TableHandle* table : tables) {
    auto* handle = dynamic_cast<RemoteTable*>(table);
    if (handle == nullptr || (!remote.empty() && handle->session() != remote.front()->session())) {
      throw StoreError(ErrorCode::InvalidArgument,
                       "a synchronous step's tables must all live on the same recdev-server shards (one store)");
    }
    remote.push_back(handle);
  }
  return remote;
}

// The client waits for progress as long as a shard may hold a part back, plus its usual timeout for
// the transfer itself.
double client_timeout(RemoteSession& session, double timeout_seconds) {
  return timeout_seconds + session.timeout_seconds();
}

}  // namespace

void stage_step(const std::vector<store::StepRows>& tables, const StepTag& tag, double timeout_seconds) {
  if (tables.empty()) return;
  if (!(timeout_seconds > 0) || timeout_seconds * 1000 > double(UINT32_MAX)) {
    throw StoreError(ErrorCode::InvalidArgument, "a synchronous step's timeout must be in (0, 4294967] seconds");
  }
  std::vector<store::TableHandle*> handles;
  for (const store::StepRows& rows : tables) handles.push_back(rows.table);
  const std::vector<RemoteTable*> remote = remote_tables(handles);
  RemoteSession& session = *remote.front()->session();
  const auto timeout_ms = uint32_t(std::max(1.0, std::ceil(timeout_seconds * 1000)));
  size_t ids = 0;
  for (const store::StepRows& rows : tables) ids += rows.n;
  const trace::Range range("recdev::sync_stage",
                           {{"step", tag.step}, {"rank", tag.rank}, {"tables", tables.size()}, {"ids", ids}});
  RemoteSession::Lease lease(session);
  std::vector<Call> calls;
  for (size_t t = 0; t < tables.size(); ++t) {
    remote[t]->stage_calls(lease, tables[t].ids, tables[t].n, tables[t].grads, tag, timeout_ms, calls);
  }
  session.exchange_within(lease, calls, client_timeout(session, timeout_seconds));
}

void commit_step(const std::vector<store::TableHandle*>& handles, const StepTag& tag, double timeout_seconds) {
  if (handles.empty()) return;
  const std::vector<RemoteTable*> tables = remote_tables(handles);
  RemoteSession& session = *tables.front()->session();
  const trace::Range range("recdev::commit", {{"step", tag.step}, {"rank", tag.rank}, {"tables", tables.size()}});
  RemoteSession::Lease lease(session);
  // Every shard that can be asked is asked, even when another cannot: the step then holds on every
  // shard still holding it, and the error below can say where it was applied.
  std::vector<Call> calls;
  std::vector<std::string> call_label;
  std::vector<std::pair<size_t, std::exception_ptr>> unaddressed;
  std::vector<std::string> failed;
  std::exception_ptr first_error;
  for (RemoteTable* table : tables) {
    const size_t first_call = calls.size();
    const size_t first_unaddressed = unaddressed.size();
    table->commit_calls(lease, tag, calls, unaddressed);
    for (size_t k = first_call; k < calls.size(); ++k) call_label.push_back(table->describe_shard(calls[k].shard));
    for (size_t k = first_unaddressed; k < unaddressed.size(); ++k) {
      failed.push_back(table->describe_shard(unaddressed[k].first));
      if (!first_error) first_error = unaddressed[k].second;
    }
  }
  std::vector<bool> applied(calls.size(), false);
  try {
    session.exchange_within(lease, calls, client_timeout(session, timeout_seconds),
                            [&](size_t k) { applied[k] = true; });
  } catch (const StoreError&) {
    if (!first_error) first_error = std::current_exception();
  }
  if (failed.empty() && first_error == nullptr) return;
  std::string applied_on, why;
  for (size_t k = 0; k < calls.size(); ++k) {
    if (applied[k]) applied_on += (applied_on.empty() ? "" : ", ") + call_label[k];
    else failed.push_back(call_label[k]);
  }
  try {
    std::rethrow_exception(first_error);
  } catch (const StoreError& error) {
    why = error.what();
  }
  if (applied_on.empty()) {
    throw StoreError(ErrorCode::Unavailable, "nothing of this step was applied: " + why);
  }
  // A shard that restarted between staging and commit lost its parts: the step cannot be applied
  // there any more, and the tables now hold it on some shards only.
  std::string missing;
  for (const std::string& label : failed) missing += (missing.empty() ? "" : ", ") + label;
  throw StoreError(ErrorCode::Unavailable,
                   "this step was applied to " + applied_on + " but not to " + missing + " (" + why +
                       "): the tables now differ from a single process by this step on those shards. Restore every "
                       "table of the step from the fleet's last checkpoint (ops.load, or restart the shards from their "
                       "--checkpoint-dir) before training on (docs/fleet.md, \"A shard restarted mid-step\")");
}

}  // namespace recdev::net
