// ggml types and dequantization (see gguf_types.h). Built with -ffp-contract=off
// (backend/CMakeLists.txt): each product and sum below is rounded on its own, as in ggml's
// reference C code, so the results match ggml's to_float bit for bit.
#include "backend/io/gguf_types.h"

#include <cstring>
#include <map>

namespace dit {

namespace {

struct TypeRow {
  uint32_t id;
  const char* name;
};

// ggml.h `enum ggml_type` (ids 4, 5 and 31-33, 36-38 are removed types; ggml keeps the gaps).
constexpr TypeRow kTypeNames[] = {{0, "F32"},
                                  {1, "F16"},
                                  {2, "Q4_0"},
                                  {3, "Q4_1"},
                                  {4, "Q4_2 (removed)"},
                                  {5, "Q4_3 (removed)"},
                                  {6, "Q5_0"},
                                  {7, "Q5_1"},
                                  {8, "Q8_0"},
                                  {9, "Q8_1"},
                                  {10, "Q2_K"},
                                  {11, "Q3_K"},
                                  {12, "Q4_K"},
                                  {13, "Q5_K"},
                                  {14, "Q6_K"},
                                  {15, "Q8_K"},
                                  {16, "IQ2_XXS"},
                                  {17, "IQ2_XS"},
                                  {18, "IQ3_XXS"},
                                  {19, "IQ1_S"},
                                  {20, "IQ4_NL"},
                                  {21, "IQ3_S"},
                                  {22, "IQ2_S"},
                                  {23, "IQ4_XS"},
                                  {24, "I8"},
                                  {25, "I16"},
                                  {26, "I32"},
                                  {27, "I64"},
                                  {28, "F64"},
                                  {29, "IQ1_M"},
                                  {30, "BF16"},
                                  {31, "Q4_0_4_4 (removed)"},
                                  {32, "Q4_0_4_8 (removed)"},
                                  {33, "Q4_0_8_8 (removed)"},
                                  {34, "TQ1_0"},
                                  {35, "TQ2_0"},
                                  {36, "IQ4_NL_4_4 (removed)"},
                                  {37, "IQ4_NL_4_8 (removed)"},
                                  {38, "IQ4_NL_8_8 (removed)"},
                                  {39, "MXFP4"}};

struct BlockRow {
  GgmlType t;
  int64_t block, bytes;
};
constexpr BlockRow kBlocks[] = {
    {GgmlType::F32, 1, 4},      {GgmlType::F16, 1, 2},      {GgmlType::BF16, 1, 2},
    {GgmlType::Q4_0, 32, 18},   {GgmlType::Q4_1, 32, 20},   {GgmlType::Q5_0, 32, 22},
    {GgmlType::Q5_1, 32, 24},   {GgmlType::Q8_0, 32, 34},   {GgmlType::Q2_K, 256, 84},
    {GgmlType::Q3_K, 256, 110}, {GgmlType::Q4_K, 256, 144}, {GgmlType::Q5_K, 256, 176},
    {GgmlType::Q6_K, 256, 210}};

const BlockRow* blockRow(GgmlType t) {
  for (const auto& r : kBlocks)
    if (r.t == t) return &r;
  return nullptr;
}

inline uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline float fp16(const uint8_t* p) { return halfToFloat(rd16(p)); }

// ggml's get_scale_min_k4: 6-bit scale and min `j` (0..7) of a Q4_K / Q5_K block's 12 bytes.
inline void scaleMinK4(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void rowQ4_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 18, y += 32) {
    const float d = fp16(b);
    const uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      const int x0 = (qs[j] & 0x0F) - 8;
      const int x1 = (qs[j] >> 4) - 8;
      y[j] = static_cast<float>(x0) * d;
      y[j + 16] = static_cast<float>(x1) * d;
    }
  }
}

void rowQ4_1(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 20, y += 32) {
    const float d = fp16(b), m = fp16(b + 2);
    const uint8_t* qs = b + 4;
    for (int j = 0; j < 16; ++j) {
      const int x0 = qs[j] & 0x0F;
      const int x1 = qs[j] >> 4;
      y[j] = static_cast<float>(x0) * d + m;
      y[j + 16] = static_cast<float>(x1) * d + m;
    }
  }
}

void rowQ5_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 22, y += 32) {
    const float d = fp16(b);
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);  // little-endian hosts only (as ggml)
    const uint8_t* qs = b + 6;
    for (int j = 0; j < 16; ++j) {
      const uint8_t xh0 = static_cast<uint8_t>(((qh >> (j + 0)) << 4) & 0x10);
      const uint8_t xh1 = static_cast<uint8_t>(((qh >> (j + 12))) & 0x10);
      const int x0 = ((qs[j] & 0x0F) | xh0) - 16;
      const int x1 = ((qs[j] >> 4) | xh1) - 16;
      y[j] = static_cast<float>(x0) * d;
      y[j + 16] = static_cast<float>(x1) * d;
    }
  }
}

void rowQ5_1(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 24, y += 32) {
    const float d = fp16(b), m = fp16(b + 2);
    uint32_t qh;
    std::memcpy(&qh, b + 4, 4);
    const uint8_t* qs = b + 8;
    for (int j = 0; j < 16; ++j) {
      const uint8_t xh0 = static_cast<uint8_t>(((qh >> (j + 0)) << 4) & 0x10);
      const uint8_t xh1 = static_cast<uint8_t>(((qh >> (j + 12))) & 0x10);
      const int x0 = (qs[j] & 0x0F) | xh0;
      const int x1 = (qs[j] >> 4) | xh1;
      y[j] = static_cast<float>(x0) * d + m;
      y[j + 16] = static_cast<float>(x1) * d + m;
    }
  }
}

void rowQ8_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 34, y += 32) {
    const float d = fp16(b);
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
  }
}

// block_q2_K {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}
void rowQ2_K(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 84) {
    const uint8_t* scales = b;
    const uint8_t* q = b + 16;
    const float d = fp16(b + 80), min = fp16(b + 82);
    int is = 0;
    for (int n = 0; n < 256; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        uint8_t sc = scales[is++];
        float dl = d * static_cast<float>(sc & 0xF), ml = min * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l] >> shift) & 3)) - ml;
        sc = scales[is++];
        dl = d * static_cast<float>(sc & 0xF);
        ml = min * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l + 16] >> shift) & 3)) - ml;
        shift += 2;
      }
      q += 32;
    }
  }
}

// block_q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}
void rowQ3_K(const uint8_t* b, float* y, int64_t nb) {
  constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  for (int64_t i = 0; i < nb; ++i, b += 110) {
    const uint8_t* hm = b;
    const uint8_t* q = b + 32;
    const float dAll = fp16(b + 108);
    uint32_t aux[4];
    std::memcpy(aux, b + 96, 12);
    const uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    int8_t scales[16];
    std::memcpy(scales, aux, 16);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < 256; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        float dl = dAll * static_cast<float>(scales[is++] - 32);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l] >> shift) & 3) -
                                         ((hm[l] & m) ? 0 : 4));
        dl = dAll * static_cast<float>(scales[is++] - 32);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l + 16] >> shift) & 3) -
                                         ((hm[l + 16] & m) ? 0 : 4));
        shift += 2;
        m = static_cast<uint8_t>(m << 1);
      }
      q += 32;
    }
  }
}

// block_q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}
void rowQ4_K(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 144) {
    const float d = fp16(b), min = fp16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* q = b + 16;
    int is = 0;
    uint8_t sc, m;
    for (int j = 0; j < 256; j += 64) {
      scaleMinK4(is + 0, scales, sc, m);
      const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
      scaleMinK4(is + 1, scales, sc, m);
      const float d2 = d * static_cast<float>(sc), m2 = min * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

// block_q5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
void rowQ5_K(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 176) {
    const float d = fp16(b), min = fp16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* ql = b + 48;
    int is = 0;
    uint8_t sc, m;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < 256; j += 64) {
      scaleMinK4(is + 0, scales, sc, m);
      const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
      scaleMinK4(is + 1, scales, sc, m);
      const float d2 = d * static_cast<float>(sc), m2 = min * static_cast<float>(m);
      for (int l = 0; l < 32; ++l)
        *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l)
        *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      is += 2;
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

// block_q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
void rowQ6_K(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 210) {
    const float d = fp16(b + 208);
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int n = 0; n < 256; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int8_t q1 = static_cast<int8_t>(
            static_cast<int8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
        const int8_t q2 = static_cast<int8_t>(
            static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        const int8_t q3 =
            static_cast<int8_t>(static_cast<int8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        const int8_t q4 = static_cast<int8_t>(
            static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

}  // namespace

float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3FF) << 13;
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::string ggmlTypeName(uint32_t id) {
  for (const auto& r : kTypeNames)
    if (r.id == id) return r.name;
  return "type id " + std::to_string(id);
}

bool ggmlTypeSupported(uint32_t id) { return blockRow(static_cast<GgmlType>(id)) != nullptr; }

int64_t ggmlBlockSize(GgmlType t) {
  const BlockRow* r = blockRow(t);
  return r ? r->block : 0;
}

int64_t ggmlBlockBytes(GgmlType t) {
  const BlockRow* r = blockRow(t);
  return r ? r->bytes : 0;
}

bool parseGgmlType(const std::string& name, GgmlType& out) {
  for (const auto& r : kBlocks)
    if (ggmlTypeName(static_cast<uint32_t>(r.t)) == name) {
      out = r.t;
      return true;
    }
  return false;
}

double storageBytesPerParameter(const std::string& s) {
  static const std::map<std::string, double> plain{
      {"F64", 8}, {"I64", 8},  {"U64", 8},  {"F32", 4},     {"I32", 4},      {"U32", 4},
      {"F16", 2}, {"BF16", 2}, {"I16", 2},  {"U16", 2},     {"F8_E4M3", 1},  {"F8_E5M2", 1},
      {"I8", 1},  {"U8", 1},   {"BOOL", 1}, {"float32", 4}, {"bfloat16", 2}, {"float16", 2}};
  auto it = plain.find(s);
  if (it != plain.end()) return it->second;
  GgmlType t;
  if (parseGgmlType(s, t))
    return static_cast<double>(ggmlBlockBytes(t)) / static_cast<double>(ggmlBlockSize(t));
  return 0;
}

void dequantizeGgml(GgmlType t, const uint8_t* src, float* dst, int64_t n) {
  const int64_t nb = n / ggmlBlockSize(t);
  switch (t) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16(src + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(rd16(src + 2 * i)) << 16;
        std::memcpy(dst + i, &bits, 4);
      }
      return;
    case GgmlType::Q4_0:
      return rowQ4_0(src, dst, nb);
    case GgmlType::Q4_1:
      return rowQ4_1(src, dst, nb);
    case GgmlType::Q5_0:
      return rowQ5_0(src, dst, nb);
    case GgmlType::Q5_1:
      return rowQ5_1(src, dst, nb);
    case GgmlType::Q8_0:
      return rowQ8_0(src, dst, nb);
    case GgmlType::Q2_K:
      return rowQ2_K(src, dst, nb);
    case GgmlType::Q3_K:
      return rowQ3_K(src, dst, nb);
    case GgmlType::Q4_K:
      return rowQ4_K(src, dst, nb);
    case GgmlType::Q5_K:
      return rowQ5_K(src, dst, nb);
    case GgmlType::Q6_K:
      return rowQ6_K(src, dst, nb);
  }
}

}  // namespace dit
