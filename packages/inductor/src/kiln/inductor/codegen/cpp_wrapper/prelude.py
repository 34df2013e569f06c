"""The constant parts of a generated C++ wrapper: its includes and the model library's C ABI.

The wrapper includes no torch header: it calls libtorch through ``kiln/model_support.h`` (and a CUDA
package's cubins through ``kiln/model_support_cuda.h``; kiln.runtime.cxx compiles those libraries' side
once per torch release and links them into each model.so), so a package's own C++ builds in well under
a second.

The ABI (version 4) is plain C so that any loader can call it (``kiln/runner.h`` through dlopen, the
Python loaders through ctypes): ``kiln_model_init(package_dir, device_type, device_index, err, err_len)``
once per device (c10::DeviceType's code: 0 CPU, 1 CUDA; it refuses a device type the library was not
built for, and on CUDA loads the cubins onto that device). Per call,
``kiln_model_run(device_type, device_index, sizes, inputs, constants, outputs, err, err_len)``: ``sizes``
holds the values of the manifest's size symbols in its order (read from the inputs; none for static
shapes), whose relations it checks first; ``inputs`` and ``constants`` the data pointers of the inputs and
constants, on that device and laid out as the manifest says (the caller checked them). It returns 0 with
``outputs[k]`` an owned reference to output k's ``at::TensorImpl`` (allocated by the program when it
computed it; the C++ runner adopts it with ``intrusive_ptr::reclaim``), or 1 with a message and no output.
``kiln_model_release_outputs(outputs, n)`` drops such references, for a caller that took its own
(Python's ``torch._C._wrap_tensor_impl``). ``kiln_model_hold_inputs(index, impls, n)`` (optional, before a
run on the same thread): owned references to inputs the caller no longer holds, which the run drops after
each one's last use.
"""

from __future__ import annotations

ABI_VERSION = 4

HEAD = """// kiln generated C++ wrapper for graph {name!r} ({device}): allocates buffers, calls kiln's kernels and
// ATen (through kiln/model_support.h) in the planned order. Built into model.so by kiln.package.
#include <kiln/model_support.h>
{includes}
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

using kiln_rt::Tensor;

// a float argument's value, passed as its IEEE bits in the int64 array of sizes
static inline double kiln_double_of_bits(int64_t bits) {{
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}}

"""

CUDA_INCLUDE = "#include <kiln/model_support_cuda.h>\n"

# CUDA: the package's cubins (kernels/*.cubin), loaded onto a device by kiln_model_init
CUDA_PROGRAM = """
// the package's cubins: file, sha256, symbol, num_warps, shared memory bytes, scratch parameters, global scratch
static const kiln_rt::cuda::KernelInfo KERNELS[] = {{
{rows}
}};
static kiln_rt::cuda::Program PROGRAM(KERNELS, {n}, {arch});

"""

LOAD_CUDA = "PROGRAM.load(package_dir, device_index, err, err_len)"

ABI = """
#define KILN_EXPORT extern "C" __attribute__((visibility("default")))

KILN_EXPORT int kiln_model_abi_version() {{ return {abi}; }}

KILN_EXPORT const char* kiln_model_graph() {{ return {name_c}; }}

KILN_EXPORT const char* kiln_model_device() {{ return "{device}"; }}

// looks up every ATen op the graph calls (a libtorch without one fails here, not mid-run); CUDA: loads
// the package's cubins onto the device
KILN_EXPORT int kiln_model_init(const char* package_dir, int device_type, int device_index, char* err,
                                unsigned long err_len) {{
  (void)package_dir; (void)device_index;
  if (device_type != {device_type})
    return kiln_rt::report("this model.so was built for {device}, asked to run on another device type", err, err_len);
  static const char* const names[] = {{{names}}};
  static const char* const overloads[] = {{{overloads}}};
  int rc = kiln_rt::init_ops(names, overloads, {n_ops}, err, err_len);
  return rc != 0 ? rc : {load};
}}

// outputs[k]: an owned reference to output k's at::TensorImpl (null: an output the caller makes itself)
KILN_EXPORT int kiln_model_run(int device_type, int device_index, const int64_t* sizes, void* const* inputs,
                               void* const* constants, void** outputs, char* err, unsigned long err_len) {{
  return kiln_rt::run(run_graph, kiln_rt::Device{{device_type, device_index}}, sizes, inputs, constants, outputs,
                      err, err_len);
}}

// owned references to inputs the caller hands over for this thread's next kiln_model_run, which drops each
// after the input's last use (kiln_rt::hold_inputs)
KILN_EXPORT void kiln_model_hold_inputs(const int64_t* index, void* const* impls, unsigned long n) {{
  kiln_rt::hold_inputs(index, impls, n);
}}

// drops the references kiln_model_run handed over, for a caller that took its own
KILN_EXPORT void kiln_model_release_outputs(void* const* outputs, unsigned long n) {{
  kiln_rt::release_outputs(outputs, n);
}}
"""
