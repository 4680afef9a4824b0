// Greedy or beam search of an s2s-deploy export with onnxruntime-node, from docs/manifest.md alone.
// The search itself is s2s_deploy/web/search.js, the module the browser page runs too.
// usage: node translate.js EXPORT_DIR [--beam K] "sentence" ...
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');
const { Translator } = require('../../s2s_deploy/web/search.js');

async function main() {
  const args = process.argv.slice(2);
  const folder = args.shift();
  let beam = 1;
  if (args[0] === '--beam') {
    beam = Number(args[1]);
    args.splice(0, 2);
    if (!Number.isInteger(beam) || beam < 1) throw new Error('--beam needs a positive integer');
  }
  const manifest = JSON.parse(fs.readFileSync(path.join(folder, 'manifest.json'), 'utf8'));
  const options = { executionProviders: ['cpu'] };
  const encoder = await ort.InferenceSession.create(path.join(folder, manifest.graphs.encoder.file), options);
  const decoder = await ort.InferenceSession.create(path.join(folder, manifest.graphs.decoder.file), options);
  const translator = new Translator(ort, manifest, encoder, decoder);
  for (const text of args) console.log((await translator.translate(text, { beam })).text);
}

main().catch((error) => {
  console.error(`error: ${error.message}`);
  process.exit(1);
});
