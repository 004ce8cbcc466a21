// The page at / in Debian's headless Chromium, driven over the DevTools protocol on a pipe
// (--remote-debugging-pipe; no extra npm package): it loads, submits a prompt (a ?submit=1
// link), shows at least one live preview, then the final image in the gallery, the per-rank
// table (rank 0 with its pid and stage) and the job done in the queue; a screenshot is written
// to $SCREENSHOT (default: ./server-page.png).
// Env: DITSTUDIO_BIN, CHROMIUM (default: chromium).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { startServer, tempDir, waitReady } from './lib.mjs';

const dir = tempDir('page');
const server = await startServer(['--images-dir', join(dir, 'images')]);
const chrome = spawn(process.env.CHROMIUM || 'chromium', ['--headless=new', '--no-sandbox', '--disable-gpu',
  '--hide-scrollbars', '--no-first-run', '--remote-debugging-pipe', `--user-data-dir=${join(dir, 'profile')}`,
  '--window-size=1100,900', 'about:blank'], { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] });
let chromeErr = '';
chrome.stderr.on('data', (d) => { chromeErr += d; });

// A minimal DevTools-protocol client: NUL-separated JSON messages on fds 3 (to Chromium) and 4.
let nextId = 1;
const pending = new Map();
let buf = '';
chrome.stdio[4].on('data', (d) => {
  buf += d;
  let at;
  while ((at = buf.indexOf('\0')) >= 0) {
    const msg = JSON.parse(buf.slice(0, at));
    buf = buf.slice(at + 1);
    if (msg.id && pending.has(msg.id)) {
      const { resolve, reject } = pending.get(msg.id);
      pending.delete(msg.id);
      if (msg.error) reject(new Error(JSON.stringify(msg.error))); else resolve(msg.result);
    }
  }
});
function send(method, params = {}, sessionId) {
  const id = nextId++;
  chrome.stdio[3].write(JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) }) + '\0');
  return new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
}

let failed = false;
try {
  await waitReady(server.url);
  const { targetId } = await send('Target.createTarget', { url: 'about:blank' });
  const { sessionId } = await send('Target.attachToTarget', { targetId, flatten: true });
  await send('Page.enable', {}, sessionId);
  await send('Page.navigate', { url: `${server.url}/?steps=60&size=64x64&seed=7&submit=1` }, sessionId);
  const probe = `(() => {
    const q = (s) => Array.from(document.querySelectorAll(s));
    return {
      previews: Number(document.getElementById('preview').dataset.previews || 0),
      gallery: q('#gallery img').filter((i) => i.src.startsWith('blob:') && i.naturalWidth === 64).length,
      ranks: q('#ranks tbody tr').map((r) => Array.from(r.cells).map((c) => c.textContent)),
      queue: q('#queue tbody tr').map((r) => Array.from(r.cells).map((c) => c.textContent)),
      status: document.getElementById('pstatus').textContent,
      conn: document.getElementById('conn').textContent,
      error: document.getElementById('error').textContent,
    };
  })()`;
  let state;
  const end = Date.now() + 90000;
  for (;;) {
    state = (await send('Runtime.evaluate', { expression: probe, returnByValue: true }, sessionId)).result.value;
    if (state && state.gallery >= 1 && state.queue.some((r) => r[1] === 'done')) break;
    assert.ok(Date.now() < end, `page did not finish: ${JSON.stringify(state)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  assert.equal(state.error, '');
  assert.equal(state.conn, 'connected');
  assert.ok(state.previews >= 1, `no live preview shown: ${JSON.stringify(state)}`);
  const rank0 = state.ranks.find((r) => r[0] === 'g0' && r[2] === '0');
  assert.ok(rank0, JSON.stringify(state.ranks));
  assert.match(rank0[3], /^\d+$/, 'rank 0 pid');
  assert.match(rank0[7], /MiB$/, 'rank 0 RSS');
  console.log(`ok page: ${state.previews} live previews, ${state.gallery} image(s) in the gallery, rank table ${JSON.stringify(rank0)}, queue ${JSON.stringify(state.queue[0])}`);
  const shot = await send('Page.captureScreenshot', { format: 'png' }, sessionId);
  const file = process.env.SCREENSHOT || join(process.cwd(), 'server-page.png');
  writeFileSync(file, Buffer.from(shot.data, 'base64'));
  console.log(`screenshot: ${file}`);
} catch (e) {
  failed = true;
  console.error(e);
  console.error('--- chromium ---\n' + chromeErr.slice(-2000) + '\n--- server log ---\n' + server.log().slice(-3000));
} finally {
  chrome.kill('SIGTERM');
  await server.stop();
}
process.exit(failed ? 1 : 0);
