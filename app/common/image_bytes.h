// The byte checks every image file goes through before stb_image decodes it (cut-short files,
// malformed JPEG Huffman tables: backend/io/image_check.h), for the server's uploads: dit_server
// reaches the backend only through app/common (layering rule 3), as with request_values.h.
// Header-only and Torch-free.
#pragma once

#include "backend/io/image_check.h"

namespace dit::server {

using dit::ImageFormat;
using dit::imageFormatName;
using dit::missingImageBytes;
using dit::sniffImageFormat;

}  // namespace dit::server
