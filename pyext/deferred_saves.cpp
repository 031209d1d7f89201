#include "pyext/deferred_saves.h"

#include <Python.h>
#include <c10/util/Exception.h>
#include <torch/csrc/utils/pybind.h>

#include <tuple>
#include <utility>

#include "pyext/offload_ops.h"

namespace torch_offload_pyext {

Holdable holdable(const at::Tensor& t, int64_t min_bytes) {
  if (!t.defined() || t.layout() != c10::kStrided || t.is_quantized() || t.is_nested() ||
      t.is_conj() || t.is_neg() || t.numel() == 0 || !t.has_storage()) {
    return Holdable::kNo;
  }
  if (t.numel() * static_cast<int64_t>(t.element_size()) < min_bytes) return Holdable::kNo;
  const at::TensorBase& root = t.is_view() ? t._base() : static_cast<const at::TensorBase&>(t);
  if (root.grad_fn() != nullptr) return Holdable::kOpOutput;
  return root.requires_grad() ? Holdable::kNo : Holdable::kLeafWithoutGrad;
}

DeferredSaves::~DeferredSaves() {
  for (SavedView* view : views_) Py_DECREF(view);
}

void DeferredSaves::begin() {
  if (depth_ == 0) {
    owner_ = std::this_thread::get_id();
    depth_ = 1;
  } else if (owner_ == std::this_thread::get_id()) {
    depth_++;
  }
  // (another thread's batch is open: this thread's saves go to the engine at once)
}

bool DeferredSaves::end() {
  if (depth_ == 0 || owner_ != std::this_thread::get_id()) return false;
  return --depth_ == 0;
}

void DeferredSaves::add(SavedView* view) {
  Py_INCREF(view);
  views_.push_back(view);
}

std::vector<SavedView*> DeferredSaves::take() { return std::exchange(views_, {}); }

std::exception_ptr offload_held(std::vector<SavedView*> views, int64_t manager, int64_t filter) {
  // The engine's answers, gathered without the GIL; applied to the views with it (dropping a held
  // tensor may free its Python object).
  std::vector<std::tuple<at::Tensor, int64_t>> answers(views.size());  // (undefined: not asked)
  std::exception_ptr error;
  {
    pybind11::gil_scoped_release no_gil;
    for (size_t i = 0; i < views.size() && !error; ++i) {
      SavedView& view = *views[i];
      if (Py_REFCNT(&view) == 1) continue;  // autograd no longer holds it: nothing to offload
      if (view.held._version() != view.held_version) continue;  // stale: stays held, and raises
      try {
        answers[i] = pack_op().call(view.held, manager, filter, view.not_a_weight);
      } catch (...) {
        error = std::current_exception();
      }
    }
  }
  for (size_t i = 0; i < views.size(); ++i) {
    SavedView& view = *views[i];
    view.pending = false;
    // Changed in place since its save (even while the engine read it): it stays held, so
    // backward raises (held_tensor: versions only grow) and never gets the copy.
    auto& save = std::get<0>(answers[i]);
    if (save.defined() && view.held._version() == view.held_version) {
      view.save = std::move(save);
      view.held = at::Tensor();
    }
    Py_DECREF(&view);
  }
  return error;
}

const at::Tensor& held_tensor(const SavedView& view) {
  TORCH_CHECK(view.held._version() == view.held_version,
              "torch_offload: a tensor saved for backward was modified in place after it was "
              "saved (its version went from ",
              view.held_version, " to ", view.held._version(),
              "). Save it after the in-place operation, or clone it before modifying it.");
  return view.held;
}

}  // namespace torch_offload_pyext
