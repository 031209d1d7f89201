// A C++ training loop with torch_offload: each block runs under torch_offload::checkpoint, so its
// input waits in host memory (pinned, on a GPU) and the block is recomputed in backward.
//   build/examples/cpp/train_offload [steps]
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>

#include "torch_library/checkpoint.h"

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc1(register_module("fc1", torch::nn::Linear(width, 4 * width))),
        fc2(register_module("fc2", torch::nn::Linear(4 * width, width))),
        drop(register_module("drop", torch::nn::Dropout(0.1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(drop(torch::gelu(fc1(norm(x))))); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc1, fc2;
  torch::nn::Dropout drop;
};
TORCH_MODULE(Block);

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 5;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const int64_t width = 256, tokens = 2048, layers = 6;
  torch::manual_seed(0);
  torch::nn::ModuleList blocks;
  for (int64_t i = 0; i < layers; ++i) blocks->push_back(Block(width));
  blocks->to(device);
  torch::optim::SGD optimizer(blocks->parameters(), torch::optim::SGDOptions(1e-2));
  auto manager = c10::make_intrusive<torch_offload::OffloadManager>(4, 1, 0);
  const torch::Tensor x = torch::randn({tokens, width}, device);
  const torch::Tensor target = torch::randn({tokens, width}, device);

  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    torch::Tensor h = x;
    for (const auto& module : *blocks) {
      auto block = module->as<BlockImpl>();
      h = torch_offload::checkpoint([block](const at::Tensor& t) { return block->forward(t); }, h,
                                    manager);
    }
    torch::Tensor loss = torch::mse_loss(h, target);
    loss.backward();
    optimizer.step();
    std::printf("step %d loss %.6f\n", step, loss.item<double>());
  }
  auto stats = manager->stats();
  std::printf(
      "device %s: offloaded %.0f tensors, %.1f MB to host, %.1f MB back, %.0f prefetch hits\n",
      device.str().c_str(), stats.at("saves"), stats.at("bytes_to_host") / 1e6,
      stats.at("bytes_to_device") / 1e6, stats.at("prefetch_hits"));
  return 0;
}
