#include "backend/kv_format.h"

#include <charconv>
#include <optional>

namespace ember {
namespace {
constexpr KvDType kAll[] = {KvDType::kAuto, KvDType::kF32,  KvDType::kBF16, KvDType::kF16,
                            KvDType::kFP8,  KvDType::kInt8, KvDType::kInt4};

std::optional<int32_t> ParseLayerIndex(std::string_view s) {
  int32_t v = 0;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, v);
  if (s.empty() || ec != std::errc() || p != end) return std::nullopt;
  return v;
}
}  // namespace

const char* KvDTypeName(KvDType dtype) {
  switch (dtype) {
    case KvDType::kAuto: return "auto";
    case KvDType::kF32: return "f32";
    case KvDType::kBF16: return "bf16";
    case KvDType::kF16: return "f16";
    case KvDType::kFP8: return "fp8";
    case KvDType::kInt8: return "int8";
    case KvDType::kInt4: return "int4";
  }
  return "?";
}

Result<KvDType> ParseKvDType(std::string_view value, std::string_view flag) {
  for (KvDType t : kAll)
    if (value == KvDTypeName(t)) return t;
  return Status::Error(std::string(flag) + " must be auto, f32, bf16, f16, fp8, int8 or int4, got '" +
                       std::string(value) + "'");
}

Result<std::vector<KvLayerOverride>> ParseKvLayerOverrides(std::string_view value) {
  std::vector<KvLayerOverride> out;
  while (!value.empty()) {
    const size_t comma = value.find(',');
    const std::string_view item = value.substr(0, comma);
    value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
    const auto bad = [&](const std::string& why) {
      return Status::Error("--kv-cache-dtype-layers: item '" + std::string(item) + "': " + why);
    };
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return bad("expected LAYERS=DTYPE (e.g. 0:1=bf16,-1=f32)");
    const std::string_view layers = item.substr(0, eq);
    KvLayerOverride o;
    EMBER_ASSIGN_OR_RETURN(o.dtype, ParseKvDType(item.substr(eq + 1), "--kv-cache-dtype-layers"));
    const size_t colon = layers.find(':');
    const auto first = ParseLayerIndex(layers.substr(0, colon));
    const auto last = colon == std::string_view::npos ? first : ParseLayerIndex(layers.substr(colon + 1));
    if (!first || !last) return bad("layers must be I or I:J (integers; negative from the end)");
    o.first = *first;
    o.last = *last;
    out.push_back(o);
  }
  return out;
}

Result<KvFormat> ResolveKvFormat(const KvCacheSpec& spec, int32_t num_layers) {
  KvFormat f;
  f.rotate_int4 = spec.rotate_int4;
  f.layers.assign(static_cast<size_t>(num_layers), spec.dtype);
  for (const KvLayerOverride& o : spec.layers) {
    const int32_t first = o.first < 0 ? num_layers + o.first : o.first;
    const int32_t last = o.last < 0 ? num_layers + o.last : o.last;
    if (first < 0 || last >= num_layers || first > last)
      return Status::Error("--kv-cache-dtype-layers: layers " + std::to_string(o.first) + ":" +
                           std::to_string(o.last) + " are not a range of this model's " +
                           std::to_string(num_layers) + " layers");
    for (int32_t l = first; l <= last; ++l) f.layers[static_cast<size_t>(l)] = o.dtype;
  }
  return f;
}

bool KvFormat::AllAuto() const {
  for (KvDType t : layers)
    if (t != KvDType::kAuto) return false;
  return true;
}

std::string KvFormat::Describe() const {
  std::string out;
  bool int4 = false;
  size_t runs = 0;
  for (size_t l = 0; l < layers.size();) {
    size_t end = l;
    while (end + 1 < layers.size() && layers[end + 1] == layers[l]) ++end;
    int4 = int4 || layers[l] == KvDType::kInt4;
    if (runs++ > 0) out += ", ";
    out += KvDTypeName(layers[l]);
    if (l != 0 || end + 1 != layers.size()) {
      out += runs == 1 ? " (layers " : " (";
      out += std::to_string(l);
      if (end > l) {
        out += '-';
        out += std::to_string(end);
      }
      out += ')';
    }
    l = end + 1;
  }
  if (int4 && !rotate_int4) out += " (int4 without rotation)";
  return out;
}

}  // namespace ember
