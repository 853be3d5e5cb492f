// Field access on apart's JSON files with errors that name the file, the field and the schema.
#include "simulator/json_reader.h"

#include <cmath>

#include "graph/error.h"

namespace apart::sim {

JsonReader::JsonReader(std::string source, std::string schema, std::string docs, Null null)
    : source_(std::move(source)), schema_(std::move(schema)), docs_(std::move(docs)), null_(null) {}

void JsonReader::fail(const std::string& field, const std::string& what) const {
  throw InvalidModel(source_ + ": " + field + " " + what + " (schema " + schema_ + ", " + docs_ +
                     "; re-run `apart partition` to regenerate the plan)");
}

bool JsonReader::has(const json& obj, const char* key) const {
  return obj.contains(key) && !(null_ == Null::kAbsent && obj[key].is_null());
}

const JsonReader::json& JsonReader::member(const json& obj, const std::string& path, const char* key) const {
  if (!obj.contains(key)) fail(path + key, "is missing");
  return obj[key];
}

const JsonReader::json& JsonReader::object(const json& obj, const std::string& path, const char* key) const {
  const json& v = member(obj, path, key);
  if (!v.is_object()) fail(path + key, "must be an object");
  return v;
}

const JsonReader::json& JsonReader::array(const json& obj, const std::string& path, const char* key) const {
  const json& v = member(obj, path, key);
  if (!v.is_array()) fail(path + key, "must be an array");
  return v;
}

double JsonReader::number(const json& obj, const std::string& path, const char* key) const {
  if (!has(obj, key)) fail(path + key, "is missing");
  const json& v = obj[key];
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
    fail(path + key, "must be a finite non-negative number");
  return v.get<double>();
}

std::optional<double> JsonReader::optional_number(const json& obj, const std::string& path, const char* key) const {
  if (!has(obj, key)) return std::nullopt;
  return number(obj, path, key);
}

int64_t JsonReader::integer(const json& value, const std::string& field, int64_t min) const {
  if (!value.is_number_integer() && !(value.is_number_float() && std::floor(value.get<double>()) == value.get<double>()))
    fail(field, "must be an integer");
  const double d = value.get<double>();
  if (d < static_cast<double>(min) || d > 9.0e15) fail(field, "must be at least " + std::to_string(min));
  return static_cast<int64_t>(d);
}

int64_t JsonReader::integer(const json& obj, const std::string& path, const char* key, int64_t min) const {
  if (!has(obj, key)) fail(path + key, "is missing");
  return integer(obj[key], path + key, min);
}

std::optional<int64_t> JsonReader::optional_integer(const json& obj, const std::string& path, const char* key,
                                                    int64_t min) const {
  if (!has(obj, key)) return std::nullopt;
  return integer(obj[key], path + key, min);
}

std::string JsonReader::string(const json& obj, const std::string& path, const char* key) const {
  if (!has(obj, key)) fail(path + key, "is missing");
  if (!obj[key].is_string()) fail(path + key, "must be a string");
  return obj[key].get<std::string>();
}

std::optional<std::string> JsonReader::optional_string(const json& obj, const std::string& path, const char* key) const {
  if (!has(obj, key)) return std::nullopt;
  return string(obj, path, key);
}

bool JsonReader::boolean(const json& obj, const std::string& path, const char* key, bool fallback) const {
  if (!obj.contains(key)) return fallback;
  if (!obj[key].is_boolean()) fail(path + key, "must be true or false");
  return obj[key].get<bool>();
}

}  // namespace apart::sim
