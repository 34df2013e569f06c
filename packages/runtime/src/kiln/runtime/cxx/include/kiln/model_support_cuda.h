// What a generated CUDA wrapper (model.so) calls besides kiln/model_support.h: its Triton kernels,
// compiled ahead of time into cubins that the package ships (kernels/*.cubin), loaded and launched
// through the CUDA driver API on the current stream (at::cuda::getCurrentCUDAStream()). No CUDA or
// torch header here: model_support_cuda.cpp (compiled once per torch release, cached) holds them.
//
// The driver library (libcuda.so.1) is opened at run time, as torch and triton do: a package links,
// and a program using it builds, on a machine without a GPU driver.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kiln_rt {
namespace cuda {

// One cubin: its file in the package and how to launch it (from triton's metadata, kiln.inductor's
// codegen/triton/cubins.py)
struct KernelInfo {
  const char* file;  // relative to the package folder
  const char* sha256;  // of the file (checked at load)
  const char* symbol;  // cuModuleGetFunction's name
  int num_warps;  // block: num_warps * 32 threads
  int shared_bytes;  // dynamic shared memory per block
  int scratch_params;  // null scratch pointers appended after the kernel's arguments (triton's ABI)
  int64_t global_scratch_bytes;  // per program; allocated per launch when > 0
  int pdl;  // launched with programmatic dependent launch (sm_90+: the kernel waits for the previous one first)
};

struct DeviceKernels;  // the cubins loaded onto one device (model_support_cuda.cpp)

// The launches of one call: the device's kernels, its current stream, its context made current.
class Launcher {
 public:
  Launcher(const DeviceKernels* kernels, int device, void* stream) : k_(kernels), device_(device), stream_(stream) {}
  // kernel ``k`` over grid (gx, gy, gz) with these pointer arguments, in order, then these sizes (symbolic
  // shapes: passed as int32, as the cubin was compiled; a size past int32 throws)
  void operator()(int k, unsigned gx, unsigned gy, unsigned gz, std::initializer_list<void*> args,
                  std::initializer_list<int64_t> sizes = {}) const;

 private:
  const DeviceKernels* k_;
  int device_;
  void* stream_;
};

// A model's cubins (one per model.so): loaded onto a device by load(), once per device.
class Program {
 public:
  Program(const KernelInfo* kernels, int n, int arch);
  ~Program();
  // Read, check and load every cubin onto ``device``: 0, or 1 with the reason in ``err`` (no driver,
  // another GPU architecture, a missing or corrupt cubin).
  int load(const char* package_dir, int device, char* err, size_t err_len);
  // This call's launcher on ``device`` (loaded before): throws std::runtime_error otherwise.
  Launcher launcher(int device);

 private:
  const KernelInfo* kernels_;
  int n_;
  int arch_;
  std::mutex lock_;
  std::vector<std::unique_ptr<DeviceKernels>> devices_;  // by device index
};

}  // namespace cuda
}  // namespace kiln_rt
