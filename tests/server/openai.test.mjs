// ditstudio-server driven by the unmodified official `openai` npm client (pinned in
// tests/server/client/package.json, installed by tests/server/setup-client.sh) on the embedded
// default model: models, generations (b64_json, url, n > 1, jpeg/webp), streaming with partial
// images, edits with and without a mask, refusals in OpenAI's error shape, the AUTOMATIC1111
// txt2img face; every image compared pixel for pixel with ditstudio-cli's for the same settings.
// Usage: DITSTUDIO_BIN=build/bin OPENAI_CLIENT_DIR=build/tests/server-client node openai.test.mjs
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { assertSamePixels, decodePng, encodePng, runCli, startServer, tempDir, waitJson, waitReady } from './lib.mjs';

const require = createRequire(join(process.env.OPENAI_CLIENT_DIR, 'package.json'));
const { OpenAI, toFile } = require('openai');

const P = 'a large yellow star on a purple background, centre';
const P2 = 'a small red circle on a green background, left';
const dir = tempDir('openai');
const images = join(dir, 'images');
const server = await startServer(['--images-dir', images]);
let failed = false;
try {
  await waitReady(server.url);
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'not-needed-on-loopback', maxRetries: 0 });
  const cli = (args) => runCli(['--width', '64', '--height', '64', '--steps', '6', ...args], dir);

  // GET /v1/models
  const models = [];
  for await (const m of client.models.list()) models.push(m.id);
  assert.deepEqual(models, ['tiny-flux']);

  // b64_json, DiT Studio's fields echoed; equal to the CLI's image.
  const ref7 = cli(['--prompt', P, '--seed', '7']);
  const g = await client.images.generate({ prompt: P, size: '64x64', seed: 7, steps: 6, response_format: 'b64_json' });
  assert.equal(g.data.length, 1);
  assert.equal(g.seed, 7);
  assert.equal(g.steps, 6);
  assert.equal(g.data[0].seed, 7);
  assert.equal(g.size, '64x64');
  assertSamePixels(Buffer.from(g.data[0].b64_json, 'base64'), ref7, 'generations b64_json vs CLI');
  console.log('ok generations b64_json = ditstudio-cli (seed 7)');

  // url
  const u = await client.images.generate({ prompt: P, size: '64x64', seed: 7, steps: 6, response_format: 'url' });
  assert.match(u.data[0].url, /^http:\/\/127\.0\.0\.1:\d+\/v1\/images\/files\/[A-Za-z0-9._-]+\.png$/);
  const fetched = Buffer.from(await (await fetch(u.data[0].url)).arrayBuffer());
  assertSamePixels(fetched, ref7, 'generations url vs CLI');
  console.log('ok generations url = ditstudio-cli');

  // n > 1: image i has seed + i, equal to the CLI's image of that seed.
  const n = await client.images.generate({ prompt: P, size: '64x64', n: 3, seed: 11, steps: 6 });
  assert.equal(n.data.length, 3);
  assert.deepEqual(n.data.map((d) => d.seed), [11, 12, 13]);
  assertSamePixels(Buffer.from(n.data[2].b64_json, 'base64'), cli(['--prompt', P, '--seed', '13']), 'n=3, image 2 vs CLI seed 13');
  assert.notDeepEqual(n.data[0].b64_json, n.data[1].b64_json);
  console.log('ok n=3 (seeds 11, 12, 13; image 2 = ditstudio-cli seed 13)');

  // output formats
  const jpg = await client.images.generate({ prompt: P, size: '64x64', seed: 7, steps: 6, output_format: 'jpeg' });
  assert.deepEqual([...Buffer.from(jpg.data[0].b64_json, 'base64').subarray(0, 3)], [0xff, 0xd8, 0xff]);
  assert.equal(jpg.output_format, 'jpeg');
  const webp = await client.images.generate({ prompt: P, size: '64x64', seed: 7, steps: 6, output_format: 'webp' });
  const wb = Buffer.from(webp.data[0].b64_json, 'base64');
  assert.equal(wb.subarray(0, 4).toString('latin1') + wb.subarray(8, 12).toString('latin1'), 'RIFFWEBP');
  console.log('ok output_format jpeg and webp');

  // stream: partial images from the denoising previews, then the completed image.
  const stream = await client.images.generate({ prompt: P, size: '64x64', seed: 7, steps: 6, stream: true, partial_images: 2 });
  const kinds = [];
  let completed = null;
  for await (const ev of stream) {
    kinds.push(ev.type);
    if (ev.type === 'image_generation.partial_image') {
      const px = decodePng(Buffer.from(ev.b64_json, 'base64'));
      assert.deepEqual([px.width, px.height], [64, 64]);
    }
    if (ev.type === 'image_generation.completed') completed = ev;
  }
  const partials = kinds.filter((k) => k === 'image_generation.partial_image').length;
  assert.ok(partials >= 1 && partials <= 2, `partial images: ${kinds.join(', ')}`);
  assert.ok(completed, `no completed event: ${kinds.join(', ')}`);
  assertSamePixels(Buffer.from(completed.b64_json, 'base64'), ref7, 'streamed image vs CLI');
  console.log(`ok stream: ${partials} partial image(s), then the completed image = ditstudio-cli`);

  // edits without a mask (image-to-image) and with one (inpainting), against the CLI.
  const init = join(dir, 'init.png');
  writeFileSync(init, ref7);
  const e1 = await client.images.edit({
    image: await toFile(ref7, 'init.png', { type: 'image/png' }), prompt: P2, seed: 5, steps: 6, strength: 0.5,
  });
  assert.equal(e1.strength, 0.5);
  assertSamePixels(Buffer.from(e1.data[0].b64_json, 'base64'),
    cli(['--prompt', P2, '--seed', '5', '--init-image', init, '--strength', '0.5']), 'edit without mask vs CLI');
  console.log('ok edits without mask = ditstudio-cli --init-image');

  const grey = Buffer.alloc(64 * 64);
  for (let y = 0; y < 64; y++) for (let x = 0; x < 32; x++) grey[y * 64 + x] = 255;  // left half: repaint
  const maskFile = join(dir, 'mask.png');
  writeFileSync(maskFile, encodePng(64, 64, 1, grey));
  const refMask = cli(['--prompt', P2, '--seed', '5', '--init-image', init, '--mask', maskFile, '--strength', '0.8']);
  const e2 = await client.images.edit({
    image: await toFile(ref7, 'init.png', { type: 'image/png' }),
    mask: await toFile(encodePng(64, 64, 1, grey), 'mask.png', { type: 'image/png' }),
    prompt: P2, seed: 5, steps: 6, strength: 0.8,
  });
  assertSamePixels(Buffer.from(e2.data[0].b64_json, 'base64'), refMask, 'edit with mask vs CLI');
  // OpenAI's own mask convention (transparent = edit) gives the same inpainting.
  const rgba = Buffer.alloc(64 * 64 * 4, 0);
  for (let i = 0; i < 64 * 64; i++) rgba[i * 4 + 3] = grey[i] ? 0 : 255;
  const e3 = await client.images.edit({
    image: await toFile(ref7, 'init.png', { type: 'image/png' }),
    mask: await toFile(encodePng(64, 64, 4, rgba), 'mask.png', { type: 'image/png' }),
    prompt: P2, seed: 5, steps: 6, strength: 0.8,
  });
  assertSamePixels(Buffer.from(e3.data[0].b64_json, 'base64'), refMask, 'edit with an alpha mask vs CLI');
  console.log('ok edits with mask (grey and alpha masks) = ditstudio-cli --mask');

  // Refusals in OpenAI's error shape, as the client reports them.
  await assert.rejects(client.images.generate({ prompt: P, n: 0 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.status, 400);
    assert.equal(e.type, 'invalid_request_error');
    assert.equal(e.param, 'n');
    assert.match(e.message, /'n' must be in 1 \.\. 10, got 0/);
    return true;
  });
  await assert.rejects(client.images.generate({ prompt: P, size: '60x64', steps: 2 }), (e) => {
    assert.equal(e.status, 400);
    assert.match(e.message, /multiples of 8/);
    return true;
  });
  await assert.rejects(client.images.generate({ prompt: P, model: 'dall-e-3' }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError, String(e));
    assert.equal(e.code, 'model_not_found');
    return true;
  });
  await assert.rejects(client.images.generate({ prompt: P, guidance: 1e9 }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.param, 'guidance');
    return true;
  });
  await assert.rejects(client.images.edit({ image: await toFile(Buffer.from('not an image'), 'x.png'), prompt: P }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.param, 'image');
    assert.match(e.message, /not a PNG/);
    return true;
  });
  const raw = await fetch(`${server.url}/v1/images/files/..%2F..%2Fetc%2Fpasswd`);
  assert.equal(raw.status, 404);
  assert.equal((await raw.json()).error.type, 'invalid_request_error');
  console.log('ok refusals: 400 (n, size, guidance, image) and 404 (model, file) in OpenAI\'s error shape');

  // AUTOMATIC1111 txt2img on the same queue.
  const a = await (await fetch(`${server.url}/sdapi/v1/txt2img`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: P, negative_prompt: '', seed: 7, steps: 6, width: 64, height: 64, cfg_scale: 1 }),
  })).json();
  assert.equal(a.images.length, 1);
  assertSamePixels(Buffer.from(a.images[0], 'base64'), ref7, 'sdapi txt2img vs CLI');
  assert.equal(JSON.parse(a.info).all_seeds[0], 7);
  console.log('ok /sdapi/v1/txt2img = ditstudio-cli');

  // AUTOMATIC1111 img2img (base64 init image and mask, white = repaint) = the CLI's inpainting.
  const i2i = await (await fetch(`${server.url}/sdapi/v1/img2img`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: P2, seed: 5, steps: 6, denoising_strength: 0.8, cfg_scale: 1,
      init_images: [ref7.toString('base64')], mask: encodePng(64, 64, 1, grey).toString('base64') }),
  })).json();
  assertSamePixels(Buffer.from(i2i.images[0], 'base64'), refMask, 'sdapi img2img with mask vs CLI');
  console.log('ok /sdapi/v1/img2img with mask = ditstudio-cli --mask');

  // /sdapi/v1/progress while a txt2img runs, then /sdapi/v1/interrupt cancels it.
  const slow = fetch(`${server.url}/sdapi/v1/txt2img`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: P, seed: 9, steps: 1000, width: 64, height: 64 }),
  });
  const prog = await waitJson(`${server.url}/sdapi/v1/progress`, (p) => p.state.sampling_step >= 2);
  assert.equal(prog.state.sampling_steps, 1000);
  assert.ok(prog.progress > 0 && prog.progress < 1, JSON.stringify(prog));
  const intr = await (await fetch(`${server.url}/sdapi/v1/interrupt`, { method: 'POST' })).json();
  assert.equal(intr.interrupted.length, 1);
  const slowRes = await slow;
  assert.equal(slowRes.status, 409);
  assert.equal((await slowRes.json()).error.code, 'cancelled');
  console.log(`ok /sdapi/v1/progress (step ${prog.state.sampling_step}/1000), /sdapi/v1/interrupt cancelled it (409)`);

  // Every image the server wrote is in its images folder.
  const files = readdirSync(images);
  assert.ok(files.filter((f) => f.endsWith('.png')).length >= 12, files.join(' '));
  assert.ok(files.includes('uploads'));
  console.log(`ok ${files.length} entries in the images folder`);
} catch (e) {
  failed = true;
  console.error(e);
  console.error('--- server log ---\n' + server.log().slice(-4000));
} finally {
  const r = await server.stop();
  console.log(`server stopped (${JSON.stringify(r)})`);
}
process.exit(failed ? 1 : 0);
