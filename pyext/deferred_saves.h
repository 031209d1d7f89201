// Deferred saves: inside a batch (offload_activations' batch_copies: mode "modules", one batch per
// selected module call), the pack hook only holds each large op output it is given (and each leaf
// without grad that is no weight, as rotary cos / sin), and the batch's end offloads them all, one
// after the other (offload_held).
//
// Why: in a host-bound step (the forward of a "modules" step whose host thread is the bottleneck)
// each save's trip through the engine cost ~11 us of the step's host thread, against ~3-6 us for
// the same calls made back to back: the engine's code and data go cold between saves, while the
// model's own ops run. Held, a save costs the hook a few checks and a SavedView; the engine then
// sees the call's saves in one run, before the batch's copies are issued. Handing them to a worker
// thread instead was slower (docs/performance.md).
//
// What a held save keeps: the tensor (as autograd would), its version when saved, and whether the
// caller checked it is no weight. Backward reads it as it was; changed in place before the batch's
// end, it is not copied, and unpacking it raises as a stale offloaded copy does. Saves the engine
// keeps on the device stay held.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

#include "pyext/saved_view.h"

namespace torch_offload_pyext {

// Whether the hook may hold `t` instead of asking the engine now: a dense strided tensor with
// data (what the engine's filter decides without Python) of at least `min_bytes` that is an op's
// output or a view of one (kOpOutput), or a leaf without grad or a view of one (kLeafWithoutGrad:
// held once the caller saw that it is no frozen nn.Parameter, as rotary cos / sin). Weights
// (leaves that require grad) are not held: the filter keeps them at once.
enum class Holdable { kNo, kOpOutput, kLeafWithoutGrad };
Holdable holdable(const at::Tensor& t, int64_t min_bytes);

// The batches of one set of hooks. One thread at a time holds saves: the thread whose outermost
// batch is open (another thread's saves go to the engine at once, as before). Call with the GIL.
class DeferredSaves {
 public:
  ~DeferredSaves();  // drops the held views (with the GIL)

  void begin();
  // True when this ends the calling thread's outermost batch: the caller offloads take() then.
  bool end();
  bool holding() const { return depth_ > 0 && owner_ == std::this_thread::get_id(); }
  void add(SavedView* view);  // takes a new reference
  std::vector<SavedView*> take();

 private:
  std::thread::id owner_;
  int depth_ = 0;
  std::vector<SavedView*> views_;
};

// Offloads the held saves in `views` through offload_pack_filtered (the GIL released around the
// op calls), then drops the references. A view only the list still held (autograd dropped it) is
// skipped. Returns the first error of the op (the views from there on stay held), or nullptr.
std::exception_ptr offload_held(std::vector<SavedView*> views, int64_t manager, int64_t filter);

// The tensor a held view gives back to backward; throws where it was changed in place after
// its save.
const at::Tensor& held_tensor(const SavedView& view);

}  // namespace torch_offload_pyext
