// Greedy or beam decoding of an s2s-deploy export with onnxruntime-node, through the search
// module the browser page runs (s2s_deploy/web/search.js): one implementation for both.
// beam.js beside this file is the independent check, written from docs/manifest.md alone.
// usage: node translate.js EXPORT_DIR [--beam K] "sentence" ...
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');
const { Translator } = require('../../s2s_deploy/web/search.js');

function parse(argv) {
  const [folder, ...rest] = argv;
  let beam; // the export's own default (its manifest's search.beam_size, else 1)
  const texts = [];
  for (let i = 0; i < rest.length; i += 1) {
    if (rest[i] === '--beam') {
      beam = Number(rest[i + 1]);
      if (!Number.isInteger(beam) || beam < 1) throw new Error(`--beam takes a whole number >= 1, not ${rest[i + 1]}`);
      i += 1;
    } else {
      texts.push(rest[i]);
    }
  }
  if (!folder) throw new Error('usage: node translate.js EXPORT_DIR [--beam K] "sentence" ...');
  return { folder, beam, texts };
}

async function main() {
  const { folder, beam, texts } = parse(process.argv.slice(2));
  const manifest = JSON.parse(fs.readFileSync(path.join(folder, 'manifest.json'), 'utf8'));
  const options = { executionProviders: ['cpu'] };
  const encoder = await ort.InferenceSession.create(path.join(folder, manifest.graphs.encoder.file), options);
  const decoder = await ort.InferenceSession.create(path.join(folder, manifest.graphs.decoder.file), options);
  const translator = new Translator(ort, manifest, encoder, decoder);
  for (const text of texts) console.log((await translator.translate(text, { beam })).text);
}

main().catch((error) => {
  console.error(`error: ${error.message}`);
  process.exit(1);
});
