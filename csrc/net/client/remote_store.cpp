// RemoteStoreClient: the store on recdev-server shards: tables created, declared, found and freed on
// every shard; checkpoints; synchronous steps (sync_step.h).
#include "remote_store.h"

#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "remote_checkpoint.h"
#include "store/errors.h"
#include "sync_step.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

namespace {

uint64_t random_route_key() {
  static std::mutex mutex;
  static std::mt19937_64 generator{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mutex);
  return generator();
}

}  // namespace

RemoteStoreClient::RemoteStoreClient(const std::string& servers, const std::string& token, double timeout_seconds,
                                     bool read_only, bool overlap_updates)
    : session_(std::make_shared<RemoteSession>(parse_server_list(servers), token, timeout_seconds, read_only,
                                               overlap_updates)) {}

std::vector<std::string> RemoteStoreClient::servers() const {
  std::vector<std::string> servers;
  for (const std::string& address : session_->servers()) servers.push_back("tcp://" + address);
  return servers;
}

std::shared_ptr<store::TableHandle> RemoteStoreClient::create_table(const store::TableConfig& config,
                                                                    std::optional<uint64_t> init_stream) {
  store::validate_table_config(config);
  const uint64_t client_id = next_id_++;
  CreateTableRequest request;
  request.config = config;
  // Every shard draws the same init values: the stream is chosen here, not by each server.
  request.init_stream = init_stream.value_or(client_id);
  request.route_key = random_route_key();
  RemoteSession::Lease lease(*session_);
  const size_t shards = session_->num_shards();
  std::vector<Call> calls;
  for (size_t shard = 0; shard < shards; ++shard) calls.push_back(make_call(shard, Opcode::CreateTable, request));
  std::vector<uint64_t> table_ids(shards), epochs(shards);
  try {
    session_->exchange(lease, calls);
  } catch (...) {
    // Free what the other shards made.
    std::vector<Call> frees;
    for (size_t shard = 0; shard < shards; ++shard) {
      if (!calls[shard].response.empty()) {
        frees.push_back(
            make_call(shard, Opcode::FreeTable, TableRequest{answer_of<TableIdResponse>(calls[shard]).table_id}));
      }
    }
    try {
      session_->exchange_keeping_failures(lease, frees);
    } catch (const StoreError&) {}
    throw;
  }
  for (size_t shard = 0; shard < shards; ++shard) {
    table_ids[shard] = answer_of<TableIdResponse>(calls[shard]).table_id;
    epochs[shard] = lease.connection(shard).epoch;
  }
  return std::make_shared<RemoteTable>(session_, client_id, std::string(), request.route_key, config.num_rows,
                                       config.row_words, config.dtype, std::move(table_ids), std::move(epochs));
}

std::shared_ptr<RemoteTable> RemoteStoreClient::named_from(const std::string& name,
                                                           const std::vector<TableDescription>& found,
                                                           RemoteSession::Lease& lease) {
  std::vector<uint64_t> table_ids, epochs;
  for (size_t shard = 0; shard < found.size(); ++shard) {
    if (found[shard].config.num_rows != found[0].config.num_rows ||
        found[shard].config.row_words != found[0].config.row_words) {
      throw StoreError(ErrorCode::InvalidArgument, "table '" + name + "' has " + describe(found[0].config) + " on " +
                                                       session_->describe(0) + " but " + describe(found[shard].config) +
                                                       " on " + session_->describe(shard));
    }
    table_ids.push_back(found[shard].table_id);
    epochs.push_back(lease.connection(shard).epoch);
  }
  return std::make_shared<RemoteTable>(session_, next_id_++, name, route_key_of_name(name), found[0].config.num_rows,
                                       found[0].config.row_words, found[0].config.dtype, std::move(table_ids),
                                       std::move(epochs));
}

std::shared_ptr<store::TableHandle> RemoteStoreClient::declare(const std::string& name,
                                                               const store::TableDeclaration& declaration) {
  if (name.empty()) throw StoreError(ErrorCode::InvalidArgument, "a named table needs a non-empty name");
  store::validate_table_config(declaration.config);
  if (declaration.optimizer) store::validate_optimizer(*declaration.optimizer);
  if (session_->read_only()) return open_read_only(name, declaration);
  RemoteSession::Lease lease(*session_);
  if (!declaration.reset) refuse_if_lost(lease, name);
  std::vector<Call> calls;
  for (size_t shard = 0; shard < session_->num_shards(); ++shard) {
    calls.push_back(make_call(shard, Opcode::OpenNamed, OpenNamedRequest{name, declaration}));
  }
  session_->exchange(lease, calls);
  std::vector<TableDescription> found;
  for (const Call& call : calls) found.push_back(answer_of<TableDescription>(call));
  return named_from(name, found, lease);
}

std::shared_ptr<store::TableHandle> RemoteStoreClient::open_read_only(const std::string& name,
                                                                      const store::TableDeclaration& declaration) {
  if (declaration.reset) {
    throw StoreError(
        ErrorCode::ReadOnly,
        "cannot reset table '" + name + "' on a read-only connection (torch_recdev.connect(..., read_only=True))");
  }
  const auto found = find(name);
  if (!found) {
    throw StoreError(ErrorCode::NotFound, "table '" + name +
                                              "' is not on the servers of this read-only connection; a serving "
                                              "shard holds the tables of the version it serves (recdev-server --stats "
                                              "lists them)");
  }
  const store::TableConfig held = (*found)->config();
  const store::TableConfig& wanted = declaration.config;
  if (held.num_rows != wanted.num_rows || held.row_words != wanted.row_words || held.dtype != wanted.dtype) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "table '" + name + "' is served with num_rows " + std::to_string(held.num_rows) + ", dim " +
                         std::to_string(held.row_words) + " and dtype " + store::describe(held.dtype) +
                         "; the declaration has num_rows " + std::to_string(wanted.num_rows) + ", dim " +
                         std::to_string(wanted.row_words) + " and dtype " + store::describe(wanted.dtype));
  }
  return *found;
}

std::vector<std::optional<TableDescription>> RemoteStoreClient::find_on_every_shard(RemoteSession::Lease& lease,
                                                                                    const std::string& name) {
  std::vector<Call> calls;
  for (size_t shard = 0; shard < session_->num_shards(); ++shard) {
    calls.push_back(make_call(shard, Opcode::Find, NameRequest{name}));
  }
  session_->exchange(lease, calls);
  std::vector<std::optional<TableDescription>> found;
  for (const Call& call : calls) found.push_back(answer_of<FindResponse>(call).table);
  return found;
}

void RemoteStoreClient::throw_lost(const std::string& name, size_t missing_shard) const {
  throw StoreError(ErrorCode::NotFound,
                   "table '" + name + "' is on some shards but not on " + session_->describe(missing_shard) +
                       ": that server restarted without it (was it started with the --checkpoint-dir it had?), "
                       "and the table's rows there are lost. Restore the table from a checkpoint (ops.load), or "
                       "declare it with reset=True to start it over on every shard");
}

void RemoteStoreClient::refuse_if_lost(RemoteSession::Lease& lease, const std::string& name) {
  constexpr double kDeclarationSettleSeconds = 1.0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kDeclarationSettleSeconds);
  while (true) {
    const auto found = find_on_every_shard(lease, name);
    const auto missing = std::find_if(found.begin(), found.end(), [](const auto& table) { return !table; });
    const bool on_some = std::any_of(found.begin(), found.end(), [](const auto& table) { return table.has_value(); });
    if (missing == found.end() || !on_some) return;
    if (std::chrono::steady_clock::now() >= deadline) throw_lost(name, size_t(missing - found.begin()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::optional<std::shared_ptr<store::TableHandle>> RemoteStoreClient::find(const std::string& name) {
  RemoteSession::Lease lease(*session_);
  std::vector<TableDescription> found;
  std::optional<size_t> missing;
  const auto answers = find_on_every_shard(lease, name);
  for (size_t shard = 0; shard < answers.size(); ++shard) {
    if (answers[shard]) found.push_back(*answers[shard]);
    else if (!missing) missing = shard;
  }
  if (missing && !found.empty()) throw_lost(name, *missing);
  if (found.empty()) return std::nullopt;
  return named_from(name, found, lease);
}

void RemoteStoreClient::free_table(store::TableHandle& table) noexcept {
  if (auto* remote = dynamic_cast<RemoteTable*>(&table)) remote->free();
}

void RemoteStoreClient::save(const std::string& path) { save_checkpoint(*session_, path); }

void RemoteStoreClient::stage_step(const std::vector<store::StepRows>& tables, const StepTag& tag,
                                   double timeout_seconds) {
  net::stage_step(tables, tag, timeout_seconds);
}

void RemoteStoreClient::commit_step(const std::vector<store::TableHandle*>& tables, const StepTag& tag,
                                    double timeout_seconds) {
  net::commit_step(tables, tag, timeout_seconds);
}

std::vector<std::string> RemoteStoreClient::load(const std::string& path) { return load_checkpoint(*session_, path); }
uint64_t RemoteStoreClient::checkpoint(const std::string& directory) { return save_version(*session_, directory); }
std::pair<uint64_t, std::vector<std::string>> RemoteStoreClient::restore(const std::string& directory,
                                                                         std::optional<uint64_t> version) {
  return restore_version(*session_, directory, version);
}
uint64_t RemoteStoreClient::export_tables(const std::string& directory, std::optional<store::ElementType> dtype) {
  return export_version(*session_, directory, dtype);
}

}  // namespace recdev::net
