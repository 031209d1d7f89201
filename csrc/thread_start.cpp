#include "thread_start.h"

#include <c10/util/Exception.h>

#include <cerrno>
#include <fstream>
#include <system_error>
#include <utility>

namespace torch_offload {
namespace {

// The threads of this process, from /proc ("" where it cannot be read).
std::string threads_of_this_process() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) {
      const size_t start = line.find_first_not_of(" \t", 8);
      return start == std::string::npos ? "" : line.substr(start);
    }
  }
  return "";
}

std::string thread_start_error(const std::string& what, const std::string& reason) {
  const std::string threads = threads_of_this_process();
  return "torch_offload: cannot start " + what + ": " + reason +
         ". The process or its container has most likely reached its limit of threads or of " +
         "memory" + (threads.empty() ? "" : " (this process runs " + threads + " threads)") +
         ": raise the limit (ulimit -u, the container's pids limit, ulimit -v) or start fewer " +
         "threads (fewer OffloadManagers alive at once, a smaller OMP_NUM_THREADS)";
}

}  // namespace

std::thread start_thread(const std::string& what, FaultSite site, std::function<void()> body) {
  try {
    if (fault_injected(site)) {
      throw std::system_error(EAGAIN, std::generic_category(), "injected by a test");
    }
    return std::thread(std::move(body));
  } catch (const std::system_error& e) {
    TORCH_CHECK(false, thread_start_error(what, e.what()));
  }
}

}  // namespace torch_offload
