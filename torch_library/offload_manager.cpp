#include "offload_manager.h"

namespace torch_offload {

OffloadManager::OffloadManager(int64_t max_in_flight, int64_t prefetch_depth,
                               int64_t host_budget_bytes, bool synchronous, std::string disk_dir,
                               bool disk_only, bool release_sources_on_save,
                               int64_t keep_on_device_bytes, bool disk_direct_io,
                               bool disk_direct_io_auto, int64_t disk_io_threads) {
  ManagerConfig config;
  config.max_in_flight = max_in_flight;
  config.prefetch_depth = prefetch_depth;
  config.host_budget_bytes = host_budget_bytes;
  config.synchronous = synchronous;
  config.disk_dir = std::move(disk_dir);
  config.disk_only = disk_only;
  config.release_sources_on_save = release_sources_on_save;
  config.keep_on_device_bytes = keep_on_device_bytes;
  config.disk_direct_io = disk_direct_io;
  config.disk_direct_io_auto = disk_direct_io_auto;
  config.disk_io_threads = disk_io_threads;
  manager_ = Manager::create(config);
}

c10::Dict<std::string, double> OffloadManager::stats() const {
  c10::Dict<std::string, double> out;
  for (const auto& [name, value] : manager_->stats().items()) out.insert(name, value);
  return out;
}

c10::Dict<std::string, int64_t> OffloadManager::save_filter_counts(int64_t id) const {
  const SaveFilter::StepCounts counts = manager_->save_filters().get(id)->step_counts();
  c10::Dict<std::string, int64_t> out;
  out.insert("offloaded", counts.offloaded);
  out.insert("under_min_bytes", counts.under_min_bytes);
  out.insert("largest_under_min_bytes", counts.largest_under_min_bytes);
  out.insert("kept_other", counts.kept_other);
  return out;
}

c10::Dict<std::string, int64_t> OffloadManager::save_filter_report(int64_t id) const {
  const SaveFilter::Report report = manager_->save_filters().get(id)->report();
  c10::Dict<std::string, int64_t> out;
  out.insert("expected_bytes", report.expected_bytes);
  out.insert("freed_bytes", report.freed_bytes);
  out.insert("storages", report.storages);
  return out;
}

void OffloadManager::simulate_full_disk(bool full) { manager_->simulate_full_disk(full); }

void OffloadManager::simulate_available_ram(int64_t bytes) {
  manager_->simulate_available_ram(bytes);
}

OffloadManager::State OffloadManager::state() const {
  return {{max_in_flight(), prefetch_depth(), host_budget_bytes(), synchronous() ? 1 : 0,
           disk_only() ? 1 : 0, release_sources_on_save() ? 1 : 0, keep_on_device_bytes(),
           disk_direct_io()        ? 1
           : disk_direct_io_auto() ? 2
                                   : 0,
           disk_io_threads()},
          disk_dir()};
}

c10::intrusive_ptr<OffloadManager> OffloadManager::from_state(const State& state) {
  const std::vector<int64_t>& v = std::get<0>(state);
  // 6 values: saved before keep_on_device_bytes existed; 7: before disk_direct_io; 8: before
  // disk_io_threads. The 8th is disk_direct_io: 0 no, 1 every file, 2 'auto'.
  TORCH_CHECK(v.size() >= 6 && v.size() <= 9, "OffloadManager: bad pickled state");
  const int64_t direct_io = v.size() >= 8 ? v[7] : 0;
  return c10::make_intrusive<OffloadManager>(
      v[0], v[1], v[2], v[3] != 0, std::get<1>(state), v[4] != 0, v[5] != 0,
      v.size() >= 7 ? v[6] : 0, direct_io == 1, direct_io == 2,
      v.size() >= 9 ? v[8] : ManagerConfig{}.disk_io_threads);
}

}  // namespace torch_offload
