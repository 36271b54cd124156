#include "trace_range.h"

namespace recdev::trace {

namespace {
std::atomic<Tracer*> installed{nullptr};
}  // namespace

void install_tracer(Tracer* tracer) { installed.store(tracer, std::memory_order_release); }

bool active() {
  const Tracer* tracer = installed.load(std::memory_order_acquire);
  return tracer != nullptr && tracer->active();
}

Range::Range(const char* name, std::initializer_list<Field> fields, Nesting nesting)
    : tracer_(installed.load(std::memory_order_acquire)) {
  if (tracer_ != nullptr) handle_ = tracer_->begin(name, fields.begin(), fields.size(), nesting);
}

void Range::end() {
  if (handle_ == nullptr) return;
  tracer_->end(handle_);
  handle_ = nullptr;
}

}  // namespace recdev::trace
