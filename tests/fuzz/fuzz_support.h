// Shared pieces of the fuzz harnesses (tests/fuzz/*_fuzz.cc): splitting one input into parts,
// a per-process scratch directory for parsers that read files, the fixed tokenizers the
// text harnesses run on, and the property check that turns a broken invariant into a crash
// libFuzzer reports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

// The entry point every harness defines (libFuzzer's, or replay_main.cc's caller).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace morserve::fuzz {

// Aborts with `what` when `ok` is false: a violated property is a finding, like a crash.
void Check(bool ok, const char* what);

// The input as text.
inline std::string_view AsText(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Splits `text` at NUL bytes into at most `max_parts` parts (the last keeps any further NULs).
// JSON, YAML and templates hold no NUL, so it separates the files one input carries.
std::vector<std::string_view> SplitAtNul(std::string_view text, size_t max_parts);

// A directory private to this process, removed at exit.
const std::string& ScratchDir();
// Writes `bytes` to `path`, replacing it.
void WriteFile(const std::string& path, std::string_view bytes);
std::string ReadFile(const std::string& path);

// Reads every byte of [p, p + n) so that ASan checks the whole range.
void TouchBytes(const void* p, size_t n);

// DATA/<file>: the harnesses' fixed inputs (tests/fuzz/data).
std::string DataPath(const std::string& file);

// The two tokenizer shapes in use (tests/fuzz/data): byte-level BPE with a regex split
// (GPT-2, Llama 3, Qwen) and SentencePiece-style BPE with byte fallback (Llama 2).
const Tokenizer& ByteLevelTokenizer();
const Tokenizer& SentencePieceTokenizer();

}  // namespace morserve::fuzz
