#include "copy_batch.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <utility>

namespace torch_offload {

void CopyBatch::take_over() {
  thread_ = std::this_thread::get_id();
  depth_ = 1;
}

bool CopyBatch::close() {
  if (!open_on_this_thread()) return false;  // never begun, or taken over
  if (--depth_ > 0) return false;
  thread_ = std::thread::id{};
  return true;
}

c10::Stream CopyBatch::producer_of(const at::Tensor& src) {
  return c10::impl::getDeviceGuardImpl(src.device().type())->getStream(src.device());
}

void CopyBatch::add(Copy copy, const c10::Stream& producer) {
  TORCH_INTERNAL_ASSERT(accepts(producer), "a batch of copies takes sources of one stream");
  stream_ = producer;
  pending_.push_back(std::move(copy));
}

std::vector<CopyBatch::Copy> CopyBatch::take() {
  std::vector<Copy> taken;
  taken.swap(pending_);
  return taken;
}

}  // namespace torch_offload
