#include "sync_step.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "store/errors.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

namespace {

// Every table of one optimizer lives in one store: one session, one lease, one round of requests.
RemoteSession& session_of(const std::vector<RemoteTable*>& tables) {
  for (const RemoteTable* table : tables) {
    if (table->session() != tables.front()->session()) {
      throw StoreError(ErrorCode::InvalidArgument,
                       "a synchronous step's tables must live on the same servers (one store)");
    }
  }
  return *tables.front()->session();
}

// The client waits for progress as long as a shard may hold a part back, plus its usual timeout for
// the transfer itself.
double client_timeout(RemoteSession& session, double timeout_seconds) {
  return timeout_seconds + session.timeout_seconds();
}

}  // namespace

void stage_step(const std::vector<StepRows>& tables, const StepTag& tag, double timeout_seconds) {
  if (tables.empty()) return;
  if (!(timeout_seconds > 0) || timeout_seconds * 1000 > double(UINT32_MAX)) {
    throw StoreError(ErrorCode::InvalidArgument, "a synchronous step's timeout must be in (0, 4294967] seconds");
  }
  std::vector<RemoteTable*> handles;
  for (const StepRows& rows : tables) handles.push_back(rows.table);
  RemoteSession& session = session_of(handles);
  const auto timeout_ms = uint32_t(std::max(1.0, std::ceil(timeout_seconds * 1000)));
  RemoteSession::Lease lease(session);
  std::vector<Call> calls;
  for (const StepRows& rows : tables) rows.table->stage_calls(lease, rows.ids, rows.n, rows.grads, tag, timeout_ms, calls);
  session.exchange_within(lease, calls, client_timeout(session, timeout_seconds));
}

void commit_step(const std::vector<RemoteTable*>& tables, const StepTag& tag, double timeout_seconds) {
  if (tables.empty()) return;
  RemoteSession& session = session_of(tables);
  RemoteSession::Lease lease(session);
  std::vector<Call> calls;
  for (RemoteTable* table : tables) table->commit_calls(lease, tag, calls);
  session.exchange_within(lease, calls, client_timeout(session, timeout_seconds));
}

}  // namespace recdev::net
