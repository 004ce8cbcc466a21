// Load benchmark of ditstudio-server (a benchmark that prints figures, not a unit test): on one
// group (default 2 ranks, tensor parallel) it holds 60 open /v1/events streams and 60 slow clients
// (a request head sent one header line every 2 s, never finished) while 50 generations are sent at
// once, and measures /v1/health meanwhile; then a soak of small generations one after another.
// It prints: every client's answer (status counts; a reset or a connection left unanswered is
// counted as such), health latency p50 / p99 / max, the server's RSS before, after the burst and
// across the soak (first and last tenth), and whether it stayed within 10%.
//
//   node packaging/server-load.mjs [BIN_DIR]          (default build/bin)
//   env: LOAD_BURST=50 LOAD_STREAMS=60 LOAD_SLOW=60 LOAD_SOAK=500 LOAD_STEPS=2 LOAD_SIZE=64
//        LOAD_SERVER_ARGS="--tp-degree 2"  (the group; --max-queue defaults to 64 here)
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const bin = resolve(process.argv[2] || 'build/bin');
const env = (k, d) => Number(process.env[k] || d);
const BURST = env('LOAD_BURST', 50), STREAMS = env('LOAD_STREAMS', 60), SLOW = env('LOAD_SLOW', 60);
const SOAK = env('LOAD_SOAK', 500), STEPS = env('LOAD_STEPS', 2), SIZE = env('LOAD_SIZE', 64);
const extra = (process.env.LOAD_SERVER_ARGS || '--tp-degree 2').split(/\s+/).filter(Boolean);
const dir = mkdtempSync(join(tmpdir(), 'ditstudio-load-'));

const server = spawn(join(bin, 'ditstudio-server'), ['--port', '0', '--images-dir', join(dir, 'images'),
  '--max-queue', '64', ...extra], { env: { ...process.env, OMP_NUM_THREADS: '1' }, stdio: ['ignore', 'pipe', 'pipe'] });
let log = '';
server.stderr.on('data', (d) => { log += d; });
const port = await new Promise((res, rej) => {
  let out = '';
  server.stdout.on('data', (d) => {
    out += d;
    const m = /listening on http:\/\/[^ ]+:(\d+)/.exec(out);
    if (m) res(Number(m[1]));
  });
  server.on('exit', (c) => rej(new Error(`server exited ${c}:\n${log}`)));
});
const url = `http://127.0.0.1:${port}`;
const rssMiB = () => {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${server.pid}/status`, 'utf8'));
  return Number(m[1]) / 1024;
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const pct = (a, p) => { const s = [...a].sort((x, y) => x - y); return s[Math.min(s.length - 1, Math.floor(p * s.length))]; };

for (let t = Date.now(); ; await sleep(200)) {
  try { if ((await (await fetch(`${url}/v1/health`)).json()).ready >= 1) break; } catch {}
  if (Date.now() - t > 180000) throw new Error(`no group ready:\n${log}`);
}
const body = (seed) => JSON.stringify({ prompt: 'a small red circle', size: `${SIZE}x${SIZE}`, steps: STEPS, seed });
const generate = async (seed) => {
  try {
    const r = await fetch(`${url}/v1/images/generations`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: body(seed) });
    await r.arrayBuffer();
    return String(r.status);
  } catch (e) {
    return `error:${e.cause?.code || e.name}`;
  }
};
await generate(1);  // warm
const rss0 = rssMiB();

// Held connections: event streams and slow heads.
const held = [];
let streamBytes = 0, slowClosed = 0;
for (let i = 0; i < STREAMS; i++) {
  const s = net.connect(port, '127.0.0.1', () => s.write(`GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`));
  s.on('data', (d) => { streamBytes += d.length; });
  s.on('error', () => {});
  held.push(s);
}
for (let i = 0; i < SLOW; i++) {
  const s = net.connect(port, '127.0.0.1', () => s.write(`POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n`));
  const iv = setInterval(() => s.write(`X-Slow: ${i}\r\n`), 2000);
  s.on('close', () => { clearInterval(iv); slowClosed++; });
  s.on('error', () => {});
  held.push(s);
}
await sleep(500);

// Health probes during the burst.
let probing = true;
const health = [];
const probe = (async () => {
  while (probing) {
    const t0 = performance.now();
    try {
      const r = await fetch(`${url}/v1/health`, { signal: AbortSignal.timeout(10000) });
      await r.json();
      health.push(performance.now() - t0);
    } catch { health.push(Infinity); }
    await sleep(50);
  }
})();
const t0 = performance.now();
const statuses = await Promise.all(Array.from({ length: BURST }, (_, i) => generate(100 + i)));
const burstS = (performance.now() - t0) / 1000;
probing = false;
await probe;
const counts = {};
for (const s of statuses) counts[s] = (counts[s] || 0) + 1;
const rss1 = rssMiB();
for (const s of held) s.destroy();

console.log(`burst: ${BURST} simultaneous generations (${SIZE}x${SIZE}, ${STEPS} steps) with ${STREAMS} event streams and ${SLOW} slow clients held: ${JSON.stringify(counts)} in ${burstS.toFixed(1)} s`);
console.log(`  every client answered: ${statuses.every((s) => /^\d+$/.test(s)) ? 'yes' : 'NO'}; event streams received ${(streamBytes / 1024).toFixed(0)} KiB; slow clients closed by the server during the burst: ${slowClosed}`);
console.log(`  /v1/health during the burst: ${health.length} probes, p50 ${pct(health, 0.5).toFixed(1)} ms, p99 ${pct(health, 0.99).toFixed(1)} ms, max ${Math.max(...health).toFixed(1)} ms`);
console.log(`  server RSS: ${rss0.toFixed(1)} MiB before, ${rss1.toFixed(1)} MiB after`);

// Soak.
const rss = [];
const soakCounts = {};
const s0 = performance.now();
for (let i = 0; i < SOAK; i++) {
  const s = await generate(10000 + i);
  soakCounts[s] = (soakCounts[s] || 0) + 1;
  rss.push(rssMiB());
}
const tenth = Math.max(1, Math.floor(SOAK / 10));
const first = rss.slice(0, tenth).reduce((a, b) => a + b, 0) / tenth;
const last = rss.slice(-tenth).reduce((a, b) => a + b, 0) / tenth;
const growth = (last - first) / first;
console.log(`soak: ${SOAK} generations one after another: ${JSON.stringify(soakCounts)} in ${((performance.now() - s0) / 1000).toFixed(1)} s`);
console.log(`  server RSS: first tenth ${first.toFixed(1)} MiB, last tenth ${last.toFixed(1)} MiB (${(growth * 100).toFixed(1)}%): ${Math.abs(growth) <= 0.1 ? 'flat within 10%' : 'NOT within 10%'}`);

server.kill('SIGTERM');
await new Promise((r) => server.on('exit', r));
rmSync(dir, { recursive: true, force: true });
