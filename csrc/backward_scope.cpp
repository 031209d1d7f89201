#include "backward_scope.h"

#include <mutex>
#include <utility>

namespace torch_offload {
namespace {

std::mutex default_scope_mutex;
BackwardScope& default_scope() {
  static BackwardScope scope{[] { return int64_t{-1}; }, [](std::function<void()>) {}};
  return scope;
}

}  // namespace

void set_default_backward_scope(BackwardScope scope) {
  std::lock_guard<std::mutex> lock(default_scope_mutex);
  default_scope() = std::move(scope);
}

BackwardScope default_backward_scope() {
  std::lock_guard<std::mutex> lock(default_scope_mutex);
  return default_scope();
}

}  // namespace torch_offload
