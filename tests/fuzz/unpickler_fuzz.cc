// Fuzzes the restricted unpickler (engine/io/unpickler.cc) and the state-dict reader over it
// (engine/io/torch_zip.cc: ReadTorchStateDict, TorchStorageDType, CheckTorchTensor) on
// arbitrary pickle bytes: opcodes, memo references, stack underflow, nested containers.
// Property: the root of a pickle that runs is one of its values.
#include "engine/io/torch_zip.h"
#include "engine/io/unpickler.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace morserve;
  const std::string_view bytes = fuzz::AsText(data, size);
  absl::StatusOr<Unpickled> u = Unpickle(bytes);
  if (u.ok()) fuzz::Check(u->root < u->values.size(), "the root is a value");
  absl::StatusOr<std::vector<TorchTensorRecord>> records = ReadTorchStateDict(bytes, "fuzz.pkl");
  if (!records.ok()) return 0;
  for (const TorchTensorRecord& r : *records) {
    (void)TorchStorageDType(r, "fuzz.pkl");
    (void)CheckTorchTensor(r, "fuzz.pkl");
  }
  return 0;
}
