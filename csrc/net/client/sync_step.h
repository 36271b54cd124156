// A synchronous step of a fleet on remote shards, from one rank (torch_recdev/sync.py calls it through
// the bindings): the rank's recorded rows of every table of an optimizer staged on the shards, then
// committed (docs/protocol.md, "Synchronous steps"; the shard's side is staged_steps.h).
//
// stage_step returns once every shard holds every rank's part of every table, or throws the first
// shard's error (a rank whose part never came is named; nothing of the step is applied anywhere,
// since no rank commits). commit_step then applies the step: each shard applies it on the first
// commit, and answers each rank once it is applied, so a rank's next lookup sees every rank's rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "remote_store.h"
#include "store/sync_steps.h"

namespace recdev::net {

// store::SyncSteps as RemoteStoreClient implements it: every table must be a RemoteTable of one
// session (StoreError(InvalidArgument) otherwise). timeout_seconds: how long a shard waits for the
// other ranks' parts.
void stage_step(const std::vector<store::StepRows>& tables, const StepTag& tag, double timeout_seconds);
void commit_step(const std::vector<store::TableHandle*>& tables, const StepTag& tag, double timeout_seconds);

}  // namespace recdev::net
