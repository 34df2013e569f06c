"""The constant parts of a generated C++ wrapper: its one include and the model library's C ABI.

The wrapper includes no torch header: it calls libtorch through ``kiln/model_support.h`` (kiln.runtime.cxx
compiles that library's side once per torch release and links it into each model.so), so a package's
own C++ builds in well under a second.

The ABI is plain C so that any loader can call it (``kiln/runner.h`` through dlopen, the Python
loader through ctypes): ``kiln_model_run(inputs, constants, outputs, err, err_len)`` takes the data
pointers of the inputs and constants, laid out as the manifest says (the caller checked them), and of
output buffers the caller allocated in the manifest's layouts; it returns 0, or 1 with a message.
"""

from __future__ import annotations

ABI_VERSION = 1

HEAD = """// kiln generated C++ wrapper for graph {name!r}: allocates buffers, calls kiln's C++ kernels and
// ATen (through kiln/model_support.h) in the planned order. Built into model.so by kiln.package.
#include <kiln/model_support.h>

#include <limits>

using kiln_rt::Tensor;

"""

ABI = """
#define KILN_EXPORT extern "C" __attribute__((visibility("default")))

KILN_EXPORT int kiln_model_abi_version() {{ return {abi}; }}

KILN_EXPORT const char* kiln_model_graph() {{ return {name_c}; }}

// looks up every ATen op the graph calls (a libtorch without one fails here, not mid-run)
KILN_EXPORT int kiln_model_init(char* err, unsigned long err_len) {{
  static const char* const names[] = {{{names}}};
  static const char* const overloads[] = {{{overloads}}};
  return kiln_rt::init_ops(names, overloads, {n_ops}, err, err_len);
}}

KILN_EXPORT int kiln_model_run(void* const* inputs, void* const* constants, void* const* outputs, char* err,
                               unsigned long err_len) {{
  return kiln_rt::run(run_graph, inputs, constants, outputs, err, err_len);
}}
"""
