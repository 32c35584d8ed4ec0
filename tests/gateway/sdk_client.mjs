// Runs OpenAI requests through the official `openai` npm SDK against morserve-gateway and
// writes what the SDK returned, normalized per choice (text, finish reason, logprob tokens and
// values) plus usage (and a chat completion's top-level prompt_logprobs), for
// gateway_sdk_test to compare with the gRPC server's answers.
// usage: node sdk_client.mjs BASE_URL CASES.json OUT.json
import { readFileSync, writeFileSync } from "node:fs";
import OpenAI from "openai";

const [baseURL, casesPath, outPath] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "test-key", maxRetries: 0 });
const cases = JSON.parse(readFileSync(casesPath, "utf8"));

function choiceSlot(choices, index) {
  choices[index] ??= { index, text: "", finish_reason: null, tokens: [], token_logprobs: [] };
  return choices[index];
}

// Completions' legacy logprobs or chat's content list into tokens / token_logprobs.
function addLogprobs(slot, lp) {
  if (!lp) return;
  if (Array.isArray(lp.content)) {
    for (const t of lp.content) {
      slot.tokens.push(t.token);
      slot.token_logprobs.push(t.logprob);
    }
  } else if (Array.isArray(lp.tokens)) {
    slot.tokens.push(...lp.tokens);
    slot.token_logprobs.push(...lp.token_logprobs);
  }
}

async function runCase(c) {
  const api = c.chat ? client.chat.completions : client.completions;
  const choices = [];
  let usage = null;
  let chunks = 0;
  let promptLogprobs = null;
  if (!c.stream) {
    const r = await api.create(c.params);
    for (const ch of r.choices) {
      const slot = choiceSlot(choices, ch.index);
      slot.text = c.chat ? ch.message.content : ch.text;
      slot.finish_reason = ch.finish_reason;
      addLogprobs(slot, ch.logprobs);
    }
    usage = r.usage;
    promptLogprobs = r.prompt_logprobs ?? null; // vLLM's chat extension (top level)
  } else {
    const stream = await api.create({ ...c.params, stream: true });
    for await (const chunk of stream) {
      ++chunks;
      if (chunk.usage) usage = chunk.usage;
      for (const ch of chunk.choices) {
        const slot = choiceSlot(choices, ch.index);
        slot.text += (c.chat ? ch.delta?.content : ch.text) ?? "";
        if (ch.finish_reason) slot.finish_reason = ch.finish_reason;
        addLogprobs(slot, ch.logprobs);
      }
    }
  }
  return { name: c.name, choices, usage, chunks, prompt_logprobs: promptLogprobs };
}

const results = [];
for (const c of cases) {
  try {
    results.push(await runCase(c));
  } catch (e) {
    results.push({ name: c.name, error: String(e?.stack ?? e) });
  }
}
writeFileSync(outPath, JSON.stringify(results, null, 1));
