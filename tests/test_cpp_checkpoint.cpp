// The libtorch checkpoint API: gradients equal plain C++ training, dropout included (the recompute
// replays the forward's RNG state), and the block inputs go through the manager.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "torch_library/checkpoint.h"

namespace {

struct Net {
  explicit Net(int64_t width) {
    torch::manual_seed(7);
    for (int i = 0; i < 3; ++i) {
      blocks.push_back(torch::nn::Sequential(torch::nn::Linear(width, 2 * width), torch::nn::ReLU(),
                                             torch::nn::Dropout(0.2),
                                             torch::nn::Linear(2 * width, width)));
    }
  }
  std::vector<torch::Tensor> grads() const {
    std::vector<torch::Tensor> out;
    for (const auto& b : blocks)
      for (const auto& p : b->parameters()) out.push_back(p.grad().clone());
    return out;
  }
  void zero_grad() {
    for (auto& b : blocks) b->zero_grad();
  }
  std::vector<torch::nn::Sequential> blocks;
};

torch::Tensor run(Net& net, const torch::Tensor& x,
                  const c10::intrusive_ptr<torch_offload::OffloadManager>& manager) {
  torch::Tensor h = x;
  for (auto& block : net.blocks) {
    auto forward = [block](const at::Tensor& t) mutable { return t + block->forward(t); };
    h = manager ? torch_offload::checkpoint(forward, h, manager) : forward(h);
  }
  return h.square().mean();
}

TEST(CppCheckpoint, GradientsEqualPlainTrainingWithDropout) {
  Net net(32);
  const torch::Tensor x = torch::randn({16, 32});
  for (const bool input_requires_grad : {false, true}) {
    const torch::Tensor input = x.clone().requires_grad_(input_requires_grad);
    net.zero_grad();
    torch::manual_seed(123);
    run(net, input, nullptr).backward();
    const auto plain = net.grads();
    const torch::Tensor plain_input_grad =
        input_requires_grad ? input.grad().clone() : torch::Tensor();

    auto manager = c10::make_intrusive<torch_offload::OffloadManager>(4, 1, 0);
    const torch::Tensor input2 = x.clone().requires_grad_(input_requires_grad);
    net.zero_grad();
    torch::manual_seed(123);
    run(net, input2, manager).backward();
    const auto offloaded = net.grads();
    ASSERT_EQ(plain.size(), offloaded.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_TRUE(torch::equal(plain[i], offloaded[i])) << "parameter " << i;
    }
    if (input_requires_grad) {
      EXPECT_TRUE(torch::equal(plain_input_grad, input2.grad()));
    }
    auto stats = manager->stats();
    EXPECT_EQ(stats.at("saves"), 3.0);
    EXPECT_EQ(stats.at("restores"), 3.0);
    EXPECT_EQ(stats.at("bytes_to_host"), 3.0 * 16 * 32 * 4);
  }
}

TEST(CppCheckpoint, NoGradRunsTheFunctionDirectly) {
  auto manager = c10::make_intrusive<torch_offload::OffloadManager>(4, 1, 0);
  torch::NoGradGuard no_grad;
  const torch::Tensor out = torch_offload::checkpoint([](const at::Tensor& t) { return t * 2; },
                                                      torch::ones({4}), manager);
  EXPECT_TRUE(torch::equal(out, torch::full({4}, 2.0)));
  EXPECT_EQ(manager->stats().at("saves"), 0.0);
}

}  // namespace
