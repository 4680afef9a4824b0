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
  // shorter max_len. This module runs beam, alpha, the length limits, the decoder prompt, the suppress lists
  // and Whisper's timestamps: an export whose search block turns on any other option is refused, never
  // decoded without it.
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
    window_cut: "fixed",
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
    hallucination_silence_threshold: null,
    speculative: 0,
    suppress_blank: false,
  };
  const ALIASES = {
    alpha: ["length_penalty_alpha"],
  };
  // END generated
  // prompt_start and no_speech_token change nothing while prompt and the temperature fallback are off (refused when
  // on). The decoder prompt (its open slot too), suppress_tokens, begin_suppress_tokens and Whisper's timestamp
  // grammar are run here (StepOptions below), as runtime/options.py and runtime/search.py run them. window_cut is
  // app.js's, where it cuts a long clip's windows.
  const RUN_HERE = new Set(['beam_size', 'n_best', 'alpha', 'max_len', 'max_len_a', 'max_len_b', 'seed', 'early_stopping',
    'prompt_start', 'timestamp_begin', 'max_initial_timestamp', 'time_precision', 'timestamp_frames', 'no_speech_token',
    'best_of', 'prompt_reset_on_temperature', 'decoder_prompt', 'suppress_tokens', 'begin_suppress_tokens', 'timestamps',
    'window_cut']);
  const OPEN_SLOT = -1;

  // Whether a step needs the full log_probs (runtime/options.py's options_on, for the options run here).
  function optionsOn(options) {
    return options.suppress_tokens.length > 0 || options.begin_suppress_tokens.length > 0 || options.timestamps;
  }

  // Rule 3 of docs/decoding.md (runtime/decoding.py's with_timestamps): timestamps need the export's first
  // timestamp id, and the decoder prompt's closing no-timestamps token (the id before it) is dropped.
  function withTimestamps(options, size) {
    const begin = options.timestamp_begin;
    if (begin < 1) throw new Error('timestamps: this export has no timestamp tokens (its search block sets no timestamp_begin)');
    if (begin >= size) throw new Error(`timestamp_begin ${begin} is outside the target vocabulary (0..${size - 1})`);
    const prompt = options.decoder_prompt;
    const dropped = prompt.length && prompt[prompt.length - 1] === begin - 1 ? prompt.slice(0, -1) : prompt;
    return { ...options, timestamps: true, decoder_prompt: dropped };
  }

  // Each row's k best values and ids of a (rows × width) Float32Array, best first, ties to the lower id
  // (runtime/options.py's top_of, as ONNX TopK); NaN never ranks.
  function topOf(data, rows, width, k) {
    const values = new Float32Array(rows * k).fill(-Infinity);
    const ids = new Array(rows * k).fill(0);
    for (let r = 0; r < rows; r += 1) {
      let count = 0;
      const base = r * k;
      for (let i = 0; i < width; i += 1) {
        const v = data[r * width + i];
        if (!(v >= -Infinity)) continue; // NaN
        if (count === k && !(v > values[base + k - 1])) continue;
        let j = Math.min(count, k - 1);
        while (j > 0 && v > values[base + j - 1]) { // strictly better moves up: an equal one keeps the lower id first
          values[base + j] = values[base + j - 1];
          ids[base + j] = ids[base + j - 1];
          j -= 1;
        }
        values[base + j] = v;
        ids[base + j] = i;
        if (count < k) count += 1;
      }
    }
    return { values, ids };
  }

  // log(sum(exp(x))) of x[from..to) in float64, -Infinity where nothing is finite.
  function logSumExp(x, from, to) {
    let top = -Infinity;
    for (let i = from; i < to; i += 1) if (x[i] > top) top = x[i];
    if (!Number.isFinite(top)) top = 0;
    let sum = 0;
    for (let i = from; i < to; i += 1) sum += Math.exp(x[i] - top);
    return top + Math.log(sum);
  }

  // The options of one search (runtime/options.py's StepOptions, for the options run here): it follows each
  // row's generated tokens from the tokens and reorder fed at every step, and turns a step's full log-probs
  // into its ranked candidates. The timestamp rule's sums run in float64 here, numpy's in float32: the two
  // can part only where the timestamps' summed probability ties the best text token's to float32 rounding.
  class StepOptions {
    constructor(options, eos, vocab) {
      this.options = options;
      this.eos = eos;
      this.vocab = vocab;
      for (const id of [...options.suppress_tokens, ...options.begin_suppress_tokens]) {
        if (!(id >= 0 && id < vocab)) throw new Error(`a suppressed id ${id} is outside the vocabulary (0..${vocab - 1})`);
      }
      if (options.timestamps && !(options.timestamp_begin > 0 && options.timestamp_begin < vocab)) {
        throw new Error(`timestamp_begin ${options.timestamp_begin} is outside the vocabulary (1..${vocab - 1})`);
      }
      this.history = [];
      this.t = 0;
    }

    // One step's log-probs (rows × vocab, Float32Array) with every option applied, in a new array.
    process(logProbs, tokens, reorder) {
      const { options, vocab } = this;
      const rows = tokens.length;
      const t = this.t;
      this.history = t === 0 ? tokens.map(() => []) : reorder.map((parent, r) => [...this.history[parent], tokens[r]]);
      this.t += 1;
      const out = Float32Array.from(logProbs);
      const banned = t === 0 ? [...options.suppress_tokens, ...options.begin_suppress_tokens] : options.suppress_tokens;
      for (let r = 0; r < rows; r += 1) for (const id of banned) out[r * vocab + id] = -Infinity;
      if (options.timestamps) for (let r = 0; r < rows; r += 1) this.timestampRules(out.subarray(r * vocab, (r + 1) * vocab), this.history[r], t);
      return out;
    }

    // Whisper's timestamp grammar on one row (transformers' WhisperTimeStampLogitsProcessor), as
    // runtime/options.py's _timestamp_rules states it.
    timestampRules(row, history, t) {
      const begin = this.options.timestamp_begin;
      const vocab = row.length;
      row[begin - 1] = -Infinity;
      const length = history.length;
      if (length) {
        const last = history[length - 1] >= begin;
        const penultimate = length > 1 ? history[length - 2] >= begin : true;
        if (last && penultimate) row.fill(-Infinity, begin);
        if (last && !penultimate) row.fill(-Infinity, 0, this.eos);
        let latest = -1;
        for (let i = length - 1; i >= 0; i -= 1) if (history[i] >= begin) { latest = history[i]; break; }
        const floor = latest < 0 ? begin : (last && !penultimate ? latest : latest + 1);
        row.fill(-Infinity, begin, Math.max(begin, floor));
      }
      if (t === 0) {
        row.fill(-Infinity, 0, begin);
        if (this.options.max_initial_timestamp >= 0) row.fill(-Infinity, Math.min(vocab, begin + this.options.max_initial_timestamp + 1));
      }
      const norm = logSumExp(row, 0, vocab);
      const shifted = Float64Array.from(row, (v) => v - norm);
      const stampMass = logSumExp(shifted, begin, vocab);
      let textTop = -Infinity;
      for (let i = 0; i < begin; i += 1) if (shifted[i] > textTop) textTop = shifted[i];
      if (stampMass > textTop) row.fill(-Infinity, 0, begin);
    }
  }

  // The decoder's steps over one search's feeds: the graph's own step index counts every fed token.
  class Run {
    constructor(translator, feeds) {
      this.translator = translator;
      this.feeds = feeds;
      this.t = 0;
    }

    async run(tokens, reorder, fetches) {
      const { translator, feeds } = this;
      feeds.tokens = translator.tensor('int64', ...int64(tokens, [tokens.length]));
      feeds.reorder = translator.tensor('int64', ...int64(reorder, [reorder.length]));
      if (translator.inputs.has('step')) feeds.step = translator.tensor('int64', ...int64([this.t], []));
      feeds.top_k = translator.tensor('int64', ...int64([fetches.k || 1], [1])); // required (docs/manifest.md)
      const names = [...fetches.names, ...translator.manifest.state.map((s) => `present_${s.name}`)];
      const out = await translator.decoder.run(feeds, names);
      for (const s of translator.manifest.state) feeds[`past_${s.name}`] = out[`present_${s.name}`];
      this.t += 1;
      return out;
    }

    // Each row's full log-probs: (rows × vocab) Float32Array.
    async step(tokens, reorder) {
      return (await this.run(tokens, reorder, { names: ['log_probs'] })).log_probs.data;
    }

    // Each row's best `k` (log-prob, id), best first, and (if asked) each row's attention averaged over
    // its maps (layers, heads) as one array of src_len per row.
    async stepTop(tokens, reorder, k, attention) {
      const out = await this.run(tokens, reorder, { names: ['top_log_probs', 'top_ids', ...(attention ? ['attention'] : [])], k });
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
  }

  // A run whose first step is preceded by the decoder prompt (runtime/search.py's PromptedRun): the start
  // token and every prompt token but the last are fed with their outputs dropped, and the first step the
  // search asks for is fed the last prompt token. An open slot (-1) is, per row, the language id with the best
  // log-prob after the token before it (ids ascending, the first of equal ones), no option applied.
  class PromptedRun {
    constructor(run, start, prompt, languages) {
      if (prompt.includes(OPEN_SLOT) && !languages.length) {
        throw new Error(`the decoder prompt holds ${OPEN_SLOT} (the language the model scores best), but the export knows no language tokens`);
      }
      this.inner = run;
      this.start = start;
      this.prompt = prompt;
      this.languages = languages.slice().sort((a, b) => a - b);
      this.fed = null; // per row, the prompt fed
    }

    async tokensFor(tokens) {
      if (this.fed) return tokens;
      const rows = tokens.length;
      const identity = tokens.map((_, r) => r);
      const columns = [this.start, ...this.prompt].map((token) => new Array(rows).fill(token));
      const vocab = this.inner.translator.tgt.tokens.length;
      for (let position = 0; position < this.prompt.length; position += 1) {
        if (this.prompt[position] === OPEN_SLOT) {
          const logProbs = await this.inner.step(columns[position], identity);
          columns[position + 1] = identity.map((r) => {
            let best = this.languages[0];
            for (const id of this.languages) if (logProbs[r * vocab + id] > logProbs[r * vocab + best]) best = id;
            return best;
          });
        } else {
          await this.inner.stepTop(columns[position], identity, 1, false);
        }
      }
      this.fed = identity.map((r) => columns.slice(1).map((column) => column[r]));
      return columns[columns.length - 1];
    }

    async step(tokens, reorder) {
      return this.inner.step(await this.tokensFor(tokens), reorder);
    }

    async stepTop(tokens, reorder, k, attention) {
      return this.inner.stepTop(await this.tokensFor(tokens), reorder, k, attention);
    }

    get translator() {
      return this.inner.translator;
    }
  }

  // A run whose steps rank the full log-probs after the options (runtime/options.py's StepOptions.bind).
  class OptionsRun {
    constructor(run, options, eos, vocab) {
      this.inner = run;
      this.options = new StepOptions(options, eos, vocab);
      this.vocab = vocab;
    }

    async stepTop(tokens, reorder, k) {
      const logProbs = await this.inner.step(tokens, reorder);
      const { values, ids } = topOf(this.options.process(logProbs, tokens, reorder), tokens.length, this.vocab, k);
      return { values, ids, width: k, maps: null };
    }

    get fed() {
      return this.inner.fed;
    }
  }

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
        throw new Error(`search.${name} is set, which this search module does not run (beam, alpha, length limits, decoder prompt, suppress lists and timestamps only)`);
      }
    }
    if (!Number.isInteger(options.beam_size) || options.beam_size < 1) throw new Error(`beam_size must be a whole number >= 1, not ${options.beam_size}`);
    if (options.n_best > options.beam_size) throw new Error(`n_best ${options.n_best} needs a beam of at least ${options.n_best} (beam_size is ${options.beam_size})`);
    return options;
  }

  // The decoder prompt a search fed (an open slot filled with the language chosen there), else the options'.
  function promptOf(run, options) {
    return run.fed ? run.fed[0] : options.decoder_prompt;
  }

  // Python's float32 arithmetic: numpy rounds every float32 product and quotient once, as fround does.
  const f32 = Math.fround;

  // One window's output (its EOS excluded), read from frame `seek` for `frames` frames, as segments
  // ({ start, end, tokens }), and the frames to advance: runtime/timestamps.py's split (generate's
  // _retrieve_segment), float64 times.
  function splitWindow(tokens, seek, frames, options) {
    const { timestamp_begin: begin, time_precision: precision, timestamp_frames: stride } = options;
    const offset = (seek * precision) / stride;
    const stamp = tokens.map((token) => token >= begin);
    const n = tokens.length;
    const singleEnding = n >= 2 && !stamp[n - 2] && stamp[n - 1];
    const cuts = [];
    for (let i = 0; i < n - 1; i += 1) if (stamp[i] && stamp[i + 1]) cuts.push(i + 1);
    if (!cuts.length) { // one segment: to its last timestamp, else to the window's end
      let end = Math.trunc(f32(f32(f32(frames) * f32(precision / stride)) / f32(precision)));
      const stamps = tokens.filter((token) => token >= begin);
      if (stamps.length && stamps[stamps.length - 1] !== begin) end = stamps[stamps.length - 1] - begin;
      return [[{ start: offset, end: offset + end * precision, tokens: tokens.slice() }], frames];
    }
    if (singleEnding) cuts.push(n);
    else cuts[cuts.length - 1] += 1; // the last pair stays whole in the last segment
    const pieces = [];
    let last = 0;
    cuts.forEach((cut, i) => {
      const piece = tokens.slice(last, cut);
      const closing = i < cuts.length - 1 || singleEnding ? piece[piece.length - 1] : piece[piece.length - 2];
      pieces.push({ start: offset + (piece[0] - begin) * precision, end: offset + (closing - begin) * precision, tokens: piece });
      last = cut;
    });
    return [pieces, singleEnding ? frames : (tokens[last - 2] - begin) * stride];
  }

  // One window's output without timestamps: one piece over the whole window, all of it consumed.
  function wholeWindow(tokens, seek, frames, options) {
    const scale = options.time_precision / options.timestamp_frames;
    return [[{ start: seek * scale, end: (seek + frames) * scale, tokens: tokens.slice() }], frames];
  }

  // Python's str.isspace and str.strip: JavaScript's \s lacks U+001C..U+001F and U+0085, and holds U+FEFF.
  const PY_SPACE = '\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';
  const LEADING = new RegExp(`^[${PY_SPACE}]+`, 'u');
  const TRAILING = new RegExp(`[${PY_SPACE}]+$`, 'u');
  const strip = (text) => text.replace(LEADING, '').replace(TRAILING, '');
  const startsWithSpace = (text) => LEADING.test(text);

  // A running median of odd `width` along each row of rows (arrays of float32 values), edges reflected
  // (runtime/words.py's median_filter); a row no longer than half the width is left as it is.
  function medianFilter(rows, width) {
    const pad = Math.floor(width / 2);
    return rows.map((row) => {
      if (row.length <= pad) return row;
      const padded = [];
      for (let i = pad; i > 0; i -= 1) padded.push(row[i]);
      padded.push(...row);
      for (let i = 1; i <= pad; i += 1) padded.push(row[row.length - 1 - i]);
      return row.map((_, p) => padded.slice(p, p + width).sort((a, b) => a - b)[pad]);
    });
  }

  // The cheapest monotonic path through `matrix` (rows: tokens, columns: positions; float64 values), as
  // runtime/words.py's dtw finds it: float32 costs, the same tie rules. [rows along the path, columns].
  function dtw(matrix) {
    const rows = matrix.length;
    const columns = matrix[0].length;
    const cost = Array.from({ length: rows + 1 }, () => new Float32Array(columns + 1).fill(Infinity));
    const trace = Array.from({ length: rows + 1 }, () => new Int8Array(columns + 1).fill(-1));
    cost[0][0] = 0;
    for (let i = 1; i <= rows; i += 1) {
      for (let j = 1; j <= columns; j += 1) {
        const c0 = cost[i - 1][j - 1];
        const c1 = cost[i - 1][j];
        const c2 = cost[i][j - 1];
        const step = c0 < c1 && c0 < c2 ? 0 : c1 < c0 && c1 < c2 ? 1 : 2;
        cost[i][j] = matrix[i - 1][j - 1] + [c0, c1, c2][step]; // a float64 sum stored as float32, as numpy stores it
        trace[i][j] = step;
      }
    }
    trace[0].fill(2);
    for (let i = 0; i <= rows; i += 1) trace[i][0] = 1;
    const text = [];
    const time = [];
    for (let i = rows, j = columns; i > 0 || j > 0;) {
      text.push(i - 1);
      time.push(j - 1);
      const move = trace[i][j];
      if (move === 0) { i -= 1; j -= 1; } else if (move === 1) i -= 1; else j -= 1;
    }
    return [text.reverse(), time.reverse()];
  }

  // One time per row of `weights` (steps × heads × source, float32): runtime/words.py's token_times. The
  // float32 arithmetic is numpy's, operation for operation: each mean and variance a running float32 sum
  // over the rows (the axis numpy reduces outside its inner loop), divided once.
  function tokenTimes(weights, positions, precision) {
    const steps = weights.length;
    const heads = weights[0].length;
    const width = Math.min(positions, weights[0][0].length);
    const normalised = [];
    for (let h = 0; h < heads; h += 1) {
      const rows = Array.from({ length: steps }, (_, r) => Array.from(weights[r][h].subarray(0, width)));
      for (let p = 0; p < width; p += 1) {
        let sum = 0;
        for (let r = 0; r < steps; r += 1) sum = f32(sum + rows[r][p]);
        const mean = f32(sum / steps);
        let squares = 0;
        for (let r = 0; r < steps; r += 1) {
          const d = f32(rows[r][p] - mean);
          squares = f32(squares + f32(d * d));
        }
        const std = f32(Math.sqrt(f32(squares / steps)));
        for (let r = 0; r < steps; r += 1) rows[r][p] = f32(f32(rows[r][p] - mean) / std);
      }
      normalised.push(medianFilter(rows, 7));
    }
    const matrix = Array.from({ length: steps }, (_, r) => Array.from({ length: width }, (__, p) => {
      let sum = 0;
      for (let h = 0; h < heads; h += 1) sum = f32(sum + normalised[h][r][p]);
      return -f32(sum / heads);
    }));
    const [text, time] = dtw(matrix);
    return time.filter((_, k) => k === 0 || text[k] !== text[k - 1]).map((t) => t * precision);
  }

  // One input's features ({ data, dims }, frames last) decoded window by window (runtime/timestamps.py's
  // seek_windows for one input): each window the next `window` frames from `seek`, zero-padded; an open
  // language slot is chosen on the first window and kept. `search(features, options)` decodes one window.
  // Returns { pieces, scores, prompt, windows } (windows: { seek, frames, width, tokens, prompt, kept }).
  async function seekWindows(search, features, window, options) {
    const cut = options.timestamps ? splitWindow : wholeWindow;
    const total = features.dims[features.dims.length - 1];
    const rows = features.data.length / total;
    const pieces = [];
    const scores = [];
    const windows = [];
    let prompt = null;
    for (let seek = 0; seek < total;) {
      const n = Math.min(total - seek, window);
      const part = new Float32Array(rows * window);
      for (let r = 0; r < rows; r += 1) part.set(features.data.subarray(r * total + seek, r * total + seek + n), r * window);
      const fed = prompt || options.decoder_prompt;
      const best = await search({ data: part, dims: [...features.dims.slice(0, -1), window] }, { ...options, decoder_prompt: fed });
      if (prompt === null) prompt = best.prompt.length ? best.prompt : fed;
      const [found, advance] = cut(best.tokens, seek, n, options);
      if (advance <= 0) throw new Error("a window's timestamps did not advance the search (the model's timestamp tokens break the rules of docs/decoding.md)");
      pieces.push(...found);
      windows.push({ seek, frames: n, width: window, tokens: best.tokens, finished: best.finished, prompt: best.prompt, kept: found.reduce((sum, p) => sum + p.tokens.length, 0) });
      scores.push(best.score);
      seek += advance;
    }
    return { pieces, scores, prompt: prompt || [], windows };
  }

  // GPT-2's byte-to-character table (tokenizers' ByteLevel): printable bytes stand for themselves, the
  // rest are shifted past 255. Its inverse reads a byte-level token back as bytes.
  function byteLevelChars() {
    const bytes = [];
    for (let b = 33; b <= 126; b += 1) bytes.push(b);
    for (let b = 161; b <= 172; b += 1) bytes.push(b);
    for (let b = 174; b <= 255; b += 1) bytes.push(b);
    const chars = bytes.slice();
    let extra = 0;
    for (let b = 0; b < 256; b += 1) {
      if (!bytes.includes(b)) {
        bytes.push(b);
        chars.push(256 + extra);
        extra += 1;
      }
    }
    return new Map(chars.map((c, i) => [String.fromCodePoint(c), bytes[i]]));
  }

  // A tokenizers tokenizer.json read back (never encoded): ids to tokens (its model's vocabulary and its
  // added tokens), special added tokens skipped (decode(ids, skip_special_tokens=True)), then its decoder:
  // none joins the tokens with one space (tokenizers' own fallback); ByteLevel maps each token's
  // characters back to bytes (a token with a character outside the table keeps its UTF-8 bytes) and reads
  // them as UTF-8, a broken sequence as U+FFFD. Any other decoder is refused when the page loads.
  class HFDecoder {
    constructor(tokenizer) {
      if (!tokenizer || !tokenizer.model) throw new Error('an hf vocabulary needs its tokenizer.json');
      const decoder = tokenizer.decoder || null;
      if (decoder && decoder.type !== 'ByteLevel') throw new Error(`this tokenizer's ${decoder.type} decoder is not run here: none and ByteLevel only`);
      this.byteLevel = Boolean(decoder);
      this.tokens = new Map();
      const vocab = tokenizer.model.vocab || {};
      for (const [token, id] of Array.isArray(vocab) ? vocab.map(([t], i) => [t, i]) : Object.entries(vocab)) this.tokens.set(id, token);
      this.special = new Set();
      for (const added of tokenizer.added_tokens || []) {
        this.tokens.set(added.id, added.content);
        if (added.special) this.special.add(added.id);
      }
      this.chars = this.byteLevel ? byteLevelChars() : null;
    }

    decode(ids) {
      const tokens = ids.filter((id) => this.tokens.has(id) && !this.special.has(id)).map((id) => this.tokens.get(id));
      if (!this.byteLevel) return tokens.join(' ');
      const bytes = [];
      const utf8 = new TextEncoder();
      for (const token of tokens) {
        const mapped = Array.from(token, (c) => this.chars.get(c));
        bytes.push(...(mapped.every((b) => b !== undefined) ? mapped : utf8.encode(token)));
      }
      return new TextDecoder('utf-8').decode(Uint8Array.from(bytes));
    }
  }

  class Translator {
    // ort: the onnxruntime module; encoder, decoder: its InferenceSessions over the export's graphs;
    // tokenizer: the target's tokenizer.json, parsed, for an `hf` vocabulary (decoded only, never encoded).
    constructor(ort, manifest, encoder, decoder, tokenizer = null) {
      if (!['s2s-deploy-manifest/2', 's2s-deploy-manifest/3', 's2s-deploy-manifest/4', 's2s-deploy-manifest/5',
        's2s-deploy-manifest/6', 's2s-deploy-manifest/7', 's2s-deploy-manifest/8'].includes(manifest.format)) {
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
      for (const side of sides) { // subword levels need a JS tokenizer: an hf target is decoded (HFDecoder below)
        const decodable = side === manifest.vocab.target && input.kind === 'features' && side.level === 'hf';
        if (!['char', 'word', undefined].includes(side.level) && !decodable) throw new Error(`a ${side.level} vocabulary needs its tokenizer library, which this search module does not run: char and word only, and an hf target read back from audio (docs/manifest.md)`);
      }
      this.hf = manifest.vocab.target.level === 'hf' ? new HFDecoder(tokenizer) : null;
      if (manifest.vocab.target.upper_case) throw new Error('vocab.target.upper_case is set, which this search module does not run');
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

    // Ids as text (format/vocab.py's Vocabulary.decode): up to EOS, without pad, bos, the decoder start and
    // hidden ids; at the hf level a hidden id (a timestamp) also splits the text, each run detokenised alone.
    decodeIds(ids) {
      if (this.hf) {
        const skip = new Set([this.special.pad, this.special.bos, this.special.decoder_start]);
        const hidden = new Set(this.tgt.hidden || []);
        const runs = [[]];
        for (const id of ids) {
          if (id === this.special.eos) break;
          if (hidden.has(id)) runs.push([]);
          else if (!skip.has(id)) runs[runs.length - 1].push(id);
        }
        return runs.filter((run) => run.length).map((run) => this.hf.decode(run)).join('');
      }
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

    // One search's decoder run over `rows` copies of `source`: the prompt fed first where there is one, and the
    // options applied where one is on (runtime/search.py's prompted and step_options).
    async open(source, rows, options) {
      let run = new Run(this, await this.start(source, rows));
      if (options.decoder_prompt.length) run = new PromptedRun(run, this.special.decoder_start, options.decoder_prompt, this.tgt.languages || []);
      if (optionsOn(options)) run = new OptionsRun(run, options, this.special.eos, this.tgt.tokens.length);
      return run;
    }

    // One clip's features read window by window (seekWindows), `window` frames at a time, with `options`
    // (this.options(...)); each piece's text decoded as Python decodes it.
    async seek(features, window, options) {
      const sought = await seekWindows((part, windowOptions) => this.search(this.featureSource(part), { options: windowOptions }),
        features, window, options);
      const tokens = sought.pieces.flatMap((piece) => piece.tokens);
      const segments = sought.pieces.map((p) => ({ start: p.start, end: p.end, text: this.decodeIds(p.tokens) }));
      return { ...sought, tokens, text: this.decodeIds(tokens), segments, language: this.languageOf(sought.prompt) };
    }

    // The code of the language token a decoder prompt holds (format/vocab.py's code_of: `<|fr|>` is `fr`),
    // null without one.
    languageOf(prompt) {
      const languages = new Set(this.tgt.languages || []);
      const id = prompt.find((token) => languages.has(token));
      if (id === undefined) return null;
      const token = this.tgt.tokens[id];
      return token.replace(/^[^A-Za-z0-9]*|[^A-Za-z0-9]*$/g, '') || token;
    }

    // Each window's kept tokens' times in seconds from the clip's start (runtime/words.py's window_times for
    // one clip): its tokens fed again from the start token and its prompt, the alignment heads' attention
    // read at every generated token fed, cropped to the window's audio (`content`: the clip's frames).
    async windowTimes(features, windows, content, options) {
      if (!this.manifest.graphs.decoder.outputs.some((io) => io.name === 'attention') || !(this.manifest.alignment_heads || []).length) {
        throw new Error('word timestamps: this export has no alignment heads; export it with --word-timestamps');
      }
      const total = features.dims[features.dims.length - 1];
      const rows = features.data.length / total;
      const scale = options.time_precision / options.timestamp_frames;
      const found = [];
      for (const w of windows) {
        const part = new Float32Array(rows * w.width);
        for (let r = 0; r < rows; r += 1) part.set(features.data.subarray(r * total + w.seek, r * total + w.seek + w.frames), r * w.width);
        const head = [this.special.decoder_start, ...w.prompt];
        const fed = [...head, ...(w.finished ? w.tokens : w.tokens.slice(0, -1))];
        const run = new Run(this, await this.start(this.featureSource({ data: part, dims: [...features.dims.slice(0, -1), w.width] }), 1));
        const kept = [];
        for (let t = 0; t < fed.length; t += 1) {
          const out = await run.run([fed[t]], [0], { names: ['top_log_probs', 'top_ids', 'attention'], k: 1 });
          if (t >= head.length) {
            const { data, dims } = out.attention; // (1, heads, source)
            kept.push(Array.from({ length: dims[1] }, (_, h) => data.slice(h * dims[2], (h + 1) * dims[2])));
          }
        }
        if (!w.kept) {
          found.push([]);
          continue;
        }
        const positions = Math.max(1, Math.floor((content - w.seek) / options.timestamp_frames));
        const jumps = kept.length ? tokenTimes(kept, positions, options.time_precision) : [0];
        found.push(Array.from({ length: w.kept }, (_, k) => jumps[Math.min(k, jumps.length - 1)] + w.seek * scale));
      }
      return found;
    }

    // A window's kept tokens (with their times) as words (runtime/words.py's words_of): runs of text tokens
    // split before one whose decoded text starts with a space; { start, end, text }.
    wordsOf(tokens, times, options) {
      const hidden = new Set([...Object.values(this.special), ...(this.tgt.hidden || []), ...(this.tgt.languages || []), ...(this.tgt.tasks || [])]);
      const isText = tokens.map((t) => !hidden.has(t) && !(options.timestamp_begin >= 1 && t >= options.timestamp_begin));
      const spans = [];
      let previous = [];
      isText.forEach((text, index) => {
        if (!text) return;
        const decoded = Array.from(this.decodeIds(tokens.slice(0, index + 1).filter((_, k) => isText[k]))); // code points, as Python slices
        const added = decoded.slice(previous.length).join('');
        previous = decoded;
        if (!spans.length || spans[spans.length - 1][1] !== index || startsWithSpace(added)) spans.push([index, index + 1]);
        else spans[spans.length - 1][1] = index + 1;
      });
      return spans.map(([start, end]) => ({
        start: times[start],
        end: end < tokens.length ? times[end] : times[end - 1],
        text: strip(this.decodeIds(tokens.slice(start, end).filter((_, k) => isText[start + k]))),
      }));
    }

    // Every window's words, in order.
    async words(features, windows, content, options) {
      const times = await this.windowTimes(features, windows, content, options);
      return windows.flatMap((w, i) => this.wordsOf(w.tokens.slice(0, w.kept), times[i], options));
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

    // The export's options with the caller's over them; `timestamps`: rule 3 (docs/decoding.md).
    options({ beam, alpha, maxLen, timestamps = false, decoderPrompt } = {}) {
      const options = resolve(this.manifest, { beam_size: beam, alpha, max_len: maxLen, decoder_prompt: decoderPrompt });
      return timestamps ? withTimestamps(options, this.tgt.tokens.length) : options;
    }

    // One source (textSource or featureSource) decoded with the caller's options over the export's defaults
    // (or `options`, resolved already): { text, tokens, score, finished, attention, prompt } where `prompt`
    // is the decoder prompt fed, an open slot filled with the language chosen there.
    async search(source, { beam, alpha, maxLen, attention = false, timestamps = false, decoderPrompt, options } = {}) {
      const resolved = options || this.options({ beam, alpha, maxLen, timestamps, decoderPrompt });
      let maxLength = resolved.max_len;
      const { max_len_a: a, max_len_b: b, min_len: minLen } = resolved;
      if (a || b) maxLength = Math.min(maxLength, Math.max(minLen, 1, Math.ceil(a * source.length + b))); // the source's own limit
      const withMaps = attention && this.hasAttention && !optionsOn(resolved) && !resolved.decoder_prompt.length;
      const found = resolved.beam_size === 1 ? await this.greedy(source, maxLength, resolved, withMaps)
        : await this.beamSearch(source, resolved.beam_size, maxLength, resolved, withMaps);
      return { ...found, text: this.decodeIds(found.tokens) };
    }

    async greedy(source, maxLen, options, withMaps) {
      const { alpha } = options;
      const run = await this.open(source, 1, options);
      const eos = this.special.eos;
      const tokens = [];
      const maps = [];
      let token = this.special.decoder_start;
      let logProb = 0;
      let finished = false;
      for (let t = 0; t < maxLen; t += 1) {
        const out = await run.stepTop([token], [0], 1, withMaps);
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
      return { tokens, score: logProb / Math.pow(length, alpha), finished, attention: withMaps ? maps : null, prompt: promptOf(run, options) };
    }

    // Beam search as docs/manifest.md's "Search, exactly" has it, for one sentence (K rows), n-best 1.
    async beamSearch(source, k, maxLen, options, withMaps) {
      const { alpha } = options;
      const vocab = this.tgt.tokens.length;
      if (k >= vocab) throw new Error(`beam size ${k} must be smaller than the vocabulary (${vocab})`);
      const eos = this.special.eos;
      const run = await this.open(source, k, options);
      const width = Math.min(2 * k, vocab);
      let costs = Array.from({ length: k }, (_, r) => (r === 0 ? 0 : Infinity)); // only row 0 may extend at first
      let tokens = new Array(k).fill(this.special.decoder_start);
      let reorder = Array.from({ length: k }, (_, r) => r);
      const trail = []; // per step: { parents, tokens, lps, maps }
      const endings = [];
      let active = true;
      for (let t = 0; t < maxLen && active; t += 1) {
        const out = await run.stepTop(tokens, reorder, width, withMaps);
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
      return { tokens: path, score: best.score, finished: best.eosLogProb !== null, attention: withMaps ? maps : null, prompt: promptOf(run, options) };
    }
  }

  return { Translator, split, resolve, splitWindow, wholeWindow, seekWindows, HFDecoder, topOf, strip, dtw, tokenTimes };
});
