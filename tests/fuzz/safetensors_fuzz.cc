// Fuzzes the safetensors parser (engine/io/safetensors.cc) on whole files: the 8-byte header
// length, the JSON header, dtypes, shapes and data offsets. Property: a file that parses yields
// views that lie wholly inside the input (every byte is read under ASan) and whose element
// count matches their byte count.
#include <vector>

#include "engine/io/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace morserve;
  absl::StatusOr<std::vector<TensorView>> views = ParseSafetensors(data, size, "fuzz.safetensors");
  if (!views.ok()) {
    fuzz::Check(!views.status().message().empty(), "an error says what is wrong");
    return 0;
  }
  for (const TensorView& v : *views) {
    const uint8_t* p = static_cast<const uint8_t*>(v.data);
    fuzz::Check(v.nbytes() == 0 || (p >= data && p + v.nbytes() <= data + size),
                "a view lies inside the file");
    if (v.nbytes() > 0) fuzz::TouchBytes(p, v.nbytes());
    if (v.numel() <= 4096) (void)v.ToF32Vector();
  }
  return 0;
}
