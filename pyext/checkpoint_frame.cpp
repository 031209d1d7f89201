// torch_offload._save_hooks.CheckpointFrame: the saved-tensor hooks of one non-reentrant checkpoint
// call (torch_offload/nonreentrant.py), in C.
//
// torch's non-reentrant checkpoint runs a Python pack hook for every tensor the checkpointed
// function saves (a holder object, a weak reference, the metadata dict of the determinism check), a
// Python unpack hook for every one backward reads, and a Python pack hook again for every tensor
// the recompute saves: three Python calls per saved tensor, about a thousand per step of a 24-layer
// model, on the host thread that launches the step. Here each is a C call: the forward's save is a
// counter (the index autograd keeps in place of the tensor) and the tensor's metadata, the
// recompute's save a slot in the vector of the backward that asked for it.
//
// The semantics are torch's (torch/utils/checkpoint.py):
// - the function is recomputed once per backward (graph task, or GraphExecGroup), on the first
//   unpack, and each recomputed tensor is handed out once, then dropped (a second unpack is an
//   error; under a GraphExecGroup, which all its backwards share, it names their overlap);
// - an unpack outside any backward recomputes for itself;
// - early stop: the recompute stops (StopRecompute) once it has saved what the forward saved;
// - the determinism check compares the count and each tensor's shape, dtype and device, and raises
//   torch.utils.checkpoint.CheckpointError with torch's wording.
#include "pyext/checkpoint_frame.h"

#include <ATen/core/Tensor.h>
#include <c10/core/AutogradState.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_variable.h>

#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pyext/checkpoint_check.h"
#include "pyext/module_types.h"

namespace {

// One backward's recomputed tensors, by the index the forward's pack hook returned.
struct Recomputed {
  PyObject* group = nullptr;       // owned: the GraphExecGroup this backward runs under, or nullptr
  std::vector<at::Tensor> values;  // undefined once handed out
  bool done = false;
};

// Which backward: (GraphExecGroup, 0) under a group, (nullptr, graph task id) in a backward,
// (nullptr, a fresh negative number) for an unpack outside any backward.
using BackwardKey = std::pair<PyObject*, int64_t>;

struct FrameState {
  std::vector<torch_offload_pyext::SavedMetadata>
      metadata;  // the forward's saves, for the determinism check
  std::map<BackwardKey, Recomputed> by_backward;
  // Per thread, the backwards whose recompute runs there now, innermost last: record() files a save
  // under the backward recomputing in its own thread (two backwards may recompute one frame at
  // once).
  std::unordered_map<unsigned long, std::vector<BackwardKey>> recording;
  int64_t next_temporary = -2;
  bool capturing = false;            // begin_capture: the forward's saves are also kept here
  std::vector<at::Tensor> captured;  // ... until end_capture hands them out
};

struct CheckpointFrame {
  PyObject ob_base;     // PyObject_HEAD
  PyObject* recompute;  // recompute(frame): runs the function again with frame.record as pack hook
  size_t saved;         // tensors saved in forward
  bool check_metadata;
  bool early_stop;
  bool forward_done;
  bool ignore_mismatch;  // early_stop=False and a backward inside the forward (as in torch)
  FrameState* state;
};

PyObject* stop_recompute_type = nullptr;  // made in add_checkpoint_frame

PyObject* frame_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"recompute", "check_metadata", "early_stop", nullptr};
  PyObject* recompute = nullptr;
  int check_metadata = 1;
  int early_stop = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Opp:CheckpointFrame", const_cast<char**>(names),
                                   &recompute, &check_metadata, &early_stop)) {
    return nullptr;
  }
  auto* frame = reinterpret_cast<CheckpointFrame*>(type->tp_alloc(type, 0));
  if (frame == nullptr) return nullptr;
  frame->recompute = Py_NewRef(recompute);
  frame->saved = 0;
  frame->check_metadata = check_metadata != 0;
  frame->early_stop = early_stop != 0;
  frame->forward_done = false;
  frame->ignore_mismatch = false;
  frame->state = new FrameState();
  return reinterpret_cast<PyObject*>(frame);
}

int frame_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* frame = reinterpret_cast<CheckpointFrame*>(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(frame->recompute);
  if (frame->state != nullptr) {
    for (const auto& [key, recomputed] : frame->state->by_backward) Py_VISIT(recomputed.group);
  }
  return 0;
}

void drop_entries(FrameState* state) {
  for (auto& [key, recomputed] : state->by_backward) Py_CLEAR(recomputed.group);
  state->by_backward.clear();
}

int frame_clear(PyObject* self) {
  auto* frame = reinterpret_cast<CheckpointFrame*>(self);
  Py_CLEAR(frame->recompute);
  if (frame->state != nullptr) drop_entries(frame->state);
  return 0;
}

void frame_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  frame_clear(self);
  auto* frame = reinterpret_cast<CheckpointFrame*>(self);
  delete frame->state;
  frame->state = nullptr;
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);
}

const at::Tensor* tensor_argument(PyObject* t, const char* hook) {
  if (!THPVariable_Check(t)) {
    PyErr_Format(PyExc_TypeError, "CheckpointFrame.%s: expected a tensor, got %s", hook,
                 Py_TYPE(t)->tp_name);
    return nullptr;
  }
  return &THPVariable_Unpack(t);
}

// The forward's pack hook: the save's index stands in for the tensor.
PyObject* frame_pack(PyObject* self, PyObject* t) {
  auto* frame = reinterpret_cast<CheckpointFrame*>(self);
  const at::Tensor* tensor = tensor_argument(t, "pack");
  if (tensor == nullptr) return nullptr;
  if (frame->check_metadata) {
    frame->state->metadata.push_back(torch_offload_pyext::SavedMetadata::of(*tensor));
  }
  if (frame->state->capturing) frame->state->captured.push_back(*tensor);
  return PyLong_FromSize_t(frame->saved++);
}

// The backward asking for a saved tensor now (see BackwardKey); false with the error set.
bool current_backward(FrameState* state, BackwardKey& key) {
  if (c10::AutogradState::get_tls_state().get_graph_exec_group().has_value()) {
    PyObject* torch_c = PyImport_ImportModule("torch._C");
    if (torch_c == nullptr) return false;
    PyObject* group = PyObject_CallMethod(torch_c, "_get_graph_exec_group", nullptr);
    Py_DECREF(torch_c);
    if (group == nullptr) return false;
    key = {group, 0};  // a new reference: the caller keeps it in the entry or drops it
    return true;
  }
  const int64_t task = torch::autograd::get_current_graph_task_id();
  key = {nullptr, task >= 0 ? task : state->next_temporary--};
  return true;
}

bool is_temporary(const BackwardKey& key) { return key.first == nullptr && key.second < 0; }

void erase(FrameState* state, std::map<BackwardKey, Recomputed>::iterator entry) {
  Py_CLEAR(entry->second.group);
  state->by_backward.erase(entry);
}

// The unpack hook: recomputes the function once for this backward, then hands out the
// tensor saved at `index`.
PyObject* frame_unpack(PyObject* self, PyObject* index_object) {
  auto* frame = reinterpret_cast<CheckpointFrame*>(self);
  const size_t index = PyLong_AsSize_t(index_object);
  if (index == static_cast<size_t>(-1) && PyErr_Occurred()) return nullptr;
  FrameState* state = frame->state;
  BackwardKey key;
  if (!current_backward(state, key)) return nullptr;
  auto entry = state->by_backward.find(key);
  if (entry == state->by_backward.end()) {
    entry = state->by_backward.emplace(key, Recomputed{}).first;
    entry->second.group = key.first;  // takes over the reference
  } else {
    Py_XDECREF(key.first);
  }
  if (!entry->second.done) {
    if (frame->recompute == nullptr) {
      PyErr_SetString(PyExc_RuntimeError, "torch_offload.checkpoint: this checkpoint was cleared");
      return nullptr;
    }
    std::vector<BackwardKey>& mine = state->recording[PyThread_get_thread_ident()];
    mine.push_back(key);
    PyObject* result = PyObject_CallOneArg(frame->recompute, self);
    // (re-read: the recompute may have added other threads' stacks)
    state->recording[PyThread_get_thread_ident()].pop_back();
    entry = state->by_backward.find(key);  // the recompute may have run other unpacks
    if (result == nullptr) {
      if (entry != state->by_backward.end()) erase(state, entry);
      return nullptr;
    }
    Py_DECREF(result);
    entry->second.done = true;
    if (!frame->ignore_mismatch &&
        !torch_offload_pyext::recompute_matches(frame->state->metadata, frame->saved,
                                                frame->check_metadata, entry->second.values)) {
      erase(state, entry);
      return nullptr;
    }
  }
  std::vector<at::Tensor>& values = entry->second.values;
  if (index >= values.size() || !values[index].defined()) {
    // Under a GraphExecGroup every backward shares one recompute, so two backwards that need the
    // same saved tensor are the likely cause: torch's message says so there, and so does ours.
    const char* overlap =
        entry->second.group != nullptr
            ? "Performing two backward calls that overlap (i.e. require the same saved activation "
              "in order to compute gradients) is not allowed while under the "
              "torch.utils.checkpoint.GraphExecGroup context. "
            : "";
    return torch_offload_pyext::raise_checkpoint_error(
        std::string("torch_offload.checkpoint: Unpack is being triggered for a tensor that was "
                    "already unpacked once. ") +
        overlap +
        "If you are calling ctx.saved_tensors in backward, make sure to do so only once. "
        "Otherwise please open an issue with details on your use case.");
  }
  at::Tensor value = std::move(values[index]);
  values[index] = at::Tensor();
  // An entry stays until the frame goes (a second unpack of one tensor in one backward is an
  // error, as in torch), except an unpack's outside any backward, which no later unpack shares.
  if (is_temporary(key)) erase(state, entry);
  return THPVariable_Wrap(std::move(value));
}

// The recompute's pack hook: keeps the tensor for the backward being recomputed; raises
// StopRecompute after the last one the forward saved (early stop).
PyObject* frame_record(PyObject* self, PyObject* t) {
  auto* frame = reinterpret_cast<CheckpointFrame*>(self);
  const at::Tensor* tensor = tensor_argument(t, "record");
  if (tensor == nullptr) return nullptr;
  FrameState* state = frame->state;
  const auto mine = state->recording.find(PyThread_get_thread_ident());
  auto entry = mine == state->recording.end() || mine->second.empty()
                   ? state->by_backward.end()
                   : state->by_backward.find(mine->second.back());
  if (entry == state->by_backward.end()) {
    PyErr_SetString(PyExc_RuntimeError,
                    "torch_offload.checkpoint: a recompute saved a tensor with no backward waiting "
                    "for it (CheckpointFrame.record outside recompute)");
    return nullptr;
  }
  std::vector<at::Tensor>& values = entry->second.values;
  if (values.size() >= frame->saved) {
    if (!frame->forward_done) {  // a backward inside the forward, early_stop=False (as in torch)
      frame->ignore_mismatch = true;
      return Py_NewRef(t);
    }
    return torch_offload_pyext::raise_checkpoint_error(
        std::string("torch_offload.checkpoint: trying to save more tensors during recomputation "
                    "than during the original forward pass.\n") +
        torch_offload_pyext::kCheckpointDebugTip);
  }
  values.push_back(tensor->requires_grad() ? tensor->detach() : *tensor);
  if (frame->early_stop && values.size() == frame->saved) {
    PyErr_SetNone(stop_recompute_type);
    return nullptr;
  }
  return THPVariable_Wrap(values.back());
}

// begin_capture / end_capture: the tensors the forward saves in between, in save order, for a
// caller that stands in for what saved them in the recompute (attention_offload.py: the fused
// attention call, whose outputs it offloads and hands back through record()).
PyObject* frame_begin_capture(PyObject* self, PyObject*) {
  FrameState* state = reinterpret_cast<CheckpointFrame*>(self)->state;
  if (state->capturing) {
    PyErr_SetString(PyExc_RuntimeError, "CheckpointFrame.begin_capture: already capturing");
    return nullptr;
  }
  state->capturing = true;
  Py_RETURN_NONE;
}

PyObject* frame_end_capture(PyObject* self, PyObject*) {
  FrameState* state = reinterpret_cast<CheckpointFrame*>(self)->state;
  state->capturing = false;
  std::vector<at::Tensor> captured = std::move(state->captured);
  state->captured.clear();
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(captured.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < captured.size(); ++i) {
    PyObject* tensor = THPVariable_Wrap(std::move(captured[i]));
    if (tensor == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), tensor);
  }
  return list;
}

PyObject* frame_finish_forward(PyObject* self, PyObject*) {
  reinterpret_cast<CheckpointFrame*>(self)->forward_done = true;
  Py_RETURN_NONE;
}

PyMethodDef frame_methods[] = {
    {"pack", frame_pack, METH_O, "the forward's pack hook: the save's index"},
    {"unpack", frame_unpack, METH_O, "the unpack hook: recomputes once per backward"},
    {"record", frame_record, METH_O, "the recompute's pack hook"},
    {"finish_forward", frame_finish_forward, METH_NOARGS, "the checkpointed forward returned"},
    {"begin_capture", frame_begin_capture, METH_NOARGS, "keep the forward's saves from now on"},
    {"end_capture", frame_end_capture, METH_NOARGS, "the saves kept since begin_capture"},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot frame_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(frame_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(frame_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(frame_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(frame_clear)},
    {Py_tp_methods, frame_methods},
    {Py_tp_doc, const_cast<char*>("the saved-tensor hooks of one non-reentrant checkpoint call "
                                  "(torch_offload/nonreentrant.py)")},
    {0, nullptr}};

PyType_Spec frame_spec = {"torch_offload._save_hooks.CheckpointFrame", sizeof(CheckpointFrame), 0,
                          Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, frame_slots};

}  // namespace

namespace torch_offload_pyext {

bool add_checkpoint_frame(PyObject* module) {
  stop_recompute_type =
      PyErr_NewException("torch_offload._save_hooks.StopRecompute", nullptr, nullptr);
  if (stop_recompute_type == nullptr ||
      PyModule_AddObject(module, "StopRecompute", Py_NewRef(stop_recompute_type)) < 0) {
    return false;
  }
  return add_type(module, &frame_spec, "CheckpointFrame") != nullptr;
}

}  // namespace torch_offload_pyext
