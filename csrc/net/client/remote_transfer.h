// Whole tables between this client and the shards (docs/protocol.md: DUMP and the staged load), for
// client-side checkpoints (remote_checkpoint.h) and for torch.save / torch.load of a remote table
// (RemoteTable::scan / install).
//
// dump_table reads a table from a point-in-time snapshot per shard. TableLoad stages rows on the
// shards that own them; nothing changes on any shard until commit_loads installs every staged table
// with one COMMIT_LOAD per shard, and abort_loads drops the staging instead.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "remote_session.h"
#include "store/table.h"

namespace recdev::net {

// Every materialized row of one table, whose id on shard s is shard_table_ids[s]: on_header once (its
// row_count summed over the shards), then on_row for each row, shard by shard.
void dump_table(RemoteSession& session, RemoteSession::Lease& lease, const std::vector<uint64_t>& shard_table_ids,
                const std::string& label, const std::function<void(const store::TableScanHeader&)>& on_header,
                const std::function<void(uint64_t row_id, const float* record)>& on_row);

// A point-in-time cut per shard of the table's changes for a change chain (store::Table::cut_changes),
// merged: the rows, the rows dropped, and the policy state with the touch metadata of the cut's rows.
// nullopt when the shards disagree on whether the cut is whole (one lost the chain in a restart).
std::optional<store::TableCut> dump_cut(RemoteSession& session, RemoteSession::Lease& lease,
                                        const std::vector<uint64_t>& shard_table_ids, const std::string& label,
                                        uint64_t chain);

// dump_table's rows gathered into a snapshot, to install into another table. A row that comes from
// two shards is StoreError(Protocol).
store::TableSnapshot dump_snapshot(RemoteSession& session, RemoteSession::Lease& lease,
                                   const std::vector<uint64_t>& shard_table_ids, const std::string& label);

// The table's policy state merged from every shard's (GET_POLICY_STATE; policy_shares.h), or nullopt
// when it has no policy.
std::optional<store::TablePolicyState> fetch_policy_state(RemoteSession& session, RemoteSession::Lease& lease,
                                                          const std::vector<uint64_t>& shard_table_ids,
                                                          uint64_t num_rows, const std::string& label);

class TableLoad {
 public:
  // Begins a load on every shard: into the named table `header.name` (created at commit if missing),
  // or, when shard_table_ids is not empty, into the existing table with those ids. route_key is the
  // table's (route_key_of_name for a named table). With a policy state, each shard gets its share of
  // it (policy_shares.h), installed at commit in place of the table's policy.
  TableLoad(RemoteSession& session, RemoteSession::Lease& lease, const BeginLoadRequest& header,
            const std::vector<uint64_t>& shard_table_ids, uint64_t route_key, const store::TablePolicyState* policy);

  // Queues a row for its shard (record: dim + state_words floats), sending a frame when one is full.
  void add(uint64_t row_id, const float* record);
  // Sends what is queued.
  void flush();

  const std::vector<uint64_t>& load_ids() const { return load_ids_; }  // per shard

 private:
  RemoteSession& session_;
  RemoteSession::Lease& lease_;
  const uint64_t route_key_;
  const uint32_t record_words_;
  const uint32_t batch_rows_;
  std::vector<uint64_t> load_ids_;
  std::vector<LoadRowsRequest> batches_;
};

// Installs the loads: one COMMIT_LOAD per shard listing that shard's load of each.
void commit_loads(RemoteSession& session, RemoteSession::Lease& lease, const std::vector<const TableLoad*>& loads);
// Drops the loads' staging. Never throws: what an unreachable server still stages belongs to this
// session, and the server frees it when the session lapses.
void abort_loads(RemoteSession& session, RemoteSession::Lease& lease,
                 const std::vector<const TableLoad*>& loads) noexcept;

}  // namespace recdev::net
