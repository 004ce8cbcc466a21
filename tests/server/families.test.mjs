// Each family's declared request through ditstudio-server (one group per family fixture): the
// unmodified official `openai` npm client's extra body fields and the AUTOMATIC1111 route set
// Z-Image's own options (cfg_truncation, cfg_normalization) and Qwen-Image's true CFG with a
// negative prompt, and each image equals ditstudio-cli's for the same request; the group's
// declared request refuses before queueing (400, `param` naming the field) what the CLI refuses;
// FLUX.2 [klein] floors a size and echoes the size made, FLUX.1 refuses it naming `size`.
// Usage: DITSTUDIO_BIN=build/bin OPENAI_CLIENT_DIR=... DITSTUDIO_TEST_DATA=tests/data node families.test.mjs
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { assertSamePixels, decodePng, runCli, startServer, tempDir, waitReady } from './lib.mjs';

const require = createRequire(join(process.env.OPENAI_CLIENT_DIR, 'package.json'));
const { OpenAI } = require('openai');

const DATA = process.env.DITSTUDIO_TEST_DATA;
const Z = join(DATA, 'tiny-zimage-A'), Q = join(DATA, 'tiny-qwenimage-A');
const K = join(DATA, 'tiny-flux2-A'), F = join(DATA, 'tiny-flux-A');
const P = 'a red fox in the snow';
const dir = tempDir('families');
const server = await startServer(['--images-dir', join(dir, 'images'),
  '--pool', `model=${Z},np=1`, '--pool', `model=${Q},np=1`, '--pool', `model=${K},np=1`,
  '--pool', `model=${F},np=1`]);
let failed = false;
const post = async (path, body) => {
  const r = await fetch(`${server.url}${path}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  });
  return { status: r.status, body: await r.json() };
};
try {
  await waitReady(server.url, 4);
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'not-needed-on-loopback', maxRetries: 0 });
  const cli = (args) => runCli(args, dir);

  // Z-Image: guidance 3 (CFG) with cfg_truncation 0.25 and cfg_normalization 1.
  const zArgs = ['--model', Z, '--prompt', P, '--width', '32', '--height', '32', '--steps', '4',
    '--guidance', '3', '--seed', '7'];
  const zRef = cli([...zArgs, '--cfg-truncation', '0.25', '--cfg-normalization', '1']);
  const zPlain = cli(zArgs);
  assert.notDeepEqual(decodePng(zRef).pixels, decodePng(zPlain).pixels,
    'the two Z-Image options change the image (else this test proves nothing)');
  const zg = await client.images.generate({ model: 'tiny-zimage-A', prompt: P, size: '32x32', seed: 7,
    steps: 4, guidance: 3, options: { cfg_truncation: 0.25, cfg_normalization: 1 } });
  assertSamePixels(Buffer.from(zg.data[0].b64_json, 'base64'), zRef, 'Z-Image options via openai vs CLI');
  assert.deepEqual(zg.options, { cfg_truncation: 0.25, cfg_normalization: 1 });
  console.log('ok Z-Image cfg_truncation / cfg_normalization through the openai client = ditstudio-cli');
  const za = await post('/sdapi/v1/txt2img', { model: 'tiny-zimage-A', prompt: P, width: 32, height: 32,
    steps: 4, seed: 7, cfg_scale: 3, options: { cfg_truncation: 0.25, cfg_normalization: 1 } });
  assert.equal(za.status, 200, JSON.stringify(za.body));
  assertSamePixels(Buffer.from(za.body.images[0], 'base64'), zRef, 'Z-Image options via A1111 vs CLI');
  console.log('ok Z-Image options through /sdapi/v1/txt2img (cfg_scale = its guidance) = ditstudio-cli');

  // Qwen-Image: true CFG 4 with a negative prompt.
  const qRef = cli(['--model', Q, '--prompt', P, '--negative-prompt', 'blurry', '--true-cfg-scale', '4',
    '--width', '32', '--height', '32', '--steps', '3', '--seed', '5']);
  const qg = await client.images.generate({ model: 'tiny-qwenimage-A', prompt: P, size: '32x32', seed: 5,
    steps: 3, negative_prompt: 'blurry', true_cfg_scale: 4 });
  assertSamePixels(Buffer.from(qg.data[0].b64_json, 'base64'), qRef, 'Qwen-Image true CFG via openai vs CLI');
  const qa = await post('/sdapi/v1/txt2img', { model: 'tiny-qwenimage-A', prompt: P, negative_prompt: 'blurry',
    cfg_scale: 4, width: 32, height: 32, steps: 3, seed: 5 });
  assert.equal(qa.status, 200, JSON.stringify(qa.body));
  assertSamePixels(Buffer.from(qa.body.images[0], 'base64'), qRef, 'Qwen-Image true CFG via A1111 vs CLI');
  console.log('ok Qwen-Image true CFG with a negative prompt through openai and A1111 = ditstudio-cli');

  // Refusals before queueing, naming the field as the CLI's --check does.
  const refused = async (body, param, what) => {
    const r = await post('/v1/images/generations', body);
    assert.equal(r.status, 400, `${what}: ${JSON.stringify(r.body)}`);
    assert.equal(r.body.error.param, param, `${what}: ${JSON.stringify(r.body)}`);
    assert.equal(r.body.error.type, 'invalid_request_error');
    return r.body.error.message;
  };
  let m = await refused({ model: 'tiny-zimage-A', prompt: P, size: '32x32', options: { cfg_truncation: 101 } },
    'options.cfg_truncation', 'Z-Image cfg_truncation above its range');
  assert.match(m, /cfg_truncation must be a finite number in 0 \.\. 100 for Z-Image, got 101/);
  m = await refused({ model: 'tiny-qwenimage-A', prompt: P, size: '32x32', options: { cfg_truncation: 0.5 } },
    'options.cfg_truncation', 'a Z-Image option on Qwen-Image');
  assert.match(m, /'cfg_truncation' is not an option of Qwen-Image \(QwenImagePipeline\)/);
  m = await refused({ model: 'tiny-flux-A', prompt: P, size: '63x64' }, 'size', 'FLUX.1 size off the multiple');
  assert.match(m, /multiples of 4/);
  console.log('ok refusals: 400 naming options.cfg_truncation (range, unknown) and size (FLUX.1 63x64)');

  // FLUX.2 [klein] floors 63x64 to 56x64 (multiples of 8) and says so.
  const kg = await client.images.generate({ model: 'tiny-flux2-A', prompt: P, size: '63x64', seed: 3, steps: 2 });
  assert.equal(kg.size, '56x64');
  const px = decodePng(Buffer.from(kg.data[0].b64_json, 'base64'));
  assert.deepEqual([px.width, px.height], [56, 64]);
  console.log('ok FLUX.2 [klein] size 63x64 is made and echoed as 56x64');
} catch (e) {
  failed = true;
  console.error(e);
  console.error(server.log());
} finally {
  await server.stop();
}
process.exit(failed ? 1 : 0);
