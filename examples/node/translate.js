// Greedy decoding of an s2s-deploy export with onnxruntime-node, from docs/manifest.md alone.
// usage: node translate.js EXPORT_DIR "sentence" ...
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

const WORD = /\w+|[^\w\s]/gu;

function split(text, level) {
  return level === 'char' ? Array.from(text) : (text.match(WORD) || []);
}

function zeros(spec, batch) {
  const dims = spec.shape.map((d) => (d === 'batch' ? batch : d));
  return new ort.Tensor(spec.dtype, new Float32Array(dims.reduce((a, b) => a * b, 1)), dims);
}

function int64(values, dims) {
  return new ort.Tensor('int64', BigInt64Array.from(values.map(BigInt)), dims);
}

async function main() {
  const [folder, ...texts] = process.argv.slice(2);
  const manifest = JSON.parse(fs.readFileSync(path.join(folder, 'manifest.json'), 'utf8'));
  const { source: srcVocab, target: tgtVocab } = manifest.vocab;
  const special = manifest.special_tokens;
  const index = new Map(srcVocab.tokens.map((token, i) => [token, i]));
  const options = { executionProviders: ['cpu'] };
  const encoder = await ort.InferenceSession.create(path.join(folder, manifest.graphs.encoder.file), options);
  const decoder = await ort.InferenceSession.create(path.join(folder, manifest.graphs.decoder.file), options);
  const decoderInputs = new Set(manifest.graphs.decoder.inputs.map((io) => io.name));
  const maxLen = manifest.limits.max_target_length || 256;

  for (const text of texts) {
    const unk = srcVocab.special.unk; // the source's own ids; special_tokens holds the target's
    const ids = [...srcVocab.prefix, ...split(text, srcVocab.level).map((t) => (index.has(t) ? index.get(t) : unk)),
      ...srcVocab.suffix];
    const encoded = await encoder.run({ src: int64(ids, [1, ids.length]), src_len: int64([ids.length], [1]) });
    const feeds = {};
    for (const m of manifest.memory) if (decoderInputs.has(m.name)) feeds[m.name] = encoded[m.name];
    for (const s of manifest.state) {
      feeds[`past_${s.name}`] = s.init === 'encoder' ? encoded[`init_${s.name}`] : zeros(s, 1);
    }
    let token = special.decoder_start;
    const output = [];
    for (let step = 0; step < maxLen; step += 1) {
      feeds.tokens = int64([token], [1]);
      feeds.reorder = int64([0], [1]);
      if (decoderInputs.has('step')) feeds.step = int64([step], []);
      const fetches = ['top_ids', ...manifest.state.map((s) => `present_${s.name}`)]; // top_k defaults to 1
      const result = await decoder.run(feeds, fetches);
      for (const s of manifest.state) feeds[`past_${s.name}`] = result[`present_${s.name}`];
      token = Number(result.top_ids.data[0]);
      if (token === special.eos) break;
      output.push(token);
    }
    const hidden = new Set([special.pad, special.bos, special.decoder_start, ...tgtVocab.hidden]);
    const words = output.filter((i) => !hidden.has(i)).map((i) => tgtVocab.tokens[i]);
    console.log(words.join(tgtVocab.level === 'char' ? '' : ' '));
  }
}

main().catch((error) => {
  console.error(`error: ${error.message}`);
  process.exit(1);
});
