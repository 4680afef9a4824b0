// Greedy and beam search over an s2s-deploy export, written from docs/manifest.md alone.
// Shared by the browser page (a classic <script>: global S2SSearch) and the Node example (require).
// The caller makes the two ONNX Runtime sessions (onnxruntime-web or onnxruntime-node) and passes
// its `ort` module, so this file loads no files and imports nothing. A text export's source is a
// sentence (translate); a features export's is the front end's output (transcribe: frontend.js).
(function (root, factory) {
  if (typeof module === 'object' && module.exports) module.exports = factory();
  else root.S2SSearch = factory();
})(typeof self !== 'undefined' ? self : this, function () {
  'use strict';

  // Python's `\w+|[^\w\s]` on str: \w is any letter, digit or underscore, in any script.
  const WORD = /[\p{L}\p{N}_]+|[^\p{L}\p{N}_\s]/gu;
  const ARRAYS = { float32: Float32Array, float16: Uint16Array, int64: BigInt64Array }; // fp16 as raw bits: zeros are zeros

  function split(text, level) {
    return level === 'char' ? Array.from(text) : text.match(WORD) || [];
  }

  function int64(values, dims) {
    return [BigInt64Array.from(values.map(BigInt)), dims];
  }

  // numpy.repeat of a one-sentence tensor K times along its batch axis.
  function repeatRows(data, dims, axis, k) {
    const outer = dims.slice(0, axis).reduce((a, b) => a * b, 1);
    const inner = dims.slice(axis + 1).reduce((a, b) => a * b, 1);
    const out = new data.constructor(data.length * k);
    for (let o = 0; o < outer; o += 1) {
      const block = data.subarray(o * inner, (o + 1) * inner);
      for (let r = 0; r < k; r += 1) out.set(block, (o * k + r) * inner);
    }
    const shape = dims.slice();
    shape[axis] = k;
    return [out, shape];
  }

  // Stable ascending order of costs: ties keep the lower index (numpy's kind="stable").
  function argsort(costs) {
    const order = Array.from(costs, (_, i) => i);
    return order.sort((a, b) => (costs[a] < costs[b] ? -1 : costs[a] > costs[b] ? 1 : a - b));
  }

  // Decoding options as docs/manifest.md's "Resolving the options" has them (s2s_deploy/runtime/decoding.py):
  // the caller's value, else the manifest's search value (by its name, else an older key of ALIASES), else the
  // built-in default; max_len's is limits.max_target_length, else 256; a manifest min_len yields to a
  // shorter max_len. This module runs beam, alpha and the length limits: an export whose search block
  // turns on any other option is refused, never decoded without it.
  // BEGIN generated from s2s_deploy/format/decoding.py by `python -m s2s_deploy.web.defaults`: do not edit
  const BUILT_IN = {
    beam_size: 1,
    n_best: 1,
    max_len: 256,
    alpha: 0.75,
    min_len: 0,
    sampling_topk: 1,
    sampling_topp: 1.0,
    sampling_temperature: 1.0,
    seed: 0,
    repetition_penalty: 1.0,
    no_repeat_ngram_size: 0,
    encoder_no_repeat_ngram_size: 0,
    prefix: [],
    suppress_tokens: [],
    disable_unk: false,
    bad_words_ids: [],
    forced_eos: false,
    max_len_a: 0.0,
    max_len_b: 0,
    early_stopping: false,
    forced_bos: -1,
    begin_suppress_tokens: [],
    decoder_prompt: [],
    target_lang: "",
    task: "",
    prompt: [],
    prompt_start: -1,
    timestamps: false,
    batched: false,
    timestamp_begin: -1,
    max_initial_timestamp: -1,
    time_precision: 0.02,
    timestamp_frames: 2,
    preset: "",
    temperature: [],
    best_of: 1,
    compression_ratio_threshold: null,
    log_prob_threshold: null,
    no_speech_threshold: null,
    no_speech_token: -1,
    condition_on_previous_text: false,
    initial_prompt: [],
    prompt_reset_on_temperature: 0.5,
    suppress_blank: false,
  };
  const ALIASES = {
    alpha: ["length_penalty_alpha"],
  };
  // END generated
  // prompt_start and the timestamp parameters change nothing while prompt and timestamps are off (refused when on)
  const RUN_HERE = new Set(['beam_size', 'n_best', 'alpha', 'max_len', 'max_len_a', 'max_len_b', 'seed', 'early_stopping',
    'prompt_start', 'timestamp_begin', 'max_initial_timestamp', 'time_precision', 'timestamp_frames', 'no_speech_token',
    'best_of', 'prompt_reset_on_temperature']);

  function resolve(manifest, given = {}) {
    const stored = manifest.search || {};
    const options = { ...BUILT_IN, max_len: (manifest.limits && manifest.limits.max_target_length) || BUILT_IN.max_len };
    for (const name of Object.keys(options)) {
      const key = [name, ...(ALIASES[name] || [])].find((k) => stored[k] !== undefined);
      if (key !== undefined) options[name] = stored[key];
    }
    for (const [name, value] of Object.entries(given)) if (value !== undefined) options[name] = value;
    if (stored.min_len !== undefined && given.min_len === undefined) options.min_len = Math.min(stored.min_len, options.max_len);
    for (const [name, value] of Object.entries(options)) {
      if (!RUN_HERE.has(name) && JSON.stringify(value) !== JSON.stringify(BUILT_IN[name])) {
        throw new Error(`search.${name} is set, which this search module does not run (beam, alpha and length limits only)`);
      }
    }
    if (!Number.isInteger(options.beam_size) || options.beam_size < 1) throw new Error(`beam_size must be a whole number >= 1, not ${options.beam_size}`);
    if (options.n_best > options.beam_size) throw new Error(`n_best ${options.n_best} needs a beam of at least ${options.n_best} (beam_size is ${options.beam_size})`);
    return options;
  }

  class Translator {
    // ort: the onnxruntime module; encoder, decoder: its InferenceSessions over the export's graphs.
    constructor(ort, manifest, encoder, decoder) {
      if (!['s2s-deploy-manifest/2', 's2s-deploy-manifest/3', 's2s-deploy-manifest/4', 's2s-deploy-manifest/5',
        's2s-deploy-manifest/6', 's2s-deploy-manifest/7'].includes(manifest.format)) {
        throw new Error(`unsupported manifest format ${manifest.format}`);
      }
      const input = manifest.encoder_input || { kind: 'tokens' }; // formats 2 and 3 read token ids
      if (!['tokens', 'features'].includes(input.kind)) throw new Error(`unknown encoder_input.kind ${input.kind}`);
      if (input.kind === 'features' && input.dtype !== 'float32') {
        throw new Error(`this encoder reads ${input.dtype} features, which this search module does not feed: float32 only`);
      }
      this.input = input;
      // A features export's source vocabulary only records the training transcripts: nothing tokenises with it.
      const sides = input.kind === 'tokens' ? [manifest.vocab.source, manifest.vocab.target] : [manifest.vocab.target];
      for (const side of sides) { // subword levels need a JS tokenizer
        if (!['char', 'word', undefined].includes(side.level)) throw new Error(`a ${side.level} vocabulary needs its tokenizer library, which this search module does not run: char and word only (docs/manifest.md)`);
      }
      this.ort = ort;
      this.manifest = manifest;
      this.encoder = encoder;
      this.decoder = decoder;
      if (!decoder.inputNames.includes('top_k')) { // an input with a default: onnxruntime's JS bindings drop it
        throw new Error('this decoder takes top_k as an optional input, which onnxruntime-web cannot feed: export it again');
      }
      this.special = manifest.special_tokens;
      this.src = manifest.vocab.source;
      this.tgt = manifest.vocab.target;
      this.index = new Map(this.src.tokens.map((token, i) => [token, i]));
      this.inputs = new Set(manifest.graphs.decoder.inputs.map((io) => io.name));
      this.hasAttention = manifest.graphs.decoder.outputs.some((io) => io.name === 'attention');
      this.defaults = resolve(manifest); // an export with options this module does not run fails here
    }

    tensor(type, data, dims) {
      return new this.ort.Tensor(type, data, dims);
    }

    encodeText(text) {
      const own = this.src.special || this.special; // format 3: the source's own ids, prefix and suffix
      const ids = (this.src.prefix || []).concat(
        split(text, this.src.level).map((t) => (this.index.has(t) ? this.index.get(t) : own.unk)),
        this.src.suffix || [own.eos]);
      const limit = this.manifest.limits.max_source_length;
      if (limit && ids.length > limit) throw new Error(`input of ${ids.length} tokens exceeds the model's limit of ${limit}`);
      return ids;
    }

    decodeIds(ids) {
      const words = [];
      for (const id of ids) {
        if (id === this.special.eos) break;
        const hidden = id === this.special.pad || id === this.special.bos || id === this.special.decoder_start
          || (this.tgt.hidden || []).includes(id);
        if (!hidden) words.push(this.tgt.tokens[id] ?? '<unk>');
      }
      return words.join(this.tgt.level === 'char' ? '' : ' ');
    }

    // One sentence's encoder input (manifest step 1): { src: [type, data, dims], length } with a batch of one.
    textSource(text) {
      if (this.input.kind !== 'tokens') throw new Error(`this export reads ${this.input.frontend.kind} features, not text: transcribe`);
      const ids = this.encodeText(text);
      return { src: ['int64', ...int64(ids, [1, ids.length])], length: ids.length };
    }

    // One clip's features ({ data, dims } from frontend.js) checked against encoder_input.shape: every
    // fixed entry must match, and the "frames" entry's length is src_len (1 without one: a fixed item).
    featureSource({ data, dims }) {
      if (this.input.kind !== 'features') throw new Error('this export reads text (token ids), not features: translate');
      const shape = this.input.shape;
      const fits = dims.length === shape.length && shape.every((d, i) => d === 'frames' || d === dims[i]);
      if (!fits) throw new Error(`features of shape [${dims}] do not fit the encoder's [${shape}]`);
      const axis = shape.indexOf('frames');
      const length = axis < 0 ? 1 : dims[axis];
      if (!length) throw new Error('the clip is too short to make a single frame of features');
      return { src: ['float32', Float32Array.from(data), [1, ...dims]], length };
    }

    // The decoder's first feeds for `rows` copies of one source (manifest steps 2-4).
    async start(source, rows) {
      const encoded = await this.encoder.run({
        src: this.tensor(...source.src),
        src_len: this.tensor('int64', ...int64([source.length], [1])),
      });
      const feeds = {};
      const tile = (tensor, axis) => (rows === 1 ? tensor
        : this.tensor(tensor.type, ...repeatRows(tensor.data, tensor.dims, axis, rows)));
      // one memory row serves every row where the decoder groups rows by sentence (manifest step 4)
      const shared = this.manifest.memory_per_sentence === true;
      for (const m of this.manifest.memory) {
        if (this.inputs.has(m.name)) feeds[m.name] = shared ? encoded[m.name] : tile(encoded[m.name], m.batch_axis);
      }
      for (const s of this.manifest.state) {
        if (s.init === 'encoder') {
          feeds[`past_${s.name}`] = tile(encoded[`init_${s.name}`], s.batch_axis);
        } else {
          const dims = s.shape.map((d) => (d === 'batch' ? rows : d));
          feeds[`past_${s.name}`] = this.tensor(s.dtype, new ARRAYS[s.dtype](dims.reduce((a, b) => a * b, 1)), dims);
        }
      }
      return feeds;
    }

    // One decoder step: each row's best `k` (log-prob, id), best first, and (if asked) each row's
    // attention averaged over its maps (layers, heads) as one array of src_len per row.
    async step(feeds, tokens, reorder, t, k, attention) {
      feeds.tokens = this.tensor('int64', ...int64(tokens, [tokens.length]));
      feeds.reorder = this.tensor('int64', ...int64(reorder, [reorder.length]));
      if (this.inputs.has('step')) feeds.step = this.tensor('int64', ...int64([t], []));
      feeds.top_k = this.tensor('int64', ...int64([k], [1])); // required (docs/manifest.md)
      const fetches = ['top_log_probs', 'top_ids', ...this.manifest.state.map((s) => `present_${s.name}`)];
      if (attention) fetches.push('attention');
      const out = await this.decoder.run(feeds, fetches);
      for (const s of this.manifest.state) feeds[`past_${s.name}`] = out[`present_${s.name}`];
      const values = out.top_log_probs.data;
      const ids = Array.from(out.top_ids.data, Number);
      let maps = null;
      if (attention) {
        const { data, dims } = out.attention;
        const srcLen = dims[dims.length - 1];
        const perRow = data.length / dims[0];
        const count = perRow / srcLen;
        maps = [];
        for (let r = 0; r < dims[0]; r += 1) {
          const mean = new Float32Array(srcLen);
          for (let m = 0; m < count; m += 1) {
            for (let j = 0; j < srcLen; j += 1) mean[j] += data[r * perRow + m * srcLen + j] / count;
          }
          maps.push(mean);
        }
      }
      return { values, ids, width: values.length / tokens.length, maps };
    }

    // One sentence: { text, tokens, score, attention: [[src weights] per output token] | null }.
    // Options left out take the export's defaults (this.defaults).
    async translate(text, options = {}) {
      const found = await this.search(this.textSource(text), options);
      return { ...found, sourceTokens: split(text, this.src.level).concat('<eos>') };
    }

    // One clip's features ({ data, dims }, frontend.js): { text, tokens, score, attention }, as translate.
    async transcribe(features, options = {}) {
      return this.search(this.featureSource(features), options);
    }

    // One source (textSource or featureSource) decoded with the caller's options over the export's defaults.
    async search(source, { beam, alpha, maxLen, attention = false } = {}) {
      const options = resolve(this.manifest, { beam_size: beam, alpha, max_len: maxLen });
      ({ beam_size: beam, alpha, max_len: maxLen } = options);
      const { max_len_a: a, max_len_b: b, min_len: minLen } = options;
      if (a || b) maxLen = Math.min(maxLen, Math.max(minLen, 1, Math.ceil(a * source.length + b))); // the source's own limit
      const withMaps = attention && this.hasAttention;
      const found = beam === 1 ? await this.greedy(source, maxLen, alpha, withMaps)
        : await this.beamSearch(source, beam, maxLen, alpha, withMaps);
      return { ...found, text: this.decodeIds(found.tokens) };
    }

    async greedy(source, maxLen, alpha, withMaps) {
      const feeds = await this.start(source, 1);
      const eos = this.special.eos;
      const tokens = [];
      const maps = [];
      let token = this.special.decoder_start;
      let logProb = 0;
      let finished = false;
      for (let t = 0; t < maxLen; t += 1) {
        const out = await this.step(feeds, [token], [0], t, 1, withMaps);
        token = out.ids[0];
        logProb += out.values[0];
        if (withMaps) maps.push(out.maps[0]);
        if (token === eos) {
          finished = true;
          break;
        }
        tokens.push(token);
      }
      const length = tokens.length + (finished ? 1 : 0);
      return { tokens, score: logProb / Math.pow(length, alpha), finished, attention: withMaps ? maps : null };
    }

    // Beam search as docs/manifest.md's "Search, exactly" has it, for one sentence (K rows), n-best 1.
    async beamSearch(source, k, maxLen, alpha, withMaps) {
      const vocab = this.tgt.tokens.length;
      if (k >= vocab) throw new Error(`beam size ${k} must be smaller than the vocabulary (${vocab})`);
      const eos = this.special.eos;
      const feeds = await this.start(source, k);
      const width = Math.min(2 * k, vocab);
      let costs = Array.from({ length: k }, (_, r) => (r === 0 ? 0 : Infinity)); // only row 0 may extend at first
      let tokens = new Array(k).fill(this.special.decoder_start);
      let reorder = Array.from({ length: k }, (_, r) => r);
      const trail = []; // per step: { parents, tokens, lps, maps }
      const endings = [];
      let active = true;
      for (let t = 0; t < maxLen && active; t += 1) {
        const out = await this.step(feeds, tokens, reorder, t, width, withMaps);
        const perRow = out.width;
        const candidates = new Float64Array(k * perRow);
        for (let i = 0; i < candidates.length; i += 1) candidates[i] = costs[Math.floor(i / perRow)] - out.values[i];
        const ranked = argsort(candidates);
        const top = ranked.slice(0, 2 * k);
        const origin = top.map((i) => Math.floor(i / perRow));
        const isEos = top.map((i) => out.ids[i] === eos && Number.isFinite(candidates[i]));
        let kept = top.slice(0, k);
        if (kept.some((i) => out.ids[i] === eos)) {
          for (let j = 0; j < k; j += 1) {
            if (!isEos[j]) continue;
            const score = -candidates[top[j]] / Math.pow(t + 1, alpha);
            const eosMap = withMaps ? out.maps[origin[j]] : null;
            endings.push({ score, lastStep: t - 1, row: origin[j], eosLogProb: out.values[top[j]], eosMap });
          }
          kept = top.filter((_, j) => !isEos[j]).slice(0, k); // the first K non-EOS candidates, in rank order
        }
        const parents = kept.map((i) => Math.floor(i / perRow));
        costs = kept.map((i) => candidates[i]);
        tokens = kept.map((i) => out.ids[i]);
        reorder = parents;
        trail.push({ parents, tokens, lps: kept.map((i) => out.values[i]), maps: withMaps ? parents.map((p) => out.maps[p]) : null });
        if (endings.length >= k) { // Hugging Face's early_stopping=False: the K-th best finished beats every live beam
          const kth = endings.map((e) => e.score).sort((a, b) => b - a)[k - 1];
          const bestLive = -Math.min(...costs) / Math.pow(t + 1, alpha);
          if (kth >= bestLive) active = false;
        }
      }
      if (active) { // max_len reached: live beams end as they stand
        for (let j = 0; j < k; j += 1) {
          if (Number.isFinite(costs[j])) endings.push({ score: -costs[j] / Math.pow(trail.length, alpha), lastStep: trail.length - 1, row: j, eosLogProb: null, eosMap: null });
        }
      }
      const best = endings.slice().sort((a, b) => b.score - a.score)[0];
      const path = [];
      const maps = [];
      for (let step = best.lastStep, row = best.row; step >= 0; step -= 1) {
        path.push(trail[step].tokens[row]);
        if (withMaps) maps.push(trail[step].maps[row]);
        row = trail[step].parents[row];
      }
      path.reverse();
      maps.reverse();
      if (withMaps && best.eosMap) maps.push(best.eosMap);
      return { tokens: path, score: best.score, finished: best.eosLogProb !== null, attention: withMaps ? maps : null };
    }
  }

  return { Translator, split, resolve };
});
