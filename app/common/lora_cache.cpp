#include "app/common/lora_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "backend/io/file_guard.h"
#include "backend/io/sha256.h"
#include "backend/nn/lora_loader.h"

namespace dit {

namespace fs = std::filesystem;

std::shared_ptr<const LoraCache::Entry> LoraCache::get(const std::string& file,
                                                       DiffusionTransformer& model) {
  std::error_code ec;
  const fs::path abs = fs::absolute(file, ec);
  if (ec || !fs::exists(abs, ec)) throw std::invalid_argument(file + ": LoRA file not found");
  if (!fs::is_regular_file(abs, ec)) {
    // A directory, FIFO, device or socket is named as what it is (openRegularFile's words);
    // nothing is opened that could block.
    ::close(openRegularFile(abs.string()));
  }
  // The file's identity: a file replaced between two requests (renamed over, even with the same
  // size and mtime) has another inode and is read again, never served from the old copy.
  struct stat st {};
  if (::stat(abs.c_str(), &st) != 0) throw std::invalid_argument(file + ": LoRA file not found");
  const auto mtime = fs::last_write_time(abs, ec).time_since_epoch().count();
  const std::string key = abs.string() + "|" + std::to_string(st.st_size) + "|" +
                          std::to_string(static_cast<long long>(mtime)) + "|" +
                          std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  for (auto it = lru_.begin(); it != lru_.end(); ++it)
    if ((*it)->key == key) {
      auto e = *it;
      lru_.erase(it);
      lru_.push_front(e);
      return e;
    }
  auto e = std::make_shared<Entry>();
  e->key = key;
  e->file = file;
  e->info = inspectLoraFile(abs.string());
  e->info.path = file;
  tensor_parallel::LoraAdapter adapter = loadLoraAdapter(abs.string(), model.kohyaLoraMapping());
  adapter.file = file;
  e->prepared = model.loraTargets().prepare(adapter);
  e->sha256 = sha256File(abs.string());
  ++loads_;
  bytes_ += e->prepared->bytes;
  lru_.push_front(e);
  evict();
  return e;
}

void LoraCache::evict() {
  while (bytes_ > budget_ && !lru_.empty()) {
    bytes_ -= lru_.back()->prepared->bytes;
    lru_.pop_back();
  }
}

std::vector<std::shared_ptr<const LoraCache::Entry>> LoraCache::apply(
    std::vector<protocol::LoraRequest>& loras, DiffusionTransformer& model) {
  std::vector<std::shared_ptr<const Entry>> entries;
  std::vector<std::pair<std::shared_ptr<const tensor_parallel::PreparedLora>, double>> list;
  for (auto& l : loras) {
    entries.push_back(get(l.file, model));
    list.emplace_back(entries.back()->prepared, l.strength);
  }
  model.loraTargets().apply(list);
  for (size_t i = 0; i < loras.size(); ++i) loras[i].sha256 = entries[i]->sha256;
  return entries;
}

uint64_t loraCacheBudgetFromEnv() {
  const char* v = std::getenv("DITSTUDIO_LORA_CACHE_MB");
  uint64_t mb = 4096;
  if (v && *v) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (end && *end == '\0') mb = n;
  }
  return mb << 20;
}

}  // namespace dit
