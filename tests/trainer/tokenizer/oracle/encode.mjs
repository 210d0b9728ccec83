// The oracle: encodes a UTF-8 file as one document with Hugging Face's JavaScript tokenizers
// (add_special_tokens = true, as meshrun-tokenize does) and writes the ids as little-endian uint32.
// usage: node encode.mjs TOKENIZER.json CORPUS OUT.u32
// Prints "encode MB/s: X" (encoding only, MB per CPU second of the process: the benchmark's oracle figure).
import { readFileSync, writeFileSync, existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";

const [tokenizerPath, corpusPath, outPath] = process.argv.slice(2);
if (!outPath) {
  console.error("usage: node encode.mjs TOKENIZER.json CORPUS OUT.u32");
  process.exit(2);
}
const configPath = join(dirname(tokenizerPath), "tokenizer_config.json");
const config = existsSync(configPath) ? JSON.parse(readFileSync(configPath, "utf8")) : {};
const tokenizer = new Tokenizer(JSON.parse(readFileSync(tokenizerPath, "utf8")), config);
const bytes = readFileSync(corpusPath);
const text = bytes.toString("utf8");
const c0 = process.cpuUsage();
const { ids } = tokenizer.encode(text, { add_special_tokens: true });
const c1 = process.cpuUsage(c0);
const seconds = (c1.user + c1.system) / 1e6;  // CPU time: other load on a shared machine does not count
writeFileSync(outPath, Buffer.from(Uint32Array.from(ids).buffer));
console.log(`ids: ${ids.length}`);
console.log(`encode MB/s: ${(bytes.length / 1e6 / seconds).toFixed(2)}`);
