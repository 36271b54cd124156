#include "cpu_access.h"

#include "cpu_view.h"

namespace recdev::device {

CpuAccess::CpuAccess(const at::Tensor& t, const std::string& what) {
  if (is_table(t)) {
    window_.emplace(t, what);
    cpu_ = window_->cpu();
  } else if (t.defined() && t.is_privateuseone()) {
    cpu_ = cpu_view(t);
  } else {
    cpu_ = t;
  }
}

void CpuAccess::write_back() const {
  if (window_) {
    window_->write_back();
  }
}

}  // namespace recdev::device
