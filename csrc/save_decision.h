#pragma once
// What the save hooks' filter decided for a save (SaveFilter::decide, save_filter.h): the codes
// offload_pack_filtered returns, declared once here. Header-only, with no dependency: the C save
// hooks (pyext/) compare the op's result with these codes, and the Python package reads them, by
// name, from torch.ops.offload.save_decisions().
#include <array>
#include <cstdint>
#include <utility>

namespace torch_offload {

enum class SaveDecision : int64_t {
  kOffload = 0,        // packed: the op returns its save handle
  kKeep = 1,           // stays on the device (a weight, a kept storage, under min_bytes)
  kCallerDecides = 2,  // the engine cannot tell (not strided, conjugated, negated, empty)
  // A leaf that does not require grad, or a view of one: perhaps a frozen nn.Parameter, which only
  // the caller can tell; called again with not_a_weight=True it is decided like an op's output.
  kLeafWithoutGrad = 3,
};

// Each decision with the name Python reads it by (torch_offload._library.manager.DECISIONS).
constexpr std::array<std::pair<const char*, SaveDecision>, 4> kSaveDecisionNames{{
    {"offload", SaveDecision::kOffload},
    {"keep", SaveDecision::kKeep},
    {"caller_decides", SaveDecision::kCallerDecides},
    {"leaf_without_grad", SaveDecision::kLeafWithoutGrad},
}};

}  // namespace torch_offload
