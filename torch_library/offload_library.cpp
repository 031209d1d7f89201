// The single TORCH_LIBRARY of torch_offload: op schemas and the OffloadManager class.
#include <torch/library.h>

#include "offload_manager.h"

TORCH_LIBRARY(offload, m) {
  // Functional ops returning tensors, so that neither TorchScript nor torch.compile drops them.
  m.def("offload_save(Tensor x, int manager) -> Tensor");
  m.def("offload_restore(Tensor handle, Device device, int manager) -> Tensor");
  // The save hooks' deduplicated saves (csrc/saved_regions.h): offload_pack returns a host "save
  // handle" viewing the copy that holds t's elements; offload_unpack returns t again on `device`.
  m.def("offload_pack(Tensor t, int manager) -> Tensor");
  // The same for the save hooks' plain tensors, after the filter `filter` of the manager decided
  // (csrc/save_filter.h): (save handle or None, the decision's code, csrc/save_decision.h). For a
  // leaf without grad the caller calls again with not_a_weight=True unless it is a weight.
  m.def(
      "offload_pack_filtered(Tensor t, int manager, int filter, bool not_a_weight=False) -> "
      "(Tensor, int)");
  m.def("offload_unpack(Tensor save, Device device, int manager) -> Tensor");
  // Eager save hooks only: begin (or end and issue) a batch of the manager's device-to-host copies
  // for the saves of this thread (Manager::begin_batch; mode "modules", per selected module call).
  m.def("offload_batch(int manager, bool begin) -> ()");
  // What the engine declares once, for the Python package to read rather than repeat: the names
  // of the statistics stats() reports (csrc/offload_stats.h), the defaults of the manager's integer
  // options (csrc/manager_config.h), and the codes of offload_pack_filtered's decisions by name
  // (csrc/save_decision.h).
  m.def("stat_names() -> str[]");
  m.def("manager_defaults() -> Dict(str, int)");
  m.def("save_decisions() -> Dict(str, int)");

  using torch_offload::OffloadManager;
  // The constructor's defaults are ManagerConfig's (csrc/manager_config.h).
  const torch_offload::ManagerConfig defaults;
  m.class_<OffloadManager>("OffloadManager")
      .def(
          torch::init<int64_t, int64_t, int64_t, bool, std::string, bool, bool, int64_t, bool, bool,
                      int64_t>(),
          "",
          {torch::arg("max_in_flight") = defaults.max_in_flight,
           torch::arg("prefetch_depth") = defaults.prefetch_depth,
           torch::arg("host_budget_bytes") = defaults.host_budget_bytes,
           torch::arg("synchronous") = defaults.synchronous,
           torch::arg("disk_dir") = defaults.disk_dir, torch::arg("disk_only") = defaults.disk_only,
           torch::arg("release_sources_on_save") = defaults.release_sources_on_save,
           torch::arg("keep_on_device_bytes") = defaults.keep_on_device_bytes,
           torch::arg("disk_direct_io") = defaults.disk_direct_io,
           torch::arg("disk_direct_io_auto") = defaults.disk_direct_io_auto,
           torch::arg("disk_io_threads") = defaults.disk_io_threads})
      .def("id", &OffloadManager::id)
      .def("stats", &OffloadManager::stats)
      .def("reset_stats", &OffloadManager::reset_stats)
      .def("synchronize", &OffloadManager::synchronize)
      .def("finish_save", &OffloadManager::finish_save)
      .def("prefetch", &OffloadManager::prefetch)
      .def("prefetch_newest", &OffloadManager::prefetch_newest)
      .def("empty_pool", &OffloadManager::empty_pool)
      .def("saved_region_counts", &OffloadManager::saved_region_counts)
      .def("add_save_filter", &OffloadManager::add_save_filter)
      .def("remove_save_filter", &OffloadManager::remove_save_filter)
      .def("save_filter_keep", &OffloadManager::save_filter_keep)
      .def("save_filter_record", &OffloadManager::save_filter_record)
      .def("save_filter_counts", &OffloadManager::save_filter_counts)
      .def("save_filter_report", &OffloadManager::save_filter_report)
      .def("save_filter_reset_record", &OffloadManager::save_filter_reset_record)
      .def("max_in_flight", &OffloadManager::max_in_flight)
      .def("prefetch_depth", &OffloadManager::prefetch_depth)
      .def("set_prefetch_depth", &OffloadManager::set_prefetch_depth)
      .def("host_budget_bytes", &OffloadManager::host_budget_bytes)
      .def("synchronous", &OffloadManager::synchronous)
      .def("disk_dir", &OffloadManager::disk_dir)
      .def("disk_only", &OffloadManager::disk_only)
      .def("disk_direct_io", &OffloadManager::disk_direct_io)
      .def("disk_direct_io_auto", &OffloadManager::disk_direct_io_auto)
      .def("disk_io_threads", &OffloadManager::disk_io_threads)
      .def("release_sources_on_save", &OffloadManager::release_sources_on_save)
      .def("keep_on_device_bytes", &OffloadManager::keep_on_device_bytes)
      .def("set_keep_on_device_bytes", &OffloadManager::set_keep_on_device_bytes)
      .def("_simulate_full_disk", &OffloadManager::simulate_full_disk)
      .def("_simulate_available_ram", &OffloadManager::simulate_available_ram)
      .def_pickle(
          [](const c10::intrusive_ptr<OffloadManager>& self) -> OffloadManager::State {
            return self->state();
          },
          [](OffloadManager::State state) -> c10::intrusive_ptr<OffloadManager> {
            return OffloadManager::from_state(state);
          });
}
