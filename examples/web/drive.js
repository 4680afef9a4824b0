// Drives the page in a headless Chromium with puppeteer-core (the browser test's helper).
// usage: node drive.js URL SCREENSHOT.png < {"texts": [...], "beams": [1, 4]}
// prints {"1": [{text, ms}, ...], "4": [...]}: the page's own translations for each beam.
'use strict';
const fs = require('fs');
const puppeteer = require('puppeteer-core');

async function main() {
  const [url, screenshot] = process.argv.slice(2);
  const { texts, beams } = JSON.parse(fs.readFileSync(0, 'utf8'));
  const browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'], // root in a container
  });
  try {
    const page = await browser.newPage();
    const problems = [];
    page.on('pageerror', (error) => problems.push(error.message));
    page.on('console', (message) => { if (message.type() === 'error') problems.push(message.text()); });
    await page.setViewport({ width: 1000, height: 900 });
    await page.goto(url, { waitUntil: 'load' });
    await page.evaluate(() => window.s2s.ready.then(() => null));
    const results = {};
    for (const beam of beams) results[beam] = await page.evaluate((t, b) => window.s2s.translate(t, b), texts, beam);
    // The page as a user sees it: the default sentences at the default beam, first row's attention.
    await page.click('#translate');
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
