// `airlock template build -f Dockerfile`: the Dockerfile subset a template can hold today, built by
// the real CLI in real sandboxes, then run with `airlock run --template`; bad input is a typed error
// naming the line (or, for a failing RUN, TEMPLATE_BUILD_FAILED with the step and its stderr).
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AirlockError } from '../../src/core/errors.js';
import { dockerfileTemplate } from '../../src/sandbox/dockerfile-template.js';
import { canRunNamespaces, NO_RESIDUE, runCli, settledResidue, SKIP_REASON } from '../helpers.js';

const DOCKERFILE = `# a comment
FROM host
ARG GREETING=hello
ENV APP=demo
WORKDIR /workspace/app
COPY app.txt ./
COPY conf/ /home/user/conf/
LABEL team=a
RUN echo "$GREETING $APP" > out.txt && cat app.txt >> out.txt && pwd >> out.txt
RUN ["sh", "-c", "ls /home/user/conf > /workspace/app/conf.txt"]
CMD ["sh", "-c", "echo cmd $APP"]
`;

describe('Dockerfile → template (no sandbox)', () => {
  let ctx: string;
  beforeAll(() => {
    ctx = mkdtempSync('/tmp/airlock-df-');
    writeFileSync(join(ctx, 'a.txt'), 'a');
    writeFileSync(join(ctx, 'bin.dat'), Buffer.from([0xff, 0xfe, 0x00]));
    writeFileSync(join(ctx, 'x.tar.gz'), 'x');
    symlinkSync('/etc/hostname', join(ctx, 'escape'));
  });
  afterAll(() => rmSync(ctx, { recursive: true, force: true }));

  const refused = (text: string, line: number, re: RegExp): void => {
    let err: unknown;
    try {
      dockerfileTemplate(text, { name: 't', context: ctx });
    } catch (e) {
      err = e;
    }
    expect(AirlockError.isInstance(err), text).toBe(true);
    expect((err as AirlockError).code).toBe('INVALID_SPEC');
    expect((err as AirlockError).message).toContain(`Dockerfile line ${line}`);
    expect((err as AirlockError).message).toMatch(re);
  };

  it('refuses what a template cannot hold, naming the line', () => {
    refused('FROM host\nEXPOSE 80\n', 2, /EXPOSE/);
    refused('FROM host\nFROBNICATE x\n', 2, /FROBNICATE/);
    refused('FROM registry.example.com/te am\n', 1, /FROM takes one/);
    refused('FROM a%b\n', 1, /not an image reference/);
    refused('FROM host\nCOPY ../etc/passwd /workspace/\n', 2, /no "\.\."/);
    refused('FROM host\nCOPY /etc/passwd /workspace/\n', 2, /inside the build context/);
    refused('FROM host\nADD https://example.com/x /workspace/\n', 2, /URL/);
    refused('FROM host\nADD x.tar.gz /workspace/\n', 2, /archives are not extracted/);
    refused('FROM host\nCOPY escape /workspace/\n', 2, /outside the build context/);
    refused('FROM host\nCOPY bin.dat /workspace/\n', 2, /not UTF-8/);
    refused('FROM host\nRUN true\nCOPY a.txt /workspace/\n', 3, /before its steps/);
    refused('FROM host\nUSER root\nRUN true\n', 2, /sandbox user/);
  });

  it('FROM an image reference is an image base; ENV, WORKDIR, CMD and ENTRYPOINT become the config', () => {
    const t = dockerfileTemplate(
      'FROM registry.example.com/team/py:3.12\nENV A=1\nWORKDIR /srv\nENTRYPOINT ["python3"]\nCMD ["-V"]\n',
      { name: 'x', context: ctx },
    );
    expect(t.base).toBe('image:registry.example.com/team/py:3.12');
    expect(t.config).toEqual({ env: ['A=1'], workingDir: '/srv', entrypoint: ['python3'], cmd: ['-V'] });
    // A bare name stays a template name, a digest a layer digest.
    expect(dockerfileTemplate('FROM mytpl\n', { name: 'x', context: ctx }).base).toBe('mytpl');
  });

  it('maps COPY targets (relative to WORKDIR, into a dir) and RUN env/workdir', () => {
    const t = dockerfileTemplate(
      'FROM host\nARG V=1\nWORKDIR /workspace/w\nCOPY a.txt ./\nCOPY a.txt b.txt\nRUN echo $V\n',
      {
        name: 'x',
        context: ctx,
      },
    );
    expect(t.files).toEqual([
      { path: '/workspace/w/a.txt', content: 'a' },
      { path: '/workspace/w/b.txt', content: 'a' },
    ]);
    expect(t.steps).toEqual([{ run: 'echo $V', env: { V: '1' }, workdir: '/workspace/w' }]);
  });
});

describe.skipIf(!canRunNamespaces)(`airlock template build -f (${SKIP_REASON})`, () => {
  let ctx: string;
  beforeAll(() => {
    ctx = mkdtempSync('/tmp/airlock-df-');
    writeFileSync(join(ctx, 'Dockerfile'), DOCKERFILE);
    writeFileSync(join(ctx, 'app.txt'), 'from the context\n');
    mkdirSync(join(ctx, 'conf'));
    writeFileSync(join(ctx, 'conf', 'one.yaml'), 'a: 1\n');
    writeFileSync(join(ctx, 'conf', 'two.yaml'), 'b: 2\n');
  });
  afterAll(async () => {
    await runCli(['template', 'rm', 'df-test']);
    rmSync(ctx, { recursive: true, force: true });
    expect(await settledResidue()).toEqual(NO_RESIDUE);
  }, 60_000);

  it('builds, and airlock run --template runs on what it made', async () => {
    const b = await runCli(['template', 'build', '-f', join(ctx, 'Dockerfile'), '--name', 'df-test'], {
      timeoutMs: 120_000,
    });
    expect(b.stderr).not.toMatch(/error/i);
    expect(b.code).toBe(0);
    expect(b.stdout).toMatch(/^df-test sha256:[0-9a-f]{64}\n$/);
    const r = await runCli([
      'run',
      '--template',
      'df-test',
      '--',
      'cat',
      '/workspace/app/out.txt',
      '/workspace/app/conf.txt',
    ]);
    expect(r.code).toBe(0);
    expect(r.stdout).toBe('hello demo\nfrom the context\n/workspace/app\none.yaml\ntwo.yaml\n');
    // No command: the template's CMD runs, with its ENV (a host-root template keeps both too).
    const cmd = await runCli(['run', '--template', 'df-test']);
    expect(cmd.stderr).toBe('');
    expect(cmd.stdout).toBe('cmd demo\n');
  }, 180_000);

  it('a failing RUN: TEMPLATE_BUILD_FAILED naming the step, with its stderr', async () => {
    const bad = join(ctx, 'bad');
    mkdirSync(bad);
    writeFileSync(join(bad, 'Dockerfile'), 'FROM host\nRUN true\nRUN echo oops-from-step >&2; exit 3\n');
    const b = await runCli(['template', 'build', '-f', join(bad, 'Dockerfile')], { timeoutMs: 120_000 });
    expect(b.code).not.toBe(0);
    expect(b.stderr).toMatch(/TEMPLATE_BUILD_FAILED|template step 2/);
    expect(b.stderr).toMatch(/exited 3/);
    expect(b.stderr).toContain('oops-from-step');
    // nothing was recorded under the context's name
    expect((await runCli(['template', 'inspect', 'bad'])).code).not.toBe(0);
    // an unknown instruction: the CLI's typed error names the line
    writeFileSync(join(bad, 'Dockerfile'), 'FROM host\n\nSPAWN x\n');
    const u = await runCli(['template', 'build', '-f', join(bad, 'Dockerfile')]);
    expect(u.code).not.toBe(0);
    expect(u.stderr).toMatch(/Dockerfile line 3/);
  }, 180_000);
});
