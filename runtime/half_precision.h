// float16/bfloat16 storage, float32 compute: the one home of the half ↔ float conversions, and the model pass that
// widens a half-precision model to float32 where the runtime loads it (docs/runtime.md, "Half precision").
#pragma once

#include <bit>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "graph/dtype.h"
#include "graph/task_graph.h"
#include "runtime/tensor.h"

namespace onnx {
class ModelProto;
}

namespace apart {

// --- Scalar conversions (bit patterns as uint16_t) ---
// Widening is exact: every float16 and bfloat16 value is a float32 value (subnormals, ±0, ±inf; a NaN keeps its sign
// and payload), so all 65,536 patterns of each round-trip through float32 bitwise.
// Narrowing rounds to nearest, ties to even (IEEE 754's default, as numpy, torch and F16C do); values past the largest
// finite half round to ±inf as that rule says (float16: |x| ≥ 65520); a NaN stays a NaN of the same sign with the top of
// its payload (the quiet bit set only when nothing of the payload survives, as numpy does).

constexpr float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | mantissa << 13);  // inf, NaN
  if (exponent != 0) return std::bit_cast<float>(sign | (exponent + 112) << 23 | mantissa << 13);
  // Zero or subnormal: mantissa · 2^-24, exact in float32 (a 10-bit integer times a power of two).
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

constexpr uint16_t float_to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) {  // NaN
    const uint16_t payload = static_cast<uint16_t>(a >> 13 & 0x3ffu);
    return static_cast<uint16_t>(sign | 0x7c00u | (payload ? payload : 0x200u));
  }
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // ≥ 65520 (and inf): inf
  if (a < 0x38800000u) {
    // Below float16's least normal 2^-14: adding 0.5 puts the subnormal's bits at the bottom of the sum's mantissa,
    // and float32's own addition rounds them to nearest even (the sum stays in [0.5, 1), one binade).
    const float sum = std::bit_cast<float>(a) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(sum) - 0x3f000000u));
  }
  // Normal: rebias the exponent, then round the 13 dropped bits to nearest even (a carry into the exponent is right:
  // it gives the next binade, or inf past 65504).
  const uint32_t odd = (a >> 13) & 1u;
  return static_cast<uint16_t>(sign | ((a - (112u << 23) + 0xfffu + odd) >> 13));
}

constexpr float bfloat16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

constexpr uint16_t float_to_bfloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN
    const uint16_t top = static_cast<uint16_t>(x >> 16);
    return static_cast<uint16_t>((top & 0x7fu) ? top : top | 0x40u);
  }
  // bfloat16 is float32's top half: round the bottom 16 bits to nearest even (overflow carries into inf).
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// A double rounded once to float16/bfloat16 (Cast from DOUBLE): rounding to float32 first could round twice. Rounding
// to float32 *to odd* (truncate, then set the last bit when inexact) and then to nearest even is exact, as float32
// carries more than twice the bits plus two of either half format (Boldo & Melquiond, "Emulation of FMA and correctly
// rounded sums: proved algorithms using rounding to odd", IEEE TC 2008).
float float_rounded_to_odd(double d);
inline uint16_t double_to_half(double d) { return float_to_half(float_rounded_to_odd(d)); }
inline uint16_t double_to_bfloat16(double d) { return float_to_bfloat16(float_rounded_to_odd(d)); }

// Whether `t` is float16 or bfloat16.
constexpr bool is_half(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }
// A half pattern of `t` (float16 or bfloat16) as float, and a float rounded to `t`.
inline float half_bits_to_float(DType t, uint16_t bits) { return t == DType::kFloat16 ? half_to_float(bits) : bfloat16_to_float(bits); }
inline uint16_t float_to_half_bits(DType t, float f) { return t == DType::kFloat16 ? float_to_half(f) : float_to_bfloat16(f); }

// --- Tensors (host) ---
// A float16/bfloat16 tensor widened to float32 (a new tensor).
Tensor widen_to_float32(const Tensor& half);
// A float32 tensor rounded to `to` (float16 or bfloat16), to nearest even (a new tensor).
Tensor narrow_from_float32(const Tensor& wide, DType to);
// A float32 tensor whose values are `wide`'s rounded to `half` (float16 or bfloat16) and widened back: what a GEMM
// reading `half` operands multiplies (float16: ±inf past 65504, zero below 2^-25), in float32 storage.
Tensor rounded_through(const Tensor& wide, DType half);

// --- The model pass ---
// What widen_half_precision changed.
struct HalfWidening {
  int64_t tensors = 0;        // initializers and tensor attributes (Constant, ConstantOfShape values) widened
  int64_t stored_bytes = 0;   // their bytes as stored (half)
  std::set<DType> formats;    // the half dtypes they were stored in
  int64_t casts = 0;          // Cast(to=FLOAT16|BFLOAT16) made Cast(to=FLOAT), and `dtype` attributes made FLOAT
  int64_t value_types = 0;    // other declared types made FLOAT: value_info, initializers' inputs, subgraphs' inputs/outputs
  std::map<std::string, DType> inputs;   // graph inputs that were half: name → their stored dtype (fed as either)
  std::map<std::string, DType> outputs;  // graph outputs that were half: name → their stored dtype
  bool changed() const { return tensors > 0 || casts > 0 || value_types > 0 || !inputs.empty() || !outputs.empty(); }
};

// Whether any tensor, value type, Cast or dtype attribute of the model (main graph and subgraphs) is half.
bool has_half_precision(const onnx::ModelProto& model);

// Makes a float16/bfloat16 model compute in float32, keeping its node list (node indices stay the task graph's):
// every FLOAT16/BFLOAT16 initializer and tensor attribute is widened to FLOAT (the float32 master weights; data read
// under `base_dir` when external, written inline), every Cast(to=FLOAT16|BFLOAT16) becomes a Cast to FLOAT (the
// rounding dropped: compute is float32 end to end, docs/runtime.md says why), a `dtype` attribute of FLOAT16/BFLOAT16
// (RandomNormal, EyeLike…) becomes FLOAT, and every half graph input, output and value_info is declared FLOAT. After
// it no value of the model is half, so its task graph is the half model's with each half value float32.
// Deterministic and idempotent (a float32 model is left as it is), so every reader applies it alike.
// Throws what tensor_from_proto throws for an unreadable initializer; Unsupported when the widened weights would pass
// protobuf's 2 GiB limit.
HalfWidening widen_half_precision(onnx::ModelProto& model, const std::filesystem::path& base_dir);

// One line for stderr (an `apart: note:`), "" when nothing was widened.
std::string half_widening_note(const HalfWidening& widened);

// The task graph of a widened model from the half model's: every float16/bfloat16 value float32, and the Cast `to` and
// `dtype` attributes widen_half_precision rewrites rewritten alike (all that differs, as it leaves no half value; the
// executor uses it for a model imported before widening).
void widen_half_values(TaskGraph& graph);

}  // namespace apart
