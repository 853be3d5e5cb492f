// Field access on apart's JSON files (plan.json, costs.json, baselines.json) with InvalidModel errors that name
// the file, the field path and the schema: "p.json: stages[1].forward_s is missing (schema apart.plan/1, ...)".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace apart::sim {

class JsonReader {
 public:
  using json = nlohmann::json;
  // How a null number, integer or string reads: as a value of the wrong type, or as an absent field (the report
  // reads figures that partition could not compute, written as null).
  enum class Null { kInvalid, kAbsent };

  // `docs` is the page that documents the schema ("docs/simulator.md").
  JsonReader(std::string source, std::string schema, std::string docs, Null null = Null::kInvalid);

  [[noreturn]] void fail(const std::string& field, const std::string& what) const;

  // Each reader takes the object, the path to it ("stages[1]." or "" at the top) and the key.
  const json& member(const json& obj, const std::string& path, const char* key) const;
  const json& object(const json& obj, const std::string& path, const char* key) const;
  const json& array(const json& obj, const std::string& path, const char* key) const;

  // A finite non-negative number; the optional_ forms give nullopt for an absent field.
  double number(const json& obj, const std::string& path, const char* key) const;
  std::optional<double> optional_number(const json& obj, const std::string& path, const char* key) const;
  // An integer (an integral float counts) of at least `min`.
  int64_t integer(const json& value, const std::string& field, int64_t min) const;
  int64_t integer(const json& obj, const std::string& path, const char* key, int64_t min) const;
  std::optional<int64_t> optional_integer(const json& obj, const std::string& path, const char* key, int64_t min) const;
  std::string string(const json& obj, const std::string& path, const char* key) const;
  std::optional<std::string> optional_string(const json& obj, const std::string& path, const char* key) const;
  bool boolean(const json& obj, const std::string& path, const char* key, bool fallback) const;

 private:
  bool has(const json& obj, const char* key) const;

  std::string source_;
  std::string schema_;
  std::string docs_;
  Null null_;
};

}  // namespace apart::sim
