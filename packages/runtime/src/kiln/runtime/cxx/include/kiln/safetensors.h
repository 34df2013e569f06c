// Read a safetensors file into tensors (copies; for test data and tools: kiln::Runner maps its weights
// itself). kiln::read_safetensors("inputs.safetensors") -> name -> at::Tensor.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

#include "kiln/detail/json.h"
#include "kiln/runner.h"

namespace kiln {

inline at::ScalarType safetensors_dtype(const std::string& s) {
  static const std::pair<const char*, at::ScalarType> table[] = {
      {"F32", at::kFloat}, {"F64", at::kDouble}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
      {"I32", at::kInt},   {"I16", at::kShort},  {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool}};
  for (const auto& e : table)
    if (s == e.first) return e.second;
  throw std::runtime_error("unknown safetensors dtype '" + s + "'");
}

inline std::map<std::string, at::Tensor> read_safetensors(const std::string& path) {
  detail::MappedFile f(path);
  if (f.size() < 8) throw std::runtime_error(path + ": too short for a safetensors file");
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  if (n > f.size() - 8) throw std::runtime_error(path + ": header runs past the end of the file");
  detail::Json header = detail::parse_json(std::string(reinterpret_cast<char*>(f.data()) + 8, n));
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, entry] : header.fields) {
    if (name == "__metadata__") continue;
    std::vector<int64_t> off = entry.at("data_offsets").ints();
    at::Tensor t = at::empty(entry.at("shape").ints(), at::TensorOptions().dtype(safetensors_dtype(entry.at("dtype").str())));
    if (off.size() != 2 || off[1] - off[0] != int64_t(t.nbytes()) || size_t(off[1]) > f.size() - 8 - n)
      throw std::runtime_error(path + ": tensor '" + name + "' has bad data offsets");
    if (t.nbytes()) std::memcpy(t.data_ptr(), f.data() + 8 + n + off[0], t.nbytes());
    out[name] = t;
  }
  return out;
}

}  // namespace kiln
