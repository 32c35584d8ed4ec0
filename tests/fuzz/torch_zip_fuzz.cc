// Fuzzes the PyTorch zip checkpoint loader (engine/io/torch_zip.cc: libzip, the archive
// layout, the pickled state dict, storage bounds) on whole pytorch_model.bin files, written
// to the scratch directory because the loader reads a path. Property: every loaded tensor's
// bytes are readable (ASan) and match its shape and dtype.
#include "engine/io/tensor_store.h"
#include "engine/io/torch_zip.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace morserve;
  static const std::string path = fuzz::ScratchDir() + "/pytorch_model.bin";
  fuzz::WriteFile(path, fuzz::AsText(data, size));
  TensorStore store;
  absl::Status s = LoadTorchZip(path, &store);
  if (!s.ok()) {
    fuzz::Check(!s.message().empty(), "an error says what is wrong");
    return 0;
  }
  for (const auto& [name, v] : store.tensors()) {
    fuzz::TouchBytes(v.data, v.nbytes());
    if (v.numel() <= 4096) (void)v.ToF32Vector();
  }
  return 0;
}
