// LinearWeights: resident weight rows in their format (see linear_weights.h).
#include "engine/cpu/linear_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/check.h"
#include "engine/io/mapped_file.h"
#include "engine/model/dtype.h"

namespace morserve {
namespace {

constexpr int kGroup = LinearWeights::kQ8Group;

int RoundUpToGroup(int k) { return (k + kGroup - 1) / kGroup * kGroup; }
int RoundUp(int v, int to) { return (v + to - 1) / to * to; }

// The dtype a format reads in place, if any.
bool ReadsInPlace(WeightFormat f, DType t) {
  return (f == WeightFormat::kF32 && t == DType::kF32) ||
         (f == WeightFormat::kBF16 && t == DType::kBF16) ||
         (f == WeightFormat::kF16 && t == DType::kF16);
}

}  // namespace

std::string_view WeightFormatName(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32:
      return "f32";
    case WeightFormat::kBF16:
      return "bf16";
    case WeightFormat::kF16:
      return "f16";
    case WeightFormat::kQ8:
      return "int8";
    case WeightFormat::kAmxBf16:
      return "amx-bf16";
    case WeightFormat::kW8A8:
      return "w8a8";
    case WeightFormat::kBF16Quads:
      return "bf16-quads";
    case WeightFormat::kQ8Octets:
      return "int8-octets";
  }
  return "?";
}

int64_t WeightRowBytes(WeightFormat format, int k) {
  switch (format) {
    case WeightFormat::kF32:
      return int64_t{4} * k;
    case WeightFormat::kBF16:
    case WeightFormat::kF16:
      return int64_t{2} * k;
    case WeightFormat::kQ8:
    case WeightFormat::kW8A8: {
      const int kq = RoundUpToGroup(k);
      return kq + int64_t{2} * (kq / kGroup);
    }
    case WeightFormat::kAmxBf16:
      return int64_t{2} * RoundUp(k, LinearWeights::kAmxKBlock);
    case WeightFormat::kBF16Quads:
      return int64_t{2} * RoundUp(k, 8);
    case WeightFormat::kQ8Octets:
      return OctetStride(k) / LinearWeights::kOctetCols;
  }
  return 0;
}

namespace {

// Index (uint16 units) of column c (0..15) and k offset q (0..31) inside one 1 KiB tile:
// row q / 2 of k pairs, the column's pair at c * 2, the value q % 2 within it.
int AmxInTile(int c, int q) { return (q / 2) * 32 + c * 2 + q % 2; }

}  // namespace

int64_t AmxTileIndex(int k, int j, int p) {
  const int64_t kblocks = RoundUp(k, LinearWeights::kAmxKBlock) / LinearWeights::kAmxKBlock;
  const int64_t g = j / LinearWeights::kAmxGroupCols, t = (j % LinearWeights::kAmxGroupCols) / 16;
  const int64_t kb = p / LinearWeights::kAmxKBlock;
  return ((g * kblocks + kb) * 4 + t) * 16 * 32 + AmxInTile(j % 16, p % LinearWeights::kAmxKBlock);
}

int64_t QuadIndex(int k, int j, int p) {
  const int64_t q = j / LinearWeights::kQuadCols, c = j % LinearWeights::kQuadCols;
  const int64_t word = (c / 2) * 8 + p % 8;  // the 32-bit word of the block
  return q * QuadStride(k) + (p / 8) * 32 + word * 2 + c % 2;
}

int64_t OctetValueIndex(int k, int j, int p) {
  const int64_t o = j / LinearWeights::kOctetCols, c = j % LinearWeights::kOctetCols;
  return o * OctetStride(k) + 16 + c * 8 + OctetRowLayout::Value(p);
}

int64_t OctetScaleIndex(int k, int j, int p) {
  const int64_t o = j / LinearWeights::kOctetCols, c = j % LinearWeights::kOctetCols;
  return o * OctetStride(k) + c * 2 + int64_t{2} * OctetRowLayout::Scale(p);
}

int ColumnGranularity(WeightFormat format) {
  switch (format) {
    case WeightFormat::kBF16Quads:
      return LinearWeights::kQuadCols;
    case WeightFormat::kQ8Octets:
      return LinearWeights::kOctetCols;
    default:
      return 1;
  }
}

int64_t W8A8ValueIndex(int k, int j, int p) {
  const int64_t kgroups = RoundUpToGroup(k) / kGroup;
  const int64_t cg = j / LinearWeights::kW8A8GroupCols, c = j % LinearWeights::kW8A8GroupCols;
  const int64_t g = p / kGroup, q = (p % kGroup) / 4;
  return ((cg * kgroups + g) * 8 + q) * 64 + c * 4 + p % 4;
}

int64_t W8A8ScaleIndex(int k, int j, int p) {
  const int64_t kgroups = RoundUpToGroup(k) / kGroup;
  const int64_t cg = j / LinearWeights::kW8A8GroupCols, c = j % LinearWeights::kW8A8GroupCols;
  return (cg * kgroups + p / kGroup) * LinearWeights::kW8A8GroupCols + c;
}

void QuantizeRowQ8(const float* w, int k, int8_t* q, uint16_t* scales) {
  const int kq = RoundUpToGroup(k);
  for (int g = 0; g * kGroup < kq; ++g) {
    const int begin = g * kGroup, end = std::min(k, begin + kGroup);
    float amax = 0.0f;
    for (int i = begin; i < end; ++i) amax = std::max(amax, std::fabs(w[i]));
    MORSERVE_CHECK(std::isfinite(amax), "int8 quantization: a weight is not finite");
    const uint16_t d16 = F32ToF16(std::min(amax / 127.0f, 65504.0f));
    const float d = F16ToF32(d16);
    scales[g] = d16;
    for (int i = begin; i < begin + kGroup; ++i) {
      float v = 0.0f;
      if (i < end && d > 0.0f) v = std::nearbyint(w[i] / d);
      q[i] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
  }
}

void DecodeWeightRow(WeightFormat format, const WeightRow& row, int k, float* out) {
  switch (format) {
    case WeightFormat::kF32:
      std::memcpy(out, row.data, sizeof(float) * k);
      return;
    case WeightFormat::kBF16:
      ToF32(DType::kBF16, row.data, k, out);
      return;
    case WeightFormat::kF16:
      ToF32(DType::kF16, row.data, k, out);
      return;
    case WeightFormat::kQ8: {
      const auto* q = static_cast<const int8_t*>(row.data);
      for (int i = 0; i < k; ++i)
        out[i] = static_cast<float>(q[i]) * F16ToF32(row.scales[i / kGroup]);
      return;
    }
    case WeightFormat::kAmxBf16:
    case WeightFormat::kW8A8:
    case WeightFormat::kBF16Quads:
    case WeightFormat::kQ8Octets:
      MORSERVE_CHECK(false,
                     "DecodeWeightRow: amx-bf16, w8a8, bf16-quads and int8-octets rows are not "
                     "contiguous (LinearWeights::DecodeRow)");
  }
}

int64_t LinearWeights::bytes() const { return WeightRowBytes(format_, k_) * n_; }

void LinearWeights::DecodeRow(int i, float* out) const {
  if (format_ == WeightFormat::kW8A8) {
    const uint8_t* values = w8a8_values();
    const uint16_t* scales = w8a8_scales();
    for (int p = 0; p < k_; ++p) {
      const int q = static_cast<int>(values[W8A8ValueIndex(k_, i, p)]) - 128;
      out[p] = static_cast<float>(q) * F16ToF32(scales[W8A8ScaleIndex(k_, i, p)]);
    }
    return;
  }
  if (format_ == WeightFormat::kBF16Quads) {
    const uint16_t* values = quads();
    for (int p = 0; p < k_; ++p) out[p] = Bf16ToF32(values[QuadIndex(k_, i, p)]);
    return;
  }
  if (format_ == WeightFormat::kQ8Octets) {
    const uint8_t* bytes = octets();
    for (int p = 0; p < k_; ++p) {
      uint16_t d;
      std::memcpy(&d, bytes + OctetScaleIndex(k_, i, p), sizeof(d));
      out[p] =
          static_cast<float>(static_cast<int8_t>(bytes[OctetValueIndex(k_, i, p)])) * F16ToF32(d);
    }
    return;
  }
  if (format_ != WeightFormat::kAmxBf16) return DecodeWeightRow(format_, rows_[i], k_, out);
  const uint16_t* tiles = amx_tiles();
  for (int p = 0; p < k_; ++p) out[p] = Bf16ToF32(tiles[AmxTileIndex(k_, i, p)]);
}

const uint8_t* LinearWeights::w8a8_values() const {
  return format_ == WeightFormat::kW8A8 ? owned_.data() : nullptr;
}

const uint16_t* LinearWeights::w8a8_scales() const {
  if (format_ != WeightFormat::kW8A8) return nullptr;
  const int64_t np = RoundUp(n_, kW8A8GroupCols);
  return reinterpret_cast<const uint16_t*>(owned_.data() + np * RoundUpToGroup(k_));
}

// owned_ holds the values of round_up(n_, 16) columns x round_up(k_, 32), then their scales;
// padding columns and padding k are q = 0 (byte 128) with scale 0.
void LinearWeights::PackW8A8(const float* w) {
  const int np = RoundUp(n_, kW8A8GroupCols), kq = RoundUpToGroup(k_);
  const size_t value_bytes = static_cast<size_t>(np) * kq;
  owned_.assign(value_bytes + static_cast<size_t>(np) * (kq / kGroup) * 2, 0);
  std::fill(owned_.begin(), owned_.begin() + static_cast<std::ptrdiff_t>(value_bytes), 128);
  auto* scales = reinterpret_cast<uint16_t*>(owned_.data() + value_bytes);
  std::vector<int8_t> q(kq);
  std::vector<uint16_t> d(kq / kGroup);
  for (int j = 0; j < n_; ++j) {
    QuantizeRowQ8(w + static_cast<size_t>(j) * k_, k_, q.data(), d.data());
    for (int p = 0; p < kq; ++p)
      owned_[W8A8ValueIndex(k_, j, p)] = static_cast<uint8_t>(q[p] + 128);
    for (int g = 0; g < kq / kGroup; ++g) scales[W8A8ScaleIndex(k_, j, g * kGroup)] = d[g];
  }
  rows_.assign(n_, WeightRow{owned_.data(), scales});
  fill_ = owned_.size();
}

const uint16_t* LinearWeights::quads() const {
  return format_ == WeightFormat::kBF16Quads ? reinterpret_cast<const uint16_t*>(owned_.data())
                                             : nullptr;
}

// owned_ holds round_up(n_, 4) columns x round_up(k_, 8) bf16 values, zero where W has none;
// row j's WeightRow points at its half of the quad (see WeightRow).
void LinearWeights::StartQuads() {
  const int np = RoundUp(n_, kQuadCols);
  owned_.assign(static_cast<size_t>(np / kQuadCols) * QuadStride(k_) * 2, 0);
  fill_ = owned_.size();
  rows_.clear();
  for (int j = 0; j < n_; ++j) {
    const uint16_t* half = quads() + QuadIndex(k_, j, 0) - j % 2;
    rows_.push_back(WeightRow{half, nullptr, j % 2 == 1});
  }
}

// Rows [j0, j0 + n) as bf16 bits (`rows`, [n, k] row-major) into their quads.
void LinearWeights::PutQuadRows(int j0, int n, const uint16_t* rows) {
  auto* values = reinterpret_cast<uint16_t*>(owned_.data());
  for (int r = 0; r < n; ++r) {
    uint16_t* dst = values + QuadIndex(k_, j0 + r, 0);
    const uint16_t* src = rows + static_cast<size_t>(r) * k_;
    for (int p = 0; p < k_; ++p) dst[(p / 8) * 32 + (p % 8) * 2] = src[p];
  }
}

void LinearWeights::PackQuads(const float* w) {
  StartQuads();
  std::vector<uint16_t> row(k_);
  for (int j = 0; j < n_; ++j) {
    const float* src = w + static_cast<size_t>(j) * k_;
    for (int p = 0; p < k_; ++p) row[p] = F32ToBf16(src[p]);
    PutQuadRows(j, 1, row.data());
  }
}

// A part's rows as bf16 bits: copied from a bf16 tensor, rounded from any other dtype; then
// its mapped pages are released.
void LinearWeights::PackQuadPart(int j0, const TensorView& t) {
  const int n = static_cast<int>(t.shape[0]);
  if (t.dtype == DType::kBF16) {
    PutQuadRows(j0, n, static_cast<const uint16_t*>(t.data));
  } else {
    const std::vector<float> f = t.ToF32Vector();
    std::vector<uint16_t> bits(f.size());
    for (size_t i = 0; i < f.size(); ++i) bits[i] = F32ToBf16(f[i]);
    PutQuadRows(j0, n, bits.data());
  }
  ReleaseMappedPages(t.data, t.nbytes());
}

const uint8_t* LinearWeights::octets() const {
  return format_ == WeightFormat::kQ8Octets ? owned_.data() : nullptr;
}

// owned_ holds round_up(n_, 8) columns x round_up(k_, 32) int8 values and their scales, zero
// (q = 0, scale 0) where W has none; row j's WeightRow points at its first value and scale.
void LinearWeights::StartOctets() {
  const int np = RoundUp(n_, kOctetCols);
  owned_.assign(static_cast<size_t>(np / kOctetCols) * OctetStride(k_), 0);
  fill_ = owned_.size();
  rows_.clear();
  for (int j = 0; j < n_; ++j) {
    rows_.push_back(WeightRow{
        owned_.data() + OctetValueIndex(k_, j, 0),
        reinterpret_cast<const uint16_t*>(owned_.data() + OctetScaleIndex(k_, j, 0)), false});
  }
}

// Rows [j0, j0 + n) given as fp32 (`w`, [n, k] row-major), quantized as Q8 rows are.
void LinearWeights::PutOctetRows(int j0, int n, const float* w) {
  const int kq = RoundUpToGroup(k_);
  std::vector<int8_t> q(kq);
  std::vector<uint16_t> d(kq / kGroup);
  for (int r = 0; r < n; ++r) {
    const int j = j0 + r;
    QuantizeRowQ8(w + static_cast<size_t>(r) * k_, k_, q.data(), d.data());
    for (int p = 0; p < kq; ++p) owned_[OctetValueIndex(k_, j, p)] = static_cast<uint8_t>(q[p]);
    for (int g = 0; g < kq / kGroup; ++g)
      std::memcpy(&owned_[OctetScaleIndex(k_, j, g * kGroup)], &d[g], sizeof(uint16_t));
  }
}

const uint16_t* LinearWeights::amx_tiles() const {
  return format_ == WeightFormat::kAmxBf16 ? reinterpret_cast<const uint16_t*>(owned_.data())
                                           : nullptr;
}

// owned_ holds round_up(n_, 64) x round_up(k_, 32) bf16 values, zero where W has none.
void LinearWeights::PackAmx(const float* w) {
  const int np = RoundUp(n_, kAmxGroupCols), kp = RoundUp(k_, kAmxKBlock);
  owned_.assign(static_cast<size_t>(np) * kp * 2, 0);
  auto* tiles = reinterpret_cast<uint16_t*>(owned_.data());
  // Tile by tile in storage order: each reads 16 rows of W, 32 values each.
  for (int g = 0; g < np; g += kAmxGroupCols) {
    for (int kb = 0; kb < kp; kb += kAmxKBlock) {
      for (int j0 = g; j0 < std::min(n_, g + kAmxGroupCols); j0 += 16) {
        uint16_t* tile = tiles + AmxTileIndex(k_, j0, kb);
        for (int c = 0; c < 16 && j0 + c < n_; ++c) {
          const float* src = w + static_cast<size_t>(j0 + c) * k_;
          for (int p = kb; p < std::min(k_, kb + kAmxKBlock); ++p)
            tile[AmxInTile(c, p - kb)] = F32ToBf16(src[p]);
        }
      }
    }
  }
  rows_.assign(n_, WeightRow{owned_.data(), nullptr});
  fill_ = owned_.size();
}

// Writes n rows at the end of owned_'s filled part; owned_ is sized up front, so the pointers
// of rows written earlier stay valid.
void LinearWeights::PackRows(const float* w, int n) {
  const int64_t row_bytes = WeightRowBytes(format_, k_);
  for (int r = 0; r < n; ++r) {
    const float* src = w + static_cast<size_t>(r) * k_;
    uint8_t* dst = owned_.data() + fill_;
    WeightRow row;
    row.data = dst;
    switch (format_) {
      case WeightFormat::kF32:
        std::memcpy(dst, src, sizeof(float) * k_);
        break;
      case WeightFormat::kBF16:
      case WeightFormat::kF16: {
        auto* d = reinterpret_cast<uint16_t*>(dst);
        for (int i = 0; i < k_; ++i)
          d[i] = format_ == WeightFormat::kBF16 ? F32ToBf16(src[i]) : F32ToF16(src[i]);
        break;
      }
      case WeightFormat::kQ8: {
        auto* scales = reinterpret_cast<uint16_t*>(dst + RoundUpToGroup(k_));
        QuantizeRowQ8(src, k_, reinterpret_cast<int8_t*>(dst), scales);
        row.scales = scales;
        break;
      }
      case WeightFormat::kAmxBf16:
      case WeightFormat::kW8A8:
      case WeightFormat::kBF16Quads:
      case WeightFormat::kQ8Octets:
        MORSERVE_CHECK(false,
                       "PackRows: amx-bf16, w8a8, bf16-quads and int8-octets weights are packed "
                       "whole");
    }
    rows_.push_back(row);
    fill_ += static_cast<size_t>(row_bytes);
  }
}

LinearWeights LinearWeights::FromF32(const float* w, int n, int k, WeightFormat format) {
  MORSERVE_CHECK(n > 0 && k > 0, "LinearWeights needs n > 0 and k > 0");
  LinearWeights out;
  out.n_ = n;
  out.k_ = k;
  out.format_ = format;
  if (format == WeightFormat::kAmxBf16) {
    out.PackAmx(w);
    return out;
  }
  if (format == WeightFormat::kW8A8) {
    out.PackW8A8(w);
    return out;
  }
  if (format == WeightFormat::kBF16Quads) {
    out.PackQuads(w);
    return out;
  }
  if (format == WeightFormat::kQ8Octets) {
    out.StartOctets();
    out.PutOctetRows(0, n, w);
    return out;
  }
  out.owned_.resize(static_cast<size_t>(WeightRowBytes(format, k)) * n);
  out.PackRows(w, n);
  return out;
}

absl::StatusOr<LinearWeights> LinearWeights::FromViews(std::span<const TensorView* const> parts,
                                                       WeightFormat format) {
  if (parts.empty()) return absl::InvalidArgumentError("LinearWeights: no tensors");
  LinearWeights out;
  out.format_ = format;
  out.k_ = -1;
  int64_t owned_rows = 0;
  for (const TensorView* t : parts) {
    if (t->shape.size() != 2 || t->shape[0] <= 0 || t->shape[1] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(t->name, ": a linear weight must be 2-D, got ", ShapeString(t->shape)));
    }
    if (out.k_ >= 0 && t->shape[1] != out.k_) {
      return absl::InvalidArgumentError(absl::StrCat(
          t->name, ": ", t->shape[1], " input features, the fused weight has ", out.k_));
    }
    out.k_ = static_cast<int>(t->shape[1]);
    out.n_ += static_cast<int>(t->shape[0]);
    if (!ReadsInPlace(format, t->dtype)) owned_rows += t->shape[0];
  }
  if (format == WeightFormat::kBF16Quads) {  // part by part: no fp32 copy of the whole
    out.StartQuads();
    int j0 = 0;
    for (const TensorView* t : parts) {
      out.PackQuadPart(j0, *t);
      j0 += static_cast<int>(t->shape[0]);
    }
    return out;
  }
  if (format == WeightFormat::kQ8Octets) {  // part by part: no fp32 copy of the whole
    out.StartOctets();
    int j0 = 0;
    for (const TensorView* t : parts) {
      out.PutOctetRows(j0, static_cast<int>(t->shape[0]), t->ToF32Vector().data());
      ReleaseMappedPages(t->data, t->nbytes());
      j0 += static_cast<int>(t->shape[0]);
    }
    return out;
  }
  if (format == WeightFormat::kAmxBf16 || format == WeightFormat::kW8A8) {
    std::vector<float> all;
    all.reserve(static_cast<size_t>(out.n_) * out.k_);
    for (const TensorView* t : parts) {
      const std::vector<float> f = t->ToF32Vector();
      all.insert(all.end(), f.begin(), f.end());
    }
    if (format == WeightFormat::kAmxBf16) {
      out.PackAmx(all.data());
    } else {
      out.PackW8A8(all.data());
    }
    for (const TensorView* t : parts) ReleaseMappedPages(t->data, t->nbytes());
    return out;
  }
  out.owned_.resize(static_cast<size_t>(WeightRowBytes(format, out.k_) * owned_rows));
  const size_t in_place_row = static_cast<size_t>(WeightRowBytes(format, out.k_));
  for (const TensorView* t : parts) {
    const int rows = static_cast<int>(t->shape[0]);
    if (ReadsInPlace(format, t->dtype)) {
      const auto* base = static_cast<const uint8_t*>(t->data);
      for (int r = 0; r < rows; ++r)
        out.rows_.push_back(WeightRow{base + r * in_place_row, nullptr});
    } else {
      out.PackRows(t->ToF32Vector().data(), rows);
      ReleaseMappedPages(t->data, t->nbytes());
    }
  }
  return out;
}

}  // namespace morserve
