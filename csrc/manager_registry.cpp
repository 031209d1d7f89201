#include "manager_registry.h"

#include <c10/util/Exception.h>

#include <mutex>
#include <unordered_map>

namespace torch_offload {
namespace {

struct Registry {
  std::mutex mutex;
  int64_t next_id = 1;
  std::unordered_map<int64_t, std::weak_ptr<Manager>> managers;
};

Registry& registry() {
  static Registry* instance = new Registry();  // leaked: managers may outlive static destruction
  return *instance;
}

}  // namespace

int64_t register_manager(const std::shared_ptr<Manager>& manager) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const int64_t id = r.next_id++;
  r.managers.emplace(id, manager);
  return id;
}

void unregister_manager(int64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.managers.erase(id);
}

std::shared_ptr<Manager> find_manager(int64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.managers.find(id);
  std::shared_ptr<Manager> manager = it == r.managers.end() ? nullptr : it->second.lock();
  TORCH_CHECK(manager != nullptr, "torch_offload: unknown OffloadManager id ", id,
              ": no live manager has it (it was never created in this process, or it was "
              "destroyed together with every tensor it saved). Create one with "
              "torch.classes.offload.OffloadManager() and pass its id().");
  return manager;
}

}  // namespace torch_offload
