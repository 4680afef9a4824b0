// Drives the page in a headless Chromium with puppeteer-core (the browser test's helper).
// usage: node drive.js URL SCREENSHOT.png < JOB
// A text export's JOB is {"texts": [...], "beams": [1, 4]}; it prints {"1": [{text, ms}, ...], "4": [...]}:
// the page's own translations for each beam, after clicking Translate on its default sentences.
// An audio export's JOB is {"clips": [[samples at the front end's rate], ...], "beams": [...],
// "frontends": [{kind, ...}], "files": [URL relative to the page], "upload": PATH, "record": WAV (optional)}; it prints
// {"beams": {beam: [{text, ms}]}, "features": [[data per clip] per front end], "whole": [data per clip, uncut, first front end],
//  "decoded": [samples per file as the upload decodes it], "files": {beam: [{text, ms}] of those},
//  "garbage": the error decoding three bytes that are no audio file,
//  "upload": [[source, text, ms] per table row after uploading PATH through the file input],
//  "record": the same after recording 3 s from a fake microphone that plays WAV (Chromium's flags)}.
// A JOB of {"calls": [[name, ...args], ...]} (one browser for many checks) prints each
// window.s2s[name](...args)'s result in order (["goto", URL]: the page at URL from then on), then uploads "upload" (a path, optional) through the file
// input with the boxes of "boxes" ({id: checked}) set, and adds "table": the table's rows as a user sees them,
// "html": the table's markup, and "karaoke": for each time of "seek" (seconds), the index of the word the
// first row's player highlights once sought there (-1: none).
'use strict';
const puppeteer = require('puppeteer-core');

async function textPage(page, { texts, beams }) {
  const results = {};
  for (const beam of beams) results[beam] = await page.evaluate((t, b) => window.s2s.translate(t, b), texts, beam);
  // The page as a user sees it: the default sentences at the default beam, first row's attention.
  await page.click('#translate');
  return results;
}

function tableRows(page) {
  return page.$$eval('#results tr', (rows) => rows.map((row) => Array.from(row.cells, (cell) => cell.textContent)));
}

async function audioPage(page, { clips, beams, frontends, files, upload, record }) {
  const results = { beams: {}, files: {} };
  for (const beam of beams) results.beams[beam] = await page.evaluate((c, b) => window.s2s.transcribe(c, b), clips, beam);
  // The front end alone, on the very samples the Python side read.
  results.features = await page.evaluate((configs, c) => configs.map((f) => c.map((s) => Array.from(S2SFrontEnd.compute(f, Float32Array.from(s)).data))), frontends, clips);
  // The first front end's uncut variant, which a clip longer than the window is read from.
  results.whole = await page.evaluate((f, c) => c.map((s) => Array.from(S2SFrontEnd.compute(f, Float32Array.from(s), { whole: true }).data)), frontends[0], clips);
  // The upload's decoding (and resampling) by the browser, then the same search.
  results.decoded = await page.evaluate(async (urls) => {
    const decoded = [];
    for (const url of urls) decoded.push(Array.from(await window.s2s.decodeAudio(new Uint8Array(await (await fetch(url)).arrayBuffer()))));
    return decoded;
  }, files);
  for (const beam of beams) results.files[beam] = await page.evaluate((c, b) => window.s2s.transcribe(c, b), results.decoded, beam);
  // Bytes that are no audio file: the message the page would show.
  results.garbage = await page.evaluate(() => window.s2s.decodeAudio(new Uint8Array([1, 2, 3])).then(() => null, (error) => error.message));
  // The page as a user sees it: a file chosen in its file input, transcribed at the default beam.
  const input = await page.$('#files');
  await input.uploadFile(upload);
  await page.waitForFunction(() => /ms each|error/.test(document.getElementById('status').textContent), { timeout: 120000 });
  results.upload = await tableRows(page);
  if (!record) return results;
  // The microphone: Chromium's fake capture device plays the WAV in a loop.
  await page.click('#record');
  await page.waitForFunction(() => document.getElementById('status').textContent === 'recording…', { timeout: 30000 });
  await new Promise((resolve) => { setTimeout(resolve, 3000); });
  await page.click('#record');
  await page.waitForFunction(() => /^recording/.test(document.querySelector('#results td')?.textContent || '') || /error/.test(document.getElementById('status').textContent), { timeout: 120000 });
  results.record = await tableRows(page);
  return results;
}

async function calls(page, { calls: list, upload, boxes, seek }) {
  const results = [];
  for (const [name, ...args] of list) {
    if (name === 'goto') { // another page (another export): what follows runs there
      await page.goto(args[0], { waitUntil: 'load' });
      await page.evaluate(() => window.s2s.ready.then(() => null));
      results.push(null);
    } else {
      results.push(await page.evaluate((n, a) => window.s2s[n](...a), name, args));
    }
  }
  if (!upload) return { results };
  for (const [id, checked] of Object.entries(boxes || {})) await page.$eval(`#${id}`, (box, on) => { box.checked = on; }, checked);
  await (await page.$('#files')).uploadFile(upload);
  await page.waitForFunction(() => /ms each|error/.test(document.getElementById('status').textContent), { timeout: 120000 });
  const karaoke = [];
  for (const time of seek || []) {
    karaoke.push(await page.$eval('#results audio', (player, t) => new Promise((resolve, reject) => {
      const sought = () => {
        player.removeEventListener('seeked', sought);
        setTimeout(() => { // after the page's own seeked listener
          const now = player.parentElement.querySelector('span.now');
          resolve(now ? Number(now.dataset.index) : -1);
        }, 50);
      };
      player.addEventListener('seeked', sought);
      player.addEventListener('error', () => reject(new Error('the player cannot load the clip')));
      const go = () => { player.currentTime = t; };
      if (player.readyState >= 1) go(); else player.addEventListener('loadedmetadata', go, { once: true });
    }), time));
  }
  return { results, table: await tableRows(page), html: await page.$eval('#results', (el) => el.innerHTML), karaoke };
}

// All of stdin: readFileSync(0) fails with EAGAIN on a pipe that is still filling (an audio job's samples).
async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks).toString('utf8');
}

async function main() {
  const [url, screenshot] = process.argv.slice(2);
  const job = JSON.parse(await readStdin());
  const browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', // root in a container
      ...(job.record ? ['--use-fake-ui-for-media-stream', '--use-fake-device-for-media-stream', `--use-file-for-fake-audio-capture=${job.record}`] : [])],
  });
  try {
    const page = await browser.newPage();
    const problems = [];
    page.on('pageerror', (error) => problems.push(error.message));
    page.on('console', (message) => { if (message.type() === 'error') problems.push(message.text()); });
    await page.setViewport({ width: 1000, height: 900 });
    await page.goto(url, { waitUntil: 'load' });
    await page.evaluate(() => window.s2s.ready.then(() => null));
    const results = job.calls ? await calls(page, job) : job.clips ? await audioPage(page, job) : await textPage(page, job);
    await page.waitForFunction(() => /ms each|error/.test(document.getElementById('status').textContent), { timeout: 120000 });
    await page.screenshot({ path: screenshot, fullPage: true });
    const status = await page.$eval('#status', (el) => el.textContent);
    if (status.startsWith('error') || problems.length) throw new Error(`${status} ${problems.join('; ')}`);
    console.log(JSON.stringify(results));
  } finally {
    await browser.close();
  }
}

main().catch((error) => {
  console.error(`error: ${error.message}`);
  process.exit(1);
});
