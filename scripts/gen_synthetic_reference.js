// Runs the synthetic tokenizers written by gen_synthetic_tokenizers.py
// through Hugging Face tokenizers (npm `tokenizers`) and writes the golden
// file the tokenizer tests read.
//   node gen_synthetic_reference.js IN_DIR OUT_JSON
const fs = require('fs');
const path = require('path');
const {Tokenizer} = require('tokenizers');

(async () => {
  const [dir, outFile] = process.argv.slice(2);
  const {variants, cases} = JSON.parse(fs.readFileSync(path.join(dir, 'cases.json'), 'utf8'));
  const out = {cases, variants: {}};
  for (const name of variants) {
    const file = path.join(dir, name + '.json');
    const t = Tokenizer.fromFile(file);
    const v = {tokenizer: JSON.parse(fs.readFileSync(file, 'utf8')), results: []};
    for (const text of cases) {
      const plain = Array.from((await t.encode(text, null, {addSpecialTokens: false})).getIds());
      const special = Array.from((await t.encode(text, null, {addSpecialTokens: true})).getIds());
      v.results.push({
        ids: plain,
        ids_special: special,
        decoded: await t.decode(special, false),
        decoded_skip: await t.decode(special, true),
      });
    }
    out.variants[name] = v;
  }
  fs.writeFileSync(outFile, JSON.stringify(out) + '\n');
})();
