// The page: loads the export beside it (or the folder in ?export=...), checks each graph's sha256,
// translates one sentence at a time with search.js and shows the time and the attention map.
/* global ort, S2SSearch */
'use strict';

const folder = new URLSearchParams(location.search).get('export') || '.';
const $ = (id) => document.getElementById(id);

async function fetchBytes(name) {
  const response = await fetch(`${folder}/${name}`);
  if (!response.ok) throw new Error(`${name}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

async function checkedGraph(entry) {
  const bytes = await fetchBytes(entry.file);
  if (crypto.subtle) { // only in secure contexts (https, localhost, 127.0.0.1)
    const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
    const hex = Array.from(digest, (b) => b.toString(16).padStart(2, '0')).join('');
    if (hex !== entry.sha256) throw new Error(`${entry.file} does not match the sha256 in the manifest`);
  }
  return ort.InferenceSession.create(bytes, { executionProviders: ['wasm'], logSeverityLevel: 3 });
}

async function load() {
  ort.env.wasm.wasmPaths = new URL('ort/', location.href).href;
  ort.env.logLevel = 'error';
  ort.env.wasm.numThreads = 1; // threads need a cross-origin-isolated page; one works anywhere
  const manifest = JSON.parse(new TextDecoder().decode(await fetchBytes('manifest.json')));
  const [encoder, decoder] = await Promise.all([checkedGraph(manifest.graphs.encoder), checkedGraph(manifest.graphs.decoder)]);
  const translator = new S2SSearch.Translator(ort, manifest, encoder, decoder);
  const sizes = `${manifest.vocab.source.tokens.length}/${manifest.vocab.target.tokens.length} tokens`;
  $('model').textContent = `${manifest.plugin.name} v${manifest.plugin.version} (${sizes}${translator.hasAttention ? ', with attention' : ''})`;
  $('input').value = (manifest.samples || []).slice(0, 8).join('\n');
  return translator;
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

function show(results) {
  const body = $('results');
  body.textContent = '';
  results.forEach((r, i) => {
    const row = body.insertRow();
    row.insertCell().textContent = r.source;
    row.insertCell().textContent = r.text;
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
window.s2s = {
  ready,
  // For scripts and tests: plain data, no DOM.
  translate: async (texts, beam) => (await translateAll(await ready, texts, beam)).map(({ text, ms }) => ({ text, ms })),
};

ready.then((translator) => {
  const button = $('translate');
  button.disabled = false;
  $('status').textContent = 'ready';
  button.addEventListener('click', async () => {
    const texts = $('input').value.split('\n').filter((line) => line.trim());
    button.disabled = true;
    $('status').textContent = 'translating…';
    try {
      const results = await translateAll(translator, texts, Number($('beam').value));
      show(results);
      const total = results.reduce((sum, r) => sum + r.ms, 0);
      $('status').textContent = `${results.length} sentences, ${(total / Math.max(1, results.length)).toFixed(1)} ms each`;
    } catch (error) {
      $('status').textContent = `error: ${error.message}`;
      $('status').className = 'error';
    } finally {
      button.disabled = false;
    }
  });
}, (error) => {
  $('status').textContent = `error: ${error.message}`;
  $('status').className = 'error';
});
