#include "profiler_ranges.h"

#include <memory>
#include <string>
#include <unordered_map>

#include "store/trace_range.h"

namespace recdev::device {

namespace {

// The fields become keyword inputs, which the profiler keeps with record_shapes=True
// (FunctionEvent.kwinputs, the "args" of a Chrome trace event); without it they are not built.
class ProfilerTracer final : public trace::Tracer {
 public:
  bool active() const override { return at::hasCallbacks(); }

  void* begin(const char* name, const trace::Field* fields, size_t count, trace::Nesting nesting) override {
    std::optional<at::StepCallbacks> callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE);
    if (!callbacks) return nullptr;
    auto range = std::make_unique<at::RecordFunction>(std::move(*callbacks));
    if (!range->isActive()) return nullptr;
    // An async range stays out of the profiler's parent and child links (FunctionEvent.cpu_parent).
    if (nesting == trace::Nesting::Overlapping) range->_setAsync();
    if (range->needsInputs()) {
      std::unordered_map<std::string, c10::IValue> kwargs;
      for (size_t i = 0; i < count; ++i) {
        const trace::Field& field = fields[i];
        kwargs.emplace(field.key, field.is_text ? c10::IValue(std::string(field.text)) : c10::IValue(field.number));
      }
      range->before(name, &kwargs);
    } else {
      range->before(name);
    }
    return range.release();
  }

  void end(void* range) override { delete static_cast<at::RecordFunction*>(range); }  // ~RecordFunction ends it
};

const bool installed = [] {
  static ProfilerTracer tracer;
  trace::install_tracer(&tracer);
  return true;
}();

}  // namespace

}  // namespace recdev::device
