// Issue 46 over HTTP: reference-image editing through ditstudio-server with the unmodified
// official `openai` npm client (images.edit with two images = FLUX.2 [klein] references in
// order) and the AUTOMATIC1111 img2img route (init_images = the references; FLUX.1 Kontext's one
// reference with its max_area / auto_resize options), each image equal to ditstudio-cli --image
// for the same request and to the diffusers golden (tests/data/tiny-flux2-A/golden/EDIT.md run 1,
// within one 8-bit level); the refusals before queueing name the field (400, OpenAI's shape).
// Usage: DITSTUDIO_BIN=build/bin OPENAI_CLIENT_DIR=... DITSTUDIO_TEST_DATA=tests/data node edit.test.mjs
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { assertSamePixels, decodePng, runCli, startServer, tempDir, waitReady } from './lib.mjs';

const require = createRequire(join(process.env.OPENAI_CLIENT_DIR, 'package.json'));
const { OpenAI, toFile } = require('openai');

const DATA = process.env.DITSTUDIO_TEST_DATA;
const K = join(DATA, 'tiny-flux2-A'), KX = join(DATA, 'tiny-flux-kontext-A'), F = join(DATA, 'tiny-flux-A');
const KG = join(K, 'golden'), FG = join(F, 'golden');
const info = JSON.parse(readFileSync(join(KG, 'edit_info.json'), 'utf8'));
const run1 = info.runs[1];  // two references, no CFG: edit_ref_0.png then edit_ref_1.png
const dir = tempDir('edit');
const server = await startServer(['--images-dir', join(dir, 'images'),
  '--pool', `model=${K},np=1`, '--pool', `model=${KX},np=1`, '--pool', `model=${F},np=1`]);
let failed = false;
const post = async (path, body) => {
  const r = await fetch(`${server.url}${path}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  });
  return { status: r.status, body: await r.json() };
};
const b64 = (file) => readFileSync(file).toString('base64');
try {
  await waitReady(server.url, 3);
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'not-needed-on-loopback', maxRetries: 0 });
  const cli = (args) => runCli(args, dir);
  const refs = run1.ref_files.map((f) => join(KG, f));

  // The CLI's image of golden run 1 (and the same with the references swapped: order matters).
  const common = ['--model', K, '--prompt', run1.prompt, '--seed', String(run1.seed), '--steps',
    String(run1.num_inference_steps), '--guidance', String(run1.guidance_scale), '--width',
    String(run1.width_arg), '--height', String(run1.height_arg)];
  const cliImage = cli([...common, '--image', refs[0], '--image', refs[1]]);
  const swapped = cli([...common, '--image', refs[1], '--image', refs[0]]);
  assert.notDeepEqual(decodePng(cliImage).pixels, decodePng(swapped).pixels,
    'swapping the references changes the image (their order is their identity)');

  // openai images.edit with two images: the references in order.
  const e = await client.images.edit({
    model: 'tiny-flux2-A', prompt: run1.prompt, size: `${run1.width_arg}x${run1.height_arg}`,
    image: [await toFile(readFileSync(refs[0]), 'a.png', { type: 'image/png' }),
      await toFile(readFileSync(refs[1]), 'b.png', { type: 'image/png' })],
    seed: run1.seed, steps: run1.num_inference_steps, guidance: run1.guidance_scale,
  });
  const served = Buffer.from(e.data[0].b64_json, 'base64');
  assertSamePixels(served, cliImage, 'openai images.edit with two references vs ditstudio-cli --image x2');
  assert.equal(e.reference_images, 2);
  console.log('ok openai images.edit with two images = ditstudio-cli --image a --image b (FLUX.2 [klein])');

  // A1111 img2img: init_images are the references.
  const a = await post('/sdapi/v1/img2img', { model: 'tiny-flux2-A', prompt: run1.prompt,
    init_images: [b64(refs[0]), b64(refs[1])], width: run1.width_arg, height: run1.height_arg,
    steps: run1.num_inference_steps, seed: run1.seed, cfg_scale: run1.guidance_scale });
  assert.equal(a.status, 200, JSON.stringify(a.body));
  assertSamePixels(Buffer.from(a.body.images[0], 'base64'), cliImage, 'A1111 img2img references vs CLI');
  console.log('ok /sdapi/v1/img2img init_images as references = ditstudio-cli');

  // JSON edits: base64 images (one as a data: URL), the same references in order.
  const ej = await post('/v1/images/edits', { model: 'tiny-flux2-A', prompt: run1.prompt,
    size: `${run1.width_arg}x${run1.height_arg}`, image: [b64(refs[0]), `data:image/png;base64,${b64(refs[1])}`],
    seed: run1.seed, steps: run1.num_inference_steps, guidance: run1.guidance_scale });
  assert.equal(ej.status, 200, JSON.stringify(ej.body));
  assertSamePixels(Buffer.from(ej.body.data[0].b64_json, 'base64'), cliImage, 'JSON edits vs CLI');
  console.log('ok /v1/images/edits with JSON base64 images = ditstudio-cli');

  // The page's path: POST /v1/jobs with reference_images (data: URLs from its file picker).
  const pj = await post('/v1/jobs', { model: 'tiny-flux2-A', prompt: run1.prompt,
    size: `${run1.width_arg}x${run1.height_arg}`, seed: run1.seed, steps: run1.num_inference_steps,
    guidance: run1.guidance_scale,
    reference_images: refs.map((f) => `data:image/png;base64,${b64(f)}`) });
  assert.equal(pj.status, 202, JSON.stringify(pj.body));
  let job;
  for (let i = 0; i < 600; i++) {
    job = await (await fetch(`${server.url}/v1/jobs/${pj.body.id}`)).json();
    if (['done', 'failed', 'cancelled'].includes(job.state)) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  assert.equal(job.state, 'done', JSON.stringify(job));
  const pageImage = Buffer.from(await (await fetch(
    `${server.url}/v1/images/files/${encodeURIComponent(job.images[0].file)}`)).arrayBuffer());
  assertSamePixels(pageImage, cliImage, 'the page\'s /v1/jobs with reference_images vs CLI');
  console.log('ok the page\'s /v1/jobs with reference_images = ditstudio-cli');

  // FLUX.1 Kontext golden run 2 (the reference resized with LANCZOS; max_area = 26 x 30) via A1111.
  const kinfo = JSON.parse(readFileSync(join(FG, 'kontext_info.json'), 'utf8')).runs[2];
  const kref = join(FG, kinfo.ref_file);
  const kArgs = ['--model', KX, '--prompt', kinfo.prompt, '--seed', String(kinfo.seed), '--steps',
    String(kinfo.num_inference_steps), '--guidance', String(kinfo.guidance_scale), '--width',
    String(kinfo.width_arg), '--height', String(kinfo.height_arg), '--max-sequence-length', '48',
    '--max-area', String(kinfo.max_area_arg), '--auto-resize', 'off', '--image', kref];
  const kCli = cli(kArgs);
  assert.deepEqual([decodePng(kCli).width, decodePng(kCli).height], [28, 24], 'Kontext floors 30x26 to 28x24');
  const ka = await post('/sdapi/v1/img2img', { model: 'tiny-flux-kontext-A', prompt: kinfo.prompt,
    init_images: [b64(kref)], width: kinfo.width_arg, height: kinfo.height_arg, steps: kinfo.num_inference_steps,
    seed: kinfo.seed, guidance: kinfo.guidance_scale, max_sequence_length: 48,
    options: { max_area: kinfo.max_area_arg, auto_resize: 0 } });
  assert.equal(ka.status, 200, JSON.stringify(ka.body));
  assertSamePixels(Buffer.from(ka.body.images[0], 'base64'), kCli, 'Kontext via A1111 vs CLI');
  console.log('ok FLUX.1 Kontext through /sdapi/v1/img2img (max_area, auto_resize off) = ditstudio-cli');

  // Refusals before queueing, naming the field where the client put it.
  const seven = [];
  for (let i = 0; i < 7; i++) seven.push(await toFile(readFileSync(refs[i % 2]), `r${i}.png`, { type: 'image/png' }));
  await assert.rejects(client.images.edit({ model: 'tiny-flux2-A', prompt: 'x', image: seven }), (err) => {
    assert.ok(err instanceof OpenAI.BadRequestError, String(err));
    assert.equal(err.param, 'image');
    assert.match(err.message, /7 reference images given; Flux2KleinPipeline takes at most 6/);
    return true;
  });
  const two = await post('/sdapi/v1/img2img', { model: 'tiny-flux-kontext-A', prompt: 'x',
    init_images: [b64(refs[0]), b64(refs[1])] });
  assert.equal(two.status, 400, JSON.stringify(two.body));
  assert.equal(two.body.error.param, 'init_images');
  assert.match(two.body.error.message, /takes at most 1/);
  const notImage = await post('/sdapi/v1/img2img', { model: 'tiny-flux2-A', prompt: 'x',
    init_images: [b64(refs[0]), Buffer.from('not an image at all').toString('base64')] });
  assert.equal(notImage.status, 400, JSON.stringify(notImage.body));
  assert.equal(notImage.body.error.param, 'init_images');
  const role = await post('/sdapi/v1/img2img', { model: 'tiny-flux-A', prompt: 'x',
    init_images: [b64(refs[0])], image_role: 'reference' });
  assert.equal(role.status, 400, JSON.stringify(role.body));
  assert.match(role.body.error.message, /reference images are not supported for FLUX\.1 \(FluxPipeline\)/);
  const small = await post('/sdapi/v1/img2img', { model: 'tiny-flux2-A', prompt: 'x',
    init_images: [b64(join(FG, 'kontext_ref_2.png'))] });  // 30x26: under klein's 64 px
  assert.equal(small.status, 400, JSON.stringify(small.body));
  assert.match(small.body.error.message, /both sides must be at least 64/);
  console.log('ok refusals: 7 references, 2 for Kontext, a non-image, references for FLUX.1, a 30x26 reference');
} catch (e) {
  failed = true;
  console.error(e);
} finally {
  await server.stop();
}
process.exit(failed ? 1 : 0);
