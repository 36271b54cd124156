// ShardService's handlers of synchronous steps (STAGE_UPDATE, COMMIT_UPDATE): what a part must be
// before the shard holds it, and the apply of a committed step. The waiting and the bookkeeping are
// StagedSteps' (staged_steps.h).
#include "service.h"
#include "service_helpers.h"
#include "store/gradient_check.h"

namespace recdev::net {

using namespace service_detail;

std::vector<uint8_t> ShardService::stage_update(const Session& session, const Frame& frame) {
  auto request = decode<StageUpdateRequest>(frame);
  RowsRequest& rows = request.rows;
  // Everything the apply could refuse is refused now, before the step is ready on any shard: an
  // apply that failed here after another shard applied its rows would leave the step half-applied.
  if (rows.dtype != store::ElementType::Float32) invalid("synchronous steps carry float32 gradients");
  const Target target = resolve_rows(session, rows.table_id, rows.dtype, frame.header.opcode);
  const size_t n = rows.ids.size();
  const uint32_t dim = target.table->config().row_words;
  if (rows.rows.size() != n * dim) {
    invalid("grads hold " + std::to_string(rows.rows.size()) + " floats; " + std::to_string(n) + " ids of dim " +
            std::to_string(dim) + " need " + std::to_string(n * dim));
  }
  check_rows(target, rows.ids.data(), n);
  store::check_update_gradients(rows.dtype, dim, rows.ids.data(), n, rows.rows.data(),
                                "table " + std::to_string(rows.table_id));
  // The part itself, held until applied (counted by the staged steps once staged), and the rows the
  // step may materialize.
  const Reservation part = reserve(n * (sizeof(uint64_t) + uint64_t{dim} * sizeof(float)));
  const Reservation new_rows = reserve_rows(*target.table, rows.ids.data(), n);
  if (request.timeout_ms == 0) invalid("a synchronous step's timeout_ms must be positive");
  // The budget is judged on the whole step (every rank's rows), once they are all in.
  staged_steps_.stage(
      rows.table_id, request.tag, request.rank_rows, request.timeout_ms / 1000.0, std::move(rows.ids),
      std::move(rows.rows),
      [&](const std::vector<uint64_t>& ids) { target.table->check_update_fits(ids.data(), ids.size()); },
      session.weak_from_this());
  return reply_empty(frame);
}

std::vector<uint8_t> ShardService::commit_update(const Session& session, const Frame& frame) {
  const auto request = decode<CommitUpdateRequest>(frame);
  const Target target = resolve(session, request.table_id);
  staged_steps_.commit(request.table_id, request.tag,
                       [&](const std::vector<uint64_t>& ids, const std::vector<float>& grads, bool any_rows) {
                         // One update, this shard's rows of every rank included, empty or not: the
                         // optimizer's step counter advances once on every shard, as in one process.
                         if (any_rows) target.table->update(ids.data(), ids.size(), grads.data());
                       });
  return reply_empty(frame);
}

}  // namespace recdev::net
