#pragma once
// Ops carry an integer manager id rather than the OffloadManager object (an op that receives the
// ScriptObject in backward fails under torch.compile). This maps ids to live managers.
#include <cstdint>
#include <memory>

namespace torch_offload {

class Manager;

int64_t register_manager(const std::shared_ptr<Manager>& manager);
void unregister_manager(int64_t id);
// Throws a clear error for an id that names no live manager.
std::shared_ptr<Manager> find_manager(int64_t id);

}  // namespace torch_offload
