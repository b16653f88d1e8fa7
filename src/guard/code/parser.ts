// The tree-sitter parsers of the code analysis: web-tree-sitter (a WebAssembly build of the parser
// runtime) and one grammar per language, each loaded once, lazily, and shared by every analysis.
// The .wasm files are resolved through node's module resolution from this file, so the same code
// finds them from source (tsx), from dist/ (tsc output) and from the CLI bundle (dist/bin/*.cjs,
// where import.meta.url is the bundle's own URL): the grammars are dependencies of the package.
import { createRequire } from 'node:module';
import { Language, Parser, type Tree } from 'web-tree-sitter';
import type { CodeLanguage } from '../../core/code.js';

/** The grammar a language is parsed with (the bash grammar also reads shell strings inside code). */
export type Grammar = CodeLanguage;

const WASM: Record<Grammar, string> = {
  python: 'tree-sitter-python/tree-sitter-python.wasm',
  javascript: 'tree-sitter-javascript/tree-sitter-javascript.wasm',
  typescript: 'tree-sitter-typescript/tree-sitter-typescript.wasm',
  bash: 'tree-sitter-bash/tree-sitter-bash.wasm',
};

const require = createRequire(import.meta.url);

let runtime: Promise<void> | undefined;
const languages = new Map<Grammar, Promise<Language>>();

function init(): Promise<void> {
  runtime ??= Parser.init({
    locateFile: () => require.resolve('web-tree-sitter/web-tree-sitter.wasm'),
  }).catch((e: unknown) => {
    runtime = undefined; // a failed load is retried by the next analysis, not cached
    throw e;
  });
  return runtime;
}

/** The grammar of `grammar`, loaded on first use (the promise is cached, so loads are never doubled). */
export function loadGrammar(grammar: Grammar): Promise<Language> {
  let p = languages.get(grammar);
  if (!p) {
    p = init()
      .then(() => Language.load(require.resolve(WASM[grammar])))
      .catch((e: unknown) => {
        languages.delete(grammar);
        throw e;
      });
    languages.set(grammar, p);
  }
  return p;
}

/**
 * Parse `source` with `language`, giving up after `deadlineMs` of parsing (null then). The caller
 * deletes the tree. One Parser per call: parsers are cheap, and a shared one would be state shared
 * between concurrent analyses.
 */
export function parseWith(language: Language, source: string, deadlineMs: number): Tree | null {
  const parser = new Parser();
  try {
    parser.setLanguage(language);
    const end = performance.now() + deadlineMs;
    // The progress callback's true return cancels the parse (the .d.ts types it as void).
    const progressCallback = (() => performance.now() > end) as unknown as () => void;
    return parser.parse(source, null, { progressCallback });
  } finally {
    parser.delete();
  }
}
