// The Dockerfile subset parser: Docker's semantics where supported, a typed refusal naming the line
// everywhere else (never a silent difference from what the file says).
import { describe, expect, it } from 'vitest';
import { dockerfileBase, parseDockerfile } from '../../src/core/dockerfile.js';
import type { ImageConfig } from '../../src/core/image.js';
import { AirlockError } from '../../src/core/errors.js';

const refused = (text: string, re: RegExp, buildArgs?: Record<string, string>): AirlockError => {
  let err: unknown;
  try {
    parseDockerfile(text, { buildArgs });
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(AirlockError);
  const a = err as AirlockError;
  expect(a.code).toBe('INVALID_SPEC');
  expect(a.message).toMatch(re);
  expect(a.field).toMatch(/^Dockerfile:\d+$/);
  return a;
};

const base: ImageConfig = {
  env: ['PATH=/usr/local/bin:/usr/bin:/bin', 'LANG=C.UTF-8'],
  workingDir: '/srv',
  user: 'app',
  entrypoint: ['/entry'],
  cmd: ['serve'],
  labels: { from: 'base' },
};

describe('parseDockerfile', () => {
  it('reads every supported instruction with Docker semantics', () => {
    const p = parseDockerfile(
      [
        '# syntax=docker/dockerfile:1',
        'ARG TAG=1.36',
        'FROM registry.example.com/busybox:${TAG}',
        'ENV A=1 B="two words" \\',
        '    C=3',
        'ENV OLD style value',
        'LABEL a.b="x y" c=d',
        'WORKDIR app',
        'WORKDIR sub',
        'COPY --chown=1000:1000 --chmod=755 src/ ./dst/',
        'ADD ["a b.txt", "/x/"]',
        'run echo hi && \\',
        '# a comment inside a continuation is dropped',
        '    echo $A',
        'RUN ["python3", "-c", "print(1)"]',
        'USER user:grp',
        'CMD ["sh"]',
        'ENTRYPOINT /bin/x -y',
      ].join('\r\n'),
    );
    expect(p.base).toBe('registry.example.com/busybox:1.36');
    expect(p.env).toEqual(['A=1', 'B=two words', 'C=3', 'OLD=style value']);
    expect(p.labels).toEqual({ 'a.b': 'x y', c: 'd' });
    expect(p.workingDir).toBe('/app/sub');
    expect(p.user).toBe('user:grp');
    expect(p.cmd).toEqual(['sh']); // CMD set in this file survives a later ENTRYPOINT
    expect(p.entrypoint).toEqual(['/bin/sh', '-c', '/bin/x -y']);
    expect(p.steps).toHaveLength(4);
    expect(p.steps[0]).toMatchObject({
      kind: 'copy',
      add: false,
      sources: ['src/'],
      dest: '/app/sub/dst',
      intoDir: true,
      chown: '1000:1000',
      chmod: '755',
      user: '',
    });
    expect(p.steps[1]).toMatchObject({
      kind: 'copy',
      add: true,
      sources: ['a b.txt'],
      dest: '/x',
      intoDir: true,
    });
    // RUN is never substituted by the parser: the shell expands $A from its environment.
    expect(p.steps[2]).toMatchObject({ kind: 'run', command: 'echo hi &&     echo $A', workdir: '/app/sub' });
    expect((p.steps[2] as { env: Record<string, string> }).env).toMatchObject({ A: '1', C: '3' });
    expect(p.steps[3]).toMatchObject({ kind: 'run', command: ['python3', '-c', 'print(1)'] });
  });

  it('treats a JSON array that is not all strings as shell form, as Docker does', () => {
    const p = parseDockerfile('FROM host\nRUN [1, "x"]\nCMD [not json');
    expect(p.steps[0]).toMatchObject({ command: '[1, "x"]' });
    expect(p.cmd).toEqual(['/bin/sh', '-c', '[not json']);
  });

  it('honours the escape directive (backtick) and a literal $', () => {
    const p = parseDockerfile('# escape=`\nFROM host\nENV P=C:\\dir X=`$HOME\nRUN echo a `\n  b');
    expect(p.env).toEqual(['P=C:\\dir', 'X=$HOME']);
    expect(p.steps[0]).toMatchObject({ command: 'echo a   b' });
    const q = parseDockerfile('FROM host\nENV X=\\$HOME Y=$NOPE Z=${NOPE:-dflt} W=${X:+set}');
    // Pairs of one ENV see the values from before it (Docker's rule), not each other.
    expect(q.env).toEqual(['X=$HOME', 'Y=', 'Z=dflt', 'W=']);
    const r = parseDockerfile(
      'FROM host\nENV abc=hello\nENV abc=bye def=$abc\nENV ghi=$abc\nENV s=\'$abc\' d="$abc"',
    );
    expect(r.env).toEqual(['abc=bye', 'def=hello', 'ghi=bye', 's=$abc', 'd=bye']);
  });

  it('scopes ARGs before FROM to FROM only, and applies build args', () => {
    const p = parseDockerfile('ARG IMG=a\nFROM ${IMG}\nENV V=${IMG}x\nARG N=1\nENV M=$N', {
      buildArgs: { IMG: 'b', N: '7' },
    });
    expect(p.base).toBe('b');
    expect(p.env).toEqual(['V=x', 'M=7']);
    expect(dockerfileBase('ARG IMG=a\nFROM ${IMG}\nRUN true', { IMG: 'c' })).toBe('c');
    refused('FROM host\nARG A', /build arg "B" is not declared/, { B: '1' });
  });

  it('carries the base config through and lets the file change it', () => {
    const p = parseDockerfile('FROM x\nENV LANG=en_US.UTF-8 HOME2=$PATH\nWORKDIR rel\nENTRYPOINT ["/e2"]', {
      baseConfig: base,
    });
    expect(p.env).toEqual([
      'PATH=/usr/local/bin:/usr/bin:/bin',
      'LANG=en_US.UTF-8',
      'HOME2=/usr/local/bin:/usr/bin:/bin',
    ]);
    expect(p.workingDir).toBe('/srv/rel');
    expect(p.user).toBe('app');
    expect(p.labels).toEqual({ from: 'base' });
    expect(p.entrypoint).toEqual(['/e2']);
    expect(p.cmd).toEqual([]); // ENTRYPOINT resets the base's CMD
    expect(parseDockerfile('FROM x\nRUN true', { baseConfig: base }).cmd).toEqual(['serve']);
  });

  it('refuses everything outside the subset, naming the line and what to do', () => {
    refused('FROM host\nEXPOSE 80', /line 2: EXPOSE is not supported: remove it/);
    refused('FROM host\nVOLUME /data', /VOLUME is not supported/);
    refused('FROM host\nSHELL ["bash"]', /SHELL is not supported/);
    refused('FROM host\nFROB x', /unknown instruction FROB/);
    refused('FROM a AS b\nRUN true', /one stage only/);
    refused('FROM a\nFROM b', /line 2: only one FROM/);
    refused('FROM --platform=linux/arm64 a', /FROM flags/);
    refused('FROM scratch', /FROM scratch is not supported/);
    refused('RUN true\nFROM a', /line 1: RUN before FROM/);
    refused('# nothing\n', /no FROM/);
    refused('FROM a\nCOPY --from=b /x /y', /--from needs multi-stage/);
    refused('FROM a\nCOPY --link x /y', /--link is not supported/);
    refused('FROM a\nRUN --mount=type=cache,target=/c true', /RUN flags/);
    refused('FROM a\nRUN --network=host curl x', /RUN flags/);
    refused('FROM a\nADD https://example.com/x.tgz /x', /ADD of a URL is not supported/);
    refused('FROM a\nADD ["git://example.com/r", "/r"]', /ADD of a URL/);
    refused('FROM a\nRUN <<EOF\necho hi\nEOF', /heredocs are not supported/);
    refused('FROM a\nCOPY <<-"X" /f\nhi\nX', /heredocs/);
    refused('FROM a\nCOPY x', /at least one source and a destination/);
    refused('FROM a\nUSER "a b"', /USER takes/);
    refused('FROM a\nUSER $(id)', /USER takes/);
    refused('FROM a\nENV 1A=x', /ENV name "1A"/);
    refused('FROM a\nENV A="unterminated', /unterminated " quote/);
    refused('FROM a\nENV A=${B:?err}', /unsupported substitution/);
    refused('FROM a\nENV A=${B', /unterminated/);
    refused('FROM a\nCOPY --chmod=u+x a /b', /--chmod takes an octal mode/);
    refused('# escape=x\nFROM a', /escape directive/);
  });

  it('keeps every COPY/ADD source inside the build context, after substitution too', () => {
    refused('FROM a\nCOPY ../secret /x', /must stay inside the build context/);
    refused('FROM a\nCOPY /etc/shadow /x', /inside the build context/);
    refused('FROM a\nCOPY ["a/../../b", "/x"]', /inside the build context/);
    refused('FROM a\nARG UP=..\nCOPY $UP/x /y', /inside the build context/);
    refused('FROM a\nENV R=/\nCOPY ${R}etc/passwd /y', /inside the build context/);
    refused('FROM a\nCOPY a\\\n/../b /y', /inside the build context/);
  });

  it('resolves destinations against WORKDIR and normalises them', () => {
    const p = parseDockerfile('FROM a\nWORKDIR /w\nCOPY f ./g/../h\nCOPY a b /multi\nCOPY f /abs/');
    expect(p.steps.map((s) => s.kind === 'copy' && [s.dest, s.intoDir])).toEqual([
      ['/w/h', false],
      ['/multi', true],
      ['/abs', true],
    ]);
  });
});
