// Pickle VM for torch state dicts (see unpickler.h). Opcode values follow CPython's
// Lib/pickle.py; only the subset torch.save uses is implemented, the rest is an error.
#include "engine/io/unpickler.h"

#include <cstring>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace morserve {
namespace {

constexpr size_t kMaxStack = size_t{1} << 20;
constexpr size_t kMaxMarks = size_t{1} << 16;
constexpr size_t kMaxMemo = size_t{1} << 22;
constexpr size_t kMaxValues = size_t{1} << 23;
constexpr size_t kMaxGlobalLine = 256;

namespace op {
constexpr uint8_t kMark = '(', kStop = '.', kPop = '0', kBinFloat = 'G', kBinInt = 'J',
                  kBinInt1 = 'K', kBinInt2 = 'M', kNone = 'N', kBinPersId = 'Q', kReduce = 'R',
                  kBinString = 'T', kShortBinString = 'U', kBinUnicode = 'X', kAppend = 'a',
                  kBuild = 'b', kGlobal = 'c', kDict = 'd', kAppends = 'e', kBinGet = 'h',
                  kLongBinGet = 'j', kList = 'l', kBinPut = 'q', kLongBinPut = 'r', kSetItem = 's',
                  kTuple = 't', kSetItems = 'u', kEmptyDict = '}', kEmptyList = ']',
                  kEmptyTuple = ')', kProto = 0x80, kTuple1 = 0x85, kTuple2 = 0x86, kTuple3 = 0x87,
                  kNewTrue = 0x88, kNewFalse = 0x89, kLong1 = 0x8a, kShortBinUnicode = 0x8c,
                  kBinUnicode8 = 0x8d, kStackGlobal = 0x93, kMemoize = 0x94, kFrame = 0x95;
}  // namespace op

class Machine {
 public:
  explicit Machine(std::string_view in) : in_(in) {}

  absl::StatusOr<Unpickled> Run() {
    while (true) {
      op_pos_ = pos_;
      uint8_t code = 0;
      if (!ReadByte(&code)) return Error("truncated: no STOP opcode");
      op_ = code;
      if (code == op::kStop) break;
      if (absl::Status s = Step(code); !s.ok()) return s;
    }
    absl::StatusOr<PickleId> root = Pop();
    if (!root.ok()) return root.status();
    Unpickled out;
    out.values = std::move(values_);
    out.root = *root;
    return out;
  }

 private:
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("malformed pickle at byte %d (opcode 0x%02x): %s", op_pos_, op_, what));
  }

  // ---- input ----
  bool ReadByte(uint8_t* b) {
    if (pos_ >= in_.size()) return false;
    *b = static_cast<uint8_t>(in_[pos_++]);
    return true;
  }
  bool ReadBytes(uint64_t n, std::string_view* out) {
    if (n > in_.size() - pos_) return false;
    *out = in_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  // Little-endian unsigned integer of n <= 8 bytes.
  bool ReadLe(int n, uint64_t* v) {
    std::string_view b;
    if (!ReadBytes(n, &b)) return false;
    *v = 0;
    for (int i = n - 1; i >= 0; --i) *v = (*v << 8) | static_cast<uint8_t>(b[i]);
    return true;
  }
  bool ReadLine(std::string* line) {
    const size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos || end - pos_ > kMaxGlobalLine) return false;
    line->assign(in_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return true;
  }

  // ---- stack and values ----
  absl::StatusOr<PickleId> New(PickleValue v) {
    if (values_.size() >= kMaxValues) return Error("too many values");
    values_.push_back(std::move(v));
    return static_cast<PickleId>(values_.size() - 1);
  }
  absl::Status Push(PickleId id) {
    if (stack_.size() >= kMaxStack) return Error("stack too deep");
    stack_.push_back(id);
    return absl::OkStatus();
  }
  absl::Status PushNew(PickleValue v) {
    absl::StatusOr<PickleId> id = New(std::move(v));
    if (!id.ok()) return id.status();
    return Push(*id);
  }
  absl::StatusOr<PickleId> Pop() {
    if (stack_.size() <= StackFloor()) return Error("stack underflow");
    const PickleId id = stack_.back();
    stack_.pop_back();
    return id;
  }
  absl::StatusOr<PickleId> Top() {
    if (stack_.size() <= StackFloor()) return Error("stack underflow");
    return stack_.back();
  }
  // Items above the innermost MARK may not reach below it.
  size_t StackFloor() const { return marks_.empty() ? 0 : marks_.back(); }
  absl::StatusOr<std::vector<PickleId>> PopMark() {
    if (marks_.empty()) return Error("no MARK");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<PickleId> items(stack_.begin() + static_cast<ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return items;
  }
  // The value `id` refers to, when it has kind `kind`; else nullptr.
  PickleValue* As(PickleId id, PickleKind kind) {
    return values_[id].kind == kind ? &values_[id] : nullptr;
  }

  absl::Status Step(uint8_t code);
  absl::Status Scalar(uint8_t code);
  absl::Status String(uint8_t code);
  absl::Status Memo(uint8_t code);
  absl::Status Tuple(uint8_t code);
  absl::Status Global(uint8_t code);
  absl::Status Collection(uint8_t code);
  absl::Status Reduce();
  absl::Status RebuildTensor(const std::vector<PickleId>& args);
  absl::Status PersistentId();
  absl::Status Build();

  std::string_view in_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  uint8_t op_ = 0;
  std::vector<PickleValue> values_;
  std::vector<PickleId> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PickleId> memo_;
};

absl::Status Machine::Step(uint8_t code) {
  switch (code) {
    case op::kProto: {
      uint8_t version = 0;
      if (!ReadByte(&version)) return Error("truncated");
      if (version < 2 || version > 5) return Error(absl::StrCat("protocol ", version));
      return absl::OkStatus();
    }
    case op::kFrame: {
      uint64_t unused = 0;
      return ReadLe(8, &unused) ? absl::OkStatus() : Error("truncated");
    }
    case op::kMark:
      if (marks_.size() >= kMaxMarks) return Error("too many MARKs");
      marks_.push_back(stack_.size());
      return absl::OkStatus();
    case op::kPop:
      return Pop().status();
    case op::kNone:
    case op::kNewTrue:
    case op::kNewFalse:
    case op::kBinInt:
    case op::kBinInt1:
    case op::kBinInt2:
    case op::kLong1:
    case op::kBinFloat:
      return Scalar(code);
    case op::kBinUnicode:
    case op::kShortBinUnicode:
    case op::kBinUnicode8:
    case op::kBinString:
    case op::kShortBinString:
      return String(code);
    case op::kBinPut:
    case op::kLongBinPut:
    case op::kMemoize:
    case op::kBinGet:
    case op::kLongBinGet:
      return Memo(code);
    case op::kEmptyTuple:
    case op::kTuple:
    case op::kTuple1:
    case op::kTuple2:
    case op::kTuple3:
      return Tuple(code);
    case op::kGlobal:
    case op::kStackGlobal:
      return Global(code);
    case op::kEmptyDict:
    case op::kEmptyList:
    case op::kDict:
    case op::kList:
    case op::kSetItem:
    case op::kSetItems:
    case op::kAppend:
    case op::kAppends:
      return Collection(code);
    case op::kReduce:
      return Reduce();
    case op::kBinPersId:
      return PersistentId();
    case op::kBuild:
      return Build();
    default:
      return Error("unsupported opcode");
  }
}

absl::Status Machine::Scalar(uint8_t code) {
  PickleValue v;
  uint64_t raw = 0;
  switch (code) {
    case op::kNone:
      break;
    case op::kNewTrue:
    case op::kNewFalse:
      v.kind = PickleKind::kBool;
      v.int_value = code == op::kNewTrue;
      break;
    case op::kBinInt:
      if (!ReadLe(4, &raw)) return Error("truncated");
      v.kind = PickleKind::kInt;
      v.int_value = static_cast<int32_t>(static_cast<uint32_t>(raw));
      break;
    case op::kBinInt1:
    case op::kBinInt2:
      if (!ReadLe(code == op::kBinInt1 ? 1 : 2, &raw)) return Error("truncated");
      v.kind = PickleKind::kInt;
      v.int_value = static_cast<int64_t>(raw);
      break;
    case op::kLong1: {
      uint8_t n = 0;
      if (!ReadByte(&n)) return Error("truncated");
      if (n > 8) return Error("integer wider than 64 bits");
      if (!ReadLe(n, &raw)) return Error("truncated");
      if (n > 0 && n < 8 && (raw >> (8 * n - 1)) & 1) raw |= ~uint64_t{0} << (8 * n);  // sign
      v.kind = PickleKind::kInt;
      v.int_value = static_cast<int64_t>(raw);
      break;
    }
    case op::kBinFloat: {
      std::string_view b;
      if (!ReadBytes(8, &b)) return Error("truncated");
      for (int i = 0; i < 8; ++i) raw = (raw << 8) | static_cast<uint8_t>(b[i]);  // big-endian
      v.kind = PickleKind::kFloat;
      std::memcpy(&v.float_value, &raw, 8);
      break;
    }
  }
  return PushNew(std::move(v));
}

absl::Status Machine::String(uint8_t code) {
  uint64_t n = 0;
  const int width = (code == op::kShortBinUnicode || code == op::kShortBinString) ? 1
                    : code == op::kBinUnicode8                                    ? 8
                                                                                  : 4;
  if (!ReadLe(width, &n)) return Error("truncated");
  std::string_view bytes;
  if (!ReadBytes(n, &bytes)) return Error(absl::StrCat("string of ", n, " bytes past the end"));
  PickleValue v;
  v.kind = PickleKind::kString;
  v.str.assign(bytes);
  return PushNew(std::move(v));
}

absl::Status Machine::Memo(uint8_t code) {
  uint64_t index = 0;
  switch (code) {
    case op::kBinPut:
    case op::kLongBinPut:
    case op::kMemoize: {
      if (code == op::kMemoize) {
        index = memo_.size();
      } else if (!ReadLe(code == op::kBinPut ? 1 : 4, &index)) {
        return Error("truncated");
      }
      absl::StatusOr<PickleId> top = Top();
      if (!top.ok()) return top.status();
      if (memo_.size() >= kMaxMemo && !memo_.contains(index)) return Error("memo too large");
      memo_[index] = *top;
      return absl::OkStatus();
    }
    default: {
      if (!ReadLe(code == op::kBinGet ? 1 : 4, &index)) return Error("truncated");
      const auto it = memo_.find(index);
      if (it == memo_.end()) return Error(absl::StrCat("memo key ", index, " not set"));
      return Push(it->second);
    }
  }
}

absl::Status Machine::Tuple(uint8_t code) {
  PickleValue v;
  v.kind = PickleKind::kTuple;
  if (code == op::kTuple) {
    absl::StatusOr<std::vector<PickleId>> items = PopMark();
    if (!items.ok()) return items.status();
    v.items = *std::move(items);
  } else if (code != op::kEmptyTuple) {
    const size_t n = code - op::kTuple1 + 1;
    v.items.resize(n);
    for (size_t i = n; i-- > 0;) {
      absl::StatusOr<PickleId> item = Pop();
      if (!item.ok()) return item.status();
      v.items[i] = *item;
    }
  }
  return PushNew(std::move(v));
}

absl::Status Machine::Global(uint8_t code) {
  PickleValue v;
  v.kind = PickleKind::kGlobal;
  if (code == op::kGlobal) {
    std::string module, name;
    if (!ReadLine(&module) || !ReadLine(&name)) return Error("bad GLOBAL name");
    v.str = absl::StrCat(module, ".", name);
  } else {
    absl::StatusOr<PickleId> name = Pop();
    if (!name.ok()) return name.status();
    absl::StatusOr<PickleId> module = Pop();
    if (!module.ok()) return module.status();
    const PickleValue* n = As(*name, PickleKind::kString);
    const PickleValue* m = As(*module, PickleKind::kString);
    if (n == nullptr || m == nullptr) return Error("STACK_GLOBAL needs two strings");
    v.str = absl::StrCat(m->str, ".", n->str);
  }
  return PushNew(std::move(v));
}

absl::Status Machine::Collection(uint8_t code) {
  if (code == op::kEmptyDict || code == op::kEmptyList || code == op::kDict || code == op::kList) {
    PickleValue v;
    v.kind = (code == op::kEmptyDict || code == op::kDict) ? PickleKind::kDict : PickleKind::kList;
    if (code == op::kDict || code == op::kList) {
      absl::StatusOr<std::vector<PickleId>> items = PopMark();
      if (!items.ok()) return items.status();
      if (code == op::kDict && items->size() % 2 != 0) return Error("odd number of dict items");
      v.items = *std::move(items);
    }
    return PushNew(std::move(v));
  }
  std::vector<PickleId> items;
  if (code == op::kSetItems || code == op::kAppends) {
    absl::StatusOr<std::vector<PickleId>> marked = PopMark();
    if (!marked.ok()) return marked.status();
    items = *std::move(marked);
  } else {
    const int n = code == op::kSetItem ? 2 : 1;
    items.resize(n);
    for (int i = n - 1; i >= 0; --i) {
      absl::StatusOr<PickleId> item = Pop();
      if (!item.ok()) return item.status();
      items[i] = *item;
    }
  }
  absl::StatusOr<PickleId> target = Top();
  if (!target.ok()) return target.status();
  const bool to_dict = code == op::kSetItem || code == op::kSetItems;
  PickleValue* container = As(*target, to_dict ? PickleKind::kDict : PickleKind::kList);
  if (container == nullptr)
    return Error(to_dict ? "SETITEM on a non-dict" : "APPEND on a non-list");
  if (to_dict && items.size() % 2 != 0) return Error("odd number of dict items");
  container->items.insert(container->items.end(), items.begin(), items.end());
  return absl::OkStatus();
}

absl::Status Machine::Reduce() {
  absl::StatusOr<PickleId> args_id = Pop();
  if (!args_id.ok()) return args_id.status();
  absl::StatusOr<PickleId> callable_id = Pop();
  if (!callable_id.ok()) return callable_id.status();
  const PickleValue* callable = As(*callable_id, PickleKind::kGlobal);
  const PickleValue* args = As(*args_id, PickleKind::kTuple);
  if (callable == nullptr || args == nullptr) return Error("REDUCE needs a global and a tuple");
  const std::string& name = callable->str;
  const std::vector<PickleId> arg_ids = args->items;  // copy: New() may move values_
  if (name == "collections.OrderedDict" && arg_ids.empty()) {
    PickleValue dict;
    dict.kind = PickleKind::kDict;
    return PushNew(std::move(dict));
  }
  if (name == "torch._utils._rebuild_tensor_v2") return RebuildTensor(arg_ids);
  if (name == "torch._utils._rebuild_parameter" ||
      name == "torch._utils._rebuild_parameter_with_state") {
    if (arg_ids.empty() || As(arg_ids[0], PickleKind::kTensor) == nullptr) {
      return Error(absl::StrCat(name, " without a tensor"));
    }
    return Push(arg_ids[0]);  // a Parameter is its data tensor
  }
  return Error(absl::StrCat("unsupported callable ", name));
}

absl::Status Machine::RebuildTensor(const std::vector<PickleId>& args) {
  // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
  if (args.size() < 4) return Error("_rebuild_tensor_v2 needs at least 4 arguments");
  const PickleValue* offset = As(args[1], PickleKind::kInt);
  const PickleValue* size = As(args[2], PickleKind::kTuple);
  const PickleValue* stride = As(args[3], PickleKind::kTuple);
  if (As(args[0], PickleKind::kStorage) == nullptr || offset == nullptr || size == nullptr ||
      stride == nullptr) {
    return Error("_rebuild_tensor_v2 arguments are not (storage, int, tuple, tuple, ...)");
  }
  PickleValue t;
  t.kind = PickleKind::kTensor;
  t.storage = args[0];
  t.storage_offset = offset->int_value;
  for (const auto& [tuple, out] : {std::pair{size, &t.shape}, std::pair{stride, &t.stride}}) {
    for (PickleId id : tuple->items) {
      const PickleValue* dim = As(id, PickleKind::kInt);
      if (dim == nullptr) return Error("tensor size or stride is not an int");
      out->push_back(dim->int_value);
    }
  }
  return PushNew(std::move(t));
}

absl::Status Machine::PersistentId() {
  absl::StatusOr<PickleId> pid_id = Pop();
  if (!pid_id.ok()) return pid_id.status();
  const PickleValue* pid = As(*pid_id, PickleKind::kTuple);
  if (pid == nullptr || pid->items.size() != 5) return Error("persistent id is not a 5-tuple");
  const PickleValue* tag = As(pid->items[0], PickleKind::kString);
  const PickleValue* type = As(pid->items[1], PickleKind::kGlobal);
  const PickleValue* key = As(pid->items[2], PickleKind::kString);
  const PickleValue* numel = As(pid->items[4], PickleKind::kInt);
  if (tag == nullptr || tag->str != "storage" || type == nullptr || key == nullptr ||
      numel == nullptr) {
    return Error("persistent id is not ('storage', type, key, location, numel)");
  }
  PickleValue storage;
  storage.kind = PickleKind::kStorage;
  storage.str = key->str;
  storage.storage_type = type->str;
  storage.storage_numel = numel->int_value;
  return PushNew(std::move(storage));
}

absl::Status Machine::Build() {
  absl::StatusOr<PickleId> state = Pop();
  if (!state.ok()) return state.status();
  absl::StatusOr<PickleId> target = Top();
  if (!target.ok()) return target.status();
  // torch.save's OrderedDict carries `_metadata` (module versions) as its state: not needed.
  if (As(*target, PickleKind::kDict) == nullptr) return Error("BUILD on a non-dict");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Unpickled> Unpickle(std::string_view bytes) { return Machine(bytes).Run(); }

}  // namespace morserve
