// Private preview ports in a browser: the token link `?airlock_token=<traffic token>` answers 302 to
// the same URL without it and sets a host-only cookie (an HMAC of the token bound to the sandbox and
// port, never the token), which then opens that host like the header. The app INSIDE the sandbox
// (test/fixtures/preview/browser_app.py) echoes the request it saw, so every test checks that the
// parameter and the cookie never reach it, over HTTP and WebSocket upgrades. Real Chromium (Debian's,
// driven by playwright-core) loads the page after the link; its fetch() and WebSocket ride the cookie.
// The front server is a real node:http server on 127.0.0.1 with attachPreview over the real library
// (the same wiring as preview.test.ts); Chromium resolves *.localhost to loopback itself.
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer, request, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type BrowserContext } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import type { Airlock } from '../../src/sandbox/airlock.js';
import type { Sandbox } from '../../src/sandbox/index.js';
import { previewCookieValue } from '../../src/server/preview-auth.js';
import { attachPreview, newPreviewAccess } from '../../src/server/preview.js';
import { NO_RESIDUE, SKIP_REASON, canRunNamespaces, settledResidue, testAirlock } from '../helpers.js';
import { LibraryPorts, startBrowserApp } from './preview-support.js';

const CHROMIUM = '/usr/bin/chromium';

interface Reply {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}
interface Seen {
  method: string;
  path: string;
  headers: Array<[string, string]>;
}

describe.skipIf(!canRunNamespaces)(
  `preview URLs in a browser: token link and cookie (${SKIP_REASON})`,
  () => {
    let airlock: Airlock;
    let lib: LibraryPorts;
    let x: Sandbox; // private: the app on 8000 and on 8001
    let y: Sandbox; // private: the app on 8000
    const servers: Server[] = [];
    let port = 0; // the front server (secure: false)
    let securePort = 0; // another front server, as with TLS (secure: true)

    const host = (p: number, s: Sandbox): string => `${p}-${s.id}.localhost:${port}`;
    const token = (s: Sandbox): string => lib.access.get(s.id)!.trafficToken!;
    const cookie = (s: Sandbox, p: number): string => previewCookieValue(token(s), s.id, p);

    function hit(
      hostHeader: string,
      path: string,
      o: { method?: string; headers?: Record<string, string>; body?: string; to?: number } = {},
    ): Promise<Reply> {
      return new Promise((resolve, reject) => {
        const req = request(
          {
            host: '127.0.0.1',
            port: o.to ?? port,
            path,
            method: o.method ?? 'GET',
            headers: { host: hostHeader, ...o.headers },
            setHost: false,
          },
          (res) => {
            let body = '';
            res.setEncoding('utf8');
            res.on('data', (d: string) => (body += d));
            res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body }));
          },
        );
        req.on('error', reject);
        req.end(o.body);
      });
    }

    /** What the app saw, and that it saw neither the token nor the cookie in any form. */
    function seenClean(r: Reply, s: Sandbox, p: number): Seen {
      expect(r.status, r.body).toBe(200);
      const seen = JSON.parse(r.body) as Seen;
      expect(r.body).not.toContain(token(s));
      expect(r.body).not.toContain(cookie(s, p));
      expect(r.body).not.toMatch(/airlock_token|airlock%5ftoken|airlock_preview/i);
      return seen;
    }

    /** A WebSocket through the proxy; resolves with the handshake the app saw and one echo. */
    function wsRound(
      path: string,
      headers: Record<string, string>,
    ): Promise<{ status: number; seen?: Seen; echo?: string }> {
      return new Promise((resolve, reject) => {
        const ws = new WebSocket(`ws://127.0.0.1:${port}${path}`, { headers });
        const msgs: string[] = [];
        ws.once('unexpected-response', (_req, res) => {
          res.resume();
          resolve({ status: res.statusCode! });
        });
        ws.on('message', (d: Buffer) => {
          msgs.push(d.toString());
          if (msgs.length === 1) ws.send('echo me');
          else {
            ws.close();
            resolve({ status: 101, seen: JSON.parse(msgs[0]!) as Seen, echo: msgs[1]! });
          }
        });
        ws.once('error', (e) => {
          if (!msgs.length) reject(e);
        });
      });
    }

    beforeAll(async () => {
      airlock = testAirlock();
      lib = new LibraryPorts(airlock);
      [x, y] = await Promise.all([airlock.create({ ttlMs: 300_000 }), airlock.create({ ttlMs: 300_000 })]);
      lib.access.set(x.id, newPreviewAccess(false));
      lib.access.set(y.id, newPreviewAccess(false));
      await Promise.all([startBrowserApp(x, 8000), startBrowserApp(x, 8001), startBrowserApp(y, 8000)]);
      for (const secure of [false, true]) {
        const front = createServer((_req, res) => res.writeHead(404).end('{"api":"no such route"}'));
        attachPreview(front, { api: lib, caller: { tenant: '*' }, secure });
        await new Promise<void>((r) => front.listen(0, '127.0.0.1', r));
        servers.push(front);
        if (secure) securePort = (front.address() as AddressInfo).port;
        else port = (front.address() as AddressInfo).port;
      }
    }, 120_000);

    afterAll(async () => {
      for (const s of servers) s.close();
      await lib?.allClosed();
      await airlock?.killAll();
      await airlock?.close();
      expect(await settledResidue()).toEqual(NO_RESIDUE);
    }, 60_000);

    it('the token link answers 302 to the URL without it, setting a host-only HttpOnly SameSite=Lax cookie that is not the token', async () => {
      const before = lib.connects;
      const r = await hit(host(8000, x), `/?a=1&airlock_token=${token(x)}&b=%2F`);
      expect(r.status).toBe(302);
      expect(r.headers.location).toBe('/?a=1&b=%2F'); // the rest of the query kept byte for byte
      expect(r.headers['cache-control']).toBe('no-store');
      expect(r.headers['referrer-policy']).toBe('no-referrer');
      expect(r.headers['set-cookie']).toEqual([
        `airlock_preview=${cookie(x, 8000)}; Path=/; HttpOnly; SameSite=Lax`,
      ]);
      expect(r.headers['set-cookie']![0]).not.toContain(token(x));
      expect(r.headers['set-cookie']![0]).not.toMatch(/domain=|secure/i);
      expect(lib.connects).toBe(before); // a redirect reaches nothing in the sandbox
      // Only the parameter: the Location is the bare path.
      expect((await hit(host(8000, x), `/page?airlock_token=${token(x)}`)).headers.location).toBe('/page');
      // Its name percent-encoded is the same parameter.
      const enc = await hit(host(8000, x), `/p?airlock%5Ftoken=${token(x)}`);
      expect([enc.status, enc.headers.location]).toEqual([302, '/p']);
    });

    it('with TLS the cookie is Secure and named __Host- (still host-only, Path=/)', async () => {
      const r = await hit(`8000-${x.id}.localhost:${securePort}`, `/?airlock_token=${token(x)}`, {
        to: securePort,
      });
      expect(r.status).toBe(302);
      expect(r.headers['set-cookie']).toEqual([
        `__Host-airlock_preview=${cookie(x, 8000)}; Path=/; HttpOnly; SameSite=Lax; Secure`,
      ]);
    });

    it('a redirect never leaves the host: //evil and /\\evil paths stay paths', async () => {
      for (const [path, want] of [
        [`//evil.example/x?airlock_token=${token(x)}`, '/.//evil.example/x'],
        [`/\\evil.example/?airlock_token=${token(x)}`, '/./\\evil.example/'],
      ] as const) {
        const r = await hit(host(8000, x), path);
        expect(r.status, path).toBe(302);
        expect(r.headers.location).toBe(want);
        expect(new URL(r.headers.location!, `http://${host(8000, x)}`).host).toBe(host(8000, x));
      }
    });

    it('a wrong or missing token in the link: 403/401, no cookie, no connection', async () => {
      const before = lib.connects;
      for (const bad of [token(y), `${token(x)}x`, token(x).slice(1), '', token(x).toUpperCase()]) {
        const r = await hit(host(8000, x), `/?airlock_token=${encodeURIComponent(bad)}`);
        expect(r.status, bad).toBe(403);
        expect(r.headers['set-cookie']).toBeUndefined();
      }
      // Two parameters, one wrong: refused.
      expect((await hit(host(8000, x), `/?airlock_token=${token(x)}&airlock_token=${token(y)}`)).status).toBe(
        403,
      );
      const none = await hit(host(8000, x), '/echo');
      expect(none.status).toBe(401);
      expect(none.body).toContain('airlock_token');
      expect(lib.connects).toBe(before);
    });

    it('the cookie opens its host; the app sees neither it nor the token, its own cookies pass', async () => {
      const r = await hit(host(8000, x), '/echo?q=1', {
        headers: {
          cookie: `app=1; airlock_preview=${cookie(x, 8000)}; __Host-airlock_preview=junk; other=2`,
        },
      });
      const seen = seenClean(r, x, 8000);
      expect(seen.path).toBe('/echo?q=1');
      expect(seen.headers.filter(([k]) => k === 'cookie')).toEqual([['cookie', 'app=1; other=2']]);
      // Only the preview cookie: no Cookie header at all reaches the app.
      const only = seenClean(
        await hit(host(8000, x), '/echo', { headers: { cookie: `airlock_preview=${cookie(x, 8000)}` } }),
        x,
        8000,
      );
      expect(only.headers.some(([k]) => k === 'cookie')).toBe(false);
    });

    it('a cookie for sandbox X port P opens neither port Q of X nor sandbox Y', async () => {
      const before = lib.connects;
      const c = `airlock_preview=${cookie(x, 8000)}`;
      expect((await hit(host(8001, x), '/echo', { headers: { cookie: c } })).status).toBe(403);
      expect((await hit(host(8000, y), '/echo', { headers: { cookie: c } })).status).toBe(403);
      // Nor does the token itself, as a cookie value.
      expect(
        (await hit(host(8000, x), '/echo', { headers: { cookie: `airlock_preview=${token(x)}` } })).status,
      ).toBe(403);
      expect(lib.connects).toBe(before);
      // Each opens its own.
      seenClean(
        await hit(host(8001, x), '/echo', { headers: { cookie: `airlock_preview=${cookie(x, 8001)}` } }),
        x,
        8001,
      );
      seenClean(
        await hit(host(8000, y), '/echo', { headers: { cookie: `airlock_preview=${cookie(y, 8000)}` } }),
        y,
        8000,
      );
    });

    it("a cookie is not honoured for another origin's request (a page on a sibling preview host)", async () => {
      const c = `airlock_preview=${cookie(x, 8000)}`;
      for (const origin of [`http://${host(8000, y)}`, 'http://evil.example', 'null']) {
        const r = await hit(host(8000, x), '/echo', {
          method: 'POST',
          headers: { cookie: c, origin },
          body: 'x',
        });
        expect(r.status, origin).toBe(401);
      }
      const own = await hit(host(8000, x), '/echo', {
        method: 'POST',
        headers: { cookie: c, origin: `http://${host(8000, x)}` },
        body: 'x',
      });
      expect(seenClean(own, x, 8000).method).toBe('POST');
    });

    it('a non-GET with the token parameter is let through, the parameter stripped', async () => {
      const r = await hit(host(8000, x), `/echo?x=1&airlock_token=${token(x)}&y=2`, {
        method: 'POST',
        body: 'b',
      });
      expect(seenClean(r, x, 8000).path).toBe('/echo?x=1&y=2');
      const enc = await hit(host(8000, x), `/echo?airlock%5Ftoken=${token(x)}`, { method: 'PUT', body: 'b' });
      expect(seenClean(enc, x, 8000).path).toBe('/echo');
    });

    it('WebSocket upgrades: by the parameter or by the cookie, both stripped from the handshake the app sees', async () => {
      const byParam = await wsRound(`/ws?keep=1&airlock_token=${token(x)}`, { host: host(8000, x) });
      expect(byParam.status).toBe(101);
      expect(byParam.echo).toBe('echo me');
      expect(byParam.seen!.path).toBe('/ws?keep=1');
      expect(JSON.stringify(byParam.seen)).not.toContain(token(x));
      const byCookie = await wsRound('/ws', {
        host: host(8000, x),
        origin: `http://${host(8000, x)}`,
        cookie: `app=1; airlock_preview=${cookie(x, 8000)}`,
      });
      expect(byCookie.status).toBe(101);
      expect(byCookie.seen!.headers.filter(([k]) => k === 'cookie')).toEqual([['cookie', 'app=1']]);
      expect(JSON.stringify(byCookie.seen)).not.toContain(cookie(x, 8000));
      // Refused: no credential, another port's cookie, another origin.
      expect((await wsRound('/ws', { host: host(8000, x) })).status).toBe(401);
      expect(
        (await wsRound('/ws', { host: host(8000, x), cookie: `airlock_preview=${cookie(x, 8001)}` })).status,
      ).toBe(403);
      expect(
        (
          await wsRound('/ws', {
            host: host(8000, x),
            origin: `http://${host(8000, y)}`,
            cookie: `airlock_preview=${cookie(x, 8000)}`,
          })
        ).status,
      ).toBe(401);
    });

    describe.skipIf(!existsSync(CHROMIUM))(
      `in Chromium${existsSync(CHROMIUM) ? '' : ' [skipped: no /usr/bin/chromium]'}`,
      () => {
        let ctx: BrowserContext;
        const profile = mkdtempSync(join(tmpdir(), 'airlock-chromium-'));
        beforeAll(async () => {
          ctx = await chromium.launchPersistentContext(profile, {
            executablePath: CHROMIUM,
            headless: true,
            args: [
              '--headless',
              '--no-sandbox',
              '--disable-gpu',
              '--disable-background-networking',
              '--disable-component-update',
              '--disable-sync',
              '--no-first-run',
            ],
          });
        }, 60_000);
        afterAll(async () => {
          await ctx?.close();
          rmSync(profile, { recursive: true, force: true });
        });

        it('without the token the page is refused (401)', async () => {
          const page = await ctx.newPage();
          const r = await page.goto(`http://${host(8000, x)}/`);
          expect(r!.status()).toBe(401);
          expect(await page.content()).toContain('airlock_token');
          await page.close();
        }, 60_000);

        it('after the token link the page loads; its fetch() and WebSocket work through the cookie; the app never sees it', async () => {
          const page = await ctx.newPage();
          const r = await page.goto(`http://${host(8000, x)}/?airlock_token=${token(x)}`);
          expect(r!.status()).toBe(200);
          expect(page.url()).toBe(`http://${host(8000, x)}/`); // the token is gone from the address bar
          await page.waitForFunction('document.title === "done"', undefined, { timeout: 30_000 });
          const result = JSON.parse(await page.evaluate<string>('window.result')) as {
            error?: string;
            fetchStatus: number;
            fetch: Seen;
            wsHandshake: Seen;
            wsEcho: string;
          };
          expect(result.error).toBeUndefined();
          expect(result.fetchStatus).toBe(200);
          expect(result.fetch.path).toBe('/echo?from=page');
          expect(result.wsHandshake.path).toBe('/ws?from=page');
          expect(result.wsEcho).toBe('echo me');
          const all = JSON.stringify(result);
          expect(all).not.toContain(token(x));
          expect(all).not.toContain(cookie(x, 8000));
          expect(all).not.toContain('airlock_preview');
          // The browser holds one cookie, for exactly this host, HttpOnly, SameSite=Lax: not the token.
          const jar = await ctx.cookies();
          expect(jar).toHaveLength(1);
          expect(jar[0]).toMatchObject({
            name: 'airlock_preview',
            value: cookie(x, 8000),
            domain: `8000-${x.id}.localhost`,
            path: '/',
            httpOnly: true,
            sameSite: 'Lax',
            secure: false,
          });
          expect(await page.evaluate<string>('document.cookie')).toBe(''); // HttpOnly: the page's JS cannot read it
          await page.close();
        }, 60_000);

        it('the same browser gets no further: another sandbox and another port of this one still answer 401', async () => {
          const page = await ctx.newPage();
          expect((await page.goto(`http://${host(8000, y)}/`))!.status()).toBe(401);
          expect((await page.goto(`http://${host(8001, x)}/`))!.status()).toBe(401);
          await page.close();
        }, 60_000);
      },
    );
  },
);
