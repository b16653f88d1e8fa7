// What an exec on the WASM tier runs, from its argv (src/backends/wasm/commands.ts): the facade's
// wrappings undone, shell strings split into words with no shell features, and everything that is
// not python, node or a builtin refused with one line and exit 127.
import { describe, expect, it } from 'vitest';
import { FILES_WRITE_SCRIPT, NOT_RUNNABLE, commandOf, shellWords } from '../../src/backends/wasm/commands.js';
import { checkedArgv } from '../../src/sandbox/exec-check.js';

describe('wasm commands', () => {
  it('an argv array behind the facade check runs as given', () => {
    const argv = ['python3', '-c', 'print(1)', 'a b', '$HOME'];
    expect(commandOf(checkedArgv(argv, {}))).toEqual({
      kind: 'python',
      code: 'print(1)',
      argv: ['-c', 'a b', '$HOME'],
    });
    expect(commandOf(checkedArgv(['node', '-e', 'x', 'y'], { PWD: '/w' }))).toEqual({
      kind: 'javascript',
      code: 'x',
      argv: ['y'],
    });
  });

  it('python and node forms: -c/-e, a script path, stdin; harmless flags are skipped', () => {
    expect(commandOf(['/usr/bin/python3', '-u', '-B', 'main.py', '--x'])).toEqual({
      kind: 'python',
      path: 'main.py',
      argv: ['main.py', '--x'],
    });
    expect(commandOf(['python'])).toMatchObject({ kind: 'python', path: '/dev/stdin' });
    expect(commandOf(['python3.14', '-c', '1'])).toMatchObject({ kind: 'python', code: '1' });
    expect(commandOf(['js', 'app.js', '1'])).toEqual({ kind: 'javascript', path: 'app.js', argv: ['1'] });
    expect(commandOf(['python3', '-m', 'http.server'])).toMatchObject({ kind: 'refuse', exitCode: 2 });
    expect(commandOf(['python3', '-c'])).toMatchObject({ kind: 'refuse', exitCode: 2 });
    expect(commandOf(['node', '--require', 'x'])).toMatchObject({ kind: 'refuse', exitCode: 9 });
  });

  it('anything else exits 127 with one line naming it', () => {
    for (const argv of [
      ['ls', '-la'],
      ['/bin/bash'],
      ['sh', '-c', 'exit 7', 'zero'],
      ['/usr/bin/env'],
      ['curl', 'x'],
    ]) {
      const c = commandOf(argv);
      expect(c).toMatchObject({ kind: 'refuse', exitCode: 127 });
      const msg = (c as { message: string }).message;
      expect(msg).toContain(NOT_RUNNABLE);
      expect(msg).not.toContain('\n');
    }
    expect((commandOf(['/opt/bin/curl']) as { message: string }).message).toMatch(/^airlock: curl: /);
  });

  it('a shell string is split into words; shell features are refused, never half-run', () => {
    expect(commandOf(['/bin/sh', '-c', `echo 'a b' "c \\"d\\"" e\\ f`])).toEqual({
      kind: 'builtin',
      argv: ['echo', 'a b', 'c "d"', 'e f'],
    });
    for (const s of [
      'echo a; rm -rf /',
      'cat x | wc',
      'echo $HOME',
      'echo "$HOME"',
      'echo `id`',
      'echo > f',
      'ls *',
      'A=1 echo',
      'echo a\necho b',
      "echo 'open",
    ]) {
      const c = commandOf(['/bin/sh', '-c', s]);
      expect({ s, kind: c.kind }).toEqual({ s, kind: 'refuse' });
    }
    expect(shellWords("''")).toEqual(['']);
    expect(shellWords('  a   b ')).toEqual(['a', 'b']);
  });

  it("the files API's write command becomes the write builtin; other sh -c scripts do not", () => {
    expect(commandOf(['/bin/sh', '-c', FILES_WRITE_SCRIPT, 'sh', '/workspace/x'])).toEqual({
      kind: 'builtin',
      argv: ['airlock-write', '/workspace/x'],
    });
    expect(commandOf(['/bin/sh', '-c', `${FILES_WRITE_SCRIPT}; id`, 'sh', '/x'])).toMatchObject({
      kind: 'refuse',
    });
  });
});

describe('wasm commands: the files API', () => {
  it("FILES_WRITE_SCRIPT is byte-equal to src/sandbox/files.ts's write command", async () => {
    const { readFileSync } = await import('node:fs');
    const src = readFileSync(new URL('../../src/sandbox/files.ts', import.meta.url), 'utf8');
    expect(src).toContain(`'${FILES_WRITE_SCRIPT}'`);
  });
});
