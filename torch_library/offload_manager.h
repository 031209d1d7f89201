#pragma once
// OffloadManager: the user-facing handle on one offload engine, registered as
// torch.classes.offload.OffloadManager. Usable from Python, TorchScript (as a module attribute,
// saved and loaded through def_pickle) and C++. Ops take its id(), never the object itself.
#include <torch/custom_class.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "csrc/manager.h"

namespace torch_offload {

class OffloadManager : public torch::CustomClassHolder {
 public:
  // Pickled configuration: {max_in_flight, prefetch_depth, host_budget_bytes, synchronous,
  // disk_only, release_sources_on_save, keep_on_device_bytes, disk_direct_io (0, 1, 2: 'auto'),
  // disk_io_threads} and disk_dir.
  using State = std::tuple<std::vector<int64_t>, std::string>;

  // The defaults are ManagerConfig's (csrc/manager_config.h).
  OffloadManager(int64_t max_in_flight, int64_t prefetch_depth, int64_t host_budget_bytes,
                 bool synchronous = ManagerConfig{}.synchronous,
                 std::string disk_dir = ManagerConfig{}.disk_dir,
                 bool disk_only = ManagerConfig{}.disk_only,
                 bool release_sources_on_save = ManagerConfig{}.release_sources_on_save,
                 int64_t keep_on_device_bytes = ManagerConfig{}.keep_on_device_bytes,
                 bool disk_direct_io = ManagerConfig{}.disk_direct_io,
                 bool disk_direct_io_auto = ManagerConfig{}.disk_direct_io_auto,
                 int64_t disk_io_threads = ManagerConfig{}.disk_io_threads);

  int64_t id() const { return manager_->id(); }
  c10::Dict<std::string, double> stats() const;
  void reset_stats() { manager_->reset_stats(); }
  void synchronize() { manager_->synchronize(); }
  void finish_save(const at::Tensor& handle) { manager_->finish_save(handle); }
  void prefetch(const at::Tensor& handle, c10::Device device) {
    manager_->prefetch(handle, device);
  }
  void prefetch_newest(c10::Device device, int64_t count) {
    manager_->prefetch_newest(device, count);
  }
  void empty_pool() { manager_->empty_pool(); }
  // The deduplicated saves' table (offload_pack), for tests and diagnostics: source storages with
  // a live copy, and copies holding a restored device tensor.
  c10::Dict<std::string, int64_t> saved_region_counts() {
    c10::Dict<std::string, int64_t> counts;
    auto& regions = manager_->saved_regions();
    counts.insert("storages", regions.live_storages());
    counts.insert("held_restores", regions.held_restores());
    return counts;
  }
  // The save hooks' filters (csrc/save_filter.h), one per set of hooks: which saves
  // offload_pack_filtered offloads, what was kept and why, and the storages offloaded since a
  // reset.
  int64_t add_save_filter(int64_t min_bytes, bool record) {
    return manager_->save_filters().add(min_bytes, record);
  }
  void remove_save_filter(int64_t id) { manager_->save_filters().remove(id); }
  void save_filter_keep(int64_t id, const at::Tensor& t) {
    manager_->save_filters().get(id)->keep(t);
  }
  // Records t's storage as offloaded by the hooks' Python path (when the filter records).
  void save_filter_record(int64_t id, const at::Tensor& t) {
    manager_->save_filters().get(id)->record(t);
  }
  // offloaded, under_min_bytes, largest_under_min_bytes, kept_other (never reset).
  c10::Dict<std::string, int64_t> save_filter_counts(int64_t id) const;
  // expected_bytes, freed_bytes, storages: the storages offloaded since the last reset_record.
  c10::Dict<std::string, int64_t> save_filter_report(int64_t id) const;
  void save_filter_reset_record(int64_t id) { manager_->save_filters().get(id)->reset_record(); }
  int64_t max_in_flight() const { return manager_->config().max_in_flight; }
  int64_t prefetch_depth() const { return manager_->prefetch_depth(); }
  void set_prefetch_depth(int64_t depth) { manager_->set_prefetch_depth(depth); }
  int64_t host_budget_bytes() const { return manager_->config().host_budget_bytes; }
  bool synchronous() const { return manager_->config().synchronous; }
  std::string disk_dir() const { return manager_->config().disk_dir; }
  bool disk_only() const { return manager_->config().disk_only; }
  // Asked for; stats()["disk_direct_io"] says whether the filesystem does it.
  bool disk_direct_io() const { return manager_->config().disk_direct_io; }
  // disk_direct_io='auto': each file decides (ManagerConfig::disk_direct_io_auto).
  bool disk_direct_io_auto() const { return manager_->config().disk_direct_io_auto; }
  int64_t disk_io_threads() const { return manager_->config().disk_io_threads; }
  bool release_sources_on_save() const { return manager_->config().release_sources_on_save; }
  int64_t keep_on_device_bytes() const { return manager_->keep_on_device_bytes(); }
  void set_keep_on_device_bytes(int64_t bytes) { manager_->set_keep_on_device_bytes(bytes); }
  // Test hook: make the disk tier's next writes fail with ENOSPC.
  void simulate_full_disk(bool full);
  // Test hook: the host's available RAM as disk_direct_io_auto sees it (-1: the real one).
  void simulate_available_ram(int64_t bytes);

  // Configuration only: a loaded manager starts with an empty pool and fresh statistics.
  State state() const;
  static c10::intrusive_ptr<OffloadManager> from_state(const State& state);

 private:
  std::shared_ptr<Manager> manager_;
};

}  // namespace torch_offload
