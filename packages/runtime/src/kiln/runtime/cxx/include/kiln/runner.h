// kiln::Runner: load a package written by kiln.package and run it from C++ with libtorch alone.
//
//   kiln::Runner runner("model_pkg");       // on the manifest's device (CUDA: the current one), or
//   kiln::Runner runner("model_pkg", c10::Device("cuda:1"));
//   std::vector<at::Tensor> outputs = runner.run({x});
//
// Build: g++ main.cpp $(python -m kiln.runtime.cxx --cflags --ldflags) -o main
//        (CUDA packages: python -m kiln.runtime.cxx --cuda --cflags --ldflags)
// Header-only, and no CUDA header: everything CUDA happens inside a CUDA package's model.so. The
// constructor reads manifest.json, checks its format and schema version, the torch version and device
// the package was built for (a CUDA package refuses a CPU device and vice versa; model.so refuses a GPU
// of another architecture than its cubins'), and the sha256 and size of model.so, the weights and each
// cubin; then it dlopens model.so and memory-maps the weights (safetensors; a CUDA package's are copied
// onto the device once). run() checks each input's dtype, shape and device against the manifest; on CUDA
// it runs on the device's current stream. Every failure is a std::runtime_error whose message names
// the package and what is wrong.
//
// Dynamic shapes: a dim the manifest names by a size symbol varies. run() reads each symbol from the
// input dim the manifest's "sizes" say, checks it against its range, checks every input dim named by a
// symbol against its value (two inputs sharing a dim), and has model.so check the other relations the
// program assumed.
//
// Outputs: model.so allocates each when its program computes it (an output is not live before that) and
// hands it over as an owned at::TensorImpl reference, which run() adopts.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/UndefinedTensorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/version.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/detail/json.h"
#include "kiln/detail/sha256.h"

namespace kiln {

constexpr int kPackageSchemaVersion = 2;
constexpr int kModelAbiVersion = 4;

struct TensorSpec {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;   // -1 where the dim is symbolic
  std::vector<int64_t> stride;  // empty for a symbolic input: contiguous
  std::vector<std::string> symbols;  // per dim: the size symbol (or expression) naming it, "" when static
  bool dynamic() const { return !symbols.empty(); }
};

// A dim that varies: its size symbol, the input dim it is read from, and the sizes served.
struct SizeSpec {
  std::string symbol;
  size_t input;
  int64_t dim;
  int64_t min;
  int64_t max;
};

namespace detail {

inline at::ScalarType dtype_of(const std::string& s) {
  static const std::pair<const char*, at::ScalarType> table[] = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"int64", at::kLong},    {"int32", at::kInt},      {"int16", at::kShort},  {"int8", at::kChar},
      {"uint8", at::kByte},    {"bool", at::kBool}};
  for (const auto& e : table)
    if (s == e.first) return e.second;
  throw std::runtime_error("unknown dtype '" + s + "'");
}

inline std::string dims(at::IntArrayRef d) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < d.size(); ++i) o << (i ? ", " : "") << d[i];
  o << "]";
  return o.str();
}

// A read-only file mapped into memory (copy-on-write pages: ATen may treat a constant as writable).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) { ::close(fd); throw std::runtime_error("cannot stat " + path); }
    size_ = size_t(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) { ::close(fd); throw std::runtime_error("cannot map " + path); }
      data_ = static_cast<uint8_t*>(p);
    }
    ::close(fd);
  }
  ~MappedFile() { if (data_) ::munmap(data_, size_); }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::ostringstream o;
  o << f.rdbuf();
  return o.str();
}

// This CPU's instruction-set flags (/proc/cpuinfo), as the manifest lists the building CPU's.
inline std::vector<std::string> cpu_flags() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    std::string key = line.substr(0, line.find(':'));
    key.erase(key.find_last_not_of(" \t") + 1);
    if (key == "flags" || key == "Features") {
      std::istringstream words(line.substr(line.find(':') + 1));
      std::vector<std::string> out;
      for (std::string w; words >> w;) out.push_back(w);
      return out;
    }
  }
  return {};
}

// The building CPU's flags this one lacks (kiln's kernels are built with -march=native).
inline std::string missing_cpu_flags(const Json& built) {
  std::vector<std::string> here = cpu_flags();
  std::string missing;
  for (const auto& f : built.array())
    if (std::find(here.begin(), here.end(), f.str()) == here.end()) missing += (missing.empty() ? "" : ", ") + f.str();
  return missing;
}

inline std::string shape_text(const TensorSpec& s) {
  std::string out = "[";
  for (size_t d = 0; d < s.shape.size(); ++d)
    out += (d ? ", " : "") + (s.symbols.empty() || s.symbols[d].empty() ? std::to_string(s.shape[d]) : s.symbols[d]);
  return out + "]";
}

inline TensorSpec spec_of(const Json& j) {
  TensorSpec s{j.at("name").str(), dtype_of(j.at("dtype").str()), {}, {}, {}};
  bool symbolic = false;
  for (const auto& d : j.at("shape").array()) symbolic = symbolic || d.kind == Json::Kind::String;
  for (const auto& d : j.at("shape").array()) {
    s.shape.push_back(d.kind == Json::Kind::String ? -1 : d.integer());
    if (symbolic) s.symbols.push_back(d.kind == Json::Kind::String ? d.str() : "");
  }
  if (!symbolic) s.stride = j.at("stride").ints();
  return s;
}

}  // namespace detail

class Runner {
 public:
  // on the device the package was built for (a CUDA package: the current CUDA device)
  explicit Runner(const std::string& package_path) : Runner(package_path, std::nullopt) {}
  // on ``device``: it must be of the package's device type
  Runner(const std::string& package_path, c10::Device device)
      : Runner(package_path, std::optional<c10::Device>(device)) {}
  ~Runner() { close(); }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  const std::vector<TensorSpec>& input_specs() const { return inputs_; }
  const std::vector<TensorSpec>& output_specs() const { return outputs_; }
  const std::vector<SizeSpec>& size_specs() const { return sizes_; }
  // where it runs: the device asked for, a CUDA one with its index (the current device's when none was given)
  c10::Device device() const { return device_; }

  // Safe to call from several threads at once (each call allocates its own buffers).
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) {
    if (inputs.size() != inputs_.size())
      throw std::runtime_error("kiln::Runner::run: expected " + std::to_string(inputs_.size()) + " inputs (" +
                               input_names() + "), got " + std::to_string(inputs.size()));
    std::vector<at::Tensor> held;  // inputs copied into the declared strides
    std::vector<void*> in(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) in[i] = checked(i, inputs[i], held);
    std::vector<int64_t> sizes = checked_sizes(inputs);
    char err[2048] = {0};
    std::vector<void*> out(outputs_.size(), nullptr);
    if (run_(int(device_.type()), device_.index(), sizes.data(), in.data(), constants_.data(), out.data(), err,
             sizeof(err)) != 0)
      throw std::runtime_error(std::string("kiln::Runner::run: ") + err);
    using Impl = c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
    std::vector<at::Tensor> outs;  // each output's reference, handed over by model.so, adopted (all: none leaks)
    for (void* p : out) outs.push_back(p ? at::Tensor(Impl::reclaim(static_cast<c10::TensorImpl*>(p))) : at::Tensor());
    for (size_t k = 0; k < outs.size(); ++k)
      if (!outs[k].defined())
        throw std::runtime_error("kiln::Runner::run: model.so handed over no tensor for output " + std::to_string(k));
    return outs;
  }

 private:
  using InitFn = int (*)(const char*, int, int, char*, size_t);
  using RunFn = int (*)(int, int, const int64_t*, void* const*, void* const*, void**, char*, size_t);
  std::string path_;
  c10::Device device_ = c10::kCPU;
  std::vector<TensorSpec> inputs_, outputs_;
  std::vector<SizeSpec> sizes_;
  std::vector<void*> constants_;
  std::vector<at::Tensor> device_constants_;  // a CUDA package's weights, copied onto its device
  std::unique_ptr<detail::MappedFile> weights_;
  void* lib_ = nullptr;
  RunFn run_ = nullptr;

  Runner(const std::string& package_path, std::optional<c10::Device> device) : path_(package_path) {
    try {
      load(device);
    } catch (const std::exception& e) {
      close();
      throw std::runtime_error("kiln::Runner: package " + path_ + ": " + e.what());
    }
  }

  std::string input_names() const {
    std::string s;
    for (size_t i = 0; i < inputs_.size(); ++i) s += (i ? ", " : "") + inputs_[i].name;
    return s;
  }

  void* checked(size_t i, const at::Tensor& t, std::vector<at::Tensor>& held) const {
    const TensorSpec& s = inputs_[i];
    std::string who = "kiln::Runner::run: input " + std::to_string(i) + " ('" + s.name + "')";
    if (!t.defined()) throw std::runtime_error(who + " is an undefined tensor");
    if (t.device() != device_)
      throw std::runtime_error(who + " is on " + t.device().str() + ", the package runs on " + device_.str());
    if (t.scalar_type() != s.dtype)
      throw std::runtime_error(who + ": expected dtype " + std::string(c10::toString(s.dtype)) + ", got " +
                               c10::toString(t.scalar_type()));
    if (s.dynamic()) {  // its static dims here, its symbolic ones in checked_sizes
      bool same = t.dim() == int64_t(s.shape.size());
      for (size_t d = 0; same && d < s.shape.size(); ++d) same = s.shape[d] < 0 || t.size(int64_t(d)) == s.shape[d];
      if (!same)
        throw std::runtime_error(who + ": expected shape " + detail::shape_text(s) + ", got " +
                                 detail::dims(t.sizes()) + " (the dims named by a size symbol vary)");
      if (t.is_contiguous()) return t.data_ptr();
      held.push_back(t.contiguous());
      return held.back().data_ptr();
    }
    if (t.sizes() != at::IntArrayRef(s.shape))
      throw std::runtime_error(who + ": expected shape " + detail::dims(s.shape) + ", got " + detail::dims(t.sizes()) +
                               " (the package was exported for static shapes)");
    if (t.strides() == at::IntArrayRef(s.stride) || t.numel() == 0) return t.data_ptr();
    held.push_back(at::empty_strided(s.shape, s.stride, t.options()));
    held.back().copy_(t);
    return held.back().data_ptr();
  }

  // Each size symbol's value, read from its input dim and checked against its range; then the input
  // dims named by one symbol checked to be equal (inputs that share a dim; the first one names it).
  std::vector<int64_t> checked_sizes(const std::vector<at::Tensor>& inputs) const {
    std::vector<int64_t> out;
    for (const auto& z : sizes_) {
      int64_t v = inputs[z.input].size(z.dim);
      if (v < z.min || v > z.max)
        throw std::runtime_error("kiln::Runner::run: input " + std::to_string(z.input) + " ('" + inputs_[z.input].name +
                                 "') dim " + std::to_string(z.dim) + ": size " + std::to_string(v) +
                                 " is outside the range [" + std::to_string(z.min) + ", " + std::to_string(z.max) +
                                 "] the package was exported for");
      out.push_back(v);
    }
    std::map<std::string, std::pair<size_t, int64_t>> first;  // symbol -> (input, dim) naming it first
    for (size_t i = 0; i < inputs_.size(); ++i)
      for (size_t d = 0; d < inputs_[i].symbols.size(); ++d) {
        const std::string& sym = inputs_[i].symbols[d];
        if (sym.empty()) continue;
        auto [it, fresh] = first.emplace(sym, std::make_pair(i, int64_t(d)));
        const auto [j, e] = it->second;
        if (fresh || inputs[i].size(int64_t(d)) == inputs[j].size(e)) continue;
        throw std::runtime_error(
            "kiln::Runner::run: input " + std::to_string(i) + " ('" + inputs_[i].name + "') dim " + std::to_string(d) +
            ": size " + std::to_string(inputs[i].size(int64_t(d))) + " must equal input " + std::to_string(j) + " ('" +
            inputs_[j].name + "') dim " + std::to_string(e) + ", size " + std::to_string(inputs[j].size(e)) +
            " (the program relates these sizes: both are " + sym + ")");
      }
    return out;
  }

  void verify(const detail::Json& files, const std::string& name, const uint8_t* data, size_t size) const {
    const detail::Json& f = files.at(name);
    if (int64_t(size) != f.at("bytes").integer())
      throw std::runtime_error(name + " has " + std::to_string(size) + " bytes, the manifest says " +
                               std::to_string(f.at("bytes").integer()) + " (truncated or replaced)");
    if (detail::sha256_hex(data, size) != f.at("sha256").str())
      throw std::runtime_error(name + " does not match its sha256 in the manifest (corrupt or replaced)");
  }

  // The device a package of device type ``built`` runs on: ``asked``, a CUDA one with its index filled in
  static c10::Device resolve(const std::string& built, c10::Device asked) {
    if (built != "cpu" && built != "cuda")
      throw std::runtime_error("built for device '" + built + "'; this runner runs cpu and cuda packages");
    if (c10::Device(built).type() != asked.type())
      throw std::runtime_error("built for " + built + ", asked to run on " + asked.str() +
                               " (package it again with kiln.package(..., device='" +
                               c10::DeviceTypeName(asked.type(), true) + "'))");
    if (asked.is_cpu()) return asked;
    // the current CUDA device (no CUDA header: through c10's device guard registry)
    if (!c10::impl::hasDeviceGuardImpl(asked.type()))
      throw std::runtime_error("built for cuda, and this program has no CUDA support loaded (link it with "
                               "python -m kiln.runtime.cxx --cuda --ldflags)");
    const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(asked.type());
    if (asked.has_index()) return asked;
    if (impl->deviceCount() == 0)  // (no driver, or no GPU: reported as none, not thrown)
      throw std::runtime_error("built for cuda, and this machine has no CUDA device (or no NVIDIA driver)");
    return impl->getDevice();
  }

  void load(std::optional<c10::Device> device) {
    detail::Json m;
    try {
      m = detail::parse_json(detail::read_text(path_ + "/manifest.json"));
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("manifest.json: ") + e.what());
    }
    if (!m.has("format") || m.at("format").str() != "kiln-package")
      throw std::runtime_error("manifest.json is not a kiln package manifest");
    int64_t schema = m.at("schema_version").integer();
    if (schema != kPackageSchemaVersion)
      throw std::runtime_error("manifest schema version " + std::to_string(schema) + "; this runner reads version " +
                               std::to_string(kPackageSchemaVersion) + " (rebuild the package or the program)");
    const std::string built = m.at("built_for").at("torch").str();
    // torch/version.h spells the release without the wheel's local tag ("2.15.0", not "2.15.0+cu132")
    if (built.substr(0, built.find('+')) != TORCH_VERSION)
      throw std::runtime_error("built for torch " + built + ", this program links torch " + TORCH_VERSION);
    const detail::Json& files = m.at("files");
    for (const auto& [name, rec] : files.fields)  // cubins: model.so reads them; checked here like the rest
      if (name != m.at("weights").str() && name != m.at("library").str()) {
        detail::MappedFile f(path_ + "/" + name);
        verify(files, name, f.data(), f.size());
      }
    const std::string built_on = m.at("device").str();
    device_ = resolve(built_on, device ? *device : c10::Device(built_on == "cuda" ? c10::kCUDA : c10::kCPU));
    if (m.at("built_for").has("cpu_flags")) {
      std::string missing = detail::missing_cpu_flags(m.at("built_for").at("cpu_flags"));
      if (!missing.empty())
        throw std::runtime_error("built on a CPU with instructions this one lacks (" + missing +
                                 "); rebuild the package on this machine");
    }
    for (const auto& j : m.at("inputs").array()) inputs_.push_back(detail::spec_of(j));
    for (const auto& j : m.at("outputs").array()) outputs_.push_back(detail::spec_of(j));
    for (const auto& j : m.at("sizes").array()) {
      SizeSpec z{j.at("symbol").str(), size_t(j.at("input").integer()), j.at("dim").integer(), j.at("min").integer(),
                 j.at("max").integer()};
      if (z.input >= inputs_.size() || z.dim < 0 || z.dim >= int64_t(inputs_[z.input].shape.size()))
        throw std::runtime_error("manifest.json: size " + z.symbol + " names no input dim");
      sizes_.push_back(z);
    }
    c10::OptionalDeviceGuard on_device;
    if (!device_.is_cpu()) on_device.reset_device(device_);
    load_weights(m, files);
    load_library(m, files);
  }

  void load_weights(const detail::Json& m, const detail::Json& files) {
    const std::string name = m.at("weights").str();
    weights_ = std::make_unique<detail::MappedFile>(path_ + "/" + name);
    verify(files, name, weights_->data(), weights_->size());
    if (weights_->size() < 8) throw std::runtime_error(name + " is too short for a safetensors file");
    uint64_t n = 0;
    std::memcpy(&n, weights_->data(), 8);  // little-endian header length
    if (n > weights_->size() - 8) throw std::runtime_error(name + ": header runs past the end of the file");
    detail::Json header = detail::parse_json(std::string(reinterpret_cast<char*>(weights_->data()) + 8, n));
    uint8_t* base = weights_->data() + 8 + n;
    size_t avail = weights_->size() - 8 - n;
    for (const auto& c : m.at("constants").array()) {
      const std::string cname = c.at("name").str();
      std::vector<int64_t> off = header.at(cname).at("data_offsets").ints();
      if (off.size() != 2 || off[0] < 0 || off[1] < off[0] || size_t(off[1]) > avail)
        throw std::runtime_error(name + ": tensor '" + cname + "' lies outside the file");
      if (device_.is_cpu()) {
        constants_.push_back(base + off[0]);
        continue;
      }
      const TensorSpec spec = detail::spec_of(c);
      at::Tensor host = at::from_blob(base + off[0], spec.shape, spec.stride, at::TensorOptions().dtype(spec.dtype));
      if (int64_t(host.nbytes()) != off[1] - off[0])
        throw std::runtime_error(name + ": tensor '" + cname + "' does not have the manifest's size");
      device_constants_.push_back(at::empty_strided(spec.shape, spec.stride, host.options().device(device_)));
      device_constants_.back().copy_(host);
      constants_.push_back(device_constants_.back().data_ptr());
    }
  }

  void load_library(const detail::Json& m, const detail::Json& files) {
    const std::string name = m.at("library").str();
    const std::string so = path_ + "/" + name;
    {
      detail::MappedFile bytes(so);
      verify(files, name, bytes.data(), bytes.size());
    }
    lib_ = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib_) throw std::runtime_error(std::string("cannot load ") + name + ": " + ::dlerror());
    auto abi = reinterpret_cast<int (*)()>(::dlsym(lib_, "kiln_model_abi_version"));
    auto init = reinterpret_cast<InitFn>(::dlsym(lib_, "kiln_model_init"));
    run_ = reinterpret_cast<RunFn>(::dlsym(lib_, "kiln_model_run"));
    if (!abi || !init || !run_) throw std::runtime_error(name + " is not a kiln model library");
    if (abi() != kModelAbiVersion || abi() != m.at("abi_version").integer())
      throw std::runtime_error(name + " has model ABI version " + std::to_string(abi()) + ", this runner calls version " +
                               std::to_string(kModelAbiVersion));
    char err[2048] = {0};
    if (init(path_.c_str(), int(device_.type()), device_.index(), err, sizeof(err)) != 0) throw std::runtime_error(err);
  }

  // model.so stays loaded: OpenMP's worker threads and ATen's registries may still point into it
  void close() {
    lib_ = nullptr;
    run_ = nullptr;
  }
};

}  // namespace kiln
