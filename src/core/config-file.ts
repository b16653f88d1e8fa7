// The one config-file loader: read a file a user wrote (size-capped), parse YAML or JSON, validate it
// with a zod schema. Every failure is a typed error naming the file and, for schema failures, the path
// of the bad key (e.g. `mcpServers.fs.airlock.boundary`). Used for gateway configs, template files and
// network policy files.
import { closeSync, constants, fstatSync, openSync, readSync } from 'node:fs';
import { extname } from 'node:path';
import type * as Yaml from 'yaml';
import type { z } from 'zod';
import { AirlockError } from './errors.js';
import { lazyRequire } from './lazy.js';
import { parseOrThrow } from './validate.js';

const yaml = lazyRequire<typeof Yaml>('yaml');

/** The error code a config failure carries (what it means for an exit status or an HTTP status). */
export type ConfigErrorCode = 'INVALID_SPEC' | 'INVALID_ARGUMENT' | 'MCP_INVALID_CONFIG';

export interface ConfigFileOptions {
  /** Names the file in messages, e.g. 'gateway config' → "invalid gateway config /path: …". */
  readonly what: string;
  readonly code: ConfigErrorCode;
  readonly maxBytes: number;
  /**
   * 'json', 'yaml', or 'auto' (the default): YAML for .yaml/.yml, JSON for .json, otherwise JSON when
   * the text starts with `{` or `[` and YAML when it does not.
   */
  readonly format?: 'json' | 'yaml' | 'auto';
}

export type ConfigFormat = 'json' | 'yaml';

/** Which parser a file gets (see ConfigFileOptions.format). */
export function configFormat(
  path: string,
  text: string,
  format: ConfigFileOptions['format'] = 'auto',
): ConfigFormat {
  if (format !== 'auto') return format;
  const ext = extname(path).toLowerCase();
  if (ext === '.yaml' || ext === '.yml') return 'yaml';
  if (ext === '.json') return 'json';
  return /^\s*[[{]/.test(text) ? 'json' : 'yaml';
}

function sizeLabel(bytes: number): string {
  return bytes % (1024 * 1024) === 0 ? `${bytes / (1024 * 1024)} MiB` : `${bytes} bytes`;
}

/** The file's text (a leading BOM dropped). FILE_NOT_FOUND, PERMISSION_DENIED or `opts.code` otherwise. */
export function readConfigText(path: string, opts: ConfigFileOptions): string {
  try {
    // One fd for the check and the read: a file swapped or grown after a stat cannot pass the cap
    // (O_NONBLOCK: opening a FIFO does not wait for a writer; it is refused as not a regular file).
    const fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
    let text: string;
    try {
      const st = fstatSync(fd);
      if (!st.isFile()) throw new AirlockError(opts.code, `${opts.what} ${path} is not a regular file`);
      const buf = Buffer.alloc(opts.maxBytes + 1);
      let n = 0;
      for (let got = -1; got !== 0 && n < buf.length; n += got)
        got = readSync(fd, buf, n, buf.length - n, null);
      if (n > opts.maxBytes) {
        throw new AirlockError(opts.code, `${opts.what} ${path} is larger than ${sizeLabel(opts.maxBytes)}`);
      }
      text = buf.subarray(0, n).toString('utf8');
    } finally {
      closeSync(fd);
    }
    return text.charCodeAt(0) === 0xfeff ? text.slice(1) : text;
  } catch (e) {
    if (AirlockError.isInstance(e)) throw e;
    const errno = (e as NodeJS.ErrnoException).code;
    if (errno === 'ENOENT') {
      throw new AirlockError('FILE_NOT_FOUND', `${opts.what} ${path} not found`, { cause: e });
    }
    if (errno === 'EACCES' || errno === 'EPERM') {
      throw new AirlockError('PERMISSION_DENIED', `cannot read ${opts.what} ${path}: permission denied`, {
        cause: e,
      });
    }
    throw new AirlockError(opts.code, `cannot read ${opts.what} ${path}: ${(e as Error).message}`, {
      cause: e,
    });
  }
}

/**
 * Parse config text as YAML (duplicate keys refused, aliases capped) or JSON. `path` names the file in
 * messages ('' for text that came from elsewhere).
 */
export function parseConfigText(
  text: string,
  path: string,
  opts: Pick<ConfigFileOptions, 'what' | 'code' | 'format'>,
): unknown {
  const format = configFormat(path, text, opts.format);
  const what = path === '' ? opts.what : `${opts.what} ${path}`;
  if (format === 'json') {
    try {
      return JSON.parse(text) as unknown;
    } catch (e) {
      throw new AirlockError(
        opts.code,
        `invalid ${what}: not valid JSON (${(e as Error).message}); name the file .yaml for YAML`,
        { cause: e },
      );
    }
  }
  const doc = yaml().parseDocument(text, { prettyErrors: true, uniqueKeys: true });
  const err = doc.errors[0];
  if (err) throw new AirlockError(opts.code, `invalid ${what}: ${err.message}`, { cause: err });
  try {
    return doc.toJS({ maxAliasCount: 100 }) as unknown;
  } catch (e) {
    throw new AirlockError(opts.code, `invalid ${what}: ${(e as Error).message}`, { cause: e });
  }
}

/** Read and parse a config file (no schema): the raw data, for callers that look at it first. */
export function readConfigData(path: string, opts: ConfigFileOptions): unknown {
  return parseConfigText(readConfigText(path, opts), path, opts);
}

/**
 * Read, parse and validate a config file. The first schema issue becomes `opts.code` with the file
 * name and the path of the bad key ("invalid gateway config /x.json at mcpServers.fs.command: …").
 */
export function loadConfigFile<S extends z.ZodType>(
  path: string,
  schema: S,
  opts: ConfigFileOptions,
): z.output<S> {
  return parseOrThrow(schema, readConfigData(path, opts), `${opts.what} ${path}`, opts.code);
}
