// CPU kernels. offload_restore always dispatches here, since its handle is a host tensor; the
// engine routes the copy to the requested device (a CUDA restore is still asynchronous).
#include <torch/library.h>

#include "ops/offload_kernels.h"

TORCH_LIBRARY_IMPL(offload, CPU, m) {
  m.impl("offload_save", &torch_offload::ops::offload_save);
  m.impl("offload_restore", &torch_offload::ops::offload_restore);
}
