// A small JSON reader for kiln package manifests (objects, arrays, strings, numbers, booleans, null).
// Why our own: libtorch ships no JSON library in its headers, and a manifest is a few kilobytes.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kiln {
namespace detail {

struct Json {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0;
  std::string text;  // a String's value, or a Number's spelling (exact integers)
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  bool has(const std::string& key) const { return kind == Kind::Object && fields.count(key) > 0; }

  const Json& at(const std::string& key) const {
    if (kind != Kind::Object) throw std::runtime_error("expected a JSON object holding '" + key + "'");
    auto it = fields.find(key);
    if (it == fields.end()) throw std::runtime_error("missing field '" + key + "'");
    return it->second;
  }
  const std::string& str() const {
    if (kind != Kind::String) throw std::runtime_error("expected a JSON string");
    return text;
  }
  int64_t integer() const {
    if (kind != Kind::Number) throw std::runtime_error("expected a JSON number");
    return std::strtoll(text.c_str(), nullptr, 10);
  }
  const std::vector<Json>& array() const {
    if (kind != Kind::Array) throw std::runtime_error("expected a JSON array");
    return items;
  }
  std::vector<int64_t> ints() const {
    std::vector<int64_t> out;
    for (const auto& v : array()) out.push_back(v.integer());
    return out;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}

  Json parse() {
    Json v = value();
    skip();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  const std::string& s_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("invalid JSON at byte " + std::to_string(i_) + ": " + what);
  }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  char peek() {
    skip();
    if (i_ >= s_.size()) fail("unexpected end");
    return s_[i_];
  }
  void expect(const char* word) {
    for (const char* c = word; *c; ++c, ++i_)
      if (i_ >= s_.size() || s_[i_] != *c) fail(std::string("expected ") + word);
  }
  Json value() {
    Json v;
    char c = peek();
    if (c == '{') {
      v.kind = Json::Kind::Object;
      ++i_;
      if (peek() == '}') { ++i_; return v; }
      while (true) {
        if (peek() != '"') fail("expected a key");
        std::string key = string();
        if (peek() != ':') fail("expected ':'");
        ++i_;
        v.fields[key] = value();
        char d = peek();
        ++i_;
        if (d == '}') return v;
        if (d != ',') fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.kind = Json::Kind::Array;
      ++i_;
      if (peek() == ']') { ++i_; return v; }
      while (true) {
        v.items.push_back(value());
        char d = peek();
        ++i_;
        if (d == ']') return v;
        if (d != ',') fail("expected ',' or ']'");
      }
    }
    if (c == '"') { v.kind = Json::Kind::String; v.text = string(); return v; }
    if (c == 't') { expect("true"); v.kind = Json::Kind::Bool; v.boolean = true; return v; }
    if (c == 'f') { expect("false"); v.kind = Json::Kind::Bool; return v; }
    if (c == 'n') { expect("null"); return v; }
    size_t start = i_;
    while (i_ < s_.size() && std::string("+-0123456789.eE").find(s_[i_]) != std::string::npos) ++i_;
    if (start == i_) fail("unexpected character");
    v.kind = Json::Kind::Number;
    v.text = s_.substr(start, i_ - start);
    v.number = std::strtod(v.text.c_str(), nullptr);
    return v;
  }
  std::string string() {
    ++i_;  // the opening quote
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') return out;
      if (c != '\\') { out += c; continue; }
      if (i_ >= s_.size()) fail("unterminated escape");
      char e = s_[i_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) fail("short \\u escape");
          unsigned code = std::stoul(s_.substr(i_, 4), nullptr, 16);
          i_ += 4;
          if (code < 0x80) out += char(code);
          else if (code < 0x800) { out += char(0xC0 | (code >> 6)); out += char(0x80 | (code & 0x3F)); }
          else { out += char(0xE0 | (code >> 12)); out += char(0x80 | ((code >> 6) & 0x3F)); out += char(0x80 | (code & 0x3F)); }
          break;
        }
        default: out += e;
      }
    }
  }
};

inline Json parse_json(const std::string& text) { return JsonParser(text).parse(); }

}  // namespace detail
}  // namespace kiln
