// Builds the clean side of the scanner corpus (test/fixtures/scan-corpus/clean/): the real definitions
// of npm MCP servers. Each package must already be installed (`npm install --ignore-scripts --prefix
// DIR/<slug> <pkg>`) outside the repository; this script starts each one over stdio with the real MCP
// SDK client, lists tools, prompts, resources and resource templates, and NEVER calls a tool. Run it
// inside a network namespace with only loopback, e.g.
//   unshare -n sh -c 'ip link set lo up; npx tsx scripts/scan-corpus-harvest.ts /var/tmp/scan-npm/pkgs OUT'
// HARVEST_TIMEOUT_MS (default 20000) bounds the start-up. Servers that do not start (missing config, native module, ...) are skipped and logged to stderr.
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { z } from 'zod';

/** A dummy value for every credential a server commonly insists on at start-up. */
const DUMMY = 'dummy-0000000000000000';
const DUMMY_ENV: Record<string, string> = Object.fromEntries(
  [
    'GITHUB_PERSONAL_ACCESS_TOKEN',
    'GITHUB_TOKEN',
    'GITLAB_PERSONAL_ACCESS_TOKEN',
    'BRAVE_API_KEY',
    'SLACK_BOT_TOKEN',
    'SLACK_TEAM_ID',
    'GOOGLE_MAPS_API_KEY',
    'NOTION_TOKEN',
    'FIRECRAWL_API_KEY',
    'TAVILY_API_KEY',
    'EXA_API_KEY',
    'SUPABASE_ACCESS_TOKEN',
    'SENTRY_ACCESS_TOKEN',
    'STRIPE_SECRET_KEY',
    'CIRCLECI_TOKEN',
    'HEROKU_API_KEY',
    'PRIVATE_APP_ACCESS_TOKEN',
    'EVERART_API_KEY',
    'AWS_ACCESS_KEY_ID',
    'AWS_SECRET_ACCESS_KEY',
    'AMAP_MAPS_API_KEY',
    'TRELLO_API_KEY',
    'TRELLO_TOKEN',
    'TRELLO_BOARD_ID',
    'ATLASSIAN_API_TOKEN',
    'ATLASSIAN_USER_EMAIL',
    'DT_ENVIRONMENT',
    'FIGMA_API_KEY',
    'BW_SESSION',
    'CODACY_ACCOUNT_TOKEN',
    'BROWSERSTACK_USERNAME',
    'BROWSERSTACK_ACCESS_KEY',
    'CLOUDFLARE_API_TOKEN',
    'DOKPLOY_API_KEY',
    'LUNCHMONEY_API_KEY',
    'PAPERLESS_API_KEY',
    'METABASE_API_KEY',
    'ES_API_KEY',
    'API_KEY',
  ].map((k) => [k, DUMMY]),
);
const EXTRA_ENV: Record<string, string> = {
  AWS_REGION: 'us-east-1',
  ATLASSIAN_SITE_NAME: 'example',
  DOKPLOY_URL: 'http://127.0.0.1:9/api',
  PAPERLESS_URL: 'http://127.0.0.1:9',
  METABASE_URL: 'http://127.0.0.1:9',
  ES_URL: 'http://127.0.0.1:9',
  OPENAPI_BASE_URL: 'http://127.0.0.1:9',
  API_BASE_URL: 'http://127.0.0.1:9',
  MYSQL_HOST: '127.0.0.1',
  REDIS_URL: 'redis://127.0.0.1:9',
  SERVICE_ACCOUNT_KEY_PATH: '/nonexistent.json',
  FIREBASE_STORAGE_BUCKET: 'example',
};
/** Positional arguments some servers need to start. */
const ARGS: Record<string, string[]> = {
  '@modelcontextprotocol/server-filesystem': ['/tmp'],
  '@modelcontextprotocol/server-postgres': ['postgresql://127.0.0.1:9/db'],
  '@modelcontextprotocol/server-redis': ['redis://127.0.0.1:9'],
  '@agent-infra/mcp-server-filesystem': ['--allowed-directories', '/tmp'],
  '@j0hanz/filesystem-mcp': ['/tmp'],
  '@henkey/postgres-mcp-server': ['--connection-string', 'postgresql://127.0.0.1:9/db'],
  'figma-developer-mcp': ['--stdio'],
  '@notionhq/notion-mcp-server': [],
};

const Loose = z.object({}).passthrough();

interface PackageJson {
  name: string;
  version: string;
  bin?: string | Record<string, string>;
}

function binOf(pkg: PackageJson): string | undefined {
  if (typeof pkg.bin === 'string') return pkg.bin;
  if (!pkg.bin) return undefined;
  const entries = Object.entries(pkg.bin);
  const short = pkg.name.split('/').pop()!;
  return (entries.find(([k]) => k === short) ?? entries.find(([k]) => /mcp/.test(k)) ?? entries[0])?.[1];
}

async function paged(client: Client, method: string, key: string): Promise<unknown[]> {
  const out: unknown[] = [];
  let cursor: string | undefined;
  for (let page = 0; page < 20; page++) {
    const r = (await client.request({ method, params: cursor ? { cursor } : {} } as never, Loose as never, {
      timeout: 15_000,
    })) as Record<string, unknown>;
    out.push(...((r[key] as unknown[] | undefined) ?? []));
    cursor = typeof r.nextCursor === 'string' ? r.nextCursor : undefined;
    if (!cursor) break;
  }
  return out;
}

async function harvest(dir: string, outDir: string): Promise<void> {
  const target = readdirSync(join(dir, 'node_modules'), { recursive: false });
  void target;
  const manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as {
    dependencies: Record<string, string>;
  };
  const name = Object.keys(manifest.dependencies)[0]!;
  const pkgDir = join(dir, 'node_modules', name);
  const pkg = JSON.parse(readFileSync(join(pkgDir, 'package.json'), 'utf8')) as PackageJson;
  const bin = binOf(pkg);
  if (!bin) throw new Error('no bin');
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [join(pkgDir, bin), ...(ARGS[name] ?? [])],
    cwd: '/tmp',
    env: { PATH: process.env.PATH ?? '', HOME: '/tmp', ...DUMMY_ENV, ...EXTRA_ENV },
    stderr: 'ignore',
  });
  const client = new Client({ name: 'airlock-scan-corpus', version: '1' });
  try {
    await client.connect(transport, { timeout: Number(process.env.HARVEST_TIMEOUT_MS ?? 20_000) });
    const caps = client.getServerCapabilities() ?? {};
    const safe = async (m: string, k: string) => paged(client, m, k).catch(() => []);
    const result = {
      package: name,
      version: pkg.version,
      serverInfo: client.getServerVersion(),
      instructions: client.getInstructions(),
      tools: caps.tools ? await paged(client, 'tools/list', 'tools') : [],
      prompts: caps.prompts ? await safe('prompts/list', 'prompts') : [],
      resources: caps.resources ? await safe('resources/list', 'resources') : [],
      resourceTemplates: caps.resources ? await safe('resources/templates/list', 'resourceTemplates') : [],
    };
    const file = join(outDir, `${name.replace(/^@/, '').replace(/\//g, '__')}.json`);
    writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
    process.stderr.write(`ok ${name}@${pkg.version}: ${result.tools.length} tools\n`);
  } finally {
    await client.close().catch(() => undefined);
  }
}

const [root, outDir] = process.argv.slice(2);
if (!root || !outDir) throw new Error('usage: scan-corpus-harvest.ts PKGS_DIR OUT_DIR');
mkdirSync(outDir, { recursive: true });
const dirs = readdirSync(root)
  .map((d) => join(root, d))
  .filter((d) => existsSync(join(d, 'done')));
const queue = [...dirs];
await Promise.all(
  [0, 1].map(async () => {
    for (let d = queue.shift(); d; d = queue.shift()) {
      await harvest(d, outDir).catch((e: unknown) =>
        process.stderr.write(`skip ${d}: ${String((e as Error)?.message ?? e).slice(0, 200)}\n`),
      );
    }
  }),
);
process.exit(0);
