#pragma once
// Autograd's rule for saved tensors, applied to offloaded copies: the source must not have been
// changed in place between its save and the restore, or the copy is stale.
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace torch_offload {

// Throws naming `what` (e.g. "offload_restore: the tensor passed to offload_save") when `counter`
// moved on from `saved`; a disabled counter (inference tensors) is never checked.
inline void check_version(const c10::VariableVersion& counter, uint32_t saved, const char* what) {
  if (!counter.enabled()) return;
  const uint32_t now = counter.current_version();
  TORCH_CHECK(now == saved, what,
              " was modified in place after it was saved (its version went from ", saved, " to ",
              now,
              "), so the offloaded copy is stale. Save it after the in-place operation, or clone "
              "it before modifying it.");
}

}  // namespace torch_offload
