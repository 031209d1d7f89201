#include "pyext/offload_ops.h"

namespace torch_offload_pyext {

const c10::TypedOperatorHandle<PackOp>& pack_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("offload::offload_pack_filtered", "")
                             .typed<PackOp>();
  return op;
}

const c10::TypedOperatorHandle<UnpackOp>& unpack_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("offload::offload_unpack", "")
                             .typed<UnpackOp>();
  return op;
}

const c10::TypedOperatorHandle<BatchOp>& batch_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("offload::offload_batch", "").typed<BatchOp>();
  return op;
}

}  // namespace torch_offload_pyext
