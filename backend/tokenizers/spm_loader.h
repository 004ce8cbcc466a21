// SentencePieceModel: libsentencepiece (SentencePieceProcessor) reached through the isolated
// libdit_spm.so module (see spm_shim.cpp for why it cannot be linked directly next to LibTorch).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dit {

class SentencePieceModel {
 public:
  /// Parses a serialized SentencePiece ModelProto (the bytes of spiece.model). Throws
  /// std::runtime_error with sentencepiece's status message, or naming the module that could not
  /// be loaded (search: $DITSTUDIO_SPM_MODULE, <exe>/../lib/ditstudio/, build dir).
  explicit SentencePieceModel(const std::string& serializedProto);
  ~SentencePieceModel();
  SentencePieceModel(const SentencePieceModel&) = delete;
  SentencePieceModel& operator=(const SentencePieceModel&) = delete;

  /// SentencePieceProcessor::Encode (ids). Throws std::runtime_error on failure.
  std::vector<int> encode(std::string_view text) const;
  int pieceSize() const;
  int pieceToId(const std::string& piece) const;
  std::string idToPiece(int id) const;

 private:
  void* h_ = nullptr;
};

}  // namespace dit
