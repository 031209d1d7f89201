#pragma once
// Which saved tensors the save hooks offload (offload_activations' pack decision, made here so that
// a plain tensor's save costs one op call and no Python): tensors on a kept storage (the model's
// parameters and buffers), leaves that require grad and views of them (weights) stay on the device,
// as do tensors under min_bytes; the others go to the deduplicated-save table (saved_regions.h).
// What the engine cannot tell is left to the caller: whether a leaf that does not require grad
// (or a view of one) is a frozen nn.Parameter, a Python notion (the caller says it is not with
// `not_a_weight`, and the engine decides the rest); non-strided, conjugated, negated and empty
// tensors.
//
// A filter also counts what it kept and why (the "nothing offloaded" warning, and the kept_saves /
// kept_bytes statistics), and can record the storages it offloaded since a reset: modules mode's
// report of bytes offloaded against bytes the device got back.
#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "offload_stats.h"
#include "save_decision.h"

namespace torch_offload {

class SaveFilter {
 public:
  // kLeafWithoutGrad: a leaf that does not require grad, or a view of one, on no kept storage and
  // not under min_bytes.
  using Decision = SaveDecision;
  // Monotonic (never reset): what the warning compares before and after a step.
  struct StepCounts {
    int64_t offloaded = 0;
    int64_t under_min_bytes = 0;
    int64_t largest_under_min_bytes = 0;
    int64_t kept_other = 0;  // weights, kept storages
  };
  struct Report {
    int64_t expected_bytes = 0;  // the recorded storages' bytes
    int64_t freed_bytes = 0;     // of those, storages no longer alive
    int64_t storages = 0;
  };

  SaveFilter(int64_t min_bytes, bool record);

  // Saves of t's storage stay on the device (held through a weak reference: no data kept alive).
  void keep(const at::Tensor& t);
  // kOffload: the caller packs t (counted as offloaded, recorded). kKeep: counted as a kept save.
  // kCallerDecides, kLeafWithoutGrad: nothing counted. `not_a_weight`: the caller checked that t
  // is no frozen parameter's view, so a leaf without grad is decided like an op's output.
  Decision decide(const at::Tensor& t, bool not_a_weight = false);
  // Records t's storage as offloaded (when recording): for the saves the caller decided itself.
  void record(const at::Tensor& t);

  StepCounts step_counts() const;
  // Saves kept since the last reset: saved_tensors, kept_saves, kept_bytes.
  void add_stats(OffloadStats& stats) const;
  void reset_stats();
  Report report() const;
  void reset_record();

 private:
  using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;
  Decision kept(int64_t nbytes);  // counts a kept save (lock held)
  void record_locked(const at::Tensor& t);

  const int64_t min_bytes_;
  const bool record_;
  mutable std::mutex mutex_;
  // Keyed by StorageImpl address; the weak reference pins that address (it cannot be reused by
  // another storage while we compare against it).
  std::unordered_map<const c10::StorageImpl*, WeakStorage> kept_;
  std::unordered_map<const c10::StorageImpl*, std::pair<WeakStorage, int64_t>> recorded_;
  StepCounts counts_;
  OffloadStats kept_stats_;  // only saved_tensors, kept_saves, kept_bytes
};

// A manager's filters, one per set of save hooks, by id.
class SaveFilters {
 public:
  int64_t add(int64_t min_bytes, bool record);
  // The filter `id` (an error naming it when there is none).
  std::shared_ptr<SaveFilter> get(int64_t id) const;
  void remove(int64_t id);
  void add_stats(OffloadStats& stats) const;
  void reset_stats();

 private:
  mutable std::mutex mutex_;
  int64_t next_id_ = 1;
  std::unordered_map<int64_t, std::shared_ptr<SaveFilter>> filters_;
};

}  // namespace torch_offload
