// A small pickle virtual machine for PyTorch checkpoints (data.pkl of a torch.save zip).
// It understands the opcodes torch.save emits for a state dict (protocol 2, plus the few
// protocol 4 framing opcodes) and exactly four callables: collections.OrderedDict,
// torch._utils._rebuild_tensor_v2 and torch._utils._rebuild_parameter(_with_state).
// Nothing is ever imported or executed. Values live in a flat arena addressed by id, so
// memo sharing and cycles are harmless and destruction never recurses. Stack, memo and
// value counts are bounded; any malformed input is an error, never a crash.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace morserve {

using PickleId = uint32_t;

enum class PickleKind {
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,  // str (and Python 2 byte strings)
  kTuple,
  kList,
  kDict,     // dict or OrderedDict, in insertion order
  kGlobal,   // a name from GLOBAL, "module.name"; only called through REDUCE
  kStorage,  // a persistent id ('storage', type, key, location, numel)
  kTensor,   // the result of _rebuild_tensor_v2
};

struct PickleValue {
  PickleKind kind = PickleKind::kNone;
  int64_t int_value = 0;  // kBool, kInt
  double float_value = 0;
  std::string str;              // kString; kGlobal: "module.name"; kStorage: storage key
  std::vector<PickleId> items;  // kTuple, kList; kDict: key, value, key, value, ...
  // kStorage: the storage class ("torch.BFloat16Storage") and its element count.
  std::string storage_type;
  int64_t storage_numel = 0;
  // kTensor: the storage value, element offset into it, sizes and strides.
  PickleId storage = 0;
  int64_t storage_offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
};

struct Unpickled {
  std::vector<PickleValue> values;
  PickleId root = 0;  // the value STOP returned
  const PickleValue& at(PickleId id) const { return values[id]; }
};

// Runs the pickle in `bytes`. Errors name the opcode and its byte offset.
absl::StatusOr<Unpickled> Unpickle(std::string_view bytes);

}  // namespace morserve
