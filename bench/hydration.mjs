// What a browser downloads before a page works, and how long that takes on a slow link:
// bytes over the wire (HTML, script, WebAssembly, styles) and the time from navigation to
// hydration (`body[data-hydrated]`), cold (empty cache) and warm (second visit), for the
// catalog and the calendar (the portal's largest page), signed in.
//
//   BERTH_BIN=…/release/berth BERTH_SITE_ROOT=target/release-site node bench/hydration.mjs
//
// The link is Chromium's network emulation: 50 Mbit/s down, 10 Mbit/s up, 20 ms latency
// (BENCH_MBITS changes the speed). BENCH_SMOKE=1: unthrottled, one run, so a broken
// benchmark fails `make test`; its figures mean nothing.
import { Berth, browser, signInAsAdmin } from '../e2e/harness.mjs';

const smoke = process.env.BENCH_SMOKE === '1';
const mbits = Number(process.env.BENCH_MBITS ?? 50);
const runs = smoke ? 1 : 5;

const berth = await Berth.start();
const chrome = await browser();
try {
  const context = await chrome.newContext({ viewport: { width: 1400, height: 1000 } });
  const page = await context.newPage();
  await signInAsAdmin(page, berth, '/calendar');
  const cdp = await context.newCDPSession(page);
  await cdp.send('Network.enable');
  if (!smoke) {
    await cdp.send('Network.emulateNetworkConditions', {
      offline: false,
      latency: 20,
      downloadThroughput: (mbits * 1e6) / 8,
      uploadThroughput: 10e6 / 8,
    });
  }

  // Bytes over the wire per kind of response, as Chromium counts them (headers included).
  const sizes = new Map();
  const kinds = new Map();
  cdp.on('Network.responseReceived', ({ requestId, response }) => kinds.set(requestId, kind(response)));
  cdp.on('Network.loadingFinished', ({ requestId, encodedDataLength }) => {
    const k = kinds.get(requestId) ?? 'other';
    sizes.set(k, (sizes.get(k) ?? 0) + encodedDataLength);
  });

  const results = [];
  for (const path of ['/catalog', '/calendar']) {
    for (const cache of ['cold', 'warm']) {
      const times = [];
      let bytes;
      for (let run = 0; run < runs; run++) {
        if (cache === 'cold') await cdp.send('Network.clearBrowserCache');
        else await visit(page, berth, path); // fill the cache first
        sizes.clear();
        const ms = await visit(page, berth, path);
        times.push(ms);
        bytes = Object.fromEntries(sizes);
      }
      times.sort((a, b) => a - b);
      results.push({ path, cache, median_ms: times[Math.floor(times.length / 2)], max_ms: times.at(-1), bytes });
    }
  }
  console.log(`link: ${smoke ? 'unthrottled (smoke)' : `${mbits} Mbit/s, 20 ms`}; ${runs} runs each`);
  for (const r of results) {
    const total = Object.values(r.bytes).reduce((a, b) => a + b, 0);
    const parts = Object.entries(r.bytes)
      .map(([k, v]) => `${k} ${kb(v)}`)
      .join(', ');
    console.log(`${r.path} ${r.cache}: hydrated in ${r.median_ms} ms (max ${r.max_ms}); ${kb(total)} over the wire (${parts})`);
  }
} finally {
  await chrome.close();
  await berth.kill();
}

/** Navigates to `path` and answers the ms until the page hydrated. */
async function visit(page, berth, path) {
  const started = Date.now();
  await page.goto(`${berth.url}${path}`, { waitUntil: 'commit' });
  await page.locator('body[data-hydrated]').waitFor({ timeout: 120_000 });
  return Date.now() - started;
}

function kind(response) {
  const type = response.mimeType ?? '';
  if (type.includes('wasm')) return 'wasm';
  if (type.includes('javascript')) return 'js';
  if (type.includes('css')) return 'css';
  if (type.includes('html')) return 'html';
  return 'other';
}

function kb(bytes) {
  return bytes >= 1e6 ? `${(bytes / 1e6).toFixed(2)} MB` : `${(bytes / 1e3).toFixed(1)} kB`;
}
