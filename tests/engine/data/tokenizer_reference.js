// tokenizer_reference.js: Hugging Face's own tokenizer (npm `tokenizers`, its Rust library) on
// documents the C side wrote, for tests/engine/data/test_tokenizer.c (the reference ids) and
// tests/bench/bench_tokenizer.c (its speed on one thread).
//   node tokenizer_reference.js ids   NPM_DIR TOKENIZER_JSON DOCS OUT
//   node tokenizer_reference.js bench NPM_DIR TOKENIZER_JSON DOCS
//   node tokenizer_reference.js classes NPM_DIR PROPERTY...   e.g. 'L' 'N' 'M'
//   node tokenizer_reference.js nfc   NPM_DIR DOCS OUT
// NPM_DIR holds node_modules/tokenizers (scripts/lib/common.sh: ddtree_npm_install). DOCS is
// documents back to back, each a little-endian u32 byte count then its UTF-8 bytes. `ids`
// writes OUT the same way: per document a u32 id count then the u32 ids, of
// encode(text, add_special_tokens=False). `bench` prints "tokens N seconds S", S the process's CPU
// time encoding them all (encodeBatch; run it with RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
// for one core).
// `classes` prints {"L": [[first, last], ...], ...}: the code points the library's Oniguruma puts
// in \p{PROPERTY}, for daemon/engine/data/tokenizer_unicode.c (test_tokenizer --unicode-table).
// `nfc` writes OUT the NFC of each document of DOCS as the library's NFC normaliser gives it,
// framed as DOCS is (also for --unicode-table).
'use strict';
const fs = require('fs');
const path = require('path');

// The ranges of code points (surrogates and U+0001, the separator, left out) that a Split on
// \p{P} between separators isolates.
function classRanges(Tokenizer, property) {
  const cps = [];
  for (let c = 0; c <= 0x10ffff; c++) if (c !== 1 && (c < 0xd800 || c > 0xdfff)) cps.push(c);
  const text = '\x01' + cps.map((c) => String.fromCodePoint(c)).join('\x01') + '\x01';
  const json = {
    version: '1.0', added_tokens: [], normalizer: null, post_processor: null, decoder: null,
    pre_tokenizer: { type: 'Split', pattern: { Regex: `(?<=\\x01)\\p{${property}}(?=\\x01)` }, behavior: 'Isolated', invert: false },
    model: { type: 'BPE', vocab: { a: 0 }, merges: [] },
  };
  const pieces = Tokenizer.fromString(JSON.stringify(json)).getPreTokenizer().preTokenizeString(text);
  const ranges = [];
  for (const [piece] of pieces) {
    if (piece.includes('\x01')) continue;
    const c = piece.codePointAt(0);
    if (ranges.length && ranges[ranges.length - 1][1] === c - 1) ranges[ranges.length - 1][1] = c;
    else ranges.push([c, c]);
  }
  return ranges;
}

async function main() {
  const [mode, npmDir, tokenizerJson, docsPath, outPath] = process.argv.slice(2);
  if (mode === 'nfc' && tokenizerJson && docsPath) {   // nfc NPM_DIR DOCS OUT
    const { nfcNormalizer } = require(path.resolve(npmDir, 'node_modules', 'tokenizers'));
    const nfc = nfcNormalizer();
    const raw = fs.readFileSync(tokenizerJson);
    const parts = [];
    for (let at = 0; at < raw.length;) {
      const n = raw.readUInt32LE(at);
      const text = Buffer.from(nfc.normalizeString(raw.toString('utf8', at + 4, at + 4 + n)), 'utf8');
      const len = Buffer.alloc(4);
      len.writeUInt32LE(text.length);
      parts.push(len, text);
      at += 4 + n;
    }
    fs.writeFileSync(docsPath, Buffer.concat(parts));
    return;
  }
  if (mode === 'classes' && npmDir) {
    const { Tokenizer } = require(path.resolve(npmDir, 'node_modules', 'tokenizers'));
    const out = {};
    for (const property of process.argv.slice(4)) out[property] = classRanges(Tokenizer, property);
    console.log(JSON.stringify(out));
    return;
  }
  if (!['ids', 'bench'].includes(mode) || !docsPath || (mode === 'ids' && !outPath)) {
    console.error('usage: tokenizer_reference.js ids|bench NPM_DIR TOKENIZER_JSON DOCS [OUT] | classes NPM_DIR PROPERTY...');
    process.exit(2);
  }
  const { Tokenizer } = require(path.resolve(npmDir, 'node_modules', 'tokenizers'));
  const tokenizer = Tokenizer.fromFile(tokenizerJson);
  const raw = fs.readFileSync(docsPath);
  const docs = [];
  for (let at = 0; at < raw.length;) {
    const n = raw.readUInt32LE(at);
    docs.push(raw.toString('utf8', at + 4, at + 4 + n));
    at += 4 + n;
  }
  const cpu = process.cpuUsage();
  const encodings = await tokenizer.encodeBatch(docs, { addSpecialTokens: false });
  const used = process.cpuUsage(cpu);
  const seconds = (used.user + used.system) / 1e6;   // CPU time of the process: per core
  const ids = encodings.map((e) => e.getIds());
  if (mode === 'bench') {
    const tokens = ids.reduce((sum, x) => sum + x.length, 0);
    console.log(`tokens ${tokens} seconds ${seconds}`);
    return;
  }
  const words = ids.reduce((sum, x) => sum + 1 + x.length, 0);
  const out = Buffer.alloc(4 * words);
  let w = 0;
  for (const x of ids) {
    out.writeUInt32LE(x.length, 4 * w++);
    for (const id of x) out.writeUInt32LE(id, 4 * w++);
  }
  fs.writeFileSync(outPath, out);
}

main().catch((e) => {
  console.error(`tokenizer_reference.js: ${e.message || e}`);
  process.exit(1);
});
