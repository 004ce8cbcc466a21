// A request means one thing everywhere: one table of request cases over the four families
// (defaults, size rules with and without an init image, guidance and CFG rules including the
// distilled FLUX.2 [klein] with a negative prompt and true_cfg_scale > 1, each knob at, inside
// and outside its range, unknown knobs), each run through every front end that checks requests:
//  - the family's declared request resolved directly (resolveRequest over requestSpecOf);
//  - the worker's input: the request through the protocol's JSON (toJson / paramsFromJson, the
//    line a worker reads) and resolved as the worker resolves it (requestValues);
//  - the GUI's live validation (dit::ui::validate with the window's ModelInfo);
//  - the CLI's pre-check (`ditstudio-cli --check`, the real binary, its JSON verdict);
//  - the worker itself (a real `ditstudio-worker` group per family and cfg degree, the refused
//    cases as request lines: each `error` event carries the resolve's message; the accepted ones
//    run through the worker in the golden and strategy tests).
// Every front end must give the same verdict and name the same field (and the same message).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "app/common/request_values.h"
#include "app/protocol/protocol.h"
#include "backend/io/model_folder.h"
#include "backend/io/png_io.h"
#include "backend/models/family_registry.h"
#include "ui/model_info.h"
#include "ui/validation.h"

using namespace dit;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

fs::path workDir() {
  static const fs::path d = [] {
    fs::path p =
        fs::temp_directory_path() / ("ditstudio-request-cases-" + std::to_string(getpid()));
    fs::remove_all(p);
    fs::create_directories(p);
    return p;
  }();
  return d;
}

std::string data(const std::string& name) { return std::string(DITSTUDIO_TEST_DATA) + "/" + name; }

// A FLUX.2 [klein] folder that declares itself step-wise distilled (model_index.json
// is_distilled true): the fixture copied with that one field changed.
std::string distilledKlein() {
  static const std::string path = [] {
    const fs::path dst = workDir() / "tiny-flux2-distilled";
    fs::copy(data("tiny-flux2-A"), dst, fs::copy_options::recursive);
    std::ifstream in(dst / "model_index.json");
    json j = json::parse(in);
    in.close();
    j["is_distilled"] = true;
    std::ofstream(dst / "model_index.json") << j.dump(2);
    return dst.string();
  }();
  return path;
}

// A 64x48 RGB PNG for the init-image cases.
std::string initImage() {
  static const std::string path = [] {
    const fs::path p = workDir() / "init-64x48.png";
    std::vector<uint8_t> rgb(64 * 48 * 3);
    for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 7);
    writePng(p.string(), rgb.data(), 64, 48, {});
    return p.string();
  }();
  return path;
}

struct Case {
  const char* name;
  std::string model;  ///< fixture folder
  json request;       ///< the protocol's keys; "init_image": true = the 64x48 PNG
  int cfg_degree = 1;
  /// Expected: "" = accepted; else the field the refusal names.
  std::string refused_field;
  std::string refused_rule;
  json expect = json::object();  ///< accepted: width/height/steps/cfg/options it resolves to
  std::string note;              ///< accepted: a note that must be given ("" = none checked)
};

// The table leaves the trailing members of a row at their defaults (accepted rows name no field).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
std::vector<Case> cases() {
  const std::string flux = data("tiny-flux-A"), klein = data("tiny-flux2-A"),
                    zimage = data("tiny-zimage-A"), qwen = data("tiny-qwenimage-A");
  return {
      // FLUX.1: refuse sizes off the multiple (vae_scale_factor 2 -> 4), true CFG with a negative.
      {"flux_defaults", flux, json::object(), 1, "", "", {{"steps", 28}, {"cfg", false}}},
      {"flux_size_not_multiple", flux, {{"width", 63}, {"height", 64}}, 1, "width", "multiple"},
      {"flux_size_multiple",
       flux,
       {{"width", 64}, {"height", 64}},
       1,
       "",
       "",
       {{"width", 64}, {"height", 64}}},
      {"flux_true_cfg",
       flux,
       {{"negative_prompt", "blurry"}, {"options", {{"true_cfg_scale", 4.0}}}},
       1,
       "",
       "",
       {{"cfg", true}}},
      {"flux_true_cfg_without_negative",
       flux,
       {{"options", {{"true_cfg_scale", 4.0}}}},
       1,
       "",
       "",
       {{"cfg", false}}},
      {"flux_cfg_parallel_without_cfg",
       flux,
       {{"options", {{"true_cfg_scale", 4.0}}}},
       2,
       "strategy",
       "cfg_true_cfg"},
      {"flux_cfg_parallel_with_true_cfg",
       flux,
       {{"negative_prompt", ""}, {"options", {{"true_cfg_scale", 4.0}}}},
       2,
       "",
       "",
       {{"cfg", true}}},
      {"flux_unknown_knob",
       flux,
       {{"options", {{"cfg_truncation", 0.5}}}},
       1,
       "cfg_truncation",
       "unknown"},
      {"flux_text_too_long",
       flux,
       {{"max_sequence_length", 600}},
       1,
       "max_sequence_length",
       "range"},
      {"flux_init_image_sets_size",
       flux,
       {{"init_image", true}},
       1,
       "",
       "",
       {{"width", 64}, {"height", 48}}},
      {"flux_init_image_given_size",
       flux,
       {{"init_image", true}, {"width", 32}, {"height", 32}},
       1,
       "",
       "",
       {{"width", 32}, {"height", 32}}},
      {"klein_too_small", klein, {{"width", 4}, {"height", 64}}, 1, "width", "min_side"},
      // int(4 - 4e-17) = 4: no step would run (diffusers raises too).
      {"flux_strength_runs_no_step",
       flux,
       {{"init_image", true}, {"strength", 1e-17}, {"steps", 4}},
       1,
       "strength",
       "strength_steps"},
      // FLUX.2 [klein] base: sizes floored to 8, classic CFG on guidance > 1, the output is the
      // init image's size whatever width/height say.
      {"klein_defaults",
       klein,
       json::object(),
       1,
       "",
       "",
       {{"steps", 50}, {"width", 512}, {"height", 512}, {"cfg", true}}},
      {"klein_size_floored",
       klein,
       {{"width", 63}, {"height", 64}},
       1,
       "",
       "",
       {{"width", 56}, {"height", 64}},
       "floored"},
      {"klein_guidance_1_no_cfg_parallel",
       klein,
       {{"guidance", 1.0}},
       2,
       "strategy",
       "cfg_true_cfg"},
      {"klein_init_image_overrides_size",
       klein,
       {{"init_image", true}, {"width", 32}, {"height", 32}},
       1,
       "",
       "",
       {{"width", 64}, {"height", 48}}},
      {"klein_unknown_knob", klein, {{"options", {{"foo", 1.0}}}}, 1, "foo", "unknown"},
      // FLUX.2 [klein] distilled: no CFG at all; a negative prompt with true_cfg_scale > 1 is
      // ignored (a note) and cannot make cfg_degree 2 useful.
      {"klein_distilled_negative_true_cfg_cfg2",
       distilledKlein(),
       {{"negative_prompt", "blurry"}, {"options", {{"true_cfg_scale", 4.0}}}},
       2,
       "strategy",
       "cfg_true_cfg"},
      {"klein_distilled_negative_true_cfg",
       distilledKlein(),
       {{"negative_prompt", "blurry"}, {"options", {{"true_cfg_scale", 4.0}}}},
       1,
       "",
       "",
       {{"cfg", false}},
       "true_cfg_scale is ignored"},
      {"klein_distilled_guidance",
       distilledKlein(),
       {{"guidance", 4.0}},
       1,
       "",
       "",
       {{"cfg", false}},
       "guidance is ignored"},
      // Z-Image: refuse sizes off 16, CFG on guidance > 0, its two knobs.
      {"zimage_defaults",
       zimage,
       json::object(),
       1,
       "",
       "",
       {{"steps", 50},
        {"width", 1024},
        {"height", 1024},
        {"cfg", true},
        {"options", {{"cfg_truncation", 1.0}, {"cfg_normalization", 0.0}, {"shift", 3.0}}}}},
      {"zimage_guidance_0", zimage, {{"guidance", 0.0}}, 1, "", "", {{"cfg", false}}},
      {"zimage_truncation_inside",
       zimage,
       {{"options", {{"cfg_truncation", 0.5}}}},
       1,
       "",
       "",
       {{"options", {{"cfg_truncation", 0.5}, {"cfg_normalization", 0.0}, {"shift", 3.0}}}}},
      {"zimage_truncation_at_max",
       zimage,
       {{"options", {{"cfg_truncation", 100.0}}}},
       1,
       "",
       "",
       {{"options", {{"cfg_truncation", 100.0}, {"cfg_normalization", 0.0}, {"shift", 3.0}}}}},
      {"zimage_truncation_above",
       zimage,
       {{"options", {{"cfg_truncation", 101.0}}}},
       1,
       "cfg_truncation",
       "range"},
      {"zimage_normalization_below",
       zimage,
       {{"options", {{"cfg_normalization", -1.0}}}},
       1,
       "cfg_normalization",
       "range"},
      {"zimage_normalization_at_min",
       zimage,
       {{"options", {{"cfg_normalization", 0.0}}}},
       1,
       "",
       ""},
      // The scheduler's shift: (0, 100], its default the folder's scheduler_config.json value.
      {"zimage_shift_inside",
       zimage,
       {{"options", {{"shift", 6.0}}}},
       1,
       "",
       "",
       {{"options", {{"cfg_truncation", 1.0}, {"cfg_normalization", 0.0}, {"shift", 6.0}}}}},
      {"zimage_shift_at_max", zimage, {{"options", {{"shift", 100.0}}}}, 1, "", ""},
      {"zimage_shift_zero", zimage, {{"options", {{"shift", 0.0}}}}, 1, "shift", "range"},
      {"zimage_shift_on_flux", flux, {{"options", {{"shift", 6.0}}}}, 1, "shift", "unknown"},
      {"zimage_unknown_knob", zimage, {{"options", {{"true_cfg", 2.0}}}}, 1, "true_cfg", "unknown"},
      {"zimage_size_not_multiple", zimage, {{"width", 60}, {"height", 64}}, 1, "width", "multiple"},
      {"zimage_no_img2img", zimage, {{"init_image", true}}, 1, "init_image", "capability"},
      // Qwen-Image: floors sizes to 16, true CFG with a negative, 1024 text tokens at most.
      {"qwen_defaults", qwen, json::object(), 1, "", "", {{"steps", 50}, {"cfg", false}}},
      {"qwen_true_cfg",
       qwen,
       {{"negative_prompt", "x"}, {"options", {{"true_cfg_scale", 4.0}}}},
       1,
       "",
       "",
       {{"cfg", true}}},
      // QwenImagePipeline's true_cfg_scale defaults to 4: a negative prompt alone turns it on.
      {"qwen_negative_alone_true_cfg_default",
       qwen,
       {{"negative_prompt", "x"}},
       1,
       "",
       "",
       {{"cfg", true}}},
      {"qwen_guidance_ignored",
       qwen,
       {{"guidance", 4.0}},
       1,
       "",
       "",
       {{"cfg", false}},
       "guidance is ignored"},
      {"qwen_size_floored",
       qwen,
       {{"width", 70}, {"height", 64}},
       1,
       "",
       "",
       {{"width", 64}, {"height", 64}}},
      {"qwen_text_too_long",
       qwen,
       {{"max_sequence_length", 2000}},
       1,
       "max_sequence_length",
       "range"},
      {"qwen_cfg_parallel_without_negative",
       qwen,
       {{"options", {{"true_cfg_scale", 4.0}}}},
       2,
       "strategy",
       "cfg_true_cfg"},
  };
}
#pragma GCC diagnostic pop

// The case's request as the protocol holds it.
protocol::GenerationParams params(const Case& c) {
  json j = c.request;
  if (j.contains("init_image") && j["init_image"].is_boolean()) j["init_image"] = initImage();
  if (!j.contains("prompt")) j["prompt"] = "a cat";
  return protocol::paramsFromJson(j);
}

std::set<std::string> givenKeys(const Case& c) {
  std::set<std::string> g;
  for (auto it = c.request.begin(); it != c.request.end(); ++it) g.insert(it.key());
  return g;
}

Strategy strategy(const Case& c) {
  Strategy s;
  s.world = s.cfg_degree = c.cfg_degree;
  return s;
}

// One front end's verdict: accepted (with the resolved values) or the first problem.
struct Verdict {
  bool ok = false;
  std::string field, rule, message;
  json values = json::object();
  std::vector<std::string> notes;
};

Verdict fromResolved(const ResolvedRequest& r, const Case& c, const ModelFolder& m) {
  Verdict v;
  std::vector<RequestProblem> problems = r.problems;
  if (r.ok() && c.cfg_degree > 1)
    for (const RequestProblem& p : strategyProblems(strategy(c), m.dims(), r))
      problems.push_back(p);
  v.ok = problems.empty();
  if (!v.ok) {
    v.field = problems.front().field;
    v.rule = problems.front().rule;
    v.message = problems.front().message;
    return v;
  }
  v.values = {{"width", r.values.width},
              {"height", r.values.height},
              {"steps", r.values.steps},
              {"cfg", r.cfg},
              {"options", r.values.options}};
  v.notes = r.notes;
  return v;
}

// 1. The family's declared request, resolved directly.
Verdict direct(const Case& c, const ModelFolder& m) {
  return fromResolved(resolveRequest(requestSpecOf(m), requestValues(params(c), givenKeys(c))), c,
                      m);
}

// 2. The worker's input: the request line's JSON, parsed back, resolved as the worker does.
Verdict throughProtocol(const Case& c, const ModelFolder& m) {
  const json line = protocol::toJson(params(c));
  const protocol::GenerationParams back = protocol::paramsFromJson(json::parse(line.dump()));
  return fromResolved(resolveRequest(requestSpecOf(m), requestValues(back, givenKeys(c))), c, m);
}

// 3. The GUI's live validation (request issues: the problems' messages).
std::vector<std::string> guiIssues(const Case& c) {
  const ui::ModelInfo info = ui::readModelInfo(QString::fromStdString(c.model));
  EXPECT_TRUE(info.ok) << info.error.toStdString();
  const protocol::GenerationParams p = params(c);
  const ui::Validation v = ui::validate(strategy(c), info, p, 0);
  std::vector<std::string> out;
  for (const QString& s : v.startIssues) out.push_back(s.toStdString());
  for (const QString& s : v.requestIssues) out.push_back(s.toStdString());
  return out;
}

// 4. The CLI's pre-check: `ditstudio-cli --check` with the case as flags.
json cliCheck(const Case& c, std::string& log) {
  const protocol::GenerationParams p = params(c);
  std::string args = " --model '" + c.model + "' --prompt 'a cat' --output '" +
                     (workDir() / (std::string(c.name) + ".png")).string() + "' --check";
  const json& r = c.request;
  for (auto it = r.begin(); it != r.end(); ++it) {
    const std::string& k = it.key();
    if (k == "options") {
      for (auto o = it->begin(); o != it->end(); ++o) args += " --set " + o.key() + "=" + o->dump();
    } else if (k == "init_image") {
      args += " --init-image '" + initImage() + "'";
    } else if (it->is_string()) {
      std::string flag = "--" + k;
      std::replace(flag.begin(), flag.end(), '_', '-');
      args += " " + flag + " '" + it->get<std::string>() + "'";
    } else {
      std::string flag = "--" + k;
      std::replace(flag.begin(), flag.end(), '_', '-');
      args += " " + flag + " " + it->dump();
    }
  }
  if (c.cfg_degree > 1) args += " --cfg-degree " + std::to_string(c.cfg_degree);
  const std::string cmd = std::string(DITSTUDIO_CLI) + args + " 2>&1";
  log.clear();
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return json();
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) log.append(buf, n);
  pclose(f);
  // The verdict is the last line that is a JSON object.
  json verdict;
  size_t pos = 0;
  while (pos < log.size()) {
    const size_t end = log.find('\n', pos);
    const std::string line =
        log.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (!line.empty() && line[0] == '{') verdict = json::parse(line, nullptr, false);
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return verdict;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// One worker group on `model` (np = cfg_degree) given `requests` (generate lines) and shutdown;
// returns the error message of each request id it refused.
std::map<std::string, std::string> workerErrors(const std::string& model, int cfgDegree,
                                                const std::vector<json>& requests,
                                                const std::string& name, std::string& log) {
  const fs::path in = workDir() / (name + ".requests"), out = workDir() / (name + ".log");
  {
    std::ofstream f(in);
    for (const json& r : requests) f << r.dump() << "\n";
    f << R"({"type":"shutdown"})"
      << "\n";
  }
  const std::string cmd = "timeout 240 " + std::string(DITSTUDIO_MPIRUN) +
                          " --allow-run-as-root --oversubscribe -np " + std::to_string(cfgDegree) +
                          " -x OMP_NUM_THREADS=1 " + DITSTUDIO_WORKER + " --model '" + model +
                          "' --cfg-degree " + std::to_string(cfgDegree) + " < '" + in.string() +
                          "' > '" + out.string() + "' 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  log = slurp(out.string());
  std::map<std::string, std::string> errors;
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line))
    if (auto e = protocol::parseEventLine(line))
      if (e->data.value("event", "") == "error" && e->data.contains("id") &&
          e->data["id"].is_string())
        errors[e->data["id"].get<std::string>()] = e->data.value("message", "");
  return errors;
}

}  // namespace

TEST(RequestCases, TableHasEnoughCasesOverEveryFamily) {
  const auto all = cases();
  EXPECT_GE(all.size(), 24u);
  std::set<std::string> families;
  for (const Case& c : all) families.insert(familyOf(ModelFolder::open(c.model)).key);
  EXPECT_EQ(families.size(), 4u);
}

TEST(RequestCases, EveryFrontEndGivesTheSameVerdictAndNamesTheSameField) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const ModelFolder m = ModelFolder::open(c.model);
    const Verdict d = direct(c, m);
    // The expected verdict.
    if (c.refused_field.empty()) {
      EXPECT_TRUE(d.ok) << d.message;
      for (auto it = c.expect.begin(); it != c.expect.end(); ++it)
        EXPECT_EQ(d.values.at(it.key()), *it) << it.key();
      if (!c.note.empty()) {
        bool found = false;
        for (const std::string& n : d.notes) found = found || n.find(c.note) != std::string::npos;
        EXPECT_TRUE(found) << "no note containing '" << c.note << "'";
      }
    } else {
      EXPECT_FALSE(d.ok);
      EXPECT_EQ(d.field, c.refused_field) << d.message;
      EXPECT_EQ(d.rule, c.refused_rule) << d.message;
    }
    // The worker's input through the protocol: the same verdict, field and values.
    const Verdict w = throughProtocol(c, m);
    EXPECT_EQ(w.ok, d.ok);
    EXPECT_EQ(w.field, d.field);
    EXPECT_EQ(w.message, d.message);
    EXPECT_EQ(w.values, d.values);
    // The GUI: no issue when accepted; the same message when refused.
    const std::vector<std::string> gui = guiIssues(c);
    if (d.ok) {
      EXPECT_TRUE(gui.empty()) << (gui.empty() ? "" : gui.front());
    } else {
      bool same = false;
      for (const std::string& s : gui) same = same || s == d.message;
      EXPECT_TRUE(same) << "GUI: " << (gui.empty() ? std::string("no issue") : gui.front())
                        << "\nresolve: " << d.message;
    }
    // The CLI's pre-check: the same verdict, field, message and values.
    std::string log;
    const json v = cliCheck(c, log);
    ASSERT_TRUE(v.is_object()) << log;
    EXPECT_EQ(v.value("ok", !d.ok), d.ok) << log;
    if (d.ok) {
      for (const char* k : {"width", "height", "steps", "cfg"})
        EXPECT_EQ(v.at(k), d.values.at(k)) << k;
      EXPECT_EQ(v.at("options"), d.values.at("options"));
    } else if (v.contains("problems") && !v["problems"].empty()) {
      EXPECT_EQ(v["problems"][0].value("field", ""), d.field) << log;
      EXPECT_EQ(v["problems"][0].value("message", ""), d.message) << log;
    }
  }
}

// The worker refuses what the front ends refuse, with the same message, before any image is made:
// one group per (model, cfg degree) takes that model's refused cases as request lines.
TEST(RequestCases, TheWorkerRefusesWithTheSameMessage) {
  std::map<std::pair<std::string, int>, std::vector<const Case*>> groups;
  const std::vector<Case> all = cases();
  for (const Case& c : all)
    if (!c.refused_field.empty()) groups[{c.model, c.cfg_degree}].push_back(&c);
  int checked = 0;
  for (const auto& [key, list] : groups) {
    std::vector<json> requests;
    for (const Case* c : list) {
      json r = protocol::toJson(params(*c));
      r["type"] = "generate";
      r["id"] = c->name;
      r["output"] = (workDir() / (std::string(c->name) + "-worker.png")).string();
      requests.push_back(r);
    }
    std::string log;
    const auto errors = workerErrors(
        key.first, key.second, requests,
        fs::path(key.first).filename().string() + "-cfg" + std::to_string(key.second), log);
    for (const Case* c : list) {
      SCOPED_TRACE(c->name);
      const ModelFolder m = ModelFolder::open(c->model);
      const Verdict d = direct(*c, m);
      ASSERT_FALSE(d.ok);
      ASSERT_TRUE(errors.count(c->name)) << "the worker did not refuse it:\n" << log;
      EXPECT_NE(errors.at(c->name).find(d.message), std::string::npos)
          << "worker: " << errors.at(c->name) << "\nresolve: " << d.message;
      EXPECT_FALSE(fs::exists(workDir() / (std::string(c->name) + "-worker.png")));
      ++checked;
    }
  }
  EXPECT_GE(checked, 12);
}
