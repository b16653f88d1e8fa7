// The fenced code blocks of the docs, and what the docs test does with each. A block's info string is
// its language and, optionally, how it is checked (GitHub renders only the first word):
//   ```ts / ```js                every block is typechecked; without `typecheck` it is also run (tsx)
//   ```ts typecheck              typechecked only (it reaches hosts outside the test's network)
//   ```sh                        run with /bin/sh -e in the doc's scratch dir, `airlock` on PATH
//   ```sh syntax                 parsed (sh -n); every `airlock SUBCOMMAND` it names must exist
//   ```sh install                changes the machine (npm install -g, apt): parsed, and every npm
//                                script, repo path and tarball name it names must exist / match
//   ```json schema=gateway       validated against the named zod schema (see SCHEMAS in the test)
//   file=NAME                    also written to NAME in the doc's scratch dir before its blocks run
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';

export type Lang = 'ts' | 'js' | 'sh' | 'json' | 'yaml';

export interface Block {
  /** Path of the markdown file, relative to the repo. */
  readonly doc: string;
  /** 1-based line of the opening fence. */
  readonly line: number;
  readonly lang: Lang;
  readonly flags: ReadonlySet<string>;
  readonly meta: Readonly<Record<string, string>>;
  readonly code: string;
}

const LANGS: Record<string, Lang> = {
  ts: 'ts',
  typescript: 'ts',
  js: 'js',
  javascript: 'js',
  sh: 'sh',
  bash: 'sh',
  shell: 'sh',
  json: 'json',
  yaml: 'yaml',
  yml: 'yaml',
};

/** README.md and docs/**.md, without the generated reference and benchmark pages. */
export function docFiles(root: string): string[] {
  const out = ['README.md'];
  const walk = (dir: string): void => {
    for (const e of readdirSync(join(root, dir), { withFileTypes: true })) {
      const rel = join(dir, e.name);
      if (e.isDirectory()) {
        if (rel !== join('docs', 'reference')) walk(rel);
      } else if (e.name.endsWith('.md') && rel !== join('docs', 'benchmarks.md')) out.push(rel);
    }
  };
  walk('docs');
  return out.sort();
}

/** Every fenced block of one markdown file; an unknown or missing language is an error. */
export function extractBlocks(root: string, doc: string): Block[] {
  const lines = readFileSync(join(root, doc), 'utf8').split('\n');
  const blocks: Block[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^(\s*)(`{3,}|~{3,})(.*)$/.exec(lines[i]!);
    if (!open) continue;
    const [, indent, fence, info] = open;
    const end = lines.findIndex((l, j) => j > i && l.trim() === fence);
    if (end < 0) throw new Error(`${doc}:${i + 1}: unclosed code fence`);
    const [word = '', ...rest] = info!.trim().split(/\s+/);
    const lang = LANGS[word];
    if (!lang) {
      throw new Error(
        `${doc}:${i + 1}: code block language "${word}" is not one the docs test runs (${Object.keys(LANGS).join(', ')})`,
      );
    }
    const flags = new Set(rest.filter((w) => !w.includes('=')));
    const meta = Object.fromEntries(
      rest
        .filter((w) => w.includes('='))
        .map((w) => [w.slice(0, w.indexOf('=')), w.slice(w.indexOf('=') + 1)]),
    );
    const code = lines
      .slice(i + 1, end)
      .map((l) => (l.startsWith(indent!) ? l.slice(indent!.length) : l))
      .join('\n');
    blocks.push({ doc: relative('.', doc), line: i + 1, lang, flags, meta, code: `${code}\n` });
    i = end;
  }
  return blocks;
}

export const blockName = (b: Block): string =>
  `${b.doc}:${b.line} (${b.lang}${[...b.flags].map((f) => ` ${f}`).join('')})`;
