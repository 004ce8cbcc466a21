// Faults and security defaults of ditstudio-server (issue 32), on a pool of two 1-rank groups:
//  - a rank killed mid-job fails that job naming the rank and its group; the other group serves;
//  - a client that disconnects mid-stream leaves nothing running (job cancelled, group idle);
//  - oversized and malformed requests get 4xx in OpenAI's error shape; a full queue gets 429;
//  - the server listens on 127.0.0.1 only (its sockets in /proc); another --host needs a bearer
//    token (generated and printed); no CORS headers unless configured.
// Env: DITSTUDIO_BIN, OPENAI_CLIENT_DIR.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { join } from 'node:path';
import { encodePng, startServer, tempDir, waitJson, waitReady } from './lib.mjs';

const require = createRequire(join(process.env.OPENAI_CLIENT_DIR, 'package.json'));
const { OpenAI } = require('openai');
const P = 'a large yellow star on a purple background, centre';
const dir = tempDir('faults');

// Local addresses of the TCP sockets in LISTEN state that process `pid` holds.
function listeningAddresses(pid) {
  const inodes = new Set();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m) inodes.add(m[1]);
    } catch { /* closed meanwhile */ }
  }
  const out = [];
  for (const [file, v6] of [['/proc/net/tcp', false], ['/proc/net/tcp6', true]]) {
    let text = '';
    try { text = readFileSync(file, 'utf8'); } catch { continue; }
    for (const line of text.split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length < 10 || f[3] !== '0A' || !inodes.has(f[9])) continue;
      const [hex, port] = f[1].split(':');
      let addr;
      if (!v6) addr = [0, 1, 2, 3].map((i) => parseInt(hex.substr(6 - 2 * i, 2), 16)).join('.');
      else addr = hex === '00000000000000000000000001000000' ? '::1' : hex === '0'.repeat(32) ? '::' : hex;
      out.push(`${addr}:${parseInt(port, 16)}`);
    }
  }
  return out;
}

const server = await startServer(['--images-dir', join(dir, 'images'), '--pool', 'name=a,np=1',
  '--pool', 'name=b,np=1', '--max-queue', '2', '--max-body-mb', '1', '--max-side', '256']);
let failed = false;
try {
  await waitReady(server.url, 2);
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: 600000 });
  const post = (path, body, headers = { 'Content-Type': 'application/json' }) =>
    fetch(`${server.url}${path}`, { method: 'POST', headers, body });

  // --- listening sockets: 127.0.0.1 only -------------------------------------------------------
  const addrs = listeningAddresses(server.proc.pid);
  assert.ok(addrs.length >= 1, 'no listening socket found');
  for (const a of addrs) assert.match(a, /^127\.0\.0\.1:/, `listening on ${a}`);
  console.log(`ok listening sockets: ${addrs.join(', ')}`);

  // --- 4xx for malformed and oversized requests --------------------------------------------
  const expect4xx = async (res, status, pattern, what) => {
    assert.equal(res.status, status, what);
    const body = await res.json();
    assert.equal(typeof body.error.message, 'string', what);
    assert.equal(body.error.type, 'invalid_request_error', what);
    assert.match(body.error.message, pattern, what);
    return body;
  };
  await expect4xx(await post('/v1/images/generations', '{"prompt": "x",'), 400, /not valid JSON/, 'truncated JSON');
  await expect4xx(await post('/v1/images/generations', '[1,2]'), 400, /must be a JSON object/, 'array body');
  const b1 = await expect4xx(await post('/v1/images/generations', JSON.stringify({ prompt: 5 })), 400, /'prompt' must be a string/, 'prompt type');
  assert.equal(b1.error.param, 'prompt');
  await expect4xx(await post('/v1/images/generations', JSON.stringify({ prompt: 'x', n: 11 })), 400, /'n' must be in 1 \.\. 10/, 'n');
  await expect4xx(await post('/v1/images/generations', JSON.stringify({ prompt: 'x', size: '512x512' })), 400, /outside 1 \.\. 256/, 'size');
  await expect4xx(await post('/v1/images/generations', JSON.stringify({ prompt: 'x', loras: [{ name: '../x' }] })), 400, /accepts no LoRA/, 'lora');
  await expect4xx(await post('/v1/images/generations', JSON.stringify({ prompt: 'x'.repeat(2 << 20) })), 413, /larger than 1048576 bytes/, 'body size');
  const big = new FormData();
  big.append('prompt', 'x');
  big.append('image', new Blob([encodePng(300, 8, 3, Buffer.alloc(300 * 8 * 3))], { type: 'image/png' }), 'big.png');
  await expect4xx(await fetch(`${server.url}/v1/images/edits`, { method: 'POST', body: big }), 400, /300x8 pixels; at most 256 per side/, 'upload size');
  await expect4xx(await post('/v1/images/edits', JSON.stringify({ prompt: 'x' })), 400, /multipart\/form-data/, 'edits JSON');
  await expect4xx(await fetch(`${server.url}/v1/nothing`), 404, /unknown route GET \/v1\/nothing/, 'route');
  console.log('ok 4xx with the cause: malformed JSON, wrong types, n, size, LoRA path, 2 MiB body (413), upload size, unknown route');

  // --- CORS off by default -------------------------------------------------------------------
  const cors = await fetch(`${server.url}/v1/models`, { headers: { Origin: 'http://evil.example' } });
  assert.equal(cors.headers.get('access-control-allow-origin'), null);
  assert.equal((await fetch(`${server.url}/v1/models`, { method: 'OPTIONS', headers: { Origin: 'http://evil.example' } })).status, 403);
  console.log('ok no CORS headers, preflight refused');

  // --- a rank killed mid-job -----------------------------------------------------------------
  const long = client.images.generate({ prompt: P, size: '64x64', seed: 1, steps: 1000 });
  long.catch(() => {});
  const running = await waitJson(`${server.url}/v1/jobs`, (j) => j.data.some((x) => x.state === 'running' && x.step >= 1));
  const job = running.data.find((x) => x.state === 'running');
  const groups = await (await fetch(`${server.url}/v1/groups`)).json();
  const victim = groups.data.find((g) => g.name === job.group);
  const other = groups.data.find((g) => g.name !== job.group);
  const pid = victim.pids['0'];
  assert.ok(pid > 0, JSON.stringify(victim));
  process.kill(pid, 'SIGKILL');
  await assert.rejects(long, (e) => {
    assert.equal(e.status, 500, String(e));
    assert.equal(e.type, 'server_error');
    assert.match(e.message, new RegExp(`group ${victim.name} failed: .*rank 0`));
    console.log(`ok killed rank 0 (pid ${pid}) of group ${victim.name}: ${e.message}`);
    return true;
  });
  const after = await waitJson(`${server.url}/v1/groups`, (g) => g.data.find((x) => x.name === victim.name).state === 'failed');
  assert.equal(after.data.find((x) => x.name === victim.name).failure.rank, 0);
  assert.equal(after.data.find((x) => x.name === other.name).state, 'ready');
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  const ok = await client.images.generate({ prompt: P, size: '64x64', seed: 2, steps: 4 });
  const okJob = await (await fetch(`${server.url}/v1/jobs/${ok.job}`)).json();
  assert.equal(okJob.group, other.name);
  console.log(`ok group ${other.name} keeps serving (job ${ok.job})`);

  // --- client disconnect mid-stream ----------------------------------------------------------
  const ac = new AbortController();
  const stream = await client.images.generate({ prompt: P, size: '64x64', seed: 3, steps: 1000, stream: true, partial_images: 3 }, { signal: ac.signal });
  let partials = 0;
  try {
    for await (const ev of stream) {
      if (ev.type === 'image_generation.partial_image' && ++partials === 1) {
        ac.abort();  // the client goes away mid-stream
        break;
      }
    }
  } catch (e) {
    assert.match(String(e.name || e), /Abort/, String(e));
  }
  assert.equal(partials, 1);
  const t0 = Date.now();
  const idle = await waitJson(`${server.url}/v1/groups`, (g) => {
    const x = g.data.find((y) => y.name === other.name);
    return x.job === null && x.stage === 'idle';
  }, { timeoutMs: 20000 });
  const jobs = await (await fetch(`${server.url}/v1/jobs`)).json();
  const streamed = jobs.data.filter((x) => x.prompt === P && x.steps === 1000 && x.group === other.name);
  assert.equal(streamed.length, 1, JSON.stringify(jobs.data.map((x) => [x.id, x.state, x.group])));
  assert.equal(streamed[0].state, 'cancelled');
  assert.ok(streamed[0].step < 1000, `stopped at step ${streamed[0].step}`);
  assert.equal(idle.data.find((y) => y.name === other.name).state, 'ready');
  console.log(`ok client disconnect: job ${streamed[0].id} cancelled at step ${streamed[0].step} of 1000, group idle after ${Date.now() - t0} ms`);

  // --- bounded queue: 429 --------------------------------------------------------------------
  const ids = [];
  const r1 = await post('/v1/jobs', JSON.stringify({ prompt: P, size: '64x64', steps: 1000, seed: 4 }));
  assert.equal(r1.status, 202);
  ids.push((await r1.json()).id);
  await waitJson(`${server.url}/v1/jobs/${ids[0]}`, (j) => j.state === 'running');
  for (let i = 0; i < 2; i++) {
    const r = await post('/v1/jobs', JSON.stringify({ prompt: P, size: '64x64', steps: 1000, seed: 5 + i }));
    assert.equal(r.status, 202);
    ids.push((await r.json()).id);
  }
  const full = await client.images.generate({ prompt: P, size: '64x64', steps: 2 }).then(() => null, (e) => e);
  assert.ok(full instanceof OpenAI.RateLimitError, String(full));
  assert.equal(full.code, 'queue_full');
  console.log(`ok queue full: 429 (${full.message})`);
  for (const id of ids) assert.equal((await fetch(`${server.url}/v1/jobs/${id}`, { method: 'DELETE' })).status, 202);
  await waitJson(`${server.url}/v1/jobs`, (j) => ids.every((id) => j.data.find((x) => x.id === id).state === 'cancelled'));
  await waitJson(`${server.url}/v1/groups`, (g) => g.data.find((y) => y.name === other.name).job === null);
  console.log('ok cancelled the queued and running jobs through DELETE /v1/jobs/ID');
} catch (e) {
  failed = true;
  console.error(e);
  console.error('--- server log ---\n' + server.log().slice(-4000));
} finally {
  await server.stop();
}

// --- another address needs a token (generated and printed when absent) ------------------------
if (!failed) {
  const open = await startServer(['--host', '0.0.0.0', '--images-dir', join(dir, 'images2')]);
  try {
    const m = /bearer token \(generated[^)]*\): (\S+)/.exec(open.stdout());
    assert.ok(m, open.stdout());
    const addrs = listeningAddresses(open.proc.pid);
    assert.ok(addrs.some((a) => a.startsWith('0.0.0.0:')), addrs.join(', '));
    const denied = await fetch(`${open.url}/v1/models`);
    assert.equal(denied.status, 401);
    assert.equal((await denied.json()).error.code, 'invalid_api_key');
    const wrong = await fetch(`${open.url}/v1/models`, { headers: { Authorization: 'Bearer nope' } });
    assert.equal(wrong.status, 401);
    const client = new OpenAI({ baseURL: `${open.url}/v1`, apiKey: m[1], maxRetries: 0 });
    assert.equal((await client.models.list()).data[0].id, 'tiny-flux');
    console.log(`ok --host 0.0.0.0: token generated and printed, 401 without it, served with it (${addrs.join(', ')})`);
  } catch (e) {
    failed = true;
    console.error(e);
  } finally {
    await open.stop();
  }
}
process.exit(failed ? 1 : 0);
