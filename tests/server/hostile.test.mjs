// ditstudio-server left running in front of hostile clients: each input below is sent to the real
// binary, and each check asserts the HTTP status, OpenAI's error shape with the field named in
// `param` and our own words (never the JSON library's), that /v1/health still answers, and at the
// end that a normal generation succeeds and that a job queued before all this was not lost.
//  - limits before work: JSON nested 100,000 deep on every JSON route (an A1111 body nested so
//    was a SIGSEGV) and in the multipart `loras` field; a chunked body past --max-body-mb (413
//    while reading); a prompt past the workers' request-line limit (was a job stuck `running`)
//    and past --max-prompt-bytes; max_sequence_length over the model's token limit (400 before
//    anything is queued, both faces); the whole-request read deadline for a slow head and a slow body;
//  - errors: a wrong JSON type (loras[0].name a number, A1111 fields), a Latin-1 byte in a
//    prompt (JSON and multipart), a rank's error naming a server file (the client's name only);
//  - browsers: a foreign Origin, a DNS-rebinding Host, a CORS "simple" Content-Type;
//  - uploads: WebP decoded; PNG, JPEG, PPM, BMP cut short refused;
//  - a cancel sent while a 2-rank group encodes the prompt ends the job before any denoising step;
//  - connections: 60 open /v1/events streams + 60 slow clients while /v1/health answers and a
//    generation runs, the 10 streams past --max-event-streams 50 refused 503 (and a stream
//    accepted again once they close); a burst of 50 simultaneous generations all answered (200 or 429); past
//    --max-client-connections a request gets 503 while /v1/health is still answered.
// Env: DITSTUDIO_BIN, OPENAI_CLIENT_DIR.
import assert from 'node:assert/strict';
import net from 'node:net';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { encodePng, startServer, tempDir, waitJson, waitReady } from './lib.mjs';

const P = 'a large yellow star on a purple background, centre';
const dir = tempDir('hostile');
const loraDir = join(dir, 'loras');
mkdirSync(loraDir);
writeFileSync(join(loraDir, 'broken.safetensors'), Buffer.from('not a safetensors file at all'));

// One raw HTTP/1.1 exchange over a socket (full control of headers, framing and pacing).
// `send(sock)` writes the request; resolves {status, headers, body, closed} when the response is
// complete (Content-Length) or the server closes; `timeoutMs` bounds it.
function raw(port, send, { timeoutMs = 20000 } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    let buf = Buffer.alloc(0);
    let done = false;
    const finish = (closed) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      const text = buf.toString('latin1');
      const head = text.split('\r\n\r\n')[0];
      const m = /^HTTP\/1\.1 (\d+)/.exec(head);
      const body = buf.subarray(head.length + 4).toString('utf8');
      sock.destroy();
      resolve({ status: m ? Number(m[1]) : 0, head, body, closed, sock });
    };
    const timer = setTimeout(() => finish(false), timeoutMs);
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      const text = buf.toString('latin1');
      const end = text.indexOf('\r\n\r\n');
      if (end < 0) return;
      const cl = /content-length: (\d+)/i.exec(text.slice(0, end));
      if (cl && buf.length >= end + 4 + Number(cl[1])) finish(false);
    });
    sock.on('close', () => finish(true));
    sock.on('error', () => finish(true));
    sock.on('connect', () => send(sock));
  });
}
const request = (port, method, path, { headers = {}, body = null, timeoutMs = 20000 } = {}) =>
  raw(port, (s) => {
    const b = body === null ? null : Buffer.isBuffer(body) ? body : Buffer.from(body);
    const h = { Host: `127.0.0.1:${port}`, ...(b ? { 'Content-Length': b.length } : {}), ...headers };
    s.write(`${method} ${path} HTTP/1.1\r\n${Object.entries(h).map(([k, v]) => `${k}: ${v}\r\n`).join('')}\r\n`);
    if (b) s.write(b);
  }, { timeoutMs });
const json = { 'Content-Type': 'application/json' };

// Asserts an error answer: status, type, param and message.
function expectError(r, status, param, pattern, what) {
  assert.equal(r.status, status, `${what}: status ${r.status}\n${r.head}\n${r.body.slice(0, 500)}`);
  const e = JSON.parse(r.body).error;
  assert.ok(e, `${what}: no error object: ${r.body.slice(0, 300)}`);
  if (status < 500) assert.equal(e.type, 'invalid_request_error', what);
  assert.equal(e.param, param, `${what}: param ${e.param} (${e.message})`);
  assert.match(e.message, pattern, what);
  assert.doesNotMatch(e.message, /json\.exception|\[json|parse_error|type_error/, `${what}: library text: ${e.message}`);
  console.log(`ok ${what}: ${status} param=${e.param} "${e.message.slice(0, 140)}"`);
  return e;
}

async function health(url, what) {
  const t0 = Date.now();
  const r = await fetch(`${url}/v1/health`, { signal: AbortSignal.timeout(5000) });
  assert.equal(r.status, 200, what);
  const h = await r.json();
  assert.equal(h.status, 'ok', `${what}: ${JSON.stringify(h)}`);
  return Date.now() - t0;
}

async function generate(url, seed, extra = {}) {
  const r = await fetch(`${url}/v1/images/generations`, {
    method: 'POST', headers: json,
    body: JSON.stringify({ prompt: P, size: '64x64', steps: 2, seed, ...extra }),
  });
  const b = await r.json();
  assert.equal(r.status, 200, JSON.stringify(b).slice(0, 500));
  return b;
}

// A 64x64 base64 image from the server itself (png, jpeg or webp).
async function madeImage(url, format) {
  const b = await generate(url, 11, { output_format: format });
  return Buffer.from(b.data[0].b64_json, 'base64');
}

const server = await startServer(['--images-dir', join(dir, 'images'), '--np', '1', '--max-queue', '4',
  '--max-body-mb', '2', '--request-timeout-s', '3', '--lora-dir', loraDir, '--max-prompt-bytes', '65536',
  '--max-event-streams', '50']);
let failed = false;
try {
  const { url, port } = server;
  await waitReady(url, 1);
  // A job queued before everything below: it must still finish with its image.
  const pre = await fetch(`${url}/v1/jobs`, { method: 'POST', headers: json,
    body: JSON.stringify({ prompt: P, size: '64x64', steps: 100, seed: 99 }) });
  assert.equal(pre.status, 202);
  const preJob = (await pre.json()).id;

  // --- JSON nested 100,000 deep, every JSON route ---------------------------------------------
  const nest = '['.repeat(100000) + ']'.repeat(100000);
  for (const path of ['/sdapi/v1/txt2img', '/sdapi/v1/img2img', '/v1/images/generations', '/v1/jobs']) {
    const r = await request(port, 'POST', path, { headers: json, body: `{"prompt": "x", "alwayson_scripts": ${nest}}` });
    expectError(r, 400, 'alwayson_scripts', /nests JSON more than 16 levels deep/, `deep JSON on ${path}`);
  }
  {
    const form = new FormData();
    form.append('prompt', 'x');
    form.append('loras', nest);
    form.append('image', new Blob([encodePng(8, 8, 3, Buffer.alloc(192))], { type: 'image/png' }), 'a.png');
    const r = await fetch(`${url}/v1/images/edits`, { method: 'POST', body: form });
    const e = (await r.json()).error;
    assert.equal(r.status, 400);
    assert.equal(e.param, 'loras');
    console.log(`ok deep JSON in the multipart loras field: 400 "${e.message}"`);
  }
  await health(url, 'after deep JSON');

  // --- a chunked body past --max-body-mb: 413 while reading ------------------------------------
  {
    let sent = 0;
    const r = await raw(port, (s) => {
      s.write(`POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`);
      const chunk = Buffer.alloc(256 << 10, 0x20);
      const pump = () => {
        while (sent < (300 << 20)) {
          if (s.destroyed) return;
          sent += chunk.length;
          const ok = s.write(`${chunk.length.toString(16)}\r\n`) && s.write(chunk) && s.write('\r\n');
          if (!ok) { s.once('drain', pump); return; }
        }
        s.write('0\r\n\r\n');
      };
      pump();
    }, { timeoutMs: 60000 });
    expectError(r, 413, null, /larger than 2097152 bytes/, 'chunked body of 300 MiB');
    assert.ok(sent < (64 << 20), `the server read ${sent >> 20} MiB before answering`);
    console.log(`   (answered after ${(sent / 1048576).toFixed(1)} MiB of 300 were sent)`);
  }
  await health(url, 'after the chunked body');
  {  // a chunked body to a route that takes none is refused before a byte of it is read
    const r = await raw(port, (s) => {
      s.write(`POST /v1/nothing HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`);
      const chunk = Buffer.alloc(64 << 10, 0x20);
      const iv = setInterval(() => { if (s.destroyed) clearInterval(iv); else s.write(`${chunk.length.toString(16)}\r\n`) && s.write(chunk) && s.write('\r\n'); }, 5);
      s.on('close', () => clearInterval(iv));
    });
    expectError(r, 404, null, /unknown route POST \/v1\/nothing/, 'chunked body to an unknown route');
  }
  expectError(await request(port, 'POST', '/v1/images/generations', { headers: { ...json, 'Content-Encoding': 'gzip' },
    body: Buffer.from([0x1f, 0x8b, 8, 0, 0, 0, 0, 0]) }), 415, null, /Content-Encoding 'gzip' is not accepted/, 'a compressed body (a zip bomb\'s way in)');

  // --- prompts past the limits: 400 before anything is queued -----------------------------------
  expectError(await request(port, 'POST', '/v1/images/generations', { headers: json,
    body: JSON.stringify({ prompt: 'x'.repeat(70000) }) }), 400, 'prompt', /'prompt' is 70000 bytes; at most 65536/, 'prompt past --max-prompt-bytes');
  expectError(await request(port, 'POST', '/sdapi/v1/txt2img', { headers: json,
    body: JSON.stringify({ prompt: 'x', negative_prompt: 'y'.repeat(70000) }) }), 400, 'negative_prompt', /at most 65536/, 'A1111 negative prompt past --max-prompt-bytes');

  // --- the read deadline (3 s here): a slow body gets 408, a slow head is closed --------------------
  {
    const t0 = Date.now();
    const r = await raw(port, (s) => {
      s.write(`POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{`);
      const iv = setInterval(() => { if (s.destroyed) clearInterval(iv); else s.write(' '); }, 500);
      s.on('close', () => clearInterval(iv));
    }, { timeoutMs: 15000 });
    const s = (Date.now() - t0) / 1000;
    expectError(r, 408, null, /did not arrive whole within 3 s/, 'slow body (a byte every 0.5 s)');
    assert.ok(s < 8, `answered after ${s} s`);
  }
  {
    const t0 = Date.now();
    let wrote = 0;
    const r = await raw(port, (s) => {
      s.write(`GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n`);
      const iv = setInterval(() => { if (s.destroyed) clearInterval(iv); else { s.write(`X-Slow-${wrote++}: 1\r\n`); } }, 400);
      s.on('close', () => clearInterval(iv));
    }, { timeoutMs: 15000 });
    const s = (Date.now() - t0) / 1000;
    assert.ok(r.closed, 'a head that never ends: the connection is closed');
    assert.ok(s < 8, `closed after ${s} s`);
    console.log(`ok slow head (a header line every 0.4 s, never ending): closed after ${s.toFixed(1)} s`);
  }
  await health(url, 'after the slow clients');

  // --- wrong JSON types and text that is not UTF-8: 400 naming the field ---------------------------
  expectError(await request(port, 'POST', '/v1/images/generations', { headers: json,
    body: JSON.stringify({ prompt: 'x', loras: [{ name: 5 }] }) }), 400, 'loras[0].name', /'loras\[0\]\.name' must be a string/, 'loras[0].name a number');
  expectError(await request(port, 'POST', '/sdapi/v1/txt2img', { headers: json,
    body: JSON.stringify({ prompt: 'x', width: '64' }) }), 400, 'width', /'width' must be an integer/, 'A1111 width a string');
  expectError(await request(port, 'POST', '/sdapi/v1/img2img', { headers: json,
    body: JSON.stringify({ prompt: 'x', init_images: ['AAAA'], inpainting_mask_invert: 'yes' }) }), 400, 'inpainting_mask_invert', /must be an integer/, 'A1111 inpainting_mask_invert a string');
  expectError(await request(port, 'POST', '/v1/images/generations', { headers: json,
    body: Buffer.concat([Buffer.from('{"prompt": "caf'), Buffer.from([0xe9]), Buffer.from(' au lait"}')]) }), 400, 'prompt', /'prompt' is not valid UTF-8 text/, 'a Latin-1 byte in the prompt');
  {  // a multipart form written by hand: its prompt field holds the byte 0xe9
    const b = '----ditstudio-hostile';
    const body = Buffer.concat([
      Buffer.from(`--${b}\r\nContent-Disposition: form-data; name="prompt"\r\n\r\ncaf`), Buffer.from([0xe9]),
      Buffer.from(`\r\n--${b}\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\nContent-Type: image/png\r\n\r\n`),
      encodePng(8, 8, 3, Buffer.alloc(192)), Buffer.from(`\r\n--${b}--\r\n`)]);
    expectError(await request(port, 'POST', '/v1/images/edits', { headers: { 'Content-Type': `multipart/form-data; boundary=${b}` }, body }),
      400, 'prompt', /form field 'prompt' is not valid UTF-8 text/, 'a Latin-1 byte in a multipart prompt');
  }
  expectError(await request(port, 'POST', '/v1/images/generations', { headers: json, body: '{"prompt": "x",' }), 400, null, /not valid JSON \(at byte/, 'truncated JSON');
  {  // a path that decodes to bytes that are not UTF-8: answered (its dump threw and dropped the connection)
    const r = await request(port, 'GET', '/%ff%fe');
    assert.equal(r.status, 404, `${r.status} ${r.body}`);
    assert.match(JSON.parse(r.body).error.message, /unknown route GET \/\ufffd\ufffd/);
    console.log(`ok GET /%ff%fe: 404 "${JSON.parse(r.body).error.message}"`);
  }

  // --- browsers: Origin, Host, Content-Type --------------------------------------------------------
  expectError(await request(port, 'POST', '/v1/images/generations', { headers: { ...json, Origin: 'http://evil.example' },
    body: JSON.stringify({ prompt: P }) }), 403, null, /web page at 'http:\/\/evil\.example' are not allowed.*--cors-origin/, 'foreign Origin');
  expectError(await request(port, 'POST', '/sdapi/v1/txt2img', { headers: { 'Content-Type': 'text/plain' },
    body: JSON.stringify({ prompt: P }) }), 415, null, /expects Content-Type: application\/json, got 'text\/plain'/, 'CORS simple Content-Type');
  expectError(await request(port, 'GET', '/v1/jobs', { headers: { Host: `rebind.evil.example:${port}` } }), 403, null,
    /Host header 'rebind\.evil\.example:\d+' is not a name of this server.*--allowed-host/, 'DNS-rebinding Host');
  {
    const same = await request(port, 'GET', '/v1/models', { headers: { Origin: `http://127.0.0.1:${port}` } });
    assert.equal(same.status, 200, 'the page\'s own origin');
    const local = await request(port, 'GET', '/v1/models', { headers: { Host: `localhost:${port}` } });
    assert.equal(local.status, 200, 'Host localhost');
    console.log('ok same-origin requests and Host localhost served');
  }

  // --- a rank's error names the client's file, never the server's folder ---------------------------
  {
    const r = await request(port, 'POST', '/v1/images/generations', { headers: json,
      body: JSON.stringify({ prompt: P, size: '64x64', steps: 2, seed: 5, loras: [{ name: 'broken.safetensors' }] }) });
    assert.ok(r.status >= 400, `${r.status} ${r.body}`);
    const e = JSON.parse(r.body).error;
    assert.ok(!e.message.includes(dir), `the message shows the server's folder: ${e.message}`);
    assert.ok(!/\/[^ ]*\/[^ ]*broken/.test(e.message), `a path in: ${e.message}`);
    assert.match(e.message, /broken\.safetensors/);
    console.log(`ok a rank's error about a LoRA: ${r.status} "${e.message.slice(0, 160)}"`);
    const jobs = await (await fetch(`${url}/v1/jobs`)).json();
    for (const j of jobs.data) if (j.error) assert.ok(!j.error.includes(dir), `GET /v1/jobs shows a server folder: ${j.error}`);
  }

  // --- uploads: WebP decoded, cut-short files refused ----------------------------------------------
  const edit = async (bytes, name, type) => {
    const form = new FormData();
    form.append('prompt', P);
    form.append('size', '64x64');
    form.append('steps', '2');
    form.append('image', new Blob([bytes], { type }), name);
    const r = await fetch(`${url}/v1/images/edits`, { method: 'POST', body: form });
    return { status: r.status, body: await r.json() };
  };
  {
    const webp = await madeImage(url, 'webp');
    assert.equal(webp.subarray(8, 12).toString('latin1'), 'WEBP');
    const r = await edit(webp, 'in.webp', 'image/webp');
    assert.equal(r.status, 200, JSON.stringify(r.body).slice(0, 300));
    console.log('ok a WebP upload decoded and edited');
    const jpeg = await madeImage(url, 'jpeg');
    const png = encodePng(16, 16, 3, Buffer.alloc(16 * 16 * 3, 0x80));
    const ppm = Buffer.concat([Buffer.from('P6\n16 16\n255\n'), Buffer.alloc(16 * 16 * 3, 0x80)]);
    const bmp = Buffer.alloc(54 + 48 * 16, 0x40);
    bmp.write('BM', 0, 'latin1'); bmp.writeUInt32LE(bmp.length, 2); bmp.writeUInt32LE(54, 10);
    bmp.writeUInt32LE(40, 14); bmp.writeInt32LE(16, 18); bmp.writeInt32LE(16, 22);
    bmp.writeUInt16LE(1, 26); bmp.writeUInt16LE(24, 28); bmp.writeUInt32LE(0, 30);
    for (const [name, bytes] of [['PNG', png], ['JPEG', jpeg], ['PPM', ppm], ['BMP', bmp], ['WebP', webp]]) {
      const ok = await edit(bytes, 'whole', 'application/octet-stream');
      assert.equal(ok.status, 200, `${name} whole: ${JSON.stringify(ok.body).slice(0, 300)}`);
      const cut = await edit(bytes.subarray(0, Math.floor(bytes.length * 0.6)), 'cut', 'application/octet-stream');
      assert.equal(cut.status, 400, `${name} cut: ${JSON.stringify(cut.body)}`);
      assert.equal(cut.body.error.param, 'image');
      assert.match(cut.body.error.message, /'image' is cut short/);
      console.log(`ok ${name}: whole file accepted, cut to 60% refused: "${cut.body.error.message}"`);
    }
  }
  await health(url, 'after the uploads');

  // --- a token limit before queueing: max_sequence_length over the model's (FLUX.1's T5: 512) ---------
  {
    const before = (await (await fetch(`${url}/v1/jobs`)).json()).data.length;
    expectError(await request(port, 'POST', '/v1/images/generations', { headers: json,
      body: JSON.stringify({ prompt: P, size: '64x64', steps: 2, max_sequence_length: 600 }) }),
    400, 'max_sequence_length', /cannot be greater than 512.*got 600/, 'max_sequence_length over the model\'s token limit');
    expectError(await request(port, 'POST', '/sdapi/v1/txt2img', { headers: json,
      body: JSON.stringify({ prompt: P, width: 64, height: 64, steps: 2, max_sequence_length: 513 }) }),
    400, 'max_sequence_length', /cannot be greater than 512.*got 513/, 'A1111 max_sequence_length over the model\'s token limit');
    const after = (await (await fetch(`${url}/v1/jobs`)).json()).data.length;
    assert.equal(after, before, 'a request over the token limit was queued');
    console.log('ok nothing over the model\'s token limit was queued');
  }

  // --- 60 event streams (--max-event-streams 50) + 60 slow clients: health answers, a generation
  // runs, the 10 streams past the limit are refused 503 in OpenAI's shape --------------------------
  {
    const held = [];
    const firstBytes = [];  // what each event stream got first
    for (let i = 0; i < 60; i++) {
      const s = net.connect(port, '127.0.0.1');
      s.on('error', () => {});
      let got = '';
      firstBytes.push(() => got);
      s.on('data', (d) => { if (got.length < 4096) got += d.toString('latin1'); });
      s.on('connect', () => s.write(`GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`));
      held.push(s);
    }
    for (let i = 0; i < 60; i++) {
      const s = net.connect(port, '127.0.0.1');
      s.on('error', () => {});
      s.on('connect', () => s.write(`POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n`));  // and nothing more
      held.push(s);
    }
    await new Promise((r) => setTimeout(r, 1000));
    const times = [];
    for (let i = 0; i < 10; i++) times.push(await health(url, `health with 120 connections held (${i})`));
    const g = await generate(url, 21);
    assert.equal(g.data.length, 1);
    console.log(`ok 60 event streams + 60 slow clients held: health in ${Math.max(...times)} ms at most, a generation succeeded`);
    const heads = firstBytes.map((f) => f());
    const open = heads.filter((h) => /^HTTP\/1\.1 200/.test(h) && /text\/event-stream/i.test(h));
    const refused = heads.filter((h) => /^HTTP\/1\.1 503/.test(h));
    assert.equal(open.length, 50, `open streams: ${open.length}; ${heads.map((h) => h.slice(0, 12)).join(',')}`);
    assert.equal(refused.length, 10, `refused streams: ${refused.length}`);
    for (const h of refused) {
      const e = JSON.parse(h.slice(h.indexOf('\r\n\r\n') + 4)).error;
      assert.equal(e.code, 'too_many_event_streams', JSON.stringify(e));
      assert.equal(e.type, 'server_error');
      assert.match(e.message, /too many open event streams \(50, --max-event-streams\)/);
      assert.match(h, /Retry-After: 5/i);
    }
    console.log(`ok 50 event streams open, 10 past --max-event-streams refused: 503 "${JSON.parse(refused[0].slice(refused[0].indexOf('\r\n\r\n') + 4)).error.message}"`);
    for (const s of held) s.destroy();
    // The slots come back when the streams' clients go away (the next keep-alive write fails).
    await new Promise((r) => setTimeout(r, 2500));
    const again = await new Promise((resolve) => {
      const s = net.connect(port, '127.0.0.1');
      let got = '';
      s.on('error', () => resolve(''));
      s.on('data', (d) => { got += d.toString('latin1'); if (/\r\n\r\n/.test(got)) { s.destroy(); resolve(got); } });
      s.on('connect', () => s.write(`GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`));
    });
    assert.match(again, /^HTTP\/1\.1 200/, `an event stream after the others closed: ${again.slice(0, 200)}`);
    console.log('ok an event stream opens again once the others have closed');
  }

  // --- a burst of 50 simultaneous generations: every one answered ----------------------------------
  {
    const burst = await Promise.all(Array.from({ length: 50 }, (_, i) =>
      request(port, 'POST', '/v1/images/generations', { headers: json,
        body: JSON.stringify({ prompt: P, size: '64x64', steps: 1, seed: 1000 + i }) })));
    const counts = {};
    for (const r of burst) counts[r.status] = (counts[r.status] || 0) + 1;
    for (const r of burst) {
      assert.ok(r.status === 200 || r.status === 429, `status ${r.status} (closed ${r.closed}): ${r.body.slice(0, 200)}`);
      if (r.status === 429) assert.equal(JSON.parse(r.body).error.code, 'queue_full');
    }
    assert.ok(counts[200] >= 1, JSON.stringify(counts));
    console.log(`ok a burst of 50 simultaneous generations: ${JSON.stringify(counts)} (no connection left unanswered)`);
  }

  // --- the queued job was not lost; a normal generation afterwards ----------------------------------
  const preState = await waitJson(`${url}/v1/jobs/${preJob}`, (j) => j.state !== 'queued' && j.state !== 'running');
  assert.equal(preState.state, 'done', JSON.stringify(preState));
  assert.equal(preState.images.length, 1);
  await health(url, 'at the end');
  const last = await generate(url, 7);
  assert.equal(last.data.length, 1);
  console.log(`ok at the end: health answers, job ${preJob} (queued before the hostile inputs) is done with its image, a normal generation succeeded`);
} catch (e) {
  failed = true;
  console.error(e);
  console.error('--- server log ---\n' + server.log().slice(-4000));
} finally {
  await server.stop();
}

// --- a prompt past the workers' request-line limit (16 MiB) with --max-prompt-bytes raised --------
if (!failed) {
  const big = await startServer(['--images-dir', join(dir, 'images-b'), '--np', '1', '--max-body-mb', '40',
    '--max-prompt-bytes', '8388608', '--max-client-connections', '8']);
  try {
    await waitReady(big.url, 1);
    // 8 MiB of '"' each: 16 MiB escaped per field, 32 MiB as the workers would read it.
    const q = '"'.repeat(8 << 20);
    const r = await request(big.port, 'POST', '/v1/images/generations', { headers: json,
      body: JSON.stringify({ prompt: q, negative_prompt: q, size: '64x64', steps: 2 }), timeoutMs: 120000 });
    expectError(r, 400, 'prompt', /bytes as the workers receive it.*at most/, 'request past the workers\' line limit');
    const jobs = await (await fetch(`${big.url}/v1/jobs`)).json();
    assert.equal(jobs.data.length, 0, 'nothing was queued');
    await health(big.url, 'after the long prompt');
    const g = await generate(big.url, 3);
    assert.equal(g.data.length, 1);
    console.log('ok nothing queued, health answers, a normal generation succeeds');
    // --max-client-connections 8: a ninth connection from this address is answered 503.
    const idle = [];
    for (let i = 0; i < 8; i++) {
      const s = net.connect(big.port, '127.0.0.1');
      s.on('error', () => {});
      idle.push(s);
    }
    await new Promise((r) => setTimeout(r, 300));
    expectError(await request(big.port, 'GET', '/v1/models'), 503, null, /too many open connections/, 'a ninth connection from one address');
    const full = await request(big.port, 'GET', '/v1/health');
    assert.equal(full.status, 200, `health while full: ${full.status} ${full.body}`);
    console.log('ok /v1/health answered on a connection over the limit');
    for (const s of idle) s.destroy();
    await new Promise((r) => setTimeout(r, 300));
    await health(big.url, 'after the connections closed');
  } catch (e) {
    failed = true;
    console.error(e);
    console.error('--- server log ---\n' + big.log().slice(-4000));
  } finally {
    const st = await big.stop();
    console.log(`ok SIGTERM stopped the server (${JSON.stringify(st)})`);
  }
}
// --- cancel reaches ranks that are encoding: a 2-rank tensor-parallel group whose rank 0 encodes
// 4 s longer (DITSTUDIO_FAULT slow_encode); a cancel sent while the group says 'encoding' ends the
// job before any denoising step (it was seen only after step 1) ----------------------------------
if (!failed) {
  const slow = await startServer(['--images-dir', join(dir, 'images-c'), '--tp-degree', '2'],
    { env: { DITSTUDIO_FAULT_RANK: '0', DITSTUDIO_FAULT: 'slow_encode:4000' } });
  try {
    await waitReady(slow.url, 1);
    const r = await fetch(`${slow.url}/v1/jobs`, { method: 'POST', headers: json,
      body: JSON.stringify({ prompt: P, size: '64x64', steps: 4, seed: 5 }) });
    assert.equal(r.status, 202);
    const id = (await r.json()).id;
    await waitJson(`${slow.url}/v1/groups`, (g) => g.data[0].stage === 'encoding', { timeoutMs: 20000 });
    const t0 = Date.now();
    const c = await fetch(`${slow.url}/v1/jobs/${id}/cancel`, { method: 'POST' });
    assert.equal(c.status, 202, await c.text());
    const j = await waitJson(`${slow.url}/v1/jobs/${id}`, (x) => x.state !== 'queued' && x.state !== 'running', { timeoutMs: 20000 });
    assert.equal(j.state, 'cancelled', `state ${j.state}: ${j.error}`);
    assert.equal(j.step, 0, `the job ran a denoising step before the cancel was seen: state ${j.state}, step ${j.step}`);
    console.log(`ok a cancel sent while the ranks encode ends the job before any step (${Date.now() - t0} ms, the encode had up to 4 s left)`);
    await health(slow.url, 'after the cancel while encoding');
    const g = await generate(slow.url, 6);
    assert.equal(g.data.length, 1);
    console.log('ok the group serves the next generation');
  } catch (e) {
    failed = true;
    console.error(e);
    console.error('--- server log ---\n' + slow.log().slice(-4000));
  } finally {
    await slow.stop();
  }
}
process.exit(failed ? 1 : 0);
