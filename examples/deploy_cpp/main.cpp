// Run a kiln package from C++ (no Python in this process) and check it against expected outputs.
//
//   main [--cuda] [--tol T] PACKAGE INPUTS.safetensors [EXPECTED.safetensors|- [ITERATIONS]]
//   main [--cuda] PACKAGE --bad-inputs      (prints the runner's error for each kind of bad call)
//
// INPUTS holds input0, input1, ... and EXPECTED output0, output1, ... (export_models.py writes both).
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

static int bad_inputs(kiln::Runner& runner, c10::Device device) {
  const auto& specs = runner.input_specs();
  std::vector<at::Tensor> good;
  for (const auto& s : specs) good.push_back(at::zeros(s.shape, at::TensorOptions().dtype(s.dtype).device(device)));
  expect_error("count", [&] { runner.run({}); });
  expect_error("shape", [&] {
    auto v = good;
    std::vector<int64_t> shape = specs[0].shape;
    shape.push_back(1);
    v[0] = at::zeros(shape, at::TensorOptions().dtype(specs[0].dtype).device(device));
    runner.run(v);
  });
  expect_error("dtype", [&] {
    auto v = good;
    v[0] = at::zeros(specs[0].shape,
                     at::TensorOptions().dtype(specs[0].dtype == at::kDouble ? at::kFloat : at::kDouble).device(device));
    runner.run(v);
  });
  expect_error("device", [&] {
    auto v = good;
    v[0] = at::empty(specs[0].shape, at::TensorOptions().dtype(specs[0].dtype).device(at::kMeta));
    runner.run(v);
  });
  if (!device.is_cpu())  // a CPU tensor given to a CUDA package
    expect_error("other device", [&] {
      auto v = good;
      v[0] = at::zeros(specs[0].shape, at::TensorOptions().dtype(specs[0].dtype));
      runner.run(v);
    });
  runner.run(good);
  synchronize(device);
  std::printf("good: ok\n");
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
    auto named = kiln::read_safetensors(args[1]);
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < runner.input_specs().size(); ++i)
      inputs.push_back(named.at("input" + std::to_string(i)).to(device));
    synchronize(device);
    auto t1 = std::chrono::steady_clock::now();
    std::vector<at::Tensor> outputs = runner.run(inputs);
    synchronize(device);
    double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    std::printf("load_ms %.2f first_run_ms %.2f\n", load_ms, first_ms);
    int status = 0;
    if (args.size() > 2 && args[2] != "-") {  // "-": no check (timing only)
      auto expected = kiln::read_safetensors(args[2]);
      for (size_t k = 0; k < outputs.size(); ++k) {
        at::Tensor want = expected.at("output" + std::to_string(k)).to(at::kDouble);
        at::Tensor got = outputs[k].to(c10::Device(c10::kCPU)).to(at::kDouble);  // expected is read on the CPU
        double err = at::sub(got, want).abs().max().item().toDouble();
        double scale = want.abs().max().item().toDouble();
        bool ok = err <= tol + tol * scale;
        std::printf("output%zu shape %s max_abs_err %.3g (max |expected| %.3g) %s\n", k,
                    kiln::detail::dims(got.sizes()).c_str(), err, scale, ok ? "ok" : "MISMATCH");
        if (!ok) status = 1;
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
