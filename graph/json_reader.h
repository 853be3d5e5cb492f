// Field access on apart's JSON files (plan.json, costs.json, baselines.json, cluster files, checkpoint headers) with
// typed errors that name the file, the field path, the accepted range and the schema:
// "p.json: stages[1].forward_s must be a finite number in [0, 32000000] (got 1e+308) (schema apart.plan/1, ...)".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "graph/checked.h"
#include "graph/error.h"

namespace apart {

class JsonReader {
 public:
  using json = nlohmann::json;
  // How a null number, integer or string reads: as a value of the wrong type, or as an absent field (the report
  // reads figures that partition could not compute, written as null).
  enum class Null { kInvalid, kAbsent };
  // Integers without a tighter cap: every one a double holds exactly (2^53).
  static constexpr int64_t kMaxInteger = int64_t{1} << 53;

  // `docs` is the page that documents the schema ("docs/simulator.md"); errors are of `kind` and end with `fix`.
  JsonReader(std::string source, std::string schema, std::string docs, Null null = Null::kInvalid,
             ErrorKind kind = ErrorKind::kInvalidModel,
             std::string fix = "re-run `apart partition` to regenerate the plan");

  [[noreturn]] void fail(const std::string& field, const std::string& what) const;

  // Each reader takes the object, the path to it ("stages[1]." or "" at the top) and the key.
  const json& member(const json& obj, const std::string& path, const char* key) const;
  const json& object(const json& obj, const std::string& path, const char* key) const;
  const json& array(const json& obj, const std::string& path, const char* key) const;

  // A finite number in [0, max]; the optional_ forms give nullopt for an absent field.
  double number(const json& obj, const std::string& path, const char* key, double max) const;
  std::optional<double> optional_number(const json& obj, const std::string& path, const char* key, double max) const;
  // A finite number in (0, max]: a rate, a capacity.
  double positive(const json& obj, const std::string& path, const char* key, double max) const;
  // A time in seconds, [0, limits::kMaxSeconds]; a size in bytes, [0, limits::kMaxBytes].
  double seconds(const json& obj, const std::string& path, const char* key) const;
  std::optional<double> optional_seconds(const json& obj, const std::string& path, const char* key) const;
  std::optional<double> optional_bytes(const json& obj, const std::string& path, const char* key) const;
  // An integer (an integral float counts) in [min, max].
  int64_t integer_at(const json& value, const std::string& field, int64_t min, int64_t max = kMaxInteger) const;
  int64_t integer(const json& obj, const std::string& path, const char* key, int64_t min,
                  int64_t max = kMaxInteger) const;
  std::optional<int64_t> optional_integer(const json& obj, const std::string& path, const char* key, int64_t min,
                                          int64_t max = kMaxInteger) const;
  std::string string(const json& obj, const std::string& path, const char* key) const;
  std::optional<std::string> optional_string(const json& obj, const std::string& path, const char* key) const;
  bool boolean(const json& obj, const std::string& path, const char* key, bool fallback) const;

 private:
  bool has(const json& obj, const char* key) const;

  std::string source_;
  std::string schema_;
  std::string docs_;
  Null null_;
  ErrorKind kind_;
  std::string fix_;
};

}  // namespace apart
