"""The constant parts of a generated C++ wrapper: includes, helpers, and the model library's C ABI.

The ABI is plain C so that any loader can call it (``kiln/runner.h`` through dlopen, the Python
loader through ctypes): ``kiln_model_run(inputs, constants, outputs, err, err_len)`` takes the data
pointers of the inputs and constants, laid out as the manifest says (the caller checked them), and of
output buffers the caller allocated in the manifest's layouts; it returns 0, or 1 with a message.
"""

from __future__ import annotations

ABI_VERSION = 1

HEAD = """// kiln generated C++ wrapper for graph {name!r}: allocates buffers, calls kiln's C++ kernels and
// ATen's (libtorch's dispatcher) in the planned order. Built into model.so by kiln.package.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/randint.h>
#include <c10/core/InferenceMode.h>
{includes}
#include <cstdio>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace {{

using Stack = std::vector<c10::IValue>;

inline at::TensorOptions opts(at::ScalarType t) {{ return at::TensorOptions().dtype(t).device(at::kCPU); }}

// caller memory as a tensor (no ownership: it outlives the call)
inline at::Tensor wrap(void* p, at::IntArrayRef size, at::IntArrayRef stride, at::ScalarType t) {{
  return at::from_blob(p, size, stride, opts(t));
}}

// ATen may return other strides than the plan (a convolution follows its input's layout); the kernels
// index by the plan, so copy into it when they differ (kiln.runtime.program_helpers.restride in Python)
inline at::Tensor restride(const at::Tensor& t, at::IntArrayRef size, at::IntArrayRef stride, at::ScalarType dt) {{
  if (!t.defined()) return at::empty_strided(size, stride, opts(dt));
  if (t.numel() <= 1) return t;
  bool same = true;
  for (size_t d = 0; d < size.size(); ++d) same = same && (size[d] == 1 || t.stride(d) == stride[d]);
  if (same) return t;
  at::Tensor out = at::empty_strided(size, stride, t.options());
  out.copy_(t);
  return out;
}}

inline at::Tensor restride(const c10::IValue& v, at::IntArrayRef size, at::IntArrayRef stride, at::ScalarType dt) {{
  return restride(v.isNone() ? at::Tensor() : v.toTensor(), size, stride, dt);
}}

std::vector<c10::OperatorHandle> OPS;

}}  // namespace

"""

ABI = """
extern "C" {{

__attribute__((visibility("default"))) int kiln_model_abi_version() {{ return {abi}; }}

__attribute__((visibility("default"))) const char* kiln_model_graph() {{ return {name_c}; }}

// looks up every ATen op the graph calls (a libtorch without one fails here, not mid-run)
__attribute__((visibility("default"))) int kiln_model_init(char* err, size_t err_len) {{
  try {{
    if (OPS.empty()) {{
      auto& d = c10::Dispatcher::singleton();
      (void)d;
{lookups}
    }}
    return 0;
  }} catch (const std::exception& e) {{
    std::snprintf(err, err_len, "kiln model: %s", e.what());
    return 1;
  }}
}}

__attribute__((visibility("default"))) int kiln_model_run(void* const* inputs, void* const* constants,
                                                         void* const* outputs, char* err, size_t err_len) {{
  try {{
    c10::InferenceMode guard;
    run_graph(inputs, constants, outputs);
    return 0;
  }} catch (const std::exception& e) {{
    std::snprintf(err, err_len, "kiln model: %s", e.what());
    return 1;
  }}
}}

}}  // extern "C"
"""
