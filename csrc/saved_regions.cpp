#include "saved_regions.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <numeric>

#include "manager.h"
#include "version_check.h"

namespace torch_offload {
namespace {

using Intervals = std::vector<std::pair<int64_t, int64_t>>;
constexpr int64_t kAlign = 16;  // copy ranges start on a multiple of every element size

Intervals merged(Intervals intervals) {
  std::sort(intervals.begin(), intervals.end());
  Intervals out;
  for (const auto& [start, end] : intervals) {
    if (!out.empty() && start <= out.back().second) {
      out.back().second = std::max(out.back().second, end);
    } else {
      out.emplace_back(start, end);
    }
  }
  return out;
}

int64_t total(const Intervals& intervals) {
  int64_t sum = 0;
  for (const auto& [start, end] : intervals) sum += end - start;
  return sum;
}

// The byte intervals of storage that t's elements occupy, merged: one for a dense view (any
// permutation), one per row of a sliced view.
Intervals element_runs(const at::Tensor& t) {
  const int64_t es = t.element_size();
  std::vector<std::pair<int64_t, int64_t>> dims;  // (byte stride, size)
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1 && t.stride(d) != 0) dims.emplace_back(t.stride(d) * es, t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t run = es;
  size_t first = 0;
  while (first < dims.size() && dims[first].first == run) run *= dims[first++].second;
  std::vector<int64_t> starts{t.storage_offset() * es};
  for (size_t i = first; i < dims.size(); ++i) {
    std::vector<int64_t> next;
    next.reserve(starts.size() * dims[i].second);
    for (int64_t s : starts) {
      for (int64_t k = 0; k < dims[i].second; ++k) next.push_back(s + k * dims[i].first);
    }
    starts = std::move(next);
  }
  Intervals runs;
  runs.reserve(starts.size());
  for (int64_t s : starts) runs.emplace_back(s, s + run);
  return merged(std::move(runs));
}

// The dimension order in which t is contiguous (a transpose, an SDPA output), or empty when no
// order is (overlapping or gapped strides).
std::vector<int64_t> dense_permutation(const at::Tensor& t) {
  std::vector<int64_t> order(t.dim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return std::make_pair(-t.stride(a), -t.size(a)) < std::make_pair(-t.stride(b), -t.size(b));
  });
  if (t.permute(order).is_contiguous()) return order;
  return {};
}

// A tensor of `dtype` viewing `storage` with the given geometry, after checking that the view stays
// inside the storage (a wrong range must fail here, never read another tensor's bytes).
at::Tensor view_of(const c10::Storage& storage, c10::DispatchKeySet keys, caffe2::TypeMeta dtype,
                   c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset) {
  int64_t last = offset;
  for (size_t d = 0; d < sizes.size(); ++d) last += (sizes[d] - 1) * strides[d];
  TORCH_CHECK(offset >= 0 && (last + 1) * static_cast<int64_t>(dtype.itemsize()) <=
                                 static_cast<int64_t>(storage.nbytes()),
              "offload_unpack: a saved view reaches past its host copy (an internal error of "
              "torch_offload's save deduplication; please report it)");
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), keys, dtype);
  out.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return out;
}

// An alias of t without autograd history (and with a version counter of its own): what the engine
// holds of t (the source of a copy in flight, a source kept on the device) must not hold t's graph,
// which holds the save handles, which hold the engine's entries: an uncollectable cycle when
// backward never runs. Versions are checked here, on t's own counter.
at::Tensor plain_alias(const at::Tensor& t) {
  at::Tensor alias =
      at::detail::make_tensor<c10::TensorImpl>(c10::Storage(t.storage()), t.key_set(), t.dtype());
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return alias;
}

}  // namespace

SavedRegions::SavedRegions(Manager& manager, BackwardScope scope)
    : manager_(manager), scope_(std::move(scope)) {}

at::Tensor SavedRegions::pack(const at::Tensor& t) {
  TORCH_CHECK(
      t.defined() && t.layout() == c10::kStrided && t.numel() > 0 && !t.is_conj() && !t.is_neg(),
      "offload_pack: takes dense strided tensors with data (not conjugated or negated)");
  const c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
  const at::Tensor root = t.is_view() ? at::Tensor(t._base()) : t;
  const uint32_t version = t.unsafeGetTensorImpl()->version_counter().current_version();
  const int64_t es = t.element_size();
  const int64_t lo = t.storage_offset() * es;
  const bool dense = t.is_contiguous();
  int64_t span = 1;  // elements from the first to the last
  for (int64_t d = 0; d < t.dim(); ++d) span += (t.size(d) - 1) * t.stride(d);
  const int64_t hi = lo + (dense ? t.numel() : span) * es;
  const Layout layout{t.scalar_type(), t.sizes().vec(), t.strides().vec(), t.storage_offset()};

  // The live copies of t's storage, each with its handle's storage held while we use it.
  std::vector<std::shared_ptr<Copy>> live;
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> held;
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    auto it = sources_.find(key);
    if (it != sources_.end()) {
      for (const auto& copy : it->second.copies) {
        if (auto storage = copy->handle_storage.lock()) {
          live.push_back(copy);
          held.push_back(std::move(storage));
        }
      }
    }
  }
  std::shared_ptr<Copy> copy;
  c10::intrusive_ptr<c10::StorageImpl> handle_storage;
  for (size_t i = 0; i < live.size() && !copy; ++i) {
    const Copy& c = *live[i];
    if (c.of_family(root, version) &&
        (c.compact ? c.layout == layout : (c.lo <= lo && hi <= c.hi))) {
      copy = live[i];
      handle_storage = held[i];
    }
  }
  const bool reused = copy != nullptr;
  if (!reused) {
    copy = copy_region(t, root, lo, hi, layout, live, handle_storage);
  }
  const Intervals runs = dense ? Intervals{{lo, hi}} : element_runs(t);
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    Source& source = sources_[key];
    const bool all_dead = std::none_of(source.copies.begin(), source.copies.end(),
                                       [](const auto& c) { return c->alive(); });
    if (all_dead)
      source = Source{
          t.storage().getWeakStorageImpl(), static_cast<int64_t>(t.storage().nbytes()), {}, {}};
    if (!reused) {
      source.copies.push_back(copy);
      copies_by_handle_[handle_storage->data_ptr().get_context()] = copy;
    }
    copy->saves++;
    counters_.saved_tensors++;
    counters_.offloaded_saves++;
    counters_.shared_saves += reused ? 1 : 0;
    counters_.saved_bytes += t.numel() * es;
    counters_.distinct_bytes_saved += cover(source, runs);
    if (++packs_since_sweep_ > 64 + static_cast<int64_t>(copies_by_handle_.size())) {
      sweep_locked();
    }
  }
  if (reused) manager_.saved_again(handle_storage->data_ptr().get_context());
  const c10::Storage storage(handle_storage);
  const c10::DispatchKeySet cpu(c10::DispatchKey::CPU);
  if (copy->compact) {
    return view_of(storage, cpu, t.dtype(), t.sizes(), copy->compact_strides, 0);
  }
  return view_of(storage, cpu, t.dtype(), t.sizes(), t.strides(), (lo - copy->lo) / es);
}

std::shared_ptr<SavedRegions::Copy> SavedRegions::copy_region(
    const at::Tensor& saved, const at::Tensor& root, int64_t lo, int64_t hi, const Layout& layout,
    const std::vector<std::shared_ptr<Copy>>& live,
    c10::intrusive_ptr<c10::StorageImpl>& handle_storage) {
  auto copy = std::make_shared<Copy>();
  copy->root = c10::weak_intrusive_ptr<c10::TensorImpl>(root.getIntrusivePtr());
  copy->version_counter = saved.unsafeGetTensorImpl()->version_counter();
  const at::Tensor t = plain_alias(saved);
  copy->version = copy->version_counter.current_version();
  const int64_t es = t.element_size();
  const int64_t storage_nbytes = static_cast<int64_t>(t.storage().nbytes());
  int64_t distinct = 1;  // elements, broadcast dimensions counted once
  for (int64_t d = 0; d < t.dim(); ++d) distinct *= t.stride(d) != 0 ? t.size(d) : 1;
  at::Tensor handle;
  if (2 * distinct * es < hi - lo) {
    // Sparse: its elements alone, broadcast dimensions narrowed to one element, in the dimension
    // order that makes them contiguous where there is one (so they come back with t's strides).
    at::Tensor narrowed = t;
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (t.stride(d) == 0 && t.size(d) > 1) narrowed = narrowed.narrow(d, 0, 1);
    }
    std::vector<int64_t> order =
        narrowed.is_contiguous() ? std::vector<int64_t>{} : dense_permutation(narrowed);
    if (order.empty()) {
      order.resize(t.dim());
      std::iota(order.begin(), order.end(), 0);
    }
    handle = manager_.save(narrowed.permute(order));  // saved contiguous in that order
    // Contiguous strides in `order`, mapped back to t's dimensions; broadcast ones stay 0.
    copy->compact_strides.assign(t.dim(), 0);
    int64_t stride = 1;
    for (int64_t i = t.dim() - 1; i >= 0; --i) {
      const int64_t d = order[i];
      copy->compact_strides[d] = t.stride(d) == 0 && t.size(d) > 1 ? 0 : stride;
      stride *= narrowed.size(d);
    }
    copy->compact = true;
    copy->layout = layout;
    copy->lo = copy->hi = lo;
  } else {
    for (const auto& c : live) {  // widen to the union with the family's overlapping copies
      if (!c->compact && c->of_family(root, copy->version) && c->lo < hi && lo < c->hi) {
        lo = std::min(lo, c->lo);
        hi = std::max(hi, c->hi);
      }
    }
    if (2 * (hi - lo) >= storage_nbytes) {
      lo = 0;
      hi = storage_nbytes;
    }
    const int64_t t_lo = t.storage_offset() * es;
    if (lo == t_lo && hi == t_lo + t.numel() * es && t.is_contiguous()) {
      handle = manager_.save(t);  // exactly t's bytes: the engine copies t (the usual case)
    } else {
      // Bytes through a 1-D view of t's storage, in t's dtype: the range is clamped to what t's
      // element size can address, and sent as bytes.
      const int64_t addressable = storage_nbytes / es * es;
      lo = lo / kAlign * kAlign;
      hi = std::min((hi + kAlign - 1) / kAlign * kAlign, addressable);
      const at::Tensor flat = t.as_strided({(hi - lo) / es}, {1}, lo / es);
      handle = manager_.save(es > 1 ? flat.view(at::kByte) : flat);
    }
    copy->lo = lo;
    copy->hi = hi;
  }
  handle_storage = handle.storage().getWeakStorageImpl().lock();  // alive: `handle` holds it
  copy->handle_storage = handle.storage().getWeakStorageImpl();
  copy->handle_sizes = handle.sizes().vec();
  copy->handle_dtype = handle.scalar_type();
  return copy;
}

int64_t SavedRegions::cover(Source& source, const Intervals& runs) {
  if (source.covered.empty()) {
    source.covered = runs;
    return total(runs);
  }
  const int64_t before = total(source.covered);
  Intervals all = source.covered;
  all.insert(all.end(), runs.begin(), runs.end());
  source.covered = merged(std::move(all));
  return total(source.covered) - before;
}

at::Tensor SavedRegions::unpack(const at::Tensor& save, c10::Device device) {
  TORCH_CHECK(save.defined() && save.is_cpu() && save.has_storage(),
              "offload_unpack: expected a save handle returned by offload_pack");
  std::shared_ptr<Copy> copy;
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    auto it = copies_by_handle_.find(save.storage().data_ptr().get_context());
    if (it != copies_by_handle_.end()) copy = it->second;
  }
  TORCH_CHECK(copy != nullptr,
              "offload_unpack: the tensor is not a save handle of this manager (pass what "
              "offload_pack returned, unchanged, to the manager that packed it)");
  const at::Tensor restored = restored_copy(copy, save, device);
  if (save.storage_offset() == 0 && restored.dtype() == save.dtype() &&
      restored.sizes() == save.sizes() && restored.strides() == save.strides()) {
    return restored;  // the copy was made from this very layout (the usual case)
  }
  return view_of(restored.storage(), restored.key_set(), save.dtype(), save.sizes(), save.strides(),
                 save.storage_offset());
}

at::Tensor SavedRegions::restored_copy(const std::shared_ptr<Copy>& copy, const at::Tensor& save,
                                       c10::Device device) {
  const int64_t task = scope_.current_task();
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    check_unmodified(*copy);
    if (copy->restored.defined() && task != -1 && task == copy->restored_task &&
        copy->restored.device() == device) {
      at::Tensor restored = copy->restored;
      if (++copy->unpacked >= copy->saves) copy->restored = at::Tensor();  // its last save
      return restored;
    }
  }
  // The handle as the manager made it, on the same storage, restored through the manager (which
  // takes a prefetched copy when one is ready, and prefetches what backward needs next).
  const at::Tensor handle =
      view_of(save.storage(), c10::DispatchKeySet(c10::DispatchKey::CPU),
              c10::scalarTypeToTypeMeta(copy->handle_dtype), copy->handle_sizes,
              c10::contiguous_strides(copy->handle_sizes), 0);
  at::Tensor restored = manager_.restore(handle, device);
  if (task == -1) return restored;  // outside backward: nothing to share it with
  std::lock_guard<std::mutex> lock(*mutex_);
  if (copy->restored_task != task) {
    // The backward's end drops what its unpacks did not use up (a save whose node never ran).
    std::weak_ptr<Copy> weak = copy;
    std::weak_ptr<std::mutex> guard = mutex_;
    scope_.at_end([weak, guard, task] {
      const auto mutex = guard.lock();
      const auto c = weak.lock();
      if (!mutex || !c) return;
      std::lock_guard<std::mutex> lock(*mutex);
      if (c->restored_task == task) {
        c->restored = at::Tensor();
        c->restored_task = -1;
        c->unpacked = 0;
      }
    });
  }
  copy->restored_task = task;
  copy->unpacked = 1;
  copy->restored = copy->unpacked >= copy->saves ? at::Tensor() : restored;
  return restored;
}

void SavedRegions::check_unmodified(const Copy& copy) const {
  check_version(copy.version_counter, copy.version, "torch_offload: a tensor saved for backward");
}

void SavedRegions::on_handle_freed(const void* context) {
  std::lock_guard<std::mutex> lock(*mutex_);
  auto it = copies_by_handle_.find(context);
  if (it == copies_by_handle_.end()) return;
  it->second->restored = at::Tensor();  // a backward that failed midway never ran its end
  copies_by_handle_.erase(it);
}

void SavedRegions::sweep_locked() {
  // (copies_by_handle_ needs no sweep: on_handle_freed takes each copy out as its handle dies)
  for (auto it = sources_.begin(); it != sources_.end();) {
    auto& copies = it->second.copies;
    copies.erase(
        std::remove_if(copies.begin(), copies.end(), [](const auto& c) { return !c->alive(); }),
        copies.end());
    it = copies.empty() ? sources_.erase(it) : std::next(it);
  }
  packs_since_sweep_ = 0;
}

int64_t SavedRegions::live_storages() {
  std::lock_guard<std::mutex> lock(*mutex_);
  sweep_locked();
  return static_cast<int64_t>(sources_.size());
}

int64_t SavedRegions::held_restores() const {
  std::lock_guard<std::mutex> lock(*mutex_);
  int64_t held = 0;
  for (const auto& [key, copy] : copies_by_handle_) held += copy->restored.defined() ? 1 : 0;
  return held;
}

void SavedRegions::add_stats(OffloadStats& stats) const {
  std::lock_guard<std::mutex> lock(*mutex_);
  stats.saved_tensors += counters_.saved_tensors;
  stats.offloaded_saves += counters_.offloaded_saves;
  stats.shared_saves += counters_.shared_saves;
  stats.saved_bytes += counters_.saved_bytes;
  stats.distinct_bytes_saved += counters_.distinct_bytes_saved;
}

void SavedRegions::reset_stats() {
  std::lock_guard<std::mutex> lock(*mutex_);
  counters_ = OffloadStats{};
}

}  // namespace torch_offload
