// Helpers shared by tests that compare against the diffusers goldens.
#pragma once

#include <ATen/ATen.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/io/safetensors.h"
#include "backend/io/tensor_io.h"

namespace dit::test {

inline const std::string& fixtureDir() {
  static const std::string d = DITSTUDIO_FIXTURE;
  return d;
}

inline const SafetensorsCollection& goldens() {
  static SafetensorsCollection g(fixtureDir() + "/golden/golden.safetensors");
  return g;
}

inline at::Tensor golden(const std::string& name) {
  const auto& info = goldens().info(name);
  return loadTensor(goldens(), name, info.dtype == DType::I64 ? at::kLong : at::kFloat);
}

inline const nlohmann::json& goldenJson() {
  static nlohmann::json j = [] {
    std::ifstream in(fixtureDir() + "/golden/golden.json");
    return nlohmann::json::parse(in);
  }();
  return j;
}

inline double maxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat).cpu() - b.to(at::kFloat).cpu()).abs().max().item<double>();
}

}  // namespace dit::test
