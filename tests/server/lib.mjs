// Helpers of the server tests (node, no dependency besides the official `openai` client the
// tests import themselves): start ditstudio-server on a free port, decode PNG pixels (zlib +
// the PNG filters), run ditstudio-cli, compare images, poll JSON endpoints.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { deflateSync, inflateSync } from 'node:zlib';
import assert from 'node:assert/strict';

export const BIN = process.env.DITSTUDIO_BIN;  // build/bin
assert.ok(BIN, 'DITSTUDIO_BIN must name the folder of ditstudio-server and ditstudio-cli');

const made = [];
process.on('exit', () => {
  if (process.env.DITSTUDIO_KEEP_TEST_DIRS) return;
  for (const d of made) rmSync(d, { recursive: true, force: true });
});
/// A temporary folder, removed when the test ends (kept with DITSTUDIO_KEEP_TEST_DIRS=1).
export function tempDir(tag) {
  const d = mkdtempSync(join(tmpdir(), `ditstudio-server-${tag}-`));
  made.push(d);
  return d;
}

/// Starts ditstudio-server with `args` (plus --port 0 unless given) and resolves once it prints
/// "listening on URL". Returns {proc, url, port, log(), stop()}.
export function startServer(args, { env = {}, timeoutMs = 60000 } = {}) {
  const full = args.includes('--port') ? args : [...args, '--port', '0'];
  const proc = spawn(join(BIN, 'ditstudio-server'), full, {
    env: { ...process.env, OMP_NUM_THREADS: '1', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  proc.stderr.on('data', (d) => { err += d; });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start:\n${out}\n${err}`)), timeoutMs);
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited with ${code} before listening:\n${out}\n${err}`));
    });
    proc.stdout.on('data', (d) => {
      out += d;
      const m = /listening on (http:\/\/[^ ]+):(\d+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        proc.removeAllListeners('exit');
        const port = Number(m[2]);
        const exited = new Promise((r) => proc.on('exit', (code, sig) => r({ code, sig })));
        resolve({
          proc,
          port,
          url: `http://127.0.0.1:${port}`,
          stdout: () => out,
          log: () => err,
          exited,
          stop: async () => {
            if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
            const r = await Promise.race([exited, new Promise((x) => setTimeout(() => x(null), 30000))]);
            if (r === null) { proc.kill('SIGKILL'); throw new Error('server did not stop within 30 s'); }
            return r;
          },
        });
      }
    });
  });
}

/// Polls GET url until pred(json) or timeout.
export async function waitJson(url, pred, { timeoutMs = 60000, headers = {} } = {}) {
  const end = Date.now() + timeoutMs;
  let last;
  while (Date.now() < end) {
    try {
      const r = await fetch(url, { headers });
      last = await r.json();
      if (pred(last)) return last;
    } catch (e) {
      last = String(e);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting on ${url}; last: ${JSON.stringify(last).slice(0, 2000)}`);
}

export async function waitReady(url, groups = 1) {
  return waitJson(`${url}/v1/health`, (h) => h.ready >= groups, { timeoutMs: 120000 });
}

function paeth(a, b, c) {
  const p = a + b - c;
  const pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/// Decodes an 8-bit, non-interlaced PNG (what DiT Studio writes) into its pixels.
export function decodePng(buf) {
  assert.equal(buf.subarray(1, 4).toString('latin1'), 'PNG', 'not a PNG');
  let off = 8;
  let width = 0, height = 0, ctype = 0, depth = 0, interlace = 0;
  const idat = [];
  while (off < buf.length) {
    const len = buf.readUInt32BE(off);
    const type = buf.subarray(off + 4, off + 8).toString('latin1');
    const data = buf.subarray(off + 8, off + 8 + len);
    if (type === 'IHDR') {
      width = data.readUInt32BE(0); height = data.readUInt32BE(4);
      depth = data[8]; ctype = data[9]; interlace = data[12];
    } else if (type === 'IDAT') idat.push(data);
    else if (type === 'IEND') break;
    off += 12 + len;
  }
  assert.equal(depth, 8, 'only 8-bit PNGs');
  assert.equal(interlace, 0, 'only non-interlaced PNGs');
  const channels = { 0: 1, 2: 3, 4: 2, 6: 4 }[ctype];
  assert.ok(channels, `PNG colour type ${ctype} not handled`);
  const raw = inflateSync(Buffer.concat(idat));
  const stride = width * channels;
  const px = Buffer.alloc(stride * height);
  for (let y = 0; y < height; y++) {
    const f = raw[y * (stride + 1)];
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    for (let x = 0; x < stride; x++) {
      const a = x >= channels ? px[y * stride + x - channels] : 0;
      const b = y > 0 ? px[(y - 1) * stride + x] : 0;
      const c = x >= channels && y > 0 ? px[(y - 1) * stride + x - channels] : 0;
      const v = line[x];
      px[y * stride + x] = (f === 0 ? v : f === 1 ? v + a : f === 2 ? v + b : f === 3 ? v + ((a + b) >> 1) : v + paeth(a, b, c)) & 255;
    }
  }
  return { width, height, channels, pixels: px };
}

/// Asserts two PNGs hold the same pixels (metadata chunks may differ).
export function assertSamePixels(pngA, pngB, what) {
  const a = decodePng(pngA), b = decodePng(pngB);
  assert.deepEqual([a.width, a.height, a.channels], [b.width, b.height, b.channels], `${what}: sizes differ`);
  let diff = 0, maxd = 0;
  for (let i = 0; i < a.pixels.length; i++) {
    const d = Math.abs(a.pixels[i] - b.pixels[i]);
    if (d) { diff++; maxd = Math.max(maxd, d); }
  }
  assert.equal(diff, 0, `${what}: ${diff} of ${a.pixels.length} bytes differ (max ${maxd})`);
}

/// Runs ditstudio-cli (one rank in-process, one OpenMP thread like a worker rank); returns the
/// PNG bytes it wrote.
export function runCli(args, dir) {
  const out = join(dir, `cli-${Date.now()}-${Math.random().toString(16).slice(2)}.png`);
  const r = spawnSync(join(BIN, 'ditstudio-cli'), [...args, '--output', out], {
    env: { ...process.env, OMP_NUM_THREADS: '1' }, encoding: 'utf8', timeout: 300000,
  });
  assert.equal(r.status, 0, `ditstudio-cli ${args.join(' ')} failed:\n${r.stdout}\n${r.stderr}`);
  return readFileSync(out);
}

const CRC = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();
function crc32(buf) {
  let c = 0xffffffff;
  for (const b of buf) c = CRC[(c ^ b) & 255] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}
function chunk(type, data) {
  const len = Buffer.alloc(4); len.writeUInt32BE(data.length);
  const td = Buffer.concat([Buffer.from(type, 'latin1'), data]);
  const crc = Buffer.alloc(4); crc.writeUInt32BE(crc32(td));
  return Buffer.concat([len, td, crc]);
}
/// Encodes 8-bit pixels (1 grey, 2 grey+alpha, 3 RGB, 4 RGBA channels) as a PNG (filter 0).
export function encodePng(width, height, channels, pixels) {
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0); ihdr.writeUInt32BE(height, 4);
  ihdr[8] = 8; ihdr[9] = { 1: 0, 2: 4, 3: 2, 4: 6 }[channels]; ihdr[10] = 0; ihdr[11] = 0; ihdr[12] = 0;
  const stride = width * channels;
  const raw = Buffer.alloc((stride + 1) * height);
  for (let y = 0; y < height; y++) pixels.copy(raw, y * (stride + 1) + 1, y * stride, (y + 1) * stride);
  return Buffer.concat([Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]), chunk('IHDR', ihdr),
    chunk('IDAT', deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);
}
