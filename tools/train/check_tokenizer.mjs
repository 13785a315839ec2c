// Encodes texts with an independent tokenizer implementation (@lenml/tokenizers, a port of transformers.js)
// so train_default_model.py can check that its Python BPE encoder produces the same ids.
// Usage: node check_tokenizer.mjs <tokenizer.json> <texts.json: ["...", ...]>  -> prints [[ids...], ...]
import { readFileSync } from "node:fs";

const lenmlUrl = new URL("../../tests/conformance/node_modules/@lenml/tokenizers/dist/main.mjs", import.meta.url);
const { TokenizerLoader } = await import(lenmlUrl.href);

const [tokenizerPath, textsPath] = process.argv.slice(2);
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(readFileSync(tokenizerPath, "utf8")),
  tokenizerConfig: { tokenizer_class: "PreTrainedTokenizerFast", add_bos_token: false, add_eos_token: false },
});
const texts = JSON.parse(readFileSync(textsPath, "utf8"));
const ids = texts.map((t) => Array.from(tokenizer.encode(t, { add_special_tokens: false })));
process.stdout.write(JSON.stringify(ids));
