// ShardService: what one recdev-server shard does with a request, independent of sockets — the
// handshake, every opcode's handler over a store::Store, row ownership, sessions, the memory limit
// and the counters of STATS. The server loop (server.h) feeds it frames; it answers every frame with
// a response frame (an error frame when the request failed) and never throws for anything a client
// sends.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "net/wire/frame_io.h"
#include "net/wire/protocol.h"
#include "request_counters.h"
#include "sessions.h"
#include "staged_steps.h"
#include "store/checkpoint_format.h"
#include "store/store.h"
#include "version_lock.h"

namespace recdev::net {

struct ServiceOptions {
  uint32_t shard = 0;
  uint32_t num_shards = 1;
  std::string token;        // empty: no token required
  uint64_t max_memory = 0;  // bytes; 0 = no limit
  double lease_seconds = 60;
  // Synchronous steps (STAGE_UPDATE): the gradient bytes all fleets may have staged at once, and the
  // longest a part waits for the others, whatever timeout its client asked for.
  uint64_t max_staged_bytes = uint64_t{1} << 30;
  double max_stage_seconds = 3600;
  // Non-empty: a read-only serving shard of this directory's versions (serving.h): requests that
  // would change a table are refused (ReadOnly), lookups do not materialize rows, and declarations
  // open the tables served.
  std::string serve_dir;
};

struct Response {
  std::vector<uint8_t> frame;
  bool close_after = false;  // a Protocol or PermissionDenied error: the connection ends after it
};

class ShardService {
 public:
  explicit ShardService(const ServiceOptions& options);

  const ServiceOptions& options() const { return options_; }
  store::Store& store() { return store_; }

  // The first frame of a connection. On success `session` is attached (detach it with
  // end_connection); otherwise the response is an error and close_after is set.
  Response handshake(const Frame& frame, std::shared_ptr<Session>& session);
  Response handle(Session& session, const Frame& frame);
  // Hands a sent response's buffer back for the next response of this thread (connection).
  void recycle(std::vector<uint8_t>&& frame);
  // The answer to a frame whose header was refused (BadFrame).
  Response refuse_frame(const BadFrame& error);
  void end_connection(Session& session) { sessions_.detach(session); }
  // Open connections, for STATS (the server loop counts them).
  void connection_opened() { connections_.fetch_add(1); }
  void connection_closed() { connections_.fetch_sub(1); }
  // Bytes held by connections' request and response buffers, counted in STATS' bytes and against
  // --max-memory: the server loop reports each change.
  void buffers_changed(uint64_t before, uint64_t after) {
    buffer_bytes_.fetch_add(after - before);  // modulo 2^64: a decrease wraps back
  }
  // This connection thread's kept response buffer (recycle()), and its release.
  uint64_t response_buffer_bytes() const;
  void release_response_buffer();

  // Bytes a request admitted under --max-memory may still add (reserve), held from its admission to
  // its end: concurrent requests are admitted against the cap together, so that twenty requests
  // checked at once cannot each fit what the others have not materialized yet. A request's rows,
  // once materialized, are counted by their table as well until it ends: an over-count, never an
  // under-count.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(std::atomic<uint64_t>& held, uint64_t bytes) : held_(&held), bytes_(bytes) {}
    Reservation(Reservation&& other) noexcept : held_(other.held_), bytes_(other.bytes_) { other.held_ = nullptr; }
    Reservation& operator=(Reservation&&) = delete;
    ~Reservation() {
      if (held_ != nullptr) held_->fetch_sub(bytes_);
    }
    // Gives back all but `bytes` of it, once the rest is counted elsewhere.
    void keep(uint64_t bytes) {
      if (held_ != nullptr && bytes < bytes_) {
        held_->fetch_sub(bytes_ - bytes);
        bytes_ = bytes;
      }
    }

   private:
    std::atomic<uint64_t>* held_ = nullptr;
    uint64_t bytes_ = 0;
  };
  // --max-memory, before a request's payload is read: twice the payload's bytes reserved — the frame,
  // and the request decoded from it (a copy of its arrays) — or StoreError(Full) if they would pass
  // the limit (the caller then skips the payload and answers refuse_request: the request is refused
  // whole without being held). Once the frame is in the connection's buffer count the caller keeps
  // only the decoded request's half, until the request is answered. Payloads below a small size are
  // not counted (see reserve), nor those of ERASE, which is how a full shard is given room.
  [[nodiscard]] Reservation admit_payload(const FrameHeader& header) const {
    return header.opcode == Opcode::Erase ? Reservation() : reserve(0, {}, 2 * uint64_t{header.payload_bytes});
  }
  Response refuse_request(const FrameHeader& header, const store::StoreError& error);

  // Frees what lapsed sessions owned, and the synchronous steps nobody committed before their
  // deadline. Called periodically by the server.
  void reap_lapsed_sessions();
  // At shutdown: ends the waits of synchronous steps' parts (StagedSteps::stop).
  void stop_staged_steps() { staged_steps_.stop(); }
  // Registers the named tables already in the store (after a checkpoint was loaded at start).
  void adopt_named_tables();
  // A serving shard's swap to another version: `tables` (this shard's rows only) replace the store's
  // tables of the same names, all at once between two requests, so that a lookup sees one version
  // entirely; tables the version has not are kept as they were.
  void serve_version(std::vector<store::StagedTable>& tables, uint64_t version, int64_t written_unix_ms);
  bool serving() const { return !options_.serve_dir.empty(); }
  ServerStats stats();

 private:
  struct TableEntry {
    uint64_t route_key;
    uint64_t owner_session;  // 0 for a named table
    std::string name;
  };
  struct Target {
    std::shared_ptr<store::Table> table;
    TableEntry entry;
  };

  // handshake's and handle's answers, before they are counted.
  Response authenticate(const Frame& frame, std::shared_ptr<Session>& session);
  Response answer(Session& session, const Frame& frame);
  // Counts an answered request (RequestCounters) and hands its response on.
  Response counted(Opcode opcode, uint64_t bytes_received, Response response, uint64_t rows, Clock::time_point started);
  std::vector<uint8_t> dispatch(Session& session, const Frame& frame);
  // The Protocol error for a request with flags set.
  Response flagged_request(const Frame& frame);
  Response error_response(Opcode opcode, uint64_t request_id, store::ErrorCode code, const std::string& message);

  Target resolve(const Session& session, uint64_t table_id) const;
  // resolve, for a request on rows: refuses (InvalidArgument) a client that holds the table as
  // another element type than this shard, naming both, before any row is read or written.
  Target resolve_rows(const Session& session, uint64_t table_id, store::ElementType dtype, Opcode opcode) const;
  // OutOfRange for an id past the table, then InvalidArgument for a row of another shard.
  void check_rows(const Target& target, const uint64_t* ids, size_t n) const;
  TableDescription describe_table(uint64_t table_id, const store::Table& table) const;
  void register_table(uint64_t table_id, const TableEntry& entry);

  // --max-memory: throws StoreError(Full) unless the store can grow by `growth` bytes (and the
  // request use `working` bytes of its own, such as its response) beside what the store holds and
  // every admitted request reserved. When the estimate does not fit, `precise` (if given) computes a
  // tighter growth first.
  [[nodiscard]] Reservation reserve(uint64_t growth, const std::function<uint64_t()>& precise = {},
                                    uint64_t working = 0) const;
  uint64_t memory_used() const;
  // Estimated bytes a batch of ids could add to a table by materializing rows, plus `working`.
  [[nodiscard]] Reservation reserve_rows(const store::Table& table, const uint64_t* ids, size_t n,
                                         uint64_t working = 0) const;

  void free_session_objects(Session& session);

  std::vector<uint8_t> create_table(Session& session, const Frame& frame);
  std::vector<uint8_t> open_named(const Frame& frame);
  std::vector<uint8_t> find(const Frame& frame);
  std::vector<uint8_t> free_table(Session& session, const Frame& frame);
  std::vector<uint8_t> list(const Session& session, const Frame& frame);
  std::vector<uint8_t> table_info(const Session& session, const Frame& frame);
  std::vector<uint8_t> read_rows(const Session& session, const Frame& frame, bool materialize);
  std::vector<uint8_t> gather_pooled_partial(const Session& session, const Frame& frame);
  std::vector<uint8_t> write_or_update(const Session& session, const Frame& frame, bool update);
  std::vector<uint8_t> write_bytes(const Session& session, const Frame& frame);
  std::vector<uint8_t> exists(const Session& session, const Frame& frame);
  std::vector<uint8_t> erase(const Session& session, const Frame& frame);
  std::vector<uint8_t> gather_state(const Session& session, const Frame& frame);
  std::vector<uint8_t> set_policy(const Session& session, const Frame& frame);
  std::vector<uint8_t> policy_state(const Session& session, const Frame& frame);
  std::vector<uint8_t> restore_policy(const Session& session, const Frame& frame);
  // A synchronous step's part (waits for every rank's; staged_steps.h) and its commit.
  std::vector<uint8_t> stage_update(const Session& session, const Frame& frame);
  std::vector<uint8_t> commit_update(const Session& session, const Frame& frame);
  std::vector<uint8_t> dump(Session& session, const Frame& frame);
  std::vector<uint8_t> begin_load(Session& session, const Frame& frame);
  std::vector<uint8_t> load_rows(Session& session, const Frame& frame);
  std::vector<uint8_t> open_served(const Frame& frame, const OpenNamedRequest& request);
  std::vector<uint8_t> commit_load(Session& session, const Frame& frame);

  const ServiceOptions options_;
  store::Store store_;
  Sessions sessions_;
  mutable std::mutex directory_mutex_;
  std::map<uint64_t, TableEntry> directory_;
  // Memory held by staged loads and dump snapshots, outside the store's tables.
  std::atomic<uint64_t> staged_bytes_{0};
  StagedSteps staged_steps_;
  std::atomic<uint64_t> buffer_bytes_{0};
  mutable std::mutex reserve_mutex_;  // one admission at a time: the check and the hold are one step
  mutable std::atomic<uint64_t> reserved_bytes_{0};
  RequestCounters counters_;
  std::atomic<uint64_t> connections_{0};
  const Clock::time_point started_ = Clock::now();
  // A serving shard's: held shared by every request, exclusively by serve_version's swap.
  VersionLock serving_mutex_;
  std::atomic<uint64_t> serving_version_{0};
  std::atomic<int64_t> serving_written_unix_ms_{0};
};

}  // namespace recdev::net
