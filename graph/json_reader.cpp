// Field access on apart's JSON files with typed errors that name the file, the field, the range and the schema.
#include "graph/json_reader.h"

#include <cmath>

namespace apart {

JsonReader::JsonReader(std::string source, std::string schema, std::string docs, Null null, ErrorKind kind,
                       std::string fix)
    : source_(std::move(source)),
      schema_(std::move(schema)),
      docs_(std::move(docs)),
      null_(null),
      kind_(kind),
      fix_(std::move(fix)) {}

void JsonReader::fail(const std::string& field, const std::string& what) const {
  throw_error(kind_, source_ + ": " + field + " " + what + " (schema " + schema_ + ", " + docs_ +
                         (fix_.empty() ? "" : "; " + fix_) + ")");
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

double JsonReader::number(const json& obj, const std::string& path, const char* key, double max) const {
  if (!has(obj, key)) fail(path + key, "is missing");
  const json& v = obj[key];
  if (!v.is_number()) fail(path + key, "must be a finite number in " + range_text(0, max) + " (got a " + std::string(v.type_name()) + ")");
  const double d = v.get<double>();
  if (const std::string e = number_range_error(d, 0, max); !e.empty()) fail(path + key, e);
  return d;
}

std::optional<double> JsonReader::optional_number(const json& obj, const std::string& path, const char* key,
                                                  double max) const {
  if (!has(obj, key)) return std::nullopt;
  return number(obj, path, key, max);
}

double JsonReader::positive(const json& obj, const std::string& path, const char* key, double max) const {
  const double d = number(obj, path, key, max);
  if (d <= 0) fail(path + key, "must be a finite number in (0, " + range_text(0, max).substr(4) + " (got 0)");
  return d;
}

double JsonReader::seconds(const json& obj, const std::string& path, const char* key) const {
  return number(obj, path, key, limits::kMaxSeconds);
}
std::optional<double> JsonReader::optional_seconds(const json& obj, const std::string& path, const char* key) const {
  return optional_number(obj, path, key, limits::kMaxSeconds);
}
std::optional<double> JsonReader::optional_bytes(const json& obj, const std::string& path, const char* key) const {
  return optional_number(obj, path, key, limits::kMaxBytes);
}

int64_t JsonReader::integer_at(const json& value, const std::string& field, int64_t min, int64_t max) const {
  std::string e;
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    e = u > static_cast<uint64_t>(INT64_MAX) ? integer_range_error(value.get<double>(), min, max)
                                             : integer_range_error(static_cast<int64_t>(u), min, max);
    if (e.empty()) return static_cast<int64_t>(u);
  } else if (value.is_number_integer()) {
    e = integer_range_error(value.get<int64_t>(), min, max);
    if (e.empty()) return value.get<int64_t>();
  } else if (value.is_number_float()) {
    e = integer_range_error(value.get<double>(), min, max);
    if (e.empty()) return *to_int64(value.get<double>());
  } else {
    e = "must be an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "] (got a " +
        std::string(value.type_name()) + ")";
  }
  fail(field, e);
}

int64_t JsonReader::integer(const json& obj, const std::string& path, const char* key, int64_t min, int64_t max) const {
  if (!has(obj, key)) fail(path + key, "is missing");
  return integer_at(obj[key], path + key, min, max);
}

std::optional<int64_t> JsonReader::optional_integer(const json& obj, const std::string& path, const char* key,
                                                    int64_t min, int64_t max) const {
  if (!has(obj, key)) return std::nullopt;
  return integer_at(obj[key], path + key, min, max);
}

std::string JsonReader::string(const json& obj, const std::string& path, const char* key) const {
  if (!has(obj, key)) fail(path + key, "is missing");
  if (!obj[key].is_string()) fail(path + key, "must be a string (got a " + std::string(obj[key].type_name()) + ")");
  return obj[key].get<std::string>();
}

std::optional<std::string> JsonReader::optional_string(const json& obj, const std::string& path, const char* key) const {
  if (!has(obj, key)) return std::nullopt;
  return string(obj, path, key);
}

bool JsonReader::boolean(const json& obj, const std::string& path, const char* key, bool fallback) const {
  if (!obj.contains(key)) return fallback;
  if (!obj[key].is_boolean()) fail(path + key, "must be true or false (got a " + std::string(obj[key].type_name()) + ")");
  return obj[key].get<bool>();
}

}  // namespace apart
