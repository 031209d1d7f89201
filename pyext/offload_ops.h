// The ops the C hooks call, through the dispatcher as Python does
// (torch_library/offload_library.cpp has their schemas). Looked up once; each throws where the
// library is not loaded.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <tuple>

#include "csrc/save_decision.h"

namespace torch_offload_pyext {

// offload_pack_filtered's decisions, as the op returns them (declared in csrc/save_decision.h, a
// header of constants only: nothing of the engine is called or linked from here).
constexpr int64_t kKeep = static_cast<int64_t>(torch_offload::SaveDecision::kKeep);
constexpr int64_t kLeafWithoutGrad =
    static_cast<int64_t>(torch_offload::SaveDecision::kLeafWithoutGrad);

using PackOp = std::tuple<at::Tensor, int64_t>(const at::Tensor&, int64_t, int64_t, bool);
using UnpackOp = at::Tensor(const at::Tensor&, c10::Device, int64_t);
using BatchOp = void(int64_t, bool);

const c10::TypedOperatorHandle<PackOp>& pack_op();
const c10::TypedOperatorHandle<UnpackOp>& unpack_op();
const c10::TypedOperatorHandle<BatchOp>& batch_op();

}  // namespace torch_offload_pyext
