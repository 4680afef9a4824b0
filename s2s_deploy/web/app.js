// The page: loads the export beside it (or the folder in ?export=...), checks each graph's sha256,
// translates one sentence at a time with search.js and shows the time and the attention map. An
// export whose encoder reads audio features gets file and microphone input instead of the text
// box: the browser decodes the audio at the front end's rate, frontend.js computes the features.
// page.json (written by `web`) may name Silero VAD's model: then a VAD box reads only the speech, as
// `transcribe --vad` does (vad.js).
/* global ort, S2SSearch, S2SFrontEnd, S2SVad */
'use strict';

const folder = new URLSearchParams(location.search).get('export') || '.';
const $ = (id) => document.getElementById(id);

async function fetchBytes(name) {
  const response = await fetch(`${folder}/${name}`);
  if (!response.ok) throw new Error(`${name}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

// A file the manifest names with its sha256 ({ file, sha256 }), checked.
async function checkedBytes(entry) {
  const bytes = await fetchBytes(entry.file);
  if (crypto.subtle) { // only in secure contexts (https, localhost, 127.0.0.1)
    const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
    const hex = Array.from(digest, (b) => b.toString(16).padStart(2, '0')).join('');
    if (hex !== entry.sha256) throw new Error(`${entry.file} does not match the sha256 in the manifest`);
  }
  return bytes;
}

async function checkedGraph(entry) {
  return ort.InferenceSession.create(await checkedBytes(entry), { executionProviders: ['wasm'], logSeverityLevel: 3 });
}

async function load() {
  ort.env.wasm.wasmPaths = new URL('ort/', location.href).href;
  ort.env.logLevel = 'error';
  ort.env.wasm.numThreads = 1; // threads need a cross-origin-isolated page; one works anywhere
  const manifest = JSON.parse(new TextDecoder().decode(await fetchBytes('manifest.json')));
  const [encoder, decoder] = await Promise.all([checkedGraph(manifest.graphs.encoder), checkedGraph(manifest.graphs.decoder)]);
  const target = manifest.vocab.target; // an hf vocabulary's tokenizer.json reads its ids back as text
  const tokenizer = target.level === 'hf' && target.tokenizer ? JSON.parse(new TextDecoder().decode(await checkedBytes(target.tokenizer))) : null;
  const translator = new S2SSearch.Translator(ort, manifest, encoder, decoder, tokenizer);
  if (translator.input.kind === 'features') {
    const page = JSON.parse(new TextDecoder().decode(await fetchBytes('page.json')));
    translator.vad = page.vad ? { ...page.vad, session: await checkedGraph(page.vad) } : null;
    return audioPage(translator);
  }
  const sizes = `${manifest.vocab.source.tokens.length}/${manifest.vocab.target.tokens.length} tokens`;
  $('model').textContent = `${manifest.plugin.name} v${manifest.plugin.version} (${sizes}${translator.hasAttention ? ', with attention' : ''})`;
  $('input').value = (manifest.samples || []).slice(0, 8).join('\n');
  return translator;
}

function audioPage(translator) {
  const { manifest } = translator;
  const frontend = manifest.encoder_input.frontend;
  if (!S2SFrontEnd.kinds.includes(frontend.kind)) { // e.g. an image front end: refused before any input
    throw new Error(`this export reads ${frontend.kind} features, which this page does not compute: ${S2SFrontEnd.kinds.join(' and ')} only`);
  }
  $('model').textContent = `${manifest.plugin.name} v${manifest.plugin.version} (${frontend.kind} at ${frontend.sampling_rate} Hz, ${manifest.vocab.target.tokens.length} target tokens)`;
  $('input').hidden = true;
  $('audio').hidden = false;
  $('translate').textContent = 'Transcribe';
  $('timestamps-box').hidden = !((manifest.search || {}).timestamp_begin >= 1);
  $('vad-box').hidden = !translator.vad;
  $('words-box').hidden = !(manifest.alignment_heads || []).length;
  $('output-head').textContent = 'transcription';
  return translator;
}

// An encoded audio file's bytes as mono float32 samples at `rate`. decodeAudioData resamples to its
// context's rate, so a file already at `rate` is decoded without resampling; the channels are then
// averaged in float64 and rounded to float32, as s2s_deploy/frontends/audio.py reads a file.
async function decodeAudio(bytes, rate) {
  const context = new OfflineAudioContext(1, 1, rate);
  let buffer;
  try {
    buffer = await context.decodeAudioData(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
  } catch (error) {
    throw new Error(`cannot decode the audio: ${error.message}`);
  }
  const channels = Array.from({ length: buffer.numberOfChannels }, (_, c) => buffer.getChannelData(c));
  return Float32Array.from(S2SFrontEnd.mono(channels));
}

// Clips ({ source, samples at the front end's rate }) in order; each result has its text, its timed
// segments (where the clip was read by its timestamps) and the milliseconds of its front end and search.
// vad: false, true (page.json's options) or options over page.json's; words: each clip's words timed
// (an export made with --word-timestamps).
async function transcribeAll(translator, clips, beam, timestamps = false, vad = false, words = false) {
  const results = [];
  for (const clip of clips) {
    const start = performance.now();
    const samples = Float32Array.from(clip.samples);
    const found = vad ? await transcribeSpeech(translator, samples, beam, timestamps, vad === true ? {} : vad, words)
      : await transcribeSamples(translator, samples, beam, timestamps, words);
    const { text, segments, chunks, language } = found;
    results.push({ source: clip.source, text, segments, chunks, language, words: found.words, audio: clip.audio, ms: performance.now() - start, attention: null });
  }
  return results;
}

// One clip's samples read as transcribeWindows reads them, and with `words` its words timed
// (runtime/words.py's decode_words): { text, segments, windows, words }.
async function transcribeSamples(translator, samples, beam, timestamps, words) {
  const frontend = translator.manifest.encoder_input.frontend;
  const features = S2SFrontEnd.compute(frontend, samples, { whole: true });
  const found = await transcribeWindows(translator, features, beam, timestamps);
  if (!words) return found;
  const content = S2SFrontEnd.contentFrames(frontend, samples) || features.dims[features.dims.length - 1];
  return { ...found, words: await translator.words(features, found.windows, content, translator.options({ beam })) };
}

// One clip's speech alone (runtime/vad.py's decode_speech for one clip): Silero's speech spans laid end to
// end into windows of at most the encoder's length, each window read as transcribeWindows reads a clip,
// the texts stripped and joined by one space, segment times held to the window's speech and mapped back
// to the clip. { text, segments, chunks: the speech spans in samples }.
async function transcribeSpeech(translator, samples, beam, timestamps, given, words) {
  const { vad, manifest } = translator;
  if (!vad) throw new Error('this page has no vad model: write it with s2s-deploy web DIR --vad');
  const frontend = manifest.encoder_input.frontend;
  const rate = frontend.sampling_rate;
  if (rate !== vad.rate) throw new Error(`the vad model reads ${vad.rate} Hz audio, and this export reads ${rate} Hz`);
  const frames = (manifest.limits && manifest.limits.max_source_length) || S2SFrontEnd.windowFrames(frontend);
  const seconds = frames ? frames * (frontend.hop_length / rate) : Infinity; // runtime/vad.py's window_seconds
  const probabilities = await S2SVad.probabilities(ort, vad.session, samples, vad);
  const chunks = S2SVad.spans(probabilities, samples.length, { ...vad.options, ...given }, seconds, vad);
  const texts = [];
  const segments = [];
  const timed = [];
  let language = null; // the first window's that names one
  for (const window of S2SVad.windows(chunks, rate, seconds)) {
    const found = await transcribeSamples(translator, S2SVad.windowAudio(window, samples), beam, timestamps, words);
    const stripped = S2SSearch.strip(found.text);
    if (language === null) language = found.language;
    if (stripped) texts.push(stripped);
    const duration = S2SVad.duration(window);
    if (timestamps) {
      for (const s of found.segments) {
        segments.push({ start: S2SVad.original(window, Math.min(s.start, duration)), end: S2SVad.original(window, Math.min(s.end, duration), true), text: s.text });
      }
    }
    for (const word of found.words || []) { // through the span its middle falls in
      const span = S2SVad.spanOf(window, Math.min((word.start + word.end) / 2, duration));
      timed.push({ start: S2SVad.original(window, Math.min(word.start, duration), false, span), end: S2SVad.original(window, Math.min(word.end, duration), true, span), text: word.text });
    }
  }
  return { text: texts.join(' '), segments, chunks, language, words: words ? timed : undefined };
}

// Where each window of a long clip ends when the manifest's search says window_cut "pause"
// (docs/manifest.md, "Timestamps, window by window"; runtime/pauses.py): at the quietest frame of
// its last 40%, loudness being the mean over the rows averaged over 15 frames, the latest of equals.
function pauseEnds(data, rows, frames, window) {
  const mean = new Float64Array(frames);
  for (let r = 0; r < rows; r += 1) for (let t = 0; t < frames; t += 1) mean[t] += data[r * frames + t];
  for (let t = 0; t < frames; t += 1) mean[t] /= rows;
  const level = new Float64Array(frames);
  for (let t = 0; t < frames; t += 1) {
    let sum = 0;
    const first = Math.max(0, t - 7);
    const last = Math.min(frames - 1, t + 7);
    for (let k = first; k <= last; k += 1) sum += mean[k];
    level[t] = sum / (last - first + 1);
  }
  const ends = [];
  for (let start = 0; frames - start > window; start = ends[ends.length - 1]) {
    let end = start + window;
    for (let t = end - 1; t >= start + Math.max(1, Math.floor(window * 0.6)); t -= 1) if (level[t] < level[end]) end = t;
    ends.push(end);
  }
  ends.push(frames);
  return ends;
}

// One clip's uncut features ({ data, dims }, frames last) as `transcribe` reads them
// (runtime/features.py, docs/decoding.md "Timestamps"): { text, segments }. With `timestamps` (an export
// with timestamp tokens), window by window by its timestamps at any length, segments timed. Without:
// within the window, one search; longer, an export with timestamp tokens seeks by them all the same
// (generate turns them on for long-form input) and its segments are shown; one without reads one whole
// window after another, each zero-padded (or, with window_cut "pause", ending at pauses and padded with the
// clip's lowest value), the texts stripped and joined by one space.
async function transcribeWindows(translator, features, beam, timestamps) {
  const { manifest } = translator;
  const window = (manifest.limits && manifest.limits.max_source_length) || S2SFrontEnd.windowFrames(manifest.encoder_input.frontend);
  const { shape } = translator.input;
  const frames = features.dims[features.dims.length - 1];
  const seekable = window && shape[shape.length - 1] === 'frames';
  if (timestamps && !seekable) throw new Error("timestamps: this encoder's input has no frames axis last to seek along");
  if (timestamps || (seekable && frames > window && (manifest.search || {}).timestamp_begin >= 1)) {
    const { text, segments, windows, language } = await translator.seek(features, window, translator.options({ beam, timestamps: true }));
    return { text, segments, windows, language };
  }
  if (!seekable || frames <= window) {
    const found = await translator.transcribe(features, { beam });
    const n = translator.featureSource(features).length;
    const windows = [{ seek: 0, frames: n, width: n, tokens: found.tokens, finished: found.finished, prompt: found.prompt, kept: found.tokens.length }];
    return { text: found.text, segments: [], windows, language: translator.languageOf(found.prompt) };
  }
  if ((manifest.search || {}).window_cut === 'pause') { // runtime/pauses.py: windows end at pauses
    const rows = features.data.length / frames;
    let floor = Infinity;
    for (const value of features.data) floor = Math.min(floor, value);
    const texts = [];
    let first = 0;
    for (const end of pauseEnds(features.data, rows, frames, window)) {
      const part = new Float32Array(rows * window).fill(floor);
      for (let r = 0; r < rows; r += 1) part.set(features.data.subarray(r * frames + first, r * frames + end), r * window);
      const text = S2SSearch.strip((await translator.transcribe({ data: part, dims: [...features.dims.slice(0, -1), window] }, { beam })).text);
      if (text) texts.push(text);
      first = end;
    }
    return { text: texts.join(' '), segments: [], windows: [], language: null };
  }
  const { segments, windows, language } = await translator.seek(features, window, translator.options({ beam }));
  const text = segments.map((s) => S2SSearch.strip(s.text)).filter((t) => t).join(' ');
  return { text, segments: [], windows, language };
}

// Translates texts in order; each result has its text and milliseconds.
async function translateAll(translator, texts, beam) {
  const results = [];
  for (const text of texts) {
    const start = performance.now();
    const found = await translator.translate(text, { beam, attention: translator.hasAttention });
    results.push({ source: text, text: found.text, ms: performance.now() - start, attention: found.attention, sourceTokens: found.sourceTokens, targetTokens: found.tokens.map((id) => translator.tgt.tokens[id]).concat(found.finished ? ['<eos>'] : []) });
  }
  return results;
}

function drawAttention(result) {
  const box = $('attention-box');
  if (!result.attention) { box.hidden = true; return; }
  box.hidden = false;
  const canvas = $('attention');
  const cell = 18;
  const left = 40;
  const top = 40;
  const rows = result.attention.length;
  const cols = result.sourceTokens.length;
  canvas.width = left + cols * cell + 4;
  canvas.height = top + rows * cell + 4;
  const g = canvas.getContext('2d');
  g.fillStyle = '#fff';
  g.fillRect(0, 0, canvas.width, canvas.height);
  g.font = '12px monospace';
  g.textAlign = 'center';
  g.fillStyle = '#000';
  result.sourceTokens.forEach((t, j) => g.fillText(t === ' ' ? '␣' : t.slice(0, 2), left + j * cell + cell / 2, top - 8));
  result.attention.forEach((weights, i) => {
    g.fillStyle = '#000';
    const label = result.targetTokens[i] || '';
    g.fillText(label === ' ' ? '␣' : label.slice(0, 3), left / 2, top + i * cell + cell * 0.7);
    for (let j = 0; j < cols; j += 1) {
      const shade = Math.round(255 * (1 - Math.min(1, weights[j] || 0)));
      g.fillStyle = `rgb(${shade},${shade},255)`;
      g.fillRect(left + j * cell, top + i * cell, cell - 1, cell - 1);
    }
  });
}

// A clip's timed segments, one line each: [start → end] text (seconds from the clip's start).
function segmentList(segments) {
  const list = document.createElement('ol');
  list.className = 'segments';
  for (const segment of segments) {
    const item = document.createElement('li');
    item.textContent = `[${segment.start.toFixed(2)} → ${segment.end.toFixed(2)}] ${segment.text}`;
    list.append(item);
  }
  return list;
}

// A clip's words as a karaoke line: with its audio (a file or recording), a player, and the word whose
// [start, end) holds the playing time highlighted, from the times word timestamps gave (seconds).
function karaoke(words, audio) {
  const box = document.createElement('div');
  box.className = 'karaoke';
  const line = document.createElement('p');
  const spans = words.map((word, i) => {
    const span = document.createElement('span');
    span.textContent = word.text;
    span.dataset.index = i;
    span.title = `${word.start.toFixed(2)} → ${word.end.toFixed(2)}`;
    line.append(span, ' ');
    return span;
  });
  if (audio) {
    const player = document.createElement('audio');
    player.controls = true;
    player.src = URL.createObjectURL(audio);
    let shown = -1;
    const highlight = () => {
      const t = player.currentTime;
      const now = words.findIndex((word) => word.start <= t && t < word.end);
      if (now !== shown) {
        if (shown >= 0) spans[shown].classList.remove('now');
        if (now >= 0) spans[now].classList.add('now');
        shown = now;
      }
      if (!player.paused) requestAnimationFrame(highlight); // timeupdate alone fires only every 250 ms or so
    };
    for (const event of ['play', 'seeked', 'timeupdate']) player.addEventListener(event, highlight);
    box.append(player);
  }
  box.append(line);
  return box;
}

function show(results) {
  const body = $('results');
  body.textContent = '';
  results.forEach((r, i) => {
    const row = body.insertRow();
    row.insertCell().textContent = r.language ? `${r.source} [${r.language}]` : r.source; // the language its prompt held
    const text = row.insertCell();
    text.textContent = r.text;
    if (r.segments && r.segments.length) text.append(segmentList(r.segments));
    if (r.words && r.words.length) text.append(karaoke(r.words, r.audio));
    const ms = row.insertCell();
    ms.className = 'ms';
    ms.textContent = r.ms.toFixed(1);
    row.addEventListener('click', () => {
      body.querySelectorAll('tr').forEach((tr) => tr.classList.remove('selected'));
      row.classList.add('selected');
      drawAttention(r);
    });
    if (i === 0) row.click();
  });
}

const ready = load();
const plain = (results) => results.map(({ text, ms, segments, chunks, words, language }) => ({ text, ms, ...(segments ? { segments } : {}), ...(chunks ? { chunks } : {}), ...(words ? { words } : {}), ...(language ? { language } : {}) }));
window.s2s = {
  ready,
  // For scripts and tests: plain data, no DOM.
  translate: async (texts, beam) => plain(await translateAll(await ready, texts, beam)),
  // clips: arrays of mono samples at the front end's sampling_rate.
  // { timestamps: true }: each clip's segments timed (an export with timestamp tokens).
  // vad: only speech read (a page written with --vad; true, or options over page.json's); chunks: its
  // speech spans in samples.
  // words: each clip's words timed (an export made with --word-timestamps).
  transcribe: async (clips, beam, { timestamps = false, vad = false, words = false } = {}) => plain(await transcribeAll(await ready, clips.map((samples, i) => ({ source: `clip ${i + 1}`, samples })), beam, timestamps, vad, words)),
  // An audio file's bytes as the upload decodes them: mono float32 at the front end's rate.
  decodeAudio: async (bytes) => decodeAudio(bytes, (await ready).manifest.encoder_input.frontend.sampling_rate),
};

function fail(error) {
  $('status').textContent = `error: ${error.message}`;
  $('status').className = 'error';
}

// Runs `work` (which returns results) with the buttons disabled, then shows what it found.
async function busy(label, noun, work) {
  const buttons = [$('translate'), $('record')];
  buttons.forEach((b) => { b.disabled = true; });
  $('status').textContent = label;
  $('status').className = '';
  try {
    const results = await work();
    show(results);
    const total = results.reduce((sum, r) => sum + r.ms, 0);
    $('status').textContent = `${results.length} ${results.length === 1 ? noun.slice(0, -1) : noun}, ${(total / Math.max(1, results.length)).toFixed(1)} ms each`;
  } catch (error) {
    fail(error);
  } finally {
    $('translate').disabled = false;
    $('record').disabled = !navigator.mediaDevices; // the microphone needs a secure context (https, localhost)
  }
}

// The chosen files, decoded and transcribed at the chosen beam.
function transcribeFiles(translator) {
  const rate = translator.manifest.encoder_input.frontend.sampling_rate;
  return busy('transcribing…', 'clips', async () => {
    const clips = [];
    for (const file of $('files').files) {
      clips.push({ source: file.name, samples: await decodeAudio(new Uint8Array(await file.arrayBuffer()), rate), audio: file });
    }
    if (!clips.length) throw new Error('choose an audio file or record a clip first');
    return transcribeAll(translator, clips, Number($('beam').value), $('timestamps').checked, $('vad').checked, $('words').checked);
  });
}

// Record toggles a MediaRecorder on the microphone; the recording (the browser's own codec, e.g.
// Opus in WebM) is decoded like an upload when it stops.
function recorder(translator) {
  const rate = translator.manifest.encoder_input.frontend.sampling_rate;
  let recording = null;
  return async () => {
    if (recording) {
      recording.stop();
      return;
    }
    try {
      const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
      const chunks = [];
      recording = new MediaRecorder(stream);
      recording.addEventListener('dataavailable', (event) => chunks.push(event.data));
      recording.addEventListener('stop', () => {
        stream.getTracks().forEach((track) => track.stop());
        recording = null;
        $('record').textContent = 'Record';
        busy('transcribing…', 'clips', async () => {
          const bytes = new Uint8Array(await new Blob(chunks).arrayBuffer());
          const samples = await decodeAudio(bytes, rate);
          return transcribeAll(translator, [{ source: `recording (${(samples.length / rate).toFixed(1)} s)`, samples, audio: new Blob(chunks) }], Number($('beam').value), $('timestamps').checked, $('vad').checked, $('words').checked);
        });
      });
      recording.start();
      $('record').textContent = 'Stop';
      $('status').textContent = 'recording…';
    } catch (error) {
      fail(new Error(`microphone: ${error.message}`));
    }
  };
}

ready.then((translator) => {
  const button = $('translate');
  button.disabled = false;
  $('status').textContent = 'ready';
  if (translator.input.kind === 'features') {
    $('record').disabled = !navigator.mediaDevices;
    $('record').addEventListener('click', recorder(translator));
    $('files').addEventListener('change', () => transcribeFiles(translator));
    button.addEventListener('click', () => transcribeFiles(translator));
    return;
  }
  button.addEventListener('click', () => busy('translating…', 'sentences', () => {
    const texts = $('input').value.split('\n').filter((line) => line.trim());
    return translateAll(translator, texts, Number($('beam').value));
  }));
}, fail);
