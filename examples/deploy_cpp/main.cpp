// Run a kiln package from C++ (no Python in this process) and check it against expected outputs.
//
//   main [--cuda] [--tol T] PACKAGE INPUTS.safetensors [EXPECTED.safetensors|- [ITERATIONS]]
//   main [--cuda] PACKAGE --bad-inputs      (prints the runner's error for each kind of bad call)
//   main [--cuda] PACKAGE --shapes 2x3x33x47 ...   (runs zeros of these shapes, one per input: prints the
//                                                  output shapes, or the runner's error and exits 3)
//
// INPUTS holds input0, input1, ... and EXPECTED output0, output1, ... (export_models.py writes both); a
// package exported with dynamic shapes is checked at more sizes: case1/input0, case1/output0, ... too.
// --cuda runs the package on the current CUDA device (a package built with device="cuda"; build this
// program with `python -m kiln.runtime.cxx --cuda --cflags --ldflags`): inputs are copied there first.
// Prints the largest error against EXPECTED (ok within T relative to max |expected|, plus T absolute;
// default 1e-4), the latency of run() (median of ITERATIONS, the device synchronized after each), and
// whether any libpython is mapped into this process (read from /proc/self/maps).
#include <kiln/runner.h>
#include <kiln/safetensors.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <ATen/ops/abs.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

static bool python_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("libpython") != std::string::npos) return true;
  return false;
}

static void expect_error(const char* what, const std::function<void()>& f) {
  try {
    f();
    std::printf("%s: NO ERROR\n", what);
  } catch (const std::runtime_error& e) {
    std::printf("%s: %s\n", what, e.what());
  }
}

// Wait for the device's queued work (CUDA launches return at once); nothing to do on CPU.
static void synchronize(c10::Device device) {
  if (!device.is_cpu()) c10::impl::getDeviceGuardImpl(device.type())->synchronizeDevice(device.index());
}

// Each input's shape at the smallest sizes the package serves (a symbolic dim: its range's min).
static std::vector<std::vector<int64_t>> smallest_shapes(const kiln::Runner& runner) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& s : runner.input_specs()) out.push_back(s.shape);
  for (const auto& z : runner.size_specs()) out[z.input][z.dim] = z.min;
  std::map<std::string, int64_t> named;  // dims named by one symbol have one size
  for (size_t i = 0; i < out.size(); ++i)
    for (size_t d = 0; d < runner.input_specs()[i].symbols.size(); ++d) {
      const std::string& sym = runner.input_specs()[i].symbols[d];
      if (!sym.empty()) out[i][d] = named.emplace(sym, out[i][d]).first->second;
    }
  return out;
}

static int bad_inputs(kiln::Runner& runner, c10::Device device) {
  const auto& specs = runner.input_specs();
  const auto shapes = smallest_shapes(runner);
  std::vector<at::Tensor> good;
  for (size_t i = 0; i < specs.size(); ++i)
    good.push_back(at::zeros(shapes[i], at::TensorOptions().dtype(specs[i].dtype).device(device)));
  auto with = [&](size_t i, std::vector<int64_t> shape) {
    auto v = good;
    v[i] = at::zeros(shape, at::TensorOptions().dtype(specs[i].dtype).device(device));
    return v;
  };
  expect_error("count", [&] { runner.run({}); });
  expect_error("shape", [&] {
    std::vector<int64_t> shape = shapes[0];
    shape.push_back(1);
    runner.run(with(0, shape));
  });
  expect_error("dtype", [&] {
    auto v = good;
    v[0] = at::zeros(shapes[0],
                     at::TensorOptions().dtype(specs[0].dtype == at::kDouble ? at::kFloat : at::kDouble).device(device));
    runner.run(v);
  });
  expect_error("device", [&] {
    auto v = good;
    v[0] = at::empty(shapes[0], at::TensorOptions().dtype(specs[0].dtype).device(at::kMeta));
    runner.run(v);
  });
  if (!device.is_cpu())  // a CPU tensor given to a CUDA package
    expect_error("other device", [&] {
      auto v = good;
      v[0] = at::zeros(shapes[0], at::TensorOptions().dtype(specs[0].dtype));
      runner.run(v);
    });
  if (!runner.size_specs().empty()) {  // dynamic shapes: a size past its range, and two related sizes that differ
    const auto& z = runner.size_specs()[0];
    expect_error("range", [&] {
      auto shape = shapes[z.input];
      shape[z.dim] = z.max + 1;
      runner.run(with(z.input, shape));
    });
    std::map<std::string, bool> named;  // the second dim named by a symbol, grown by one
    bool shown = false;
    for (size_t i = 0; i < specs.size() && !shown; ++i)
      for (size_t d = 0; d < specs[i].symbols.size() && !shown; ++d) {
        const std::string& sym = specs[i].symbols[d];
        if (sym.empty() || named.emplace(sym, true).second) continue;
        shown = true;
        expect_error("relation", [&] {
          auto shape = shapes[i];
          shape[d] += 1;
          runner.run(with(i, shape));
        });
      }
  }
  runner.run(good);
  synchronize(device);
  std::printf("good: ok\n");
  return 0;
}

static std::vector<int64_t> parse_shape(const std::string& text) {  // "2x3x33x47"
  std::vector<int64_t> shape;
  size_t at = 0;
  while (at <= text.size()) {
    size_t x = text.find('x', at);
    shape.push_back(std::stoll(text.substr(at, x == std::string::npos ? std::string::npos : x - at)));
    if (x == std::string::npos) break;
    at = x + 1;
  }
  return shape;
}

static int run_shapes(kiln::Runner& runner, c10::Device device, const std::vector<std::string>& shapes) {
  std::vector<at::Tensor> inputs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    at::ScalarType dtype = i < runner.input_specs().size() ? runner.input_specs()[i].dtype : at::kFloat;
    inputs.push_back(at::zeros(parse_shape(shapes[i]), at::TensorOptions().dtype(dtype).device(device)));
  }
  std::vector<at::Tensor> outputs = runner.run(inputs);
  synchronize(device);
  for (size_t k = 0; k < outputs.size(); ++k)
    std::printf("output%zu shape %s\n", k, kiln::detail::dims(outputs[k].sizes()).c_str());
  return 0;
}

int main(int argc, char** argv) {
  std::vector<std::string> args;
  c10::Device device = c10::kCPU;
  double tol = 1e-4;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--cuda") device = c10::Device(c10::kCUDA);
    else if (a == "--tol" && i + 1 < argc) tol = std::atof(argv[++i]);
    else args.push_back(a);
  }
  if (args.size() < 2) {
    std::fprintf(stderr, "usage: %s [--cuda] [--tol T] PACKAGE INPUTS.safetensors [EXPECTED.safetensors [ITERATIONS]]\n",
                 argv[0]);
    return 2;
  }
  try {
    auto t0 = std::chrono::steady_clock::now();
    kiln::Runner runner(args[0], device);
    double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    device = runner.device();
    if (args[1] == "--bad-inputs") return bad_inputs(runner, device);
    if (args[1] == "--shapes") return run_shapes(runner, device, std::vector<std::string>(args.begin() + 2, args.end()));
    auto named = kiln::read_safetensors(args[1]);
    auto case_inputs = [&](const std::string& prefix) {
      std::vector<at::Tensor> v;
      for (size_t i = 0; i < runner.input_specs().size(); ++i)
        v.push_back(named.at(prefix + "input" + std::to_string(i)).to(device));
      return v;
    };
    std::vector<at::Tensor> inputs = case_inputs("");
    synchronize(device);
    auto t1 = std::chrono::steady_clock::now();
    std::vector<at::Tensor> outputs = runner.run(inputs);
    synchronize(device);
    double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    std::printf("load_ms %.2f first_run_ms %.2f\n", load_ms, first_ms);
    int status = 0;
    if (args.size() > 2 && args[2] != "-") {  // "-": no check (timing only)
      auto expected = kiln::read_safetensors(args[2]);
      for (int c = 0;; ++c) {  // case 0, then case1/, case2/, ... while the files hold them
        std::string prefix = c == 0 ? "" : "case" + std::to_string(c) + "/";
        if (c > 0 && !named.count(prefix + "input0")) break;
        if (c > 0) outputs = runner.run(case_inputs(prefix));
        for (size_t k = 0; k < outputs.size(); ++k) {
          at::Tensor want = expected.at(prefix + "output" + std::to_string(k)).to(at::kDouble);
          at::Tensor got = outputs[k].to(c10::Device(c10::kCPU)).to(at::kDouble);  // expected is read on the CPU
          double err = at::sub(got, want).abs().max().item().toDouble();
          double scale = want.abs().max().item().toDouble();
          bool ok = got.sizes() == want.sizes() && err <= tol + tol * scale;
          std::printf("%soutput%zu shape %s max_abs_err %.3g (max |expected| %.3g) %s\n", prefix.c_str(), k,
                      kiln::detail::dims(got.sizes()).c_str(), err, scale, ok ? "ok" : "MISMATCH");
          if (!ok) status = 1;
        }
      }
    }
    int iters = args.size() > 3 ? std::atoi(args[3].c_str()) : 0;
    if (iters > 0) {
      std::vector<double> ms;
      for (int i = 0; i < iters; ++i) {
        auto a = std::chrono::steady_clock::now();
        runner.run(inputs);
        synchronize(device);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
      }
      std::sort(ms.begin(), ms.end());
      std::printf("latency_ms median %.4f min %.4f over %d runs\n", ms[ms.size() / 2], ms[0], iters);
    }
    std::printf("libpython mapped: %s\n", python_mapped() ? "yes" : "no");
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }
}
