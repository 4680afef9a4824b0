// The audio front ends of docs/manifest.md ("Front end whisper_log_mel", "Front end kaldi_fbank"),
// written from its text: mono float samples at the front end's sampling_rate in, the encoder's
// features out. Everything is computed in float64 and rounded to float32 once at the end, as the
// numpy reference (s2s_deploy/frontends/audio.py) does, so the two agree to float32 rounding.
// Shared like search.js: a classic <script> (global S2SFrontEnd) or require() in Node.
(function (root, factory) {
  if (typeof module === 'object' && module.exports) module.exports = factory();
  else root.S2SFrontEnd = factory();
})(typeof self !== 'undefined' ? self : this, function () {
  'use strict';

  const FLOAT32_EPS = Math.pow(2, -23); // Kaldi floors its energies at float32's epsilon before the log

  // Channels (Float32Arrays of equal length) averaged to one, in float64 (librosa's to_mono).
  function mono(channels) {
    const out = new Float64Array(channels[0].length);
    for (const channel of channels) for (let i = 0; i < out.length; i += 1) out[i] += channel[i];
    if (channels.length > 1) for (let i = 0; i < out.length; i += 1) out[i] /= channels.length;
    return out;
  }

  // cos and sin of 2πj/n for j = 0..n-1: a DFT reads them at (k·t mod n), so no angle is recomputed
  // and no error accumulates. n_fft is 400 for Whisper (not a power of two), hence a plain DFT: a
  // few hundred ms for a 30 s window, and exact to float64 rounding.
  const tables = new Map();
  function dftTable(n) {
    if (!tables.has(n)) {
      const cos = new Float64Array(n);
      const sin = new Float64Array(n);
      for (let j = 0; j < n; j += 1) {
        cos[j] = Math.cos((2 * Math.PI * j) / n);
        sin[j] = Math.sin((2 * Math.PI * j) / n);
      }
      tables.set(n, { cos, sin });
    }
    return tables.get(n);
  }

  // |X_k|² for k = 0..bins-1 of the n-point DFT of `frame` (zero-padded to n when shorter).
  function powerSpectrum(frame, n, bins) {
    const { cos, sin } = dftTable(n);
    const power = new Float64Array(bins);
    for (let k = 0; k < bins; k += 1) {
      let re = 0;
      let im = 0;
      let j = 0;
      for (let t = 0; t < frame.length; t += 1) {
        re += frame[t] * cos[j];
        im -= frame[t] * sin[j];
        j += k;
        if (j >= n) j -= n;
      }
      power[k] = re * re + im * im;
    }
    return power;
  }

  // numpy.linspace(start, stop, count): the last point is `stop` exactly.
  function linspace(start, stop, count) {
    const step = (stop - start) / (count - 1);
    return Array.from({ length: count }, (_, i) => (i === count - 1 ? stop : start + i * step));
  }

  // Slaney's mel scale: linear below 1 kHz, logarithmic above.
  const LOG_STEP = Math.log(6.4) / 27;
  const slaneyMel = (hz) => (hz < 1000 ? (3 * hz) / 200 : 15 + Math.log(Math.max(hz, 1e-10) / 1000) / LOG_STEP);
  const slaneyHz = (mel) => (mel < 15 ? (200 * mel) / 3 : 1000 * Math.exp(LOG_STEP * (mel - 15)));

  // (bins × n_mels) triangles in Hz between mel-spaced edges, each scaled by 2 / its width in Hz.
  function slaneyFilters(rate, nFft, nMels, maxHz) {
    const edges = linspace(slaneyMel(0), slaneyMel(maxHz), nMels + 2).map(slaneyHz);
    const bins = Math.floor(nFft / 2) + 1;
    const freqs = linspace(0, Math.floor(rate / 2), bins);
    const filters = new Float64Array(bins * nMels);
    for (let k = 0; k < bins; k += 1) {
      for (let m = 0; m < nMels; m += 1) {
        const rising = (freqs[k] - edges[m]) / (edges[m + 1] - edges[m]);
        const falling = (edges[m + 2] - freqs[k]) / (edges[m + 2] - edges[m + 1]);
        filters[k * nMels + m] = Math.max(0, Math.min(rising, falling)) * (2 / (edges[m + 2] - edges[m]));
      }
    }
    return filters;
  }

  // `x` padded by `half` samples each side, mirrored without repeating the edge (numpy's "reflect").
  function reflectPad(x, half) {
    if (x.length <= half) throw new Error(`a window of ${x.length} samples is too short to reflect ${half}`);
    const out = new Float64Array(x.length + 2 * half);
    out.set(x, half);
    for (let i = 1; i <= half; i += 1) {
      out[half - i] = x[i];
      out[half + x.length - 1 + i] = x[x.length - 1 - i];
    }
    return out;
  }

  function checkParams(kind, params, names) {
    for (const name of names) {
      if (!Number.isInteger(params[name]) || params[name] < 1) throw new Error(`${kind}.${name} must be a whole number >= 1, not ${params[name]}`);
    }
  }

  // Whisper's log-mel spectrogram of a fixed window: { data: Float32Array, dims: [n_mels, frames] }.
  // `whole` (docs/manifest.md, the uncut variant): a longer clip is not cut but keeps all its
  // samples // hop_length frames, scaled by its own loudest; a shorter one is padded to the window.
  function whisperLogMel(samples, params, whole) {
    checkParams('whisper_log_mel', params, ['sampling_rate', 'n_mels', 'n_fft', 'hop_length', 'chunk_length']);
    const { sampling_rate: rate, n_mels: nMels, n_fft: nFft, hop_length: hop } = params;
    const total = whole ? Math.max(samples.length, params.chunk_length * rate) : params.chunk_length * rate;
    const frames = Math.floor(total / hop);
    const clip = new Float64Array(total); // cut or zero-padded to the window (whole: padded only)
    clip.set(samples.length > total ? samples.subarray(0, total) : samples);
    const padded = reflectPad(clip, Math.floor(nFft / 2));
    const window = Array.from({ length: nFft }, (_, n) => 0.5 - 0.5 * Math.cos((2 * Math.PI * n) / nFft)); // periodic Hann
    const bins = Math.floor(nFft / 2) + 1;
    const filters = slaneyFilters(rate, nFft, nMels, 8000); // Whisper's filters stop at 8 kHz at any rate
    const logMel = new Float64Array(nMels * frames);
    const frame = new Float64Array(nFft);
    let top = -Infinity;
    for (let t = 0; t < frames; t += 1) {
      for (let n = 0; n < nFft; n += 1) frame[n] = padded[t * hop + n] * window[n];
      const power = powerSpectrum(frame, nFft, bins);
      for (let m = 0; m < nMels; m += 1) {
        let energy = 0;
        for (let k = 0; k < bins; k += 1) energy += power[k] * filters[k * nMels + m];
        const value = Math.log10(Math.max(energy, 1e-10));
        logMel[m * frames + t] = value;
        if (value > top) top = value;
      }
    }
    const data = new Float32Array(logMel.length);
    for (let i = 0; i < data.length; i += 1) data[i] = (Math.max(logMel[i], top - 8) + 4) / 4;
    return { data, dims: [nMels, frames] };
  }

  // (n_fft/2 × bins) Kaldi filters: triangles in Kaldi's mel space from 20 Hz to Nyquist, unscaled.
  function kaldiBanks(rate, nFft, numBins) {
    const mel = (hz) => 1127 * Math.log1p(hz / 700);
    const low = mel(20);
    const delta = (mel(rate / 2) - low) / (numBins + 1);
    const half = nFft / 2;
    const banks = new Float64Array(half * numBins);
    for (let k = 0; k < half; k += 1) {
      const m = mel((rate / nFft) * k);
      for (let b = 0; b < numBins; b += 1) {
        const left = low + b * delta;
        banks[k * numBins + b] = Math.max(0, Math.min((m - left) / delta, (left + 2 * delta - m) / delta));
      }
    }
    return banks;
  }

  // Speech2Text's Kaldi filterbank with per-utterance normalisation: { data, dims: [frames, num_mel_bins] }.
  function kaldiFbank(samples, params) {
    checkParams('kaldi_fbank', params, ['sampling_rate', 'num_mel_bins']);
    const { sampling_rate: rate, num_mel_bins: numBins } = params;
    const length = Math.floor((rate * 25) / 1000);
    const shift = Math.floor((rate * 10) / 1000);
    let nFft = 1;
    while (nFft < length) nFft *= 2;
    const frames = samples.length < length ? 0 : 1 + Math.floor((samples.length - length) / shift);
    const window = Array.from({ length }, (_, n) => Math.pow(0.5 - 0.5 * Math.cos((2 * Math.PI * n) / (length - 1)), 0.85)); // povey
    const banks = kaldiBanks(rate, nFft, numBins);
    const features = new Float64Array(frames * numBins);
    const frame = new Float64Array(length);
    for (let t = 0; t < frames; t += 1) {
      let mean = 0;
      for (let n = 0; n < length; n += 1) mean += samples[t * shift + n] * 32768; // Kaldi's 16-bit sample values
      mean /= length;
      let previous = samples[t * shift] * 32768 - mean; // pre-emphasis: the first sample against itself
      for (let n = 0; n < length; n += 1) {
        const value = samples[t * shift + n] * 32768 - mean;
        frame[n] = (value - 0.97 * previous) * window[n];
        previous = value;
      }
      const power = powerSpectrum(frame, nFft, nFft / 2); // the Nyquist bin is dropped
      for (let b = 0; b < numBins; b += 1) {
        let energy = 0;
        for (let k = 0; k < nFft / 2; k += 1) energy += power[k] * banks[k * numBins + b];
        features[t * numBins + b] = Math.log(Math.max(energy, FLOAT32_EPS));
      }
    }
    normalise(features, frames, numBins, params.normalize_means !== false, params.normalize_vars !== false);
    return { data: Float32Array.from(features), dims: [frames, numBins] };
  }

  // Per-bin mean and variance normalisation over the utterance; a bin that never varies stays put
  // rather than being divided by zero.
  function normalise(features, frames, bins, means, vars) {
    if (!frames) return;
    for (let b = 0; b < bins; b += 1) {
      let mean = 0;
      for (let t = 0; t < frames; t += 1) mean += features[t * bins + b];
      mean /= frames;
      if (means) for (let t = 0; t < frames; t += 1) features[t * bins + b] -= mean;
      if (!vars) continue;
      const centre = means ? 0 : mean;
      let spread = 0;
      for (let t = 0; t < frames; t += 1) spread += (features[t * bins + b] - centre) ** 2;
      const deviation = Math.sqrt(spread / frames);
      if (deviation > 0) for (let t = 0; t < frames; t += 1) features[t * bins + b] /= deviation;
    }
  }

  const FRONT_ENDS = { whisper_log_mel: whisperLogMel, kaldi_fbank: kaldiFbank };

  // The features of `frontend` (the manifest's encoder_input.frontend) for mono samples at its rate;
  // { whole: true }: uncut, for reading a long clip window by window (a front end without a window
  // never cuts).
  function compute(frontend, samples, { whole = false } = {}) {
    const run = FRONT_ENDS[frontend && frontend.kind];
    if (!run) throw new Error(`the ${frontend && frontend.kind} front end is not computed here: ${Object.keys(FRONT_ENDS).join(' and ')} only (docs/manifest.md)`);
    if (!samples.length) throw new Error('the clip holds no audio samples');
    return run(samples, frontend, whole);
  }

  // The frames one encoder call reads when the front end fixes them (Whisper's window), else null.
  function windowFrames(frontend) {
    return frontend.kind === 'whisper_log_mel' ? Math.floor((frontend.chunk_length * frontend.sampling_rate) / frontend.hop_length) : null;
  }

  // The frames that hold the clip itself, not the padding the front end adds (word timestamps align tokens
  // to these only): Whisper's attention mask, ceil(samples / hop_length); null (every frame) for the others.
  function contentFrames(frontend, samples) {
    return frontend.kind === 'whisper_log_mel' ? Math.ceil(samples.length / frontend.hop_length) : null;
  }

  return { compute, mono, windowFrames, contentFrames, kinds: Object.keys(FRONT_ENDS) };
});
