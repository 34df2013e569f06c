// The libtorch side of kiln/model_support.h: compiled once per torch release and compiler (cached),
// linked into every package's model.so.
#include "kiln/model_support.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randint.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <c10/core/UndefinedTensorImpl.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

namespace kiln_rt {
namespace {

using Stack_ = std::vector<c10::IValue>;
std::vector<c10::OperatorHandle> OPS;

at::Tensor& T(const Tensor& t) {
  static at::Tensor undefined;
  return t.impl() ? *static_cast<at::Tensor*>(t.impl()) : undefined;
}
Tensor make(at::Tensor t) { return Tensor(new at::Tensor(std::move(t))); }
c10::Device device(Device d) {
  return d.type == kDeviceCPU ? c10::Device(c10::kCPU) : c10::Device(c10::DeviceType(d.type), c10::DeviceIndex(d.index));
}
at::TensorOptions opts(Device d, int dtype) { return at::TensorOptions().dtype(at::ScalarType(dtype)).device(device(d)); }
bool misaligned(Device d, const void* p) { return d.type != kDeviceCPU && (reinterpret_cast<uintptr_t>(p) & 15) != 0; }
at::IntArrayRef ref(Ints v) { return at::IntArrayRef(v.begin(), v.size()); }
Stack_& S(void* p) { return *static_cast<Stack_*>(p); }
// caller memory on ``d``, named as on ``d``: from_blob without a target device asks the driver where a CUDA
// pointer lives (cudaPointerGetAttributes) for every input of every call
at::Tensor blob(Device d, void* data, Ints size, Ints stride, int dtype) {
  return at::for_blob(data, ref(size)).strides(ref(stride)).options(opts(d, dtype)).target_device(device(d))
      .make_tensor();
}

}  // namespace

Tensor::Tensor(const Tensor& o) : p_(o.p_ ? new at::Tensor(T(o)) : nullptr) {}
Tensor& Tensor::operator=(const Tensor& o) {
  if (this != &o) { reset(); p_ = o.p_ ? new at::Tensor(T(o)) : nullptr; }
  return *this;
}
Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) { reset(); p_ = o.p_; o.p_ = nullptr; }
  return *this;
}
void Tensor::reset() {
  delete static_cast<at::Tensor*>(p_);
  p_ = nullptr;
}
void* Tensor::data() const { return T(*this).data_ptr(); }

Tensor wrap(Device dev, void* data, Ints size, Ints stride, int dtype) {
  at::Tensor t = blob(dev, data, size, stride, dtype);
  if (misaligned(dev, data)) {  // triton's kernels were compiled for 16-byte aligned pointers
    at::Tensor copy = at::empty_strided(ref(size), ref(stride), t.options());
    copy.copy_(t);
    return make(copy);
  }
  return make(t);
}
void* aligned_data(Device dev, void* data, Ints size, Ints stride, int dtype, Tensor& hold) {
  if (!misaligned(dev, data)) return data;
  hold = wrap(dev, data, size, stride, dtype);  // an aligned copy
  return hold.data();
}
Tensor empty_strided(Device dev, Ints size, Ints stride, int dtype) {
  return make(at::empty_strided(ref(size), ref(stride), opts(dev, dtype)));
}
Tensor as_strided(const Tensor& t, Ints size, Ints stride, int64_t offset) {
  const at::Tensor& x = T(t);
  return make(x.as_strided(ref(size), ref(stride), x.storage_offset() + offset));
}
Tensor reshaped_storage(const Tensor& t, Ints size, Ints stride) { return make(T(t).as_strided(ref(size), ref(stride))); }

Tensor restride(Device dev, const Tensor& t, Ints size, Ints stride, int dtype) {
  const at::Tensor& x = T(t);
  if (!x.defined()) return empty_strided(dev, size, stride, dtype);
  if (x.numel() <= 1) return t;
  bool same = true;
  for (size_t d = 0; d < size.size(); ++d) same = same && (ref(size)[d] == 1 || x.stride(d) == ref(stride)[d]);
  if (same) return t;
  at::Tensor out = at::empty_strided(ref(size), ref(stride), x.options());
  out.copy_(x);
  return make(out);
}

Tensor copy_as(Device dev, const Tensor& src, Ints size, Ints stride, int64_t offset, int dtype) {
  if (offset == 0) {
    at::Tensor out = at::empty_strided(ref(size), ref(stride), opts(dev, dtype));
    out.copy_(T(src));
    return make(out);
  }
  int64_t extent = 1;  // elements from the view's first to its last, plus one
  for (size_t d = 0; d < size.size(); ++d) {
    if (ref(size)[d] == 0) extent = 0;
    if (extent) extent += (ref(size)[d] - 1) * ref(stride)[d];
  }
  at::Tensor out = at::empty({offset + extent}, opts(dev, dtype)).as_strided(ref(size), ref(stride), offset);
  out.copy_(T(src));
  return make(out);
}
Tensor random_seed(Device dev) { return make(at::randint(0, int64_t(1) << 62, {1}, opts(dev, kI64))); }

Tensor mm(const Tensor& a, const Tensor& b) { return make(at::mm(T(a), T(b))); }
Tensor addmm(const Tensor& c, const Tensor& a, const Tensor& b) { return make(at::addmm(T(c), T(a), T(b))); }
Tensor bmm(const Tensor& a, const Tensor& b) { return make(at::bmm(T(a), T(b))); }
Tensor baddbmm(const Tensor& c, const Tensor& a, const Tensor& b) { return make(at::baddbmm(T(c), T(a), T(b))); }
Tensor convolution(const Tensor& x, const Tensor& w, const Tensor& bias, Ints stride, Ints padding, Ints dilation,
                   bool transposed, Ints output_padding, int64_t groups) {
  std::optional<at::Tensor> b = bias.impl() ? std::optional<at::Tensor>(T(bias)) : std::nullopt;
  return make(at::convolution(T(x), T(w), b, ref(stride), ref(padding), ref(dilation), transposed, ref(output_padding),
                              groups));
}

Stack::Stack() : p_(new Stack_()) {}
Stack::~Stack() { delete &S(p_); }
Stack& Stack::none() { S(p_).emplace_back(); return *this; }
Stack& Stack::tensor(const Tensor& t) { S(p_).emplace_back(T(t)); return *this; }
Stack& Stack::i(int64_t v) { S(p_).emplace_back(v); return *this; }
Stack& Stack::d(double v) { S(p_).emplace_back(v); return *this; }
Stack& Stack::b(bool v) { S(p_).emplace_back(v); return *this; }
Stack& Stack::ints(Ints v) { S(p_).emplace_back(c10::List<int64_t>(std::vector<int64_t>(v))); return *this; }
Stack& Stack::doubles(std::initializer_list<double> v) {
  S(p_).emplace_back(c10::List<double>(std::vector<double>(v)));
  return *this;
}
Stack& Stack::bools(std::initializer_list<bool> v) {
  c10::List<bool> l;
  for (bool x : v) l.push_back(x);
  S(p_).emplace_back(l);
  return *this;
}
Stack& Stack::tensors(std::initializer_list<Tensor> v) {
  c10::List<at::Tensor> l;
  for (const auto& t : v) l.push_back(T(t));
  S(p_).emplace_back(l);
  return *this;
}
Stack& Stack::optional_tensors(std::initializer_list<Tensor> v) {
  c10::List<std::optional<at::Tensor>> l;
  for (const auto& t : v) l.push_back(t.impl() ? std::optional<at::Tensor>(T(t)) : std::nullopt);
  S(p_).emplace_back(l);
  return *this;
}
Stack& Stack::scalar_type(int v) { S(p_).emplace_back(at::ScalarType(v)); return *this; }
Stack& Stack::layout(int v) { S(p_).emplace_back(c10::Layout(v)); return *this; }
Stack& Stack::memory_format(int v) { S(p_).emplace_back(c10::MemoryFormat(v)); return *this; }
Stack& Stack::device(const char* v) { S(p_).emplace_back(c10::Device(std::string(v))); return *this; }
Stack& Stack::str(const char* v) { S(p_).emplace_back(std::string(v)); return *this; }
void Stack::call(int op) { OPS.at(size_t(op)).callBoxed(S(p_)); }
Tensor Stack::out(size_t k) const {
  const c10::IValue& v = S(p_).at(k);
  return v.isNone() ? Tensor() : make(v.toTensor());
}
Tensor Stack::out_item(size_t k, size_t j) const {
  c10::IValue v = S(p_).at(k).toList().get(j);
  return v.isNone() ? Tensor() : make(v.toTensor());
}

int init_ops(const char* const* names, const char* const* overloads, int n, char* err, size_t err_len) {
  try {
    static std::mutex lock;  // two runners of one model.so may start at once
    std::lock_guard<std::mutex> guard(lock);
    if (OPS.empty()) {
      std::vector<c10::OperatorHandle> ops;
      for (int k = 0; k < n; ++k) ops.push_back(c10::Dispatcher::singleton().findSchemaOrThrow(names[k], overloads[k]));
      OPS = std::move(ops);
    }
    return 0;
  } catch (const std::exception& e) {
    return report(e.what(), err, err_len);
  }
}

int report(const char* what, char* err, size_t err_len) {
  std::snprintf(err, err_len, "kiln model: %s", what);
  return 1;
}

using ImplPtr = c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

void hand_over(void** slots, std::initializer_list<Tensor> outputs) noexcept {
  size_t k = 0;
  for (const Tensor& t : outputs)
    slots[k++] = t.impl() && T(t).defined() ? ImplPtr(T(t).getIntrusivePtr()).release() : nullptr;
}

void release_outputs(void* const* slots, size_t n) noexcept {
  for (size_t k = 0; k < n; ++k)
    if (slots[k]) ImplPtr::reclaim(static_cast<c10::TensorImpl*>(slots[k]));  // dropped here
}

namespace {
// the inputs this thread's next run takes over (hold_inputs), by input index; empty unless a caller handed
// some over. A run moves them into its own frame (RUNNING points there while it runs), so a run entered
// from inside another (an ATen op calling back into Python) neither takes nor drops the outer run's
thread_local std::vector<ImplPtr> PENDING;
thread_local std::vector<ImplPtr>* RUNNING = nullptr;
}  // namespace

void hold_inputs(const int64_t* index, void* const* impls, size_t n) noexcept {
  PENDING.clear();
  for (size_t k = 0; k < n; ++k) {
    if (static_cast<size_t>(index[k]) >= PENDING.size()) PENDING.resize(static_cast<size_t>(index[k]) + 1);
    PENDING[static_cast<size_t>(index[k])] = ImplPtr::reclaim_copy(static_cast<c10::TensorImpl*>(impls[k]));
  }
}

void drop_input(size_t k) noexcept {
  if (RUNNING != nullptr && k < RUNNING->size()) (*RUNNING)[k].reset();
}

int run(Graph graph, Device dev, const int64_t* sizes, void* const* inputs, void* const* constants, void** outputs,
        char* err, size_t err_len) {
  struct Held {  // this run's held inputs; what it still holds goes when it ends, returned or thrown
    std::vector<ImplPtr> inputs = std::move(PENDING);
    std::vector<ImplPtr>* outer = RUNNING;
    Held() { PENDING.clear(); RUNNING = &inputs; }
    ~Held() { RUNNING = outer; }
  } held;
  try {
    // below autograd, as inference mode dispatches, but making ordinary tensors: an output may be used
    // anywhere afterwards (an inference tensor could not be updated in place or saved for backward)
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    c10::NoGradGuard no_grad;
    c10::OptionalDeviceGuard on_device;  // CUDA: the package's device is current (streams, allocations)
    if (dev.type != kDeviceCPU) on_device.reset_device(device(dev));
    graph(dev, sizes, inputs, constants, outputs);
    return 0;
  } catch (const std::exception& e) {
    return report(e.what(), err, err_len);
  }
}

}  // namespace kiln_rt
