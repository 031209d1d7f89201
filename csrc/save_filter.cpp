#include "save_filter.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace torch_offload {

SaveFilter::SaveFilter(int64_t min_bytes, bool record) : min_bytes_(min_bytes), record_(record) {}

void SaveFilter::keep(const at::Tensor& t) {
  TORCH_CHECK(t.defined() && t.has_storage(),
              "torch_offload: a tensor to keep on the device must have a storage");
  std::lock_guard<std::mutex> lock(mutex_);
  const c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
  kept_.emplace(key, t.storage().getWeakStorageImpl());
}

SaveFilter::Decision SaveFilter::kept(int64_t nbytes) {
  kept_stats_.saved_tensors++;
  kept_stats_.kept_saves++;
  kept_stats_.kept_bytes += nbytes;
  return Decision::kKeep;
}

SaveFilter::Decision SaveFilter::decide(const at::Tensor& t, bool not_a_weight) {
  if (!t.defined() || t.layout() != c10::kStrided || t.is_quantized() || t.is_nested() ||
      t.is_conj() || t.is_neg() || t.numel() == 0 || !t.has_storage()) {
    return Decision::kCallerDecides;
  }
  const int64_t nbytes = t.numel() * static_cast<int64_t>(t.element_size());
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  // The view base: autograd saves weight.t(), whose base is the weight.
  const at::TensorBase root = t.is_view() ? t._base() : t;
  const bool op_output = root.grad_fn() != nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  // A kept storage, or a leaf that requires grad or a view of one (a weight).
  if ((!kept_.empty() && kept_.count(storage) != 0) || (!op_output && root.requires_grad())) {
    counts_.kept_other++;
    return kept(nbytes);
  }
  if (nbytes < min_bytes_) {  // (a small leaf stays whatever it is: no need to ask the caller)
    counts_.under_min_bytes++;
    counts_.largest_under_min_bytes = std::max(counts_.largest_under_min_bytes, nbytes);
    return kept(nbytes);
  }
  // Perhaps a frozen nn.Parameter: only the caller can tell.
  if (!op_output && !not_a_weight) return Decision::kLeafWithoutGrad;
  counts_.offloaded++;
  record_locked(t);
  return Decision::kOffload;
}

void SaveFilter::record(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(mutex_);
  record_locked(t);
}

void SaveFilter::record_locked(const at::Tensor& t) {
  if (!record_) return;
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (recorded_.count(storage) == 0) {
    recorded_.emplace(storage, std::make_pair(t.storage().getWeakStorageImpl(),
                                              static_cast<int64_t>(t.storage().nbytes())));
  }
}

SaveFilter::StepCounts SaveFilter::step_counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

void SaveFilter::add_stats(OffloadStats& stats) const {
  std::lock_guard<std::mutex> lock(mutex_);
  stats.saved_tensors += kept_stats_.saved_tensors;
  stats.kept_saves += kept_stats_.kept_saves;
  stats.kept_bytes += kept_stats_.kept_bytes;
}

void SaveFilter::reset_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  kept_stats_ = OffloadStats();
}

SaveFilter::Report SaveFilter::report() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Report report;
  for (const auto& [key, entry] : recorded_) {
    report.expected_bytes += entry.second;
    if (entry.first.expired()) report.freed_bytes += entry.second;
    report.storages++;
  }
  return report;
}

void SaveFilter::reset_record() {
  std::lock_guard<std::mutex> lock(mutex_);
  recorded_.clear();
}

int64_t SaveFilters::add(int64_t min_bytes, bool record) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t id = next_id_++;
  filters_.emplace(id, std::make_shared<SaveFilter>(min_bytes, record));
  return id;
}

std::shared_ptr<SaveFilter> SaveFilters::get(int64_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = filters_.find(id);
  TORCH_CHECK(it != filters_.end(), "torch_offload: no save filter with id ", id,
              " on this manager (removed, or made by another manager)");
  return it->second;
}

void SaveFilters::remove(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  filters_.erase(id);
}

void SaveFilters::add_stats(OffloadStats& stats) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [id, filter] : filters_) filter->add_stats(stats);
}

void SaveFilters::reset_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [id, filter] : filters_) filter->reset_stats();
}

}  // namespace torch_offload
