// The remote store behind the TableHandle / StoreClient contract (store/table_handle.h): tables whose
// rows live on recdev-server shards (docs/protocol.md, docs/remote.md).
//
// RemoteTable: a row belongs to shard owner_shard(route_key, row id, num_shards). A batch is validated
// here first (ids in range, bag offsets, finite gradients), so a bad batch fails with the store's
// error code and no server sees it; then it is split by owner, sent to the shards at once, and the
// answers are put back in batch order. Pooled lookups send each shard its share of every bag and
// combine the shards' partial pools (pooled_partial.h). An update goes to every shard, empty shares
// included, so that every shard's optimizer step stays equal (a synchronous step stages every rank's
// rows on the shards instead: stage_calls, commit_calls). Whole-table settings (init rule,
// optimizer, lr, step) go to every shard; queries about them (config, optimizer, step) ask shard 0.
//
// RemoteStoreClient: one RemoteSession over the servers. Anonymous tables get a random routing key
// and belong to the session; named tables route by a hash of their name, so every client finds the
// same rows on the same shard. save / load write and read one checkpoint file on this machine in
// checkpoint.h's format (remote_checkpoint.h).
#pragma once

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "remote_session.h"
#include "store/sync_steps.h"
#include "store/table_handle.h"

namespace recdev::net {

class RemoteTable final : public store::TableHandle {
 public:
  // table_ids[s]: the table's id on shard s as of that shard's epoch epochs[s].
  RemoteTable(std::shared_ptr<RemoteSession> session, uint64_t client_id, std::string name, uint64_t route_key,
              uint64_t num_rows, uint32_t dim, store::ElementType dtype, std::vector<uint64_t> table_ids,
              std::vector<uint64_t> epochs);

  ~RemoteTable() override { session_->forget_owner(this); }
  RemoteTable(const RemoteTable&) = delete;
  RemoteTable& operator=(const RemoteTable&) = delete;

  const std::string& name() const { return name_; }  // empty for an anonymous table

  uint64_t id() const override { return client_id_; }
  store::TableConfig config() const override;
  uint64_t num_rows() const override { return num_rows_; }
  uint32_t row_words() const override { return row_words_; }
  store::ElementType dtype() const override { return dtype_; }
  bool in_process() const override { return false; }
  // Pools float32 rows and bag gradients on the shards (shards would add a half table's partial sums
  // in another order than CPU's); a batch goes whole, split by shard here.
  store::RowPathTraits row_path_traits() const override {
    const bool float32 = dtype() == store::ElementType::Float32;
    return store::RowPathTraits{float32, float32, true, true, session_->overlaps_updates()};
  }
  uint64_t init_stream() const override;

  void set_init(const store::InitRule& rule) override;
  void gather(const uint64_t* ids, size_t n, float* out) override;
  void peek(const uint64_t* ids, size_t n, float* out) const override;
  void gather_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                     store::PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                     int64_t padding_idx, const store::PooledOutput& out, int64_t* max_positions) override;
  void write(const uint64_t* ids, size_t n, const float* rows) override;
  void read_bytes(uint64_t byte_offset, uint64_t nbytes, void* out) const override;
  void write_bytes(uint64_t byte_offset, uint64_t nbytes, const void* data) override;
  void check_byte_range(uint64_t byte_offset, uint64_t nbytes) const override;
  void exists(const uint64_t* ids, size_t n, uint8_t* out) const override;
  void erase(const uint64_t* ids, size_t n) override;
  store::TableStats stats() const override;
  // Each shard holds its share of the policy (policy_shares.h): set_policy sends every shard its
  // share (and puts the others back if one refuses); policy() and policy_state() merge the shards'.
  void set_policy(const store::TablePolicyConfig& config) override;
  store::TablePolicyConfig policy() const override;
  std::optional<store::TablePolicyState> policy_state() const override;
  void restore_policy_state(const store::TablePolicyState& state) override;

  void set_optimizer(const store::OptimizerConfig& config) override;
  store::OptimizerConfig optimizer() const override;
  // Asks the shards until the table is seen with an optimizer, then takes it to keep one, so that a
  // backward pass does not wait a round trip per table (were it removed by another client since, a
  // shard refuses the update and says so).
  bool has_optimizer() const override;
  void set_learning_rate(double lr) override;
  uint64_t optimizer_step() const override;
  void set_optimizer_step(uint64_t step) override;
  void update(const uint64_t* ids, size_t n, const void* grads) override;
  size_t num_shards() const { return session_->num_shards(); }
  const std::shared_ptr<RemoteSession>& session() const { return session_; }
  // A synchronous step's requests on this table (docs/protocol.md, "Synchronous steps"; sync_step.h
  // sends them): one STAGE_UPDATE per shard with this rank's rows of it in batch order, empty ones
  // included (every shard waits for every rank's part), and one COMMIT_UPDATE per shard.
  void stage_calls(RemoteSession::Lease& lease, const uint64_t* ids, size_t n, const float* grads, const StepTag& tag,
                   uint32_t timeout_ms, std::vector<Call>& calls);
  // A shard whose table cannot be addressed any more (it restarted without it) gets no call: its
  // error is appended to `unaddressed` instead, so that the other shards still get theirs.
  void commit_calls(RemoteSession::Lease& lease, const StepTag& tag, std::vector<Call>& calls,
                    std::vector<std::pair<size_t, std::exception_ptr>>& unaddressed);
  std::string describe_shard(size_t shard) const;
  // Expands the bags' gradients to one row per id (store::PooledGradients) and sends them as update
  // does: one optimizer step.
  void update_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                     store::PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                     int64_t padding_idx, const void* bag_grads) override;
  uint32_t gather_state(const uint64_t* ids, size_t n, std::vector<float>& out) const override;
  // update and update_pooled with their answers owed (RemoteSession::send_answer_later), read by
  // wait_for_answers or by the session's next exchange.
  void send_update(const uint64_t* ids, size_t n, const void* grads) override;
  void send_update_pooled(const uint64_t* ids, size_t num_ids, const int64_t* offsets, size_t num_bags,
                          store::PoolingMode mode, const float* per_sample_weights, bool include_last_offset,
                          int64_t padding_idx, const void* bag_grads) override;
  // gather with its answers owed: rows land in out as they arrive, and are all there once
  // wait_for_answers() (or the session's next exchange) has read them.
  void send_gather(const uint64_t* ids, size_t n, float* out) override;
  void wait_for_answers() override { session_->read_answers_owed(this); }
  // DUMP from every shard (a point-in-time snapshot per shard) / a staged load committed on every
  // shard (remote_transfer.h).
  void scan_into(const std::function<store::RowArrays(const store::TableScanHeader&)>& allocate) const override;
  store::TableSnapshot snapshot() const override;
  void install(store::RowSet& rows, const store::InitRule& init, uint64_t init_stream,
               const store::OptimizerConfig& optimizer, uint64_t optimizer_step) override;

  // FREE_TABLE on every shard that still has it; errors are ignored (the session's lease frees what
  // an unreachable server keeps).
  void free() noexcept;

 private:
  // A batch's ids grouped by owning shard, with their positions in the batch.
  struct Routed {
    std::vector<std::vector<uint64_t>> ids;
    std::vector<std::vector<size_t>> positions;
    // fn(shard, begin, end) for each piece [begin, end) of at most per_request of a shard's ids,
    // shard by shard: one request each.
    template <class Fn>
    void for_each_piece(size_t per_request, Fn fn) const {
      for (size_t shard = 0; shard < ids.size(); ++shard) {
        for (size_t begin = 0; begin < ids[shard].size(); begin += per_request) {
          fn(shard, begin, std::min(ids[shard].size(), begin + per_request));
        }
      }
    }
    std::vector<uint64_t> piece(size_t shard, size_t begin, size_t end) const {
      return std::vector<uint64_t>(ids[shard].begin() + begin, ids[shard].begin() + end);
    }
  };

  std::string label() const;
  void check_ids(const uint64_t* ids, size_t n) const;
  Routed route(const uint64_t* ids, size_t n) const;
  // The table's id on the shard, valid on the connection the lease holds: after a shard restarted (its
  // epoch moved), a named table is looked up there again and an anonymous one is reported lost.
  uint64_t table_id(RemoteSession::Lease& lease, size_t shard) const;
  std::vector<uint64_t> shard_table_ids(RemoteSession::Lease& lease) const;  // table_id of every shard
  // update's checks, then its calls (one UPDATE per shard, empty ones included: each is one
  // optimizer step), built on `lease`.
  void check_update(const uint64_t* ids, size_t n, const void* grads) const;
  std::vector<Call> update_calls(RemoteSession::Lease& lease, const Routed& routed, const void* grads) const;
  // update_pooled's checks, then `send` (update or send_update) with the bags' gradients as one row
  // per id.
  void expand_bag_gradients(const store::EmbeddingBag& bag, const void* bag_grads,
                            void (RemoteTable::*send)(const uint64_t* ids, size_t n, const void* grads));
  // The UPDATE (or a STAGE_UPDATE's rows) for one shard of a routed batch; refuses rows that do not
  // fit in one frame, since one optimizer step must be one request.
  RowsRequest gradients_for(RemoteSession::Lease& lease, const Routed& routed, size_t shard, const float* grads) const;
  // Ids per request so that a request or answer of `bytes_per_id` bytes per id stays within a frame.
  static size_t ids_per_request(size_t bytes_per_id);
  // A batch's ids by owning shard, in requests of ids within a frame (no request for a shard with
  // none): for request k, the batch positions its answer fills.
  struct FannedIds {
    struct Piece {
      size_t shard, begin, end;
    };
    Routed routed;
    std::vector<Piece> pieces;
    const size_t* positions(size_t k) const { return routed.positions[pieces[k].shard].data() + pieces[k].begin; }
    size_t count(size_t k) const { return pieces[k].end - pieces[k].begin; }
  };
  FannedIds fan_out(const uint64_t* ids, size_t n, size_t answer_bytes_per_id) const;
  std::vector<Call> fanned_calls(RemoteSession::Lease& lease, const FannedIds& fanned, Opcode opcode) const;
  // Sends `opcode` with the fanned-out ids and hands each answer, with the batch positions of its
  // ids, to `take`.
  template <class Take>
  void fan_out_ids(const uint64_t* ids, size_t n, Opcode opcode, size_t answer_bytes_per_id, Take take) const;
  // gather (Opcode::Gather) and peek (Opcode::Peek): rows fetched from their shards into out.
  void fetch_rows(const uint64_t* ids, size_t n, float* out, Opcode opcode) const;
  // Copies an answer's rows into their batch positions in out, a batch of n rows.
  void copy_rows(const Call& call, const size_t* positions, size_t count, size_t n, float* out) const;
  // Sends one request of `opcode` with `message(table_id)` to every shard.
  template <class MakeMessage>
  void broadcast(Opcode opcode, MakeMessage message);
  TableInfoResponse info(size_t shard) const;
  std::vector<TableInfoResponse> infos() const;                  // every shard's, in order
  std::vector<store::TablePolicyConfig> shard_policies() const;  // every shard's share, in order
  // Each shard judges a request against its own share of the budget, so one could refuse a batch
  // another applies. Under a budget, a batch that reaches several shards is judged first, and sent
  // only if no share refuses it: here, for an evict budget of rows without admission (a share then
  // refuses exactly a part with more distinct rows than it holds); otherwise by every shard
  // (CHECK_POLICY: what its policy would refuse now, nothing changed). The policy is the one this
  // handle last set or read (read once, before its first batch). A policy another client changes
  // later, or another client's requests landing between the check and the batch, can still make one
  // shard refuse its part after another applied.
  void check_every_shard(const uint64_t* ids, size_t n, store::Touch touch) const;

  const std::shared_ptr<RemoteSession> session_;
  const uint64_t client_id_;
  const std::string name_;
  const uint64_t route_key_;
  const uint64_t num_rows_;
  const uint32_t row_words_;
  const store::ElementType dtype_;
  mutable std::mutex mutex_;  // guards the three below
  mutable std::vector<uint64_t> table_ids_;
  mutable std::vector<uint64_t> epochs_;
  mutable std::optional<store::TablePolicyConfig> known_policy_;
  mutable std::atomic<bool> seen_optimizer_{false};
};

class RemoteStoreClient final : public store::StoreClient, public store::SyncSteps {
 public:
  // servers: "tcp://h1:7070,tcp://h2:7071" (parse_server_list). Connects to every server now.
  // read_only: RemoteSession's; declarations then open existing tables only (find, shape and dtype
  // checked) and create none. overlap_updates: RemoteSession's.
  RemoteStoreClient(const std::string& servers, const std::string& token, double timeout_seconds,
                    bool read_only = false, bool overlap_updates = false);

  std::shared_ptr<store::TableHandle> create_table(const store::TableConfig& config,
                                                   std::optional<uint64_t> init_stream) override;
  std::shared_ptr<store::TableHandle> declare(const std::string& name,
                                              const store::TableDeclaration& declaration) override;
  std::optional<std::shared_ptr<store::TableHandle>> find(const std::string& name) override;
  void free_table(store::TableHandle& table) noexcept override;

  void save(const std::string& path) override;
  std::vector<std::string> load(const std::string& path) override;
  uint64_t checkpoint(const std::string& directory) override;
  std::pair<uint64_t, std::vector<std::string>> restore(const std::string& directory,
                                                        std::optional<uint64_t> version) override;
  uint64_t export_tables(const std::string& directory, std::optional<store::ElementType> dtype) override;

  std::string kind() const override { return "remote"; }
  std::vector<std::string> servers() const override;
  std::optional<double> timeout_seconds() const override { return session_->timeout_seconds(); }
  bool overlaps_updates() const override { return session_->overlaps_updates(); }
  void wait_for_answers() override { session_->read_answers_owed(nullptr); }
  store::SyncSteps* sync_steps() override { return this; }
  // sync_step.h
  void stage_step(const std::vector<store::StepRows>& tables, const StepTag& tag, double timeout_seconds) override;
  void commit_step(const std::vector<store::TableHandle*>& tables, const StepTag& tag, double timeout_seconds) override;

 private:
  // A declaration on a read-only connection: the existing table, if its shape and dtype match.
  std::shared_ptr<store::TableHandle> open_read_only(const std::string& name,
                                                     const store::TableDeclaration& declaration);
  std::shared_ptr<RemoteTable> named_from(const std::string& name, const std::vector<TableDescription>& found,
                                          RemoteSession::Lease& lease);
  // FIND on every shard: the table's description on each, or none where it is not.
  std::vector<std::optional<TableDescription>> find_on_every_shard(RemoteSession::Lease& lease,
                                                                   const std::string& name);
  // The StoreError(NotFound) for a named table on some shards only, naming the first without it.
  [[noreturn]] void throw_lost(const std::string& name, size_t missing_shard) const;
  // Refuses (throw_lost) to declare a table some shards hold and others lost: re-creating their part
  // would silently give its rows back their init values. Another client's first declaration, in
  // flight, also leaves it on some shards only, but only for a round trip: asked again for
  // kDeclarationSettleSeconds, a table on some shards only is lost.
  void refuse_if_lost(RemoteSession::Lease& lease, const std::string& name);

  std::shared_ptr<RemoteSession> session_;
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace recdev::net
