// Reading diffusers/transformers config.json files (Torch-free). Every error is a ModelFileError
// naming the file and the key, so a broken model folder is reported as such.
//
// Configs come from the internet: every value is checked against a schema before any compute —
// its JSON type, that it fits the C++ type it is read into (no silent wrap of 2^31 to
// -2147483648), finiteness, and the range the model code supports (the overloads taking a
// ConfigRange). Loaders of new components should read every key through these.
#pragma once

#include <cmath>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/io/safetensors.h"  // ModelFileError

namespace dit {

/// Parses `file` as JSON (a regular file of at most 64 MiB, nested at most 64 deep) whose top
/// level is an object, as every diffusers / transformers config and index is. Throws
/// ModelFileError: "file is missing", "is a FIFO (named pipe), not a regular file", "cannot open
/// file", "config is not valid JSON: syntax error at byte N" (no file bytes quoted), "config is
/// not a JSON object (its top level is an array)" (a string, a number, null likewise: without
/// this an array would read as an object with no keys, i.e. every default).
nlohmann::json readConfigJson(const std::string& file);

/// Throws ModelFileError naming `file` when `j` is not a JSON object: "config is not a JSON
/// object (its top level is a number)". For config values that reach a parser other than through
/// readConfigJson (readConfigJson applies it itself).
void requireConfigObject(const nlohmann::json& j, const std::string& file);

/// What a config's own metadata says it is: when `j[key]` (`_class_name` for diffusers configs,
/// `model_type` for transformers ones) is a string outside `accepted`, throws ModelFileError
/// naming `file` and the declared value: "declares _class_name \"DDIMScheduler\", but this
/// component is read as FlowMatchEulerDiscreteScheduler" (several accepted names are joined with
/// " or "). An absent or null key passes: many configs in the wild carry no such key.
void requireDeclaredAs(const nlohmann::json& j, const char* key,
                       std::initializer_list<const char*> accepted, const std::string& file);

/// Inclusive range of a numeric config value.
struct ConfigRange {
  double lo, hi;
};

namespace detail {

template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};

inline std::string configNumberText(const nlohmann::json& v) {
  return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

[[noreturn]] inline void wrongConfigType(const char* key, const nlohmann::json& v,
                                         const std::string& file, const char* expected) {
  std::string text = configNumberText(v);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  throw ModelFileError(file, std::string("config key '") + key + "' has the wrong type: " + text +
                                 " (expected " + expected + ")");
}

// One JSON value into an arithmetic T: the JSON type must match, and the value must fit T.
template <typename T>
T configScalar(const nlohmann::json& v, const char* key, const std::string& file) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) wrongConfigType(key, v, file, "true or false");
    return v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) wrongConfigType(key, v, file, "an integer");
    const bool fits =
        v.is_number_unsigned()
            ? v.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<T>::max())
            : (v.get<std::int64_t>() >= static_cast<std::int64_t>(std::numeric_limits<T>::min()) &&
               (std::is_unsigned_v<T> ||
                v.get<std::int64_t>() <= static_cast<std::int64_t>(std::numeric_limits<T>::max())));
    if (!fits)
      throw ModelFileError(
          file, std::string("config key '") + key + "' is out of range: " + configNumberText(v));
    return static_cast<T>(v.is_number_unsigned() ? static_cast<T>(v.get<std::uint64_t>())
                                                 : static_cast<T>(v.get<std::int64_t>()));
  } else {
    static_assert(std::is_floating_point_v<T>);
    if (!v.is_number()) wrongConfigType(key, v, file, "a number");
    return static_cast<T>(v.get<double>());
  }
}

template <typename T>
void checkConfigRange(T x, const char* key, const std::string& file, ConfigRange r) {
  const double d = static_cast<double>(x);
  if (!std::isfinite(d) || d < r.lo || d > r.hi) {
    auto txt = [](double v) {
      char b[40];
      std::snprintf(b, sizeof b, "%.10g", v);
      return std::string(b);
    };
    throw ModelFileError(file, std::string("config key '") + key + "' must be in " + txt(r.lo) +
                                   " .. " + txt(r.hi) + ", got " + txt(d));
  }
}

}  // namespace detail

/// Sets `out` from `j[key]` when the key is present and not null (else leaves the default).
/// Throws ModelFileError naming `file`, the key and the value when it has the wrong type, or is
/// an integer that does not fit T.
template <typename T>
void getConfigValue(const nlohmann::json& j, const char* key, T& out, const std::string& file) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if constexpr (std::is_arithmetic_v<T>) {
    out = detail::configScalar<T>(*it, key, file);
  } else if constexpr (detail::IsVector<T>::value && std::is_arithmetic_v<typename T::value_type>) {
    if (!it->is_array()) detail::wrongConfigType(key, *it, file, "a list of numbers");
    T r;
    for (const auto& e : *it)
      r.push_back(detail::configScalar<typename T::value_type>(e, key, file));
    out = std::move(r);
  } else {
    try {
      out = it->template get<T>();
    } catch (const nlohmann::json::exception&) {
      detail::wrongConfigType(key, *it, file, "another type");
    }
  }
}

/// getConfigValue, then the value (each element of a list) must be finite and inside `range`
/// (also when the key is absent: the default is checked too). Throws ModelFileError "config key
/// 'num_layers' must be in 0 .. 1024, got -1".
template <typename T>
void getConfigValue(const nlohmann::json& j, const char* key, T& out, const std::string& file,
                    ConfigRange range) {
  getConfigValue(j, key, out, file);
  if constexpr (detail::IsVector<T>::value) {
    for (const auto& x : out) detail::checkConfigRange(x, key, file, range);
  } else {
    detail::checkConfigRange(out, key, file, range);
  }
}

}  // namespace dit
