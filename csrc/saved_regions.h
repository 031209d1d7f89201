#pragma once
// Deduplicated saves for saved-tensor hooks (the ops offload_pack / offload_unpack): each distinct
// region of a storage that autograd saves is copied to host memory once, however many times it, or
// views of it, are saved, and restored once per backward.
//
// Keying on a raw data_ptr has given peers wrong gradients (a tensor and its transpose share a
// pointer; a freed pointer is handed to the next allocation). Here:
// - A source storage is keyed by its StorageImpl, held through a weak reference for as long as a
//   copy of it lives: the StorageImpl cannot be freed, nor its address reused, meanwhile.
// - A copy is shared only by saves of one view family (the same base, hence the same version
//   counter) at the same version. The version is checked again when the copy is restored and
//   whenever a restored copy is reused, so an in-place change between a save and backward is an
//   error as in autograd; a change between two saves makes the second save copy again.
// - A copy holds a byte range of the source storage. Each save gets back a host tensor (its save
//   handle) with its own dtype, sizes, strides and offset on the copy's storage; unpacking gives
//   the same view of the restored storage.
// - Host memory is freed when the last save handle of a copy dies (autograd drops what we packed).
//
// Which bytes are copied: the range from the view's first to its last element, widened to the union
// with overlapping copies of the same family (so a later view inside the union reuses it), and to
// the whole storage when that range is at least half of it (so the slices of a fused projection
// share one copy; at most 2x the range). A sparse view (its elements under half its range, x[:,
// ::4]) is copied alone, compacted; only a save of the identical view reuses it.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backward_scope.h"
#include "offload_stats.h"

namespace torch_offload {

class Manager;

class SavedRegions {
 public:
  SavedRegions(Manager& manager, BackwardScope scope);

  // The save handle of `t` (a dense strided tensor with data, not conjugated or negated): a host
  // tensor with t's dtype, sizes and strides on the storage of the host copy that holds t's
  // elements, made now or shared with an earlier save.
  at::Tensor pack(const at::Tensor& t);
  // The saved tensor on `device`, as it was saved: its copy is restored once per backward and
  // shared by that backward's unpacks until each save made from it has been unpacked.
  at::Tensor unpack(const at::Tensor& save, c10::Device device);

  // The manager calls this when a handle dies (its storage's context): the copy made on it goes,
  // with its restored device tensor, even where the backward's end never came (an error midway).
  void on_handle_freed(const void* context);

  // Counters since the last reset: saved_tensors, offloaded_saves, shared_saves, saved_bytes,
  // distinct_bytes_saved (see README "Statistics").
  void add_stats(OffloadStats& stats) const;
  void reset_stats();
  // Source storages with a live copy (drops the records of copies whose handles died).
  int64_t live_storages();
  // Copies holding a restored device tensor now (each is dropped after its last save's unpack).
  int64_t held_restores() const;

 private:
  using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;
  static c10::intrusive_ptr<c10::StorageImpl> NoStorage() { return {}; }
  // A sparse view's exact layout: only a save of the identical view shares its compacted copy.
  struct Layout {
    c10::ScalarType dtype = c10::kByte;
    std::vector<int64_t> sizes, strides;
    int64_t offset = 0;
    bool operator==(const Layout& other) const {
      return dtype == other.dtype && sizes == other.sizes && strides == other.strides &&
             offset == other.offset;
    }
  };
  // One host copy of a source storage's region.
  struct Copy {
    WeakStorage handle_storage{NoStorage()};  // expires with the copy's last save handle
    // The handle as Manager::save returned it (restored through it).
    std::vector<int64_t> handle_sizes;
    c10::ScalarType handle_dtype = c10::kByte;
    c10::weak_intrusive_ptr<c10::TensorImpl> root{
        c10::intrusive_ptr<c10::TensorImpl>()};  // its view family
    c10::VariableVersion version_counter;
    uint32_t version = 0;
    int64_t lo = 0, hi = 0;  // bytes [lo, hi) of the source storage (a plain copy)
    bool compact = false;    // a sparse view copied alone (layout)
    Layout layout;
    std::vector<int64_t> compact_strides;  // a save's strides on a compact copy
    int64_t saves = 0;                     // save handles made from it
    // The restored copy, shared by the unpacks of one backward.
    at::Tensor restored;
    int64_t restored_task = -1;
    int64_t unpacked = 0;  // unpacks served in restored_task
    bool alive() const { return !handle_storage.expired(); }
    // Made from a save of `root`'s view family at `version` (a dead root's address is never
    // reused while we hold it, so the comparison cannot match a newer tensor).
    bool of_family(const at::Tensor& root_now, uint32_t version_now) const {
      return version == version_now && root._unsafe_get_target() == root_now.unsafeGetTensorImpl();
    }
  };
  // The live copies of one source storage and the byte intervals its saves cover.
  struct Source {
    WeakStorage storage{NoStorage()};  // pins the StorageImpl's address while the record lives
    int64_t nbytes = 0;
    std::vector<std::shared_ptr<Copy>> copies;
    std::vector<std::pair<int64_t, int64_t>> covered;  // merged, sorted
  };

  // A new copy of t's region (no lock held: it calls Manager::save), and its handle's storage,
  // which the caller's save handle keeps alive from then on.
  std::shared_ptr<Copy> copy_region(const at::Tensor& saved, const at::Tensor& root, int64_t lo,
                                    int64_t hi, const Layout& layout,
                                    const std::vector<std::shared_ptr<Copy>>& live,
                                    c10::intrusive_ptr<c10::StorageImpl>& handle_storage);
  // Bytes newly covered by `runs` in `source` (adds them).
  static int64_t cover(Source& source, const std::vector<std::pair<int64_t, int64_t>>& runs);
  void sweep_locked();
  void check_unmodified(const Copy& copy) const;
  // The restored copy for this unpack, restoring it if this backward has not yet.
  at::Tensor restored_copy(const std::shared_ptr<Copy>& copy, const at::Tensor& save,
                           c10::Device device);

  Manager& manager_;
  const BackwardScope scope_;
  // Shared with the callbacks that run when a backward ends (they may outlive this table).
  const std::shared_ptr<std::mutex> mutex_ = std::make_shared<std::mutex>();
  std::unordered_map<const c10::StorageImpl*, Source> sources_;
  // Keyed by the handle storage's context (the manager's entry key), erased when the handle dies.
  std::unordered_map<const void*, std::shared_ptr<Copy>> copies_by_handle_;
  int64_t packs_since_sweep_ = 0;
  OffloadStats counters_;  // only the save-hook fields are used
};

}  // namespace torch_offload
