// The pool (issue 32): ONE 1-rank group, then a pool of TWO 1-rank groups, each sent the same 8
// requests at once with the official `openai` client. The pool's images equal the single group's
// (same seed, same strategy kind), both groups serve, and the throughput of each run is printed
// with their ratio (expect close to 2x on 2 free cores with one thread per rank).
// Env: DITSTUDIO_BIN, OPENAI_CLIENT_DIR; BENCH_REQUESTS (8), BENCH_STEPS (28), BENCH_SIZE (128).
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { assertSamePixels, startServer, tempDir, waitReady } from './lib.mjs';

const require = createRequire(join(process.env.OPENAI_CLIENT_DIR, 'package.json'));
const { OpenAI } = require('openai');
const N = Number(process.env.BENCH_REQUESTS || 8);
const STEPS = Number(process.env.BENCH_STEPS || 28);
const SIZE = Number(process.env.BENCH_SIZE || 128);
const PROMPTS = ['a large yellow star on a purple background, centre',
  'a small red circle on a green background, left', 'two blue squares on a white background, top'];
const dir = tempDir('pool');

async function run(label, args, groups) {
  const server = await startServer(['--images-dir', join(dir, label), '--max-queue', String(N), ...args]);
  try {
    await waitReady(server.url, groups);
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: 600000 });
    const t0 = performance.now();
    const results = await Promise.all(Array.from({ length: N }, (_, k) => client.images.generate({
      prompt: PROMPTS[k % PROMPTS.length], size: `${SIZE}x${SIZE}`, seed: 100 + k, steps: STEPS,
    })));
    const seconds = (performance.now() - t0) / 1000;
    const byGroup = {};
    for (const r of results) {
      const job = await (await fetch(`${server.url}/v1/jobs/${r.job}`)).json();
      byGroup[job.group] = (byGroup[job.group] || 0) + 1;
    }
    console.log(`${label}: ${N} requests of ${STEPS} steps at ${SIZE}x${SIZE} in ${seconds.toFixed(2)} s ` +
      `= ${(N / seconds).toFixed(3)} images/s; jobs per group ${JSON.stringify(byGroup)}`);
    return { seconds, byGroup, images: results.map((r) => Buffer.from(r.data[0].b64_json, 'base64')) };
  } catch (e) {
    console.error('--- server log ---\n' + server.log().slice(-4000));
    throw e;
  } finally {
    await server.stop();
  }
}

const one = await run('one group', ['--groups', '1'], 1);
const pool = await run('pool of two groups', ['--pool', 'name=a,np=1', '--pool', 'name=b,np=1'], 2);
for (let k = 0; k < N; k++) assertSamePixels(pool.images[k], one.images[k], `request ${k} (seed ${100 + k})`);
console.log(`ok the pool's ${N} images equal the single group's, pixel for pixel`);
assert.deepEqual(Object.keys(one.byGroup), ['g0']);
assert.deepEqual(Object.keys(pool.byGroup).sort(), ['a', 'b'], 'both groups of the pool served');
console.log(`pool throughput / one group: ${(one.seconds / pool.seconds).toFixed(2)}x ` +
  `(${(N / pool.seconds).toFixed(3)} vs ${(N / one.seconds).toFixed(3)} images/s)`);
