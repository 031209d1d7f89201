// Loads a TorchScript file whose forward calls torch.ops.offload.* (with an OffloadManager
// attribute) and runs it on a deterministic input: the model runs from C++ exactly as from Python.
//   build/examples/cpp/run_scripted MODEL.pt ROWS COLS
#include <torch/script.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "torch_library/offload_manager.h"

static int run(const char* path, int64_t rows, int64_t cols) {
  torch::jit::Module module = torch::jit::load(path);
  module.eval();
  // The same input the Python test builds: arange, scaled into [0, 1).
  const torch::Tensor input =
      torch::arange(rows * cols, torch::kFloat32).reshape({rows, cols}) / double(rows * cols);
  const torch::Tensor output = module.forward({input}).toTensor();
  auto manager = module.attr("manager").toCustomClass<torch_offload::OffloadManager>();
  std::printf("sum %.9e\n", output.sum().item<double>());
  std::printf("bytes_to_host %.0f\n", manager->stats().at("bytes_to_host"));
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL.pt ROWS COLS\n", argv[0]);
    return 2;
  }
  try {
    return run(argv[1], std::atoll(argv[2]), std::atoll(argv[3]));
  } catch (const std::exception& error) {  // a missing or invalid file, a failing forward
    std::fprintf(stderr, "%s: %s\n", argv[0], error.what());
    return 1;
  }
}
