// The CUDA side of kiln/model_support_cuda.h: cubins loaded and launched through the CUDA driver API.
// Compiled once per torch release and compiler (cached), linked into every CUDA package's model.so.
#include "kiln/model_support_cuda.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/detail/sha256.h"

namespace kiln_rt {
namespace cuda {
namespace {

// The driver entry points used here, from libcuda.so.1 (opened at first use, never closed)
struct Driver {
  decltype(&::cuInit) init;
  decltype(&::cuDeviceGet) device_get;
  decltype(&::cuDeviceGetAttribute) device_attribute;
  decltype(&::cuDeviceGetName) device_name;
  decltype(&::cuDevicePrimaryCtxRetain) primary_context;
  decltype(&::cuCtxGetCurrent) current_context;
  decltype(&::cuCtxSetCurrent) set_current_context;
  decltype(&::cuModuleLoadData) load_module;
  decltype(&::cuModuleGetFunction) get_function;
  decltype(&::cuFuncSetAttribute) set_function_attribute;
  decltype(&::cuLaunchKernel) launch;
  decltype(&::cuLaunchKernelEx) launch_ex;  // null on a driver without it (before CUDA 12): no PDL
  decltype(&::cuGetErrorString) error_string;
};

template <typename F>
void bind(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(::dlsym(lib, name));
  if (!fn) throw std::runtime_error(std::string("the CUDA driver (libcuda.so.1) has no ") + name);
}

const Driver& driver() {
  static const Driver d = [] {
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
      throw std::runtime_error(std::string("cannot load the CUDA driver (libcuda.so.1): ") + ::dlerror() +
                               "; a CUDA package needs an NVIDIA GPU and its driver");
    Driver x{};
    bind(lib, "cuInit", x.init);
    bind(lib, "cuDeviceGet", x.device_get);
    bind(lib, "cuDeviceGetAttribute", x.device_attribute);
    bind(lib, "cuDeviceGetName", x.device_name);
    bind(lib, "cuDevicePrimaryCtxRetain", x.primary_context);
    bind(lib, "cuCtxGetCurrent", x.current_context);
    bind(lib, "cuCtxSetCurrent", x.set_current_context);
    bind(lib, "cuModuleLoadData", x.load_module);
    bind(lib, "cuModuleGetFunction", x.get_function);
    bind(lib, "cuFuncSetAttribute", x.set_function_attribute);
    bind(lib, "cuLaunchKernel", x.launch);
    x.launch_ex = reinterpret_cast<decltype(&::cuLaunchKernelEx)>(::dlsym(lib, "cuLaunchKernelEx"));
    bind(lib, "cuGetErrorString", x.error_string);
    return x;
  }();
  return d;
}

[[noreturn]] void fail(CUresult r, const std::string& what) {
  const char* s = nullptr;
  driver().error_string(r, &s);
  throw std::runtime_error(what + ": CUDA error " + std::to_string(int(r)) + " (" + (s ? s : "unknown") + ")");
}

void check(CUresult r, const std::string& what) {
  if (r != CUDA_SUCCESS) fail(r, what);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

int attribute(CUdevice dev, CUdevice_attribute a) {
  int v = 0;
  check(driver().device_attribute(&v, a, dev), "cuDeviceGetAttribute");
  return v;
}

}  // namespace

struct DeviceKernels {
  CUcontext context = nullptr;
  std::vector<CUfunction> functions;
  std::vector<KernelInfo> info;
};

Program::Program(const KernelInfo* kernels, int n, int arch) : kernels_(kernels), n_(n), arch_(arch) {}
Program::~Program() = default;  // modules stay loaded until the process ends (the driver may be gone first)

int Program::load(const char* package_dir, int device, char* err, size_t err_len) {
  try {
    std::lock_guard<std::mutex> guard(lock_);
    if (device < 0) throw std::runtime_error("device index " + std::to_string(device));
    if (size_t(device) < devices_.size() && devices_[size_t(device)]) return 0;
    const Driver& d = driver();
    check(d.init(0), "cuInit");
    CUdevice dev;
    check(d.device_get(&dev, device), "cuDeviceGet(" + std::to_string(device) + ")");
    int major = attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    int minor = attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    // a cubin runs on its own major architecture at the same or a later minor revision
    if (major != arch_ / 10 || minor < arch_ % 10) {
      char name[256] = {0};
      d.device_name(name, sizeof(name) - 1, dev);
      throw std::runtime_error("the package's kernels are compiled for sm_" + std::to_string(arch_) + "; cuda:" +
                               std::to_string(device) + " (" + name + ") is sm_" + std::to_string(major * 10 + minor) +
                               ": package again for it (kiln.package(..., device='cuda', options={'cuda_arch': " +
                               std::to_string(major * 10 + minor) + "}))");
    }
    auto k = std::make_unique<DeviceKernels>();
    check(d.primary_context(&k->context, dev), "cuDevicePrimaryCtxRetain");
    check(d.set_current_context(k->context), "cuCtxSetCurrent");
    int optin = attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    for (int i = 0; i < n_; ++i) {
      const KernelInfo& info = kernels_[i];
      std::string path = std::string(package_dir) + "/" + info.file;
      std::string bytes = read_file(path);
      if (kiln::detail::sha256_hex(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()) != info.sha256)
        throw std::runtime_error(std::string(info.file) + " does not match its sha256 (corrupt or replaced)");
      CUmodule module;
      check(d.load_module(&module, bytes.data()), std::string("loading ") + info.file);
      CUfunction fn;
      check(d.get_function(&fn, module, info.symbol), std::string("finding ") + info.symbol + " in " + info.file);
      if (info.shared_bytes > 49152) {  // above the default limit a kernel must opt in
        if (info.shared_bytes > optin)
          throw std::runtime_error(std::string(info.symbol) + " needs " + std::to_string(info.shared_bytes) +
                                   " bytes of shared memory, cuda:" + std::to_string(device) + " allows " +
                                   std::to_string(optin));
        check(d.set_function_attribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, info.shared_bytes),
              std::string("cuFuncSetAttribute(") + info.symbol + ")");
      }
      k->functions.push_back(fn);
      k->info.push_back(info);
    }
    if (devices_.size() <= size_t(device)) devices_.resize(size_t(device) + 1);
    devices_[size_t(device)] = std::move(k);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(err, err_len, "kiln model: %s", e.what());
    return 1;
  }
}

Launcher Program::launcher(int device) {
  const DeviceKernels* k = nullptr;
  {
    std::lock_guard<std::mutex> guard(lock_);
    if (device >= 0 && size_t(device) < devices_.size()) k = devices_[size_t(device)].get();
  }
  if (!k) throw std::runtime_error("the package's kernels are not loaded on cuda:" + std::to_string(device));
  CUcontext current = nullptr;  // a thread that never used CUDA has no current context
  check(driver().current_context(&current), "cuCtxGetCurrent");
  if (current != k->context) check(driver().set_current_context(k->context), "cuCtxSetCurrent");
  return Launcher(k, device, c10::cuda::getCurrentCUDAStream(c10::DeviceIndex(device)).stream());
}

void Launcher::operator()(int k, unsigned gx, unsigned gy, unsigned gz, std::initializer_list<void*> args,
                          std::initializer_list<int64_t> sizes) const {
  const KernelInfo& info = k_->info[size_t(k)];
  // most kernels take a few pointers and sizes; a horizontally fused kernel takes two per member (an AMP
  // step's bf16 casts of every weight in one launch: Llama-350M's forward passed 128, and the call failed)
  constexpr size_t kMax = 1024;
  if (args.size() + sizes.size() > kMax) throw std::runtime_error(std::string(info.symbol) + ": too many arguments");
  void* values[kMax + 2];
  void* params[kMax + 2];
  int64_t ints[kMax];  // kiln's Triton kernels declare their sizes i64 (codegen/triton/kernel.py)
  size_t n = 0;
  for (void* v : args) {
    values[n] = v;
    params[n] = &values[n];
    ++n;
  }
  size_t i = 0;
  for (int64_t v : sizes) {
    if (v < 0) throw std::runtime_error(std::string(info.symbol) + ": a negative size");
    ints[i] = v;
    params[n++] = &ints[i++];
  }
  at::Tensor scratch;
  values[n] = nullptr;  // global scratch
  if (info.global_scratch_bytes > 0) {  // freed after the launch: the allocator orders reuse on this stream
    int64_t bytes = int64_t(gx) * gy * gz * info.global_scratch_bytes;
    scratch = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(c10::Device(c10::kCUDA, c10::DeviceIndex(device_))));
    values[n] = scratch.data_ptr();
  }
  values[n + 1] = nullptr;  // a profiler's scratch: none
  for (int s = 0; s < info.scratch_params; ++s, ++n) params[n] = &values[n];
  const Driver& d = driver();
  CUresult r;
  if (info.pdl && d.launch_ex) {  // may start while the kernel before it finishes (its first act is to wait)
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig config{};
    config.gridDimX = gx;
    config.gridDimY = gy;
    config.gridDimZ = gz;
    config.blockDimX = unsigned(32 * info.num_warps);
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = unsigned(info.shared_bytes);
    config.hStream = static_cast<CUstream>(stream_);
    config.attrs = &attr;
    config.numAttrs = 1;
    r = d.launch_ex(&config, k_->functions[size_t(k)], params, nullptr);
  } else {
    r = d.launch(k_->functions[size_t(k)], gx, gy, gz, unsigned(32 * info.num_warps), 1, 1,
                 unsigned(info.shared_bytes), static_cast<CUstream>(stream_), params, nullptr);
  }
  if (r != CUDA_SUCCESS) fail(r, std::string("launching ") + info.symbol);  // (no string built per launch)
}

}  // namespace cuda
}  // namespace kiln_rt
