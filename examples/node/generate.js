// One call per batch: run an export's generate.onnx (greedy or beam search inside an ONNX Loop).
// usage: node generate.js EXPORT_DIR BEAM "sentence" ...      (run `s2s-deploy fuse EXPORT_DIR` first)
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

const WORD = /\w+|[^\w\s]/gu;
const scalar = (type, value) => new ort.Tensor(type, type === 'int64' ? [BigInt(value)] : [value], []);

async function main() {
  const [folder, beamText, ...texts] = process.argv.slice(2);
  const manifest = JSON.parse(fs.readFileSync(path.join(folder, 'manifest.json'), 'utf8'));
  const { source: srcVocab, target: tgtVocab } = manifest.vocab;
  const special = manifest.special_tokens;
  for (const { level } of [srcVocab, tgtVocab]) {
    if (level !== 'char' && level !== 'word') throw new Error(`a ${level} vocabulary needs its tokenizer library (docs/manifest.md)`);
  }
  const index = new Map(srcVocab.tokens.map((token, i) => [token, i]));
  const hidden = new Set([special.pad, special.bos, special.decoder_start, ...tgtVocab.hidden]);
  const graph = manifest.graphs.generate;
  const session = await ort.InferenceSession.create(path.join(folder, graph.file), { executionProviders: ['cpu'] });
  const beam = Number(beamText);
  const maxLen = manifest.limits.max_target_length || 256;

  for (const text of texts) {
    const pieces = srcVocab.level === 'char' ? Array.from(text) : (text.match(WORD) || []);
    const unk = srcVocab.special.unk; // the source's own ids; special_tokens holds the target's
    const ids = [...srcVocab.prefix, ...pieces.map((t) => (index.has(t) ? index.get(t) : unk)), ...srcVocab.suffix];
    const feeds = {
      src: new ort.Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, ids.length]),
      src_len: new ort.Tensor('int64', [BigInt(ids.length)], [1]),
      max_len: scalar('int64', maxLen),
      min_len: scalar('int64', 0),
      alpha: scalar('float32', manifest.search.alpha ?? manifest.search.length_penalty_alpha), // formats 2-6: the older key
    };
    if (graph.search === 'beam') Object.assign(feeds, { beam_size: scalar('int64', beam), n_best: scalar('int64', 1) });
    const out = await session.run(feeds);
    const length = Number(out.lengths.data[0]);
    const best = Array.from(out.tokens.data.slice(0, length), Number);
    const words = [];
    for (const id of best) {
      if (id === special.eos) break;
      if (!hidden.has(id)) words.push(tgtVocab.tokens[id]);
    }
    console.log(words.join(tgtVocab.level === 'char' ? '' : ' '));
  }
}

main().catch((error) => {
  console.error(`error: ${error.message}`);
  process.exit(1);
});
