// What a family's FamilySpec::request starts from (Torch-free): the common request fields with
// what an opened folder's parsed config already says. Included by the family records
// (backend/models/<family>/<family>_family.cpp), which must not include the family table.
#pragma once

#include <string>

#include "backend/models/request_spec.h"

namespace dit {

struct ModelFolder;

/// baseRequestSpec for an opened folder with what its parsed config already says: the size rule's
/// vae_scale_factor and default sides (PipelineConfig::dims), max_sequence_length's default,
/// limit and rule. A family's FamilySpec::request starts from it (`family`: its display name,
/// `pipeline`: its diffusers pipeline class). Throws std::logic_error for a folder not opened.
RequestSpec folderRequestBase(const ModelFolder& folder, const std::string& family,
                              const std::string& pipeline);

}  // namespace dit
