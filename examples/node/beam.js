// Beam search over an s2s-deploy export with onnxruntime-node, written from docs/manifest.md
// ("Search, exactly") alone: one sentence at a time, K rows, the decoder called once per step.
// usage: node beam.js EXPORT_DIR BEAM N_BEST [--alpha A] [--max-len L] [--scores] "sentence" ...
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

const WORD = /\w+|[^\w\s]/gu;

function int64(values, dims) {
  return new ort.Tensor('int64', BigInt64Array.from(values.map(BigInt)), dims);
}

const ARRAYS = { float32: Float32Array, float16: Uint16Array }; // an fp16 export's cache; zero bits are 0.0

function zeros(spec, batch) {
  const dims = spec.shape.map((d) => (d === 'batch' ? batch : d));
  return new ort.Tensor(spec.dtype, new ARRAYS[spec.dtype](dims.reduce((a, b) => a * b, 1)), dims);
}

// numpy.repeat(tensor, k, axis): rows i*k .. i*k+k-1 are copies of row i
function repeat(tensor, k, axis) {
  const dims = tensor.dims;
  const outer = dims.slice(0, axis).reduce((a, b) => a * b, 1);
  const inner = dims.slice(axis + 1).reduce((a, b) => a * b, 1);
  const n = dims[axis];
  const data = new tensor.data.constructor(tensor.data.length * k);
  let at = 0;
  for (let o = 0; o < outer; o += 1) {
    for (let i = 0; i < n; i += 1) {
      const row = tensor.data.subarray((o * n + i) * inner, (o * n + i + 1) * inner);
      for (let c = 0; c < k; c += 1) { data.set(row, at); at += inner; }
    }
  }
  const shape = dims.slice();
  shape[axis] = n * k;
  return new ort.Tensor(tensor.type, data, shape);
}

const score = (sum, length, alpha) => sum / Math.pow(length, alpha);

// stable sort, descending by score: equal scores keep their earlier position
function rankDescending(items) {
  return items.map((item, i) => [item, i]).sort((a, b) => (b[0].score - a[0].score) || (a[1] - b[1])).map((p) => p[0]);
}

async function beamSearch(ctx, ids, K, nBest, alpha, maxLen) {
  const { manifest, encoder, decoder, decoderInputs } = ctx;
  const special = manifest.special_tokens;
  const eos = special.eos;
  const V = manifest.vocab.target.tokens.length;
  const W = Math.min(2 * K, V);
  const encoded = await encoder.run({ src: int64(ids, [1, ids.length]), src_len: int64([ids.length], [1]) });
  const feeds = {};
  for (const m of manifest.memory) if (decoderInputs.has(m.name)) feeds[m.name] = repeat(encoded[m.name], K, m.batch_axis);
  for (const s of manifest.state) {
    feeds[`past_${s.name}`] = s.init === 'encoder' ? repeat(encoded[`init_${s.name}`], K, s.batch_axis) : zeros(s, K);
  }
  // beam j: running sum (float64), and the trail of (parent, token, log p) per step
  let sums = Array.from({ length: K }, (_, j) => (j === 0 ? 0 : -Infinity));
  let tokens = new Array(K).fill(special.decoder_start);
  let reorder = Array.from({ length: K }, (_, j) => j);
  const trail = [];
  const finished = [];
  const spell = (step, row) => { // tokens and log-probs of the beam at `row` after `step`, walked back
    const out = [];
    for (let t = step; t >= 0; t -= 1) { out.push(trail[t].tokens[row]); row = trail[t].parents[row]; }
    return out.reverse();
  };
  let active = true;
  let t = 0;
  for (; t < maxLen && active; t += 1) {
    feeds.tokens = int64(tokens, [K]);
    feeds.reorder = int64(reorder, [K]);
    feeds.top_k = int64([W], [1]);
    if (decoderInputs.has('step')) feeds.step = int64([t], []);
    const fetches = ['top_log_probs', 'top_ids', ...manifest.state.map((s) => `present_${s.name}`)];
    const result = await decoder.run(feeds, fetches);
    for (const s of manifest.state) feeds[`past_${s.name}`] = result[`present_${s.name}`];
    const lp = result.top_log_probs.data;
    const top = result.top_ids.data;
    const candidates = [];
    for (let j = 0; j < K; j += 1) {
      for (let r = 0; r < W; r += 1) {
        const token = Number(top[j * W + r]);
        const value = lp[j * W + r]; // float32, widened to float64 by JavaScript
        candidates.push({ score: sums[j] + value, j, token });
      }
    }
    const ranked = rankDescending(candidates).slice(0, 2 * K);
    for (let p = 0; p < K; p += 1) {
      const c = ranked[p];
      if (c.token === eos && c.score > -Infinity) {
        const body = t === 0 ? [] : spell(t - 1, c.j);
        finished.push({ tokens: body, score: score(c.score, t + 1, alpha) });
      }
    }
    const live = ranked.filter((c) => c.token !== eos || c.score === -Infinity).slice(0, K);
    trail.push({ parents: live.map((c) => c.j), tokens: live.map((c) => c.token) });
    sums = live.map((c) => c.score);
    tokens = live.map((c) => c.token);
    reorder = live.map((c) => c.j);
    if (finished.length >= K) {
      const kth = finished.map((h) => h.score).sort((a, b) => b - a)[K - 1];
      if (kth >= score(Math.max(...sums), t + 1, alpha)) active = false;
    }
  }
  if (active) { // max_len reached: live beams end as they stand, without EOS
    for (let i = 0; i < K; i += 1) {
      if (sums[i] > -Infinity) finished.push({ tokens: spell(maxLen - 1, i), score: score(sums[i], maxLen, alpha) });
    }
  }
  return rankDescending(finished).slice(0, nBest);
}

async function main() {
  const args = process.argv.slice(2);
  const options = { alpha: null, maxLen: null, scores: false };
  const positional = [];
  for (let i = 0; i < args.length; i += 1) {
    if (args[i] === '--alpha') options.alpha = Number(args[++i]);
    else if (args[i] === '--max-len') options.maxLen = Number(args[++i]);
    else if (args[i] === '--scores') options.scores = true;
    else positional.push(args[i]);
  }
  const [folder, beamText, nBestText, ...texts] = positional;
  const manifest = JSON.parse(fs.readFileSync(path.join(folder, 'manifest.json'), 'utf8'));
  const { source: srcVocab, target: tgtVocab } = manifest.vocab;
  const special = manifest.special_tokens;
  const index = new Map(srcVocab.tokens.map((token, i) => [token, i]));
  const sessionOptions = { executionProviders: ['cpu'] };
  const ctx = {
    manifest,
    encoder: await ort.InferenceSession.create(path.join(folder, manifest.graphs.encoder.file), sessionOptions),
    decoder: await ort.InferenceSession.create(path.join(folder, manifest.graphs.decoder.file), sessionOptions),
    decoderInputs: new Set(manifest.graphs.decoder.inputs.map((io) => io.name)),
  };
  const alpha = options.alpha ?? manifest.search.alpha ?? manifest.search.length_penalty_alpha; // formats 2-6: the older key
  const maxLen = options.maxLen ?? ((manifest.limits && manifest.limits.max_target_length) || 256);
  for (const text of texts) {
    const pieces = srcVocab.level === 'char' ? Array.from(text) : (text.match(WORD) || []);
    const ids = [...pieces.map((t) => (index.has(t) ? index.get(t) : special.unk)), special.eos];
    const { max_len_a: a = 0, max_len_b: b = 0, min_len: minLen = 0 } = manifest.search; // the length limit
    const limit = a || b ? Math.min(maxLen, Math.max(minLen, 1, Math.ceil(a * ids.length + b))) : maxLen;
    const best = await beamSearch(ctx, ids, Number(beamText), Number(nBestText), alpha, limit);
    for (const h of best) {
      const words = h.tokens.filter((i) => i !== special.pad && i !== special.bos).map((i) => tgtVocab.tokens[i]);
      const line = words.join(tgtVocab.level === 'char' ? '' : ' ');
      console.log(options.scores ? `${h.score.toFixed(4)}\t${line}` : line);
    }
  }
}

main().catch((error) => {
  console.error(`error: ${error.message}`);
  process.exit(1);
});
