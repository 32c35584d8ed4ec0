// Encodes each input with @lenml/tokenizers (the transformers.js port the tokenizer parity
// tests use) loaded from a tokenizer directory written by `morserve mktokenizer`, and prints
// one JSON line per input: {name, ids (with BOS), decoded}. Inputs: files named on the command
// line, then 200 random Unicode strings from a fixed seed (names "random-N", text included).
// usage: node parity.mjs TOKENIZER_DIR FILE...
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { TokenizerLoader } from "@lenml/tokenizers";

const [dir, ...files] = process.argv.slice(2);
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")),
});

function rng(seed) {  // mulberry32
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const ranges = [[0x20, 0x7e], [0x0a, 0x0d], [0x20, 0x20], [0xa0, 0xff], [0x370, 0x3ff],
  [0x300, 0x36f], [0x4e00, 0x4fff], [0x2000, 0x200b], [0x1f600, 0x1f64f], [0x30, 0x39]];
const r = rng(11);
const inputs = files.map((f) => ({ name: f, text: readFileSync(f, "utf8") }));
for (let i = 0; i < 200; i++) {
  let text = "";
  const n = 1 + Math.floor(r() * 60);
  for (let k = 0; k < n; k++) {
    const [lo, hi] = ranges[Math.floor(r() * ranges.length)];
    text += String.fromCodePoint(lo + Math.floor(r() * (hi - lo + 1)));
  }
  inputs.push({ name: `random-${i}`, text, random: true });
}
inputs.push({ name: "chat", text: tok.apply_chat_template(
  [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi <|eot_id|> there" }],
  { tokenize: false, add_generation_prompt: true }), random: true });
for (const { name, text, random } of inputs) {
  const ids = tok.encode(text);
  const line = { name, ids, decoded: tok.decode(ids, { skip_special_tokens: false }) };
  if (random) line.text = text;
  console.log(JSON.stringify(line));
}
