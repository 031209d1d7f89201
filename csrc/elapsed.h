#pragma once
// Milliseconds of the steady clock since `start`: the engine's waits and IO times (its statistics).
#include <chrono>

namespace torch_offload {

inline double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace torch_offload
