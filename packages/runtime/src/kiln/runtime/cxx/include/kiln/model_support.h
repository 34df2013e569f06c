// What a generated C++ wrapper (model.so) calls: libtorch behind a small interface with no torch
// headers, so that each package's wrapper compiles in well under a second; model_support.cpp (the
// only translation unit that includes ATen) is compiled once per torch/compiler and linked in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace kiln_rt {

using Ints = std::initializer_list<int64_t>;

// Where a program's tensors live: c10::DeviceType's code (kDeviceCPU, kDeviceCUDA) and the device index.
struct Device {
  int type;
  int index;
};
constexpr int kDeviceCPU = 0;
constexpr int kDeviceCUDA = 1;

// dtype codes: c10::ScalarType's values (stable across torch releases)
enum Dtype : int { kU8 = 0, kI8 = 1, kI16 = 2, kI32 = 3, kI64 = 4, kF16 = 5, kF32 = 6, kF64 = 7, kC64 = 9, kC128 = 10,
                   kBool = 11, kBF16 = 15 };

// A reference-counted at::Tensor behind an opaque pointer (undefined when empty).
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(void* impl) : p_(impl) {}
  Tensor(const Tensor& o);
  Tensor(Tensor&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  Tensor& operator=(const Tensor& o);
  Tensor& operator=(Tensor&& o) noexcept;
  ~Tensor() { reset(); }
  void reset();
  void* data() const;
  void* impl() const { return p_; }

 private:
  void* p_ = nullptr;
};

// caller memory, not owned; on CUDA an input not 16-byte aligned (as triton's kernels assume) is copied
Tensor wrap(Device dev, void* data, Ints size, Ints stride, int dtype);
// caller memory only kernels read: ``data`` itself, or on CUDA when it is not 16-byte aligned an aligned copy,
// kept alive by ``hold`` (no at::Tensor is made for an aligned input)
void* aligned_data(Device dev, void* data, Ints size, Ints stride, int dtype, Tensor& hold);
Tensor empty_strided(Device dev, Ints size, Ints stride, int dtype);
Tensor as_strided(const Tensor& t, Ints size, Ints stride, int64_t offset);  // offset added to t's own
Tensor reshaped_storage(const Tensor& t, Ints size, Ints stride);  // t's memory (and offset) in another layout
Tensor restride(Device dev, const Tensor& t, Ints size, Ints stride, int dtype);  // ATen's result, planned strides
// a copy of ``src`` in fresh memory laid out as (size, stride) at storage offset ``offset``
Tensor copy_as(Device dev, const Tensor& src, Ints size, Ints stride, int64_t offset, int dtype);
Tensor random_seed(Device dev);  // int64[1] in [0, 2^62)

Tensor mm(const Tensor& a, const Tensor& b);
Tensor addmm(const Tensor& c, const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
Tensor baddbmm(const Tensor& c, const Tensor& a, const Tensor& b);
Tensor convolution(const Tensor& x, const Tensor& w, const Tensor& bias, Ints stride, Ints padding, Ints dilation,
                   bool transposed, Ints output_padding, int64_t groups);

// The arguments of a boxed ATen call, pushed in schema order; call(op) runs OPS[op] (init_ops).
class Stack {
 public:
  Stack();
  ~Stack();
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  Stack& none();
  Stack& tensor(const Tensor& t);
  Stack& i(int64_t v);
  Stack& d(double v);
  Stack& b(bool v);
  Stack& ints(Ints v);
  Stack& doubles(std::initializer_list<double> v);
  Stack& bools(std::initializer_list<bool> v);
  Stack& tensors(std::initializer_list<Tensor> v);
  Stack& optional_tensors(std::initializer_list<Tensor> v);  // undefined ones are None
  Stack& scalar_type(int v);
  Stack& layout(int v);
  Stack& memory_format(int v);
  Stack& device(const char* v);
  Stack& str(const char* v);
  void call(int op);
  Tensor out(size_t k) const;  // return k (None: undefined)
  Tensor out_item(size_t k, size_t j) const;  // item j of return k (a tensor list)

 private:
  void* p_;
};

// Look up the graph's ATen ops by (name, overload) into the table Stack::call indexes.
int init_ops(const char* const* names, const char* const* overloads, int n, char* err, size_t err_len);
// The handover of a program's outputs: slot k gets an owned reference to output k's at::TensorImpl (c10's
// intrusive_ptr::release(): the caller adopts it with reclaim(), or wraps it and drops this reference with
// release_outputs), null for an undefined tensor (an output the caller makes itself: an input it returns).
// The generated wrapper calls it once, after every output is computed: a call that throws hands over nothing.
void hand_over(void** slots, std::initializer_list<Tensor> outputs) noexcept;
// Drop references hand_over gave (after the caller took its own: Python's torch._C._wrap_tensor_impl);
// null slots are skipped.
void release_outputs(void* const* slots, size_t n) noexcept;

// Inputs a caller hands over (kiln.compile's C++ wrapper of a backward: its saved activations, whose
// Python references the caller drops before the run): an owned reference to input ``index[k]``'s
// at::TensorImpl for each k, held on this thread until the run drops it after that input's last use
// (drop_input: its memory is free for the rest of the run, as the Python wrapper's ``del``) or ends.
void hold_inputs(const int64_t* index, void* const* impls, size_t n) noexcept;
void drop_input(size_t k) noexcept;  // no-op for an input not held

// Run ``graph`` on ``dev`` (its device current) below autograd (no autograd graph is recorded; the outputs
// are ordinary tensors, not inference tensors, so a caller may use them in any mode); 0, or 1 with the
// exception's message in ``err``. ``sizes``: the size symbols' values (symbolic shapes), passed through.
using Graph = void (*)(Device, const int64_t*, void* const*, void* const*, void**);
int run(Graph graph, Device dev, const int64_t* sizes, void* const* inputs, void* const* constants, void** outputs,
        char* err, size_t err_len);
// Write the current exception's message into ``err`` (inside a catch block); returns 1.
int report(const char* what, char* err, size_t err_len);

}  // namespace kiln_rt
