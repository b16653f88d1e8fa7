// A Dockerfile (the subset src/core/dockerfile.ts parses) → a template (src/core/template.ts), for
// `airlock template build -f Dockerfile`. What a template can hold today decides what is accepted:
//   FROM        `host`, a built template's name or digest, or an image reference (`image:<ref>` base:
//               the steps run on the image's root and its changes are captured)
//   RUN         a step (its ENV/ARG values, WORKDIR, network none as every template step by default)
//   COPY, ADD   local files of the build context, written as the template's files: before the first
//               RUN (so a COPY after a RUN is refused), under /workspace or /home/user only
//   ENV, ARG    the environment of the RUN steps that follow them; ENV is kept for sandboxes too
//   WORKDIR     the working dir of the following RUN steps, and the base of relative COPY targets
//   USER        only the sandbox user (`user`, `1000`) or none
//   LABEL       accepted (not stored)
//   CMD, ENTRYPOINT  kept in the template's config: `airlock run --template NAME` with no command
//               runs them (WORKDIR too: the sandboxes' working dir)
// Build-context sources are confined: no absolute paths, no `..`, no URLs, no symlink leaving the
// context (each file is opened by its real path, which must be inside the context's real path).
import {
  closeSync,
  constants,
  fstatSync,
  lstatSync,
  openSync,
  readdirSync,
  readFileSync,
  realpathSync,
} from 'node:fs';
import { isUtf8 } from 'node:buffer';
import { isAbsolute, join, posix, relative, sep } from 'node:path';
import { parseDockerfile, type DockerfilePlan } from '../core/dockerfile.js';
import { AirlockError } from '../core/errors.js';
import type { TemplateInput } from '../core/template.js';

/** As the template schema: at most this many files of at most 1 MiB each. */
const MAX_FILES = 256;
const MAX_FILE_BYTES = 1024 * 1024;
const ARCHIVE_RE = /\.(tar|tgz|tbz2?|txz|tar\.(gz|bz2|xz|zst))$/i;
const SANDBOX_USERS = new Set(['', 'user', '1000', '1000:1000', 'user:user']);

export interface DockerfileTemplateOptions {
  /** The template's name. */
  readonly name: string;
  /** The build context dir (COPY sources are relative to it). */
  readonly context: string;
  readonly buildArgs?: Record<string, string>;
}

const bad = (line: number, message: string): never => {
  throw new AirlockError('INVALID_SPEC', `Dockerfile line ${line}: ${message}`, {
    field: `Dockerfile:${line}`,
  });
};

/** The template a Dockerfile's text describes (reads its COPY sources from the context). */
export function dockerfileTemplate(text: string, o: DockerfileTemplateOptions): TemplateInput {
  const plan: DockerfilePlan = parseDockerfile(text, o.buildArgs ? { buildArgs: o.buildArgs } : {});
  const fromLine = firstLine(text, 'FROM');
  const base = plan.base;
  // A bare name or a digest is a built template; a reference with a registry, path, tag or digest
  // (`registry.example.com/team/py:3.12`, `py:3.12`, `py@sha256:…`) is an image.
  const isTemplate =
    base === 'host' || /^sha256:[0-9a-f]{64}$/.test(base) || /^[a-z0-9][a-z0-9._-]{0,62}$/.test(base);
  if (!isTemplate && !/^[A-Za-z0-9][\w.:/@-]{0,511}$/.test(base))
    bad(
      fromLine,
      `FROM ${base}: not an image reference (host/path:tag or name@sha256:…), template name or "host"`,
    );
  if (!SANDBOX_USERS.has(plan.user))
    bad(
      firstLine(text, 'USER'),
      `USER ${plan.user}: a template's steps run as the sandbox user only (USER user, or none)`,
    );
  const ctx = realpathSync(o.context);
  const files: Array<{ path: string; content: string }> = [];
  const steps: NonNullable<TemplateInput['steps']> = [];
  for (const s of plan.steps) {
    if (!SANDBOX_USERS.has(s.user))
      bad(s.line, `USER ${s.user}: a template's steps run as the sandbox user only (USER user, or none)`);
    if (s.kind === 'run') {
      steps.push({
        run: s.command,
        ...(Object.keys(s.env).length ? { env: s.env } : {}),
        ...(s.workdir !== '' && s.workdir !== '/' ? { workdir: s.workdir } : {}),
      });
      continue;
    }
    const what = s.add ? 'ADD' : 'COPY';
    if (steps.length)
      bad(
        s.line,
        `${what} after RUN: a template writes its files before its steps; move it above the first RUN`,
      );
    if (s.chown !== undefined && !SANDBOX_USERS.has(s.chown))
      bad(s.line, `${what} --chown=${s.chown}: files belong to the sandbox user`);
    if (s.chmod !== undefined) bad(s.line, `${what} --chmod is not supported: set modes in a RUN step`);
    for (const src of s.sources) {
      if (/^[a-z][a-z0-9+.-]*:\/\//i.test(src))
        bad(s.line, `${what} ${src}: URLs are not fetched; download in a RUN step with a network policy`);
      if (isAbsolute(src) || src.split(/[\\/]/).includes('..'))
        bad(
          s.line,
          `${what} ${src}: sources are paths inside the build context (no absolute paths, no "..")`,
        );
      if (s.add && ARCHIVE_RE.test(src))
        bad(s.line, `ADD ${src}: archives are not extracted; COPY it and extract it in a RUN step`);
      const hostPath = join(ctx, src);
      for (const f of walk(ctx, hostPath, s.line)) {
        const rel = relative(hostPath, f.path).split(sep).join('/');
        const single = rel === '' && !s.intoDir;
        const dest = single ? s.dest : posix.join(s.dest, rel === '' ? posix.basename(src) : rel);
        files.push({ path: dest, content: f.content });
        if (files.length > MAX_FILES)
          bad(s.line, `more than ${MAX_FILES} files to copy: archive them and extract in a RUN step`);
      }
    }
  }
  const config = {
    ...(plan.env.length ? { env: plan.env } : {}),
    ...(plan.workingDir !== '' ? { workingDir: plan.workingDir } : {}),
    ...(plan.entrypoint.length ? { entrypoint: plan.entrypoint } : {}),
    ...(plan.cmd.length ? { cmd: plan.cmd } : {}),
  };
  return {
    name: o.name,
    base: isTemplate ? base : `image:${base}`,
    files,
    steps,
    ...(Object.keys(config).length ? { config } : {}),
  };
}

/** Every regular file at or under `p` (a file or dir in the context), confined to `ctx`. */
function walk(ctx: string, p: string, line: number): Array<{ path: string; content: string }> {
  let real: string;
  try {
    real = realpathSync(p);
  } catch {
    return bad(line, `${relative(ctx, p)} does not exist in the build context`);
  }
  if (real !== ctx && !real.startsWith(ctx + sep))
    bad(line, `${relative(ctx, p)} leads outside the build context (a symlink)`);
  const st = lstatSync(real);
  if (st.isDirectory()) {
    return readdirSync(real)
      .sort()
      .flatMap((n) =>
        walk(ctx, join(real, n), line).map((f) => ({ ...f, path: join(p, relative(real, f.path)) })),
      );
  }
  if (!st.isFile()) bad(line, `${relative(ctx, p)} is not a regular file`);
  const fd = openSync(real, constants.O_RDONLY | constants.O_NOFOLLOW);
  try {
    if (fstatSync(fd).size > MAX_FILE_BYTES)
      bad(line, `${relative(ctx, p)} is over 1 MiB: copy it in a RUN step from a mounted workspace instead`);
    const bytes = readFileSync(fd);
    // Template files are text: a binary file would not survive as a string.
    if (!isUtf8(bytes))
      bad(line, `${relative(ctx, p)} is not UTF-8 text: binary files are not supported yet`);
    return [{ path: p, content: bytes.toString('utf8') }];
  } finally {
    closeSync(fd);
  }
}

function firstLine(text: string, keyword: string): number {
  const i = text.split(/\r?\n/).findIndex((l) => new RegExp(`^\\s*${keyword}\\b`, 'i').test(l));
  return i < 0 ? 1 : i + 1;
}
