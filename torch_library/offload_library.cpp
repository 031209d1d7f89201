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

  using torch_offload::OffloadManager;
  m.class_<OffloadManager>("OffloadManager")
      .def(torch::init<int64_t, int64_t, int64_t, bool, std::string, bool, bool, int64_t, bool,
                       bool>(),
           "",
           {torch::arg("max_in_flight") = 4, torch::arg("prefetch_depth") = 1,
            torch::arg("host_budget_bytes") = 0, torch::arg("synchronous") = false,
            torch::arg("disk_dir") = "", torch::arg("disk_only") = false,
            torch::arg("release_sources_on_save") = false, torch::arg("keep_on_device_bytes") = 0,
            torch::arg("disk_direct_io") = false, torch::arg("disk_direct_io_auto") = false})
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
