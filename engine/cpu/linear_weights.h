// LinearWeights: the weight W [n, k] of one linear layer (y = x · W^T), as the CPU linear
// kernels (linear_kernels.h) read it: row by row, in the format the weights are resident in.
//
// Formats: f32, bf16 and f16 rows are read where they lie (a checkpoint's mmap'd tensor, no
// copy) when the stored dtype is the format asked for; otherwise, and for int8, the rows are
// packed once into memory owned here. Q8 is llama.cpp's Q8_0 idea: each row is cut into groups
// of 32 values along k (the last group zero-padded), each group stores int8 values q and one
// f16 scale d = fp16(max|w| / 127), and the value it stands for is float(q) * float(d): an int8
// times an 11-bit significand is exact in fp32, so every format decodes to exact fp32 values
// and the kernels compute the same fp32 products for every format.
//
// BF16Quads holds bf16 values (the same numbers as bf16) in one owned copy laid out for the
// AVX2 and AVX-512 sets' decode loop: columns in quads of kQuadCols (n padded with zero
// columns), k in blocks of 8 (zero-padded); per quad, its blocks one after another (a quad is
// one contiguous stream), each block 64 bytes: 32-bit word e (0..15) holds column
// 2 * (e / 8) of the quad in its low 16 bits and column 2 * (e / 8) + 1 in its high 16 bits,
// both at k = 8 * block + e % 8. A shift left by 16 and a mask of the high halves turn 32 bytes
// into two columns' exact fp32 values, with no shuffle; rows stored in place need a widening
// shuffle per 16 bytes, and short row streams keep fewer misses in flight (docs/benchmarks.md).
//
// AmxBf16 is for the AMX kernel set (linear_kernels.h): bf16 values in AMX B-tile order, one
// owned copy: columns in groups of kAmxGroupCols (n padded with zero columns), k in blocks of
// kAmxKBlock (zero-padded); per group and k block, 4 tiles of 16 columns, each tile 16 rows of
// k pairs x 16 columns x 2 values (1 KiB), so a group's weights are one contiguous stream.
//
// W8A8 is for the w8a8 kernel sets (linear_kernels_w8a8.cc): the Q8 values and scales of every
// row (the same numbers as int8), one owned copy in VNNI order: columns in groups of
// kW8A8GroupCols (n padded with zero columns), k in Q8 groups of 32 (zero-padded); per column
// group and k group, 8 quads of k x 16 columns x 4 bytes (512 bytes, each byte q + 128 as an
// unsigned value), then, in a second array, the 16 columns' f16 scales of each k group.
//
// Q8Octets holds the Q8 values and scales (the same numbers as int8) in one owned copy laid out
// for the AVX-512 set's int8 tiles: columns in octets of kOctetCols (n padded with zero
// columns), k in Q8 groups of 32 (zero-padded); per octet, its k groups one after another (an
// octet is one contiguous stream of OctetStride(k) bytes), each group kOctetGroupBytes: the 8
// columns' f16 scales (16 bytes), then 4 blocks of 8 along k, each 64 bytes: for each pair of
// columns (2c, 2c + 1), column 2c's 8 values then column 2c + 1's. One 16-byte load widens to
// one 16-lane register holding a pair's block in its two halves (the L8 lanes), no shuffle;
// rows in place are 16 short streams per tile (docs/benchmarks.md).
//
// Several tensors can be stacked along n (the fused q|k|v and gate|up projections) without
// copying: each output row keeps its own pointer.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/core/aligned_allocator.h"
#include "engine/model/tensor_view.h"

namespace morserve {

enum class WeightFormat { kF32, kBF16, kF16, kQ8, kAmxBf16, kW8A8, kBF16Quads, kQ8Octets };

std::string_view WeightFormatName(WeightFormat f);  // "f32", ..., "bf16-quads", "int8-octets"

// One output row: its k values (format-specific bytes) and, for Q8, its group scales (f16).
// bf16-quads: data is the row's 32-byte half of its quad's first block, and high says whether
// the row is the high 16 bits of each 32-bit word there. int8-octets: data is the row's 8 values
// in its octet's first block and scales its scale in the first group (the next block's values
// are 64 bytes on, the next group's values and scale kOctetGroupBytes on).
struct WeightRow {
  const void* data = nullptr;
  const uint16_t* scales = nullptr;
  bool high = false;
};

class LinearWeights {
 public:
  static constexpr int kQ8Group = 32;
  static constexpr int kAmxGroupCols = 64;
  static constexpr int kAmxKBlock = 32;
  static constexpr int kW8A8GroupCols = 16;
  static constexpr int kQuadCols = 4;
  static constexpr int kOctetCols = 8;
  static constexpr int kOctetGroupBytes = 16 + 4 * 64;

  // The rows of `parts` stacked in order (every part [rows_i, k], the same k), in `format`:
  // read in place when a part's dtype is that format, converted (bf16 rounds to nearest even,
  // f16 likewise) or quantized into one owned copy otherwise. A part copied out of a mapped
  // checkpoint has its pages released (ReleaseMappedPages), so the weights stay resident once.
  static absl::StatusOr<LinearWeights> FromViews(std::span<const TensorView* const> parts,
                                                 WeightFormat format);
  // w: [n, k] row-major fp32, always copied.
  static LinearWeights FromF32(const float* w, int n, int k, WeightFormat format);

  LinearWeights() = default;
  LinearWeights(LinearWeights&&) = default;
  LinearWeights& operator=(LinearWeights&&) = default;
  LinearWeights(const LinearWeights&) = delete;
  LinearWeights& operator=(const LinearWeights&) = delete;

  int n() const { return n_; }
  int k() const { return k_; }
  WeightFormat format() const { return format_; }
  const WeightRow& row(int i) const { return rows_[i]; }
  const WeightRow* rows() const { return rows_.data(); }
  // Bytes one pass over every row reads (values and scales).
  int64_t bytes() const;
  // Bytes held by this object (0 when every row is read in place).
  int64_t owned_bytes() const { return static_cast<int64_t>(owned_.size()); }
  // Row i as exact fp32 values, out[k].
  void DecodeRow(int i, float* out) const;
  // kAmxBf16: the tiles (see above); nullptr for the other formats.
  const uint16_t* amx_tiles() const;
  // kBF16Quads: the quads (see above); nullptr for the other formats. Quad q starts at
  // quads() + q * QuadStride(k()); row(j) is set up as WeightRow says.
  const uint16_t* quads() const;
  // kQ8Octets: the octets (see above); nullptr for the other formats. Octet o starts at
  // octets() + o * OctetStride(k()).
  const uint8_t* octets() const;
  // kW8A8: the values (q + 128) and the scales (see above); nullptr for the other formats.
  const uint8_t* w8a8_values() const;
  const uint16_t* w8a8_scales() const;

 private:
  void PackRows(const float* w, int n);  // appends n rows given as fp32, converted to format_
  void PackAmx(const float* w);          // all n_ rows given as fp32, rounded to bf16 tiles
  void PackW8A8(const float* w);         // all n_ rows given as fp32, quantized to VNNI order
  void PackQuads(const float* w);        // all n_ rows given as fp32, rounded to bf16 quads
  void StartQuads();                     // zeroed quads for n_ x k_, and the rows' views
  void PutQuadRows(int j0, int n, const uint16_t* rows);
  void PackQuadPart(int j0, const TensorView& t);
  void StartOctets();  // zeroed octets for n_ x k_, and the rows' views
  void PutOctetRows(int j0, int n, const float* w);  // quantizes rows [j0, j0 + n) into octets

  int n_ = 0;
  int k_ = 0;
  WeightFormat format_ = WeightFormat::kF32;
  std::vector<WeightRow> rows_;
  std::vector<uint8_t, AlignedAllocator<uint8_t>> owned_;  // 64-byte aligned: SIMD loads
  size_t fill_ = 0;                                        // bytes of owned_ written so far
};

// Bytes of one row's values in `format` (Q8 and W8A8: k rounded up to groups, plus the f16
// scales; AmxBf16: k rounded up to kAmxKBlock).
int64_t WeightRowBytes(WeightFormat format, int k);

// Index (uint16 units) of W[j, p] in the AmxBf16 tiles of a weight with k columns.
int64_t AmxTileIndex(int k, int j, int p);

// Index (uint16 units) of W[j, p] in the BF16Quads values of a weight with k columns, and the
// uint16 units of one quad (4 columns x k rounded up to 8).
int64_t QuadIndex(int k, int j, int p);
inline int64_t QuadStride(int k) { return int64_t{4} * ((k + 7) & ~7); }

// Index (bytes) of W[j, p]'s int8 value in the Q8Octets bytes of a weight with k columns, of
// its f16 scale, and the bytes of one octet (8 columns x k rounded up to 32, with scales).
int64_t OctetValueIndex(int k, int j, int p);
int64_t OctetScaleIndex(int k, int j, int p);
inline int64_t OctetStride(int k) {
  return int64_t{LinearWeights::kOctetGroupBytes} * ((k + 31) / 32);
}

// Where a Q8 row view (WeightRow) keeps value p (bytes from data) and its scale (uint16 units
// from scales): int8 rows hold them contiguously, int8-octets blocks of 8 every 64 bytes and
// groups (with their scales) every kOctetGroupBytes. The kernel sets' int8 decoders take one.
struct Q8RowLayout {
  static int Value(int p) { return p; }
  static int Scale(int p) { return p / LinearWeights::kQ8Group; }
};
struct OctetRowLayout {
  static int Value(int p) {
    return p / LinearWeights::kQ8Group * LinearWeights::kOctetGroupBytes +
           p % LinearWeights::kQ8Group / 8 * 64 + p % 8;
  }
  static int Scale(int p) {
    return p / LinearWeights::kQ8Group * (LinearWeights::kOctetGroupBytes / 2);
  }
};

// Columns a kernel's column range may start at for `format` (ranges start at multiples of it):
// 4 for bf16-quads, 8 for int8-octets, else 1.
int ColumnGranularity(WeightFormat format);

// Index (bytes) of W[j, p] in the W8A8 values of a weight with k columns; its scale is at
// W8A8ScaleIndex(k, j, p) in the scales.
int64_t W8A8ValueIndex(int k, int j, int p);
int64_t W8A8ScaleIndex(int k, int j, int p);

// Decodes one row of `format` (k values, not kAmxBf16, kW8A8, kBF16Quads or kQ8Octets) to
// exact fp32.
void DecodeWeightRow(WeightFormat format, const WeightRow& row, int k, float* out);

// Quantizes one row to Q8: q[round_up(k, 32)] and scales[round_up(k, 32) / 32] (f16 bits).
void QuantizeRowQ8(const float* w, int k, int8_t* q, uint16_t* scales);

}  // namespace morserve
