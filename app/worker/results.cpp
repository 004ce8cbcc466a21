// Where a request's images go: the replica leader writes each image (and its tensors) where the
// request asked and reports it (Worker::commitImage); in a group spanning hosts, a replica leader
// other than rank 0 ships its files' bytes to rank 0, which writes and reports them (issue 18).
#include <ATen/ATen.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "app/common/generation.h"
#include "app/protocol/events.h"
#include "app/protocol/protocol.h"
#include "app/worker/liveness.h"
#include "app/worker/worker.h"
#include "backend/io/safe_write.h"
#include "parallel/process_group.h"
#include "parallel/runtime.h"

namespace dit::worker {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string readBytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Where image `index` of the request goes: `output` (indexed when several), else a new unique
// name in `output_dir` (or the temporary folder). Throws when the unique name cannot be reserved.
std::string imagePath(const protocol::GenerateRequest& req, int index, int numImages,
                      uint64_t seed) {
  if (!req.output.empty()) return indexedPath(req.output, index, numImages);
  // The output folder never has a file replaced: a new unique name per image.
  return uniqueImagePath(
      req.output_dir.empty() ? fs::temp_directory_path().string() : req.output_dir, req.id, index,
      seed);
}

}  // namespace

// The PNG's metadata besides the parameters: model, the components given beside it (--config,
// --vae, ...: "components", only those given; the window's "Use parameters" restores them),
// strategy, dtype.
json Worker::imageMetadata() const {
  json meta{{"model", modelDir_}, {"strategy", s_.describe()}, {"dtype", dtype_}};
  json components = json::object();
  for (const auto& [key, path] : {std::pair<const char*, const std::string&>{"config", src_.config},
                                  {"vae", src_.vae},
                                  {"text_encoder", src_.text_encoder},
                                  {"text_encoder_2", src_.text_encoder_2},
                                  {"tokenizer", src_.tokenizer},
                                  {"tokenizer_2", src_.tokenizer_2}})
    if (!path.empty()) components[key] = path;
  if (!components.empty()) meta["components"] = components;
  return meta;
}

// The replica leader's image: written where the request asked (PNG, and the tensors when asked),
// the cache report logged, the image event emitted. Leader-only I/O: a bad path is the user's
// error, not the group's (an error event; no collective is skipped).
void Worker::commitImage(const protocol::GenerateRequest& req,
                         const protocol::GenerationParams& request, const GenerationResult& res,
                         int index, int numImages, Clock::time_point tImg) {
  const std::string& id = req.id;
  std::string path;
  const protocol::GenerationParams made = imageParams(request, res.params);
  try {
    path = imagePath(req, index, numImages, made.seed);
    // Files that existed when the request was accepted (with "overwrite") and the name reserved
    // just now may be replaced; nothing else (a file appearing meanwhile stays).
    std::vector<std::string> allowed = replaceable_;
    if (req.output.empty()) allowed.push_back(path);
    const OutputReplacePolicy policy(allowed);
    writeImagePng(path, res, made, imageMetadata());
    if (!req.output_tensors.empty())
      writeResultTensors(indexedPath(req.output_tensors, index, numImages), res, made);
  } catch (const std::exception& e) {
    // No partial output: the empty file uniqueImagePath reserved goes too.
    std::error_code ec;
    if (req.output.empty() && !path.empty() && fs::is_regular_file(path, ec) &&
        fs::file_size(path, ec) == 0)
      fs::remove(path, ec);
    emitTyped(protocol::ErrorEvent{
        id, rank_, "cannot write image " + std::to_string(index) + ": " + e.what(), false});
    return;
  }
  const json cache = cacheReport(res);
  if (!cache.is_null()) {
    std::ostringstream msg;
    msg << "cache " << cache["mode"].get<std::string>() << ": image " << index << " computed steps "
        << cache["computed_steps"].dump() << " of " << cache["steps"].get<int>() << ", reused "
        << cache["reused_steps"].dump() << ", about "
        << static_cast<int>(cache["saved_ms"].get<double>()) << " ms saved";
    emitTyped(protocol::LogEvent{id, rank_, "info", msg.str()});
  }
  protocol::ImageEvent image;
  image.id = id;
  image.cache = cache;
  image.image_index = index;
  image.path = path;
  image.seed = made.seed;
  image.has_seed = true;
  image.params = protocol::toJson(made);
  image.rank = rank_;
  image.seconds = std::chrono::duration<double>(Clock::now() - tImg).count();
  emitTyped(image);
}

// One round's transfer of replica results to rank 0 (every rank calls it; see the caller).
// Returns true on the shipping ranks (their image is reported by rank 0).
bool Worker::shipResults(bool ship, const protocol::GenerateRequest& req,
                         const protocol::GenerationParams& request, const GenerationResult& res,
                         int index, int numImages, Clock::time_point tImg) {
  at::Tensor flag = at::full({1}, ship ? 1 : 0, at::kInt);
  at::Tensor all = world_->allgather(flag, 0)->result();
  for (int src = 1; src < worldSize(); ++src) {
    if (all[src].item<int>() == 0) continue;
    if (rank_ == src) {
      json head{{"index", index}, {"rank", rank_}, {"host", hostname()}};
      std::string png, st;
      const protocol::GenerationParams made = imageParams(request, res.params);
      head["seed"] = made.seed;
      head["params"] = protocol::toJson(made);
      head["cache"] = cacheReport(res);
      head["seconds"] = std::chrono::duration<double>(Clock::now() - tImg).count();
      try {
        const fs::path dir =
            fs::temp_directory_path() / ("ditstudio-result-" + std::to_string(::getpid()));
        fs::create_directories(dir);
        writeImagePng((dir / "image.png").string(), res, made, imageMetadata());
        png = readBytes(dir / "image.png");
        if (!req.output_tensors.empty()) {
          writeResultTensors((dir / "result.safetensors").string(), res, made);
          st = readBytes(dir / "result.safetensors");
        }
        fs::remove_all(dir);
      } catch (const std::exception& e) {
        head["error"] = e.what();
      }
      const std::string h = head.dump();
      at::Tensor sizes =
          at::tensor({static_cast<int64_t>(h.size()), static_cast<int64_t>(png.size()),
                      static_cast<int64_t>(st.size())},
                     at::kLong);
      world_->send(sizes, 0, 7)->wait();
      for (const std::string* b :
           {&h, static_cast<const std::string*>(&png), static_cast<const std::string*>(&st)})
        if (!b->empty()) {
          at::Tensor t = at::from_blob(const_cast<char*>(b->data()),
                                       {static_cast<int64_t>(b->size())}, at::kByte);
          world_->send(t, 0, 7)->wait();
        }
    } else if (rank_ == 0) {
      at::Tensor sizes = at::zeros({3}, at::kLong);
      world_->recv(sizes, src, 7)->wait();
      std::string parts[3];
      for (int i = 0; i < 3; ++i) {
        const int64_t n = sizes[i].item<int64_t>();
        if (n <= 0) continue;
        at::Tensor t = at::empty({n}, at::kByte);
        world_->recv(t, src, 7)->wait();
        parts[i].assign(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(n));
      }
      receiveResult(req, json::parse(parts[0]), parts[1], parts[2], numImages);
    }
  }
  return ship;
}

// Rank 0: writes a replica's image (and tensors) where the request asked and reports it.
void Worker::receiveResult(const protocol::GenerateRequest& req, const json& head,
                           const std::string& png, const std::string& st, int numImages) {
  const int index = head["index"].get<int>();
  const int src = head["rank"].get<int>();
  const std::string who =
      "rank " + std::to_string(src) + " on host " + head["host"].get<std::string>();
  if (head.contains("error")) {
    emitTyped(protocol::ErrorEvent{req.id, src,
                                   "cannot write image " + std::to_string(index) + " (" + who +
                                       "): " + head["error"].get<std::string>(),
                                   false});
    return;
  }
  std::string path;
  try {
    path = imagePath(req, index, numImages, head["seed"].get<uint64_t>());
    auto write = [](const std::string& file, const std::string& bytes) {
      std::ofstream out(file, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      if (!out) throw std::runtime_error("cannot write " + file);
    };
    write(path, png);
    if (!req.output_tensors.empty()) write(indexedPath(req.output_tensors, index, numImages), st);
  } catch (const std::exception& e) {
    emitTyped(protocol::ErrorEvent{
        req.id, src, "cannot write image " + std::to_string(index) + ": " + e.what(), false});
    return;
  }
  protocol::ImageEvent image;
  image.id = req.id;
  image.cache = head["cache"];
  image.image_index = index;
  image.path = path;
  image.seed = head["seed"].get<std::uint64_t>();
  image.has_seed = true;
  image.params = head["params"];
  image.rank = src;
  image.host = head["host"].get<std::string>();
  image.seconds = head["seconds"].get<double>();
  emitTyped(image);
}

}  // namespace dit::worker
