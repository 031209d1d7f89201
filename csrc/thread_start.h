#pragma once
// Starts the engine's background threads (the manager's releaser, the disk tier's IO threads).
// A thread that cannot start is a clear error rather than the system's bare "Resource temporarily
// unavailable": it names the thread, gives the system's reason and what to do about it (a process
// or container at its limit of threads or memory).
#include <functional>
#include <string>
#include <thread>

#include "fault_injection.h"

namespace torch_offload {

// Runs `body` on a new thread; throws c10::Error naming `what` if the thread cannot start. `site`
// lets tests make the start fail as it would for real (fault_injection.h).
std::thread start_thread(const std::string& what, FaultSite site, std::function<void()> body);

}  // namespace torch_offload
